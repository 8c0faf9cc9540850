"""Plan the cheapest attention that keeps the model within a budget, head by head.

:func:`plan` answers "at most this much loss, in accuracy or in the proxy: which heads can
be computed partially (k exact scores per query and a least-squares map), which can keep a
window of keys, and which must stay exact, at the fewest attention FLOPs?" (or, with
``cost="seconds"``, the fewest seconds per call measured on this machine:
:mod:`~attnlens.analysis.plan.seconds`):

1. **curves**: every head alone, under every choice (:mod:`~attnlens.analysis.plan.choices`),
   costs so much on the curve examples (not those the plan is chosen on). Under an accuracy budget
   every head is screened at once (``head_costs`` ``"auto"`` or ``"screen"``), its divergence estimated
   from a forward and a backward pass per class (:mod:`~attnlens.analysis.plan.screen`), so that this
   step's cost does not grow with the heads; under a proxy budget (or ``head_costs="forwards"``) each
   head is measured alone under each choice, a forward each;
2. **path**: the greedy path spends FLOPs where they cost least, treating the heads' costs
   as additive (:func:`~attnlens.analysis.plan.allocate.greedy_path`);
3. **verify and repair**: heads interact, so the step the sum predicts is run on the model
   and judged on the selection data (the selection blocks, or half of the task's held-out
   examples, with a margin for the check's own interval); where it misses the budget, a binary search moves back along the path to the
   last step that meets it (and forward where the sum was too cautious); one choice for every
   head (each uniform k, each uniform window) is a candidate too, and the plan is the cheapest
   candidate that meets the budget on the selection data, so it never costs more there than a
   uniform plan that meets;
4. **check**: the chosen plan is judged on data it was not chosen on (held-out blocks, or
   the other half of the task's examples), beside the best uniform plans (one k for every
   head; one window for every head) and a random allocation of the same FLOPs, each
   difference with its paired interval.

The result (:class:`~attnlens.analysis.plan.result.PlanResult`) saves every budget's plan
with its maps; :meth:`~attnlens.analysis.plan.result.PlanResult.apply` runs a model under a
plan through the partial attention function (:mod:`attnlens.models.partial`).

>>> import attnlens
>>> result = attnlens.plan("minilm-l3", seq_len=16, fit_seqs=8, curve_seqs=4, select_seqs=4, eval_seqs=4,
...                        max_loss=[0.05], ks=[2], widths=[2], progress=False)
>>> result.methods.method.tolist()
['plan', 'uniform partial', 'uniform partial at plan FLOPs', 'uniform window', 'uniform window at plan FLOPs', 'random']
>>> bool(result.methods.flops_ratio.iloc[0] < 1)      # the plan computes less than exact attention
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnlens.analysis.changes import Change, seeded
from attnlens.analysis.experiment import Experiment
from attnlens.analysis.plan.allocate import Price, at_step, greedy_path, head_curves, random_allocation, uniform
from attnlens.analysis.plan.assemble import MapBank, assignment_key, layer_plans, plan_change, saved_maps
from attnlens.analysis.plan.choices import EXACT, Assignment, Choice, changes_pairs, flops, flops_on, options, parse
from attnlens.analysis.plan.judging import Budget, Costs, ProxyCosts, TaskCosts
from attnlens.analysis.plan.result import NONE_MEETS, Form, Method, PlanResult
from attnlens.analysis.plan.screen import screen_curves
from attnlens.analysis.plan.seconds import Geometry, Timings, measure
from attnlens.analysis.plan.settings import PlanSettings
from attnlens.analysis.reconstruct import MapFitter
from attnlens.data.corpus import Blocks
from attnlens.errors import BadInput
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar, split
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.sources import ModelRows, model_pairs

__all__ = ["PlanResult", "PlanSettings", "plan"]

RANDOM_STREAM = 23  # the random allocations' draws
FIT_STREAM = 24  # which training blocks fit the maps and which choose the plan
# The maps' ridge, relative to the chosen keys' mean variance. Larger than reconstruct's default (1e-6, for
# fits on 128 blocks): a causal model's per-query maps see one row per fitting block, and a plan fits on 64.
MAP_RIDGE = 1e-3


@dataclass
class _Planner:
    """What every step of a plan shares: the model's units, the choices, maps, and the judges."""

    experiment: Experiment
    s: PlanSettings
    fit: Blocks  # the blocks the maps are fitted on
    curve: Blocks  # the blocks the heads' curves are measured on
    select: Blocks  # the blocks a loss budget's plan is chosen on
    units: list[tuple[int, int]]
    choices: list[Choice]
    bank: MapBank
    proxy: ProxyCosts
    costs: Costs  # what judges a change against a budget: the task's accuracy, or the proxy's loss
    # the examples' own lengths, whose valid pairs the FLOPs count: the task's held-out examples (both
    # halves), or the corpus blocks (n tokens each) without a task
    lengths: np.ndarray
    pairs: np.ndarray  # (layer, n, n): the (query, key) pairs each layer computes at width n, which the FLOPs count
    timings: Timings | None = None  # with cost "seconds": each choice's measured seconds per head

    @property
    def model(self) -> LoadedModel:
        return self.experiment.model

    def flops(self, layer: int, choice: Choice) -> float:
        """FLOPs of one head of ``layer`` under ``choice`` on the pairs it computes of the examples judged (no padding)."""
        return flops_on(choice, self.pairs[layer], self.lengths, self.model.head_dim, causal=self.model.causal)

    def padded_flops(self, layer: int, choice: Choice) -> float:
        """FLOPs of one head of ``layer`` under ``choice`` at width n, padding included."""
        return flops(choice, self.pairs[layer], self.model.head_dim, causal=self.model.causal)

    def price(self, layer: int, choice: Choice) -> float:
        """What a head of ``layer`` under ``choice`` spends: its FLOPs, or its measured seconds per call."""
        return self.flops(layer, choice) if self.timings is None else self.timings.price(layer, choice)

    def spent(self, assignment: Assignment, price: Price | None = None) -> float:
        """What an assignment spends by ``price`` (default the plan's), summed over heads."""
        price = price or self.price
        return sum(price(layer, assignment.get((layer, head), EXACT)) for layer, head in self.units)

    def total(self, assignment: Assignment, price: Price | None = None) -> float:
        """What an assignment spends, as a share of every head exact."""
        return self.spent(assignment, price) / self.spent({}, price)

    def shares(self, assignment: Assignment) -> dict[str, float | bool]:
        """For tables: the FLOPs share on the examples' valid pairs and at width n (padding counted),
        whether the assignment changes any valid pair of them at all, and with cost "seconds" the
        predicted seconds share (timed at width n)."""
        shares = {
            "flops_ratio": self.total(assignment, self.flops),
            "flops_ratio_padded": self.total(assignment, self.padded_flops),
            "changes_nothing": not any(
                changes_pairs(choice, self.pairs[layer], self.lengths, causal=self.model.causal)
                for (layer, _), choice in assignment.items()
            ),
        }
        return shares if self.timings is None else {**shares, "seconds_ratio": self.total(assignment)}

    def change(self, assignment: Assignment) -> Change:
        plans = layer_plans(assignment, self.bank, self.s.seq_len, self.model.causal)
        return plan_change(plans, assignment_key(assignment))


