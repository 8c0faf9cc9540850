"""What attention costs: FLOPs counted on the (query, key) pairs each layer's attention computes.

The one cost model of attnlens: the plan's choices, its uniform rivals and random allocations, the
reconstruction's ratios and the report's cells are all counted here. A layer computes the rows of
its own structure, ``pairs`` (n, n) boolean: every key (an encoder), the keys at or before the
query (causal), its window (sliding or local attention), and on a text of L < n tokens its first L
rows over its first L keys (no padding). A row whose query sees ``m`` keys costs, in
multiply-adds ×2 of one head with head size ``d``:

- exact: QKᵀ ``2·m·d`` + softmax ``3·m`` + weights·V ``2·m·d``;
- partial(k), k exact scores and the rest rebuilt by an affine map: ``2·k·d`` + the map
  ``2·k·(m − k) + (m − k)`` + softmax ``3·m`` + weights·V ``2·m·d``; a row that sees at most k keys
  is computed exactly, at the exact cost;
- a mask that keeps some pairs (a window): exact attention over the pairs it keeps of those the row sees.

So a choice that keeps every pair a layer computes costs what exact attention costs: it is no saving.

>>> n = 128
>>> causal = np.tril(np.ones((n, n), dtype=bool))
>>> round(partial_cost(causal, 256, 16) / exact_cost(causal, 256), 3)                   # k = 16 of a causal row
0.643
>>> round(kept_cost(causal, band(n, 126, causal=True), 256) / exact_cost(causal, 256), 3)   # a window wider than most rows
1.0
>>> every = np.ones((n, n), dtype=bool)
>>> round(partial_cost(every, 256, 16) / exact_cost(every, 256), 3)                     # the same k, bidirectional
0.592
"""

from __future__ import annotations

import numpy as np


def every_pair(n: int) -> np.ndarray:
    """(n, n): the pairs of an encoder layer without a window (every query sees every key)."""
    return np.ones((n, n), dtype=bool)


def band(n: int, width: int, *, causal: bool) -> np.ndarray:
    """(n, n): the keys within ``width`` of each query (at or before it when ``causal``): a window's keep mask.

    >>> band(4, 1, causal=True).astype(int).tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    offset = np.arange(n)[:, None] - np.arange(n)[None, :]
    return (offset >= 0) & (offset <= width) if causal else np.abs(offset) <= width


def row_keys(pairs: np.ndarray, length: int | None = None) -> np.ndarray:
    """How many keys each query of a text of ``length`` tokens sees (default: all n): ``pairs``' first
    ``length`` rows over its first ``length`` keys, the rows a layer computes on that text.

    >>> row_keys(np.tril(np.ones((4, 4), dtype=bool)), 3).tolist()
    [1, 2, 3]
    """
    pairs = np.asarray(pairs, dtype=bool)
    length = pairs.shape[-1] if length is None else int(length)
    return pairs[:length, :length].sum(-1)


def _exact_rows(keys: np.ndarray, head_dim: int) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.float64)
    return 4 * keys * head_dim + 3 * keys


def exact_cost(pairs: np.ndarray, head_dim: int, length: int | None = None) -> float:
    """FLOPs of one head computed exactly on the rows of ``pairs`` (a text of ``length`` tokens)."""
    return float(_exact_rows(row_keys(pairs, length), head_dim).sum())


def partial_cost(pairs: np.ndarray, head_dim: int, k: int, length: int | None = None) -> float:
    """FLOPs of one head with ``k`` exact scores per row and the rest rebuilt by an affine map."""
    keys = row_keys(pairs, length).astype(np.float64)
    rebuilt = keys - k
    partial = 2 * k * head_dim + 2 * k * rebuilt + rebuilt + 3 * keys + 2 * keys * head_dim
    return float(np.where(keys > k, partial, _exact_rows(keys, head_dim)).sum())


def kept_cost(pairs: np.ndarray, keep: np.ndarray, head_dim: int, length: int | None = None) -> float:
    """FLOPs of one head under a mask that keeps the pairs ``keep`` (n, n): exact attention over the pairs
    it keeps of those the layer computes, as a kernel that skips the rest would spend."""
    return exact_cost(np.asarray(pairs, dtype=bool) & np.asarray(keep, dtype=bool), head_dim, length)


def cost_on_lengths(cost, pairs: np.ndarray, lengths: np.ndarray) -> float:
    """``cost(pairs, length)`` summed over texts of these ``lengths`` (each its own rows, no padding).

    >>> exact = lambda pairs, length: float(row_keys(pairs, length).sum())
    >>> cost_on_lengths(exact, every_pair(4), np.array([2, 2, 4]))         # 4 + 4 + 16 pairs
    24.0
    """
    sizes, counts = np.unique(np.asarray(lengths, dtype=int), return_counts=True)
    return float(sum(count * cost(pairs, int(size)) for size, count in zip(sizes, counts)))


def attention_flops(n: int, head_dim: int, k: int | None = None, *, pairs: np.ndarray | None = None) -> dict[str, float]:
    """One head's attention FLOPs over a block of n tokens: ``full`` (exact) and ``partial`` (k exact keys
    per row), and their ``ratio``, on the pairs the layer computes (``pairs``, default every pair).

    >>> round(attention_flops(128, 64, 32)["ratio"], 3)
    0.818
    >>> round(attention_flops(128, 256, 32, pairs=np.tril(np.ones((128, 128), dtype=bool)))["ratio"], 3)
    0.755
    """
    pairs = every_pair(n) if pairs is None else pairs
    full = exact_cost(pairs, head_dim)
    partial = full if k is None else partial_cost(pairs, head_dim, k)
    return {"full": full, "partial": partial, "ratio": partial / full}


def pairs_attention_flops(n: int, head_dim: int, pairs: int, rank: int, computed: int | None = None) -> dict[str, float]:
    """As :func:`attention_flops`, for pairs mode (whole matrices from a store): ``pairs`` exact scores
    (2·pairs·d) and a rank-``rank`` rebuild of the ``computed`` pairs the layer computes (default n², every
    pair; its causal triangle or window otherwise): 2·pairs·r + 2·computed·r, then softmax and V on them.

    >>> round(pairs_attention_flops(8, 4, pairs=8, rank=2)["ratio"], 3), pairs_attention_flops(8, 4, 8, 2, computed=36)["full"]
    (0.868, 684.0)
    """
    computed = n * n if computed is None else int(computed)
    full = 4.0 * computed * head_dim + 3.0 * computed
    partial = 2 * pairs * head_dim + 2 * pairs * rank + 2 * computed * rank + 3 * computed + 2 * computed * head_dim
    return {"full": full, "partial": float(partial), "ratio": partial / full}
