"""DAM: Differentiable Attention Masks learned on a frozen pretrained model (SparseBERT).

Mask logits ``α`` decide which (query, key) positions a model's attention keeps. Each
training step draws a Gumbel-sigmoid sample ``M_soft = σ((α + g₁ - g₂)/τ)``, uses the
hard mask ``M = [α + g₁ - g₂ > 0]`` in the forward pass with the straight-through
gradient of ``M_soft``, and adds ``(1 - M)·(-10⁴)`` to the scores before softmax (or sets
them to ``-inf``, ``removal="inf"``); see :class:`DamTrainer` for the scale of the
straight-through gradient (it decides the units of λ). The loss is ``objective + λ·mean(M)``, where the mean
runs over every valid (layer, head, query, key) position, so ``mean(M)`` is the fraction
of attention kept (the density) and ``1 - mean(M)`` the sparsity; λ is in loss units per
unit of density. The model's weights stay frozen unless ``train_weights``.

Variants (how logits map onto positions; :data:`LAYOUTS`):

- ``unstructured`` (DAM_u): one logit per layer, head, query and key;
- ``structured`` (DAM_s): one logit per head and offset ``|i - j|``, shared by all layers;
- ``class``: one logit per layer, head and position class (each position belongs to the
  first listed class that contains it; ``other`` takes the rest).

After training, the deterministic mask ``α > 0`` is judged on held-out blocks (disjoint
from the training blocks): achieved sparsity (valid positions actually removed), the
objective with its bootstrap interval, and the keep-probability ``σ(α)`` (the probability
a sample keeps the position) per position class; ``expected_sparsity`` is that of the
sampled masks (``1 - mean σ(α)``). A row the hard mask would leave with no valid key keeps
its keys of largest logit (:func:`rescue_rows`; ``rows_rescued`` counts them): sparing
such a row whole, as ablations do, would let a large λ remove everything and look dense. Fixed sparse patterns (:mod:`attnlens.analysis.dam.patterns`) are judged
on the same blocks for comparison.

>>> from attnlens import dam
>>> result = dam("minilm-l6", lambdas=[0.0, 1.0], steps=3, seq_len=16, train_seqs=4, eval_seqs=4,
...              batch_size=2, patterns=False, bootstrap=50, progress=False)
>>> result.table[["lambda", "steps"]].values.tolist()
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

VARIANTS = ("unstructured", "structured", "class")
REMOVALS = ("1e4", "inf")
DEFAULT_LAMBDAS = (0.01, 0.03, 0.1, 0.3)
_NOISE_STREAM, _ORDER_STREAM, _PATTERN_STREAM = 11, 12, 13
_BIG = 1e4  # the straight-through gradient scale of both removals: ∂scores/∂M


def _seeded(seed: int, *stream: int) -> int:
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


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


class PerClass(MaskLayout):
    """A logit per (layer, head, position class)."""

    name = "class"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_heads, self.num_classes)

    def expand(self, values, layer, context):
        return values[layer][:, context].transpose(0, 1)  # (batch, head, n, n)

    def counts(self, context):
        counts = torch.stack(
            [torch.bincount(context[:, valid].flatten(), minlength=self.num_classes)[: self.num_classes] for valid in self.valid]
        ).to(torch.float32)  # (layer, class)
        return counts[:, None].expand(self.shape)


LAYOUTS: dict[str, type[MaskLayout]] = {layout.name: layout for layout in (Unstructured, Structured, PerClass)}


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
        lam: float,
        steps: int,
        tau: tuple[float, float] = (1.0, 1.0),
        lr: float = 0.05,
        init_keep: float = 0.9,
        removal: str = "1e4",
        train_weights: bool = False,
        weights_lr: float = 1e-5,
        gradient_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.layout = layout
        self.lam = lam
        self.steps = steps
        self.tau = tau
        self.lr = lr
        self.init_keep = init_keep
        self.removal = removal
        self.train_weights = train_weights
        self.weights_lr = weights_lr
        self.gradient_scale = gradient_scale
        self.seed = seed

    def start(self, model: LoadedModel) -> DamTrainer:
        self.model_ = model
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

    def sample(self, tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A hard 0/1 mask with straight-through gradients of its Gumbel-sigmoid relaxation.

        Returns the mask for the penalty (gradient of ``M_soft``), the mask for the scores,
        whose gradient is scaled by ``gradient_scale / 10⁴`` so that the scores see
        ``∂s'/∂M = gradient_scale`` (see :class:`DamTrainer`), both equal to the hard mask,
        and the noisy logits ``α + g₁ - g₂`` the hard mask thresholds.
        """
        uniform = torch.rand(self.layout.shape, generator=self.generator_).clamp_(1e-6, 1 - 1e-6).to(self.logits_.device)
        noisy = self.logits_ + torch.log(uniform) - torch.log1p(-uniform)  # α + g₁ - g₂ (logistic noise)
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

    def step(self, objective: Objective, batch: PreparedBatch, context: torch.Tensor) -> dict[str, float]:
        """One step on one batch: sample, forward with the mask, loss + λ·density, backward, update."""
        tau = self.temperature(self.step_)
        mask, score_mask, noisy = self.sample(tau)
        counts = self.layout.counts(context)
        density = (mask * counts).sum() / counts.sum()
        with Capture(record=False, intervene=self.intervention(score_mask, context, noisy)):
            task = objective.evaluate(batch)["loss"].mean()
        loss = task + self.lam * density
        self.optimizer_.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer_.step()
        self.step_ += 1
        return {"loss": loss.item(), "objective": task.item(), "density": density.item(), "tau": tau}

    def fit(
        self,
        model: LoadedModel,
        objective: Objective,
        batches: list[PreparedBatch],
        contexts: list[torch.Tensor],
        order: np.ndarray,
        bar=None,
    ) -> pd.DataFrame:
        """All steps, batches taken in ``order``; returns the training curve."""
        self.start(model)
        history = []
        weights = contextlib.nullcontext() if self.train_weights else frozen(model.model)
        with weights, torch.enable_grad():
            for step in range(self.steps):
                index = int(order[step])
                history.append({"step": step, **self.step(objective, batches[index], contexts[index])})
                if bar is not None:
                    bar.update(1)
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


