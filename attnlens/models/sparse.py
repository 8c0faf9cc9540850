"""A mask run as sparse attention: FlexAttention with a block mask, or sdpa with a boolean mask.

A learned mask or a fixed pattern removes positions; whether that saves time depends on
the kernel. FlexAttention (``torch.nn.attention.flex_attention``, compiled) skips whole
blocks of 128 × 128 (query, key) positions that the mask empties, so a band saves in
proportion to the blocks it leaves empty, while a mask with holes scattered everywhere
empties no block and costs a dense kernel. sdpa with a boolean mask always computes every
score. :func:`masked_attention` runs either, with the same result as eager masked softmax.

>>> q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
>>> keep = torch.ones(8, 8, dtype=torch.bool).tril()
>>> dense = torch.softmax((q @ k.transpose(-1, -2) / 2).masked_fill(~keep, float("-inf")), -1) @ v
>>> torch.allclose(masked_attention(q, k, v, keep, kernel="sdpa"), dense, atol=1e-6)
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from attnlens.errors import BadInput

if TYPE_CHECKING:  # FlexAttention is imported where it runs, not with this module
    from torch.nn.attention.flex_attention import BlockMask

KERNELS = ("flex", "sdpa")


def block_mask(keep: torch.Tensor, block_size: int = 128) -> BlockMask:
    """FlexAttention's block mask of a (n, n) boolean ``keep``, shared by every batch and head."""
    from torch.nn.attention.flex_attention import create_block_mask

    n = keep.shape[-1]
    return create_block_mask(lambda b, h, q, kv: keep[q, kv], None, None, n, n, device=str(keep.device), BLOCK_SIZE=block_size)


@functools.cache
def compiled_flex() -> Callable[..., Any]:
    """FlexAttention compiled once (its eager form materialises every score, and is slow)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keep: torch.Tensor,
    *,
    kernel: str = "flex",
    blocks: BlockMask | None = None,
    compiled: bool = True,
) -> torch.Tensor:
    """Attention (batch, head, n, d) over the positions ``keep`` (n, n) leaves, by ``kernel``.

    ``blocks``: a block mask made once by :func:`block_mask` (flex); ``compiled=False`` runs
    FlexAttention eagerly (slow, for checks)."""
    if kernel not in KERNELS:
        raise BadInput(f"kernel '{kernel}' is unknown; use one of {', '.join(KERNELS)}")
    if kernel == "sdpa":
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keep)
    from torch.nn.attention.flex_attention import flex_attention

    mask = blocks if blocks is not None else block_mask(keep)
    if compiled:
        return compiled_flex()(query, key, value, block_mask=mask)
    return flex_attention(query, key, value, block_mask=mask)
