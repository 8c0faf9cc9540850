"""The seam: what attnlens' three attention implementations share.

transformers >= 5 routes every attention layer through ``AttentionInterface``; attnlens
registers three implementations there, each with the boolean mask entry of
``AttentionMaskInterface`` (:func:`attnlens_mask`):

- ``"attnlens"`` (:data:`ATTENTION_IMPLEMENTATION`, :mod:`attnlens.models.capture`): eager
  attention in the open, where :class:`~attnlens.models.capture.Capture` reads and changes it;
- ``"attnlens-partial"`` (:data:`PARTIAL_IMPLEMENTATION`, :mod:`attnlens.models.partial`): a
  plan's k exact scores per query, computed eagerly;
- ``"attnlens-kernels"`` (:data:`KERNEL_IMPLEMENTATION`, :mod:`attnlens.models.kernels`): the
  same plan through fused kernels, for speed.

They must agree to the bit where they compute the same thing, so the steps they share live
here once: the scores (:func:`attention_scores`), the mask split into valid keys and an
additive bias (:func:`valid_and_bias`), the masking (:func:`mask_invalid`,
:func:`remaining_or_unmodified`), the softmax (:func:`softmax`), the weighted sum
(:func:`attend`), and the table of the extra arguments an architecture passes, with the terms
capture refuses (:func:`extra_bias`, :func:`refuse_unsupported`).

Registering them with transformers is :mod:`attnlens.models.registry`'s, which imports the
three (this module imports none of them, so that each can import it).

>>> ATTENTION_IMPLEMENTATION, PARTIAL_IMPLEMENTATION, KERNEL_IMPLEMENTATION
('attnlens', 'attnlens-partial', 'attnlens-kernels')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel

ATTENTION_IMPLEMENTATION = "attnlens"
PARTIAL_IMPLEMENTATION = "attnlens-partial"
KERNEL_IMPLEMENTATION = "attnlens-kernels"


def attnlens_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The ``AttentionMaskInterface`` entry: always a boolean mask, never the "skip" ``None``.

    Without an entry a custom implementation receives no mask at all, and causal masking
    silently vanishes; transformers' sdpa mask may also skip a plain causal or bidirectional
    mask (returning ``None``), which these implementations need spelled out.
    """
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


# --------------------------------------------------------------------------- scores and masks


