"""Judging that stops when it has decided: a group-sequential design for paired differences.

A change to attention is judged by the mean of per-example paired differences (the change's
outcome minus the unmodified model's: 0/1 correct, or a fraction of fine-tune seeds). Most
changes are far from zero and decide on a few hundred examples; a few are near zero and need
thousands. :class:`Design` adds examples in rounds (``looks``: 200, then ×1.4 each round, up
to the examples the task has) and stops a judgement at the first look where

- its interval excludes zero (``"excludes zero"``), or
- its half-width is at most the target (``"half-width reached"``), or
- the examples run out (``"examples ran out"``).

Looking again and again at the same data would inflate the error rate of a fixed-sample
interval. The intervals here are **repeated confidence intervals** (Jennison & Turnbull 1989)
of a two-sided group-sequential design with the Kim–DeMets power-family α-spending function
``α·t²`` (Lan & DeMets 1983; Kim & DeMets 1987): at look k, with information fraction
``t_k = n_k / n_K``, the interval is ``mean ± c_k · se_k``, and the boundaries ``c_k`` are set
so that a random walk of the normal approximation crosses them with probability ``α·t_k²`` by
look k (:func:`boundaries`, by numerical integration over the looks). All the intervals hold
together with probability ``1 − α``, so the one at whichever look a data-dependent rule stops
covers the true Δ at least at the nominal rate. The standard error adds half a pseudo-example
to each of the four cells of the paired 2×2 table (Agresti & Min 2005), so that a run of
identical outcomes (no example changed) never gives a zero-width interval.

The design is fixed before any outcome is seen: it depends only on how many examples the task
has (``available``), the first look, the growth and α.

>>> design = Design.for_pool(4000, target=0.02)
>>> design.looks[:4], round(design.bounds[-1], 2)
((200, 280, 392, 549), 2.09)
>>> rng = np.random.default_rng(0)
>>> far = np.where(rng.random(4000) < 0.10, -1.0, 0.0)          # a change that costs 10 points
>>> decision = design.run(lambda count: far[:count])
>>> decision.reason, decision.examples
('excludes zero', 200)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

ALPHA = 0.05  # two-sided: the intervals are 95% intervals
RHO = 2.0  # the power of the spending function α·t^ρ: between Pocock-like (1) and O'Brien–Fleming-like (3)
FIRST_LOOK = 200  # examples at the first look: fewer make the normal approximation of a rare flip too rough
GROWTH = 1.4  # each look adds 40%: overshooting the examples a judgement needs costs at most that
PSEUDO = 0.5  # Agresti–Min: half an example added to each cell of the paired 2×2 table, for the standard error
REASONS = ("excludes zero", "half-width reached", "examples ran out")
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


@functools.lru_cache(maxsize=64)
def boundaries(fractions: tuple[float, ...], alpha: float = ALPHA, rho: float = RHO) -> tuple[float, ...]:
    """Two-sided boundaries ``c_k`` that spend ``α·t^ρ`` of the error by each look (the last look
    spends the rest of α), found one look at a time given the earlier ones: the paths still inside
    are carried from look to look, and each boundary cuts their density where the probability of
    staying inside is ``1 − α·t_k^ρ``.

    >>> round(boundaries((1.0,))[0], 3)                   # one look: the fixed-sample 1.96
    1.96
    >>> bounds = boundaries((0.25, 0.5, 1.0))
    >>> bounds[0] > bounds[1] > bounds[2] > 1.96           # early looks spend little: wide intervals
    True
    """
    mass, found = None, []
    for look, fraction in enumerate(fractions):
        density = _advance(mass, fractions[look - 1] if look else 0.0, fraction)
        spent = alpha if look == len(fractions) - 1 else spending(fraction, alpha, rho)
        bound = float(optimize.brentq(lambda c: _inside(density, c)[1].sum() - (1 - spent), 0.1, 7.5, xtol=1e-8))
        found.append(bound)
        mass = _inside(density, bound)
    return tuple(found)


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


def looks_for(available: int, first: int = FIRST_LOOK, growth: float = GROWTH) -> tuple[int, ...]:
    """The examples seen at each look: ``first``, then ×``growth`` each round, ending at ``available``.

    >>> looks_for(1000)
    (200, 280, 392, 549, 769, 1000)
    >>> looks_for(64)
    (64,)
    """
    counts = [min(first, available)]
    while counts[-1] * growth < available:
        counts.append(round(counts[-1] * growth))
    if counts[-1] < available:
        counts.append(available)
    return tuple(counts)


@dataclass(frozen=True)
class Decision:
    """A sequential judgement: the mean paired difference over the ``examples`` it used, its repeated
    confidence interval (``low``, ``high``; half-width ``halfwidth``, the boundary ``bound`` times
    the standard error), the ``look`` it stopped at and why (``reason``, one of :data:`REASONS`)."""

    mean: float
    low: float
    high: float
    halfwidth: float
    examples: int
    look: int
    bound: float
    reason: str

    @property
    def decided(self) -> bool:
        """Whether the interval excludes zero or is as narrow as the target asked."""
        return self.reason != "examples ran out"


@dataclass(frozen=True)
class Design:
    """The looks, their boundaries and the target half-width of a group-sequential judgement; see
    the module docstring."""

    looks: tuple[int, ...]
    bounds: tuple[float, ...]
    target: float
    alpha: float = ALPHA

    @classmethod
    def for_pool(
        cls, available: int, target: float, *, first: int = FIRST_LOOK, growth: float = GROWTH, alpha: float = ALPHA
    ) -> Design:
        """The design for a task with ``available`` held-out examples (all of them at the last look)."""
        looks = looks_for(available, first, growth)
        return cls(looks, boundaries(tuple(count / looks[-1] for count in looks), alpha), target, alpha)

    def interval(self, differences: np.ndarray, look: int) -> tuple[float, float, float, float]:
        """(mean, low, high, half-width) of the paired ``differences`` at ``look`` (0-based)."""
        values = np.asarray(differences, dtype=np.float64)
        mean, halfwidth = self.interval_of_sums(len(values), values.sum(), np.square(values).sum(), look)
        return float(mean), float(mean - halfwidth), float(mean + halfwidth), float(halfwidth)

    def interval_of_sums(self, count, total, squares, look: int):
        """(mean, half-width) from the count, sum and sum of squares of the differences (numbers or
        arrays of them, for many judgements at once): the half-width is the look's boundary times
        the standard error, with :data:`PSEUDO` examples added to each cell of the 2×2 table."""
        pseudo = 4 * PSEUDO  # half a +1, half a −1 and one 0
        adjusted = total / (count + pseudo)
        spread = np.maximum((squares + 2 * PSEUDO) / (count + pseudo) - adjusted**2, 0.0)
        return total / count, self.bounds[look] * np.sqrt(spread / (count + pseudo))

    def run(self, differences: Callable[[int], np.ndarray], available: int | None = None) -> Decision:
        """Judge sequentially: ``differences(count)`` gives the paired differences of the first
        ``count`` examples (computing only those not yet computed), called once per look until one
        of the stopping rules holds. ``available`` caps the examples that may be used: the last look
        within it ends the judgement (a look's interval holds whichever look a rule stops at)."""
        looks = [look for look in self.looks if available is None or look <= available] or [self.looks[0]]
        for look, count in enumerate(looks):
            mean, low, high, halfwidth = self.interval(np.asarray(differences(count), dtype=np.float64), look)
            reason = "excludes zero" if low > 0 or high < 0 else "half-width reached" if halfwidth <= self.target else None
            if reason is not None or look == len(looks) - 1:
                return Decision(mean, low, high, halfwidth, count, look, self.bounds[look], reason or "examples ran out")
        raise AssertionError("unreachable: the last look always decides")
