"""Moments: float64 sums of attention rows, per layer and head, mergeable.

For every (layer, head) — and, with ``queries``, every chosen query position — the sums
are the number of rows, Σx and Σxxᵀ of the rows ``x ∈ R^n`` (the scores of one query
over all keys, or its weights / log-weights), for each of two seeded halves of the
blocks. Eigen analysis, overlap and reconstruction read these sums; no analysis needs
all rows in memory. Moments of two shards add up (``a + b``) to the moments of the
whole, exactly up to float64 summation order.

:class:`Moments` / :class:`HalfMoments` are the sums the analyses read, :func:`unit_sums`
one unit's of them. :mod:`attnlens.rows.accumulate` computes them (which rows enter, and
how, is said there).

>>> m = Moments.empty("scores", n=3, layers=[0], num_heads=1)
>>> m.count[0, 0, 0] = 2; m.sum[0, 0, 0] = [4.0, 4.0, 4.0]
>>> (m + m).count[0, 0, 0].item(), (m + m).mean()[0, 0, 0].tolist()
(4.0, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlens.errors import BadFile, BadInput

QUANTITIES = ("scores", "weights", "log-weights")
LEVELS = ("head", "layer", "model")
ARRAYS = ("count", "key_count", "sum", "sum_outer")


@dataclass
class Moments:
    """Row sums for each (layer, head, query unit); see the module docstring.

    Arrays (float64), with ``Q = len(queries)`` per query position or 1 when pooled:
    ``count`` (L, H, Q), ``key_count`` (L, H, Q, n), ``sum`` (L, H, Q, n),
    ``sum_outer`` (L, H, Q, n, n).
    """

    quantity: str
    n: int
    layers: tuple[int, ...]
    num_heads: int
    queries: tuple[int, ...] | None
    count: np.ndarray
    key_count: np.ndarray
    sum: np.ndarray
    sum_outer: np.ndarray

    def __post_init__(self) -> None:
        self.layers = tuple(int(layer) for layer in self.layers)
        self.queries = None if self.queries is None else tuple(int(q) for q in self.queries)

    @classmethod
    def empty(cls, quantity: str, n: int, layers: Iterable[int], num_heads: int, queries: Iterable[int] | None = None) -> Moments:
        if quantity not in QUANTITIES:
            raise BadInput(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
        layers = tuple(layers)
        queries = None if queries is None else tuple(queries)
        units = (len(layers), num_heads, 1 if queries is None else len(queries))
        return cls(
            quantity,
            n,
            layers,
            num_heads,
            queries,
            count=np.zeros(units),
            key_count=np.zeros((*units, n)),
            sum=np.zeros((*units, n)),
            sum_outer=np.zeros((*units, n, n)),
        )

    @property
    def per_query(self) -> bool:
        return self.queries is not None

    def settings(self) -> dict[str, object]:
        return {
            "quantity": self.quantity,
            "n": self.n,
            "layers": list(self.layers),
            "num_heads": self.num_heads,
            "queries": None if self.queries is None else list(self.queries),
        }

    # ------------------------------------------------------------------ combination
    def _check_compatible(self, other: Moments) -> None:
        if self.settings() != other.settings():
            raise BadInput(f"cannot add moments with different settings: {self.settings()} and {other.settings()}")

    def __add__(self, other: Moments) -> Moments:
        self._check_compatible(other)
        return Moments(
            self.quantity,
            self.n,
            self.layers,
            self.num_heads,
            self.queries,
            count=self.count + other.count,
            key_count=self.key_count + other.key_count,
            sum=self.sum + other.sum,
            sum_outer=self.sum_outer + other.sum_outer,
        )

    def level(self, level: str) -> Moments:
        """Pool heads (``"layer"``) or heads and layers (``"model"``): rows of the pooled units together."""
        if level == "head":
            return self
        axes = (1,) if level == "layer" else (0, 1)
        if level not in LEVELS:
            raise BadInput(f"level {level} is unknown; use one of {', '.join(LEVELS)}")
        pooled = lambda array: array.sum(axis=axes, keepdims=True)
        return Moments(
            self.quantity,
            self.n,
            self.layers if level == "layer" else (-1,),
            1,
            self.queries,
            count=pooled(self.count),
            key_count=pooled(self.key_count),
            sum=pooled(self.sum),
            sum_outer=pooled(self.sum_outer),
        )

    # ------------------------------------------------------------------ statistics
    def complete_keys(self) -> np.ndarray:
        """(L, H, Q, n) bool: keys valid in every row of the unit."""
        return _complete_keys(self.count, self.key_count)

    def mean(self) -> np.ndarray:
        """(L, H, Q, n) mean row (0 where the unit has no rows)."""
        return _mean(self.count, self.sum)

    def second_moment(self, centred: bool = True) -> np.ndarray:
        """(L, H, Q, n, n) sample covariance (centred, divided by rows − 1 as numpy.cov and
        scikit-learn's PCA do) or uncentred second moment (divided by rows)."""
        return _second_moment(self.count, self.sum, self.sum_outer, centred)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            quantity=self.quantity,
            n=self.n,
            layers=np.array(self.layers),
            num_heads=self.num_heads,
            queries=np.array([] if self.queries is None else self.queries),
            per_query=self.per_query,
            count=self.count,
            key_count=self.key_count,
            sum=self.sum,
            sum_outer=self.sum_outer,
        )

    @classmethod
    def load(cls, path: str | Path) -> Moments:
        try:
            data = np.load(path)
            return cls(
                str(data["quantity"]),
                int(data["n"]),
                tuple(data["layers"].tolist()),
                int(data["num_heads"]),
                tuple(data["queries"].tolist()) if bool(data["per_query"]) else None,
                count=data["count"],
                key_count=data["key_count"],
                sum=data["sum"],
                sum_outer=data["sum_outer"],
            )
        except (OSError, KeyError, ValueError) as error:
            raise BadFile(f"cannot read moments from {path} ({error})") from None


