"""The passes over the held-out blocks that :func:`~attnlens.analysis.importance.importance` measures with.

One unmodified pass per batch records the attention mass, share and entropy of every class
(:class:`MassAccumulator`, fed layer by layer by a capture sink); one pass per ablation condition
(:func:`ablation_conditions`: the class removed, or as many random valid positions, in the whole
model, a layer or a head) records the objective's per-block losses and what it removed; one
backward pass per batch gives every block's gate derivatives (:func:`gradient_target`; for the
``hidden`` objective through a seeded random projection, :func:`hidden_projection`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnlens.analysis.changes import Ablation
from attnlens.analysis.evaluation import evaluate_batch, frozen, layer_groups
from attnlens.analysis.experiment import Experiment
from attnlens.analysis.importance.settings import ImportanceSettings
from attnlens.analysis.objectives import Objective, PreparedBatch
from attnlens.data.positions import choose, chosen_mask, heavy_class
from attnlens.models.capture import Capture
from attnlens.models.precision import DEFAULT_PRECISION
from attnlens.progress import Progress, progress_bar

CONTROLS = ("class", "random")
_PROJECTION_STREAM = 1  # keeps the projection's random numbers apart from other seeded draws (2: the random control's)


def hidden_projection(shape: tuple[int, ...], seed: int, block: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The standard-normal projection of one block's final hidden states (tokens, hidden).

    Seeded by ``seed`` and the block's index in the corpus, so it does not depend on batching.
    """
    state = int(np.random.SeedSequence([seed, _PROJECTION_STREAM, int(block)]).generate_state(1)[0])
    return torch.randn(shape, generator=torch.Generator().manual_seed(state), dtype=torch.float64).to(dtype)


def gradient_target(objective: Objective, batch: PreparedBatch, blocks: np.ndarray, seed: int) -> torch.Tensor:
    """The scalar whose gradient gives every block's gate derivatives (one block's term per block).

    ``clm``/``mlm``: the sum of the blocks' losses. ``hidden``: ``Σ_b f_b`` with
    ``f_b = sqrt(π/2) / sqrt(T·d) · Σ_t r_bt · h_bt / ‖h_ref,bt‖`` and ``r`` from
    :func:`hidden_projection`: for Gaussian ``r``, ``E|∂f_b/∂g|`` is the RMS over tokens and
    dimensions of ``∂(h / ‖h_ref‖)/∂g``.
    """
    if objective.name != "hidden":
        return objective.evaluate(batch)["loss"].sum()
    model = objective.model
    hidden = model.forward(batch.input_ids, output_hidden_states=True).hidden_states[-1]
    assert batch.reference is not None, "prepare gives a batch of the hidden objective its reference"
    reference = batch.reference.to(hidden.dtype)
    tokens, width = hidden.shape[1:]
    projection = torch.stack([hidden_projection((tokens, width), seed, block, hidden.dtype) for block in blocks]).to(
        hidden.device
    )
    scale = math.sqrt(math.pi / 2) / math.sqrt(tokens * width)
    return (projection * hidden / reference.norm(dim=-1, keepdim=True)).sum() * scale


def ablation_conditions(
    classes: tuple[str, ...], per: str, num_layers: int, num_heads: int, seed: int = 0
) -> list[Ablation | None]:
    """The unmodified run (``None``), then the whole-model ablations, then the finer scope asked
    for; each class beside its random control.

    >>> [c.scope if c else "none" for c in ablation_conditions(("self",), "layer", 2, 4)]
    ['none', 'model', 'model', 'layer', 'layer', 'layer', 'layer']
    """
    units = [(-1, -1)]
    if per == "layer":
        units += [(layer, -1) for layer in range(num_layers)]
    elif per == "head":
        units += [(layer, head) for layer in range(num_layers) for head in range(num_heads)]
    ablations = [
        Ablation(name, classes, control, layer, head, seed) for layer, head in units for name in classes for control in CONTROLS
    ]
    return [None, *ablations]


def condition_row(ablation: Ablation | None) -> dict[str, object]:
    """What the ablation table says of one condition: scope, layer, head, class and control."""
    if ablation is None:
        return {"scope": "none", "layer": -1, "head": -1, "class": "none", "control": "none"}
    return {
        "scope": ablation.scope,
        "layer": ablation.layer,
        "head": ablation.head,
        "class": ablation.cls,
        "control": ablation.control,
    }


