"""Capture: the one place that reads and changes a model's attention.

Transformers >= 5 routes every attention layer through ``AttentionInterface``. attnlens
registers one implementation there, ``"attnlens"``, that computes attention exactly as
the model's eager code does, but in the open:

    scores = q·kᵀ·scaling (soft-capped where the architecture does)   <- recorded, may be replaced
    weights = softmax(scores where valid, else the dtype's minimum)    <- optionally recorded
    output  = weights·v

and the matching ``AttentionMaskInterface`` entry, which hands it the boolean **valid**
mask (padding, causal structure, sliding windows). Without that entry a custom
implementation receives no mask at all and causal masking silently vanishes.

When no :class:`Capture` is active the implementation is a plain eager attention, so a
model loaded by :func:`attnlens.load_model` behaves exactly like the original, with one
deliberate difference: the softmax always runs in float32 or wider (float32 for float32
and half-precision models, the model's dtype when that is wider). Most of transformers'
eager code (Llama, Gemma, ...) runs it in float32 whatever the dtype, so a float64 model
here differs from transformers' by float32 rounding, by design: for gemma3-270m in
float64, about 1e-6 in the weights and 1e-5 in the logits. (BERT's eager code runs it in
the model's dtype; a half-precision BERT here is the one that rounds less.)

Invalid keys are masked *after* any intervention, so whatever an intervention returns
they get weight exactly 0 in every row that has a valid key. A row whose every valid key
an intervention removes (``-inf``, or the dtype's minimum) falls back to its unmodified
scores (see :data:`Intervention`). Models whose attention adds terms outside the
scores, such as attention sinks (``s_aux``, gpt-oss), are refused.

>>> import torch
>>> from attnlens import Capture, load_model
>>> model = load_model("minilm-l6")
>>> ids = torch.tensor([[101, 7592, 2088, 102]])
>>> with Capture(layers=[0]) as cap:
...     _ = model.forward(ids)
>>> tuple(cap.scores[0].shape)       # (batch, head, query, key)
(1, 12, 4, 4)
>>> bool(cap.valid[0].all())         # an encoder sees every key
True
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel

ATTENTION_IMPLEMENTATION = "attnlens"

Intervention = Callable[[int, torch.Tensor, torch.Tensor], "torch.Tensor | None"]
"""``intervene(layer, scores, valid) -> new scores or None``.

``scores`` has shape (batch, head, query, key); ``valid`` (batch, query, key) is boolean.
Return a tensor of the same shape to replace the scores before softmax (``-inf`` removes
a position), or ``None`` to leave them unchanged; do not change ``scores`` in place (they
are recorded, and are the fallback below). Invalid positions are masked after the
intervention, so whatever it returns (short of NaN or ``+inf``) they get weight exactly 0
in every row that has a valid key.

