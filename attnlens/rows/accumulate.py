"""Moment sums of a group of (layer, head) units, kept as torch tensors on one device.

:class:`attnlens.rows.moments.Moments` holds the sums of every unit as float64 numpy arrays,
which is what the analyses read. A scaled-out run needs two more things, which
:class:`UnitSums` adds: sums of only some units (a memory budget splits the heads among
processes and passes) and sums that live where the scores are computed (a GPU), in
float64 or float32. The arithmetic is that of ``Moments`` (pooled rows where every key
is valid, or one row per chosen query position over its valid keys), for both split
halves at once; :meth:`UnitSums.halves` turns the sums back into ``Moments``.

>>> import numpy as np, torch
>>> sums = UnitSums([(0, 1)], n=3, num_heads=2, quantity="scores", queries=None)
>>> scores = torch.arange(18, dtype=torch.float32).reshape(1, 2, 3, 3)   # (batch, head, query, key)
>>> sums.add(0, scores, torch.ones(1, 3, 3, dtype=torch.bool), half=np.array([1]))
>>> sums.count[:, 0, 0].tolist(), sums.sum[1, 0, 0].tolist()              # head 1's three rows, in half 1
([0.0, 3.0], [36.0, 39.0, 42.0])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from attnlens.rows.budgets import ACCUMULATE
from attnlens.errors import AttnlensError
from attnlens.rows.moments import QUANTITIES, HalfMoments, Moments, row_values

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
ARRAYS = ("count", "key_count", "sum", "sum_outer")


class UnitSums:
    """Sums for ``units`` (a list of (layer, head), contiguous heads within each layer).

    Tensors, each with a leading axis for the two halves and one for the units:
    ``count`` (2, U, Q) and ``key_count`` (2, U, Q, n) in float64, ``sum`` (2, U, Q, n)
    and ``sum_outer`` (2, U, Q, n, n) in the ``accumulate`` dtype; Q is 1 for pooled
    rows, else the number of query positions. ``head_chunk`` bounds how many heads'
    rows are copied at once (working memory).
    """

    def __init__(
        self, units: Iterable[tuple[int, int]], *, n: int, num_heads: int, quantity: str,
        queries: Iterable[int] | None, accumulate: str = "float64", device: str | torch.device = "cpu",
        head_chunk: int | None = None,
    ) -> None:
        if quantity not in QUANTITIES:
            raise AttnlensError(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
        if accumulate not in ACCUMULATE:
            raise AttnlensError(f"`accumulate` {accumulate} is unknown; use one of {', '.join(ACCUMULATE)}")
        self.units = [(int(layer), int(head)) for layer, head in units]
        self.n, self.num_heads, self.quantity, self.accumulate = n, num_heads, quantity, accumulate
        self.queries = None if queries is None else tuple(int(q) for q in queries)
        self.device = torch.device(device)
        self.dtype = _DTYPES[accumulate]
        self.head_chunk = head_chunk or num_heads
        self._layers = _layer_ranges(self.units)
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
            raise ValueError(f"scores of shape {tuple(scores.shape)} do not fit n={self.n}, heads={self.num_heads}")
        first, last, position = self._layers[layer]
        source = scores.device
        for which in (0, 1):
            chosen = np.flatnonzero(half == which)
            if len(chosen) == 0:
                continue
            sequences = torch.from_numpy(chosen).to(source)
            if self.queries is None:
                # (sequence, query) of every full row; rows of one query position are (sequence, position).
                sequence_of, query_of = valid.to(source)[sequences].all(-1).nonzero(as_tuple=True)
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
                    rows = scores[sequence_of[:, None], heads[None, :], query_of[:, None]].to(self.device)  # (rows, heads, k)
                    keys = valid[sequence_of.to(valid.device), query_of.to(valid.device)].to(self.device)  # (rows, k), all True
                    x = row_values(rows[:, :, None], keys[:, None], self.quantity, dtype=self.dtype)[:, :, 0]
                    self._add_pooled(which, units, x.transpose(0, 1))
                else:
                    rows = scores[sequences[:, None, None], heads[None, :, None], query_of[None, None, :]].to(self.device)
                    keys = valid[sequences.to(valid.device)][:, query_of.to(valid.device)].to(self.device)  # (batch, Q, k)
                    self._add_per_query(which, units, row_values(rows, keys, self.quantity, dtype=self.dtype), keys)

    def _add_pooled(self, which: int, units: slice, rows: torch.Tensor) -> None:
        """``rows`` (heads, rows, k): full-length rows of each head."""
        self.count[which, units, 0] += rows.shape[1]
        self.key_count[which, units, 0] += rows.shape[1]
        self.sum[which, units, 0] += rows.sum(1)
        self.sum_outer[which, units, 0] += torch.bmm(rows.transpose(1, 2), rows)

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
                raise ValueError(f"{name}: saved shape {arrays[name].shape}, expected {tuple(target.shape)}")
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
                raise ValueError(f"units must hold contiguous heads of each layer; got layer {layer} head {head} after {last - 1}")
            ranges[layer] = (first, last + 1, start)
    return ranges
