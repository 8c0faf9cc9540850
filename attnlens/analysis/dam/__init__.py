"""DAM: Differentiable Attention Masks learned on a frozen pretrained model (SparseBERT).

Mask logits ``α`` decide which (query, key) positions a model's attention keeps. Each
training step draws a Gumbel-sigmoid sample ``M_soft = σ((α + s·(g₁ - g₂))/τ)``, uses the
hard mask ``M = [α + s·(g₁ - g₂) > 0]`` in the forward pass with the straight-through
gradient of ``M_soft``, and removes what ``M`` drops (``removal``): by default
(``"renormalise"``) the attention weights are multiplied by ``M`` and renormalised over what
is kept, which equals setting removed scores to ``-inf`` in the forward pass and, unlike
adding ``(1 - M)·(-10⁴)`` to the scores (``"1e4"``, SparseBERT's), gives a removed position
the gradient of coming back. The loss is ``objective + λ·mean(M)``, where the mean runs over
every valid (layer, head, query, key) position, so ``mean(M)`` is the fraction of attention
kept (the density) and ``1 - mean(M)`` the sparsity. The model's weights stay frozen unless
``train_weights``.

**The recipe** (defaults of :class:`DamSettings`, found on minilm-l6 and gemma3-270m): Adam
at ``lr`` 0.1 on a cosine schedule down to ``lr_end`` = 1% of it at the step cap, the noise
scale ``s`` on the same schedule from 1 down to ``noise_end`` = 0.05 (late samples are the
hard mask that is judged), τ = 1, every logit starting at keep-probability ``init_keep`` 0.9
(or at a fixed pattern, ``init``). **Target sparsities** (``sparsity``) find their λ by dual
ascent from λ = 0.1 (from a warm start ``init``: where the gradients of a few batches balance,
:meth:`DamTrainer.balancing_lambda`): after each step
``log λ += dual_lr · schedule · (hard density - target)``; at the end
every logit is shifted by one constant so the hard mask meets the target on the training
blocks (:meth:`DamTrainer.calibrate`; the shift is recorded), since dual ascent leaves it a
few points off. **The stopping rule** (:class:`StoppingRule`): a run ends once, over the last
``stop_window`` steps, fewer than ``stop_flips`` of the hard mask's positions changed (a logit
changes its decision when it crosses 0 by more than ``stop_margin``) and the training loss
plateaued; ``steps`` is a cap, and a run that reached it is marked ``converged = False``.

Variants (how logits map onto positions; :data:`LAYOUTS`):

- ``unstructured`` (DAM_u): one logit per layer, head, query and key;
- ``structured`` (DAM_s): one logit per head and offset ``|i - j|``, shared by all layers;
- ``structured+global``: DAM_s plus, per head, logits for the rows and columns of the
  ``[CLS]`` (first) and ``[SEP]`` (last) tokens: the family of Longformer-like patterns;
- ``class``: one logit per layer, head and position class (each position belongs to the
  first listed class that contains it; ``other`` takes the rest).

After training, the deterministic mask ``α > 0`` is judged on held-out blocks (disjoint
from the training blocks): achieved sparsity (valid positions actually removed), the
objective with its bootstrap interval, and the keep-probability ``σ(α/s)`` (the probability
a sample keeps the position, ``s`` the noise scale at the end of training) per position
class; ``expected_sparsity`` is that of the sampled masks (``1 - mean σ(α/s)``). A row the hard mask would leave with no valid key keeps
its keys of largest logit (:func:`rescue_rows`; ``rows_rescued`` counts them): sparing
such a row whole, as ablations do, would let a large λ remove everything and look dense.
Fixed sparse patterns (:mod:`attnlens.analysis.dam.patterns`) are judged on the same blocks;
:meth:`DamResult.compared` sets each mask against the best pattern its layout can express
(:data:`EXPRESSES`) and the best overall at matched sparsity, with a paired interval. With
``train_weights`` the ``band``, ``local`` and ``bigbird`` points nearest each mask's sparsity
get the same weight training (:func:`adapt_to_pattern`) and are judged on the same blocks.

>>> from attnlens import dam
>>> result = dam("minilm-l6", lambdas=[0.0, 1.0], steps=3, stop_window=2, seq_len=16, train_seqs=4, eval_seqs=4,
...              batch_size=2, patterns=False, bootstrap=50, progress=False)
>>> result.table[["lambda", "steps"]].values.tolist()   # steps used: at most the cap
[[0.0, 3.0], [1.0, 3.0]]
>>> result.logits.shape                          # (lambda, head, offset) for the structured variant
(2, 12, 16)
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.dam.patterns import PATTERNS, build, removed_mask
from attnlens.analysis.evaluation import (
    bootstrap_interval,
    check_classes_occur,
    evaluate_batch,
    frozen,
    layer_groups,
    prepare_batches,
    removal,
    split_blocks,
    valid_masks,
)
from attnlens.analysis.objectives import OBJECTIVES, Objective, PreparedBatch
from attnlens.analysis.task import (
    Change,
    TaskBatch,
    TaskJudge,
    TaskLoss,
    TaskSettings,
    batches,
    content_key,
    task_columns,
)
from attnlens.data.corpus import Corpus, load_corpus
from attnlens.data.positions import class_masks, exclusive_index, parse_classes, token_roles
from attnlens.errors import AttnlensError, BadInput
from attnlens.io.provenance import provenance
from attnlens.io.results import Result
from attnlens.models.capture import Capture, Intervention
from attnlens.models.loading import LoadedModel, load_model
from attnlens.progress import Progress, progress_bar
from attnlens.settings import CorpusSettings, at_least, one_of, positive, probability

VARIANTS = ("unstructured", "structured", "structured+global", "class")
# Which fixed patterns each layout can express exactly: pattern -> its values (None: all of them).
# DAM_s is a function of the offset alone; +global adds the [CLS] rows and columns local(w) keeps;
# DAM_u is per position, shared by all blocks (not BigBird's random keys, drawn per block); the
# class layout with the default classes has self, prev and next: band(1), and everything but self.
EXPRESSES: dict[str, dict[str, tuple[int, ...] | None]] = {
    "structured": {"band": None, "no-diagonal": None},
    "structured+global": {"band": None, "no-diagonal": None, "local": None},
    "unstructured": {"band": None, "no-diagonal": None, "local": None, "strided": None, "fixed": None},
    "class": {"band": (1,), "no-diagonal": None},
}
MATCHED_COLUMNS = [
    "lambda", "dam_sparsity", "dam_delta", "pattern", "family", "value", "sparsity", "delta", "delta_low", "delta_high",
    "expressible", "difference", "difference_low", "difference_high",
]  # fmt: skip
ADAPTED_PATTERNS = ("band", "local", "bigbird")  # the patterns given the same weight training as a mask (train_weights)
MATCH_WITHIN = 0.03  # a pattern is compared with a mask only within 3 points of its sparsity
REMOVALS = ("1e4", "inf", "renormalise")
DEFAULT_SPARSITY = (0.8, 0.9, 0.95)  # the targets when neither `lambdas` nor `sparsity` is given
DUAL_START = 0.1  # the λ a target's run from the dense cold start begins at (dual ascent moves it)
DUAL_PROBES = 4  # batches whose gradients set the λ a target's run starts from (DamTrainer.balancing_lambda)
LAMBDA_FLOOR = 1e-3  # the least λ a target's run starts from (dual ascent moves λ in log space)
_NOISE_STREAM, _ORDER_STREAM, _PATTERN_STREAM, _PROBE_STREAM = 11, 12, 13, 14
_BIG = 1e4  # the straight-through gradient scale of both removals: ∂scores/∂M


def _seeded(seed: int, *stream: int) -> int:
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


def balancing_lambda(ratio: torch.Tensor, weights: torch.Tensor, keep: float) -> float:
    """The λ that leaves the share ``keep`` of ``weights`` on logits whose ``ratio`` exceeds it:
    the weighted (1 - keep) quantile of ``ratio``. With ``ratio`` the loss's pull on each logit
    over the density's (:meth:`DamTrainer.balancing_lambda`), those are the logits that rise.

    >>> balancing_lambda(torch.tensor([4.0, 1.0, 3.0, 2.0]), torch.tensor([1.0, 1.0, 2.0, 1.0]), 0.6)
    3.0
    """
    ratio, weights = ratio.flatten(), weights.flatten()
    order = torch.argsort(ratio, descending=True)
    kept = torch.cumsum(weights[order], 0) / weights.sum()  # the share kept when the cut passes each logit
    index = min(int(torch.searchsorted(kept, torch.tensor(keep, dtype=kept.dtype))), len(order) - 1)
    return float(ratio[order[index]])


# ----------------------------------------------------------------------------- layouts


class MaskLayout:
    """How mask logits map onto attention positions of the ``num_layers`` layers.

    ``expand(values, layer, context)`` gives a tensor broadcastable to (batch, head, n, n);
    ``counts(context)`` how many valid positions of the batch each logit controls.
    ``context`` is the batch's class index (batch, n, n), used by the class layout only.
    """

    name = ""
    shared_by_layers = False

    def __init__(self, num_layers: int, num_heads: int, n: int, valid: torch.Tensor, num_classes: int) -> None:
        self.num_layers, self.num_heads, self.n = num_layers, num_heads, n
        self.valid = valid  # (layer, n, n)
        self.num_classes = num_classes

    @property
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def expand(self, values: torch.Tensor, layer: int, context: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def counts(self, context: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def context(self, partition: dict[str, torch.Tensor], roles) -> torch.Tensor:
        """What ``expand`` needs of a batch beyond positions: nothing (a (batch, 1, 1) placeholder)
        unless the layout reads the tokens' classes or roles."""
        size = next(iter(partition.values())).shape[0]
        return torch.zeros(size, 1, 1, dtype=torch.long, device=self.valid.device)


