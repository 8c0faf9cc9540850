"""Judging that stops when it has decided: a sequential design for paired differences.

A change to attention is judged by the mean of per-example paired differences (the change's
outcome minus the unmodified model's: 0/1 correct, or a fraction of fine-tune seeds), against a
margin δ (:mod:`attnlens.analysis.margin`). :class:`Design` looks at 192 examples first, then adds
at most 40% a look, and stops a judgement at the first look where

- its interval answers the question asked (``"decided"``): for a change against the unmodified model
  (non-inferiority) it lies on one side of −δ, wholly above or wholly below; for two choices compared,
  it excludes zero or lies within ±δ; or
- the pool would not decide it (``"the pool would not decide"``): were Δ as likely as the examples so far
  say (their mean and standard error, a flat prior), the interval at the pool's end would answer the
  question less than one time in ten (:data:`FUTILITY`; predictive power, Spiegelhalter, Freedman &
  Blackburn 1986): the rest of the pool would be spent on a judgement that stays undecided; or
- the examples run out (``"examples ran out"``): the pool (``--task-pool``) is the judgement's
  budget, and a judgement undecided there says what deciding would take.

A change far from −δ decides on a few hundred examples; one near it stops once the pool is seen to be
too small for it, and says what deciding would take. Stopping for futility never makes a verdict: it
only leaves undecided some judgements the pool might have decided, so the wrong side of −δ is no more
likely than without it, and the intervals keep their coverage (they hold at every look).

**Early looks spend little α.** The intervals are repeated confidence intervals (Jennison &
Turnbull 1989): the boundary ``c_k`` of each look is set, given the boundaries already used, so
that a Brownian motion crosses one of them with probability ``s_k`` by look k (numerical
integration over the looks, :func:`_density`). Looks before the pool's end spend ``s_k = α·t_k²``
with ``t_k`` the look's share of the pool (the Kim–DeMets power family, Lan & DeMets 1983; Kim &
DeMets 1987): little at the few hundred examples a clear effect needs; the look at the pool's end
spends the rest, with a boundary near 2. All the intervals hold together with probability ``1 − α``,
so the one a judgement stops at covers the true Δ at the nominal rate, whichever rule stopped it,
and a verdict is on the wrong side of −δ at most α/2 of the time. ``tests/test_sequential.py``
measures the coverage and the verdicts by simulation, and ``bench/bench_sequential.py`` the examples
against fixed designs. The standard error adds half a pseudo-example to each of the four cells of
the paired 2×2 table (Agresti & Min 2005), so that a run of identical outcomes (no example changed)
never gives a zero-width interval.

Looks fall on whole chunks of 48 examples (or the pool's end), so every judgement computes the
same slices of the pool, in the same length buckets.

>>> design = Design.for_pool(4000, margin=0.02)
>>> rng = np.random.default_rng(0)
>>> far = np.where(rng.random(4000) < 0.10, -1.0, 0.0)          # a change that costs 10 points
>>> decision = design.run(lambda count: far[:count])
>>> decision.reason, decision.examples, bool(decision.high < -0.02)       # below −δ: does not hold
('decided', 288, True)
>>> near = rng.choice([-1.0, 0.0, 1.0], size=4000, p=[0.05, 0.9, 0.05])   # 10% discordant, Δ = 0
>>> decision = design.run(lambda count: near[:count])
>>> decision.reason, decision.examples, bool(decision.low > -0.02)        # above −δ: holds
('decided', 2592, True)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from attnlens.analysis.margin import NON_INFERIORITY, QUESTIONS, decides

ALPHA = 0.05  # two-sided: the intervals are 95% intervals
RHO = 2.0  # the power of the spending function α·t^ρ: between Pocock-like (1) and O'Brien–Fleming-like (3)
FIRST_LOOK = 192  # examples at the first look: fewer make the normal approximation of a rare flip too rough
GROWTH = 1.4  # a look adds at most 40%: few looks, and a clear effect still stops early
CHUNK = 48  # looks fall on whole chunks (three batches of 16), so every judgement runs the same slices
NEVER = 7.5  # a boundary no path crosses (probability 6e-14): a look with nothing left to spend
PSEUDO = 0.5  # Agresti–Min: half an example added to each cell of the paired 2×2 table, for the standard error
Z = 1.959964  # two-sided 95%
Z_POWER = 0.841621  # 80% power
FUTILITY = 0.1  # stop where the pool's end would decide less often than this (predictive power)
REASONS = ("decided", "the pool would not decide", "examples ran out")
_GRID = np.linspace(-8.0, 8.0, 1201)  # the standardised statistic z, where the densities are integrated


def spending(t: float, alpha: float = ALPHA, rho: float = RHO) -> float:
    """The error probability spent by information fraction ``t``: ``α·t^ρ`` (Kim & DeMets 1987).

    >>> spending(0.5), spending(1.0)
    (0.0125, 0.05)
    """
    return alpha * min(max(t, 0.0), 1.0) ** rho


def continuation(fractions: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """P(|Z_j| < c_j for every look j ≤ k), for each look k, of the standardised statistics of a
    Brownian motion observed at information ``fractions`` (``Z_k = S(t_k)/√t_k``), by numerical
    integration of the densities of the paths that have not crossed (Armitage, McPherson & Rowe 1969).

    Pocock's constant boundary for five equally spaced looks at two-sided α = 0.05 is 2.413:

    >>> p = continuation(np.arange(1, 6) / 5, np.full(5, 2.413))
    >>> round(float(1 - p[-1]), 3)
    0.05
    """
    mass, staying = None, []
    for look, (fraction, bound) in enumerate(zip(fractions, bounds)):
        density = _advance(mass, fractions[look - 1] if look else 0.0, fraction)
        mass = _inside(density, bound)
        staying.append(float(mass[1].sum()))
    return np.array(staying)


def _inside(density: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """The paths with ``|z| < bound``: trapezoid nodes over ``[−bound, bound]`` (the grid's points
    inside and both ends, the density interpolated there) and the probability each carries."""
    nodes = np.concatenate([[-bound], _GRID[np.abs(_GRID) < bound], [bound]])
    widths = np.diff(nodes)
    weights = np.concatenate([[0.0], widths]) / 2 + np.concatenate([widths, [0.0]]) / 2
    return nodes, np.interp(nodes, _GRID, density) * weights


def _advance(mass: tuple[np.ndarray, np.ndarray] | None, before: float, now: float) -> np.ndarray:
    """The density over ``_GRID`` of ``Z(now)``, from the paths still inside at ``before`` (``mass``:
    nodes and probabilities; ``None`` at the first look, where ``Z`` is standard normal), as
    ``Z(now)·√now = Z(before)·√before + N(0, now − before)``."""
    if mass is None:
        return _normal(_GRID)
    nodes, probability = mass
    spread = math.sqrt(now - before)
    kernel = _normal((_GRID[:, None] * math.sqrt(now) - nodes[None, :] * math.sqrt(before)) / spread)
    return kernel @ probability * math.sqrt(now) / spread


def _normal(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


@functools.lru_cache(maxsize=16384)
def _paths(history: tuple[tuple[int, float], ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The paths still inside every boundary of ``history`` ((examples, boundary) per look), as
    :func:`_inside` gives them; ``None`` before the first look. Cached: judgements that looked at the
    same counts with the same boundaries share their integration."""
    if not history:
        return None
    *earlier, (count, bound) = history
    return _inside(_density(tuple(earlier), count), bound)


