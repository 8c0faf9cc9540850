"""Position importance: which classes of (query, key) pairs a model's attention needs.

Three independent measures, on held-out blocks (:func:`attnlens.analysis.evaluation.split_blocks`),
for the position classes of :mod:`attnlens.data.positions`:

1. **Attention mass** (no intervention; Clark et al. 2019): for each layer, head and
   class, ``Σ_ij A_ij·S_ij`` divided by the number of queries, i.e. the average weight a
   query puts on the class. Beside it, the class's **share**: the mass a query would put
   on it with uniform attention over its valid keys (``mean_i |S_i ∩ valid_i| / |valid_i|``),
   and the attention **entropy** (nats) with its uniform maximum.
2. **Ablation**: the class removed from attention (its scores set to -inf before softmax,
   everywhere, in one layer, or in one head), and what the objective loses:
   ``delta = loss(ablated) - loss(unmodified)`` per block, mean and bootstrap interval.
   The **random control** removes, in every row, as many valid positions as the class
   does, chosen uniformly at random (seeded) and, like the class's positions, the same
   in every layer and head it applies to; ``excess = delta(class) - delta(random)``
   (paired over blocks). For the ``hidden`` objective the cosine of mean-pooled
   embeddings to the unmodified model's (``pooled_cosine``) is reported beside it. A row whose every valid key is in the class (query 0 of a causal
   model for ``self``/``cls``) is left as it is (:func:`attnlens.analysis.evaluation.guard_rows`);
   ``rows_spared`` counts them.
3. **Gradient importance** (Michel et al. 2019): a gate per class and head multiplying the
   attention weights; importance ``= mean over blocks of |∂L/∂gate|`` at gate = 1, from
   one backward pass per batch (each block has its own gates, so one pass gives every
   block's derivative). Levels: per head, per layer (one gate shared by a layer's heads)
   and per model; class ``all`` is Michel's head gate. For the ``hidden`` objective the
   loss (1 - cosine to the unmodified model) is at its minimum at gate = 1 and its
   gradient is exactly zero, so ``L`` is replaced by a seeded random projection of the
   final hidden states (:func:`hidden_projection`), whose expected ``|∂/∂gate|`` is the
   RMS sensitivity of the normalised hidden states to the gate.

A class that never occurs among the valid positions (``next`` in a causal model) is an
error when asked for by name; from the default list it is dropped with a note, and its
numbers are reported as missing, never as NaN numbers.

>>> from attnlens import importance
>>> result = importance("minilm-l6", classes="self,prev,other", seq_len=16, num_seqs=4,
...                     bootstrap=50, progress=False)
>>> list(result.table["class"])
['self', 'prev', 'other']
>>> bool((result.mass.groupby(["layer", "head"])["mass"].sum() - 1).abs().max() < 1e-5)   # a partition
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import Ablation
from attnlens.analysis.evaluation import bootstrap_interval, evaluate_batch, frozen, layer_groups
from attnlens.analysis.experiment import Experiment
from attnlens.analysis.objectives import OBJECTIVES, Objective, PreparedBatch
from attnlens.analysis.task import TaskJudge, TaskSettings, task_columns
from attnlens.data.positions import parse_classes
from attnlens.io.results import Result, format_table
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar, split
from attnlens.settings import CorpusSettings, at_least, one_of

SCOPES = ("model", "layer", "head")
CONTROLS = ("class", "random")
_PROJECTION_STREAM = 1  # keeps the projection's random numbers apart from other seeded draws (2: the random control's)


# ----------------------------------------------------------------------------- helpers


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


# ----------------------------------------------------------------------------- passes


class _MassAccumulator:
    """Sums for attention mass, share and entropy, fed layer by layer by a capture sink."""

    def __init__(self, num_layers: int, num_heads: int, num_classes: int) -> None:
        self.mass = np.zeros((num_layers, num_heads, num_classes))
        self.entropy = np.zeros((num_layers, num_heads))
        self.share = np.zeros((num_layers, num_classes))
        self.uniform_entropy = np.zeros(num_layers)
        self.rows = np.zeros(num_layers)
        self.masks: torch.Tensor | None = None  # (C, batch, n, n) float, set per batch

    def sink(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor | None) -> None:
        masks = self.masks * valid[None].to(self.masks.dtype)
        weights = weights.to(masks.dtype)
        rows = valid.any(-1)  # (batch, n): queries that attend at all
        self.mass[layer] += torch.einsum("bhqk,cbqk->hc", weights, masks).double().cpu().numpy()
        entropy = -torch.special.xlogy(weights, weights).sum(-1)  # (batch, head, n)
        self.entropy[layer] += (entropy * rows[:, None]).sum((0, 2)).double().cpu().numpy()
        keys = valid.sum(-1).clamp(min=1).to(masks.dtype)
        self.share[layer] += (masks.sum(-1) / keys).sum((1, 2)).double().cpu().numpy()
        self.uniform_entropy[layer] += float(torch.log(keys)[rows].sum())
        self.rows[layer] += float(rows.sum())


def _mass_tables(acc: _MassAccumulator, classes: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    num_layers, num_heads, _ = acc.mass.shape
    mass = acc.mass / acc.rows[:, None, None]
    share = acc.share / acc.rows[:, None]
    layer, head, cls = np.meshgrid(np.arange(num_layers), np.arange(num_heads), np.arange(len(classes)), indexing="ij")
    mass_table = pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "class": np.asarray(classes)[cls.ravel()],
            "mass": mass.ravel(),
            "share": share[layer.ravel(), cls.ravel()],
        }
    )
    mass_table["lift"] = mass_table["mass"] / mass_table["share"]
    layer2, head2 = np.meshgrid(np.arange(num_layers), np.arange(num_heads), indexing="ij")
    entropy_table = pd.DataFrame(
        {
            "layer": layer2.ravel(),
            "head": head2.ravel(),
            "entropy": (acc.entropy / acc.rows[:, None]).ravel(),
            "uniform_entropy": (acc.uniform_entropy / acc.rows)[layer2.ravel()],
        }
    )
    return mass_table, entropy_table


# ----------------------------------------------------------------------------- result


class ImportanceResult(Result):
    """Tables of one importance run; see the module docstring.

    ``table`` (one row per class: mass, share, ablation delta and random control with
    intervals, gradient importance; ``share`` and ``removed`` agree for a model whose every
    query sees every key, and part for a causal one), ``mass``, ``entropy``, ``ablation``
    (``loss``, the objective under the ablation, only for ``clm``/``mlm``: the ``hidden``
    loss of the unmodified model is 0, so it would repeat ``delta``), ``gradient``,
    ``classes`` (``positions``: valid (layer, block, query, key) occurrences); ``arrays["ablation_blocks"]`` (condition, block) losses in the order of
    ``ablation``'s rows, ``arrays["gradient_blocks"]`` (block, layer, head, class + all)
    signed derivatives; ``meta`` holds provenance, settings and the token roles.
    """

    kind = "importance"
    figures_module = "attnlens.figures.importance"
    shown = {
        "summary": (
            "class", "share", "mass", "removed", "delta", "delta_low", "delta_high", "random", "random_low", "random_high",
            "gradient", "note",
        )
    }  # fmt: skip
    column_notes = {
        "share": "mass a query would put on the class with uniform attention over its valid keys",
        "mass": "average attention weight a query puts on the class (mean over layers and heads)",
        "delta": "change of the held-out objective with the class removed everywhere, 95% interval over blocks",
        "random": "the same with as many random valid positions removed per row (the control)",
    }
    main_table = "summary"
    classes = property(lambda self: self.tables["classes"])
    mass = property(lambda self: self.tables["mass"])
    entropy = property(lambda self: self.tables["entropy"])
    ablation = property(lambda self: self.tables["ablation"])
    gradient = property(lambda self: self.tables["gradient"])

    def summary(self) -> str:
        settings = self.settings
        return f"objective {settings['objective']!r}, classes {settings['classes']}"

    def text(self) -> str:
        """Per class that occurs: its share and mass, what removing it costs beside the random control,
        its gradient importance; then why any class was dropped, and the task."""
        table = self.table[self.table["occurs"].astype(bool)]
        notes = [f"{name}: {note}" for name, note in self.meta["notes"].items()]
        return "\n".join(
            [format_table(self.view(frame=table.drop(columns=["note"]))), *self.notes_for(table), *notes, *self.task_lines()]
        )


# ----------------------------------------------------------------------------- main


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class ImportanceSettings(CorpusSettings, TaskSettings):
    """Settings of :func:`importance`: the position ``classes`` (``None``: every default
    class that occurs), the ``objective``, the ablation scope beside the whole model
    (``per``), ``num_seqs`` held-out blocks, ``bootstrap`` resamples for the intervals,
    and whether to compute ``gradient`` importance; corpus settings as :class:`CorpusSettings`;
    with ``task`` (:class:`~attnlens.analysis.task.TaskSettings`) every ablation is also
    judged by task accuracy under ``protocol`` (only those of ``task_classes`` and their random
    controls when it is given: each judgement is a forward of every held-out example).

    >>> ImportanceSettings(per="row")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: per row is unknown; use one of model, layer, head
    """

    classes: str | tuple[str, ...] | None = None
    objective: str = "auto"
    per: str = "model"
    num_seqs: int = 64
    batch_size: int = 16
    bootstrap: int = 1000
    gradient: bool = True
    task_classes: str | tuple[str, ...] | None = None

    def validate(self) -> None:
        super().validate()
        parse_classes(self.classes)
        if self.task_classes is not None:
            parse_classes(self.task_classes)
        one_of("per", self.per, SCOPES)
        one_of("objective", self.objective, OBJECTIVES)
        at_least("num_seqs", self.num_seqs, 1)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")


def importance(
    source: str | LoadedModel = "minilm-l6",
    settings: ImportanceSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> ImportanceResult:
    """Attention mass, ablation importance with a random control, and gradient importance
    of position classes, on ``num_seqs`` held-out blocks of ``seq_len`` tokens.

    ``source`` is a model (alias, path, Hub id or :class:`LoadedModel`); ``settings``
    (:class:`ImportanceSettings`) with keyword ``changes`` applied. ``per`` adds
    per-layer or per-head ablations to the whole-model ones (per-head costs ``2 × classes
    × layers × heads`` forward passes per batch). ``classes=None`` takes
    :data:`attnlens.data.positions.DEFAULT_CLASSES` and drops those that never occur.
    """
    s = ImportanceSettings.build(settings, **changes)
    # the task is prepared (and so checked) in the prologue, before the first forward pass
    experiment = Experiment.start(source, s, num_eval=s.num_seqs, device=device, task=TaskSettings.of(s))
    model, classes = experiment.model, experiment.classes
    conditions = ablation_conditions(classes, s.per, model.num_layers, model.num_heads, s.seed)
    # The task's part (its probe, then every condition judged on its examples) costs more than the
    # blocks' passes: the larger share of the bar.
    passes_progress, task_progress = split(progress, 2, 5 if s.task is not None else 0)
    passes = _Passes.run(experiment, conditions, s, passes_progress)
    task_table = _task_table(experiment, TaskSettings.of(s), s, conditions, task_progress) if s.task is not None else None
    mass_table, entropy_table = _mass_tables(passes.mass, classes)
    ablation_table = _ablation_table(conditions, passes.losses, passes.pooled, passes.removed, passes.spared, s.bootstrap, s.seed)
    gradient_table = (
        _gradient_table(passes.gradients, classes, s.bootstrap, s.seed) if s.gradient else pd.DataFrame(columns=GRADIENT_COLUMNS)
    )
    dropped = tuple(experiment.notes)
    tables = {
        "summary": _summary_table(classes, dropped, experiment.notes, mass_table, ablation_table, gradient_table),
        "classes": _classes_table(
            classes + dropped, experiment.counts, mass_table, experiment.roles.description, experiment.notes
        ),
        "mass": mass_table,
        "entropy": entropy_table,
        "ablation": ablation_table,
        "gradient": gradient_table,
        **({"task": task_table[0]} if task_table is not None else {}),
    }
    arrays = {"ablation_blocks": passes.losses}
    if passes.pooled is not None:
        arrays["ablation_pooled_cosine"] = passes.pooled
    if s.gradient:
        arrays["gradient_blocks"] = passes.gradients
    if task_table is not None:  # every judged change's per-example outcomes, to re-pair any two
        arrays.update(task_table[2])
    removal = "-inf before softmax; rows that would lose every valid key are spared"
    run = {"num_seqs": len(experiment.held_out), "removal": removal}
    meta = experiment.metadata(s, command, settings=run, task=task_table[1] if task_table is not None else None)
    return ImportanceResult(meta, tables, arrays)


@dataclass
class _Passes:
    """What the passes over the held-out blocks measure: the mass (unmodified pass), every
    condition's per-block losses and what it removed and spared, and the gradients."""

    mass: _MassAccumulator
    losses: np.ndarray  # (condition, block)
    pooled: np.ndarray | None  # (condition, block) pooled cosines, hidden objective only
    removed: np.ndarray  # (condition, 2): removed valid positions, valid positions
    spared: np.ndarray  # (condition, 2): spared rows, rows
    gradients: np.ndarray  # (block, layer, head, class + all)

    @classmethod
    def run(cls, experiment: Experiment, conditions: list[Ablation | None], s: ImportanceSettings, progress: Progress) -> _Passes:
        model, classes, blocks = experiment.model, experiment.classes, experiment.held_out
        size = (len(conditions), len(blocks))
        passes = cls(
            _MassAccumulator(model.num_layers, model.num_heads, len(classes)),
            np.zeros(size),
            np.zeros(size) if experiment.objective.name == "hidden" else None,
            np.zeros((len(conditions), 2)),
            np.zeros((len(conditions), 2)),
            np.zeros((len(blocks), model.num_layers, model.num_heads, len(classes) + 1)),
        )
        held_out = experiment.split(blocks, s.batch_size)
        groups, group_valid = layer_groups(experiment.valid.to(model.device))
        total = len(held_out.inputs) * (len(conditions) + (1 if s.gradient else 0))
        with progress_bar(total=total, desc="importance", unit="pass", enabled=progress) as bar:
            start = 0
            for number, (batch, view) in enumerate(zip(held_out.inputs, held_out.views)):
                rows = slice(start, start + view.ids.shape[0])
                stacked = torch.stack(list(view.classes(classes).values())).float()
                for index, condition in enumerate(conditions):  # a per-layer ablation runs from its layer (starts)
                    where = (held_out.starts, number)
                    passes.measure(experiment, index, condition, batch, view, rows, stacked, groups, group_valid, where)
                    bar.update(1)
                if s.gradient:
                    passes.gradients[rows] = _batch_gradients(experiment.objective, batch, blocks.index[rows], stacked, s.seed)
                    bar.update(1)
                start = rows.stop
        return passes

    def measure(self, experiment, index, condition, batch, view, rows, stacked, groups, group_valid, where) -> None:
        """One condition on one batch: the unmodified pass records the mass; an ablation its losses
        and what it removed from (and spared of) the valid positions of the layers it changes."""
        if condition is None:
            self.mass.masks = stacked
            with torch.no_grad(), Capture(weights=True, sink=self.mass.sink):
                metrics = evaluate_batch(experiment.objective, batch)
        else:
            metrics = evaluate_batch(experiment.objective, batch, condition.intervention(view), condition.layers, where)
            prepared, size = condition.prepare(view), view.ids.shape[0]
            affected = range(experiment.model.num_layers) if condition.layer < 0 else [condition.layer]
            for layer in affected:
                valid = group_valid[groups[layer]]
                remove = condition.positions(prepared, valid)
                self.removed[index] += (float(remove.sum()), float(valid.sum()) * size)
                if condition.control == "class":
                    target = prepared[0] & valid
                    self.spared[index] += (float((target.any(-1) & ~remove.any(-1)).sum()), float(valid.any(-1).sum()) * size)
        self.losses[index, rows] = metrics["loss"]
        if self.pooled is not None:
            self.pooled[index, rows] = metrics["pooled_cosine"]