class MassAccumulator:
    """Sums for attention mass, share and entropy, fed layer by layer by a capture sink.

    ``heavy(k)`` and ``other`` beside it are first summed over the keys they choose among (where
    their masks are the same for every head), then the heavy hitters' part, which each head's
    scores choose (:class:`HeavySplit`), is moved from ``other`` to ``heavy(k)``."""

    def __init__(self, num_layers: int, num_heads: int, classes: tuple[str, ...]) -> None:
        self.mass = np.zeros((num_layers, num_heads, len(classes)))
        self.entropy = np.zeros((num_layers, num_heads))
        self.share = np.zeros((num_layers, len(classes)))
        self.uniform_entropy = np.zeros(num_layers)
        self.rows = np.zeros(num_layers)
        self.masks: torch.Tensor | None = None  # (C, batch, n, n) float, set per batch
        self.heavy = HeavySplit.of(classes)

    def sink(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor | None) -> None:
        assert self.masks is not None, "the unmodified pass sets the classes' masks before it runs"
        assert weights is not None, "the unmodified pass records weights (Capture(weights=True))"
        masks = self.masks * valid[None].to(self.masks.dtype)
        weights = weights.to(masks.dtype)
        rows = valid.any(-1)  # (batch, n): queries that attend at all
        mass = torch.einsum("bhqk,cbqk->hc", weights, masks)
        entropy = -torch.special.xlogy(weights, weights).sum(-1)  # (batch, head, n)
        self.entropy[layer] += (entropy * rows[:, None]).sum((0, 2)).double().cpu().numpy()
        keys = valid.sum(-1).clamp(min=1).to(masks.dtype)
        share = (masks.sum(-1) / keys).sum((1, 2))
        if self.heavy is not None:
            chosen = self.heavy.chosen(self.masks, scores, valid).to(masks.dtype)  # (batch, head, n, n)
            mass = self.heavy.move(mass.T, (weights * chosen).sum((0, 2, 3))).T
            share = self.heavy.move(share, (chosen[:, 0].sum(-1) / keys).sum())  # as many in every head
        self.mass[layer] += mass.double().cpu().numpy()
        self.share[layer] += share.double().cpu().numpy()
        self.uniform_entropy[layer] += float(torch.log(keys)[rows].sum())
        self.rows[layer] += float(rows.sum())


