"""attnlens.plan: the greedy path against brute force, the plan's verdicts recomputed through the
partial attention function, disjoint data, save/reload/apply, and bad input."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens import BadInput, load_result
from attnlens.analysis.objectives import Objective
from attnlens.analysis.plan.allocate import at_step, greedy_path, random_allocation
from attnlens.analysis.plan.choices import EXACT, Choice, flops
from attnlens.analysis.plan.judging import Costs, TaskCosts
from tiny_models import assert_one_line_error, run_cli

N = 16
SETTINGS = dict(seq_len=N, fit_seqs=24, curve_seqs=8, select_seqs=8, eval_seqs=8, ks=[2, 4], widths=[1, 4], batch_size=8)


@pytest.fixture(scope="module")
def planned_l3(minilm_l3, tmp_path_factory):
    result = attnlens.plan(minilm_l3, max_loss=[0.02, 0.05], progress=False, **SETTINGS)
    path = tmp_path_factory.mktemp("plan") / "plan"
    result.save(path)
    return result, path


def test_a_plan_draws_its_figures(planned_l3, tmp_path):
    result, _ = planned_l3
    saved = {path.name for path in result.save_figures(tmp_path)}
    assert {"flops_by_budget.png", "choices_0_02.png", "choices_0_05.png"} <= saved


# ---------------------------------------------------------------------------- allocation (unit)


def _lower_hull(points: np.ndarray) -> list[tuple[float, float]]:
    """Lower convex hull of (flops, cost) points, by Andrew's monotone chain (independent of the code)."""
    hull: list[tuple[float, float]] = []
    for x, y in sorted(map(tuple, points)):
        while (
            len(hull) >= 2
            and (hull[-1][0] - hull[-2][0]) * (y - hull[-2][1]) - (hull[-1][1] - hull[-2][1]) * (x - hull[-2][0]) <= 0
        ):
            hull.pop()
        hull.append((x, y))
    return hull


def test_the_greedy_path_runs_along_the_lower_hull_of_every_allocation():
    """Additive costs: each step of the path is on the lower convex hull of (FLOPs, cost) over all
    4³ assignments of three heads, found by brute force."""
    rng = np.random.default_rng(3)
    names = ["partial(2)", "partial(4)", "window(1)"]
    for _ in range(20):
        curves = pd.DataFrame(
            [
                {"layer": 0, "head": h, "choice": c, "saved": float(rng.uniform(5, 95)), "cost": float(rng.uniform(0, 1))}
                for h in range(3)
                for c in names
            ]
        )
        table = {(r.head, r.choice): (100.0 - r.saved, r.cost) for r in curves.itertuples()}
        table.update({(h, "exact"): (100.0, 0.0) for h in range(3)})
        every = np.array(
            [
                [sum(table[h, c][i] for h, c in enumerate(combo)) for i in (0, 1)]
                for combo in itertools.product(["exact", *names], repeat=3)
            ]
        )
        hull = _lower_hull(every)
        path = greedy_path(curves)
        for step in range(len(path) + 1):
            chosen = at_step(path, step)
            point = [sum(table[h, str(chosen.get((0, h), EXACT))][i] for h in range(3)) for i in (0, 1)]
            below = np.interp(point[0], [x for x, _ in hull], [y for _, y in hull])
            assert point[1] <= below + 1e-9


def test_random_allocations_spend_at_most_the_target_and_repeat_with_their_seed():
    units = [(layer, head) for layer in range(2) for head in range(4)]
    choices = [Choice("partial", 2), Choice("window", 1)]
    cost = lambda layer, choice: {"exact": 10.0, "partial": 6.0, "window": 1.0}[choice.kind] * (1 + layer)  # noqa: E731
    first = random_allocation(units, choices, cost, target=50.0, seed=4)
    assert sum(cost(layer, c) for (layer, _), c in first.items()) <= 50.0
    assert first == random_allocation(units, choices, cost, target=50.0, seed=4)
    assert first != random_allocation(units, choices, cost, target=50.0, seed=5)


# ---------------------------------------------------------------------------- plans (integration)


