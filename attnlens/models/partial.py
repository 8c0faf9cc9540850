"""Partial attention: an attention function that computes only k exact scores per query.

The plug-in path of :mod:`attnlens.analysis.reconstruct` computes every score and then
replaces most of them; it measures what a reconstruction costs the model, not what it
saves. This module is a second implementation for transformers' attention interface,
``"attnlens-partial"`` (registered by :mod:`attnlens.models.registry`; the steps it shares
with ``"attnlens"`` are in :mod:`attnlens.models.attention`), that does the work a plan asks for, head by head:

- **exact** heads: every score, as ``"attnlens"`` computes it;
- **partial** heads (:class:`PartialHeads`): the scores of the k chosen keys only
  (``q·k_S``, k dot products per query instead of n), then the rest rebuilt by the fitted
  affine map in one matrix product, ``ŝ = s_S·Wᵀ + offset`` (:func:`rebuild`);
- **masked** heads (:class:`MaskedHeads`): every score, then the positions outside the
  mask removed. This is the dense kernel: it saves no time here (run a mask as sparse
  attention with :mod:`attnlens.models.sparse`).

Then softmax over valid keys and the weighted sum, as in ``"attnlens"``. A layer without a
plan runs ``"attnlens"`` itself (so :class:`~attnlens.models.capture.Capture` still works
there). :func:`planned` installs per-layer plans on a model for the time of a ``with``.

>>> import torch
>>> from attnlens import load_model
>>> model = load_model("minilm-l6")
>>> ids = torch.tensor([[101, 7592, 2088, 2003, 102]])
>>> exact = model.forward(ids).last_hidden_state
>>> with planned(model, {0: LayerPlan(n=5)}):         # a plan with every head exact
...     same = model.forward(ids).last_hidden_state
>>> torch.equal(exact, same)
True
>>> keep = torch.ones(5, 5, dtype=torch.bool).triu()  # heads 0 and 1 of layer 0 see only keys at or after the query
>>> with planned(model, {0: LayerPlan(n=5, masked=[MaskedHeads([0, 1], keep)])}):
...     changed = model.forward(ids).last_hidden_state
>>> torch.equal(exact, changed)
False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models.attention import (
    ATTENTION_IMPLEMENTATION,
    PARTIAL_IMPLEMENTATION,
    attend,
    attention_scores,
    refuse_unsupported,
    remaining_or_unmodified,
    softmax,
    valid_and_bias,
)
from attnlens.models.capture import LAYER_ATTRIBUTE, attnlens_attention, layer_index

PLAN_ATTRIBUTE = "attnlens_plan"  # the attribute :func:`planned` sets on an attention module: its LayerPlan


def rebuild(exact: torch.Tensor, weights: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Rows ``(batch, head, q, n)`` from their k exact scores ``(batch, head, q, k)``: ``offset + Σ_j w_j·s_j``.

    ``weights`` (head, Q, n, k) and ``offset`` (head, Q, n) hold one map for every query
    (Q = 1) or one per query position (Q = q).

    >>> exact = torch.ones(1, 1, 3, 2)
    >>> rebuild(exact, torch.ones(1, 1, 4, 2), torch.zeros(1, 1, 4))[0, 0, 0].tolist()
    [2.0, 2.0, 2.0, 2.0]
    """
    if weights.shape[1] == 1:  # one map for all queries: a single matrix product per head
        return torch.matmul(exact, weights[:, 0].transpose(-1, -2)) + offset[None, :, 0:1]
    return torch.einsum("bhqk,hqnk->bhqn", exact, weights) + offset[None]


