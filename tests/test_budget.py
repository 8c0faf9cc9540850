"""The report sized to a time given (``--budget``), made again from a saved report (``--sizes-from``), and
what an undecided claim says deciding it takes (attnlens.report.budget, attnlens.report.deciding)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnlens.analysis.sequential import Design
from attnlens.errors import BadInput
from attnlens.report.budget import FILL, LEVERS, POOLS, SHARES, SPREAD, fit, format_duration, parse_duration, shrunk
from attnlens.report.deciding import Deciding
from attnlens.report.presets import DEFAULT, FINETUNE, FULL, QUICK, QUICK_FINETUNE, ReportSettings
from attnlens.report.verdicts import Context, Phrase, task_verdict
from tiny_models import assert_one_line_error, run_cli


@pytest.mark.parametrize("text", ["10m", "2h", "1h30m", "1m30s", "45s", "3h15m"])
def test_a_duration_reads_back_as_it_is_written(text):
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "0m", "-5m", "10x"])
def test_a_budget_that_is_no_duration_is_refused(text):
    with pytest.raises(BadInput, match="--budget"):
        parse_duration(text)


def _blocks(settings: ReportSettings) -> int:
    return sum(
        value
        for stage in ("eigen", "reconstruct", "importance", "dam", "plan")
        for name, value in getattr(settings, stage).flat().items()
        if name in ("num_seqs", "train_seqs", "eval_seqs", "fit_seqs", "curve_seqs", "select_seqs")
    )


def _price(settings: ReportSettings) -> float:
    """A stand-in forecast that grows with every lever: blocks, each sequential judgement's pool, DAM's seeds × steps."""
    pools = sum(
        getattr(settings, stage).task.task_pool
        for stage in ("reconstruct", "importance", "dam")
        if getattr(settings, stage).task.task_eval == "auto"
    )
    return _blocks(settings) + 0.02 * pools + settings.dam.mask.seeds * settings.dam.training.steps


def _ladders(settings: ReportSettings) -> dict[str, tuple]:
    return {"pools": POOLS[::-1], "blocks": SHARES, "seeds": tuple(range(settings.dam.mask.seeds, 0, -1)), "steps": SHARES}


@pytest.mark.parametrize("share", [0.001, 0.02, 0.1, 0.3, 0.6, 0.95, 1.5])
def test_the_budget_cuts_each_lever_to_its_floor_before_the_next_and_keeps_the_largest_that_fits(share):
    """Whatever the budget (a ``share`` of the way from the smallest sizes' forecast to the largest's): the sizes
    fit; the levers before the one cut are at their least, those after at their largest; and one step back up
    on the lever cut would not fit (checked on a stand-in forecast)."""
    spent, settings = 20.0, FULL.stages(dam={"mask_seeds": 3})
    least, most = (
        _price(shrunk(settings, {lever: ladder[end] for lever, ladder in _ladders(settings).items()})) for end in (-1, 0)
    )
    seconds = (spent + least + share * (most - least)) / FILL
    budget = fit("full", settings, _price, seconds, spent, opened=True)
    levers, ladders = budget.levers, _ladders(settings)
    assert _price(shrunk(settings, levers)) <= FILL * seconds - spent == pytest.approx(FILL * seconds - spent)
    cut = next((lever for lever in LEVERS[::-1] if levers[lever] != ladders[lever][0]), None)  # the last lever cut
    if cut is None:
        return  # everything at its largest fits
    at = LEVERS.index(cut)
    assert all(levers[lever] == ladders[lever][-1] for lever in LEVERS[:at]), levers
    assert all(levers[lever] == ladders[lever][0] for lever in LEVERS[at + 1 :]), levers
    larger = ladders[cut][ladders[cut].index(levers[cut]) - 1]
    assert _price(shrunk(settings, {**levers, cut: larger})) > FILL * seconds - spent
    for pool, needed in budget.pools.items():  # the budget said to give a larger pool gives it, rounded up from the least
        assert fit("full", settings, _price, needed, spent, opened=True).levers["pools"] >= pool
        least = (SPREAD * _price(shrunk(settings, {"pools": pool, "blocks": 1.0, "seeds": 3, "steps": 1.0})) + spent) / FILL
        assert least <= needed < least + 900


def test_a_budget_too_short_for_the_smallest_sizes_is_refused_with_one_that_fits():
    with pytest.raises(BadInput, match=r"too short .* give --budget \d+m or more") as refused:
        fit("quick", QUICK, _price, 30, 20.0, opened=True)
    asked = parse_duration(str(refused.value).rsplit("--budget ", 1)[1].split()[0])
    fit("quick", QUICK, _price, asked, 20.0, opened=True)  # the budget it names fits
    # and fits again where the next run's timings price the same work up to SPREAD times higher
    fit("quick", QUICK, lambda settings: SPREAD * _price(settings), asked, 20.0, opened=True)


def test_the_levers_keep_every_stage_valid_and_never_touch_what_they_do_not_size():
    least = {"pools": POOLS[0], "blocks": SHARES[-1], "seeds": 1, "steps": SHARES[-1]}
    for preset in (QUICK, DEFAULT, FULL, FINETUNE, QUICK_FINETUNE):
        cut = shrunk(preset, least)  # every stage validates its settings as they are made
        assert cut.dam.training.steps >= 2 * cut.dam.stopping.window and cut.dam.mask.seeds == 1
        assert cut.plan is None or cut.plan.task.task_eval == preset.plan.task.task_eval  # the plan judges on halves
        assert cut.reconstruct.seq_len == preset.reconstruct.seq_len and cut.reconstruct.maps == preset.reconstruct.maps
        if preset.importance.task.protocol == "finetune":  # its seeds decide, not its examples
            assert cut.importance.task == preset.importance.task
        else:
            assert (cut.importance.task.task_eval, cut.importance.task.task_pool) == ("auto", POOLS[0])


@pytest.mark.parametrize(
    "preset", [QUICK, DEFAULT, FULL, FINETUNE, QUICK_FINETUNE], ids=["quick", "default", "full", "ft", "qft"]
)
def test_saved_settings_make_the_same_settings_again(preset):
    assert ReportSettings.from_dict(json.loads(json.dumps(preset.to_dict()))) == preset


def test_sizes_from_a_saved_report_are_made_again_and_refuse_a_choice_beside_them(minilm_l3, tmp_path):
    from attnlens.report.prepare import prepare

    sized = shrunk(QUICK, {"pools": 288, "blocks": 0.5, "seeds": 1, "steps": 1.0}).for_run(corpus="kjv", seed=3)
    (tmp_path / "result.json").write_text(json.dumps({"kind": "report", "preset": "quick", "settings": sized.to_dict()}))
    prepared = prepare(minilm_l3, sizes_from=tmp_path)
    assert prepared.settings == prepared.sized(sized) and prepared.name == "quick"
    assert len(prepared.tasks["importance"].pool) == 288  # the pool the saved sizes give
    with pytest.raises(BadInput, match="drop --budget, --seed"):
        prepare(minilm_l3, sizes_from=tmp_path, budget=600.0, seed=1)


def test_report_refuses_a_bad_budget_and_a_missing_saved_report_in_one_line(capsys, tmp_path):
    for argv, phrase in (
        (["--budget", "soon"], "--budget 'soon'"),
        (["--budget", "10m", "--quick"], "drop --quick"),
        (["--sizes-from", str(tmp_path)], "no result.json"),
    ):
        code, _, err = run_cli(capsys, "report", *argv, "--dry-run")
        assert_one_line_error(code, err, phrase)


@pytest.mark.parametrize(("discordant", "delta"), [(0.12, -0.005), (0.3, -0.04), (0.06, -0.005)])
def test_the_examples_a_judgement_needs_put_its_interval_on_one_side_of_the_margin(discordant, delta):
    """What an undecided judgement needs (from its interval alone), against the design's own interval: with the
    same mean and spread on that many examples its interval just leaves −δ (it still holds it 200 fewer), on
    simulated paired outcomes."""
    rng = np.random.default_rng(1)
    draws = rng.random(600)
    up, down = (discordant + delta) / 2, (discordant - delta) / 2
    differences = np.where(draws < up, 1.0, np.where(draws < up + down, -1.0, 0.0))
    design = Design.for_pool(10000, margin=0.02)
    count, total, squares = 600, differences.sum(), np.square(differences).sum()
    mean, half = design.interval_of_sums(count, total, squares, 1.959964)
    needs = Deciding({"importance": 0.01}, {"importance": 10000}).examples("importance", count, mean, half, 0.02)
    assert needs is not None and needs.examples is not None
    distance = abs(mean + 0.02)

    def half_at(examples: int) -> float:  # the same mean and spread on more examples
        return design.interval_of_sums(examples, total * examples / count, squares * examples / count, 1.959964)[1]

    assert half_at(count + needs.examples) <= 1.02 * distance, (needs, half_at(count + needs.examples), distance)
    if needs.examples > 200:
        assert half_at(count + needs.examples - 200) >= 0.98 * distance
    assert needs.seconds == pytest.approx(0.01 * needs.examples)


def test_an_undecided_claim_says_what_deciding_takes_and_a_decided_one_does_not():
    deciding = Deciding({"importance": 0.05}, {"importance": 4000}, {1296: 900.0, 4000: 2400.0},
                        {"dam": {"seconds": 600.0, "seeds": 3, "steps": 300}})  # fmt: skip
    context = Context("quick", deciding=deciding)  # the default margin: 2 points
    row = pd.Series({"accuracy": 0.8, "delta_accuracy": -0.01, "delta_accuracy_low": -0.04, "delta_accuracy_high": 0.02,
                     "held_out": 400})  # fmt: skip
    judged = task_verdict(row, context, stage="importance")
    assert judged.phrase is None and judged.judged and judged.needs is not None  # [−4, +2] holds −2: not decided
    # half-width 0.03 on 400 examples, 0.01 from −δ: (0.03 / 0.01)² × 400 = 3,600 in all, 3,200 more, 160 s; a pool
    # of 4,000 gives them
    assert judged.needs.text == "needs about 3,200 more examples, about 3 minutes here: --budget 40m"
    verdict = context.verdict(Phrase.NOT_DECIDED, "Δ −1.0 points", judged.needs)
    assert verdict.text == "not decided: Δ −1.0 points; needs about 3,200 more examples, about 3 minutes here: --budget 40m"
    few = task_verdict(row.replace(400, 64), context, stage="importance")  # fewer than a first look: judged at no size
    proxy = context.verdict(Phrase.PROXY_HOLDS, "cosine 0.999", few.needs)
    assert not few.judged and proxy.text.startswith("holds by the proxy (task: needs about ") and "here" in proxy.text
    assert proxy.text.count("needs about") == 1 and proxy.needs == few.needs  # said once, and kept as numbers
    below = row.copy()
    below[["delta_accuracy_low", "delta_accuracy_high"]] = [-0.05, -0.03]
    decided = task_verdict(below, context, stage="importance")
    assert decided.phrase is Phrase.DOES_NOT_HOLD and decided.needs is None
    dam = context.at_this_size("dam")
    assert dam.text == "not decided at this size (--full's DAM decides it: 3 seeds of up to 300 steps, about 10 minutes here)"
    assert Context("quick").at_this_size("dam").text == "not decided at this size (run --full)"  # read back without deciding


@pytest.mark.parametrize(("blocks", "mean", "half"), [(4, -0.0215, 0.17), (32, 0.01, 0.012), (8, 0.3, 0.5)])
def test_a_comparison_over_blocks_says_how_many_would_exclude_zero(blocks, mean, half):
    """At the blocks it names, the interval (its half-width shrinking as one over the root of the blocks) would
    just exclude zero if the mean held; one block fewer would not."""
    needs = Deciding({}, {}, per_block={"importance": 2.0}).blocks("importance", blocks, mean, half)
    needed = int(needs.text.split("about ")[1].split(" held-out")[0].replace(",", ""))
    assert half * np.sqrt(blocks / needed) <= abs(mean) < half * np.sqrt(blocks / (needed - 1))
    assert needs.seconds == pytest.approx(2.0 * needed) and f"(here {blocks})" in needs.text
    assert Deciding({}, {}, per_block={"importance": 2.0}).blocks("importance", blocks, mean, abs(mean) / 2) is None  # decided


@pytest.fixture
def counted_prices(monkeypatch):
    """Every unit priced by its tokens (1 ms a token, a fit 0.1 s) and the probe's C by its examples, instead of
    timing them: the budget's choices on a real model and its real tasks, the same on every machine (and large
    beside the seconds spent preparing, which are measured)."""
    from attnlens.forecast import units

    def measure(cls, model, wanted, blocks, precision="float32", new_shapes=True):
        return cls({unit: (1e-3 * unit.batch * unit.width if unit.kind in units.KINDS else 0.1) for unit in set(wanted)})

    monkeypatch.setattr(units.Calibration, "measure", classmethod(measure))
    monkeypatch.setattr(units, "probe_seconds", lambda examples, hidden: 1e-2 * examples)


@pytest.mark.slow
def test_a_budget_on_a_model_takes_the_preset_that_fits_and_the_largest_pool(minilm_l3, counted_prices):
    """With prices that do not depend on the machine, a budget a fifth above the quick preset's forecast takes the
    quick preset with the largest pool that fits, every judgement sequential on it; and the sizes the report runs
    with are the ones priced."""
    from attnlens.report.prepare import forecast_report, prepare

    quick = forecast_report(prepare(minilm_l3, quick=True)).seconds
    sized = prepare(minilm_l3, budget=1.2 * quick / FILL)
    budget = sized.budget
    assert sized.name == "quick" and budget is not None and budget.base == "quick"
    assert forecast_report(sized).seconds == pytest.approx(budget.forecast)
    assert budget.forecast <= FILL * budget.seconds - budget.spent
    pools = {getattr(sized.settings, stage).task.task_pool for stage in ("reconstruct", "importance", "dam")}
    assert pools == {budget.levers["pools"]} and all(
        len(sized.tasks[stage].pool) <= budget.levers["pools"] for stage in sized.tasks
    )
    assert POOLS[0] < budget.levers["pools"] < POOLS[-1], budget.levers  # the budget sits between the two ends
    assert min(budget.pools.values()) > budget.seconds  # the next pool would not have fitted: the least budget it takes is more
