"""The sequential rule: its integration against published boundaries and a Monte Carlo of random
walks, and its intervals' coverage, how often they decide and the examples they use, on simulated
paired outcomes of known Δ around the margin, against a fixed design as large as its pool."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnlens.analysis.margin import COMPARISON, NON_INFERIORITY, decides, non_inferior
from attnlens.analysis.sequential import ALPHA, Design, _spread, continuation, spending

# Published two-sided α = 0.05 constants (Pocock 1977; O'Brien & Fleming 1979; Jennison & Turnbull 2000, tables 2.1, 2.3).
PUBLISHED = [
    ("Pocock, 2 looks", np.full(2, 2.178), 2),
    ("Pocock, 5 looks", np.full(5, 2.413), 5),
    ("O'Brien-Fleming, 5 looks", 2.040 * np.sqrt(5 / np.arange(1, 6)), 5),
]
Z = 1.959964
MARGIN = 0.02  # the report's default: 2 points


@pytest.mark.parametrize(("name", "bounds", "looks"), PUBLISHED, ids=[name for name, _, _ in PUBLISHED])
def test_integration_reproduces_published_boundaries(name, bounds, looks):
    """The published constants are rounded to 3 decimals: their α is 0.05 within about 1e-4."""
    crossed = 1 - continuation(np.arange(1, looks + 1) / looks, bounds)[-1]
    assert abs(crossed - 0.05) < 3e-4, (name, crossed)


def test_a_judgements_boundaries_spend_what_a_monte_carlo_of_random_walks_spends():
    """An independent check of the boundaries a judgement used: Gaussian random walks observed at its
    looks cross them by each early look with probability α·t² (t: the look's share of the pool)
    and by the last with probability α, within Monte Carlo error."""
    rng = np.random.default_rng(2)
    edge = rng.choice([-1.0, 0.0, 1.0], size=4000, p=[0.06, 0.9, 0.04])  # Δ = −δ, 10% discordant: every look
    decision = Design.for_pool(4000, MARGIN, futility=0.0).run(lambda count: edge[:count])  # it looks at every look
    looks, bounds = np.array(decision.looks), np.array(decision.bounds)
    assert decision.reason == "examples ran out" and len(looks) >= 8
    walks = np.cumsum(rng.normal(size=(400_000, len(looks))) * np.sqrt(np.diff(looks, prepend=0)), axis=1)
    crossed = np.maximum.accumulate(np.abs(walks / np.sqrt(looks)) >= bounds, axis=1).mean(0)
    expected = np.array([spending(count / 4000) for count in looks[:-1]] + [ALPHA])
    error = 4 * np.sqrt(expected * (1 - expected) / len(walks))
    assert np.all(np.abs(crossed - expected) < error + 1e-4), (crossed, expected)
    assert Z < bounds[-1] < 2.2 < bounds[0]  # early looks spend little: the last keeps most of α


def _simulate(delta: float, discordant: float, design: Design, reps: int, seed: int) -> tuple[np.ndarray, ...]:
    """``reps`` sequential judgements of paired 0/1 outcomes: a change right where the unmodified
    model is wrong with probability (discordant + Δ)/2, the reverse (discordant − Δ)/2. Returns, per
    judgement, whether its interval covers Δ, the examples it used, and its verdict against the margin."""
    rng = np.random.default_rng(seed)
    probabilities = [(discordant + delta) / 2, (discordant - delta) / 2, 1 - discordant]
    cuts = np.array(design.cuts)
    counts = np.cumsum(np.stack([rng.multinomial(step, probabilities, size=reps) for step in np.diff(cuts, prepend=0)], 1), 1)
    at = {count: index for index, count in enumerate(cuts)}
    covered, used, verdicts = np.zeros(reps, dtype=bool), np.zeros(reps, dtype=int), np.empty(reps, dtype=object)
    for rep, (plus, minus) in enumerate(zip(counts[..., 0], counts[..., 1])):
        decision = design.run_on_sums(lambda count: (plus[at[count]] - minus[at[count]], plus[at[count]] + minus[at[count]]))
        covered[rep], used[rep] = decision.low <= delta <= decision.high, decision.examples
        verdicts[rep] = non_inferior(decision.low, decision.high, design.margin)
    return covered, used, verdicts


def fixed_power(delta: float, discordant: float, examples: int) -> float:
    """How often a fixed design of ``examples`` (normal approximation, interval 1.96 standard errors) puts its
    interval on the right side of −δ: above it where Δ > −δ, below it where Δ < −δ."""
    from scipy.stats import norm

    error = np.sqrt((discordant - delta**2) / examples)
    return float(norm.sf(Z - abs(delta + MARGIN) / error))


# Δ at 0, −δ/2 (= −δ + 1 point), −δ, −δ − 1 point and −3δ, at three rates of discordance
DELTAS = (0.0, -MARGIN / 2, -MARGIN, -MARGIN - 0.01, -3 * MARGIN)
CASES = [(delta, discordant) for discordant in (0.1, 0.2, 0.4) for delta in DELTAS]
# at 5% discordance Δ = −0.05 sends every flip one way: see below
CASES += [(0.0, 0.05), (-0.01, 0.05), (-0.02, 0.05), (-0.03, 0.05)]


@pytest.mark.parametrize(("delta", "discordant"), CASES)
def test_intervals_cover_and_decide_about_as_often_as_a_fixed_design_of_the_whole_pool(delta, discordant):
    """2,000 judgements each, stopped by the report's rule (the interval on one side of −δ, or the pool of 4,000
    run out). Coverage is at least 95% up to Monte Carlo error (3 standard errors), whatever Δ; a verdict on the
    wrong side of −δ is as rare as a missed coverage; the right verdict comes within 8 points as often as from a
    fixed design of all 4,000 examples (its power: :func:`fixed_power`); and a clear effect stops early: −3δ on
    at most half the pool on average (up to 20% discordance), no loss at 10% discordance on at most 60% of it."""
    reps = 2000
    design = Design.for_pool(4000, MARGIN)
    covered, used, verdicts = _simulate(delta, discordant, design, reps, seed=int(1e4 * (discordant - delta)))
    assert covered.mean() >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / reps), covered.mean()
    if delta == -MARGIN:  # nothing decides right at the margin: each verdict is a miss, at most α/2 a side
        assert (verdicts != "not decided").mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)
        return
    right, wrong = ("holds", "does not hold") if delta > -MARGIN else ("does not hold", "holds")
    assert (verdicts == wrong).mean() <= 0.025 + 3 * np.sqrt(0.025 * 0.975 / reps), (verdicts == wrong).mean()
    assert (verdicts == right).mean() >= fixed_power(delta, discordant, 4000) - 0.08, (verdicts == right).mean()
    if (delta == -3 * MARGIN and discordant <= 0.2) or (delta == 0 and discordant <= 0.1):
        assert used.mean() <= (0.5 if delta else 0.6) * 4000, used.mean()


def test_the_agresti_min_interval_itself_undercovers_where_every_flip_goes_one_way():
    """Why Δ = −0.05 at 5% discordance is not in the coverage cases: there every discordant example
    goes one way, and the normal interval covers less than 95% at some fixed sizes already (exact
    binomial sum), so no stopping rule on top of it can be held to 95% there."""
    from scipy.stats import binom

    count = 456  # a fixed design's size for that case
    flips = np.arange(count + 1)
    probability = binom.pmf(flips, count, 0.05)
    covers = [Design.interval_of_sums(count, -k, k, Z) for k in flips]
    hit = np.array([mean - half <= -0.05 <= mean + half for mean, half in covers])
    assert (probability * hit).sum() < 0.94


def test_a_fixed_rule_looking_as_often_would_not_cover():
    """The control that makes the coverage test able to fail: the same kind of judgement with the
    fixed-sample 1.96 at every look of the grid stops early on noise and covers Δ = −δ well below 95%."""
    design = Design.for_pool(4000, MARGIN)
    rng = np.random.default_rng(3)
    misses = 0
    for _ in range(1000):
        outcomes = rng.choice([-1.0, 0.0, 1.0], size=4000, p=[0.21, 0.6, 0.19])  # Δ = −δ, 40% discordant
        for count in design.grid:
            mean, low, high, half = design.interval(outcomes[:count], Z)
            if low > -MARGIN or high < -MARGIN or count == 4000:
                misses += not low <= -MARGIN <= high
                break
    assert misses / 1000 > 0.07


def test_decisions_say_why_they_stopped():
    design = Design.for_pool(1000, margin=MARGIN)
    assert design.grid == (192, 288, 432, 624, 912, 1000) and set(design.grid) <= set(design.cuts)
    rng = np.random.default_rng(0)
    costly = np.where(rng.random(1000) < 0.2, -1.0, 0.0)
    asked = []

    def differences(count: int) -> np.ndarray:
        asked.append(count)
        return costly[:count]

    decision = design.run(differences)
    assert (decision.reason, decision.examples, asked) == ("decided", 192, [192])
    assert decision.high < -MARGIN and decision.decided
    noisy = rng.choice([-1.0, 1.0], size=1000)  # half the examples flip each way: Δ ≈ 0 and a wide interval
    decision = design.run(lambda count: noisy[:count])
    assert not decision.decided and decision.reason in ("the pool would not decide", "examples ran out")
    design = Design.for_pool(1000, margin=MARGIN, futility=0.0)  # without the futility rule: to the pool's end
    decision = design.run(lambda count: noisy[:count])
    assert decision.reason == "examples ran out" and decision.examples == 1000 and decision.low < -MARGIN < decision.high
    assert decision.looks[-1] == 1000 and set(decision.looks) <= set(design.cuts) and not decision.decided
    untouched = np.zeros(1000)  # no example changes: the interval lies above −δ, never of zero width
    decision = design.run(lambda count: untouched[:count])
    assert decision.reason == "decided" and decision.low > -MARGIN and decision.halfwidth > 0
    mean, low, high, half = design.interval(noisy[:200], decision.bound)
    assert np.isclose(high - low, 2 * half) and np.isclose(mean, noisy[:200].mean())
    capped = design.run(lambda count: noisy[:count], available=300)  # the cap's look spends the rest of α
    assert capped.examples == 300 and capped.reason == "examples ran out" and capped.bound < capped.bounds[0]


def test_the_margin_sets_the_question_and_an_undecided_judgement_stops_where_the_pool_would_not_decide_it():
    """Against the unmodified model a judgement stops where its interval leaves −δ; two choices compared stop
    where theirs excludes zero or lies within ±δ. A Δ right at −δ is not decided: it stops where the rest of the
    pool would decide it less than one time in ten, or, without that rule, at the pool's end."""
    design = Design.for_pool(4000, MARGIN)
    rng = np.random.default_rng(5)
    edge = rng.choice([-1.0, 0.0, 1.0], size=4000, p=[0.06, 0.9, 0.04])  # Δ = −δ
    decision = design.run(lambda count: edge[:count])
    assert decision.reason == "the pool would not decide" and decision.low < -MARGIN < decision.high
    assert decision.examples < 4000 and not decision.decided
    whole = dataclasses.replace(design, futility=0.0).run(lambda count: edge[:count])
    assert whole.reason == "examples ran out" and whole.examples == 4000 and whole.looks == design.grid
    same = rng.choice([-1.0, 0.0, 1.0], size=4000, p=[0.05, 0.9, 0.05])  # two choices alike: on par within ±δ
    compared = design.run(lambda count: same[:count], question=COMPARISON)
    assert compared.decided and -MARGIN < compared.low and compared.high < MARGIN


