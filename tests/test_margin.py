"""Verdicts against a stated margin: every kind of claim, with intervals on each side of the margin and
across it, read back as the phrase the page prints; the margin given in points or as a share, and refused
in one line when it is not one; ``claims.csv`` keeps it as numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnlens.analysis.margin import Margin, compared, non_inferior
from attnlens.errors import BadInput
from attnlens.report.verdicts import (
    RECORD_FIELDS,
    Claim,
    Context,
    Difference,
    Phrase,
    Stated,
    Verdict,
    beats,
    costs_less,
    task_verdict,
)
from tiny_models import assert_one_line_error, run_cli

DELTA = 0.02  # the default margin, 2 points
# (low, high) of a paired Δ interval, and the phrase a "costs nothing" claim takes against −δ
SIDES = [
    ((-0.015, 0.004), Phrase.HOLDS),  # wholly above −δ, though below zero in part: a loss within the margin
    ((-0.012, -0.001), Phrase.HOLDS),  # below zero as a whole, yet above −δ: the paper's "enough"
    ((-0.06, -0.025), Phrase.DOES_NOT_HOLD),  # wholly below −δ
    ((-0.031, 0.006), None),  # holds zero, but −δ too: not evidence of no loss ("too loose" before)
    ((-0.07, -0.001), None),  # excludes zero, but holds −δ: not shown to lose more than the margin ("too strict" before)
]


@pytest.mark.parametrize(("interval", "phrase"), SIDES)
def test_a_change_that_costs_nothing_is_judged_against_minus_the_margin(interval, phrase):
    """By the task over examples: the row's interval against −δ, the phrase, and what deciding takes where open."""
    low, high = interval
    row = pd.Series({"accuracy": 0.8, "delta_accuracy": (low + high) / 2, "delta_accuracy_low": low,
                     "delta_accuracy_high": high, "held_out": 600, "margin": DELTA})  # fmt: skip
    judged = task_verdict(row, Context("default"), stage="reconstruct")
    assert judged.phrase is phrase and judged.judged
    expected = {"holds": Phrase.HOLDS, "does not hold": Phrase.DOES_NOT_HOLD}.get(non_inferior(low, high, DELTA))
    assert expected is phrase  # the rule, written once, agrees with the table above
    verdict = Context("default").verdict(judged.phrase or Phrase.NOT_DECIDED, "Δ")
    assert verdict.text.startswith((phrase or Phrase.NOT_DECIDED).value)


@pytest.mark.parametrize(("interval", "phrase"), SIDES)
def test_across_fine_tune_seeds_the_same_rule_reads_the_seeds_interval(interval, phrase):
    low, high = interval
    row = pd.Series({"accuracy": 0.8, "delta_accuracy": 0.0, "delta_accuracy_low": 0.0, "delta_accuracy_high": 0.0,
                     "held_out": 1000, "delta_seeds": (low + high) / 2, "delta_seeds_low": low, "delta_seeds_high": high,
                     "seed_accuracy_0": 0.8, "seed_accuracy_1": 0.79, "seed_accuracy_2": 0.81})  # fmt: skip
    judged = task_verdict(row, Context("finetune", seeded=True), stage="reconstruct")
    assert judged.phrase is phrase and judged.difference is not None and judged.difference.seeds == (0.8, 0.79, 0.81)


def test_a_share_of_the_unmodified_accuracy_is_resolved_from_the_row_that_did_not_record_its_margin():
    """3% of an unmodified accuracy of 0.8 is 2.4 points: [−2.2, −0.5] holds against it, not against 2 points."""
    row = pd.Series({"accuracy": 0.78, "delta_accuracy": -0.013, "delta_accuracy_low": -0.022,
                     "delta_accuracy_high": -0.005, "held_out": 900, "unmodified_accuracy": 0.8})  # fmt: skip
    share = Context("default", margin=Margin.parse("3%"))
    assert share.task_margin(row) == pytest.approx(0.024) and share.stated(row).text == "margin 2.4 points"
    assert task_verdict(row, share).phrase is Phrase.HOLDS
    assert task_verdict(row, Context("default")).phrase is None  # against 2 points it holds the margin
    recorded = row.copy()
    recorded["margin"] = 0.03  # a judgement that recorded its margin is read by it, whatever the report's
    assert Context("default").task_margin(recorded) == 0.03


# (low, high) of first − second, and whether "first beats second" holds
BEATS = [
    ((0.001, 0.03), Phrase.HOLDS),  # above zero
    ((-0.04, -0.025), Phrase.DOES_NOT_HOLD),  # below zero
    ((-0.015, 0.012), Phrase.DOES_NOT_HOLD),  # within ±δ: on par
    ((-0.03, 0.01), Phrase.NOT_DECIDED),  # holds zero and −δ: neither on par nor apart
    ((-0.01, 0.05), Phrase.NOT_DECIDED),  # holds zero and +δ
]