def test_the_plan_meets_its_budgets_and_the_check_is_what_the_partial_path_computes(planned_l3, minilm_l3):
    """Each budget's plan met it on the selection blocks (with the margin) and no probed cheaper step
    did; its held-out cost, recomputed by running the model under the plan through the partial
    attention function on the held-out blocks, is the cost the result reports."""
    result, _ = planned_l3
    probes = result.tables["probes"]
    blocks = attnlens.load_corpus("kjv").blocks(minilm_l3, N, num_blocks=None)
    held_out = blocks.ids[np.searchsorted(blocks.index, result.meta["corpus"]["eval_block_index"])]
    objective = Objective(minilm_l3, "hidden")
    batch = objective.prepare(torch.from_numpy(held_out))
    for row in result.methods.query("method == 'plan'").itertuples():
        mine = probes.query("budget == @row.budget")
        assert row.form == "step"
        step = int(row.path_step)
        chosen = mine[mine.step == step]
        assert chosen.meets.all() and not mine[mine.step > step].meets.any()
        assert row.select_meets
        with torch.no_grad(), result.apply(minilm_l3, row.budget):
            loss = objective.evaluate(batch)["loss"].double().numpy()
        assert loss.mean() == pytest.approx(row.check_cost, abs=1e-5)
    assert (result.methods.query("method == 'plan'").flops_ratio < 1).all()


def test_maps_curves_choice_and_check_use_disjoint_blocks(planned_l3):
    result, _ = planned_l3
    parts = {name: set(result.settings[f"{name}_block_index"]) for name in ("fit", "curve", "select")}
    parts["check"] = set(result.meta["corpus"]["eval_block_index"])
    assert {name: len(blocks) for name, blocks in parts.items()} == {"fit": 24, "curve": 8, "select": 8, "check": 8}
    assert len(set().union(*parts.values())) == 48


def test_a_plan_saves_reloads_and_applies_to_its_model(planned_l3, minilm_l3, minilm_l6):
    result, path = planned_l3
    again = load_result(path)
    ids = torch.from_numpy(attnlens.load_corpus("kjv").blocks(minilm_l3, N, 2, 9).ids)
    budget = result.budgets[-1]
    with torch.no_grad():
        with result.apply(minilm_l3, budget):
            first = minilm_l3.forward(ids)[0]
        with again.apply(minilm_l3, budget):
            second = minilm_l3.forward(ids)[0]
        exact = minilm_l3.forward(ids)[0]
    assert torch.equal(first, second) and not torch.equal(first, exact)
    with pytest.raises(BadInput, match="num_layers 3"):
        with again.apply(minilm_l6, budget):
            pass


def test_a_plan_saved_by_an_earlier_version_reads_its_methods_forms_from_their_labels(planned_l3, tmp_path):
    """Earlier versions wrote what each method is only in its ``detail`` label: such a result loads with the
    same ``form`` and ``choice`` as one saved now (each label also names its form as a reader reads it)."""
    import json
    import shutil

    _, path = planned_l3
    old = tmp_path / "old"
    shutil.copytree(path, old)
    summary = pd.read_csv(old / "summary.csv")
    summary.drop(columns=["form", "choice"]).to_csv(old / "summary.csv", index=False)
    assert "form" not in pd.read_csv(old / "summary.csv") and json.loads((old / "result.json").read_text())["kind"] == "plan"
    now, then = (load_result(where).tables["summary"] for where in (path, old))
    pd.testing.assert_frame_equal(now[["method", "detail", "form", "choice"]], then[["method", "detail", "form", "choice"]])
    for row in now.itertuples():  # the label a reader sees says the same as the form
        expected = {"step": "step ", "exact": "none meets", "random": "at plan FLOPs"}.get(row.form)
        assert str(row.detail).startswith(expected) if expected else str(row.detail).endswith(str(row.choice))


@pytest.mark.integration
def test_task_halves_are_disjoint(minilm_l3):
    """The task's held-out examples: the first half chooses, the second checks, no example in both."""
    from attnlens.analysis.experiment import Experiment
    from attnlens.analysis.plan import PlanSettings

    s = PlanSettings.build(seq_len=32, task="rotten-tomatoes", task_train=64, task_eval=40, max_drop=(50.0,))
    experiment = Experiment.start(minilm_l3, s, num_eval=2)
    costs = TaskCosts(experiment, s.task, 20, 8, batch_size=16, seed=0)
    select, check = costs.parts["select"], costs.parts["check"]
    assert costs.units("select") == 20 and costs.units("check") == 20 and costs.units("curve") == 8
    positions = np.arange(len(costs.baseline))
    assert not set(positions[select]) & set(positions[check])
    curve_rows = {int(row) for batch in costs.curve.inputs for row in costs.task.train.rows[batch.rows]}
    assert len(curve_rows) == 8 and not curve_rows & set(costs.task.held_out.rows.tolist())


