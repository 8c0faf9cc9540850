"""Allocating FLOPs over heads: per-head curves, the greedy path, and the plans to beat.

**Curves.** For every head and every choice, the mean cost (proxy loss increase, or the
divergence of the task's predictions, on the curve examples) of changing that head alone, every other head
exact, beside the choice's price (FLOPs, or seconds from the timing table).

**The greedy path** (:func:`greedy_path`) treats the heads' costs as additive and spends
them where they save the most. Each head's choices are cut to their lower convex hull in
(price saved, cost); the hull's segments of all heads, sorted by cost per unit saved, give
the path: step t applies the first t segments. Step 0 is every head exact; the last step
is every head at its cheapest choice. Costs are not additive (heads interact), so
:func:`attnlens.analysis.plan.plan` verifies steps on the model and picks its step from
what it measures, not from the sum.

**Baselines.** :func:`uniform` gives every head the same choice (one k everywhere, as the
paper does; one window everywhere, the analogue of one sparsity for all heads), and
:func:`random_allocation` moves random heads to random cheaper choices until their price
matches a plan's.

>>> curves = pd.DataFrame({"layer": [0, 0, 0, 0], "head": [0, 0, 1, 1], "choice": ["partial(2)", "window(1)"] * 2,
...                        "saved": [50.0, 80.0, 50.0, 80.0], "cost": [0.1, 0.5, 0.01, 0.9]})
>>> [(step["layer"], step["head"], step["choice"]) for step in greedy_path(curves)]
[(0, 1, 'partial(2)'), (0, 0, 'partial(2)'), (0, 0, 'window(1)'), (0, 1, 'window(1)')]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change
from attnlens.analysis.plan.choices import EXACT, Assignment, Choice, parse
from attnlens.progress import Progress, progress_bar

Price = Callable[[int, Choice], float]
"""What one head of a layer spends under a choice: ``price_of(layer, choice)``."""


def saving_pairs(units: list[tuple[int, int]], choices: list[Choice], price_of: Price) -> list[tuple[int, int, Choice]]:
    """Every (layer, head, choice) that saves anything against exact: a choice that costs a layer as much as
    exact is never worth a curve."""
    return [(layer, head, c) for layer, head in units for c in choices if price_of(layer, c) < price_of(layer, EXACT)]


def curve_table(pairs: list[tuple[int, int, Choice]], costs: list[float], price_of: Price) -> pd.DataFrame:
    """The curves' table: per pair its cost, its price and what it saves against exact."""
    records = [
        {"layer": layer, "head": head, "choice": str(choice), "price": price_of(layer, choice),
         "saved": price_of(layer, EXACT) - price_of(layer, choice), "cost": cost}
        for (layer, head, choice), cost in zip(pairs, costs)
    ]  # fmt: skip
    return pd.DataFrame(records, columns=["layer", "head", "choice", "price", "saved", "cost"])


def head_curves(
    units: list[tuple[int, int]],
    choices: list[Choice],
    change_of: Callable[[Assignment], Change],
    cost_of: Callable[[Change], np.ndarray],
    price_of: Price,
    progress: Progress = True,
) -> pd.DataFrame:
    """Mean cost of every (head, choice) alone, a forward each, with its price and what it saves against
    exact: one row per pair that saves anything (:func:`saving_pairs`)."""
    pairs = saving_pairs(units, choices, price_of)
    costs = []
    with progress_bar(total=len(pairs), desc="head curves", unit="change", enabled=progress) as bar:
        for layer, head, choice in pairs:
            costs.append(float(cost_of(change_of({(layer, head): choice})).mean()))
            bar.update(1)
    return curve_table(pairs, costs, price_of)


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


def greedy_path(curves: pd.DataFrame) -> list[dict]:
    """The greedy path's steps in order: for each, the head, its new choice, the price it saves and
    the cost it adds (as measured alone); negative costs (noise) count as 0."""
    segments = []
    for (layer, head), rows in curves.groupby(["layer", "head"], sort=True):
        points = [(saved, max(c, 0.0), name) for saved, c, name in zip(rows.saved, rows.cost, rows.choice)]
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
    units: list[tuple[int, int]], choices: list[Choice], price_of: Price, target: float, seed: int
) -> Assignment:
    """Random heads moved to random cheaper choices until the total price is at most ``target``."""
    rng = np.random.default_rng(seed)
    assignment: Assignment = {unit: EXACT for unit in units}
    total = sum(price_of(layer, EXACT) for layer, _ in units)

    def cheaper(unit: tuple[int, int]) -> list[Choice]:
        return [c for c in choices if price_of(unit[0], c) < price_of(unit[0], assignment[unit])]

    while total > target:
        movable = [u for u in units if cheaper(u)]
        if not movable:
            break  # every head at its cheapest choice
        unit = movable[rng.integers(len(movable))]
        offered = cheaper(unit)
        choice = offered[rng.integers(len(offered))]
        total += price_of(unit[0], choice) - price_of(unit[0], assignment[unit])
        assignment[unit] = choice
    return assignment