def plan(
    source: str | LoadedModel = "minilm-l6",
    settings: PlanSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> PlanResult:
    """Plan, per head, the cheapest attention that meets each budget of ``settings``
    (:class:`PlanSettings`, with keyword ``changes``); see the module docstring."""
    s = PlanSettings.build(settings, **changes)
    s.budgets  # noqa: B018 -- no budget is bad input, before any model loads
    maps_progress, curves_progress, plans_progress = split(progress, 1, 4, 2)
    planner = _planner(source, s, device, maps_progress)
    for budget in s.budgets:  # before the curves: a budget no plan can meet is bad input, found early
        _check_meetable(planner.costs, budget)
    curves = _curves(planner, curves_progress)
    path = greedy_path(curves)
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    summaries: list[dict] = []  # per budget: its methods judged, its choices and its probes, as records
    chosen: list[dict] = []
    probes: list[dict] = []
    with progress_bar(total=len(s.budgets), desc="plans", unit="budget", enabled=plans_progress) as bar:
        for number, budget in enumerate(s.budgets):
            judged, choices, probed = _plan_budget(planner, path, uniforms, budget, seeded(s.seed, RANDOM_STREAM, number))
            summaries, chosen, probes = summaries + judged, chosen + choices, probes + probed
            bar.update(1)
    return _result(planner, curves, path, pd.DataFrame(summaries), pd.DataFrame(chosen), pd.DataFrame(probes), command)


def _curves(planner: _Planner, progress: Progress) -> pd.DataFrame:
    """Each head's cost under each choice: screened at once, or measured head by head, a forward each."""
    if planner.s.screened:
        assert isinstance(planner.costs, TaskCosts)  # the settings refuse a screen without an accuracy budget
        changes = [planner.change(uniform(planner.units, choice)) for choice in planner.choices]
        alternatives = lambda view: [change.intervention(view) for change in changes]  # noqa: E731
        task = planner.costs
        return screen_curves(planner.units, planner.choices, task.task, task.curve.inputs, alternatives, planner.price, progress)
    return head_curves(
        planner.units,
        planner.choices,
        planner.change,
        lambda change: planner.costs.per_unit(change, "curve"),
        planner.price,
        progress,
    )


def _plan_budget(
    planner: _Planner, path: list[dict], uniforms: dict[Choice, Assignment], budget: Budget, seed: int
) -> tuple[list[dict], list[dict], list[dict]]:
    """One budget: the cheapest candidate that meets it on the selection data (the verified step of
    the path, or one choice for every head), its methods judged, its choices and its probes, as records."""
    step, predicted, probed = _verified_step(planner, path, budget)
    cheapest = _cheapest_uniforms(planner, uniforms, budget)
    candidates = [(planner.total(at_step(path, step)), Method(f"step {step} of the path", Form.STEP), at_step(path, step))]
    candidates += [
        (planner.total(a), Method(f"uniform {m.choice}", Form.UNIFORM, m.choice), a) for m, a in cheapest.values() if a
    ]
    _, picked, assignment = min(candidates, key=lambda item: item[0])  # the path's step on a tie
    rival = random_allocation(planner.units, planner.choices, planner.price, planner.spent(assignment), seed)
    judged = _judged_methods(planner, budget, (picked, assignment), uniforms, cheapest, rival, predicted)
    judged[0]["path_step"] = step if picked.form is Form.STEP else None  # the plan's row: its step, where it is one
    choices = [
        {"budget": budget.value, "layer": layer, "head": head, "choice": str(assignment.get((layer, head), EXACT))}
        for layer, head in planner.units
    ]
    return judged, choices, [{"budget": budget.value, **probe} for probe in probed]


def _cheapest_uniforms(
    planner: _Planner, uniforms: dict[Choice, Assignment], budget: Budget
) -> dict[str, tuple[Method, Assignment]]:
    """Per kind, the cheapest uniform plan (one choice for every head) that meets ``budget`` on the
    selection data; none meeting, exact attention ("none meets: exact", no assignment)."""
    cheapest = {}
    for kind in ("partial", "window"):
        mine = sorted((planner.total(a), str(choice), a) for choice, a in uniforms.items() if choice.kind == kind)
        meeting = next((item for item in mine if planner.costs.judged(planner.change(item[2]), "select", budget)["meets"]), None)
        cheapest[kind] = (Method(meeting[1], Form.UNIFORM, meeting[1]), meeting[2]) if meeting else (NONE_MEETS, {})
    return cheapest


def _planner(source: str | LoadedModel, s: PlanSettings, device: str, progress: Progress) -> _Planner:
    """The experiment (its training blocks divided into fit, curve and selection blocks, and the
    held-out blocks), the choices, the maps and the judges."""
    experiment = Experiment.start(  # an accuracy budget's task is prepared (and so checked) before the first forward pass
        source, s, classes=s.classes, objective=s.objective, num_eval=s.eval_seqs, num_train=s.fit_seqs + s.curve_seqs + s.select_seqs, device=device,
        task=s.task if s.max_drop is not None else None, task_pad_to=s.seq_len, precision=s.precision,
    )  # fmt: skip
    # num_train above is at least 5 (the settings' minimums): Experiment.start gives training blocks
    assert experiment.train is not None, "a plan asks for fit, curve and selection blocks"
    fit, curve, select = _divided(experiment.train, (s.fit_seqs, s.curve_seqs), s.seed)
    model = experiment.model
    s.check_geometry(model.num_layers, model.num_heads, model.causal)
    by_layer = model_pairs(model, s.seq_len)
    pairs = np.stack([by_layer[layer] for layer in range(model.num_layers)])
    choices, timings = _choices(model, pairs, s, device)
    fitter = None
    if any(choice.kind == "partial" for choice in choices):
        rows = ModelRows(model, fit)
        queries = list(range(s.seq_len)) if model.causal else None
        moments = compute_moments(rows, queries=queries, batch_size=s.batch_size, seed=s.seed, progress=progress).total
        fitter = MapFitter(moments, ridge=MAP_RIDGE, seed=s.seed, global_positions=(0,), most_keys=max(s.ks))
    proxy = ProxyCosts(experiment, curve, select, s.batch_size, s.bootstrap, s.seed)
    costs: Costs = proxy
    if s.max_drop is not None:
        costs = TaskCosts(experiment, s.task, _choosing_half(s), s.curve_seqs, s.batch_size, s.seed)
    units = [(layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
    lengths = costs.task.held_out.lengths if isinstance(costs, TaskCosts) else np.array([s.seq_len])
    return _Planner(experiment, s, fit, curve, select, units, choices, MapBank(fitter), proxy, costs, lengths, pairs, timings)


def _choices(model: LoadedModel, pairs: np.ndarray, s: PlanSettings, device: str) -> tuple[list[Choice], Timings | None]:
    """The choices cheaper than exact attention in some layer, in FLOPs on the pairs the layers compute, and
    with cost "seconds" also in measured seconds (with the timing table)."""
    choices = options(pairs, model.head_dim, s.ks, s.widths, causal=model.causal)
    if not choices:
        raise BadInput(f"no choice of `ks` or `widths` costs less than exact attention at n = {s.seq_len}; offer smaller ones")
    if s.cost == "flops":
        return choices, None
    timings = measure(Geometry.of(model), s.seq_len, choices, device=device)
    layers = range(model.num_layers)
    faster = [c for c in choices if any(timings.price(layer, c) < timings.price(layer, EXACT) for layer in layers)]
    if not faster:
        raise BadInput(
            f"no choice of `ks` or `widths` runs faster than exact attention (sdpa) at n = {s.seq_len} on this machine "
            f"({1e6 * timings.price(0, EXACT):.3g} µs a head); plan with --cost flops, narrower windows or a longer --seq-len"
        )
    return faster, timings


def _divided(blocks: Blocks, sizes: tuple[int, ...], seed: int) -> tuple[Blocks, ...]:
    """``blocks`` in disjoint parts, one of each of ``sizes`` and the rest, chosen by ``seed``, each in corpus order."""
    order = np.random.default_rng([seed, FIT_STREAM]).permutation(len(blocks))
    parts = np.split(order, np.cumsum(sizes))
    return tuple(
        Blocks(ids=blocks.ids[index], index=blocks.index[index], available=blocks.available) for index in map(np.sort, parts)
    )


def _choosing_half(s: PlanSettings) -> int:
    """How many of the task's held-out examples choose the plan: the first half."""
    return int(s.task.task_eval) // 2


def _check_meetable(costs: Costs, budget: Budget) -> None:
    allowance = budget.allowance(costs)
    if allowance <= 0:
        raise BadInput(
            f"the budget {budget} cannot be met even with every head exact: the unmodified model's loss on the selection "
            f"blocks is {costs.unmodified_loss('select'):.4g}; give `max_loss` above it"
        )


def _verified_step(planner: _Planner, path: list[dict], budget: Budget) -> tuple[int, int, list[dict]]:
    """The last step of the path whose plan meets ``budget`` on the selection data, found by a
    binary search that starts where the per-head costs' sum predicts; the step it started from,
    and every step it ran on the model."""
    allowance = budget.allowance(planner.costs)
    added = np.cumsum([0.0] + [segment["added"] for segment in path])
    # The curves predict a loss budget's step (same units); an accuracy budget's (divergence curves) starts halfway.
    predicted = int(np.flatnonzero(added <= allowance).max()) if planner.costs is planner.proxy else len(path) // 2
    probed: list[dict] = []

    def meets(step: int) -> bool:
        assignment = at_step(path, step)
        verdict = planner.costs.judged(planner.change(assignment), "select", budget)
        probed.append({"step": step, **planner.shares(assignment), "summed_proxy_cost": added[step], **verdict})
        return bool(verdict["meets"])

    low, high = 0, len(path)  # step 0 (every head exact) costs nothing: it always meets
    if meets(predicted):
        low = predicted
    else:
        high = predicted - 1
    while low < high:  # assumes the cost grows along the path; every probe is recorded
        middle = (low + high + 1) // 2
        low, high = (middle, high) if meets(middle) else (low, middle - 1)
    return low, predicted, probed


def _judged_methods(
    planner: _Planner,
    budget: Budget,
    plan: tuple[Method, Assignment],
    uniforms: dict,
    cheapest: dict[str, tuple[Method, Assignment]],
    rival: Assignment,
    predicted: int,
) -> list[dict]:
    """The plan; for each kind, the cheapest uniform plan that meets the budget on the selection data
    and the uniform plan at the plan's FLOPs (the cheapest that spends at least as much); the random
    allocation; each judged on the held-out check and paired with the plan."""
    judge, (picked, assignment) = planner.costs, plan
    spent = planner.total(assignment)
    methods = {"plan": (picked, assignment)}
    for kind, best in cheapest.items():
        methods[f"uniform {kind}"] = best
        mine = sorted((planner.total(a), str(choice), a) for choice, a in uniforms.items() if choice.kind == kind)
        if mine:
            _, name, matched = next((item for item in mine if item[0] >= spent), mine[-1])
            methods[f"uniform {kind} at plan FLOPs"] = (Method(name, Form.UNIFORM, name), matched)
    methods["random"] = (Method("at plan FLOPs", Form.RANDOM), rival)
    plan_costs = judge.per_unit(planner.change(assignment), "check")
    records = []
    for method, (picked, chosen) in methods.items():
        change = planner.change(chosen)
        selected = judge.judged(change, "select", budget)
        checked = judge.judged(change, "check", budget)
        difference = judge.interval(plan_costs - judge.per_unit(change, "check"))
        records.append(
            {
                "budget": budget.value,
                "budget_kind": budget.kind,
                "method": method,
                "detail": picked.detail,
                "form": picked.form.value,
                "choice": picked.choice,
                **planner.shares(chosen),
                **{f"select_{name}": value for name, value in selected.items()},
                **{f"check_{name}": value for name, value in checked.items()},
                "plan_minus": difference[0],
                "plan_minus_low": difference[1],
                "plan_minus_high": difference[2],
                "predicted_step": predicted if method == "plan" else None,
            }
        )
    return records


def _result(
    planner: _Planner,
    curves: pd.DataFrame,
    path: list[dict],
    summary: pd.DataFrame,
    chosen: pd.DataFrame,
    probes: pd.DataFrame,
    command,
) -> PlanResult:
    s = planner.s
    picked = [(int(row.layer), int(row.head), parse(row.choice)) for row in chosen.itertuples()]
    used = {(layer, head, choice.size) for layer, head, choice in picked if choice.kind == "partial"}
    map_rows, arrays = saved_maps(planner.bank, used)
    if isinstance(planner.costs, TaskCosts):  # every judged plan's per-example outcomes, to re-pair any two
        arrays = {**arrays, **planner.costs.task.outcome_arrays()}
    meta = planner.experiment.metadata(
        s,
        command,
        settings={
            "budgets": [str(budget) for budget in s.budgets],
            "choices": [str(choice) for choice in planner.choices],
            # one head of every layer under each choice (layers differ: causal triangles, windows), for the shares
            "head_flops": {
                str(choice): sum(planner.flops(layer, choice) for layer in range(planner.model.num_layers))
                for choice in [EXACT, *planner.choices]
            },
            "timings": planner.timings.describe() if planner.timings is not None else None,
            "evaluations": planner.costs.evaluations + (planner.proxy.evaluations if planner.costs is not planner.proxy else 0),
            "units": {part: planner.costs.units(part) for part in ("select", "check")},
            "fit_block_index": planner.fit.index.tolist(),
            "curve_block_index": planner.curve.index.tolist(),
            "curve_cost": "task" if isinstance(planner.costs, TaskCosts) else "proxy",
            "select_block_index": planner.select.index.tolist(),
        },
        task=planner.costs.task.describe() if isinstance(planner.costs, TaskCosts) else None,
    )
    tables = {"summary": summary, "choices": chosen, "curves": curves, "path": pd.DataFrame(path), "probes": probes}
    if map_rows:
        tables["maps"] = pd.DataFrame(map_rows)
    return PlanResult(meta, tables, arrays)
