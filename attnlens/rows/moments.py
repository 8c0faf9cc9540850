"""Moments: streaming float64 sums of attention rows, per layer and head, mergeable.

For every (layer, head) — and, with ``queries``, every chosen query position — a
:class:`Moments` keeps the number of rows, Σx and Σxxᵀ of the rows ``x ∈ R^n`` (the
scores of one query over all keys, or its weights / log-weights). Eigen analysis,
overlap and reconstruction read these sums; no analysis needs all rows in memory.
Moments of two shards add up (``a + b``) to the moments of the whole, exactly up to
float64 summation order.

**Which rows enter.** Only valid entries are data. Pooled over queries (the default),
a row enters only if all ``n`` of its keys are valid: for encoders on unpadded blocks
that is every row; for causal models it is only the last query of each block, so use
per-query moments there. Per query position, a row enters over its valid keys (a
causal row of query ``i`` has keys ``0…i``); ``key_count`` records in how many rows
each key was valid, and analyses use the keys valid in every row of the unit (the
"complete" keys: the valid prefix for causal models).

>>> import torch
>>> from attnlens.rows.moments import Moments
>>> m = Moments.empty("scores", n=3, layers=[0], num_heads=1)
>>> rows = torch.tensor([[[[1., 2., 3.], [3., 2., 1.]]]])            # (batch, head, query, key)
>>> m.accumulate(0, rows, torch.ones(1, 2, 3, dtype=torch.bool))
>>> m.count[0, 0, 0].item(), m.sum[0, 0, 0].tolist()
(2.0, [4.0, 4.0, 4.0])
>>> (m + m).count[0, 0, 0].item()
4.0
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnlens.errors import AttnlensError
from attnlens.rows.sources import ModelRows, StoreRows

QUANTITIES = ("scores", "weights", "log-weights")
LEVELS = ("head", "layer", "model")


def row_values(scores: torch.Tensor, valid: torch.Tensor, quantity: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rows of the chosen quantity in float64 (or ``dtype``), with invalid entries set to 0.

    ``scores`` (batch, head, q, k), ``valid`` (batch, q, k). ``weights`` and
    ``log-weights`` are the softmax (log-softmax) over the valid keys of each row.
    """
    x = scores.to(dtype)
    mask = valid[:, None].expand_as(x)
    if quantity == "weights":
        x = torch.softmax(x.masked_fill(~mask, float("-inf")), dim=-1)
    elif quantity == "log-weights":
        x = torch.log_softmax(x.masked_fill(~mask, float("-inf")), dim=-1)
    elif quantity != "scores":
        raise AttnlensError(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
    return x.masked_fill(~mask, 0.0)


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
    _layer_position: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.layers = tuple(int(layer) for layer in self.layers)
        self.queries = None if self.queries is None else tuple(int(q) for q in self.queries)
        self._layer_position = {layer: position for position, layer in enumerate(self.layers)}

    @classmethod
    def empty(
        cls, quantity: str, n: int, layers: Iterable[int], num_heads: int, queries: Iterable[int] | None = None
    ) -> Moments:
        if quantity not in QUANTITIES:
            raise AttnlensError(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
        layers = tuple(layers)
        queries = None if queries is None else tuple(queries)
        units = (len(layers), num_heads, 1 if queries is None else len(queries))
        return cls(
            quantity, n, layers, num_heads, queries,
            count=np.zeros(units), key_count=np.zeros((*units, n)),
            sum=np.zeros((*units, n)), sum_outer=np.zeros((*units, n, n)),
        )

    @property
    def per_query(self) -> bool:
        return self.queries is not None

    def settings(self) -> dict[str, object]:
        return {"quantity": self.quantity, "n": self.n, "layers": list(self.layers), "num_heads": self.num_heads,
                "queries": None if self.queries is None else list(self.queries)}

    # ------------------------------------------------------------------ accumulation
    def accumulate(self, layer: int, scores: torch.Tensor, valid: torch.Tensor) -> None:
        """Add the rows of one layer for a batch: ``scores`` (batch, head, n, n), ``valid`` (batch, n, n)."""
        if scores.shape[-1] != self.n or scores.shape[1] != self.num_heads:
            raise ValueError(f"rows of shape {tuple(scores.shape)} do not fit moments of n={self.n}, heads={self.num_heads}")
        position = self._layer_position[layer]
        x = row_values(scores, valid, self.quantity)
        if self.queries is None:
            self._add_pooled(position, x, valid)
        else:
            self._add_per_query(position, x, valid)

    def _add_pooled(self, position: int, x: torch.Tensor, valid: torch.Tensor) -> None:
        full = valid.all(-1)  # (batch, q): rows whose every key is valid
        rows = x.transpose(0, 1)  # (head, batch, q, k)
        rows = rows.reshape(self.num_heads, -1, self.n) if bool(full.all()) else rows[:, full]
        count = rows.shape[1]
        if count == 0:
            return
        self.count[position, :, 0] += count
        self.key_count[position, :, 0] += count
        self.sum[position, :, 0] += rows.sum(1).numpy()
        self.sum_outer[position, :, 0] += torch.bmm(rows.transpose(1, 2), rows).numpy()

    def _add_per_query(self, position: int, x: torch.Tensor, valid: torch.Tensor) -> None:
        queries = list(self.queries)
        rows = x[:, :, queries].permute(1, 2, 0, 3)  # (head, Q, batch, k)
        self.count[position] += x.shape[0]
        self.key_count[position] += valid[:, queries].sum(0).to(torch.float64).numpy()[None]
        self.sum[position] += rows.sum(2).numpy()
        self.sum_outer[position] += torch.matmul(rows.transpose(-1, -2), rows).numpy()

    # ------------------------------------------------------------------ combination
    def _check_compatible(self, other: Moments) -> None:
        if self.settings() != other.settings():
            raise AttnlensError(f"cannot add moments with different settings: {self.settings()} and {other.settings()}")

    def __add__(self, other: Moments) -> Moments:
        self._check_compatible(other)
        return Moments(
            self.quantity, self.n, self.layers, self.num_heads, self.queries,
            count=self.count + other.count, key_count=self.key_count + other.key_count,
            sum=self.sum + other.sum, sum_outer=self.sum_outer + other.sum_outer,
        )

    def level(self, level: str) -> Moments:
        """Pool heads (``"layer"``) or heads and layers (``"model"``): rows of the pooled units together."""
        if level == "head":
            return self
        axes = (1,) if level == "layer" else (0, 1)
        if level not in LEVELS:
            raise AttnlensError(f"level {level} is unknown; use one of {', '.join(LEVELS)}")
        pooled = lambda array: array.sum(axis=axes, keepdims=True)
        return Moments(
            self.quantity, self.n, self.layers if level == "layer" else (-1,), 1, self.queries,
            count=pooled(self.count), key_count=pooled(self.key_count), sum=pooled(self.sum), sum_outer=pooled(self.sum_outer),
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
            path, quantity=self.quantity, n=self.n, layers=np.array(self.layers), num_heads=self.num_heads,
            queries=np.array([] if self.queries is None else self.queries), per_query=self.per_query,
            count=self.count, key_count=self.key_count, sum=self.sum, sum_outer=self.sum_outer,
        )

    @classmethod
    def load(cls, path: str | Path) -> Moments:
        try:
            data = np.load(path)
            return cls(
                str(data["quantity"]), int(data["n"]), tuple(data["layers"].tolist()), int(data["num_heads"]),
                tuple(data["queries"].tolist()) if bool(data["per_query"]) else None,
                count=data["count"], key_count=data["key_count"], sum=data["sum"], sum_outer=data["sum_outer"],
            )
        except (OSError, KeyError, ValueError) as error:
            raise AttnlensError(f"cannot read moments from {path} ({error})") from None


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
        return UnitMoments(self.count + other.count, self.key_count + other.key_count, self.sum + other.sum,
                           self.sum_outer + other.sum_outer)

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

    >>> import torch
    >>> m = Moments.empty("scores", n=2, layers=[0, 1], num_heads=2)
    >>> m.accumulate(1, torch.ones(1, 2, 2, 2), torch.ones(1, 2, 2, dtype=torch.bool))
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
        members = [(l, h) for l in range(len(first.layers)) for h in range(first.num_heads)]
    else:
        raise AttnlensError(f"level {level} is unknown; use one of {', '.join(LEVELS)}")
    total: UnitMoments | None = None
    for l, h in members:
        piece: UnitMoments | None = None
        for part in parts:
            sums = UnitMoments(np.asarray(part.count[l, h, query]), part.key_count[l, h, query], part.sum[l, h, query],
                               part.sum_outer[l, h, query])
            piece = sums if piece is None else piece + sums
        total = piece if total is None else total + piece
    return total


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

    def accumulate(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, half: np.ndarray) -> None:
        """Add a batch whose sequences belong to halves ``half`` (batch,) of 0/1."""
        for moments, which in ((self.a, 0), (self.b, 1)):
            chosen = torch.from_numpy(np.flatnonzero(half == which))
            if len(chosen):
                moments.accumulate(layer, scores[chosen], valid[chosen])

    def __add__(self, other: HalfMoments) -> HalfMoments:
        return HalfMoments(self.a + other.a, self.b + other.b)

    def save(self, directory: Path) -> None:
        self.a.save(directory / "moments_a.npz")
        self.b.save(directory / "moments_b.npz")

    @classmethod
    def load(cls, directory: str | Path) -> HalfMoments:
        directory = Path(directory)
        return cls(Moments.load(directory / "moments_a.npz"), Moments.load(directory / "moments_b.npz"))


# ---------------------------------------------------------------------- sources


def check_rows_for_per_query(num_seqs: int, n: int, queries: Iterable[int] | None) -> None:
    """Per-query moments have one row per sequence: a full-rank n×n estimate needs n + 1 of them."""
    if queries is not None and num_seqs < n + 1:
        raise AttnlensError(
            f"per-query moments from {num_seqs} sequences cannot estimate a {n}x{n} covariance; they need at least "
            f"{n + 1} sequences (one row per sequence and query position): extract more, or use pooled rows"
        )


def compute_moments(
    rows: StoreRows | ModelRows,
    *,
    sequences: np.ndarray | None = None,
    quantity: str = "scores",
    queries: Iterable[int] | None = None,
    layers: Iterable[int] | None = None,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> HalfMoments:
    """Moments of the rows of ``sequences`` (default all), split into two seeded halves.

    From a model, each layer's scores are folded into the sums as the layer is
    computed, so memory does not grow with the number of sequences.
    """
    layers = rows.check_layers(layers)
    sequences = np.arange(rows.num_seqs) if sequences is None else np.sort(np.asarray(sequences))
    check_rows_for_per_query(len(sequences), rows.n, queries)
    halves = HalfMoments(*(Moments.empty(quantity, rows.n, layers, rows.num_heads, queries) for _ in range(2)))
    half = np.zeros(rows.num_seqs, dtype=np.int64)
    half[sequences] = split_halves(len(sequences), seed)
    rows.for_each_batch(
        sequences, layers, lambda layer, scores, valid, batch: halves.accumulate(layer, scores, valid, half[batch]),
        batch_size=batch_size, progress=progress, desc="moments",
    )
    return halves
