"""Allocating FLOPs over heads: per-head curves, the greedy path, and the plans to beat.

**Curves.** For every head and every choice, the mean cost (proxy loss increase on the
selection blocks) of changing that head alone, every other head exact.

**The greedy path** (:func:`greedy_path`) treats the heads' costs as additive and spends
them where they buy the most FLOPs. Each head's choices are cut to their lower convex hull
in (FLOPs saved, cost); the hull's segments of all heads, sorted by cost per FLOP saved,
give the path: step t applies the first t segments. Step 0 is every head exact; the last
step is every head at its cheapest choice. Costs are not additive (heads interact), so
:func:`attnlens.analysis.plan.plan` verifies steps on the model and picks its step from
what it measures, not from the sum.

**Baselines.** :func:`uniform` gives every head the same choice (one k everywhere, as the
paper does; one window everywhere, the analogue of one sparsity for all heads), and
:func:`random_allocation` moves random heads to random cheaper choices until the FLOPs
match a plan's.

>>> curves = pd.DataFrame({"layer": [0, 0, 0, 0], "head": [0, 0, 1, 1], "choice": ["partial(2)", "window(1)"] * 2,
...                        "flops": [50.0, 20.0, 50.0, 20.0], "cost": [0.1, 0.5, 0.01, 0.9]})
>>> [(step["layer"], step["head"], step["choice"]) for step in greedy_path(curves, full=100.0)]
[(0, 1, 'partial(2)'), (0, 0, 'partial(2)'), (0, 0, 'window(1)'), (0, 1, 'window(1)')]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change
from attnlens.analysis.plan.choices import EXACT, Assignment, Choice, parse
from attnlens.progress import Progress, progress_bar


def head_curves(
    units: list[tuple[int, int]],
    choices: list[Choice],
    change_of: Callable[[Assignment], Change],
    cost_of: Callable[[Change], np.ndarray],
    flops_of: Callable[[Choice], float],
    progress: Progress = True,
) -> pd.DataFrame:
    """Mean cost of every (head, choice) alone, with its FLOPs: one row per pair."""
    records = []
    with progress_bar(total=len(units) * len(choices), desc="head curves", unit="change", enabled=progress) as bar:
        for layer, head in units:
            for choice in choices:
                values = cost_of(change_of({(layer, head): choice}))
                records.append(
                    {"layer": layer, "head": head, "choice": str(choice), "flops": flops_of(choice), "cost": float(values.mean())}
                )
                bar.update(1)
    return pd.DataFrame(records)


def _hull(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The lower convex hull of (saved, cost, choice) from exact, (0, 0): savings and cost per saving both rise."""
    hull = [(0.0, 0.0, str(EXACT))]
    for saved, cost, name in sorted(points):
        if saved <= hull[-1][0]:  # as much saved as the last point, at no less cost
            continue
        while len(hull) > 1 and _slope(hull[-2], hull[-1]) >= _slope(hull[-2], (saved, cost)):
            hull.pop()
        hull.append((saved, cost, name))
    return hull


def _slope(a: tuple, b: tuple) -> float:
    return (b[1] - a[1]) / (b[0] - a[0])


def greedy_path(curves: pd.DataFrame, full: float) -> list[dict]:
    """The greedy path's steps in order: for each, the head, its new choice, the FLOPs it saves and
    the cost it adds (as measured alone); negative costs (noise) count as 0."""
    segments = []
    for (layer, head), rows in curves.groupby(["layer", "head"], sort=True):
        points = [(full - f, max(c, 0.0), name) for f, c, name in zip(rows.flops, rows.cost, rows.choice)]
        hull = _hull(points)
        for order, (a, b) in enumerate(zip(hull, hull[1:])):
            segments.append((_slope(a, b), layer, head, order, b[2], b[0] - a[0], b[1] - a[1]))
    segments.sort(key=lambda s: (s[0], s[1], s[2], s[3]))
    return [
        {"layer": int(layer), "head": int(head), "choice": name, "saved": saved, "added": added}
        for _, layer, head, _, name, saved, added in segments
    ]


def at_step(path: list[dict], step: int) -> Assignment:
    """The assignment after the first ``step`` steps of the path."""
    assignment: Assignment = {}
    for segment in path[:step]:
        assignment[segment["layer"], segment["head"]] = parse(segment["choice"])
    return assignment


def uniform(units: list[tuple[int, int]], choice: Choice) -> Assignment:
    return {unit: choice for unit in units}


def random_allocation(
    units: list[tuple[int, int]], choices: list[Choice], flops_of: Callable[[Choice], float], target: float, seed: int
) -> Assignment:
    """Random heads moved to random cheaper choices until the total FLOPs are at most ``target``."""
    rng = np.random.default_rng(seed)
    assignment: Assignment = {unit: EXACT for unit in units}
    total = flops_of(EXACT) * len(units)
    while total > target:
        movable = [u for u in units if any(flops_of(c) < flops_of(assignment[u]) for c in choices)]
        if not movable:
            break  # every head at its cheapest choice
        unit = movable[rng.integers(len(movable))]
        cheaper = [c for c in choices if flops_of(c) < flops_of(assignment[unit])]
        choice = cheaper[rng.integers(len(cheaper))]
        total += flops_of(choice) - flops_of(assignment[unit])
        assignment[unit] = choice
    return assignment