def _complete_keys(count: np.ndarray, key_count: np.ndarray) -> np.ndarray:
    return (key_count == count[..., None]) & (count[..., None] > 0)


def _mean(count: np.ndarray, sums: np.ndarray) -> np.ndarray:
    return sums / np.maximum(count, 1)[..., None]


def _second_moment(count: np.ndarray, sums: np.ndarray, sum_outer: np.ndarray, centred: bool) -> np.ndarray:
    expanded = count[..., None, None]
    if not centred:
        return sum_outer / np.maximum(expanded, 1)
    mean = _mean(count, sums)
    scatter = sum_outer - expanded * mean[..., :, None] * mean[..., None, :]
    return scatter / np.maximum(expanded - 1, 1)


@dataclass(frozen=True)
class UnitMoments:
    """The sums of one unit (a head, or heads and layers pooled): ``count`` (a 0-d array),
    ``key_count`` and ``sum`` (n,), ``sum_outer`` (n, n); statistics as :class:`Moments`'."""

    count: np.ndarray
    key_count: np.ndarray
    sum: np.ndarray
    sum_outer: np.ndarray

    def __add__(self, other: UnitMoments) -> UnitMoments:
        return UnitMoments(
            self.count + other.count, self.key_count + other.key_count, self.sum + other.sum, self.sum_outer + other.sum_outer
        )

    def complete_keys(self) -> np.ndarray:
        return _complete_keys(self.count, self.key_count)

    def mean(self) -> np.ndarray:
        return _mean(self.count, self.sum)

    def second_moment(self, centred: bool = True) -> np.ndarray:
        return _second_moment(self.count, self.sum, self.sum_outer, centred)


def level_shape(moments: Moments, level: str) -> tuple[int, int, int]:
    """(L, H, Q) of the units at ``level``: heads, layers (heads pooled) or the model."""
    layers, heads, queries = moments.count.shape
    return {"head": (layers, heads, queries), "layer": (layers, 1, queries), "model": (1, 1, queries)}[level]


def unit_sums(parts: Sequence[Moments], level: str, index: tuple[int, int, int]) -> UnitMoments:
    """The sums of one unit at ``level`` over ``parts`` (e.g. both halves): the unit's
    heads are read one at a time, so memory-mapped moments are never loaded whole.

    Heads are added in (layer, head) order, the sum of the parts first, as
    ``(a + b).level(level)`` adds them, so both give the same numbers.

    >>> m = Moments.empty("scores", n=2, layers=[0, 1], num_heads=2)
    >>> m.count[1] += 2                                                   # two rows in each head of layer 1
    >>> float(unit_sums([m, m], "layer", (1, 0, 0)).count), float(unit_sums([m], "model", (0, 0, 0)).count)
    (8.0, 4.0)
    """
    layer, head, query = index
    first = parts[0]
    if level == "head":
        members = [(layer, head)]
    elif level == "layer":
        members = [(layer, h) for h in range(first.num_heads)]
    elif level == "model":
        members = [(position, h) for position in range(len(first.layers)) for h in range(first.num_heads)]
    else:
        raise BadInput(f"level {level} is unknown; use one of {', '.join(LEVELS)}")

    def head_sums(position: int, h: int) -> UnitMoments:  # one head's sums over the parts, added in order
        sums = (
            UnitMoments(
                np.asarray(part.count[position, h, query]),
                part.key_count[position, h, query],
                part.sum[position, h, query],
                part.sum_outer[position, h, query],
            )
            for part in parts
        )
        return functools.reduce(operator.add, sums)

    # one head at a time, in (layer, head) order; parts and members are never empty (parts[0] is read above)
    return functools.reduce(operator.add, (head_sums(position, h) for position, h in members))


def split_halves(num_seqs: int, seed: int) -> np.ndarray:
    """A seeded assignment of each sequence to half 0 or 1 (sizes differ by at most one).

    >>> split_halves(5, seed=0).tolist().count(0) in (2, 3)
    True
    """
    half = np.zeros(num_seqs, dtype=np.int64)
    half[np.random.default_rng(seed).permutation(num_seqs)[1::2]] = 1
    return half


class HalfMoments:
    """Moments of two seeded, disjoint halves of the sequences; ``total`` is their sum.

    The halves give the split-half check of overlap (is a difference between layers
    larger than the difference between two samples of the same layer?) for free.
    """

    def __init__(self, a: Moments, b: Moments) -> None:
        self.a, self.b = a, b

    @property
    def total(self) -> Moments:
        return self.a + self.b

    def __add__(self, other: HalfMoments) -> HalfMoments:
        return HalfMoments(self.a + other.a, self.b + other.b)

    def save(self, directory: Path) -> None:
        self.a.save(directory / "moments_a.npz")
        self.b.save(directory / "moments_b.npz")

    @classmethod
    def load(cls, directory: str | Path) -> HalfMoments:
        directory = Path(directory)
        return cls(Moments.load(directory / "moments_a.npz"), Moments.load(directory / "moments_b.npz"))