class Unstructured(MaskLayout):
    """DAM_u: a logit per (layer, head, query, key)."""

    name = "unstructured"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_heads, self.n, self.n)

    def expand(self, values, layer, context):
        return values[layer][None]

    def counts(self, context):
        return self.valid[:, None].to(torch.float32).expand(self.shape) * context.shape[0]


class Structured(MaskLayout):
    """DAM_s: a logit per (head, offset |i - j|), shared by all layers."""

    name = "structured"
    shared_by_layers = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        index = torch.arange(self.n)
        self.offset = (index[:, None] - index[None, :]).abs().to(self.valid.device)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.n)

    def expand(self, values, layer, context):
        return values[:, self.offset][None]

    def counts(self, context):
        per_offset = torch.zeros(self.n, device=self.valid.device)
        per_offset.index_add_(0, self.offset.flatten(), self.valid.sum(0).flatten().to(torch.float32))
        return per_offset.expand(self.shape) * context.shape[0]


class StructuredGlobal(Structured):
    """DAM_s plus global tokens: per head, the offset logits and four more, for the rows and
    columns of the ``cls`` ([CLS] or the first token) and ``sep`` ([SEP] or the last token)
    roles, shared by all layers. Where they meet, a ``cls`` column beats a ``cls`` row beats a
    ``sep`` column beats a ``sep`` row. The family Longformer-like patterns (band + global) are in;
    a position in a global row or column is decided by that logit alone, so a band inside the
    ``sep`` row and column (``local(w)`` keeps it) is not expressible: one logit keeps or drops it all."""

    name = "structured+global"
    GLOBALS = ("cls row", "cls column", "sep row", "sep column")  # logits n, n + 1, n + 2, n + 3

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.n + len(self.GLOBALS))

    def context(self, partition, roles):
        cls, sep = roles.cls.to(self.valid.device), roles.sep.to(self.valid.device)
        code = torch.zeros(cls.shape[0], self.n, self.n, dtype=torch.long, device=self.valid.device)
        # from the lowest priority to the highest: a later assignment wins where they meet
        for number, role, axis in ((3, sep, "row"), (4, sep, "column"), (1, cls, "row"), (2, cls, "column")):
            hit = role[:, :, None] if axis == "row" else role[:, None, :]  # the query (row) or key (column) has the role
            code = torch.where(hit.expand_as(code), number, code)
        return code  # 0: an offset logit decides; k > 0: global logit n + k - 1

    def expand(self, values, layer, context):
        offsets = values[:, self.offset][None]  # (1, head, n, n)
        if context.shape[-1] != self.n:  # a placeholder context: offsets only
            return offsets
        globals_ = values[:, self.n - 1 + context.clamp_min(1)].transpose(0, 1)  # (batch, head, n, n)
        return torch.where(context[:, None] > 0, globals_, offsets)

    def counts(self, context):
        weight = self.valid.sum(0).to(torch.float32)  # (n, n): the layers each position is valid in
        per_logit = torch.zeros(self.n + len(self.GLOBALS), device=self.valid.device)
        for code in context:
            offsets = torch.where(code == 0, self.offset, self.n + code - 1)  # the logit deciding each position
            per_logit.index_add_(0, offsets.flatten(), weight.flatten())
        return per_logit.expand(self.shape)


class PerClass(MaskLayout):
    """A logit per (layer, head, position class)."""

    name = "class"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_heads, self.num_classes)

    def expand(self, values, layer, context):
        return values[layer][:, context].transpose(0, 1)  # (batch, head, n, n)

    def context(self, partition, roles):
        return exclusive_index(partition).to(self.valid.device)

    def counts(self, context):
        counts = torch.stack(
            [torch.bincount(context[:, valid].flatten(), minlength=self.num_classes)[: self.num_classes] for valid in self.valid]
        ).to(torch.float32)  # (layer, class)
        return counts[:, None].expand(self.shape)


LAYOUTS: dict[str, type[MaskLayout]] = {layout.name: layout for layout in (Unstructured, Structured, StructuredGlobal, PerClass)}


