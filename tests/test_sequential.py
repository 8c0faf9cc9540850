"""The sequential rule: its boundaries against published ones and a Monte Carlo of random walks,
and its intervals' coverage under optional stopping on simulated paired outcomes of known Δ."""

from __future__ import annotations

import numpy as np
import pytest

from attnlens.analysis.sequential import ALPHA, Design, boundaries, continuation, looks_for, spending

# Published two-sided α = 0.05 constants (Pocock 1977; O'Brien & Fleming 1979; Jennison & Turnbull 2000, tables 2.1, 2.3).
PUBLISHED = [
    ("Pocock, 2 looks", np.full(2, 2.178), 2),
    ("Pocock, 5 looks", np.full(5, 2.413), 5),
    ("O'Brien-Fleming, 5 looks", 2.040 * np.sqrt(5 / np.arange(1, 6)), 5),
]


@pytest.mark.parametrize(("name", "bounds", "looks"), PUBLISHED, ids=[name for name, _, _ in PUBLISHED])
def test_integration_reproduces_published_boundaries(name, bounds, looks):
    """The published constants are rounded to 3 decimals: their α is 0.05 within about 1e-4."""
    crossed = 1 - continuation(np.arange(1, looks + 1) / looks, bounds)[-1]
    assert abs(crossed - 0.05) < 3e-4, (name, crossed)


def test_boundaries_spend_what_a_monte_carlo_of_random_walks_spends():
    """An independent check of :func:`boundaries`: Gaussian random walks observed at the design's
    looks cross the boundaries by each look with probability α·t² (within Monte Carlo error)."""
    looks = np.array(looks_for(4000))
    fractions = looks / looks[-1]
    bounds = np.array(boundaries(tuple(fractions)))
    rng = np.random.default_rng(1)
    walks = np.cumsum(rng.normal(size=(400_000, len(looks))) * np.sqrt(np.diff(fractions, prepend=0.0)), axis=1)
    crossed = np.maximum.accumulate(np.abs(walks / np.sqrt(fractions)) >= bounds, axis=1).mean(0)
    expected = np.array([spending(t) for t in fractions[:-1]] + [ALPHA])
    error = 4 * np.sqrt(expected * (1 - expected) / len(walks))
    assert np.all(np.abs(crossed - expected) < error + 1e-4), (crossed, expected)
    assert np.all(np.diff(bounds) < 0)  # each look spends more: the boundaries fall towards 1.96
    assert bounds[-1] > 1.96


def _simulate(delta: float, discordant: float, design: Design, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``reps`` sequential judgements of paired 0/1 outcomes: a change right where the unmodified
    model is wrong with probability (discordant + Δ)/2, the reverse (discordant − Δ)/2. Returns, per
    judgement, whether its interval at the look it stopped at covers Δ, and the examples it used."""
    rng = np.random.default_rng(seed)
    probabilities = [(discordant + delta) / 2, (discordant - delta) / 2, 1 - discordant]
    steps = np.diff(np.array(design.looks), prepend=0)
    counts = np.cumsum(np.stack([rng.multinomial(step, probabilities, size=reps) for step in steps], axis=1), axis=1)
    plus, minus = counts[..., 0], counts[..., 1]
    stopped = np.full(reps, len(design.looks) - 1)
    covered = np.zeros(reps, dtype=bool)
    for look in reversed(range(len(design.looks))):  # the earliest look that stops wins
        mean, half = design.interval_of_sums(
            design.looks[look], plus[:, look] - minus[:, look], plus[:, look] + minus[:, look], look
        )
        stops = (mean - half > 0) | (mean + half < 0) | (half <= design.target) | (look == len(design.looks) - 1)
        stopped = np.where(stops, look, stopped)
        covered = np.where(stops, (mean - half <= delta) & (delta <= mean + half), covered)
    return covered, np.array(design.looks)[stopped]


@pytest.mark.parametrize("discordant", [0.05, 0.2, 0.4])
def test_sequential_intervals_cover_at_the_nominal_rate_and_stop_earlier_for_larger_effects(discordant):
    """Δ in 0, ±0.01, ±0.05; 4,000 judgements each, stopped by the report's rule (zero excluded,
    half-width 0.02, or the examples run out). Coverage is at least 95% up to Monte Carlo error
    (3 standard errors below), and the examples used fall as |Δ| grows."""
    design = Design.for_pool(4000, target=0.02)
    reps = 4000
    used = {}
    for delta in (0.0, 0.01, -0.01, 0.05, -0.05):
        covered, examples = _simulate(delta, discordant, design, reps, seed=int(1000 * (discordant + delta) + 7))
        assert covered.mean() >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / reps), (delta, covered.mean())
        used[delta] = np.mean(examples)
    for small, large in ((0.0, 0.01), (0.01, 0.05), (0.0, -0.01), (-0.01, -0.05)):
        assert used[large] <= used[small], used
    assert used[0.05] < used[0.0] and used[-0.05] < used[0.0]


def test_a_fixed_rule_looking_as_often_would_not_cover():
    """The control that makes the coverage test able to fail: the same looks with the fixed-sample
    1.96 at every look stop early on noise and cover Δ = 0 well below 95%."""
    design = Design.for_pool(4000, target=0.02)
    naive = Design(design.looks, tuple(1.959964 for _ in design.looks), design.target)
    covered, _ = _simulate(0.0, 0.4, naive, 4000, seed=3)
    assert covered.mean() < 0.93


def test_decisions_say_why_they_stopped():
    design = Design.for_pool(1000, target=0.02)
    assert design.looks == (200, 280, 392, 549, 769, 1000)
    rng = np.random.default_rng(0)
    costly = np.where(rng.random(1000) < 0.2, -1.0, 0.0)
    asked = []

    def differences(count: int) -> np.ndarray:
        asked.append(count)
        return costly[:count]

    decision = design.run(differences)
    assert (decision.reason, decision.examples, asked) == ("excludes zero", 200, [200])
    assert decision.high < 0 and decision.decided
    noisy = rng.choice([-1.0, 1.0], size=1000)  # half the examples flip each way: Δ ≈ 0 and a wide interval
    decision = design.run(lambda count: noisy[:count])
    assert decision.reason == "examples ran out" and decision.examples == 1000 and decision.halfwidth > 0.02
    untouched = np.zeros(1000)  # no example changes: the interval narrows to the target, never to zero width
    decision = design.run(lambda count: untouched[:count])
    assert decision.reason == "half-width reached" and 0 < decision.halfwidth <= 0.02
    mean, low, high, half = design.interval(noisy[:200], 0)
    assert np.isclose(high - low, 2 * half) and np.isclose(mean, noisy[:200].mean())