@pytest.mark.parametrize(("interval", "phrase"), BEATS)
def test_one_choice_beats_another_above_zero_and_is_on_par_only_within_the_margin(interval, phrase):
    low, high = interval
    assert beats(Difference((low + high) / 2, low, high, "points"), DELTA) is phrase
    said = compared(low, high, DELTA)
    assert said == {Phrase.HOLDS: "better", Phrase.NOT_DECIDED: "not decided"}.get(phrase, said)
    if phrase is Phrase.DOES_NOT_HOLD:
        assert said == ("worse" if high < 0 else "on par")


@pytest.mark.parametrize(
    ("interval", "phrase"),
    [((-0.03, -0.012), Phrase.HOLDS), ((0.012, 0.02), Phrase.DOES_NOT_HOLD), ((-0.004, 0.006), Phrase.DOES_NOT_HOLD),
     ((-0.015, 0.002), Phrase.NOT_DECIDED)],
)  # fmt: skip
def test_one_removal_costs_less_than_another_by_the_same_rule_in_the_proxys_unit(interval, phrase):
    """self − other, in 1 − cosine, against the proxy's margin 0.01: below zero it costs less, within ±0.01 on par."""
    low, high = interval
    assert costs_less(Difference((low + high) / 2, low, high, "1 − cosine"), 0.01) is phrase


def test_the_plan_is_judged_at_the_margin_on_its_held_out_check():
    """The plan's claim: met (the cost's upper end within the allowance) holds; a held-out change wholly below −δ
    does not; one that holds −δ is not decided, and says so."""
    from attnlens.report.plan import _plan_verdict

    units = {"units": {"select": 600, "check": 600}}
    result = type("Plan", (), {"settings": units, "tables": {}})()
    base = {"budget": 2.0, "flops_ratio": 0.8, "form": "step", "check_allowance": 0.02, "changes_nothing": False}
    cases = [(0.012, 0.004, 0.019, True, Phrase.HOLDS), (0.04, 0.03, 0.05, False, Phrase.DOES_NOT_HOLD),
             (0.02, 0.01, 0.03, False, Phrase.NOT_DECIDED)]  # fmt: skip
    for cost, low, high, meets, phrase in cases:
        plan = pd.Series({**base, "check_cost": cost, "check_cost_low": low, "check_cost_high": high, "check_meets": meets})
        verdict = _plan_verdict(result, plan, Context("full"), [])
        assert verdict.phrase is phrase and "the margin −2 points" in verdict.said


def test_claims_csv_keeps_the_margin_and_its_unit_as_numbers():
    claim = Claim("c", "p", Verdict(Phrase.HOLDS, "Δ"), difference=Difference(-0.01, -0.015, -0.004, "points", 900),
                  margin=Stated(2.0, "points"))  # fmt: skip
    record = claim.record()
    assert list(record) == list(RECORD_FIELDS) and (record["margin"], record["margin_unit"]) == (2.0, "points")
    assert np.isnan(Claim("c", "p", Verdict(Phrase.HOLDS)).record()["margin"])  # a claim no margin applies to


@pytest.mark.parametrize(
    ("given", "value", "relative", "fraction"),
    [(2, 2.0, False, 0.02), ("1", 1.0, False, 0.01), ("3%", 3.0, True, 0.024), (" 2.5 % ", 2.5, True, 0.02)],
)
def test_a_margin_is_points_or_a_share_of_the_unmodified_accuracy(given, value, relative, fraction):
    margin = Margin.parse(given)
    assert (margin.value, margin.relative) == (value, relative)
    assert margin.fraction(0.8) == pytest.approx(fraction)
    assert Margin.parse(margin.setting) == margin  # as settings and saved results hold it


@pytest.mark.parametrize(("given", "phrase"), [("-1", "greater than 0"), ("abc", "not a margin"), ("150%", "at most 100%"),
                                               ("0", "greater than 0"), ("nan", "greater than 0"), ("250", "at most 100 points")])  # fmt: skip
def test_a_bad_margin_is_refused_naming_the_margin(given, phrase):
    with pytest.raises(BadInput, match=phrase):
        Margin.parse(given)


@pytest.mark.parametrize("given", ["-1", "abc", "150%"])
@pytest.mark.parametrize("command", [["report", "--quick"], ["reconstruct", "minilm-l6", "--task", "imdb", "--plug-in"]])
def test_the_command_line_refuses_a_bad_margin_in_one_line_before_any_work(command, given, capsys, tmp_path):
    """No model loads (a unit test may not load one), nothing is written."""
    code, _, err = run_cli(capsys, *command, "--margin", given, "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "--margin")
    assert not (tmp_path / "out").exists()