def decided(layout: MaskLayout, contexts: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """How many positions of a set (``masks``: one (batch, n, n) per context) each logit decides,
    over the valid positions of every layer: the adjoint of ``expand`` applied to the set (the
    gradient of Σ expand(values)·set)."""
    values = torch.zeros(layout.shape, requires_grad=True, device=layout.valid.device)
    total = 0.0
    for context, mask in zip(contexts, masks):
        for layer in range(layout.num_layers):
            chosen = (mask & layout.valid[layer][None]).to(torch.float32)[:, None]  # (batch, 1, n, n)
            total = total + (layout.expand(values, layer, context) * chosen).sum()
    (counts,) = torch.autograd.grad(total, values)
    return counts


def pattern_logits(layout: MaskLayout, keeps: list[tuple[torch.Tensor, torch.Tensor]], inside: float = 0.95) -> torch.Tensor:
    """Logits that start a layout at a fixed pattern: each logit's keep-probability is
    ``1 - inside`` plus ``2·inside - 1`` times the fraction of the positions it decides that the
    pattern keeps (so ``inside`` where the pattern keeps all of them, ``1 - inside`` where it
    keeps none). ``keeps``: (context, keep (batch, n, n)) of some batches.
    """
    contexts = [context for context, _ in keeps]
    kept = decided(layout, contexts, [keep for _, keep in keeps])
    counts = sum(layout.counts(context) for context in contexts)
    fraction = (kept / counts.clamp_min(1)).clamp(0, 1)
    probability = (1 - inside) + (2 * inside - 1) * fraction
    return torch.log(probability / (1 - probability))


def equal_by_construction(
    layout: MaskLayout, contexts: list[torch.Tensor], masks: list[dict[str, torch.Tensor]]
) -> dict[str, str]:
    """Classes whose keep-probability equals an earlier class's for any logits, because the layout
    decides both from the same logits in the same shares (DAM_s decides ``next`` by offset 1 as it
    does ``prev``, and in a bidirectional model the ``cls`` column meets every offset once, as the
    ``sep`` column does): class -> the earlier class it repeats.

    >>> n = 6
    >>> layout = LAYOUTS["structured"](1, 1, n, torch.ones(1, n, n, dtype=torch.bool), 1)
    >>> i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    >>> sets = {"prev": (j == i - 1)[None], "next": (j == i + 1)[None], "cls": (j == 0).expand(1, n, n), "sep": (j == n - 1).expand(1, n, n)}
    >>> equal_by_construction(layout, [torch.zeros(1, 1, 1, dtype=torch.long)], [sets])
    {'next': 'prev', 'sep': 'cls'}
    """
    names = list(masks[0])
    shares = {}
    for name in names:
        counts = decided(layout, contexts, [batch[name] for batch in masks])
        shares[name] = counts / counts.sum().clamp_min(1)
    same = {}
    for index, name in enumerate(names):
        earlier = next(
            (other for other in names[:index] if other not in same and torch.allclose(shares[other], shares[name], atol=1e-7)),
            None,
        )
        if earlier is not None and bool(shares[name].sum() > 0):
            same[name] = earlier
    return same


def parse_init(text: str | None, n: int) -> tuple[str, int] | None:
    """``"local(6)"`` -> ("local", 6); a pattern without a parameter by its name alone.

    >>> parse_init("band(4)", 32), parse_init("no-diagonal", 32), parse_init(None, 32)
    (('band', 4), ('no-diagonal', 0), None)
    """
    if text is None:
        return None
    name, _, rest = text.partition("(")
    if name not in PATTERNS:
        raise BadInput(f"`init` {text}: unknown pattern {name}; use one of {', '.join(PATTERNS)}, e.g. `init` local(6)")
    if PATTERNS[name].parameter == "none":
        if rest:
            raise BadInput(f"`init` {text}: {name} takes no parameter")
        return name, 0
    try:
        value = int(rest.removesuffix(")")) if rest.endswith(")") else None
    except ValueError:
        value = None
    if value is None or not 1 <= value < n:
        raise BadInput(
            f"`init` {text}: give {name}'s {PATTERNS[name].parameter} between 1 and n - 1 = {n - 1}, e.g. `init` {name}(4)"
        )
    return name, value


# ----------------------------------------------------------------------------- training


def parse_tau(tau: str | float | tuple[float, float]) -> tuple[float, float]:
    """``1.0`` (fixed) or ``"2:0.1"`` (annealed geometrically from 2 to 0.1) -> (start, end).

    >>> parse_tau("2:0.5"), parse_tau(1)
    ((2.0, 0.5), (1.0, 1.0))
    """
    if isinstance(tau, tuple):
        start, end = tau
    else:
        text = str(tau)
        try:
            parts = [float(part) for part in text.split(":")]
        except ValueError:
            raise AttnlensError(f"`tau` '{text}' is not a number or start:end pair, e.g. `tau` 1.0 or `tau` 2:0.2") from None
        if len(parts) not in (1, 2):
            raise AttnlensError(f"`tau` '{text}' is not a number or start:end pair, e.g. `tau` 1.0 or `tau` 2:0.2")
        start, end = parts[0], parts[-1]
    for value in (start, end):
        if not value > 0 or not math.isfinite(value):
            raise AttnlensError(f"`tau` {value:g}: the temperature τ must be greater than 0, e.g. `tau` 1.0")
    return float(start), float(end)


def cosine(step: int, steps: int, end: float) -> float:
    """A cosine schedule's factor: 1 at step 0, ``end`` at step ``steps - 1``.

    >>> cosine(0, 11, 0.1), round(cosine(5, 11, 0.1), 3), cosine(10, 11, 0.1)
    (1.0, 0.55, 0.1)
    """
    progress = step / max(steps - 1, 1)
    return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class StoppingRule:
    """When DAM training has converged: over the last ``window`` steps, fewer than ``flips``
    of the hard mask's positions (each logit weighted by the positions it decides) changed,
    and the training loss (objective + λ·sampled density, so logits still drifting towards the
    threshold count as change) has a mean over the window's second half within ``plateau``
    (relative) of its first half. ``steps`` is then only a cap.

    A decision changes when its logit crosses the threshold by more than ``margin`` (a
    hysteresis: it stays as it was while |α| <= margin). A position whose worth balances λ
    sits at the threshold and, as a kept position's gradient pushes it out and a removed one's
    pulls it back, crosses it every few steps by less than the learning rate however small that
    gets; counted as change, a few such logits would hold every run to the cap.

    >>> rule = StoppingRule(window=4, flips=0.001, plateau=0.01)
    >>> rule.plateaued([1.0, 1.0, 1.001, 0.999]), rule.plateaued([1.0, 1.0, 0.8, 0.8])
    (True, False)
    """

    window: int = 20
    flips: float = 0.001
    plateau: float = 0.01
    margin: float = 0.05

    def decisions(self, logits: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """The hard decisions after a step: α > margin keeps, α < -margin removes, and in between
        each keeps its decision ``before``.

        >>> rule = StoppingRule(margin=0.1)
        >>> rule.decisions(torch.tensor([0.5, 0.05, -0.05, -0.5]), torch.tensor([False, False, True, True])).tolist()
        [True, False, True, False]
        """
        return torch.where(logits.abs() > self.margin, logits > 0, before)

    def plateaued(self, objectives: list[float]) -> bool:
        """The last ``window`` losses: the second half's mean within ``plateau`` of the first's."""
        recent = np.asarray(objectives[-self.window :], dtype=np.float64)
        first, second = recent[: len(recent) // 2].mean(), recent[len(recent) // 2 :].mean()
        return bool(abs(second - first) <= self.plateau * max(abs(first), 1e-12))


class DamTrainer:
    """Learns the mask logits of one layout for one λ.

    ``__init__`` stores settings only; :meth:`start` creates ``logits_`` (and the optimiser
    and noise generator), :meth:`step` takes one training step, :meth:`fit` runs them all.

    The forward pass applies the hard mask exactly (``s + (1 - M)·(-10⁴)``, or ``-inf``).
    Its straight-through gradient treats the mask as ``s' = s + gradient_scale·(M - 1)``
    near the hard value: with ``gradient_scale = 1`` (the default) ``∂L/∂M`` is the
    first-order change of the loss when a position's ``exp(s)`` is gated, so ``λ`` trades
    loss against density in the loss's own units. Differentiating ``s + (1 - M)·(-10⁴)``
    literally, as SparseBERT does, is ``gradient_scale = 10⁴``; with Adam, which ignores
    the gradient's overall scale, that equals ``gradient_scale = 1`` with λ divided by 10⁴.
    """

    def __init__(
        self,
        layout: MaskLayout,
        *,
        lam: float | None,
        steps: int,
        tau: tuple[float, float] = (1.0, 1.0),
        lr: float = 0.05,
        lr_end: float = 1.0,
        noise_end: float = 1.0,
        init_keep: float = 0.9,
        init_logits: torch.Tensor | None = None,
        removal: str = "1e4",
        train_weights: bool = False,
        weights_lr: float = 1e-5,
        gradient_scale: float = 1.0,
        stopping: StoppingRule | None = None,
        target_density: float | None = None,
        dual_lr: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.layout = layout
        self.target_density = target_density
        self.dual_lr = dual_lr
        self.stopping = stopping
        self.lam = lam
        self.steps = steps
        self.tau = tau
        self.lr = lr
        self.lr_end = lr_end
        self.noise_end = noise_end
        self.init_keep = init_keep
        self.init_logits = init_logits
        self.removal = removal
        self.train_weights = train_weights
        self.weights_lr = weights_lr
        self.gradient_scale = gradient_scale
        self.seed = seed

    def start(self, model: LoadedModel) -> DamTrainer:
        self.model_ = model
        if self.init_logits is not None:  # a warm start (e.g. at a fixed pattern: pattern_logits)
            self.logits_ = self.init_logits.detach().clone().to(model.device).requires_grad_(True)
        else:
            init = math.log(self.init_keep / (1 - self.init_keep))
            self.logits_ = torch.full(self.layout.shape, init, device=model.device, requires_grad=True)
        groups = [{"params": [self.logits_], "lr": self.lr}]
        if self.train_weights:
            groups.append({"params": [p for p in model.model.parameters() if p.requires_grad], "lr": self.weights_lr})
        self.optimizer_ = torch.optim.Adam(groups)
        self.generator_ = torch.Generator().manual_seed(_seeded(self.seed, _NOISE_STREAM))
        self.step_ = 0
        return self

    def temperature(self, step: int) -> float:
        start, end = self.tau
        return start * (end / start) ** (step / max(self.steps - 1, 1))

    def rate(self, step: int) -> float:
        """The learning rates' factor at ``step``: a cosine from 1 down to ``lr_end`` at the step cap
        (1 throughout when ``lr_end`` is 1). It scales the logits' and the weights' rates."""
        return cosine(step, self.steps, self.lr_end)

    def noise(self, step: int) -> float:
        """The scale of the logistic noise at ``step``: a cosine from 1 down to ``noise_end``, so that
        late samples approach the hard mask α > 0 that is judged."""
        return cosine(step, self.steps, self.noise_end)

    def sample(self, tau: float, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A hard 0/1 mask with straight-through gradients of its Gumbel-sigmoid relaxation.

        Returns the mask for the penalty (gradient of ``M_soft``), the mask for the scores,
        whose gradient is scaled by ``gradient_scale / 10⁴`` so that the scores see
        ``∂s'/∂M = gradient_scale`` (see :class:`DamTrainer`), both equal to the hard mask,
        and the noisy logits ``α + g₁ - g₂`` the hard mask thresholds.
        """
        uniform = torch.rand(self.layout.shape, generator=self.generator_).clamp_(1e-6, 1 - 1e-6).to(self.logits_.device)
        noisy = self.logits_ + noise * (torch.log(uniform) - torch.log1p(-uniform))  # α + g₁ - g₂ (logistic noise)
        soft = torch.sigmoid(noisy / tau)
        hard = (noisy.detach() > 0).to(soft.dtype)
        relaxation = soft - soft.detach()  # zero, with the gradient of soft
        return hard + relaxation, hard + relaxation * (self.gradient_scale / _BIG), noisy.detach()

    def intervention(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor):
        """The score intervention that applies ``mask`` (logits' shape) in every layer.

        ``removal="1e4"`` adds ``(M - 1)·10⁴`` (a row with every key removed is then
        shifted as a whole, i.e. unmasked, as in SparseBERT); ``"inf"`` sets removed scores
        to ``-inf`` and lets a row with nothing left keep its keys of largest noisy logit.
        """
        layout, infinite = self.layout, self.removal == "inf"
        cache: dict[int, torch.Tensor] = {}  # a layout shared by layers is expanded once per step

        def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            key = 0 if layout.shared_by_layers else layer
            if key not in cache:
                expanded = layout.expand(mask, layer, context)
                cache[key] = expanded if infinite else (expanded - 1) * _BIG
            if not infinite:
                return scores + cache[key]
            expanded = cache[key]
            keep = rescue_rows(layout.expand(noisy, layer, context), valid[:, None])
            return scores.masked_fill(~keep, float("-inf")) + (expanded - expanded.detach()) * _BIG

        return intervene

    def gate(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor):
        """The weights intervention of ``removal="renormalise"``: the hard mask (rows it would
        empty keep their keys of largest noisy logit) multiplies the weights, which are then
        renormalised over what is kept. The forward pass equals removing the scores by -inf; the
        backward pass treats the mask as a gate on each weight, so a removed position still gets
        the gradient of bringing it back (weight w_ij / Σ kept, times its effect), which an
        additive -10⁴ on the scores zeroes (softmax's Jacobian carries the factor w_ij = 0)."""
        layout = self.layout

        def intervene(layer: int, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            soft = layout.expand(mask, layer, context)
            keep = rescue_rows(layout.expand(noisy, layer, context), valid[:, None]).to(weights.dtype)
            gated = weights * (keep + (soft - soft.detach()))
            return gated / gated.sum(-1, keepdim=True).clamp_min(1e-30)

        return intervene

    def sampled_loss(
        self, objective: Objective, batch: PreparedBatch, context: torch.Tensor, tau: float, noise: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective on ``batch`` under one sampled hard mask, and the mask's density (its
        straight-through relaxation carries the gradients to the logits)."""
        mask, score_mask, noisy = self.sample(tau, noise)
        counts = self.layout.counts(context)
        density = (mask * counts).sum() / counts.sum()
        if self.removal == "renormalise":
            capture = Capture(record=False, intervene_weights=self.gate(mask, context, noisy))
        else:
            capture = Capture(record=False, intervene=self.intervention(score_mask, context, noisy))
        with capture:
            task = objective.evaluate(batch)["loss"].mean()
        return task, density

    def balancing_lambda(self, objective: Objective, batches: list[PreparedBatch], contexts: list[torch.Tensor]) -> float:
        """The λ a run aimed at ``target_density`` starts from: at the starting logits, the λ at
        which the objective's gradient outweighs λ times the density's on exactly the target's share
        of positions, so the first steps move the mask towards the target instead of away from it
        (from a warm start at a pattern as sparse as the target, a λ too small would first undo the
        pattern). Averaged over ``batches`` and their sampled masks, drawn from a noise stream of
        their own; at least :data:`LAMBDA_FLOOR`."""
        saved, self.generator_ = self.generator_, torch.Generator().manual_seed(_seeded(self.seed, _PROBE_STREAM))
        pull, push, weights = (torch.zeros_like(self.logits_) for _ in range(3))
        for batch, context in zip(batches, contexts):
            task, density = self.sampled_loss(objective, batch, context, self.tau[0], self.noise(0))
            pull -= torch.autograd.grad(task, self.logits_, retain_graph=True)[0]  # > 0 where keeping more lowers the objective
            push += torch.autograd.grad(density, self.logits_)[0]
            counts = self.layout.counts(context)
            weights += (counts / counts.sum()).detach()
        self.generator_ = saved
        decided = weights > 0
        ratio = pull[decided] / push[decided].clamp_min(1e-30)
        return max(balancing_lambda(ratio, weights[decided], self.target_density), LAMBDA_FLOOR)

    def step(self, objective: Objective, batch: PreparedBatch, context: torch.Tensor) -> dict[str, float]:
        """One step on one batch: sample, forward with the mask, loss + λ·density, backward, update."""
        tau, rate = self.temperature(self.step_), self.rate(self.step_)
        for group, base in zip(self.optimizer_.param_groups, (self.lr, self.weights_lr)):
            group["lr"] = base * rate
        task, density = self.sampled_loss(objective, batch, context, tau, self.noise(self.step_))
        loss = task + self.lam * density
        self.optimizer_.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer_.step()
        self.step_ += 1
        with torch.no_grad():
            counts = self.layout.counts(context)
            weights = counts / counts.sum()
            keep = self.keep_probability(self.step_ - 1)
            hard_density = float((weights * (self.logits_ > 0)).sum())
            undecided = float((weights * ((keep > 0.1) & (keep < 0.9))).sum())
        if self.target_density is not None:  # dual ascent: λ rises while the hard mask keeps more than the target
            # in log space (λ's scale depends on the removal and the objective), on the logits' schedule
            self.lam = self.lam * math.exp(self.dual_lr * rate * (hard_density - self.target_density))
        return {
            "loss": loss.item(),
            "objective": task.item(),
            "density": density.item(),
            "hard_density": hard_density,
            "undecided": undecided,
            "tau": tau,
            "lr": self.lr * rate,
            **({"lambda_now": self.lam} if self.target_density is not None else {}),  # the λ dual ascent is at
        }

    def keep_probability(self, step: int) -> torch.Tensor:
        """σ(α / s): the probability that a sample at ``step`` keeps each position, where s is the
        noise scale then (α + s·logistic noise > 0); σ(α) without noise annealing."""
        return torch.sigmoid(self.logits_.detach() / max(self.noise(step), 1e-6))

    def calibrate(self, contexts: list[torch.Tensor]) -> float:
        """Shift every logit by one constant so that the hard mask α > 0, rows left empty rescued as
        when it is judged, keeps ``target_density`` of the valid positions of ``contexts``, as near
        as the logits' granularity allows: dual ascent leaves the density a few points off, and a
        comparison at matched sparsity needs it within one. The ranking of positions is unchanged.
        Returns the shift (subtracted)."""
        logits = self.logits_.detach()
        values = torch.unique(logits)  # ascending; a cut between two keeps the logits above it
        cuts = torch.cat([values[:1] - 1, (values[1:] + values[:-1]) / 2, values[-1:] + 1])
        density = {}

        def kept(index: int) -> float:
            if index not in density:
                density[index] = 1.0 - hard_sparsity(self.layout, logits - cuts[index], contexts)
            return density[index]

        low, high = 0, len(cuts) - 1  # the density falls as the cut rises
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if kept(middle) > self.target_density else (low, middle)
        best = min((low, high), key=lambda index: abs(kept(index) - self.target_density))
        shift = float(cuts[best])
        with torch.no_grad():
            self.logits_ -= shift
        return shift

    def flipped(self, before: torch.Tensor, now: torch.Tensor, context: torch.Tensor) -> float:
        """The fraction of positions (each logit weighted by the positions it decides) whose
        hard decision ``now`` differs from ``before``."""
        counts = self.layout.counts(context)
        return float((counts * (before != now)).sum() / counts.sum())

    def fit(
        self,
        model: LoadedModel,
        objective: Objective,
        batches: list[PreparedBatch],
        contexts: list[torch.Tensor],
        order: np.ndarray,
        bar=None,
    ) -> pd.DataFrame:
        """Steps on batches taken in ``order`` until the stopping rule says the mask has converged
        (or ``steps``, the cap); returns the training curve, with the fraction of the hard mask
        that flipped over the last window (``flipped``). ``converged_`` and ``steps_used_`` say how it ended."""
        self.start(model)
        if self.lam is None:  # a target's run: λ starts where the gradients balance
            with contextlib.nullcontext() if self.train_weights else frozen(model.model), torch.enable_grad():
                probes = [int(index) for index in order[:DUAL_PROBES]]
                self.lam = self.balancing_lambda(objective, [batches[i] for i in probes], [contexts[i] for i in probes])
        self.lambda_start_ = self.lam
        history, hard = [], [self.logits_.detach() > 0]  # the decisions of the last `window` + 1 steps
        self.converged_ = False
        weights = contextlib.nullcontext() if self.train_weights else frozen(model.model)
        with weights, torch.enable_grad():
            for step in range(self.steps):
                index = int(order[step])
                row = {"step": step, **self.step(objective, batches[index], contexts[index])}
                rule = self.stopping
                if rule is not None:
                    hard.append(rule.decisions(self.logits_.detach(), hard[-1]))
                    if len(hard) > rule.window + 1:
                        hard.pop(0)
                    if len(hard) == rule.window + 1:  # hard[0]: the decisions `window` steps ago
                        row["flipped"] = self.flipped(hard[0], hard[-1], contexts[index])
                history.append(row)
                if bar is not None:
                    bar.update(1)
                if rule is not None and "flipped" in row and row["flipped"] < rule.flips:
                    if rule.plateaued([entry["loss"] for entry in history]):
                        self.converged_ = True
                        break
        self.steps_used_ = len(history)
        self.shift_ = float("nan")  # no target, no shift
        if self.target_density is not None:
            self.shift_ = self.calibrate(contexts)
        if bar is not None:
            bar.update(self.steps - self.steps_used_)  # the steps a converged run did not need
        return pd.DataFrame(history)


# ----------------------------------------------------------------------------- evaluation


def rescue_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The keep mask ``values > 0`` among valid keys; a row that would keep no valid key keeps
    the valid keys of largest value (a query must attend somewhere).

    >>> valid = torch.ones(2, 3, dtype=torch.bool)
    >>> rescue_rows(torch.tensor([[1.0, -1.0, 2.0], [-3.0, -1.0, -2.0]]), valid).tolist()
    [[True, False, True], [False, True, False]]
    """
    masked = values.masked_fill(~valid, float("-inf"))
    keep = masked > 0
    empty = ~keep.any(-1, keepdim=True) & valid.any(-1, keepdim=True)
    best = masked == masked.amax(-1, keepdim=True)
    return keep | (empty & best & valid)


def _hard_removals(layout: MaskLayout, logits: torch.Tensor, context: torch.Tensor) -> tuple[list[torch.Tensor], float, float]:
    """Per layer, the (batch|1, head, n, n) valid positions the deterministic mask α > 0
    removes (rows left empty keep their most probable keys), and the rescued and total rows."""
    removals, rescued, rows = [], 0.0, 0.0
    for layer in range(layout.num_layers):
        valid = layout.valid[layer][None, None]
        values = layout.expand(logits, layer, context)
        keep = rescue_rows(values, valid)
        removals.append(valid & ~keep)
        shape = torch.broadcast_shapes(values.shape, (context.shape[0], layout.num_heads, 1, 1))[:2]
        kept_rows = (values.masked_fill(~valid, float("-inf")) > 0).any(-1)
        rescued += float((~kept_rows & valid.any(-1)).expand(*shape, -1).sum())
        rows += float(valid.any(-1).expand(*shape, -1).sum())
    return removals, rescued, rows


def hard_sparsity(layout: MaskLayout, logits: torch.Tensor, contexts: list[torch.Tensor]) -> float:
    """The fraction of valid (layer, head, query, key) positions of ``contexts`` that the hard
    mask α > 0 removes, rows left empty rescued (:func:`rescue_rows`)."""
    removed = total = 0.0
    for context in contexts:
        removals, _, _ = _hard_removals(layout, logits, context)
        for layer, removal_now in enumerate(removals):
            removed += float(removal_now.expand(context.shape[0], layout.num_heads, -1, -1).sum())
            total += float(layout.valid[layer].sum()) * context.shape[0] * layout.num_heads
    return removed / total


def evaluate_mask(
    layout: MaskLayout,
    logits: torch.Tensor,
    objective: Objective,
    batches: list[PreparedBatch],
    contexts: list[torch.Tensor],
    masks: list[dict[str, torch.Tensor]],
    noise: float = 1.0,
) -> dict[str, np.ndarray]:
    """Held-out losses under the hard mask, sparsity, and keep statistics per (layer, head, class):
    the keep-probability of a sample at noise scale ``noise``, σ(α / noise)."""
    logits = logits.detach()
    probability = torch.sigmoid(logits / max(noise, 1e-6))
    valid = layout.valid
    num_classes = len(masks[0])
    keep_sum = np.zeros((layout.num_layers, layout.num_heads, num_classes))
    kept_sum = np.zeros_like(keep_sum)
    positions = np.zeros((layout.num_layers, num_classes))
    removed = total = rescued = rows = expected = counted = 0.0
    losses = []
    for batch, context, batch_masks in zip(batches, contexts, masks):
        removals, batch_rescued, batch_rows = _hard_removals(layout, logits, context)
        rescued += batch_rescued
        rows += batch_rows
        counts = layout.counts(context)
        expected += float((probability * counts).sum())
        counted += float(counts.sum())
        intervene = removal(lambda layer, valid_now: removals[layer])
        losses.append(evaluate_batch(objective, batch, intervene)["loss"])
        stacked = torch.stack(list(batch_masks.values())).to(torch.float32)  # (class, batch, n, n)
        size = context.shape[0]
        for layer in range(layout.num_layers):
            in_class = stacked * valid[layer].to(torch.float32)
            p = layout.expand(probability, layer, context).expand(size, -1, -1, -1)
            kept = 1.0 - removals[layer].to(torch.float32).expand(size, layout.num_heads, -1, -1)
            keep_sum[layer] += torch.einsum("bhqk,cbqk->hc", p, in_class).double().cpu().numpy()
            kept_sum[layer] += torch.einsum("bhqk,cbqk->hc", kept, in_class).double().cpu().numpy()
            positions[layer] += in_class.sum((1, 2, 3)).double().cpu().numpy()
            removed += float(removals[layer].expand(size, layout.num_heads, -1, -1).sum())
            total += float(valid[layer].sum()) * size * layout.num_heads
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "losses": np.concatenate(losses),
            "sparsity": np.array(removed / total),
            "expected_sparsity": np.array(1 - expected / counted),
            "rows_rescued": np.array(rescued / rows),
            "keep_probability": keep_sum / positions[:, None, :],
            "kept": kept_sum / positions[:, None, :],
            "positions": positions,
        }


def pattern_removals(
    name: str, value: int, n: int, roles_cls: torch.Tensor, block_index: np.ndarray, sizes: list[int], group_valid, seed: int
) -> list[list[torch.Tensor]]:
    """Per batch of ``sizes`` blocks, per layer group, the (batch, n, n) positions pattern ``name``
    at ``value`` removes (after the row guard). BigBird's random keys are seeded by the batch's
    first block, so a block gets the same pattern wherever it is judged."""
    removals, start = [], 0
    for size in sizes:
        generator = torch.Generator().manual_seed(_seeded(seed, _PATTERN_STREAM, int(block_index[start])))
        keep = build(name, n, value, roles_cls[start : start + size], generator)
        removals.append([removed_mask(keep, gv) for gv in group_valid])
        start += size
    return removals


def judge_pattern(
    objective: Objective, batches: list[PreparedBatch], removals: list[list[torch.Tensor]], groups: list[int], group_valid
) -> tuple[np.ndarray, float]:
    """Per-block losses under a pattern's ``removals`` (:func:`pattern_removals`), and the
    fraction of valid (layer, query, key) positions they remove."""
    losses, removed, total = [], 0.0, 0.0
    for batch, per_group in zip(batches, removals):
        intervene = removal(lambda layer, valid_now, per_group=per_group: per_group[groups[layer]][:, None])
        losses.append(evaluate_batch(objective, batch, intervene)["loss"])
        for group in groups:  # one entry per layer
            removed += float(per_group[group].sum())
            total += float(group_valid[group].sum()) * per_group[group].shape[0]
    return np.concatenate(losses), removed / total


def adapt_to_pattern(
    model: LoadedModel,
    objective: Objective,
    batches: list[PreparedBatch],
    removals: list[list[torch.Tensor]],
    groups: list[int],
    order: np.ndarray,
    steps: int,
    cap: int,
    weights_lr: float,
    lr_end: float,
    bar=None,
) -> list[float]:
    """Fine-tune the weights under a fixed pattern as :class:`DamTrainer` does under a learned mask
    (``train_weights``): Adam at ``weights_lr`` on the same cosine schedule over ``cap`` steps, the
    same batches in the same ``order``, for ``steps`` steps. Returns the training losses; the
    caller restores the weights."""
    parameters = [parameter for parameter in model.model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=weights_lr)
    losses = []
    with torch.enable_grad():
        for step in range(steps):
            optimizer.param_groups[0]["lr"] = weights_lr * cosine(step, cap, lr_end)
            index = int(order[step])
            per_group = removals[index]
            intervene = removal(lambda layer, valid_now, per_group=per_group: per_group[groups[layer]][:, None])
            with Capture(record=False, intervene=intervene):
                loss = objective.evaluate(batches[index])["loss"].mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if bar is not None:
                bar.update(1)
    return losses


def evaluate_patterns(
    objective: Objective,
    batches: list[PreparedBatch],
    block_index: np.ndarray,
    roles_cls: torch.Tensor,
    valid: torch.Tensor,
    seed: int,
    bar=None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Every fixed pattern at every parameter value: per-block losses and honest sparsity."""
    groups, group_valid = layer_groups(valid)
    n = valid.shape[-1]
    sizes = [batch.input_ids.shape[0] for batch in batches]
    rows, losses = [], []
    for pattern in PATTERNS.values():
        for value in pattern.values(n):
            removals = pattern_removals(pattern.name, value, n, roles_cls, block_index, sizes, group_valid, seed)
            pattern_losses, removed = judge_pattern(objective, batches, removals, groups, group_valid)
            losses.append(pattern_losses)
            rows.append(
                {
                    "pattern": pattern.name,
                    "family": pattern.family,
                    "parameter": pattern.parameter,
                    "value": value,
                    "sparsity": removed,
                }
            )
            if bar is not None:
                bar.update(1)
    return pd.DataFrame(rows), np.stack(losses)


def _batch_order(rng: np.random.Generator, num_batches: int, steps: int) -> np.ndarray:
    """Which training batch each step takes: seeded epochs of permutations, cut at ``steps``."""
    epochs = math.ceil(steps / num_batches)
    return np.concatenate([rng.permutation(num_batches) for _ in range(epochs)])[:steps]


def mask_change(layout: MaskLayout, logits: torch.Tensor, model: LoadedModel, layout_classes, key: str) -> Change:
    """The hard mask ``α > 0`` of ``layout`` as a task :class:`Change` (rows left empty keep
    their most probable keys, as in :func:`evaluate_mask`), read off each batch's valid mask."""

    def intervention(batch: TaskBatch) -> Intervention:
        context = (
            exclusive_index(class_masks(batch.ids, model, layout_classes))
            if isinstance(layout, PerClass)
            else torch.zeros(batch.ids.shape[0], 1, 1, dtype=torch.long, device=batch.ids.device)
        )

        def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            keep = rescue_rows(layout.expand(logits, layer, context), valid[:, None])
            return scores.masked_fill(valid[:, None] & ~keep, float("-inf"))

        return intervene

    return Change(key, intervention)


def pattern_change(model: LoadedModel, name: str, value: int, n: int, seed: int) -> Change:
    """Fixed pattern ``name`` at ``value`` as a task :class:`Change`, under the row guard."""

    def intervention(batch: TaskBatch) -> Intervention:
        generator = torch.Generator().manual_seed(_seeded(seed, _PATTERN_STREAM, batch.start))
        keep = build(name, n, value, token_roles(batch.ids, model).cls, generator)
        return lambda layer, scores, valid: scores.masked_fill(removed_mask(keep, valid)[:, None], float("-inf"))

    return Change(f"pattern/{name}/{value}/{seed}", intervention)


def pattern_points(n: int) -> int:
    return sum(len(pattern.values(n)) for pattern in PATTERNS.values())


# ----------------------------------------------------------------------------- result


class DamResult(Result):
    """A λ sweep of learned masks, with the fixed patterns judged on the same held-out blocks.

    Tables: ``table`` (one row per λ: sparsity, held-out loss and its change against the
    unmodified model, with bootstrap intervals), ``keep`` (λ, layer, head, class:
    keep-probability σ(α) and the fraction the hard mask keeps), ``keep_summary`` (λ,
    class), ``patterns`` (pattern, parameter value: sparsity, loss, its change), ``training``
    (λ, step). With the ``hidden`` objective ``table`` and ``patterns`` carry the change
    (``delta``) only: the unmodified model's loss is 0 by definition, so the loss would
    repeat it (``meta["columns"]``); the unmodified loss is ``meta["baseline"]``.
    Arrays: ``logits`` (λ, *layout shape), ``keep_images`` (λ, layer, head, n, n) keep
    probabilities on the first held-out block, per-block losses.
    """

    kind = "dam"
    main_table = "summary"
    keep = property(lambda self: self.tables["keep"])
    keep_summary = property(lambda self: self.tables["keep_summary"])
    patterns = property(lambda self: self.tables["patterns"])
    training = property(lambda self: self.tables["training"])
    logits = property(lambda self: self.arrays["logits"])

    def matched(self, within: float = MATCH_WITHIN) -> pd.DataFrame:
        """For each λ and each pattern, the pattern point whose sparsity is nearest the mask's, if it
        is within ``within`` of it (a pattern that cannot come that close is left out: a comparison
        at another sparsity is not a comparison). With ``train_weights`` the patterns are those given
        the same weight training (``patterns_adapted``). ``expressible``: the mask's layout can
        express the pattern (:data:`EXPRESSES`); ``difference`` is the mask's held-out loss minus the
        pattern's, paired over blocks, with its bootstrap interval."""
        adapted = "patterns_adapted" in self.tables
        points = self.tables["patterns_adapted"] if adapted else self.patterns
        losses = self.arrays["adapted_pattern_losses" if adapted else "pattern_losses"]
        settings = self.settings
        expresses = EXPRESSES[settings["variant"]]
        rows, differences = [], []
        for number, dam_row in self.table.reset_index(drop=True).iterrows():
            candidates = points[points["lambda"] == dam_row["lambda"]] if adapted else points
            for name, group in candidates.groupby("pattern", sort=False):
                position = int((group["sparsity"] - dam_row["sparsity"]).abs().argmin())
                nearest = group.iloc[position]
                if abs(nearest["sparsity"] - dam_row["sparsity"]) > within:
                    continue
                values = expresses.get(name, ())
                rows.append(
                    {
                        "lambda": dam_row["lambda"],
                        "dam_sparsity": dam_row["sparsity"],
                        "dam_delta": dam_row["delta"],
                        "pattern": name,
                        "family": nearest["family"],
                        "value": nearest["value"],
                        "sparsity": nearest["sparsity"],
                        "delta": nearest["delta"],
                        "delta_low": nearest["delta_low"],
                        "delta_high": nearest["delta_high"],
                        "expressible": values is None or int(nearest["value"]) in values,
                    }
                )
                differences.append(self.arrays["eval_losses"][number] - losses[group.index[position]])
        table = pd.DataFrame(rows, columns=MATCHED_COLUMNS[:-3])
        if rows:
            mean, low, high = bootstrap_interval(np.stack(differences), settings["bootstrap"], settings["seed"])
        else:
            mean = low = high = np.zeros(0)
        return table.assign(difference=mean, difference_low=low, difference_high=high)

    def compared(self, within: float = MATCH_WITHIN) -> pd.DataFrame:
        """Per λ, the mask against the best pattern (lowest held-out loss) its own layout can express
        (``scope`` "own family") and the best of all (``scope`` "overall"), at matched sparsity:
        ``verdict`` is "worse" or "better" when the paired interval of the difference excludes 0,
        else "on par"."""
        matched = self.matched(within)
        rows = []
        for _, group in matched.groupby("lambda", sort=False):
            for scope, candidates in (("own family", group[group["expressible"]]), ("overall", group)):
                if not len(candidates):
                    continue
                best = candidates.loc[candidates["delta"].idxmin()]
                verdict = "worse" if best["difference_low"] > 0 else "better" if best["difference_high"] < 0 else "on par"
                rows.append({**best.to_dict(), "scope": scope, "verdict": verdict})
        return pd.DataFrame(rows, columns=[*MATCHED_COLUMNS, "scope", "verdict"])

    def summary(self) -> str:
        settings = self.settings
        runs = f"sparsity {settings['sparsity']}" if settings["lambdas"] is None else f"lambdas {settings['lambdas']}"
        return f"variant {settings['variant']!r}, {runs}"


# ----------------------------------------------------------------------------- main


# ---------------------------------------------------------------------- settings


@dataclass(frozen=True)
class DamSettings(CorpusSettings, TaskSettings):
    """Settings of :func:`dam`: the mask ``variant``, the sparsity weights ``lambdas``, the
    optimiser (``steps``, Gumbel-sigmoid temperature ``tau`` fixed or ``"start:end"``,
    ``lr``, initial keep-probability ``init_keep``), how removed scores are masked
    (``removal``), fine-tuning the weights alongside (``train_weights``, ``weights_lr``),
    the position ``classes`` reported (and learned by the ``class`` variant), the
    ``objective``, ``train_seqs`` and ``eval_seqs`` (disjoint blocks), the fixed
    ``patterns``, and ``bootstrap`` resamples; corpus settings as :class:`CorpusSettings`.
    With ``task`` (:class:`~attnlens.analysis.task.TaskSettings`) every mask and pattern is
    also judged by task accuracy, and the masks train against the task's probe loss
    when its examples are full blocks of ``seq_len`` tokens (else against ``objective``,
    as ``meta["settings"]["trained_on"]`` says).

    >>> DamSettings(lambdas=[0.1, -1])
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: lambdas -1: λ must be 0 or more (a finite number), e.g. lambdas 0.01,0.1
    """

    variant: str = "structured"
    lambdas: tuple[float, ...] | None = None  # fixed sparsity weights, instead of target sparsities
    sparsity: tuple[float, ...] | None = None  # target sparsities (None and no lambdas: DEFAULT_SPARSITY)
    dual_lr: float = 0.2
    dual_start: float | None = None  # the λ a target's run starts from; None: DUAL_START, or with `init` where gradients balance
    steps: int = 300  # the cap: the stopping rule usually ends a run earlier
    tau: str | float | tuple[float, float] = 1.0
    lr: float = 0.1
    lr_end: float = 0.01  # the learning rate at the step cap, as a fraction of `lr` (cosine schedule)
    noise_end: float = 0.05  # the logistic noise's scale at the step cap (cosine schedule)
    init_keep: float = 0.9
    init: str | None = None  # a fixed pattern to start the logits at, e.g. "local(6)"
    removal: str = "renormalise"
    train_weights: bool = False
    weights_lr: float = 1e-5
    classes: str | tuple[str, ...] | None = None
    objective: str = "auto"
    train_seqs: int = 256
    eval_seqs: int = 64
    batch_size: int = 16
    patterns: bool = True
    bootstrap: int = 1000
    stop_window: int = 20
    stop_flips: float = 0.001
    stop_plateau: float = 0.01
    stop_margin: float = 0.05  # a decision changes when its logit crosses the threshold by more than this

    def validate(self) -> None:
        super().validate()
        one_of("variant", self.variant, VARIANTS)
        if self.lambdas is not None and self.sparsity is not None:
            raise BadInput("give `lambdas` or `sparsity`, not both: a target sparsity finds its own λ")
        for value in self.sparsity or ():
            probability("sparsity", value, ": a target sparsity is strictly between 0 and 1, e.g. `sparsity` 0.8,0.9")
        positive("dual_lr", self.dual_lr)
        if self.dual_start is not None:
            positive("dual_start", self.dual_start, " (λ moves in log space), e.g. `dual_start` 1")
        if self.lambdas is not None and not self.lambdas:
            raise BadInput("`lambdas` is empty; give at least one λ, e.g. `lambdas` 0.01,0.1")
        for value in self.lambdas or ():
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
                raise BadInput(f"`lambdas` {shown}: λ must be 0 or more (a finite number), e.g. `lambdas` 0.01,0.1")
        at_least("stop_window", self.stop_window, 2, " steps (the stopping rule compares two halves of it)")
        at_least(
            "steps", self.steps, self.stop_window, f": the stopping rule needs `stop_window` ({self.stop_window}) steps to judge"
        )
        probability("stop_flips", self.stop_flips, ", e.g. 0.001")
        positive("stop_plateau", self.stop_plateau, ", e.g. 0.01")
        if not (self.stop_margin >= 0 and math.isfinite(self.stop_margin)):
            raise BadInput(f"`stop_margin` {self.stop_margin:g}: a distance of logits, 0 or more, e.g. `stop_margin` 0.05")
        positive("lr", self.lr, ", e.g. `lr` 0.05")
        if not 0 < self.lr_end <= 1:
            raise BadInput(
                f"`lr_end` {self.lr_end:g}: the final learning rate is a fraction of `lr` in (0, 1], e.g. `lr_end` 0.01"
            )
        if not 0 <= self.noise_end <= 1:
            raise BadInput(f"`noise_end` {self.noise_end:g}: the final noise scale is in [0, 1], e.g. `noise_end` 0.05")
        probability("init_keep", self.init_keep, ", e.g. 0.9")
        parse_init(self.init, self.seq_len)
        if self.removal not in REMOVALS:
            raise BadInput(
                f"`removal` {self.removal} is unknown; use 1e4 (add -10^4 to removed scores), inf, or renormalise "
                "(zero the removed weights and renormalise the kept ones)"
            )
        if self.train_weights:
            positive("weights_lr", self.weights_lr)
        parse_tau(self.tau)
        parse_classes(self.classes)
        one_of("objective", self.objective, OBJECTIVES)
        at_least("train_seqs", self.train_seqs, 1)
        at_least("eval_seqs", self.eval_seqs, 1)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")


def _dual_start(init: str | None) -> float | None:
    """The λ a target's run starts from unless given: :data:`DUAL_START` from the dense cold start,
    where every logit must fall and the logits crossing 0 together set the path (on minilm-l6 a
    balancing start changed DAM_s's held-out loss by -0.004, +0.057 and -0.030 at 80/90/95%); from a
    warm start, where the gradients balance (None, :meth:`DamTrainer.balancing_lambda`), since a
    pattern already near the target is held there instead of first undone by a λ too small."""
    return None if init is not None else DUAL_START


def dam(
    source: str | LoadedModel = "minilm-l6",
    settings: DamSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> DamResult:
    """Learn attention masks for each λ on training blocks and judge them on held-out blocks.

    ``source`` is a model (alias, path, Hub id or :class:`LoadedModel`); ``settings``
    (:class:`DamSettings`) with keyword ``changes`` applied. Every λ starts from the same
    logits (``init_keep`` keep-probability) and sees the same batches and noise
    (``seed``). With ``train_weights`` the model is fine-tuned alongside (learning rate
    ``weights_lr``) and restored after each λ.
    """
    s = DamSettings.build(settings, **changes)
    # (starting λ, target sparsity or None) per run
    runs = (
        [(float(value), None) for value in s.lambdas]
        if s.lambdas is not None
        else [(s.dual_start or _dual_start(s.init), float(target)) for target in (s.sparsity or DEFAULT_SPARSITY)]
    )
    model, corpus = source, s.corpus
    explicit = s.classes is not None
    classes = parse_classes(s.classes)
    tau = parse_tau(s.tau)
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    if not isinstance(model, LoadedModel):
        model = load_model(model, device=device)
    model.check_seq_len(s.seq_len)
    judge = Objective(model, s.objective, seed=s.seed)
    eval_blocks, train_blocks = split_blocks(corpus, model, s.seq_len, s.eval_seqs, s.train_seqs, seed=s.seed)
    valid = valid_masks(model, eval_blocks.ids).to(model.device)
    groups, group_valid = layer_groups(valid)

    eval_ids, train_ids = torch.from_numpy(eval_blocks.ids), torch.from_numpy(train_blocks.ids)
    eval_roles, train_roles = token_roles(eval_ids, model), token_roles(train_ids, model)
    probe_masks = class_masks(eval_ids, model, classes, roles=eval_roles)
    counts = {name: int(sum(int((mask & gv).sum()) for gv in valid)) for name, mask in probe_masks.items()}
    classes, notes = check_classes_occur(classes, counts, model, len(eval_blocks), explicit=explicit)
    # The class layout needs a partition: "other" takes what the listed classes leave.
    layout_classes = classes if "other" in classes else (*classes, "other")
    layout = LAYOUTS[s.variant](model.num_layers, model.num_heads, s.seq_len, valid, len(layout_classes))

    def contexts_of(ids: torch.Tensor, roles, size: int) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        contexts, report = [], []
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            chunk_roles = type(roles)(
                roles.cls[start : start + size],
                roles.sep[start : start + size],
                roles.punct[start : start + size],
                roles.description,
            )
            partition = class_masks(chunk, model, layout_classes, roles=chunk_roles)
            contexts.append(layout.context(partition, chunk_roles).to(model.device))
            report.append(
                {name: mask.to(model.device) for name, mask in class_masks(chunk, model, classes, roles=chunk_roles).items()}
            )
        return contexts, report

    # Batches are prepared before any training: the hidden objective's references come
    # from the unmodified model even when its weights are fine-tuned.
    eval_batches = prepare_batches(judge, eval_blocks.ids, s.batch_size)
    train_batches = prepare_batches(judge, train_blocks.ids, s.batch_size)
    eval_contexts, eval_masks = contexts_of(eval_ids, eval_roles, s.batch_size)
    same = equal_by_construction(layout, eval_contexts, eval_masks)
    train_contexts, train_masks = contexts_of(train_ids, train_roles, s.batch_size)
    init_logits = None
    if s.init is not None:  # the pattern on the corpus's training blocks, averaged into each logit
        name, value = parse_init(s.init, s.seq_len)
        generator = torch.Generator().manual_seed(_seeded(s.seed, _PATTERN_STREAM))
        cls = train_roles.cls.to(model.device)
        keeps = [
            (context, build(name, s.seq_len, value, cls[number * s.batch_size : number * s.batch_size + len(context)], generator))
            for number, context in enumerate(train_contexts[: len(train_batches)])
        ]
        init_logits = pattern_logits(layout, keeps)
    rng = np.random.default_rng(_seeded(s.seed, _ORDER_STREAM))
    order = _batch_order(rng, len(train_batches), s.steps)

    task = None
    if s.task is not None:  # examples padded to n, the width of the layouts and patterns
        task = TaskJudge(model, TaskSettings.of(s), seq_len=s.seq_len, batch_size=s.batch_size, seed=s.seed, pad_to=s.seq_len)
    trained_on = judge.name
    if task is not None and not (task.train.padded or task.held_out.padded):
        trained_on = "task"
        train_batches = list(batches(task.train, s.batch_size, model.device))
        train_ids = torch.from_numpy(task.train.ids)
        train_contexts, train_masks = contexts_of(train_ids, token_roles(train_ids, model), s.batch_size)
        order = _batch_order(rng, len(train_batches), s.steps)
    trainer_objective = TaskLoss(task) if trained_on == "task" else judge
    train_cls = token_roles(train_ids, model).cls.to(model.device)  # the global keys of the blocks trained on
    train_index = train_blocks.index if trained_on != "task" else np.arange(len(train_ids))  # seeds BigBird's random keys
    task_rows = []

    baseline = np.concatenate([evaluate_batch(judge, batch)["loss"] for batch in eval_batches])
    original = copy.deepcopy(model.model.state_dict()) if s.train_weights else None
    adapting = s.train_weights and s.patterns
    train_sizes = [len(chunk) for chunk in train_ids.split(s.batch_size)]  # blocks or task examples
    eval_cls, eval_sizes = eval_roles.cls.to(model.device), [batch.input_ids.shape[0] for batch in eval_batches]
    total = (
        len(runs) * (s.steps + 1)
        + (pattern_points(s.seq_len) * (2 if task is not None else 1) if s.patterns else 0)
        + (len(runs) * len(ADAPTED_PATTERNS) * s.steps if adapting else 0)
    )
    summary_rows, keep_rows, keep_summary_rows, curves, adapted_rows = [], [], [], [], []
    logits_all, images, losses_all, adapted_losses = [], [], [], []
    groups_of_layers, group_valid = layer_groups(valid)
    with progress_bar(total=total, desc="dam", unit="step", enabled=progress) as bar:
        if s.patterns:  # judged first (on the unmodified model): weight training under a pattern needs their sparsity
            pattern_table, pattern_losses = evaluate_patterns(
                judge, eval_batches, eval_blocks.index, eval_cls, valid, s.seed, bar
            )
        else:
            pattern_table, pattern_losses = (
                pd.DataFrame(columns=["pattern", "family", "parameter", "value", "sparsity"]),
                np.zeros((0, len(baseline))),
            )

        def on_training_blocks(logits: torch.Tensor) -> dict[str, float]:  # what training optimised, as judged
            seen = evaluate_mask(layout, logits, trainer_objective, train_batches, train_contexts, train_masks)
            return {"loss": float(seen["losses"].mean()), "sparsity": float(seen["sparsity"])}

        start = on_training_blocks(init_logits) if init_logits is not None else None  # the pattern, the same for every run
        for lam, target in runs:
            began = time.perf_counter()
            trainer = DamTrainer(
                layout,
                lam=lam,
                target_density=None if target is None else 1.0 - target,
                dual_lr=s.dual_lr,
                steps=s.steps,
                tau=tau,
                lr=s.lr,
                lr_end=s.lr_end,
                noise_end=s.noise_end,
                init_keep=s.init_keep,
                init_logits=init_logits,
                removal=s.removal,
                train_weights=s.train_weights,
                weights_lr=s.weights_lr,
                stopping=StoppingRule(s.stop_window, s.stop_flips, s.stop_plateau, s.stop_margin),
                seed=s.seed,
            )
            curve = trainer.fit(model, trainer_objective, train_batches, train_contexts, order, bar)
            trained = on_training_blocks(trainer.logits_)
            seconds = time.perf_counter() - began
            lam = trainer.lam  # a target's run ends at the λ dual ascent found: its key in every table
            noise = trainer.noise(trainer.steps_used_ - 1)  # the sampler's at the end: keep-probabilities are σ(α / noise)
            judged = evaluate_mask(layout, trainer.logits_, judge, eval_batches, eval_contexts, eval_masks, noise)
            if task is not None:  # before the weights are restored: a mask trained with them is judged with them
                logits = trainer.logits_.detach()
                change = mask_change(layout, logits, model, layout_classes, content_key(f"dam/{s.variant}/{lam}", logits))
                task_rows.append({"lambda": lam, "sparsity": float(judged["sparsity"]), **task_columns(task.judge(change))})
            bar.update(1)
            if original is not None:
                model.model.load_state_dict(original)
            if adapting:  # each pattern near this mask's sparsity gets the same weight training
                for name in ADAPTED_PATTERNS:
                    points = pattern_table[pattern_table["pattern"] == name]
                    nearest = points.iloc[(points["sparsity"] - float(judged["sparsity"])).abs().argmin()]
                    if abs(nearest["sparsity"] - float(judged["sparsity"])) > MATCH_WITHIN:
                        bar.update(s.steps)
                        continue
                    value = int(nearest["value"])
                    train_removals = pattern_removals(
                        name, value, s.seq_len, train_cls, train_index, train_sizes, group_valid, s.seed
                    )
                    curve_losses = adapt_to_pattern(
                        model,
                        trainer_objective,
                        train_batches,
                        train_removals,
                        groups_of_layers,
                        order,
                        trainer.steps_used_,
                        s.steps,
                        s.weights_lr,
                        s.lr_end,
                        bar,
                    )
                    bar.update(s.steps - trainer.steps_used_)
                    eval_removals = pattern_removals(
                        name,
                        value,
                        s.seq_len,
                        eval_cls,
                        eval_blocks.index,
                        eval_sizes,
                        group_valid,
                        s.seed,
                    )
                    losses, removed = judge_pattern(judge, eval_batches, eval_removals, groups_of_layers, group_valid)
                    model.model.load_state_dict(original)
                    adapted_losses.append(losses)
                    adapted_rows.append(
                        {
                            "lambda": lam,
                            "pattern": name,
                            "family": PATTERNS[name].family,
                            "value": value,
                            "sparsity": removed,
                            "steps": trainer.steps_used_,
                            "train_objective": float(np.mean(curve_losses[-max(1, len(curve_losses) // 10) :])),
                        }
                    )
            logits = trainer.logits_.detach()
            logits_all.append(logits.cpu().numpy())
            probability = torch.sigmoid(logits / max(noise, 1e-6))
            images.append(
                torch.stack([layout.expand(probability, layer, eval_contexts[0][:1])[0] for layer in range(model.num_layers)])
                .cpu()
                .numpy()
                .astype(np.float16)
            )
            losses_all.append(judged["losses"])
            curves.append(curve.assign(**{"lambda": lam}))
            summary_rows.append(
                {
                    **_summary_row(lam, s.variant, judged, baseline, curve, trainer, seconds, s.bootstrap, s.seed),
                    "train_loss": trained["loss"],
                    "init_train_loss": start["loss"] if start else float("nan"),
                    "init_train_sparsity": start["sparsity"] if start else float("nan"),
                }
            )
            keep_rows.extend(_keep_rows(lam, classes, judged))
            keep_summary_rows.extend(_keep_summary_rows(lam, classes, judged, same))

        if task is not None and len(pattern_table):
            judged_patterns = []
            for row in pattern_table.itertuples():
                judged_patterns.append(
                    task_columns(task.judge(pattern_change(model, row.pattern, int(row.value), s.seq_len, s.seed)))
                )
                bar.update(1)
            pattern_task = pd.DataFrame(judged_patterns)
    if len(pattern_table):
        delta = pattern_losses - baseline
        pattern_table["loss"] = pattern_losses.mean(1)
        pattern_table["delta"], pattern_table["delta_low"], pattern_table["delta_high"] = bootstrap_interval(
            delta, s.bootstrap, s.seed
        )
    else:
        pattern_table = pattern_table.reindex(columns=[*pattern_table.columns, "loss", "delta", "delta_low", "delta_high"])

    adapted = pd.DataFrame(adapted_rows, columns=["lambda", "pattern", "family", "value", "sparsity", "steps", "train_objective"])
    adapted_losses = np.stack(adapted_losses) if adapted_losses else np.zeros((0, len(baseline)))
    if len(adapted):
        adapted["loss"] = adapted_losses.mean(1)
        adapted["delta"], adapted["delta_low"], adapted["delta_high"] = bootstrap_interval(
            adapted_losses - baseline, s.bootstrap, s.seed
        )
    baseline_mean, baseline_low, baseline_high = bootstrap_interval(baseline[None], s.bootstrap, s.seed)
    if task is not None:
        task_table = pd.DataFrame(task_rows).assign(kind="dam", variant=s.variant)
        if len(pattern_table):
            patterns_judged = pattern_table[["pattern", "value", "sparsity"]].join(pattern_task).assign(kind="pattern")
            task_table = pd.concat([task_table, patterns_judged], ignore_index=True)
    meta = {
        "model": model.describe(),
        "corpus": {
            **corpus.describe(),
            "blocks_available": eval_blocks.available,
            "eval_block_index": eval_blocks.index.tolist(),
            "train_block_index": train_blocks.index.tolist(),
        },
        "settings": {
            **s.to_dict(),
            "corpus": corpus.describe().get("source"),
            "sparsity": None if s.lambdas is not None else [target for _, target in runs],  # the targets run
            "tau": list(tau),
            "weights_lr": s.weights_lr if s.train_weights else None,
            "classes": list(classes),
            "classes_dropped": list(notes),
            "layout_classes": list(layout_classes),
            "objective": judge.name,
            "trained_on": trained_on,
            "n": s.seq_len,
            "train_seqs": len(train_blocks),
            "eval_seqs": len(eval_blocks),
            "logits_shape": list(layout.shape),
            "optimiser": "Adam",
            "penalty": "lambda * mean of the hard mask over valid (layer, head, query, key) positions",
        },
        "baseline": {"loss": float(baseline_mean[0]), "loss_low": float(baseline_low[0]), "loss_high": float(baseline_high[0])},
        "columns": loss_columns(judge.name),
        "roles": eval_roles.description,
        "notes": notes,
        "equal_by_construction": same,
        "task": task.describe() if task is not None else None,
        **provenance(command),
    }
    tables = {
        # columns of settings not used (no target, no warm start) are left out rather than all NaN
        "summary": without_absolute_loss(pd.DataFrame(summary_rows), judge.name).dropna(axis=1, how="all"),
        "keep": pd.DataFrame(keep_rows),
        "keep_summary": pd.DataFrame(keep_summary_rows),
        "patterns": without_absolute_loss(pattern_table, judge.name),
        "training": pd.concat(curves, ignore_index=True),
    }
    if task is not None:
        tables["task"] = task_table
    if adapting:
        tables["patterns_adapted"] = without_absolute_loss(adapted, judge.name)
    arrays = {
        "logits": np.stack(logits_all),
        "keep_images": np.stack(images),
        "eval_losses": np.stack(losses_all),
        "baseline_losses": baseline,
        "pattern_losses": pattern_losses,
        **({"adapted_pattern_losses": adapted_losses} if adapting else {}),
    }
    return DamResult(meta, tables, arrays)


ABSOLUTE_LOSS = ("loss", "loss_low", "loss_high")
ABSOLUTE_LOSS_NOTE = (
    "absent with the hidden objective: its loss, 1 - cosine to the unmodified model, is 0 for that model "
    "by definition, so loss would repeat delta"
)


def loss_columns(objective: str) -> dict[str, str]:
    """What ``loss`` and ``delta`` of ``table`` and ``patterns`` hold, for ``meta["columns"]``."""
    delta = "change of the held-out loss against the unmodified model (paired over blocks, with interval)"
    if objective == "hidden":
        return {"loss": ABSOLUTE_LOSS_NOTE, "delta": delta}
    return {"loss": f"held-out {objective} loss (nats) under the mask or pattern", "delta": delta}


def without_absolute_loss(table: pd.DataFrame, objective: str) -> pd.DataFrame:
    """``table`` without ``loss`` (and its interval) under the ``hidden`` objective, where it
    equals ``delta`` (the unmodified model's loss is 0); the other objectives keep both: the
    held-out loss in nats and its change against the unmodified model."""
    if objective != "hidden":
        return table
    return table.drop(columns=[name for name in ABSOLUTE_LOSS if name in table])


def _summary_row(lam, variant, judged, baseline, curve, trainer, seconds, bootstrap, seed) -> dict:
    losses = judged["losses"]
    mean, low, high = bootstrap_interval(np.stack([losses, losses - baseline]), bootstrap, seed)
    tail = curve.tail(max(1, len(curve) // 10))
    return {
        "lambda": lam,
        "target_sparsity": float("nan") if trainer.target_density is None else 1.0 - trainer.target_density,
        "variant": variant,
        "sparsity": float(judged["sparsity"]),
        "expected_sparsity": float(judged["expected_sparsity"]),
        "rows_rescued": float(judged["rows_rescued"]),
        "loss": mean[0],
        "loss_low": low[0],
        "loss_high": high[0],
        "delta": mean[1],
        "delta_low": low[1],
        "delta_high": high[1],
        "train_objective": tail["objective"].mean(),
        "train_density": tail["density"].mean(),
        # the hard mask's sparsity when training stopped, before the shift: how far dual ascent got
        "trained_sparsity": float("nan") if trainer.target_density is None else 1.0 - float(curve["hard_density"].iloc[-1]),
        # a target's run: the λ dual ascent began at (NaN for a given λ, which is the key)
        "lambda_start": float("nan") if trainer.target_density is None else trainer.lambda_start_,
        "threshold_shift": trainer.shift_,  # subtracted from the logits to meet a target sparsity (NaN for a given λ)
        "steps": trainer.steps_used_,
        "converged": trainer.converged_,  # False: the run hit the step cap before the stopping rule held
        "seconds": seconds,
    }


def _keep_rows(lam, classes, judged) -> list[dict]:
    rows = []
    num_layers, num_heads, _ = judged["keep_probability"].shape
    for layer in range(num_layers):
        for head in range(num_heads):
            for index, name in enumerate(classes):
                rows.append(
                    {
                        "lambda": lam,
                        "layer": layer,
                        "head": head,
                        "class": name,
                        "keep_probability": judged["keep_probability"][layer, head, index],
                        "kept": judged["kept"][layer, head, index],
                        "positions": judged["positions"][layer, index],
                    }
                )
    return rows


def _keep_summary_rows(lam, classes, judged, same: dict[str, str]) -> list[dict]:
    positions = judged["positions"]  # (layer, class): weights for pooling over layers
    rows = []
    for index, name in enumerate(classes):
        weight = positions[:, index][:, None]
        total = weight.sum() * judged["keep_probability"].shape[1]
        rows.append(
            {
                "lambda": lam,
                "class": name,
                "keep_probability": float((judged["keep_probability"][:, :, index] * weight).sum() / total),
                "kept": float((judged["kept"][:, :, index] * weight).sum() / total),
                "positions": float(positions[:, index].sum()),
                "same_as": same.get(name, name),  # the first class it equals by construction (itself if none)
            }
        )
    return rows