def evaluate_mask(
    layout: MaskLayout,
    logits: torch.Tensor,
    objective: Objective,
    batches: list[PreparedBatch],
    contexts: list[torch.Tensor],
    masks: list[dict[str, torch.Tensor]],
) -> dict[str, np.ndarray]:
    """Held-out losses under the hard mask, sparsity, and keep statistics per (layer, head, class)."""
    logits = logits.detach()
    probability = torch.sigmoid(logits)
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


def evaluate_patterns(
    model: LoadedModel,
    objective: Objective,
    batches: list[PreparedBatch],
    blocks_ids: np.ndarray,
    block_index: np.ndarray,
    roles_cls: torch.Tensor,
    valid: torch.Tensor,
    batch_size: int,
    seed: int,
    bar=None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Every fixed pattern at every parameter value: per-block losses and honest sparsity."""
    groups, group_valid = layer_groups(valid)
    n = valid.shape[-1]
    rows, losses = [], []
    for pattern in PATTERNS.values():
        for value in pattern.values(n):
            removed = total = 0.0
            pattern_losses = []
            for number, batch in enumerate(batches):
                start = number * batch_size
                cls = roles_cls[start : start + batch.input_ids.shape[0]]
                generator = torch.Generator().manual_seed(_seeded(seed, _PATTERN_STREAM, int(block_index[start])))
                keep = build(pattern.name, n, value, cls, generator)
                per_group = [removed_mask(keep, gv) for gv in group_valid]
                intervene = removal(lambda layer, valid_now, per_group=per_group: per_group[groups[layer]][:, None])
                pattern_losses.append(evaluate_batch(objective, batch, intervene)["loss"])
                for layer in range(len(groups)):
                    removed += float(per_group[groups[layer]].sum())
                    total += float(group_valid[groups[layer]].sum()) * keep.shape[0]
            losses.append(np.concatenate(pattern_losses))
            rows.append({"pattern": pattern.name, "parameter": pattern.parameter, "value": value, "sparsity": removed / total})
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

    def matched(self) -> pd.DataFrame:
        """For each λ and each pattern, the pattern point whose sparsity is nearest the λ's."""
        rows = []
        for _, dam_row in self.table.iterrows():
            for name, points in self.patterns.groupby("pattern", sort=False):
                nearest = points.iloc[(points["sparsity"] - dam_row["sparsity"]).abs().argmin()]
                rows.append(
                    {
                        "lambda": dam_row["lambda"],
                        "dam_sparsity": dam_row["sparsity"],
                        "dam_delta": dam_row["delta"],
                        "pattern": name,
                        "value": nearest["value"],
                        "sparsity": nearest["sparsity"],
                        "delta": nearest["delta"],
                        "delta_low": nearest["delta_low"],
                        "delta_high": nearest["delta_high"],
                    }
                )
        return pd.DataFrame(rows)

    def summary(self) -> str:
        settings = self.settings
        return f"variant {settings['variant']!r}, lambdas {settings['lambdas']}"


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
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    steps: int = 100
    tau: str | float | tuple[float, float] = 1.0
    lr: float = 0.05
    init_keep: float = 0.9
    removal: str = "1e4"
    train_weights: bool = False
    weights_lr: float = 1e-5
    classes: str | tuple[str, ...] | None = None
    objective: str = "auto"
    train_seqs: int = 256
    eval_seqs: int = 64
    batch_size: int = 16
    patterns: bool = True
    bootstrap: int = 1000

    def validate(self) -> None:
        super().validate()
        one_of("variant", self.variant, VARIANTS)
        if not self.lambdas:
            raise BadInput("`lambdas` is empty; give at least one λ, e.g. `lambdas` 0.01,0.1")
        for value in self.lambdas:
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
                raise BadInput(f"`lambdas` {shown}: λ must be 0 or more (a finite number), e.g. `lambdas` 0.01,0.1")
        at_least("steps", self.steps, 1)
        positive("lr", self.lr, ", e.g. `lr` 0.05")
        probability("init_keep", self.init_keep, ", e.g. 0.9")
        if self.removal not in REMOVALS:
            raise BadInput(f"`removal` {self.removal} is unknown; use 1e4 (add -10^4 to removed scores) or inf")
        if self.train_weights:
            positive("weights_lr", self.weights_lr)
        parse_tau(self.tau)
        parse_classes(self.classes)
        one_of("objective", self.objective, OBJECTIVES)
        at_least("train_seqs", self.train_seqs, 1)
        at_least("eval_seqs", self.eval_seqs, 1)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")


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
    lambdas = [float(value) for value in s.lambdas]
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
            contexts.append(
                exclusive_index(partition).to(model.device)
                if s.variant == "class"
                else torch.zeros(len(chunk), 1, 1, dtype=torch.long, device=model.device)
            )
            report.append(
                {name: mask.to(model.device) for name, mask in class_masks(chunk, model, classes, roles=chunk_roles).items()}
            )
        return contexts, report

    # Batches are prepared before any training: the hidden objective's references come
    # from the unmodified model even when its weights are fine-tuned.
    eval_batches = prepare_batches(judge, eval_blocks.ids, s.batch_size)
    train_batches = prepare_batches(judge, train_blocks.ids, s.batch_size)
    eval_contexts, eval_masks = contexts_of(eval_ids, eval_roles, s.batch_size)
    train_contexts, _ = contexts_of(train_ids, train_roles, s.batch_size)
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
        train_contexts, _ = contexts_of(train_ids, token_roles(train_ids, model), s.batch_size)
        order = _batch_order(rng, len(train_batches), s.steps)
    trainer_objective = TaskLoss(task) if trained_on == "task" else judge
    task_rows = []

    baseline = np.concatenate([evaluate_batch(judge, batch)["loss"] for batch in eval_batches])
    original = copy.deepcopy(model.model.state_dict()) if s.train_weights else None
    total = len(lambdas) * (s.steps + 1) + (pattern_points(s.seq_len) * (2 if task is not None else 1) if s.patterns else 0)
    summary_rows, keep_rows, keep_summary_rows, curves = [], [], [], []
    logits_all, images, losses_all = [], [], []
    with progress_bar(total=total, desc="dam", unit="step", enabled=progress) as bar:
        for lam in lambdas:
            began = time.perf_counter()
            trainer = DamTrainer(
                layout,
                lam=lam,
                steps=s.steps,
                tau=tau,
                lr=s.lr,
                init_keep=s.init_keep,
                removal=s.removal,
                train_weights=s.train_weights,
                weights_lr=s.weights_lr,
                seed=s.seed,
            )
            curve = trainer.fit(model, trainer_objective, train_batches, train_contexts, order, bar)
            seconds = time.perf_counter() - began
            judged = evaluate_mask(layout, trainer.logits_, judge, eval_batches, eval_contexts, eval_masks)
            if task is not None:  # before the weights are restored: a mask trained with them is judged with them
                logits = trainer.logits_.detach()
                change = mask_change(layout, logits, model, layout_classes, content_key(f"dam/{s.variant}/{lam}", logits))
                task_rows.append({"lambda": lam, "sparsity": float(judged["sparsity"]), **task_columns(task.judge(change))})
            bar.update(1)
            if original is not None:
                model.model.load_state_dict(original)
            logits = trainer.logits_.detach()
            logits_all.append(logits.cpu().numpy())
            probability = torch.sigmoid(logits)
            images.append(
                torch.stack([layout.expand(probability, layer, eval_contexts[0][:1])[0] for layer in range(model.num_layers)])
                .cpu()
                .numpy()
                .astype(np.float16)
            )
            losses_all.append(judged["losses"])
            curves.append(curve.assign(**{"lambda": lam}))
            summary_rows.append(_summary_row(lam, s.variant, judged, baseline, curve, s.steps, seconds, s.bootstrap, s.seed))
            keep_rows.extend(_keep_rows(lam, classes, judged))
            keep_summary_rows.extend(_keep_summary_rows(lam, classes, judged))

        if s.patterns:
            pattern_table, pattern_losses = evaluate_patterns(
                model,
                judge,
                eval_batches,
                eval_blocks.ids,
                eval_blocks.index,
                eval_roles.cls.to(model.device),
                valid,
                s.batch_size,
                s.seed,
                bar,
            )
        else:
            pattern_table, pattern_losses = (
                pd.DataFrame(columns=["pattern", "parameter", "value", "sparsity"]),
                np.zeros((0, len(baseline))),
            )
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
            "lambdas": lambdas,
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
        "task": task.describe() if task is not None else None,
        **provenance(command),
    }
    tables = {
        "summary": without_absolute_loss(pd.DataFrame(summary_rows), judge.name),
        "keep": pd.DataFrame(keep_rows),
        "keep_summary": pd.DataFrame(keep_summary_rows),
        "patterns": without_absolute_loss(pattern_table, judge.name),
        "training": pd.concat(curves, ignore_index=True),
    }
    if task is not None:
        tables["task"] = task_table
    arrays = {
        "logits": np.stack(logits_all),
        "keep_images": np.stack(images),
        "eval_losses": np.stack(losses_all),
        "baseline_losses": baseline,
        "pattern_losses": pattern_losses,
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


def _summary_row(lam, variant, judged, baseline, curve, steps, seconds, bootstrap, seed) -> dict:
    losses = judged["losses"]
    mean, low, high = bootstrap_interval(np.stack([losses, losses - baseline]), bootstrap, seed)
    tail = curve.tail(max(1, len(curve) // 10))
    return {
        "lambda": lam,
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
        "steps": steps,
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


def _keep_summary_rows(lam, classes, judged) -> list[dict]:
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
            }
        )
    return rows