A valid key counts as removed when its new score is ``-inf`` or the dtype's minimum (the
value invalid keys are masked with). A row that would lose *every* valid key keeps its
unmodified scores instead: softmax over nothing has no answer, and without this rule the
row's weight would spread over the invalid keys (for a causal model, the future). This
is the rule of :func:`attnlens.analysis.evaluation.guard_rows` (importance ablation's
``rows_spared``), applied to any intervention. Scores that are merely very negative
(e.g. DAM's ``scores - 10⁴``) are not removed: they stay finite, and a row shifted as a
whole keeps its softmax over its valid keys.
"""

WeightsIntervention = Callable[[int, torch.Tensor, torch.Tensor], "torch.Tensor | None"]
"""``intervene_weights(layer, weights, valid) -> new weights or None``, after softmax.

For gates that multiply attention weights (e.g. head or position-class importance,
Michel et al. 2019); the result is used as is, without renormalising.
"""

Sink = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None"], None]
"""``sink(layer, scores, valid, weights)``: receives each recorded layer as it is computed."""

_ACTIVE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar("attnlens_capture", default=None)


class Capture:
    """Record pre-softmax scores (and optionally weights) and intervene in attention.

    Use it as a context manager around forward passes of a model loaded with
    :func:`attnlens.load_model`. Recorded tensors are detached.

    Parameters
    ----------
    layers:
        Layers to record and intervene in; ``None`` means all.
    weights:
        Also record the post-softmax weights (after any intervention).
    intervene:
        Optional :data:`Intervention` applied to the scores of each chosen layer. A row
        it would leave with no valid key keeps its unmodified scores; invalid keys get
        weight exactly 0 either way.
    intervene_weights:
        Optional :data:`WeightsIntervention` applied to the weights after softmax.
    sink:
        Optional :data:`Sink` that receives each recorded layer instead of keeping it.
        Without a sink, :attr:`scores`, :attr:`valid` and :attr:`weights` hold the
        tensors of the most recent forward pass, keyed by layer.
    record:
        Set to ``False`` to intervene without keeping anything.
    """

    def __init__(
        self,
        layers: Iterable[int] | None = None,
        *,
        weights: bool = False,
        intervene: Intervention | None = None,
        intervene_weights: WeightsIntervention | None = None,
        sink: Sink | None = None,
        record: bool = True,
    ) -> None:
        self.layers = None if layers is None else frozenset(int(layer) for layer in layers)
        self.record_weights = weights
        self.intervene = intervene
        self.intervene_weights = intervene_weights
        self.sink = sink
        self.record = record
        self.scores: dict[int, torch.Tensor] = {}
        self.valid: dict[int, torch.Tensor] = {}
        self.weights: dict[int, torch.Tensor] = {}
        self._token: contextvars.Token | None = None

    def __enter__(self) -> Capture:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)
        self._token = None

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def _keep(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor | None) -> None:
        if self.sink is not None:
            self.sink(layer, scores, valid, weights)
            return
        self.scores[layer] = scores
        self.valid[layer] = valid
        if weights is not None:
            self.weights[layer] = weights


@contextlib.contextmanager
def no_capture() -> Iterator[None]:
    """Run the model untouched inside an active :class:`Capture` (e.g. for a reference output)."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def layer_index(module: nn.Module) -> int:
    """The layer number of an attention module, as :func:`attnlens.load_model` assigned it."""
    index = getattr(module, "attnlens_layer", None)
    if index is None:
        index = getattr(module, "layer_idx", None)
    if index is None:
        raise UnsupportedModel(f"{type(module).__name__} has no layer index; load the model with attnlens.load_model")
    return int(index)


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


def _remaining_or_unmodified(
    replaced: torch.Tensor, unmodified: torch.Tensor, valid: torch.Tensor, needs_mask: bool
) -> torch.Tensor:
    """The masked scores an intervention leaves, with rows it empties restored.

    A row is empty when no valid key scores above the dtype's minimum (every valid key
    ``-inf`` or the minimum itself); softmax would then put its weight on the invalid
    keys, which hold the minimum. Such rows take their unmodified scores, as
    :data:`Intervention` documents. Rows with no valid key at all are masked either way,
    so restoring them changes nothing (they stay uniform, as in eager attention).
    """
    floor = torch.finfo(replaced.dtype).min
    masked = _mask(replaced, valid, needs_mask)
    emptied = masked.amax(dim=-1, keepdim=True) <= floor
    if not bool(emptied.any()):  # the usual case: one reduction, no second masking pass
        return masked
    return torch.where(emptied, _mask(unmodified.to(replaced.dtype), valid, needs_mask), masked)


def _mask(scores: torch.Tensor, valid: torch.Tensor, needs_mask: bool) -> torch.Tensor:
    """Scores with invalid keys set to the dtype's minimum, as eager attention masks them."""
    return torch.where(valid[:, None], scores, torch.finfo(scores.dtype).min) if needs_mask else scores


def _attend(weights: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    batch, heads, q_len, k_len = weights.shape
    kv_heads = value.shape[1]
    grouped = weights.reshape(batch, kv_heads, (heads // kv_heads) * q_len, k_len)
    return torch.matmul(grouped, value).reshape(batch, heads, q_len, value.shape[-1])


# What each argument an architecture may pass to the attention function (besides the mask,
# scaling, dropout and soft-capping) means for the scores. Family differences are data: a
# term added to the scores before softmax is part of them ("bias"); a term outside q·kᵀ
# that capture does not reproduce is refused; and arguments that describe what the mask
# already holds, or how other kernels would run, change nothing here ("ignored"). A tensor
# not in the table that is shaped like the scores (..., query, key) is refused: attnlens
# cannot tell what it would do to them.
_ARGUMENTS: dict[str, str] = {
    "position_bias": "bias",  # T5, mT5, LongT5, UMT5, Switch, Pix2Struct, UDOP, ...: relative position bias
    "s_aux": "refuse:attention sinks (s_aux)",  # gpt-oss: an extra logit per head in the softmax
    "sinks": "refuse:attention sinks",
    "indices": "refuse:sparse attention over selected keys (indices)",  # DeepSeek's sparse attention
    "block_indices": "refuse:sparse attention over selected blocks (block_indices)",
    **{
        name: "ignored"
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


def _extra_bias(module: nn.Module, kwargs: dict[str, Any], shape: tuple[int, int] | None = None) -> torch.Tensor | None:
    """The additive score terms the call carries (e.g. T5's position bias), after refusing
    any argument whose meaning capture cannot reproduce or cannot tell; ``shape``, the scores'
    (query, key), also refuses an unknown tensor of that shape."""
    bias = None
    for argument, value in kwargs.items():
        if value is None:
            continue
        meaning = _ARGUMENTS.get(argument)
        if meaning is None and isinstance(value, torch.Tensor) and tuple(value.shape[-2:]) == shape:
            meaning = f"refuse:an argument `{argument}` to its attention whose meaning attnlens does not know"
        if meaning is not None and meaning.startswith("refuse:"):
            raise UnsupportedModel(
                f"{type(module).__name__} uses {meaning.removeprefix('refuse:')}, which attnlens capture does not support"
            )
        if meaning == "bias":
            bias = value if bias is None else bias + value
    return bias


def _refuse_unsupported(module: nn.Module, kwargs: dict[str, Any]) -> None:
    """Raise :class:`UnsupportedModel` if the attention call carries a term the fast paths do not add."""
    # no unknown tensor is checked here: a plan is made under "attnlens", which refuses them first
    if _extra_bias(module, kwargs) is not None:
        raise UnsupportedModel(f"{type(module).__name__} adds a position bias to its scores; run it under 'attnlens'")


def attnlens_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``AttentionInterface`` implementation registered as ``"attnlens"``."""
    extra = _extra_bias(module, kwargs, (query.shape[2], key.shape[2]))
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    scores = attention_scores(query, key, scaling, softcap)
    valid, bias = valid_and_bias(attention_mask, scores)
    # In the order the models' own eager code adds them (T5: position bias, then the mask).
    for term in (extra, bias):
        if term is not None:
            scores = scores + term.to(scores.dtype)

    capture = _ACTIVE.get()
    layer = layer_index(module) if capture is not None else -1
    active = capture is not None and capture.wants(layer)
    # Masking is a full pass over the scores; encoders on unpadded blocks need none.
    needs_mask = not bool(valid.all())
    replaced = capture.intervene(layer, scores, valid) if active and capture.intervene is not None else None
    if replaced is None:
        masked = _mask(scores, valid, needs_mask)
    else:
        # After the intervention, so that nothing it returns can unmask an invalid key.
        masked = _remaining_or_unmodified(replaced, scores, valid, needs_mask)
    # At least float32 (half-precision softmax loses mass), float64 for float64 models.
    weights = nn.functional.softmax(masked, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
    if active and capture.record:
        capture._keep(
            layer,
            scores.detach(),  # as computed, before any intervention
            valid,
            weights.detach() if capture.record_weights else None,
        )
    if active and capture.intervene_weights is not None:
        gated = capture.intervene_weights(layer, weights, valid)
        weights = weights if gated is None else gated
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = _attend(weights, value)
    return output.transpose(1, 2).contiguous(), weights


def attnlens_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The ``AttentionMaskInterface`` entry: always a boolean mask, never the "skip" ``None``."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Register ``"attnlens"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, attnlens_attention)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, attnlens_mask)