def test_the_early_miss_stops_clear_misses_at_the_first_look_and_almost_never_one_at_the_allowance():
    """The selection's early look, simulated on paired outcomes (each example lost, gained or kept): a change
    that loses 25 points stops at the first look nearly always; one whose true cost is the allowance
    (1 point net, 10% of examples changed) stops at any look at most 0.4% of the time (3 looks at z = 3)."""
    from attnlens.analysis.plan.judging import EARLY_LOOKS, clearly_misses

    rng = np.random.default_rng(0)

    def stops(lost: float, gained: float, reps: int = 4000) -> np.ndarray:
        drawn = rng.random((reps, EARLY_LOOKS[-1]))
        values = (drawn < lost).astype(float) - ((drawn >= lost) & (drawn < lost + gained))
        return np.array([[clearly_misses(row[:look], 0.01) for look in EARLY_LOOKS] for row in values])

    clear = stops(0.25, 0.0)
    assert clear[:, 0].mean() > 0.99
    at_allowance = stops(0.055, 0.045).any(axis=1).mean()
    assert at_allowance <= 0.004 + 3 * np.sqrt(0.004 / 4000)


@pytest.mark.integration
def test_the_selections_early_looks_are_prefixes_of_the_whole_and_exact_runs_nothing(minilm_l3):
    """A selection verdict stops early only where its prefix clearly misses (else it is seen whole); the
    early looks' costs are the whole half's first examples as the judge computes them at once; a plan
    with every head exact costs nothing and runs no forward pass."""
    from attnlens.analysis.experiment import Experiment
    from attnlens.analysis.plan import PlanSettings
    from attnlens.analysis.plan.assemble import EXACT_KEY, layer_plans, plan_change
    from attnlens.analysis.plan.judging import EARLY_LOOKS, Budget, clearly_misses

    s = PlanSettings.build(
        seq_len=32, task="rotten-tomatoes", task_train=64, task_eval=420, max_drop=(1.0,), forecastable_only=False
    )
    experiment = Experiment.start(minilm_l3, s, num_eval=2)
    costs = TaskCosts(experiment, s.task, 210, 8, batch_size=32, seed=0)
    budget = Budget("accuracy", 1.0)
    narrow = {(layer, head): Choice("window", 1) for layer in range(3) for head in range(12)}
    change = plan_change(layer_plans(narrow, None, 32, False), "narrow")
    verdict = costs.judged(change, "select", budget)
    whole = costs.baseline - costs.task.judge(change)["correct"]  # every held-out example, by the judge itself
    first = whole[: EARLY_LOOKS[0]]
    assert np.abs(whole).sum() > 0, "the change flips examples: the prefixes can differ"
    assert verdict["examples"] == (EARLY_LOOKS[0] if clearly_misses(first, 0.01) else 210)
    assert np.array_equal(costs.per_unit(change, "select"), whole[:210])
    exact = costs.judged(plan_change({}, EXACT_KEY), "select", budget)
    assert exact["examples"] == 210 and exact["cost"] == 0 and EXACT_KEY not in costs.task.outcome_arrays()["task_changes"]