@dataclass(frozen=True)
class HeavySplit:
    """Where ``heavy(k)`` (and ``other``, if asked for) sit among the classes, to split the keys they
    share by each head's scores (:func:`~attnlens.data.positions.choose`)."""

    name: str
    index: int
    other: int | None

    @classmethod
    def of(cls, classes: tuple[str, ...]) -> HeavySplit | None:
        name = heavy_class(classes)
        if name is None:
            return None
        return cls(name, classes.index(name), classes.index("other") if "other" in classes else None)

    def chosen(self, masks: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(batch, head, n, n) bool: each head's heavy hitters, from the shared keys in ``masks`` (C, batch, n, n)."""
        return choose({self.name: masks[self.index].bool()}, scores, valid)[self.name]

    def move(self, sums: torch.Tensor, heavy: torch.Tensor) -> torch.Tensor:
        """``sums`` (C, ...) with the heavy hitters' part ``heavy`` taken from ``other`` and given to ``heavy(k)``,
        whose entry held every shared key's."""
        sums = sums.clone()
        if self.other is not None:
            sums[self.other] = sums[self.index] - heavy
        sums[self.index] = heavy
        return sums


@dataclass
class Passes:
    """What the passes over the held-out blocks measure: the mass (unmodified pass), every
    condition's per-block losses and what it removed and spared, and the gradients."""

    mass: MassAccumulator
    losses: np.ndarray  # (condition, block)
    pooled: np.ndarray | None  # (condition, block) pooled cosines, hidden objective only
    removed: np.ndarray  # (condition, 2): removed valid positions, valid positions
    spared: np.ndarray  # (condition, 2): spared rows, rows
    gradients: np.ndarray  # (block, layer, head, class + all)

    @classmethod
    def run(cls, experiment: Experiment, conditions: list[Ablation | None], s: ImportanceSettings, progress: Progress) -> Passes:
        model, classes, blocks = experiment.model, experiment.classes, experiment.held_out
        size = (len(conditions), len(blocks))
        passes = cls(
            MassAccumulator(model.num_layers, model.num_heads, classes),
            np.zeros(size),
            np.zeros(size) if experiment.objective.name == "hidden" else None,
            np.zeros((len(conditions), 2)),
            np.zeros((len(conditions), 2)),
            np.zeros((len(blocks), model.num_layers, model.num_heads, len(classes) + 1)),
        )
        held_out = experiment.split(blocks, s.batch_size)
        # The mass and the gradients measure the model and judge nothing: float32 whatever the judging
        # precision, on batches of their own where that is not float32 (the hidden objective's references too).
        exact = experiment.objective.at(DEFAULT_PRECISION)
        measured = held_out if exact is experiment.objective else experiment.split(blocks, s.batch_size, exact)
        groups, group_valid = layer_groups(experiment.valid.to(model.device))
        total = len(held_out.inputs) * (len(conditions) + (1 if s.gradient else 0))
        with progress_bar(total=total, desc="importance", unit="pass", enabled=progress) as bar:
            start = 0
            for number, (batch, view) in enumerate(zip(held_out.inputs, held_out.views)):
                rows = slice(start, start + view.ids.shape[0])
                stacked = torch.stack(list(view.classes(classes).values())).float()
                exactly = (exact, measured.inputs[number])
                for index, condition in enumerate(conditions):  # a per-layer ablation runs from its layer (starts)
                    where = (held_out.starts, number)
                    passes.measure(experiment, index, condition, batch, view, rows, stacked, groups, group_valid, where, exactly)
                    bar.update(1)
                if s.gradient:
                    passes.gradients[rows] = _batch_gradients(*exactly, blocks.index[rows], stacked, s.seed, passes.mass.heavy)
                    bar.update(1)
                start = rows.stop
        return passes

    def measure(self, experiment, index, condition, batch, view, rows, stacked, groups, group_valid, where, exactly) -> None:
        """One condition on one batch: the unmodified pass records the mass (in float32: ``exactly``, the
        float32 objective and its batch) and its losses; an ablation its losses and what it removed from
        (and spared of) the valid positions of the layers it changes."""
        if condition is None:
            self.mass.masks = stacked
            with torch.no_grad(), Capture(weights=True, sink=self.mass.sink):
                metrics = evaluate_batch(*exactly)
            if exactly[0] is not experiment.objective:  # the unmodified arm at the judging precision, as the ablations
                metrics = evaluate_batch(experiment.objective, batch)
        else:
            metrics = evaluate_batch(experiment.objective, batch, condition.intervention(view), condition.layers, where)
            prepared, size = condition.prepare(view), view.ids.shape[0]
            affected = range(experiment.model.num_layers) if condition.layer < 0 else [condition.layer]
            for layer in affected:
                valid = group_valid[groups[layer]]
                remove = condition.positions(prepared, valid)[:, 0]  # counts: the same in every head
                self.removed[index] += (float(remove.sum()), float(valid.sum()) * size)
                if condition.control == "class":
                    target = chosen_mask(prepared[0], condition.cls, None, valid[None])[:, 0] & valid
                    self.spared[index] += (float((target.any(-1) & ~remove.any(-1)).sum()), float(valid.any(-1).sum()) * size)
        self.losses[index, rows] = metrics["loss"]
        if self.pooled is not None:
            self.pooled[index, rows] = metrics["pooled_cosine"]


def _batch_gradients(
    judge: Objective, batch: PreparedBatch, block_index: np.ndarray, stacked: torch.Tensor, seed: int, heavy: HeavySplit | None
) -> np.ndarray:
    """(batch, layer, head, class + all) derivatives of each block's loss w.r.t. its gates at 1."""
    gates: dict[int, torch.Tensor] = {}
    chosen: dict[int, torch.Tensor] = {}  # each layer's heavy hitters, chosen by its scores

    def gate(layer: int, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        # One gate per (block, head, query, key); a class gate's derivative is the sum over
        # its positions, so one backward pass gives every class and every level at once.
        gates[layer] = torch.ones_like(weights, requires_grad=True)
        return weights * gates[layer]

    def choose_heavy(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> None:
        if heavy is not None:
            chosen[layer] = heavy.chosen(stacked, scores.detach(), valid)

    with torch.enable_grad(), frozen(judge.model.model), Capture(record=False, intervene=choose_heavy, intervene_weights=gate):
        gradient_target(judge, batch, block_index, seed).backward()
    per_class = []
    masks = stacked.double()  # float64 sums: per-position derivatives of both signs cancel
    for layer in sorted(gates):
        grad = gates[layer].grad
        assert grad is not None, "the backward pass reaches every gate"
        grad = grad.double()
        classes = torch.einsum("bhqk,cbqk->bhc", grad, masks)
        if heavy is not None:
            classes = heavy.move(classes.permute(2, 0, 1), (grad * chosen[layer]).sum((-1, -2))).permute(1, 2, 0)
        per_class.append(torch.cat([classes, grad.sum((-1, -2))[..., None]], dim=-1))
    return torch.stack(per_class, dim=1).double().cpu().numpy()
