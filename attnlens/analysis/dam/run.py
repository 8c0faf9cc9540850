"""``dam()``: learn masks on training blocks and judge them, beside fixed patterns, on held-out blocks.

The run reads as its steps: the shared prologue (:class:`~attnlens.analysis.experiment.Experiment`),
the :class:`~attnlens.analysis.dam.runs.Setup` (layout, batches, warm start, batch order, task), the
fixed patterns, one training and judgement per run
(:func:`~attnlens.analysis.dam.mask_run.train_and_judge`), the task's view of the patterns
(:mod:`~attnlens.analysis.dam.compared`), and the result's tables
(:func:`~attnlens.analysis.dam.assemble.assemble`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change
from attnlens.analysis.dam.assemble import assemble, with_deltas
from attnlens.analysis.dam.compared import adapted_on_task, matched_on_task
from attnlens.analysis.dam.judging import judge_patterns, judge_patterns_on_task, pattern_points
from attnlens.analysis.dam.mask_run import train_and_judge
from attnlens.analysis.dam.result import DamResult
from attnlens.analysis.dam.runs import Run, Setup
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.experiment import Experiment
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar


def dam(
    source: str | LoadedModel = "minilm-l6",
    settings: DamSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> DamResult:
    """Learn attention masks for each target sparsity (or λ) on training blocks and judge them on held-out blocks.

    ``source`` is a model (alias, path, Hub id or :class:`LoadedModel`); ``settings``
    (:class:`DamSettings`) with keyword ``changes`` applied. Every run starts from the same
    logits (``init_keep`` keep-probability, or the pattern ``init``) and sees the same batches
    and noise (``seed``). With ``train_weights`` the model is fine-tuned alongside (learning
    rate ``weights_lr``) and restored after each run.

    >>> from attnlens import dam
    >>> result = dam("minilm-l6", lambdas=[0.0, 1.0], steps=3, stop_window=2, seq_len=16, train_seqs=4, eval_seqs=4,
    ...              batch_size=2, patterns=False, bootstrap=50, progress=False)
    >>> result.table[["lambda", "steps"]].values.tolist()   # steps used: at most the cap
    [[0.0, 3.0], [1.0, 3.0]]
    >>> result.logits.shape                          # (run, head, offset) for the structured variant
    (2, 12, 16)
    """
    s = DamSettings.build(settings, **changes)
    experiment = Experiment.start(  # the task is prepared (and so checked) here, before the first forward pass
        source, s, classes=s.mask.classes, objective=s.judging.objective, num_eval=s.eval_seqs, num_train=s.train_seqs,
        device=device, task=s.task,
        task_trains=s.training.train_on == "task", precision=s.precision,
    )  # fmt: skip
    setup = Setup.of(experiment, s, progress)
    with progress_bar(total=setup.total_steps(), desc="dam", unit="step", enabled=progress) as bar:
        # the patterns first (on the unmodified model): weight training under a pattern needs their sparsity
        points = pattern_points(s.seq_len, experiment.model.causal) if s.judging.patterns else []
        patterns, pattern_losses = judge_patterns(
            setup.judging_objective, setup.held_out.split, setup.layout.valid, points, s.seed, bar
        )
        if setup.task is not None and points:  # each point's share of the task's own positions, to match on
            patterns = patterns.assign(
                task_sparsity=[setup.task.removal_share(setup.pattern(row)) for row in patterns.itertuples()]
            )
        runs = [train_and_judge(setup.for_seed(seed), lam, target, seed, patterns, bar) for lam, target, seed in s.runs()]
        _distinct_keys(runs)
        task_patterns = None if setup.task is None or not points else _task_patterns(setup, patterns, pattern_losses, runs, bar)
    return assemble(setup, patterns, pattern_losses, runs, task_patterns, command)


def _distinct_keys(runs: list[Run]) -> None:
    """Runs are told apart by the λ they end at. Two seeds of a target end at the same λ only when
    dual ascent never saw their hard masks differ (no logit crossed the threshold: a run too short);
    the later one's key is then moved up by the least step a float allows, so every table keeps
    one row per run."""
    seen: set[float] = set()
    for run in runs:
        while run.lam in seen:
            run.lam = float(np.nextafter(run.lam, np.inf))
        seen.add(run.lam)
        run.summary["lambda"] = run.lam
        run.curve = run.curve.assign(**{"lambda": run.lam})
        if run.task is not None:
            run.task["lambda"] = run.lam
        if run.reference is not None:
            run.reference["lambda"] = run.lam
        for row, _, _ in run.adapted:
            row["lambda"] = run.lam


def _task_patterns(
    setup: Setup, patterns: pd.DataFrame, pattern_losses: np.ndarray, runs: list[Run], bar
) -> tuple[pd.DataFrame, pd.DataFrame, list[Change]]:
    """The patterns the task judges and each mask is compared with (rows of lambda, scope, pattern,
    value), their task table and outcomes: with ``train_weights``, those trained beside each mask;
    else those ``task_patterns`` names, judged now."""
    s, task = setup.settings, setup.task
    assert task is not None, "the task's view of the patterns needs a task"
    if s.training.train_weights:  # judged by the task with the weights they trained
        return adapted_on_task(runs)
    compared = matched_on_task(setup, with_deltas(patterns, pattern_losses, setup.baseline, s), runs, s.judging.task_patterns)
    chosen = patterns if s.judging.task_patterns == "all" else patterns.merge(compared[["pattern", "value"]].drop_duplicates())
    table, changes = judge_patterns_on_task(task, chosen, s.seq_len, s.seed, bar)
    return compared, table, list(changes)
