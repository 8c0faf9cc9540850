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

The parts: :mod:`~attnlens.analysis.importance.settings` (:class:`ImportanceSettings`),
:mod:`~attnlens.analysis.importance.passes` (the passes over the blocks),
:mod:`~attnlens.analysis.importance.tables` (their tables) and
:mod:`~attnlens.analysis.importance.result` (:class:`ImportanceResult`); :func:`importance` runs them.

>>> from attnlens import importance
>>> result = importance("minilm-l6", classes="self,prev,other", seq_len=16, num_seqs=4,
...                     bootstrap=50, progress=False)
>>> list(result.table["class"])
['self', 'prev', 'other']
>>> bool((result.mass.groupby(["layer", "head"])["mass"].sum() - 1).abs().max() < 1e-5)   # a partition
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Ablation
from attnlens.analysis.experiment import Experiment
from attnlens.analysis.importance.passes import Passes, ablation_conditions, condition_row
from attnlens.analysis.importance.result import ImportanceResult
from attnlens.analysis.importance.settings import ImportanceSettings
from attnlens.analysis.importance.tables import (
    GRADIENT_COLUMNS,
    tabulate_ablations,
    tabulate_classes,
    tabulate_gradients,
    tabulate_mass,
    tabulate_summary,
)
from attnlens.analysis.task import TaskJudge, TaskSettings, task_columns
from attnlens.data.positions import parse_classes
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar, split


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
    experiment = Experiment.start(
        source, s, classes=s.classes, objective=s.objective, num_eval=s.num_seqs, device=device, task=s.task,
        precision=s.precision,
    )  # fmt: skip
    model, classes = experiment.model, experiment.classes
    conditions = ablation_conditions(classes, s.per, model.num_layers, model.num_heads, s.seed)
    # The task's part (its probe, then every condition judged on its examples) costs more than the
    # blocks' passes: the larger share of the bar.
    passes_progress, task_progress = split(progress, 2, 5 if s.task.name is not None else 0)
    passes = Passes.run(experiment, conditions, s, passes_progress)
    task_table = _task_table(experiment, s.task, s, conditions, task_progress) if s.task.name is not None else None
    mass_table, entropy_table = tabulate_mass(passes.mass, classes)
    ablation_table = tabulate_ablations(
        conditions, passes.losses, passes.pooled, passes.removed, passes.spared, s.bootstrap, s.seed
    )
    gradient_table = (
        tabulate_gradients(passes.gradients, classes, s.bootstrap, s.seed)
        if s.gradient
        else pd.DataFrame(columns=GRADIENT_COLUMNS)
    )
    dropped = tuple(experiment.notes)
    tables = {
        "summary": tabulate_summary(classes, dropped, experiment.notes, mass_table, ablation_table, gradient_table),
        "classes": tabulate_classes(
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


def _task_table(
    experiment: Experiment,
    task_settings: TaskSettings,
    s: ImportanceSettings,
    conditions: list[Ablation | None],
    progress: Progress,
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
            with judge.moving(bar):  # a judgement's examples move the bar through its condition
                rows.append({**condition_row(condition), **task_columns(judge.judge(condition))})
            bar.update(1)
    table = pd.DataFrame(rows)
    excess = np.full((len(table), 3), np.nan)
    for index in np.flatnonzero((table["control"] == "class").to_numpy()):  # the random control follows its class
        ablated = conditions[index]
        assert ablated is not None, "a class row is an ablation (the unmodified run's control is none)"
        compared = judge.compare(ablated, conditions[index + 1])
        excess[index] = compared["difference"], compared["difference_low"], compared["difference_high"]
    table["excess_accuracy"], table["excess_accuracy_low"], table["excess_accuracy_high"] = excess.T
    return table, judge.describe(), judge.outcome_arrays()
