"""The report's forecast: its counts are what the stages run, and its prices read the timings right.

The counts are checked against what a stage really runs: a hook on the model's first layer sees every
forward (whole or stopped after the layers a pass needs) with its batch and width, and whether it
computes gradients. A stage at settings where it decides nothing as it goes (a fixed number of task
examples, DAM's steps no more than its stopping rule's least) must run exactly the blocks and examples
its items count, at the widths they count them."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.eigen import EigenSettings
from attnlens.analysis.importance import ImportanceSettings
from attnlens.analysis.plan.settings import PlanSettings
from attnlens.analysis.reconstruct.settings import ReconstructSettings
from attnlens.forecast import StageForecast
from attnlens.forecast import stages as counted
from attnlens.forecast.stages import Facts
from attnlens.forecast.units import KINDS, Calibration, Unit
from attnlens.forecast.work import Item, examples

GRADIENT = ("step", "train")


def _run_counting(model, run) -> collections.Counter:
    """Sequences through ``model`` per (width, with gradients) while ``run()`` runs, from a hook on layer 0
    (a one-block forward, the stages' probe of which pairs a layer computes, aside: the forecast leaves it out)."""
    seen: collections.Counter = collections.Counter()
    layers = max((m for m in model.model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)

    def hook(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if hidden.shape[0] > 1:
            seen[int(hidden.shape[1]), torch.is_grad_enabled()] += int(hidden.shape[0])

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen


def _counted(items: list[Item]) -> collections.Counter:
    """The same tally from a stage's items (their forward kinds; fits and measures are not forwards)."""
    tally: collections.Counter = collections.Counter()
    for item in items:
        if item.unit.kind in KINDS:
            assert item.low is None or item.low == item.high, f"{item.what}: these settings decide as they go"
            tally[item.unit.width, item.unit.kind in GRADIENT] += item.count * item.unit.batch
    return collections.Counter({key: round(value, 6) for key, value in tally.items()})


def _facts(model, per_query=False, tasks=None) -> Facts:
    return Facts(model.num_layers, model.num_heads, model.causal, per_query, model.objective, tasks or {})


def test_eigen_counts_the_blocks_it_folds_into_moments(minilm_l6):
    from attnlens.analysis.eigen import eigen

    s = EigenSettings.build(num_seqs=12, seq_len=16, batch_size=4)
    seen = _run_counting(minilm_l6, lambda: eigen(minilm_l6, s, progress=False))
    assert seen == _counted(counted.eigen_work(s))


def test_reconstruct_counts_its_moments_rows_and_plug_in_runs(minilm_l6):
    from attnlens.analysis.reconstruct import reconstruct

    s = ReconstructSettings.build(num_seqs=16, seq_len=16, batch_size=4, ks=(2, 8), strategies=("greedy",), scopes=("head", "all"),
                                  plug_in=True, plug_in_scopes=("head",))  # fmt: skip
    seen = _run_counting(minilm_l6, lambda: reconstruct(minilm_l6, s, progress=False))
    assert seen == _counted(counted.reconstruct_work(s, _facts(minilm_l6)))


def test_importance_counts_every_pass_and_every_judged_example(minilm_l6, tmp_path, monkeypatch):
    """Task examples run at their batches' own widths (:func:`test_task_examples_are_priced_at_their_batches_widths`
    checks the width that prices them): here, every block and example, with and without gradients, is counted."""
    from attnlens.analysis.importance import importance
    from attnlens.analysis.task import prepare_task

    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))  # the probe's training features are computed, as counted
    s = ImportanceSettings.build(num_seqs=8, seq_len=32, batch_size=4, classes="self,cls", task="rotten-tomatoes",
                                 protocol="probe", task_train=16, task_eval=24, task_classes="self")  # fmt: skip
    prepared = prepare_task(minilm_l6, s.task, seq_len=32, seed=0)
    work = counted.importance_work(s, _facts(minilm_l6, tasks={"importance": prepared}))
    seen = _run_counting(minilm_l6, lambda: importance(minilm_l6, s, progress=False))
    expected = _counted(work)
    for grad in (False, True):
        assert sum(v for (_, g), v in seen.items() if g == grad) == pytest.approx(
            sum(v for (_, g), v in expected.items() if g == grad)
        )


def test_dam_counts_its_steps_and_judgements(minilm_l6):
    from attnlens.analysis.dam import dam

    s = DamSettings.build(seq_len=16, batch_size=4, train_seqs=8, eval_seqs=8, sparsity=(0.5,), steps=2, stop_window=2,
                          polish_rounds=0, reference=None, patterns=False, bootstrap=50)  # fmt: skip
    seen = _run_counting(minilm_l6, lambda: dam(minilm_l6, s, progress=False))
    assert seen == _counted(counted.dam_work(s, _facts(minilm_l6)))


def test_plan_counts_its_curves_and_plans(minilm_l3):
    from attnlens.analysis.plan import plan

    s = PlanSettings.build(seq_len=16, batch_size=4, fit_seqs=8, curve_seqs=4, select_seqs=4, eval_seqs=4, ks=(4,), widths=(2,),
                           max_loss=(0.05,), bootstrap=50)  # fmt: skip
    seen = _run_counting(minilm_l3, lambda: plan(minilm_l3, s, progress=False))
    work = counted.plan_work(s, _facts(minilm_l3))
    ranged = [item for item in work if item.what.startswith("plans judged")]  # the search and the check
    fixed = _counted([item for item in work if item not in ranged])
    judged = sum(seen.values()) - sum(fixed.values())  # what the search and the check ran, within their ranges
    assert {item.unit.batch for item in ranged} == {4}
    assert sum(item.bounds[0] for item in ranged) * 4 <= judged <= sum(item.bounds[1] for item in ranged) * 4


def test_the_plan_screen_counts_a_forward_and_a_backward_per_class(minilm_l3):
    """Under an accuracy budget the heads are screened at once: the curve examples' unmodified predictions, then one
    forward with gradients per batch (the backward per class reuses it); priced as a gated step per class."""
    from attnlens.analysis.plan import _curves, _planner
    from attnlens.analysis.task import prepare_task

    s = PlanSettings.build(seq_len=32, task="rotten-tomatoes", task_train=16, task_eval=40, max_drop=(50.0,), fit_seqs=4,
                           curve_seqs=8, batch_size=4, ks=(), widths=(2,), forecastable_only=False)  # fmt: skip
    assert s.screened  # the default under an accuracy budget
    prepared = prepare_task(minilm_l3, s.task, seq_len=32, seed=s.seed)
    work = {item.what: item for item in counted.plan_work(s, _facts(minilm_l3, tasks={"plan": prepared}))}
    planner = _planner(minilm_l3, s, "cpu", False)
    seen = _run_counting(minilm_l3, lambda: _curves(planner, False))
    screen = work["curves: the screen, a backward per class"]
    assert screen.unit.kind == "screen" and screen.count * screen.unit.batch == pytest.approx(2 * 8)  # two classes
    assert sum(v for (_, grad), v in seen.items() if grad) == 8  # one forward with gradients per curve example
    assert "curves: one change per head and choice" not in work


def test_a_stage_is_priced_at_the_middle_of_its_ranges():
    """A range counts its middle (a sequential design's looks too: bench_sequential's judgements average near it), and the least and
    the most price its ends; a width between two timed ones is read off the line through them."""
    calibration = Calibration({Unit("changed", 16, 32): 1.0, Unit("changed", 16, 128): 4.0})
    assert calibration.seconds(Unit("changed", 16, 64)) == pytest.approx(2.0)
    assert calibration.seconds(Unit("changed", 8, 64)) == pytest.approx(1.0)  # half the batch, half the seconds
    items = [Item("fixed", Unit("changed", 16, 32), 10), Item.ranged("looks", Unit("changed", 16, 128), 4, 64)]
    stage = StageForecast.of("x", items, calibration)
    assert stage.seconds == pytest.approx(10 + 34 * 4.0) and (stage.low, stage.high) == (10 + 16, 10 + 256)


def test_without_new_shapes_a_kind_timed_before_is_read_off_its_timing_and_a_new_kind_is_timed(minilm_l3):
    """The budget's search prices many sizes: a kind timed at one batch is scaled to another, not timed again; a kind
    never timed is timed; and the next calibration with new shapes times the shape it scaled."""
    from attnlens.forecast import units

    blocks = np.arange(4 * 24).reshape(4, 24) % 1000 + 1000
    units._TIMED.clear()
    first = Calibration.measure(minilm_l3, [Unit("changed", 4, 16)], blocks)
    timed = first.seconds_of[Unit("changed", 4, 16)]
    read = Calibration.measure(minilm_l3, [Unit("changed", 8, 16), Unit("features", 4, 16)], blocks, new_shapes=False)
    assert Unit("changed", 8, 16) not in read.seconds_of and read.seconds(Unit("changed", 8, 16)) == pytest.approx(2 * timed)
    assert Unit("features", 4, 16) in read.seconds_of  # a kind not timed before is timed
    again = Calibration.measure(minilm_l3, [Unit("changed", 8, 16)], blocks)
    assert Unit("changed", 8, 16) in again.seconds_of and set(again.seconds_of) == {Unit("changed", 8, 16)}


def test_task_examples_are_priced_at_their_batches_widths():
    """Examples sorted by length and cut into batches, each at its longest: the mean width prices them all."""
    from attnlens.data.tasks import Examples

    lengths = np.array([5, 30, 6, 29, 7, 28, 8, 27])
    mask = (np.arange(30)[None] < lengths[:, None]).astype(np.int64)
    item = examples("t", "judged", Examples(mask.copy(), mask, np.zeros(8, np.int64), np.arange(8)), batch=4)
    assert item.count == 2 and item.unit == Unit("judged", 4, round((8 * 4 + 30 * 4) / 8))


@pytest.mark.integration
def test_dry_run_prints_every_stages_forecast_and_runs_none(capsys, monkeypatch, tmp_path):
    """``--dry-run``: the checks, then the forecast table (every stage the report would run, and the total); no
    stage runs, nothing is written, and no --out is needed. Without --out or --dry-run: one line of bad input."""
    import sys

    from tiny_models import assert_one_line_error, run_cli

    monkeypatch.setattr(sys.modules["attnlens.report"], "analyses", lambda *args, **kwargs: pytest.fail("a stage ran"))
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "report", "--quick", "--dry-run")
    assert code == 0 and not list(tmp_path.iterdir())
    names = ("eigen", "eigen (second model)", "overlap", "reconstruct", "importance", "dam", "plan", "figures", "total")
    assert [line.split("  ")[0] for line in out.splitlines()[1:-1]] == list(names)
    code, _, err = run_cli(capsys, "report", "--quick")
    assert_one_line_error(code, err, "--out DIR", "--dry-run")