@functools.lru_cache(maxsize=16384)
def _density(history: tuple[tuple[int, float], ...], count: int) -> np.ndarray:
    """The density over ``_GRID`` of the standardised statistic at ``count`` examples, of the paths
    that stayed inside the boundaries of ``history`` (the statistic is a Brownian motion in the
    number of examples, so counts serve as information directly)."""
    return _advance(_paths(history), history[-1][0] if history else 0, count)


@functools.lru_cache(maxsize=16384)
def _boundary(history: tuple[tuple[int, float], ...], count: int, staying: float) -> float:
    """The boundary at a look at ``count`` examples after the looks of ``history`` that keeps
    probability ``staying`` of the paths inside; :data:`NEVER` where nothing is left to spend at
    this look (so nothing stops here)."""
    density = _density(history, count)
    if _inside(density, NEVER)[1].sum() <= staying:
        return NEVER
    return float(optimize.brentq(lambda c: _inside(density, c)[1].sum() - staying, 0.1, NEVER, xtol=1e-8))


def cuts(available: int, chunk: int = CHUNK) -> tuple[int, ...]:
    """Every count a look may fall on, whatever the margin: whole chunks, and the pool's end.

    >>> cuts(200)
    (48, 96, 144, 192, 200)
    """
    return (*range(chunk, available, chunk), available)