def _task_table(
    experiment: Experiment, task_settings, s, conditions: list[Ablation | None], progress: Progress
) -> tuple[pd.DataFrame, dict, dict[str, np.ndarray]]:
    """Every ablation judged by task accuracy; class rows carry their excess over the random control
    (the class's accuracy minus the control's, paired over examples, judged as a judgement is);
    the judge's description and every judged change's per-example outcomes."""
    judge = TaskJudge(
        experiment.model, task_settings, seq_len=s.seq_len, batch_size=s.batch_size, seed=s.seed, progress=progress,
        prepared=experiment.task,
    )  # fmt: skip
    if s.task_classes is not None:  # the unmodified run, then the chosen classes, each beside its random control
        chosen = parse_classes(s.task_classes)
        conditions = [condition for condition in conditions if condition is None or condition.cls in chosen]
    rows = []
    with progress_bar(total=len(conditions), desc="importance: task", unit="condition", enabled=progress) as bar:
        for condition in conditions:
            rows.append({**condition_row(condition), **task_columns(judge.judge(condition))})
            bar.update(1)
    table = pd.DataFrame(rows)
    excess = np.full((len(table), 3), np.nan)
    for index in np.flatnonzero((table["control"] == "class").to_numpy()):  # the random control follows its class
        compared = judge.compare(conditions[index], conditions[index + 1])
        excess[index] = compared["difference"], compared["difference_low"], compared["difference_high"]
    table["excess_accuracy"], table["excess_accuracy_low"], table["excess_accuracy_high"] = excess.T
    return table, judge.describe(), judge.outcome_arrays()