@pytest.mark.parametrize("question", [NON_INFERIORITY, COMPARISON])
@pytest.mark.parametrize(
    ("mean", "discordant", "count"), [(-0.017, 0.2, 1824), (-0.01, 0.1, 912), (0.0, 0.4, 432), (-0.03, 0.1, 288)]
)
def test_the_chance_the_pool_decides_is_that_of_a_monte_carlo_of_its_rest(question, mean, discordant, count):
    """:meth:`Design.would_decide` in closed form against 50,000 draws: Δ from the normal the first ``count``
    examples give it (flat prior), the rest of the pool's mean given Δ, the final interval at 1.96 standard errors,
    and the question's rule (:func:`attnlens.analysis.margin.decides`) read off each draw."""
    design, cap, rng = Design.for_pool(4000, MARGIN), 4000, np.random.default_rng(11)
    total, squares = mean * count, discordant * count
    variance = float(_spread(count, total, squares))
    delta = rng.normal(mean, np.sqrt(variance / count), 50_000)
    rest = rng.normal(delta, np.sqrt(variance / (cap - count)))
    final = (total + rest * (cap - count)) / cap
    half = Z * np.sqrt(variance / (cap + 2))
    drawn = np.mean([decides(question, value - half, value + half, MARGIN) for value in final])
    assert design.would_decide(question, count, cap, total, squares) == pytest.approx(drawn, abs=0.01)