def _chunks(count: float, chunk: int) -> int:
    """``count`` rounded up to a whole number of chunks."""
    return int(math.ceil(count / chunk - 1e-9)) * chunk


@dataclass(frozen=True)
class Decision:
    """A sequential judgement: the mean paired difference over the ``examples`` it used, its repeated
    confidence interval (``low``, ``high``; half-width ``halfwidth``, the boundary ``bound`` times
    the standard error), the ``look`` it stopped at and why (``reason``, one of :data:`REASONS`),
    and the examples and boundary of every look it made (``looks``, ``bounds``)."""

    mean: float
    low: float
    high: float
    halfwidth: float
    examples: int
    look: int
    bound: float
    reason: str
    looks: tuple[int, ...] = ()
    bounds: tuple[float, ...] = ()

    @property
    def decided(self) -> bool:
        """Whether the interval answers the question the judgement asked."""
        return self.reason == "decided"


@dataclass(frozen=True)
class Design:
    """How a task with ``available`` held-out examples judges a change sequentially against the
    ``margin`` (a fraction of accuracy): see the module docstring. Looks fall on whole ``chunk``\\ s
    of examples (or the pool's end), so every judgement computes the same slices of the pool
    (:attr:`cuts`)."""

    available: int
    margin: float
    alpha: float = ALPHA
    futility: float = FUTILITY
    first: int = FIRST_LOOK
    growth: float = GROWTH
    chunk: int = CHUNK

    @classmethod
    def for_pool(cls, available: int, margin: float, **options) -> Design:
        """The design for a task with ``available`` held-out examples (``options``: the other fields)."""
        return cls(available, margin, **options)

    @property
    def cuts(self) -> tuple[int, ...]:
        """Every count a look may fall on (:func:`cuts`)."""
        return cuts(self.available, self.chunk)

    def interval(self, differences: np.ndarray, bound: float) -> tuple[float, float, float, float]:
        """(mean, low, high, half-width) of the paired ``differences`` with boundary ``bound``."""
        values = np.asarray(differences, dtype=np.float64)
        mean, halfwidth = self.interval_of_sums(len(values), values.sum(), np.square(values).sum(), bound)
        return float(mean), float(mean - halfwidth), float(mean + halfwidth), float(halfwidth)

    @staticmethod
    def interval_of_sums(count, total, squares, bound):
        """(mean, half-width) from the count, sum and sum of squares of the differences (numbers or
        arrays of them): the half-width is ``bound`` times the standard error, with :data:`PSEUDO`
        examples added to each cell of the 2×2 table."""
        return total / count, bound * np.sqrt(_spread(count, total, squares) / (count + 4 * PSEUDO))

    def run(
        self, differences: Callable[[int], np.ndarray], available: int | None = None, question: str = NON_INFERIORITY
    ) -> Decision:
        """Judge sequentially: ``differences(count)`` gives the paired differences of the first
        ``count`` examples (computing only those not yet computed), called once per look until one
        of the stopping rules holds. ``available`` caps the examples that may be used (the design's
        own at most): the look that reaches it spends the rest of α and ends the judgement.
        ``question``: ``"non-inferiority"`` (a change against the unmodified model, against −margin) or
        ``"comparison"`` (two choices: zero excluded, or within ±margin), :mod:`attnlens.analysis.margin`."""

        def sums(count: int) -> tuple[float, float]:
            values = np.asarray(differences(count), dtype=np.float64)
            return float(values.sum()), float(np.square(values).sum())

        return self.run_on_sums(sums, available, question)

    def run_on_sums(
        self, sums: Callable[[int], tuple[float, float]], available: int | None = None, question: str = NON_INFERIORITY
    ) -> Decision:
        """:meth:`run`, given ``sums(count)``: the sum and the sum of squares of the first ``count``
        differences (a simulation draws these without drawing every example)."""
        assert question in QUESTIONS, question  # only a bug in attnlens asks another
        cap = self.available if available is None else max(1, min(available, self.available))
        history: tuple[tuple[int, float], ...] = ()
        for count in (look for look in (*self.grid, cap) if look <= cap):
            total, squares = sums(count)
            last = count >= cap  # the look at the pool's end (or the cap) spends the rest of α
            bound = _boundary(history, count, 1 - (self.alpha if last else spending(count / self.available, self.alpha)))
            mean, half = self.interval_of_sums(count, total, squares, bound)
            history += ((count, bound),)
            decided = decides(question, mean - half, mean + half, self.margin)
            futile = not (decided or last) and self.would_decide(question, count, cap, total, squares) < self.futility
            if decided or futile or last:
                looks, bounds = zip(*history)
                reason = REASONS[0] if decided else REASONS[1] if futile else REASONS[2]
                return Decision(mean, mean - half, mean + half, half, count, len(history) - 1, bound, reason, looks, bounds)
        raise AssertionError("the cap is a look")  # only a bug in attnlens reaches here

    def would_decide(self, question: str, count: int, cap: int, total: float, squares: float) -> float:
        """The probability that the look at ``cap`` examples answers ``question``, given the first ``count``
        differences (their sum ``total`` and sum of squares ``squares``): the final mean drawn from its predictive
        distribution under a flat prior on Δ, N(mean, σ²(cap − count)/(cap·count)), and the final interval's
        half-width taken as 1.96 standard errors (the last boundary is a little wider: this errs towards going on).

        >>> design = Design.for_pool(4000, margin=0.02)
        >>> round(design.would_decide("non-inferiority", 1824, 4000, -0.017 * 1824, 0.21 * 1824), 2)  # near −δ, wide
        0.09
        >>> round(design.would_decide("non-inferiority", 192, 4000, 0.0, 0.05 * 192), 2)  # Δ ≈ 0, 5% discordant
        0.83
        """
        variance = float(_spread(count, total, squares))
        mean, half = total / count, Z * math.sqrt(variance / (cap + 4 * PSEUDO))
        spread = max(math.sqrt(variance * (cap - count) / (cap * count)), 1e-12)

        def above(value: float) -> float:  # P(final mean > value)
            return 0.5 * math.erfc((value - mean) / (spread * math.sqrt(2)))

        if question == NON_INFERIORITY:  # the final interval wholly above or wholly below −δ
            return above(-self.margin + half) + 1 - above(-self.margin - half)
        if self.margin >= 2 * half:  # an interval that holds zero lies within ±δ: every final mean decides
            return 1.0
        # zero excluded (|mean| > h), or within ±δ (|mean| < δ − h): two disjoint regions
        return above(half) + 1 - above(-half) + max(above(-(self.margin - half)) - above(self.margin - half), 0.0)

    @property
    def grid(self) -> tuple[int, ...]:
        """The early looks: ``first``, then ×``growth`` each (in whole chunks), and the pool's end.

        >>> Design.for_pool(1000, 0.02).grid
        (192, 288, 432, 624, 912, 1000)
        """
        looks = [min(self.first, self.available)]
        while looks[-1] < self.available:
            looks.append(min(_chunks(looks[-1] * self.growth, self.chunk), self.available))
        return tuple(looks)


def _spread(count, total, squares):
    """The variance of one paired difference, with :data:`PSEUDO` examples in each cell of the 2×2 table
    (half a +1, half a −1 and one 0)."""
    pseudo = 4 * PSEUDO
    return np.maximum((squares + 2 * PSEUDO) / (count + pseudo) - (total / (count + pseudo)) ** 2, 0.0)