def test_the_reports_precision_reaches_every_stage_that_judges():
    """``--precision`` sets every stage that judges a change (the eigen analysis judges none)."""
    from attnlens.report.presets import QUICK

    settings = QUICK.for_run(corpus="kjv", seed=0, precision="bfloat16")
    judging = [settings.reconstruct, settings.importance, settings.dam, settings.plan]
    assert all(stage.precision == "bfloat16" and stage.task.precision == "bfloat16" for stage in judging)
    assert "precision" not in settings.eigen.flat()


def test_sinks_counts_its_blocks_and_one_pass_per_head(minilm_l3, tmp_path, minilm_l6, monkeypatch):
    """The weights' pass over every block (seen by the hook); with ``far``, the unmodified losses and one pass per
    head over ``far_seqs`` blocks (each started at its head's layer, so counted where the objective evaluates)."""
    import attnlens
    from attnlens.analysis import sinks as module
    from attnlens.analysis.sinks import SinkSettings, far
    from tiny_models import save_tiny

    s = SinkSettings.build(num_seqs=6, seq_len=16, batch_size=4, min_keys=8)
    seen = _run_counting(minilm_l3, lambda: module.sinks(minilm_l3, s, progress=False))
    assert seen == _counted(counted.sinks_work(s, _facts(minilm_l3)))
    causal = attnlens.load_model(str(save_tiny(tmp_path / "causal", minilm_l6, "causal")))
    s = s.replace(far=True, far_seqs=5, far_max_seqs=5, window=2)  # one round: its passes are known before it runs
    evaluated = collections.Counter()
    original = far.evaluate_batch
    monkeypatch.setattr(
        far,
        "evaluate_batch",
        lambda objective, batch, *rest: evaluated.update([batch.input_ids.shape[0]]) or original(objective, batch, *rest),
    )
    module.sinks(causal, s, progress=False)
    _, each_head = counted.sinks_work(s, _facts(causal))
    assert sum(size * count for size, count in evaluated.items()) == each_head.count * each_head.unit.batch