@pytest.mark.integration
def test_a_task_budgets_curves_are_the_divergence_of_the_classifiers_predictions(minilm_l3):
    """One head's curve under a task budget: per curve example, KL(unmodified prediction ‖ changed
    prediction) of the probe, as the plan measures it (from the changed layer on, batches padded to n),
    against scipy's divergence of the probabilities computed by hand from full forwards of every example
    alone; never negative, where the cross-entropy against the labels it replaced moved both ways."""
    from scipy.stats import entropy

    from attnlens.analysis.plan import PlanSettings, _planner
    from attnlens.analysis.task.batching import batches

    s = PlanSettings.build(seq_len=32, task="rotten-tomatoes", task_train=64, task_eval=40, max_drop=(50.0,), fit_seqs=4,
                     curve_seqs=6, ks=(), widths=(2,), forecastable_only=False)  # fmt: skip
    planner = _planner(minilm_l3, s, "cpu", False)
    judge = planner.costs.task
    change = planner.change({(2, 1): Choice("window", 2)})
    measured = planner.costs.per_unit(change, "curve")
    by_hand, labelled = [], []
    for row in range(6):
        one = judge.train.take(slice(row, row + 1))
        (batch,) = batches(one, 1, "cpu")
        with torch.no_grad():
            unmodified, loss = torch.softmax(judge.logits(batch), 1)[0].numpy(), judge.loss(batch)
            with attnlens.Capture(layers=change.layers, intervene=change.intervention(batch.view(minilm_l3)), record=False):
                changed, changed_loss = torch.softmax(judge.logits(batch), 1)[0].numpy(), judge.loss(batch)
        by_hand.append(entropy(unmodified, changed))
        labelled.append(float(changed_loss - loss))
    order = np.concatenate([batch.rows for batch in planner.costs.curve.inputs])
    assert np.abs(measured - np.array(by_hand)[order]).max() < 1e-6
    assert measured.min() >= -1e-9 and measured.max() > 1e-4, "the change moves predictions: the comparison can fail"
    assert min(labelled) < 0 < max(labelled), "against the labels, the same change lowered some examples' loss"


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "phrases"),
    [
        (["--max-loss", "0"], "must be greater than 0"),
        (["--max-drop", "-1", "--task", "rotten-tomatoes"], "must be greater than 0"),
        ([], "give a budget"),
        (["--max-loss", "0.1", "--ks", "40", "--seq-len", "32"], "--ks 40 is larger than n = 32"),
        (["--max-drop", "1"], "name a task"),
        (
            ["--max-drop", "1,2", "--task", "rotten-tomatoes", "--task-eval", "512"],
            ("cannot be forecast on 256 + 256", "at least 1,148"),
        ),
    ],
)
def test_bad_plans_get_one_line(argv, phrases, capsys, tmp_path):
    code, _, err = run_cli(capsys, "plan", *argv, "--out", str(tmp_path / "p"))
    assert_one_line_error(code, err, *([phrases] if isinstance(phrases, str) else phrases))
    assert not (tmp_path / "p").exists()


def test_an_accuracy_budget_needs_the_examples_that_can_forecast_it():
    """One lost example among n/2, forecast by hand (mean 1/s, sd √(1/s), the one-sided t quantile of both
    means' noise at the rule's 97.5% and the check's own half-width): the needed task_eval is the smallest n, by brute force,
    whose forecast fits the budget; a budget refused below it is planned from it (no model is loaded)."""
    from scipy import stats

    from attnlens.analysis.plan import PlanSettings

    def by_hand(n: int) -> float:
        s, c = n // 2, n - n // 2
        sd = np.sqrt(1 / s)  # the sample sd of one 1 among s values: √(s·(1/s)(1 − 1/s)/(s − 1)) = √(1/s)
        return 1 / s + stats.t.ppf(0.975, s - 1) * sd * np.sqrt(1 / s + 1 / c) + 1.959964 * sd / np.sqrt(c)

    for points in (0.5, 1.0, 2.0, 5.0):
        needed = next(n for n in range(8, 10_000) if by_hand(n) <= points / 100)
        with pytest.raises(BadInput, match=f"at least {needed:,}"):
            PlanSettings.build(max_drop=(points,), task="rotten-tomatoes", task_eval=needed - 1)
        PlanSettings.build(max_drop=(points,), task="rotten-tomatoes", task_eval=needed)
        PlanSettings.build(max_drop=(points,), task="rotten-tomatoes", task_eval=needed - 1, forecastable_only=False)


def test_a_budget_below_the_unmodified_loss_cannot_be_met(gemma3, capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "plan", "--model", "gemma3-270m", "--max-loss", "0.5", "--ks", "none", "--widths", "2",
        "--seq-len", "8", "--fit-seqs", "2", "--curve-seqs", "2", "--select-seqs", "2", "--eval-seqs", "2", "--out", str(tmp_path / "p"), "--no-progress",
    )  # fmt: skip
    assert_one_line_error(code, err, "cannot be met even with every head exact")


