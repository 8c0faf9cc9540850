"""The one moments engine: the accumulator and the one loop over batches that feeds it.

:class:`UnitSums` is the accumulator (any subset of units, on the device that computes the
scores, in float64 or float32), :func:`accumulate_rows` the one loop over batches, and
:func:`compute_moments` runs them in one process; :mod:`attnlens.rows.jobs` runs the same
loop over ranks and passes, with checkpoints. They give :class:`~attnlens.rows.moments.Moments`.

**Which rows enter.** Only valid entries are data. Pooled over queries (the default), a row
enters only if it sees as many keys as any row of its layer (a *full* row): for encoders on
unpadded blocks that is every row; for causal models it is only the last query of each
block, so use per-query moments there. In a windowed layer (a sliding or local window
shorter than n) a full row sees a whole window of ``w`` keys; its keys enter in
window-relative order, end-aligned on the last ``w`` key coordinates (the row's last visible
key at n − 1), so ``key_count`` marks those ``w`` as the layer's keys. In a causal model that
frame is the key's offset from the query in every layer, windowed or not. Per query
position, a row enters over its valid keys (a causal row of query ``i`` has keys ``0…i``);
``key_count`` records in how many rows each key was valid, and analyses use the keys valid
in every row of the unit (the "complete" keys: the valid prefix for causal models).

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

from collections.abc import Callable, Iterable

import numpy as np
import torch

from attnlens.errors import BadFile, BadInput
from attnlens.progress import Progress, progress_bar
from attnlens.rows.moments import ARRAYS, QUANTITIES, HalfMoments, Moments, split_halves
from attnlens.rows.sources import ModelRows, StoreRows

ACCUMULATE = {"float64": torch.float64, "float32": torch.float32}


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
        most = int(counts.max()) if counts.numel() else 0  # one reduction, one sync with the device
        width = self._widths.setdefault(layer, most)
        if most > width:
            raise BadInput(
                f"rows of layer {layer} see up to {most} keys in one batch but {width} in the first; "
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
