"""Moments: streaming float64 sums of attention rows, per layer and head, mergeable.

For every (layer, head) — and, with ``queries``, every chosen query position — the sums
are the number of rows, Σx and Σxxᵀ of the rows ``x ∈ R^n`` (the scores of one query
over all keys, or its weights / log-weights), for each of two seeded halves of the
blocks. Eigen analysis, overlap and reconstruction read these sums; no analysis needs
all rows in memory. Moments of two shards add up (``a + b``) to the moments of the
whole, exactly up to float64 summation order.

This module is the one moments engine: :class:`UnitSums` is the accumulator (any subset
of units, on the device that computes the scores, in float64 or float32),
:func:`accumulate_rows` the one loop over batches that feeds it, and :class:`Moments`
/ :class:`HalfMoments` the float64 numpy sums the analyses read.
:func:`compute_moments` runs them in one process; :mod:`attnlens.rows.jobs` runs the
same loop over ranks and passes, with checkpoints.

**Which rows enter.** Only valid entries are data. Pooled over queries (the default),
a row enters only if it sees as many keys as any row of its layer (a *full* row): for
encoders on unpadded blocks that is every row; for causal models it is only the last
query of each block, so use per-query moments there. In a windowed layer (a sliding or
local window shorter than n) a full row sees a whole window of ``w`` keys; its keys enter
in window-relative order, end-aligned on the last ``w`` key coordinates (the row's last
visible key at n − 1), so ``key_count`` marks those ``w`` as the layer's keys. In a causal
model that frame is the key's offset from the query in every layer, windowed or not. Per query position, a row enters over its valid keys (a
causal row of query ``i`` has keys ``0…i``); ``key_count`` records in how many rows
each key was valid, and analyses use the keys valid in every row of the unit (the
"complete" keys: the valid prefix for causal models).

>>> import numpy as np, torch
>>> sums = UnitSums([(0, 0)], n=3, num_heads=1, quantity="scores", queries=None)
>>> rows = torch.tensor([[[[1., 2., 3.], [3., 2., 1.]]]])            # (batch, head, query, key)
>>> sums.add(0, rows, torch.ones(1, 2, 3, dtype=torch.bool), half=np.array([0]))
>>> m = sums.halves([0]).a                                           # float64 Moments of half a
>>> m.count[0, 0, 0].item(), m.sum[0, 0, 0].tolist()
(2.0, [4.0, 4.0, 4.0])
>>> (m + m).count[0, 0, 0].item()
4.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlens.errors import BadFile, BadInput
from attnlens.progress import Progress, progress_bar
from attnlens.rows.sources import ModelRows, StoreRows

QUANTITIES = ("scores", "weights", "log-weights")
LEVELS = ("head", "layer", "model")
ACCUMULATE = {"float64": torch.float64, "float32": torch.float32}
ARRAYS = ("count", "key_count", "sum", "sum_outer")


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
        raise BadInput(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
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
    total: UnitMoments | None = None
    for position, h in members:
        piece: UnitMoments | None = None
        for part in parts:
            sums = UnitMoments(
                np.asarray(part.count[position, h, query]),
                part.key_count[position, h, query],
                part.sum[position, h, query],
                part.sum_outer[position, h, query],
            )
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

    def __add__(self, other: HalfMoments) -> HalfMoments:
        return HalfMoments(self.a + other.a, self.b + other.b)

    def save(self, directory: Path) -> None:
        self.a.save(directory / "moments_a.npz")
        self.b.save(directory / "moments_b.npz")

    @classmethod
    def load(cls, directory: str | Path) -> HalfMoments:
        directory = Path(directory)
        return cls(Moments.load(directory / "moments_a.npz"), Moments.load(directory / "moments_b.npz"))


# ---------------------------------------------------------------------- the accumulator


class UnitSums:
    """Sums for ``units`` (a list of (layer, head), contiguous heads within each layer).

    Tensors, each with a leading axis for the two halves and one for the units:
    ``count`` (2, U, Q) and ``key_count`` (2, U, Q, n) in float64, ``sum`` (2, U, Q, n)
    and ``sum_outer`` (2, U, Q, n, n) in the ``accumulate`` dtype; Q is 1 for pooled
    rows, else the number of query positions. ``head_chunk`` bounds how many heads'
    rows are copied at once (working memory).
    """

    def __init__(
        self,
        units: Iterable[tuple[int, int]],
        *,
        n: int,
        num_heads: int,
        quantity: str,
        queries: Iterable[int] | None,
        accumulate: str = "float64",
        device: str | torch.device = "cpu",
        head_chunk: int | None = None,
    ) -> None:
        if quantity not in QUANTITIES:
            raise BadInput(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
        if accumulate not in ACCUMULATE:
            raise BadInput(f"`accumulate` {accumulate} is unknown; use one of {', '.join(ACCUMULATE)}")
        self.units = [(int(layer), int(head)) for layer, head in units]
        self.n, self.num_heads, self.quantity, self.accumulate = n, num_heads, quantity, accumulate
        self.queries = None if queries is None else tuple(int(q) for q in queries)
        self.device = torch.device(device)
        self.dtype = ACCUMULATE[accumulate]
        self.head_chunk = head_chunk or num_heads
        self._layers = _layer_ranges(self.units)
        self._widths: dict[int, int] = {}  # keys a full row of each layer sees (pooled rows)
        shape = (2, len(self.units), 1 if self.queries is None else len(self.queries))
        self.count = torch.zeros(shape, dtype=torch.float64, device=self.device)
        self.key_count = torch.zeros((*shape, n), dtype=torch.float64, device=self.device)
        self.sum = torch.zeros((*shape, n), dtype=self.dtype, device=self.device)
        self.sum_outer = torch.zeros((*shape, n, n), dtype=self.dtype, device=self.device)

    @property
    def layers(self) -> list[int]:
        """The layers this group needs, in order."""
        return sorted(self._layers)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).numel() * getattr(self, name).element_size() for name in ARRAYS)

    # ------------------------------------------------------------------ accumulation
    def add(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, half: np.ndarray) -> None:
        """Add one layer of a batch: ``scores`` (batch, head, n, n) on any device and in any
        dtype, ``valid`` (batch, n, n), ``half`` (batch,) the half (0/1) of each sequence.

        Only the rows that enter are copied out of ``scores``, ``head_chunk`` heads at a
        time: the chosen query positions, or for pooled rows those whose every key is
        valid (all rows of an encoder, the last row of each block of a causal model).
        """
        if layer not in self._layers:
            return
        if scores.shape[-1] != self.n or scores.shape[1] != self.num_heads:
            raise BadInput(
                f"scores of shape {tuple(scores.shape)} do not fit these sums' n = {self.n} and {self.num_heads} heads"
            )
        first, last, position = self._layers[layer]
        source = scores.device
        for which in (0, 1):
            chosen = np.flatnonzero(half == which)
            if len(chosen) == 0:
                continue
            sequences = torch.from_numpy(chosen).to(source)
            if self.queries is None:
                sequence_of, query_of, key_of = self._full_rows(layer, valid.to(source)[sequences])
                sequence_of = sequences[sequence_of]
                if len(sequence_of) == 0:
                    continue
            else:
                query_of = torch.tensor(self.queries, device=source)
            for start in range(first, last, self.head_chunk):
                stop = min(start + self.head_chunk, last)
                heads = torch.arange(start, stop, device=source)
                units = slice(position + start - first, position + stop - first)
                if self.queries is None:
                    # (rows, heads, width): each full row's visible keys, end-aligned (see _full_rows)
                    if key_of.shape[-1] == self.n:  # every key: a plain gather of whole rows
                        rows = scores[sequence_of[:, None], heads[None, :], query_of[:, None]]
                    else:
                        rows = scores[
                            sequence_of[:, None, None], heads[None, :, None], query_of[:, None, None], key_of[:, None, :]
                        ]
                    keys = torch.ones(rows.shape[0], 1, rows.shape[-1], dtype=torch.bool, device=self.device)  # all visible
                    x = row_values(rows.to(self.device)[:, :, None], keys, self.quantity, dtype=self.dtype)[:, :, 0]
                    self._add_pooled(which, units, x.transpose(0, 1))
                else:
                    rows = scores[sequences[:, None, None], heads[None, :, None], query_of[None, None, :]].to(self.device)
                    keys = valid[sequences.to(valid.device)][:, query_of.to(valid.device)].to(self.device)  # (batch, Q, k)
                    self._add_per_query(which, units, row_values(rows, keys, self.quantity, dtype=self.dtype), keys)

    def _full_rows(self, layer: int, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sequence, query, keys) of every full row of ``layer`` in ``valid`` (batch, q, k).

        A full row sees as many keys as any row of its layer can (its width ``w``): every key
        of an encoder, the last query of a causal block, or a whole window in a windowed
        layer (sliding or local attention shorter than n). ``keys`` (rows, w) are its visible
        keys in order, which land end-aligned on the last ``w`` of the n key coordinates; with
        ``w = n`` that is every key where it is, as before windows existed. The width is fixed
        by the first batch a layer sees: a later batch whose rows see more keys is refused
        rather than mixed.
        """
        counts = valid.sum(-1)  # (batch, q)
        width = self._widths.setdefault(layer, int(counts.max()) if counts.numel() else 0)
        if counts.numel() and int(counts.max()) > width:
            raise BadInput(
                f"rows of layer {layer} see up to {int(counts.max())} keys in one batch but {width} in the first; "
                "pooled rows need blocks of one length without padding (use per-query rows)"
            )
        sequence_of, query_of = (counts == width).nonzero(as_tuple=True)
        first = valid[sequence_of, query_of].float().argmax(-1)  # the first visible key of each row
        key_of = first[:, None] + torch.arange(width, device=valid.device)
        contiguous = valid[sequence_of[:, None], query_of[:, None], key_of.clamp(max=valid.shape[-1] - 1)].all(-1)
        if not bool(contiguous.all()):
            raise BadInput(f"the visible keys of layer {layer}'s rows are not one run; use per-query rows")
        return sequence_of, query_of, key_of

    def _add_pooled(self, which: int, units: slice, rows: torch.Tensor) -> None:
        """``rows`` (heads, rows, w): full rows of each head, added on the last ``w`` keys."""
        tail = slice(self.n - rows.shape[-1], self.n)
        self.count[which, units, 0] += rows.shape[1]
        self.key_count[which, units, 0, tail] += rows.shape[1]
        self.sum[which, units, 0, tail] += rows.sum(1)
        self.sum_outer[which, units, 0, tail, tail] += torch.bmm(rows.transpose(1, 2), rows)

    def _add_per_query(self, which: int, units: slice, x: torch.Tensor, valid: torch.Tensor) -> None:
        """``x`` (batch, heads, Q, k) rows of the chosen queries, ``valid`` (batch, Q, k)."""
        rows = x.permute(1, 2, 0, 3)  # (heads, Q, batch, k)
        self.count[which, units] += x.shape[0]
        self.key_count[which, units] += valid.sum(0).to(torch.float64)[None]
        self.sum[which, units] += rows.sum(2)
        self.sum_outer[which, units] += torch.matmul(rows.transpose(-1, -2), rows)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, np.ndarray]:
        """The four sums as numpy arrays on the CPU (views when already there)."""
        return {name: getattr(self, name).detach().cpu().numpy() for name in ARRAYS}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from saved sums (of the same units and settings)."""
        for name in ARRAYS:
            target = getattr(self, name)
            if tuple(arrays[name].shape) != tuple(target.shape):
                raise BadFile(f"the saved {name} has shape {tuple(arrays[name].shape)}, these sums {tuple(target.shape)}")
            target.copy_(torch.from_numpy(np.asarray(arrays[name])))

    def halves(self, layers: Iterable[int]) -> HalfMoments:
        """The sums as float64 :class:`Moments` of ``layers`` × all heads (units this group
        does not hold stay zero)."""
        layers = tuple(layers)
        state = self.state()
        halves = [Moments.empty(self.quantity, self.n, layers, self.num_heads, self.queries) for _ in range(2)]
        for index, (layer, head) in enumerate(self.units):
            for which, moments in enumerate(halves):
                for name in ARRAYS:
                    getattr(moments, name)[layers.index(layer), head] = state[name][which, index]
        return HalfMoments(*halves)


def _layer_ranges(units: list[tuple[int, int]]) -> dict[int, tuple[int, int, int]]:
    """``{layer: (first head, last head + 1, position of the first head among the units)}``.

    >>> _layer_ranges([(0, 10), (0, 11), (1, 0), (1, 1)])
    {0: (10, 12, 0), 1: (0, 2, 2)}
    """
    ranges: dict[int, tuple[int, int, int]] = {}
    for position, (layer, head) in enumerate(units):
        if layer not in ranges:
            ranges[layer] = (head, head + 1, position)
        else:
            first, last, start = ranges[layer]
            if head != last or position != start + last - first:
                # A bug, not bad input: units come from attnlens.rows.budgets.plan_units, which keeps each layer's heads together.
                raise AssertionError(
                    f"units must hold contiguous heads of each layer; got layer {layer} head {head} after {last - 1}"
                )
            ranges[layer] = (first, last + 1, start)
    return ranges


# ---------------------------------------------------------------------- the pipeline


def check_rows_for_per_query(num_seqs: int, n: int, queries: Iterable[int] | None) -> None:
    """Per-query moments have one row per sequence: a full-rank n×n estimate needs n + 1 of them."""
    if queries is not None and num_seqs < n + 1:
        raise BadInput(
            f"per-query moments from {num_seqs} sequences cannot estimate a {n}x{n} covariance; they need at least "
            f"{n + 1} sequences (one row per sequence and query position): extract more, or use pooled rows"
        )


class _LayersDone(Exception):
    """Stops a forward pass once the last layer the sums need has been added."""


def accumulate_rows(
    rows: StoreRows | ModelRows,
    sums: UnitSums,
    sequences: np.ndarray,
    half: np.ndarray,
    *,
    batch_size: int,
    after_batch: Callable[[np.ndarray], None] | None = None,
) -> None:
    """Add the rows of ``sequences`` (in order, ``batch_size`` at a time) to ``sums``.

    ``half`` (num_seqs,) gives each sequence's half. A model's forward pass stops after
    the last layer the sums need. ``after_batch(chunk)`` runs after each batch (progress,
    checkpoints). This is the one loop of every moments computation: in memory
    (:func:`compute_moments`) and in sharded, resumable jobs (:mod:`attnlens.rows.jobs`).
    """
    layers = sums.layers
    last = layers[-1]

    def consume(layer: int, scores: torch.Tensor, valid: torch.Tensor, chunk: np.ndarray) -> None:
        sums.add(layer, scores, valid, half[chunk])
        if layer == last:
            raise _LayersDone  # later layers are not needed: skip their compute

    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        try:
            rows.for_each_batch(chunk, layers, consume, batch_size=len(chunk), progress=False, to_cpu=False)
        except _LayersDone:
            pass
        if after_batch is not None:
            after_batch(chunk)


def compute_moments(
    rows: StoreRows | ModelRows,
    *,
    sequences: np.ndarray | None = None,
    quantity: str = "scores",
    queries: Iterable[int] | None = None,
    layers: Iterable[int] | None = None,
    batch_size: int = 32,
    seed: int = 0,
    progress: Progress = True,
) -> HalfMoments:
    """Moments of the rows of ``sequences`` (default all), split into two seeded halves, in one process.

    From a model, each layer's scores are folded into the sums as the layer is
    computed, so memory does not grow with the number of sequences. The halves are
    assigned over ``sequences`` with ``seed``.
    """
    layers = rows.check_layers(layers)
    sequences = np.arange(rows.num_seqs) if sequences is None else np.sort(np.asarray(sequences))
    queries = None if queries is None else tuple(queries)
    check_rows_for_per_query(len(sequences), rows.n, queries)
    device = rows.model.device if isinstance(rows, ModelRows) else torch.device("cpu")
    sums = UnitSums(
        [(layer, head) for layer in layers for head in range(rows.num_heads)],
        n=rows.n,
        num_heads=rows.num_heads,
        quantity=quantity,
        queries=queries,
        device=device,
    )
    half = np.zeros(rows.num_seqs, dtype=np.int64)
    half[sequences] = split_halves(len(sequences), seed)
    with progress_bar(total=len(sequences), desc="moments", unit="seq", enabled=progress) as bar:
        accumulate_rows(rows, sums, sequences, half, batch_size=batch_size, after_batch=lambda chunk: bar.update(len(chunk)))
    return sums.halves(layers)