class _Drawn(Costs):
    """Per-unit costs of an assignment: its heads' costs summed, times an interaction, plus noise
    drawn from the assignment itself (so the same change on the same part always costs the same)."""

    def __init__(self, table: dict, interaction: float) -> None:
        super().__init__()
        self.table, self.interaction, self.bootstrap = table, interaction, 200

    def _compute(self, change, part: str) -> np.ndarray:
        assignment = dict(change.key)
        mean = sum(self.table.get((unit, str(choice)), 0.0) for unit, choice in assignment.items()) * self.interaction
        rng = np.random.default_rng(
            list(zlib.crc32(repr((change.key, part)).encode()).to_bytes(4, "little"))
        )  # not hash(): salted per process
        return mean + rng.normal(0, 0.002, size=32)

    def unmodified_loss(self, part: str) -> float:
        return 0.0

    def units(self, part: str) -> int:
        return 32


@pytest.mark.parametrize("cost", ["flops", "seconds"])
def test_the_plan_never_costs_more_than_a_uniform_plan_that_meets_on_the_selection_data(cost):
    """Random per-head curves that mislead (each off from the judge's own cost by a random factor, as the
    proxy's curves are for a task), costs that interact (the sum off by up to 2×): whatever the path reaches,
    the plan returned meets the budget on the selection data and costs no more than any uniform plan (one
    choice for every head) that meets there, in the plan's own price: FLOPs, or seconds from a timing table
    drawn at random (not in the FLOPs' order, as measured times are not)."""
    from types import SimpleNamespace

    from attnlens.analysis.plan import _plan_budget, _Planner
    from attnlens.analysis.plan.allocate import uniform
    from attnlens.analysis.plan.choices import options
    from attnlens.analysis.plan.judging import Budget

    n, head_dim, rng = 64, 32, np.random.default_rng(11)
    every = np.ones((3, n, n), dtype=bool)
    choices = options(every, head_dim, [8, 16, 32], [8, 16, 32], causal=False)
    units = [(layer, head) for layer in range(3) for head in range(4)]
    flops_of = lambda choice: flops(choice, every[0], head_dim, causal=False)  # noqa: E731
    chose_uniform, TRIALS = 0, 60
    for trial in range(TRIALS):
        seconds = {c: float(rng.uniform(0.1, 0.95)) for c in choices} | {EXACT: 1.0}
        timings = SimpleNamespace(price=lambda layer, c: seconds[c] * (1 + layer)) if cost == "seconds" else None
        price_of = (lambda layer, c: flops_of(c)) if timings is None else (lambda layer, c: seconds[c] * (1 + layer))
        scale = rng.uniform(0.001, 0.02, size=len(units))  # some heads cheap to change, some dear
        table = {
            (unit, str(c)): float(scale[i] * (1 - flops_of(c) / flops_of(EXACT)) ** rng.uniform(0.5, 3))
            for i, unit in enumerate(units)
            for c in choices
        }
        judge = _Drawn(table, interaction=rng.uniform(0.5, 2.0))
        planner = SimpleNamespace(units=units, choices=choices, flops=lambda layer, c: flops_of(c), padded_flops=lambda layer, c: flops_of(c),
                                  lengths=np.array([n]), pairs=every, model=SimpleNamespace(causal=False), costs=judge, proxy=judge,
                                  timings=timings)  # fmt: skip
        planner.price = lambda layer, c, p=planner: _Planner.price(p, layer, c)
        planner.spent = lambda a, price=None, p=planner: _Planner.spent(p, a, price)
        planner.total = lambda a, price=None, p=planner: _Planner.total(p, a, price)
        planner.shares = lambda a, p=planner: _Planner.shares(p, a)
        planner.change = lambda a: SimpleNamespace(key=tuple(sorted(a.items(), key=lambda item: item[0])))
        curves = pd.DataFrame(
            [
                {
                    "layer": u[0],
                    "head": u[1],
                    "choice": str(c),
                    "saved": price_of(u[0], EXACT) - price_of(u[0], c),
                    "cost": table[u, str(c)] * rng.lognormal(0, 2),
                }
                for u in units
                for c in choices
            ]
        )
        path = greedy_path(curves)
        uniforms = {choice: uniform(units, choice) for choice in choices}
        budget = Budget("loss", float(rng.uniform(0.01, 0.08)))
        judged, _, _ = _plan_budget(planner, path, uniforms, budget, seed=trial)
        methods = pd.DataFrame(judged).set_index("method")
        plan = methods.loc["plan"]
        assert plan.select_meets, trial
        meeting = [planner.total(a) for a in uniforms.values() if judge.judged(planner.change(a), "select", budget)["meets"]]
        spent = plan[f"{cost}_ratio"]
        assert all(spent <= ratio + 1e-12 for ratio in meeting), (trial, spent, meeting)
        chose_uniform += plan.form == "uniform"
    assert 0 < chose_uniform < TRIALS, "both kinds of candidate won somewhere: the test exercises the choice"


