"""A plan run for speed: each group of heads through the kernel that computes it fastest.

``"attnlens-partial"`` (:mod:`attnlens.models.partial`) computes what a plan asks with
eager attention throughout, so that its exact heads match ``"attnlens"`` bit for bit. To
turn a plan's savings into seconds, this module is ``"attnlens-kernels"`` (registered by
:mod:`attnlens.models.registry`), which runs a layer's heads in groups:

- **exact** heads (and every head of a layer without a plan): one fused
  ``scaled_dot_product_attention`` call (through its causal path where the layer's mask is
  plain causal);
- **window** heads (:class:`~attnlens.models.partial.MaskedHeads`): compiled FlexAttention
  with a block mask (``kernel="flex"``, skipping the 128 × 128 blocks the window empties)
  or sdpa with the boolean mask (``kernel="sdpa"``); the plan's timing table says which is
  faster at its n on this machine (:mod:`attnlens.analysis.plan.seconds`);
- **partial** heads: the partial path (k exact scores per query and the map), then
  softmax and the weighted sum.

It returns no attention weights (fused kernels never form them), so capture does not work
under it; the same plan under ``"attnlens-partial"`` gives the same outputs to float32
rounding (``tests/test_plan_seconds.py``).

>>> import torch
>>> from attnlens import load_model
>>> from attnlens.models.partial import LayerPlan, MaskedHeads
>>> model = load_model("minilm-l3")
>>> ids = torch.tensor([[101, 7592, 2088, 2003, 102]])
>>> keep = torch.ones(5, 5, dtype=torch.bool).triu()
>>> plans = {0: LayerPlan(n=5, masked=[MaskedHeads([0, 1], keep, kernel="sdpa")])}
>>> with planned(model, plans, implementation=PARTIAL_IMPLEMENTATION):
...     eager = model.forward(ids).last_hidden_state
>>> with planned(model, plans, implementation=KERNEL_IMPLEMENTATION):
...     fast = model.forward(ids).last_hidden_state
>>> bool((eager - fast).abs().max() < 1e-4)
True
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel
from attnlens.models.attention import (
    KERNEL_IMPLEMENTATION,
    PARTIAL_IMPLEMENTATION,
    attend,
    refuse_unsupported,
    softmax,
    valid_and_bias,
)
from attnlens.models.partial import LayerPlan, MaskedHeads, PartialHeads, plan_of, planned

if TYPE_CHECKING:  # FlexAttention is imported where a window runs through it, not with this module
    from torch.nn.attention.flex_attention import BlockMask

__all__ = ["KERNEL_IMPLEMENTATION", "PARTIAL_IMPLEMENTATION", "kernel_attention", "planned"]


def kernel_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` implementation registered as ``"attnlens-kernels"``."""
    refuse_unsupported(module, kwargs)
    batch, heads, n, _ = query.shape
    plan = plan_of(module) or LayerPlan(n=n)
    plan.check(module, n)
    if softcap is not None or (dropout and module.training):
        raise UnsupportedModel(f"{type(module).__name__} caps its scores or trains with dropout; run it under 'attnlens-partial'")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    valid = _valid(attention_mask, batch, n, query.device)
    output = query.new_empty(batch, heads, n, value.shape[-1])
    groups: list[PartialHeads | MaskedHeads] = [*plan.partial, *plan.masked]
    exact = sorted(set(range(heads)) - {h for group in groups for h in group.heads})
    if exact:  # sdpa's causal path where the mask is plain causal: about twice as fast at n = 2,048
        causal = valid is not None and _plain_causal(valid)
        output[:, exact] = _sdpa(*_own(exact, query, key, value), None if causal else valid, scaling, causal)
    for window in plan.masked:
        output[:, window.heads] = _window(window, *_own(window.heads, query, key, value), valid, scaling)
    for part in plan.partial:
        output[:, part.heads] = _partial(part, *_own(part.heads, query, key, value), valid, scaling)
    return output.transpose(1, 2).contiguous(), None


def _valid(attention_mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor | None:
    """The boolean (batch, 1, n, n) mask of keys each query may see (``None``: all of them)."""
    if attention_mask is None:
        return None
    valid, bias = valid_and_bias(attention_mask, torch.empty(batch, 1, n, n, device="meta"))
    if bias is not None:
        raise UnsupportedModel("the model passes an additive attention mask; run it under 'attnlens-partial'")
    return None if bool(valid.all()) else valid[:, None]


def _own(
    heads: list[int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query heads ``heads`` with the key and value heads they read (grouped-query attention)."""
    index = torch.tensor(heads, device=query.device)
    kv_index = index // (query.shape[1] // key.shape[1])
    return query.index_select(1, index), key.index_select(1, kv_index), value.index_select(1, kv_index)


def _sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor | None, scaling: float, causal: bool = False
) -> torch.Tensor:
    return nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=valid, is_causal=causal, scale=scaling)


def _plain_causal(valid: torch.Tensor) -> bool:
    """Whether ``valid`` (batch, 1, n, n) is the causal mask and nothing else (no padding, no sliding window)."""
    n = valid.shape[-1]
    return valid.shape[-2] == n and bool((valid == _lower(n, valid.device)).all())


@functools.cache
def _lower(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _window(
    part: MaskedHeads, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Window heads through their kernel; a row the window and the mask leave empty keeps the mask's keys,
    as ``"attnlens"`` keeps a row an intervention empties."""
    keep = part.keep.to(query.device)[None, None]
    allowed = keep if valid is None else keep & valid
    if valid is not None:
        allowed = allowed | (~allowed.any(-1, keepdim=True) & valid)
    if part.kernel == "sdpa":
        return _sdpa(query, key, value, allowed, scaling)
    from attnlens.models.sparse import compiled_flex

    return compiled_flex()(query, key, value, block_mask=_blocks(part, allowed), scale=scaling)


def _blocks(part: MaskedHeads, allowed: torch.Tensor) -> BlockMask:
    """FlexAttention's block mask of ``allowed`` (batch, 1, n, n), made once per distinct mask and kept on ``part``."""
    from torch.nn.attention.flex_attention import create_block_mask

    cached = part.blocks.get("mask")
    if cached is None or cached.shape != allowed.shape or not torch.equal(cached, allowed):
        batch, n = allowed.shape[0], allowed.shape[-1]
        part.blocks["mask"] = allowed
        part.blocks["block"] = create_block_mask(
            lambda b, h, q, kv: allowed[b, 0, q, kv], batch, None, n, n, device=str(allowed.device)
        )
    return part.blocks["block"]


def _partial(
    part: PartialHeads, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Partial heads: their rebuilt scores, masked, softmax and the weighted sum (no fused kernel takes rebuilt scores)."""
    scores = part.scores(query, key, scaling, None)
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    return attend(softmax(scores, query.dtype), value)
