"""What partial computation costs: attention FLOPs with k exact scores per row, against full attention,
and the ks a reconstruction measures by default."""

from __future__ import annotations

import numpy as np


def attention_flops(n: int, head_dim: int, k: int | None = None) -> dict[str, float]:
    """Multiply-adds ×2 of one head's attention over n queries: full, and with k exact keys.

    Full: QKᵀ (2n²d) + softmax (≈3n²) + weights·V (2n²d). Partial: k scores per query
    (2nkd) + the affine map for the other n − k (2nk(n − k) + n(n − k)) + softmax + V.

    >>> round(attention_flops(128, 64, 32)["ratio"], 3)
    0.818
    """
    full = 4 * n * n * head_dim + 3 * n * n
    if k is None:
        return {"full": float(full), "partial": float(full), "ratio": 1.0}
    partial = 2 * n * k * head_dim + 2 * n * k * (n - k) + n * (n - k) + 3 * n * n + 2 * n * n * head_dim
    return {"full": float(full), "partial": float(partial), "ratio": partial / full}


def flops_on_lengths(lengths: np.ndarray, head_dim: int, k: int) -> float:
    """Attention FLOPs with k exact scores per row over examples of these ``lengths`` (their own
    tokens: the valid pairs a system that does not pad computes), against full attention on them. A
    text of at most k tokens has every score exact.

    >>> flops_on_lengths(np.array([10, 12]), 32, 16)          # every text shorter than k: no saving
    1.0
    """
    sizes, counts = np.unique(np.asarray(lengths, dtype=int), return_counts=True)
    costs = [attention_flops(int(size), head_dim, k if k < size else None) for size in sizes]
    return float(
        sum(c * cost["partial"] for c, cost in zip(counts, costs)) / sum(c * cost["full"] for c, cost in zip(counts, costs))
    )


def pairs_attention_flops(n: int, head_dim: int, pairs: int, rank: int) -> dict[str, float]:
    """As :func:`attention_flops`, for pairs mode: ``pairs`` exact scores (2·pairs·d) and a
    rank-``rank`` rebuild of the whole matrix (2·pairs·r + 2n²r), then softmax and V."""
    full = attention_flops(n, head_dim)["full"]
    partial = 2 * pairs * head_dim + 2 * pairs * rank + 2 * n * n * rank + 3 * n * n + 2 * n * n * head_dim
    return {"full": full, "partial": float(partial), "ratio": partial / full}


def default_ks(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself.

    >>> default_ks(20)
    [1, 2, 4, 8, 16, 20]
    """
    ks = [2**p for p in range(n.bit_length()) if 2**p <= n]
    return ks if ks[-1] == n else [*ks, n]