@pytest.fixture(scope="module")
def short_texts(tmp_path_factory):
    """Rotten Tomatoes sentences of at most 16 words (both labels): a task whose texts all fit a window of 40."""
    from attnlens.data.tasks import load_task

    task = load_task("rotten-tomatoes")
    rows = [row for row in np.random.default_rng(5).permutation(len(task)) if len(task.texts[row].split()) <= 16][:160]
    path = tmp_path_factory.mktemp("short") / "short.csv"
    pd.DataFrame({"text": [task.texts[row] for row in rows], "label": task.labels[rows]}).to_csv(path, index=False)
    return path


@pytest.mark.integration
def test_a_window_wider_than_every_text_saves_nothing_and_says_so(minilm_l3, short_texts):
    """Costs are counted on the valid pairs of the examples judged: a window wider than every text keeps
    them all (no saving, "changes nothing on this task"), though padded to n it would look like one; the
    FLOPs of a narrow window are checked against pairs counted one by one."""
    from attnlens.analysis.plan import PlanSettings, _planner, plan
    from attnlens.report.plan import plan_claims
    from attnlens.report.verdicts import Context, Phrase

    s = PlanSettings.build(seq_len=64, task=str(short_texts), task_train=64, task_eval=60, max_drop=(50.0,), fit_seqs=4,
                     curve_seqs=6, ks=(), widths=(40,), forecastable_only=False)  # fmt: skip
    planner = _planner(minilm_l3, s, "cpu", False)
    lengths = planner.lengths
    assert len(lengths) == 60 and lengths.max() <= 41, "every text fits the window"
    everywhere = {unit: Choice("window", 40) for unit in planner.units}
    shares = planner.shares(everywhere)
    assert shares["flops_ratio"] == 1.0 and shares["changes_nothing"] and shares["flops_ratio_padded"] < 0.9

    d, one = minilm_l3.head_dim, {(0, 0): Choice("window", 4)}
    full = [4 * n * n * d + 3 * n * n for n in lengths]
    kept = [sum(abs(i - j) <= 4 for i in range(n) for j in range(n)) / (n * n) for n in lengths]
    heads = len(planner.units)
    expected = (sum(full) * (heads - 1) + sum(f * k for f, k in zip(full, kept))) / (sum(full) * heads)
    assert planner.shares(one)["flops_ratio"] == pytest.approx(expected, rel=1e-12)
    assert not planner.shares(one)["changes_nothing"]

    # priced on real pairs the window saves nothing, so the plan keeps every head exact
    result = plan(minilm_l3, s, progress=False)
    methods = result.methods.set_index("method")
    assert methods.loc["plan", "flops_ratio"] == methods.loc["plan", "flops_ratio_padded"] == 1.0
    assert methods.loc["uniform window at plan FLOPs", "changes_nothing"]
    # every head exact is no saving: at a size that could decide (as a full report's), the claim is not decided
    checked = dict(result.settings["units"])
    result.settings["units"].update(select=600, check=600)
    (claim,) = plan_claims(result, Context("full"))
    assert (
        claim.verdict.phrase is Phrase.NOT_DECIDED
        and "no plan that computes less met the margin −50 points" in claim.verdict.said
    )
    result.settings["units"].update(checked)
    # a plan whose only saving is padding (every head under the window, as FLOPs at width n would pick) says so
    summary = result.tables["summary"]
    window = summary[summary.method == "uniform window at plan FLOPs"].iloc[0]
    columns = ["detail", "form", "choice", "flops_ratio", "flops_ratio_padded", "changes_nothing"]
    summary.loc[summary.method == "plan", columns] = [
        "uniform window(40)",
        "uniform",
        "window(40)",
        window.flops_ratio,
        window.flops_ratio_padded,
        True,
    ]
    (claim,) = plan_claims(result, Context("full"))
    assert claim.verdict.phrase is Phrase.CHANGES_NOTHING and "100% of the FLOPs on real token pairs" in claim.verdict.said
