"""Capture: the one place that reads and changes a model's attention.

Transformers >= 5 routes every attention layer through ``AttentionInterface``. attnlens
registers one implementation there, ``"attnlens"``, that computes attention exactly as
the model's eager code does, but in the open:

    scores = q·kᵀ·scaling (soft-capped where the architecture does)   <- recorded, may be replaced
    weights = softmax(scores where valid, else the dtype's minimum)    <- optionally recorded
    output  = weights·v

and the matching ``AttentionMaskInterface`` entry, which hands it the boolean **valid**
mask (padding, causal structure, sliding windows). Without that entry a custom
implementation receives no mask at all and causal masking silently vanishes. The steps
it shares with the plan implementations, the mask entry and the registration of all
three live in :mod:`attnlens.models.attention`.

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

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models.attention import (
    attend,
    attention_scores,
    extra_bias,
    mask_invalid,
    remaining_or_unmodified,
    softmax,
    valid_and_bias,
)

LAYER_ATTRIBUTE = "attnlens_layer"  # the layer number attnlens.load_model sets on each attention module

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
        self._token: contextvars.Token[Capture | None] | None = None

    def __enter__(self) -> Capture:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is None:
            raise BadInput("a Capture was exited without being entered; use it as `with Capture(...) as capture:`")
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


def active_capture() -> Capture | None:
    """The :class:`Capture` whose ``with`` block is running here, if any: the one ``"attnlens"`` serves."""
    return _ACTIVE.get()


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
    index = getattr(module, LAYER_ATTRIBUTE, None)
    if index is None:
        index = getattr(module, "layer_idx", None)
    if index is None:
        raise UnsupportedModel(f"{type(module).__name__} has no layer index; load the model with attnlens.load_model")
    return int(index)


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
    extra = extra_bias(module, kwargs, (query.shape[2], key.shape[2]))
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
    if capture is not None and not capture.wants(layer):
        capture = None  # a layer the capture did not choose runs as plain eager attention
    # Masking is a full pass over the scores; encoders on unpadded blocks need none.
    needs_mask = not bool(valid.all())
    replaced = capture.intervene(layer, scores, valid) if capture is not None and capture.intervene is not None else None
    if replaced is None:
        masked = mask_invalid(scores, valid, needs_mask)
    else:
        # After the intervention, so that nothing it returns can unmask an invalid key.
        masked = remaining_or_unmodified(replaced, scores, valid, needs_mask)
    weights = softmax(masked, query.dtype)
    if capture is not None and capture.record:
        capture._keep(
            layer,
            scores.detach(),  # as computed, before any intervention
            valid,
            weights.detach() if capture.record_weights else None,
        )
    if capture is not None and capture.intervene_weights is not None:
        gated = capture.intervene_weights(layer, weights, valid)
        weights = weights if gated is None else gated
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = attend(weights, value)
    return output.transpose(1, 2).contiguous(), weights
