"""The fixed patterns set beside each mask: given its weight training, and chosen for the task's comparisons.

With ``train_weights`` the settings' ``adapted_patterns`` nearest a mask's sparsity get the same
weight training as the mask (:func:`adapt_patterns`), and the task compares each mask with those
(:func:`adapted_on_task`); otherwise the task compares it with the patterns matched on the task's
own positions (:func:`matched_on_task`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change, PatternChange
from attnlens.analysis.dam.judging import adapt_to_pattern, removed_fraction
from attnlens.analysis.dam.result import MATCH_WITHIN
from attnlens.analysis.dam.runs import Adapted, Run, Setup
from attnlens.analysis.evaluation import evaluate_change
from attnlens.analysis.patterns import PATTERNS
from attnlens.analysis.task import task_columns
from attnlens.models.loading import module_sha256


def matched_on_task(setup: Setup, patterns: pd.DataFrame, runs: list[Run], which: str) -> pd.DataFrame:
    """Per mask of ``runs``, the patterns the task compares it with, matched on the task's own
    positions: among the pattern points whose share of the task's valid positions (``task_sparsity``)
    is within :data:`MATCH_WITHIN` of the mask's (each pattern at its nearest point), the best by the
    held-out proxy (``patterns``' ``delta``) of the mask's own family and the best overall, or with
    ``which`` "adapted" each of the settings' ``adapted_patterns`` (scope "same fine-tuning"). Rows: lambda,
    scope, pattern, value."""
    rows = []
    for run in runs:
        mask = run.task
        assert mask is not None, "with a task, every run is judged by it"
        distance = (patterns["task_sparsity"] - mask["task_sparsity"]).abs()
        close = distance[distance <= MATCH_WITHIN]
        nearest = patterns.loc[close.groupby(patterns.loc[close.index, "pattern"]).idxmin()]
        expressible = [setup.layout.can_express(p, v) for p, v in zip(nearest["pattern"], nearest["value"])]
        nearest = nearest.assign(expressible=expressible)
        scopes = [("own family", nearest[nearest["expressible"]]), ("overall", nearest)]
        if which == "adapted":
            scopes = [
                ("same fine-tuning", nearest[nearest["pattern"] == name]) for name in setup.settings.judging.adapted_patterns
            ]
        for scope, candidates in scopes:
            if len(candidates):
                best = candidates.loc[candidates["delta"].idxmin()]
                rows.append({"lambda": mask["lambda"], "scope": scope, "pattern": best["pattern"], "value": int(best["value"])})
    return pd.DataFrame(rows, columns=["lambda", "scope", "pattern", "value"])


def adapt_patterns(
    setup: Setup, lam: float, sparsity: float, curve: pd.DataFrame, order: np.ndarray, patterns: pd.DataFrame, original: dict, bar
) -> list[Adapted]:
    """The points of the settings' ``adapted_patterns`` nearest a mask's ``sparsity`` (within 3 points;
    with a task, its sparsity on the task's own positions), each given the mask's weight training (the
    steps of its ``curve``: the same batches of ``order`` at the same learning rates) and
    judged on the held-out blocks, and by the task with the weights it trained (as the mask is);
    the weights are restored after each. Returns (row of ``patterns_adapted``, per-block losses,
    (the change as the task judged it, its judgement) or None)."""
    s, model = setup.settings, setup.experiment.model
    adapted: list[Adapted] = []
    if not s.judging.patterns:
        return adapted
    matched_on = "sparsity" if setup.task is None else "task_sparsity"
    batches = [int(order[step % len(order)]) for step in curve["step"]]
    rates = (curve["lr"] / s.training.lr).tolist()
    for name in s.judging.adapted_patterns:
        points = patterns[patterns["pattern"] == name]
        nearest = points.iloc[(points[matched_on] - sparsity).abs().argmin()]
        if abs(nearest[matched_on] - sparsity) > MATCH_WITHIN:
            bar.update(s.training.steps)
            continue
        change = setup.pattern(nearest)
        losses = adapt_to_pattern(model, setup.train_objective, setup.train.split, change, batches, rates, s, bar)
        bar.update(s.training.steps - len(batches))
        held_out = setup.held_out.split
        judged = evaluate_change(setup.judging_objective, held_out.inputs, held_out.views, change)["loss"]
        removed = removed_fraction(change, held_out, setup.layout.valid)
        outcome = None
        if setup.task is not None:  # with the weights it trained: two masks may adapt one pattern, each its own way
            change = replace(change, weights=module_sha256(model.model)[:16])
            outcome = (change, setup.task.judge(change))
        model.model.load_state_dict(original)
        row: dict = {
            "lambda": lam,
            "pattern": name,
            "family": PATTERNS[name].family,
            "value": int(nearest["value"]),
            "sparsity": removed,
        }
        row |= {"steps": len(batches), "train_objective": float(np.mean(losses[-max(1, len(losses) // 10) :]))}
        adapted.append((row, judged, outcome))
    return adapted


def adapted_on_task(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, list[Change]]:
    """The adapted patterns as the task judged them (each with the weights it trained, beside its
    mask): the rows each mask is compared with (scope "same fine-tuning"), their task table (with the
    mask's ``lambda``: two masks adapt a pattern each with its own training) and outcomes."""
    adapted: list[tuple[float, dict, tuple[PatternChange, dict]]] = []
    for run in runs:
        for row, _, outcome in run.adapted:
            assert outcome is not None, "with a task, every adapted pattern is judged by it"
            adapted.append((run.lam, row, outcome))
    compared = pd.DataFrame(
        [
            {"lambda": lam, "scope": "same fine-tuning", "pattern": row["pattern"], "value": row["value"]}
            for lam, row, _ in adapted
        ],
        columns=["lambda", "scope", "pattern", "value"],
    )
    rows = [
        {"lambda": lam, "pattern": row["pattern"], "value": row["value"], "sparsity": row["sparsity"], **task_columns(outcome[1])}
        for lam, row, outcome in adapted
    ]
    # no pattern near a mask's sparsity: an empty table that still has the columns the figures read
    table = (pd.DataFrame(rows) if rows else pd.DataFrame(columns=["lambda", "pattern", "value", "sparsity"])).assign(
        kind="pattern"
    )
    return compared, table, [outcome[0] for _, _, outcome in adapted]