def _batch_gradients(
    judge: Objective, batch: PreparedBatch, block_index: np.ndarray, stacked: torch.Tensor, seed: int
) -> np.ndarray:
    """(batch, layer, head, class + all) derivatives of each block's loss w.r.t. its gates at 1."""
    gates: dict[int, torch.Tensor] = {}

    def gate(layer: int, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        # One gate per (block, head, query, key); a class gate's derivative is the sum over
        # its positions, so one backward pass gives every class and every level at once.
        gates[layer] = torch.ones_like(weights, requires_grad=True)
        return weights * gates[layer]

    with torch.enable_grad(), frozen(judge.model.model), Capture(record=False, intervene_weights=gate):
        gradient_target(judge, batch, block_index, seed).backward()
    per_class = []
    masks = stacked.double()  # float64 sums: per-position derivatives of both signs cancel
    for layer in sorted(gates):
        grad = gates[layer].grad.double()
        classes = torch.einsum("bhqk,cbqk->bhc", grad, masks)
        per_class.append(torch.cat([classes, grad.sum((-1, -2))[..., None]], dim=-1))
    return torch.stack(per_class, dim=1).double().cpu().numpy()


def _ablation_table(conditions, losses, pooled, removed, spared, bootstrap, seed) -> pd.DataFrame:
    delta = losses - losses[0]
    mean, low, high = bootstrap_interval(delta, bootstrap, seed)
    table = pd.DataFrame([condition_row(condition) for condition in conditions])
    table["removed"] = np.where(removed[:, 1] > 0, removed[:, 0] / np.maximum(removed[:, 1], 1), 0.0)
    table["rows_spared"] = np.where(spared[:, 1] > 0, spared[:, 0] / np.maximum(spared[:, 1], 1), np.nan)
    if pooled is None:  # hidden (the one with pooled cosines): its unmodified loss is 0, so loss would repeat delta
        table["loss"] = losses.mean(1)
    table["delta"], table["delta_low"], table["delta_high"] = mean, low, high
    if pooled is not None:
        table["pooled_cosine"], table["pooled_cosine_low"], table["pooled_cosine_high"] = bootstrap_interval(
            pooled, bootstrap, seed
        )
    # class minus its random control, paired over blocks (random rows follow their class rows)
    excess = np.full((3, len(conditions)), np.nan)
    is_class = (table["control"] == "class").to_numpy()
    index = np.flatnonzero(is_class)
    if len(index):
        excess[:, index] = np.stack(bootstrap_interval(delta[index] - delta[index + 1], bootstrap, seed))
        # the control spares the same rows: it removes as many positions, and none where the class removes none
        table.loc[index + 1, "rows_spared"] = table.loc[index, "rows_spared"].to_numpy()
    table["excess"], table["excess_low"], table["excess_high"] = excess
    return table


GRADIENT_COLUMNS = ["level", "layer", "head", "class", "importance", "importance_low", "importance_high", "signed"]


def _gradient_table(gradients: np.ndarray, classes: tuple[str, ...], bootstrap: int, seed: int) -> pd.DataFrame:
    names = [*classes, "all"]
    frames = []
    num_blocks, num_layers, num_heads, _ = gradients.shape
    levels = {
        "model": (gradients.sum((1, 2))[:, None, None], [-1], [-1]),
        "layer": (gradients.sum(2)[:, :, None], range(num_layers), [-1]),
        "head": (gradients, range(num_layers), range(num_heads)),
    }
    for level, (values, layers, heads) in levels.items():
        values = np.moveaxis(values, 0, -1)  # (layer, head, class, block)
        mean, low, high = bootstrap_interval(np.abs(values), bootstrap, seed)
        layer, head, cls = np.meshgrid(list(layers), list(heads), np.arange(len(names)), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "level": level,
                    "layer": layer.ravel(),
                    "head": head.ravel(),
                    "class": np.asarray(names, dtype=object)[cls.ravel()],
                    "importance": mean.ravel(),
                    "importance_low": low.ravel(),
                    "importance_high": high.ravel(),
                    "signed": values.mean(-1).ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _classes_table(classes, counts, mass_table, roles, notes) -> pd.DataFrame:
    share = mass_table.groupby("class")["share"].mean()
    definitions = {
        "self": "j = i",
        "prev": "j = i - 1",
        "next": "j = i + 1",
        "other": "none of the other classes measured",
        **{role: f"key is {text}" for role, text in roles.items()},
    }
    rows = []
    for name in classes:
        rows.append(
            {
                "class": name,
                "definition": definitions.get(name, "0 < |i - j| <= w" if name.startswith("band") else ""),
                "occurs": name not in notes,
                "positions": counts.get(name, 0),
                "share": share.get(name, np.nan),
                "note": notes.get(name, ""),
            }
        )
    return pd.DataFrame(rows)


def _summary_table(classes, dropped, notes, mass_table, ablation, gradient) -> pd.DataFrame:
    rows = []
    model_rows = ablation[ablation["scope"] == "model"]
    grad_rows = gradient[gradient["level"] == "model"].set_index("class") if len(gradient) else None
    for name in classes:
        mass = mass_table[mass_table["class"] == name]
        row = {
            "class": name,
            "occurs": True,
            "share": mass["share"].mean(),
            "mass": mass["mass"].mean(),
            "mass_max": mass["mass"].max(),
        }
        for control, prefix in (("class", "delta"), ("random", "random")):
            picked = model_rows[(model_rows["class"] == name) & (model_rows["control"] == control)].iloc[0]
            row[prefix], row[f"{prefix}_low"], row[f"{prefix}_high"] = picked["delta"], picked["delta_low"], picked["delta_high"]
            if "pooled_cosine" in picked:
                row["pooled_cosine" if control == "class" else "random_pooled_cosine"] = picked["pooled_cosine"]
            if control == "class":
                row["removed"] = picked["removed"]
                row["excess"], row["excess_low"], row["excess_high"] = (
                    picked["excess"],
                    picked["excess_low"],
                    picked["excess_high"],
                )
        if grad_rows is not None and name in grad_rows.index:
            picked = grad_rows.loc[name]
            row["gradient"], row["gradient_low"], row["gradient_high"] = (
                picked["importance"],
                picked["importance_low"],
                picked["importance_high"],
            )
        row["note"] = ""
        rows.append(row)
    for name in dropped:
        rows.append({"class": name, "occurs": False, "note": notes[name]})
    return pd.DataFrame(rows)
