"""A DAM run's result put together: every run's rows, the patterns' and the task's tables, the arrays and the metadata.

:func:`assemble` turns the runs of one :func:`~attnlens.analysis.dam.run.dam` call
(:class:`~attnlens.analysis.dam.runs.Run`) and the patterns judged beside them into a
:class:`~attnlens.analysis.dam.result.DamResult`; :func:`with_deltas` gives a table of judged
changes their held-out loss and its change against the unmodified model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change
from attnlens.analysis.dam.judging import compare_on_task
from attnlens.analysis.dam.result import DamResult, keep_rows, keep_summary_rows, loss_columns, without_absolute_loss
from attnlens.analysis.dam.runs import Run, Setup
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.evaluation import bootstrap_interval


def assemble(
    setup: Setup,
    patterns: pd.DataFrame,
    pattern_losses: np.ndarray,
    runs: list[Run],
    task_patterns: tuple[pd.DataFrame, pd.DataFrame, list[Change]] | None,
    command: str | None,
) -> DamResult:
    """The result: every run's rows, the patterns with their change against the unmodified model
    (intervals over the same blocks), the task's tables (with ``task_patterns``, the patterns the task
    judged and their outcomes: each mask against them, paired), the arrays and the metadata."""
    s, experiment, baseline, judge = setup.settings, setup.experiment, setup.baseline, setup.judging_objective.name
    patterns = with_deltas(patterns, pattern_losses, baseline, s)
    adapted_rows = [row for run in runs for row, _, _ in run.adapted]
    adapted_losses = (
        np.stack([losses for run in runs for _, losses, _ in run.adapted]) if adapted_rows else np.zeros((0, len(baseline)))
    )
    columns = ["lambda", "pattern", "family", "value", "sparsity", "steps", "train_objective"]
    adapted = with_deltas(pd.DataFrame(adapted_rows, columns=columns), adapted_losses, baseline, s)
    tables = {
        "summary": _summary(runs, judge, s),
        "keep": pd.DataFrame([row for run in runs for row in keep_rows(run.lam, experiment.classes, run.judged)]),
        "keep_summary": pd.DataFrame(
            [row for run in runs for row in keep_summary_rows(run.lam, experiment.classes, run.judged, setup.same)]
        ),
        "patterns": without_absolute_loss(patterns, judge),
        "training": pd.concat([run.curve for run in runs], ignore_index=True),
    }
    if setup.task is not None:
        task_table = pd.DataFrame([run.task for run in runs]).assign(kind="dam", variant=s.mask.variant)
        tables["task"] = task_table if task_patterns is None else pd.concat([task_table, task_patterns[1]], ignore_index=True)
    adapting = s.training.train_weights and s.judging.patterns
    if adapting:
        tables["patterns_adapted"] = without_absolute_loss(adapted, judge)
    if s.judging.reference is not None:
        tables["reference"] = pd.DataFrame([run.reference for run in runs])
    arrays = {
        "logits": np.stack([run.logits for run in runs]),
        "keep_images": np.stack([run.image for run in runs]),
        "eval_losses": np.stack([run.judged["losses"] for run in runs]),
        "baseline_losses": baseline,
        "pattern_losses": pattern_losses,
        **({"adapted_pattern_losses": adapted_losses} if adapting else {}),
        **({"reference_logits": np.stack([_searched(run) for run in runs])} if s.judging.reference is not None else {}),
    }
    result = DamResult(_metadata(setup, command), tables, arrays)
    if task_patterns is not None:
        assert setup.task is not None, "only the task judges patterns"
        # a mask judged with the weights it trained (and patterns adapted beside it) cannot be run again on more examples
        compared, judged, changes = task_patterns
        masks: list[Change] = []
        for run in runs:
            assert run.task_change is not None, "with a task, every run's mask is judged by it"
            masks.append(run.task_change)
        extend = not s.training.train_weights
        result.tables["task_compared"] = compare_on_task(setup.task, compared, task_table, masks, judged, changes, extend=extend)
    if setup.task is not None:  # after the comparisons, which may judge changes on more examples
        result.arrays.update(setup.task.outcome_arrays())
    return result


def _searched(run: Run) -> np.ndarray:
    """The logits of the swap search beside ``run`` (with ``reference``, every run has one)."""
    assert run.reference_logits is not None, "with reference, a swap search runs beside every mask"
    return run.reference_logits


def _summary(runs: list[Run], judge: str, s: DamSettings) -> pd.DataFrame:
    """One row per run; columns of settings not used (no target, no warm start, one seed, a check
    that could not judge) are left out rather than all NaN or all the same."""
    table = without_absolute_loss(pd.DataFrame([run.summary for run in runs]), judge).dropna(axis=1, how="all")
    return table if s.mask.seeds > 1 else table.drop(columns="mask_seed")


def with_deltas(table: pd.DataFrame, losses: np.ndarray, baseline: np.ndarray, s: DamSettings) -> pd.DataFrame:
    """``table`` with each row's held-out loss and its change against the unmodified model (interval over blocks)."""
    if not len(table):
        return table.reindex(columns=[*table.columns, "loss", "delta", "delta_low", "delta_high"])
    table = table.assign(loss=losses.mean(1))
    table["delta"], table["delta_low"], table["delta_high"] = bootstrap_interval(losses - baseline, s.bootstrap, s.seed)
    return table


def _metadata(setup: Setup, command: str | None) -> dict:
    """The result's meta: the experiment's, what this run's settings came to, the layout, the baseline and the task."""
    s, experiment = setup.settings, setup.experiment
    assert experiment.train is not None, "dam's experiment draws training blocks (train_seqs)"
    mean, low, high = bootstrap_interval(setup.baseline[None], s.bootstrap, s.seed)
    runs = {
        "sparsity": None if s.target.lambdas is not None else list(dict.fromkeys(target for _, target, _ in s.runs())),
        "tau": list(s.training.temperature),
        "weights_lr": s.training.weights_lr if s.training.train_weights else None,
        "layout_classes": list(setup.layout_classes),
        "trained_on": setup.trained_on,
        "train_seqs": len(experiment.train),
        **({"train_block_index_by_seed": setup.train_blocks} if s.resample else {}),
        "eval_seqs": len(experiment.held_out),
        "logits_shape": list(setup.layout.shape),
        "optimiser": "Adam",
        "penalty": "lambda * mean of the hard mask over valid (layer, head, query, key) positions",
    }
    return experiment.metadata(
        s,
        command,
        settings=runs,
        layout=setup.layout.describe(),
        baseline={"loss": float(mean[0]), "loss_low": float(low[0]), "loss_high": float(high[0])},
        columns=loss_columns(setup.judging_objective.name),
        equal_by_construction=setup.same,
        task=setup.task.describe() if setup.task is not None else None,
    )
