"""What partial computation costs, on the pairs each layer computes (:mod:`attnlens.analysis.costs`), and the
ks a reconstruction measures by default."""

from __future__ import annotations

import numpy as np

from attnlens.analysis.costs import cost_on_lengths, exact_cost, partial_cost


def partial_ratio(layer_pairs: np.ndarray, head_dim: int, k: int, lengths: np.ndarray | None = None) -> float:
    """Attention FLOPs with k exact scores per row in every layer, against exact attention: over the pairs
    each layer computes (``layer_pairs``, (layer, n, n)), on texts of these ``lengths`` (their own tokens:
    the valid pairs a system that does not pad computes; default: blocks of n). A row that sees at most k
    keys is exact.

    >>> causal = np.tril(np.ones((128, 128), dtype=bool))[None]
    >>> round(partial_ratio(causal, 256, 16), 3), partial_ratio(causal, 32, 16, np.array([10, 12]))
    (0.643, 1.0)
    """
    lengths = np.array([layer_pairs.shape[-1]]) if lengths is None else np.asarray(lengths)
    partial = sum(cost_on_lengths(lambda p, size: partial_cost(p, head_dim, k, size), pairs, lengths) for pairs in layer_pairs)
    full = sum(cost_on_lengths(lambda p, size: exact_cost(p, head_dim, size), pairs, lengths) for pairs in layer_pairs)
    return float(partial / full)


def default_ks(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself.

    >>> default_ks(20)
    [1, 2, 4, 8, 16, 20]
    """
    ks = [2**p for p in range(n.bit_length()) if 2**p <= n]
    return ks if ks[-1] == n else [*ks, n]