def valid_and_bias(attention_mask: torch.Tensor | None, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split the mask the model passes into the boolean valid mask and an additive bias.

    With attnlens' mask entry registered, models pass a boolean (batch, 1, q, k) mask.
    A float mask (from a model that builds its own) is additive: very negative entries
    are invalid, the rest are a bias that belongs to the scores. The bias keeps its head
    axis: ALiBi (Falcon) gives every head its own slope. Which keys are valid must be the
    same for every head (``valid`` has no head axis); a mask whose heads disagree is refused.

    >>> alibi = torch.tensor([0.0, -1.0])[None, :, None, None] * torch.arange(3.0)   # (1, heads, 1, k)
    >>> valid, bias = valid_and_bias(alibi.expand(1, 2, 3, 3), torch.zeros(1, 2, 3, 3))
    >>> bias[0, :, 0].tolist()                                                       # each head its own
    [[0.0, 0.0, 0.0], [-0.0, -1.0, -2.0]]
    """
    batch, _, q_len, k_len = scores.shape
    if attention_mask is None:
        return torch.ones(1, 1, 1, dtype=torch.bool, device=scores.device).expand(batch, q_len, k_len), None
    mask = attention_mask[..., -k_len:]
    valid = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if valid.shape[1] > 1 and not bool((valid == valid[:, :1]).all()):
        raise UnsupportedModel("the attention mask differs between heads, which attnlens capture does not support")
    if mask.dtype == torch.bool:
        return valid[:, 0].expand(batch, q_len, k_len), None
    bias = torch.where(valid, mask, torch.zeros((), dtype=mask.dtype, device=mask.device))
    return valid[:, 0].expand(batch, q_len, k_len), bias.to(scores.dtype)


def attention_scores(query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None = None) -> torch.Tensor:
    """Pre-softmax scores (batch, head, q, k), sharing each key head among its query group.

    Grouped-query attention: query head ``h`` reads key head ``h // (heads / kv_heads)``,
    as transformers' ``repeat_kv`` does, computed without copying the keys.

    >>> q = torch.randn(2, 4, 3, 8); k = torch.randn(2, 1, 3, 8)
    >>> s = attention_scores(q, k, 8 ** -0.5)
    >>> torch.allclose(s[:, 2], q[:, 2] @ k[:, 0].transpose(-1, -2) * 8 ** -0.5, atol=1e-6)
    True
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group * q_len, dim)
    # In place: the matmul's output is fresh and not needed for backward, so this saves a copy.
    scores = torch.matmul(grouped, key.transpose(-1, -2)).reshape(batch, heads, q_len, k_len).mul_(scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return scores


def mask_invalid(scores: torch.Tensor, valid: torch.Tensor, needs_mask: bool) -> torch.Tensor:
    """Scores with invalid keys set to the dtype's minimum, as eager attention masks them.

    ``needs_mask=False`` (every key valid) returns ``scores`` itself: masking is a full pass.
    """
    return torch.where(valid[:, None], scores, torch.finfo(scores.dtype).min) if needs_mask else scores


def remaining_or_unmodified(
    replaced: torch.Tensor, unmodified: torch.Tensor, valid: torch.Tensor, needs_mask: bool
) -> torch.Tensor:
    """The masked scores an intervention leaves, with rows it empties restored.

    A row is empty when no valid key scores above the dtype's minimum (every valid key
    ``-inf`` or the minimum itself); softmax would then put its weight on the invalid
    keys, which hold the minimum. Such rows take their unmodified scores, as
    :data:`attnlens.models.capture.Intervention` documents. Rows with no valid key at all
    are masked either way, so restoring them changes nothing (they stay uniform, as in
    eager attention).

    >>> valid = torch.ones(1, 1, 2, dtype=torch.bool)
    >>> remaining_or_unmodified(torch.full((1, 1, 1, 2), float("-inf")), torch.ones(1, 1, 1, 2), valid, False).tolist()
    [[[[1.0, 1.0]]]]
    """
    floor = torch.finfo(replaced.dtype).min
    masked = mask_invalid(replaced, valid, needs_mask)
    emptied = masked.amax(dim=-1, keepdim=True) <= floor
    if not bool(emptied.any()):  # the usual case: one reduction, no second masking pass
        return masked
    return torch.where(emptied, mask_invalid(unmodified.to(replaced.dtype), valid, needs_mask), masked)


def softmax(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over the keys, computed in at least float32 and returned in ``dtype`` (the query's).

    Half precision loses mass in a softmax; a float64 model keeps float64.
    """
    return nn.functional.softmax(scores, dim=-1, dtype=torch.promote_types(dtype, torch.float32)).to(dtype)


def attend(weights: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The weighted sum of the values (batch, head, q, d), each value head shared by its query group."""
    batch, heads, q_len, k_len = weights.shape
    kv_heads = value.shape[1]
    grouped = weights.reshape(batch, kv_heads, (heads // kv_heads) * q_len, k_len)
    return torch.matmul(grouped, value).reshape(batch, heads, q_len, value.shape[-1])


# --------------------------------------------------------------------------- extra arguments


class Meaning(enum.Enum):
    """What an extra argument to the attention function means for the scores, where capture reproduces it."""

    BIAS = "bias"  # a term added to the scores before softmax: part of them
    IGNORED = "ignored"  # describes what the mask already holds, or how other kernels would run


@dataclass(frozen=True)
class Refused:
    """An argument whose term capture does not reproduce (or cannot tell); ``what`` names it in the refusal."""

    what: str


# What each argument an architecture may pass to the attention function (besides the mask,
# scaling, dropout and soft-capping) means for the scores. Family differences are data. A
# tensor not in the table that is shaped like the scores (..., query, key) is refused:
# attnlens cannot tell what it would do to them.
_ARGUMENTS: dict[str, Meaning | Refused] = {
    "position_bias": Meaning.BIAS,  # T5, mT5, LongT5, UMT5, Switch, Pix2Struct, UDOP, ...: relative position bias
    "s_aux": Refused("attention sinks (s_aux)"),  # gpt-oss: an extra logit per head in the softmax
    "sinks": Refused("attention sinks"),
    "indices": Refused("sparse attention over selected keys (indices)"),  # DeepSeek's sparse attention
    "block_indices": Refused("sparse attention over selected blocks (block_indices)"),
    **{
        name: Meaning.IGNORED
        for name in (
            "sliding_window",  # the mask holds the window
            "is_causal",  # the mask holds the causal structure
            "position_ids",
            "cache_position",
            "output_attentions",
            "deterministic",
            "use_cache",
            "cu_seq_lens_q",  # flash attention's packed sequences (the mask holds them here)
            "cu_seq_lens_k",
            "max_length_q",
            "max_length_k",
            "layer_idx",
        )
    },
}


def extra_bias(module: nn.Module, kwargs: dict[str, Any], shape: tuple[int, int] | None = None) -> torch.Tensor | None:
    """The additive score terms the call carries (e.g. T5's position bias), after refusing
    any argument whose meaning capture cannot reproduce or cannot tell; ``shape``, the scores'
    (query, key), also refuses an unknown tensor of that shape.

    >>> extra_bias(nn.Identity(), {"is_causal": True, "position_bias": torch.ones(1)}).tolist()
    [1.0]
    >>> extra_bias(nn.Identity(), {"s_aux": torch.zeros(4)})
    Traceback (most recent call last):
        ...
    attnlens.errors.UnsupportedModel: Identity uses attention sinks (s_aux), which attnlens capture does not support
    """
    bias = None
    for argument, value in kwargs.items():
        if value is None:
            continue
        meaning = _ARGUMENTS.get(argument)
        if meaning is None and isinstance(value, torch.Tensor) and tuple(value.shape[-2:]) == shape:
            meaning = Refused(f"an argument `{argument}` to its attention whose meaning attnlens does not know")
        if isinstance(meaning, Refused):
            raise UnsupportedModel(f"{type(module).__name__} uses {meaning.what}, which attnlens capture does not support")
        if meaning is Meaning.BIAS:
            bias = value if bias is None else bias + value
    return bias


def refuse_unsupported(module: nn.Module, kwargs: dict[str, Any]) -> None:
    """Raise :class:`UnsupportedModel` if the attention call carries a term the plan paths do not add."""
    # no unknown tensor is checked here: a plan is made under "attnlens", which refuses them first
    if extra_bias(module, kwargs) is not None:
        raise UnsupportedModel(f"{type(module).__name__} adds a position bias to its scores; run it under 'attnlens'")