def rebuild_from(scores: torch.Tensor, positions: torch.Tensor, weights: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The plug-in form of :func:`rebuild`: rows rebuilt from every score (batch, head, q, n), read at
    ``positions`` (head, Q, k), Q = 1 meaning the same keys for every query."""
    batch, heads, queries, _ = scores.shape
    index = positions.to(scores.device)[None].expand(batch, heads, queries if positions.shape[1] == 1 else -1, -1)
    return rebuild(scores.gather(-1, index), weights.to(scores), offset.to(scores))


@dataclass
class PartialHeads:
    """Heads of one layer computed partially: ``positions`` (h, Q, k) exact keys, ``weights``
    (h, Q, n, k) and ``offset`` (h, Q, n), one map per head (Q = 1) or per head and query."""

    heads: list[int]
    positions: torch.Tensor
    weights: torch.Tensor
    offset: torch.Tensor

    def scores(self, query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None) -> torch.Tensor:
        """Rebuilt scores (batch, h, n, n) from the k exact scores of each query; ``query`` and ``key``
        hold this group's heads (batch, h, n, d)."""
        batch, heads, _, dim = key.shape
        positions = self.positions.to(key.device)
        if positions.shape[1] == 1:  # the same k keys for every query: (batch, h, k, d)
            chosen = key.gather(2, positions[None, :, 0, :, None].expand(batch, -1, -1, dim))
            exact = torch.matmul(query, chosen.transpose(-1, -2)).mul_(scaling)
        else:  # keys chosen per query: (batch, h, q, k, d), k dot products per query
            chosen = key[:, torch.arange(heads, device=key.device)[:, None, None], positions]
            exact = torch.einsum("bhqd,bhqkd->bhqk", query, chosen).mul_(scaling)
        if softcap is not None:
            exact = torch.tanh(exact / softcap) * softcap
        return rebuild(exact, self.weights.to(exact), self.offset.to(exact))


@dataclass
class MaskedHeads:
    """Heads of one layer that keep only the positions of ``keep`` (n, n): computed densely here;
    under ``"attnlens-kernels"`` (:mod:`attnlens.models.kernels`) by ``kernel``, ``"flex"`` or ``"sdpa"``."""

    heads: list[int]
    keep: torch.Tensor
    kernel: str = "sdpa"
    blocks: dict = field(default_factory=dict, repr=False, compare=False)  # FlexAttention's block mask, made once


@dataclass
class LayerPlan:
    """How one layer's heads are computed at width ``n``: heads in no group are exact."""

    n: int
    partial: list[PartialHeads] = field(default_factory=list)
    masked: list[MaskedHeads] = field(default_factory=list)

    def replace(self, scores: torch.Tensor) -> torch.Tensor:
        """The plug-in form, as a capture intervention: from every score (batch, head, n, n), the
        partial heads' rows rebuilt from their exact keys and the masked heads' positions removed."""
        changed = scores.clone()
        for part in self.partial:
            changed[:, part.heads] = rebuild_from(scores[:, part.heads], part.positions, part.weights, part.offset)
        for window in self.masked:
            changed[:, window.heads] = changed[:, window.heads].masked_fill(~window.keep.to(scores.device), float("-inf"))
        return changed

    def check(self, module: nn.Module, n: int) -> None:
        if n != self.n:
            raise BadInput(
                f"the plan for layer {getattr(module, LAYER_ATTRIBUTE, '?')} was made for sequences of {self.n} tokens, "
                f"not {n}; pad the inputs to {self.n} tokens or make a plan at this length"
            )


def partial_attention(
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
    """The ``AttentionInterface`` implementation registered as ``"attnlens-partial"``."""
    plan = plan_of(module)
    if plan is None:
        return attnlens_attention(module, query, key, value, attention_mask, scaling, dropout, softcap, **kwargs)
    refuse_unsupported(module, kwargs)
    batch, heads, n, _ = query.shape
    plan.check(module, n)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores, removed = _planned_scores(plan, query, key, scaling, softcap)
    valid, bias = valid_and_bias(attention_mask, scores)
    if bias is not None:  # an additive mask would have to reach the rebuilt scores too
        raise UnsupportedModel(
            f"{type(module).__name__} passes an additive attention mask; partial attention needs a boolean one"
        )
    replaced = scores if removed is None else scores.masked_fill(removed, float("-inf"))
    # the rows a mask empties (every valid key removed) keep their full scores, as in "attnlens"
    masked = remaining_or_unmodified(replaced, scores, valid, not bool(valid.all()))
    weights = softmax(masked, query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return attend(weights, value).transpose(1, 2).contiguous(), weights


def _planned_scores(
    plan: LayerPlan, query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every head's scores as the plan computes them, and the positions its masks remove (or ``None``)."""
    batch, heads, n, _ = query.shape
    group = heads // key.shape[1]
    exact = sorted(set(range(heads)) - {h for part in plan.partial for h in part.heads})
    if len(exact) == heads:  # no partial head: the very call "attnlens" makes, so exact heads are bit for bit the same
        scores = attention_scores(query, key, scaling, softcap)
        exact = []
    else:
        scores = query.new_empty(batch, heads, n, n)

    def own(selected: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(selected, device=query.device)
        return query.index_select(1, index), key.index_select(1, index // group)

    if exact:
        scores[:, exact] = attention_scores(*own(exact), scaling, softcap)
    for part in plan.partial:
        scores[:, part.heads] = part.scores(*own(part.heads), scaling, softcap)
    if not plan.masked:
        return scores, None
    removed = torch.zeros(1, heads, n, n, dtype=torch.bool, device=query.device)
    for window in plan.masked:
        removed[:, window.heads] = ~window.keep.to(query.device)
    return scores, removed


def attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    """The attention modules of a model loaded by :func:`attnlens.load_model`, by layer."""
    return {layer_index(module): module for module in model.modules() if hasattr(module, LAYER_ATTRIBUTE)}


def plan_of(module: nn.Module) -> LayerPlan | None:
    """The plan :func:`planned` (or :func:`set_plan`) gave an attention module, if any."""
    plan = getattr(module, PLAN_ATTRIBUTE, None)
    if plan is not None and not isinstance(plan, LayerPlan):
        raise BadInput(
            f"{type(module).__name__}.{PLAN_ATTRIBUTE} is a {type(plan).__name__}, not a LayerPlan; give plans to `planned`"
        )
    return plan


def set_plan(module: nn.Module, plan: LayerPlan | None) -> None:
    """Give an attention module a plan (``None``: take it away), read by the plan implementations.

    An attribute on the module, as transformers passes the implementation nothing else of
    attnlens'; ``setattr`` because ``nn.Module`` types its attributes as tensors and modules.
    """
    if plan is None:
        if hasattr(module, PLAN_ATTRIBUTE):
            delattr(module, PLAN_ATTRIBUTE)
    else:
        setattr(module, PLAN_ATTRIBUTE, plan)


@contextlib.contextmanager
def planned(model: Any, plans: dict[int, LayerPlan], implementation: str = PARTIAL_IMPLEMENTATION) -> Iterator[None]:
    """Run ``model`` (a :class:`~attnlens.models.loading.LoadedModel`) with ``plans`` by layer, through
    ``implementation`` (``"attnlens-partial"``, or ``"attnlens-kernels"`` for speed), inside the ``with``;
    layers without a plan stay exact."""
    modules = attention_modules(model.model)
    for layer, plan in plans.items():
        set_plan(modules[layer], plan)
    model.model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
        for layer in plans:
            set_plan(modules[layer], None)
