"""What the reconstruction's maps cost to fit and measure, per layer, on this model's geometry.

Fitting is float64 linear algebra, not forward passes: its cost grows with the heads, n and, for a
causal model (or windowed layers), with one map per query (n maps where an encoder has one). It is
timed by the code the reconstruction runs (:class:`~attnlens.analysis.reconstruct.MapFitter`,
:class:`~attnlens.analysis.reconstruct.HeldOutBatch`) on one layer's moments of random rows with the
model's heads, n and valid keys: the cost depends on those shapes, not on what the scores are.
Each (strategy, scope) is timed at the smallest and the largest k (its selection order, computed once
per strategy and scope, counted with the first) and read off the line between them for the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

RIDGE = 1e-3  # any ridge: the time of a solve does not depend on it


@dataclass(frozen=True)
class FitTimes:
    """Seconds per layer: ``order[(strategy, scope)]`` once, ``per_k[(strategy, scope)]`` the line
    (seconds at k = ``ks[0]``, at ``ks[1]``) of one config's fit, and ``measure`` one held-out batch measured."""

    order: dict[tuple[str, str], float]
    per_k: dict[tuple[str, str], tuple[float, float]]
    ks: tuple[int, int]
    measure: float

    def config(self, strategy: str, scope: str, k: int) -> float:
        """Seconds of one layer's maps of one config, its order aside."""
        (low, high), (k0, k1) = self.per_k[strategy, scope], self.ks
        return max(low + (high - low) * (k - k0) / (k1 - k0) if k1 > k0 else low, 0.0)


def time_fits(
    num_heads: int,
    n: int,
    valid: torch.Tensor,
    per_query: bool,
    strategies: list[str],
    scopes: list[str],
    ks: list[int],
    batch: int,
) -> FitTimes:
    """:class:`FitTimes` on one layer of ``num_heads`` heads at width ``n`` whose (query, key) pairs are
    ``valid`` (n, n), with maps per query where ``per_query``; ``batch`` held-out blocks measured at once."""
    from attnlens.analysis.reconstruct import MapFitter

    fitter = MapFitter(_moments(num_heads, n, valid, per_query), ridge=RIDGE, seed=0, global_positions=(0,))
    low, high = min(ks), max(ks)
    order, per_k = {}, {}
    for strategy in strategies:
        for scope in scopes:
            first = _timed(lambda: fitter.layer_maps(strategy, scope, high, 0))  # the order is computed here
            at_high = _timed(lambda: fitter.layer_maps(strategy, scope, high, 0))
            at_low = at_high if low == high else _timed(lambda: fitter.layer_maps(strategy, scope, low, 0))
            order[strategy, scope], per_k[strategy, scope] = max(first - at_high, 0.0), (at_low, at_high)
    maps, _ = fitter.layer_maps(strategies[0], scopes[0], high, 0)
    return FitTimes(order, per_k, (low, high), _measure_time(maps, num_heads, n, valid, per_query, batch))


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _rows(num_heads: int, n: int, valid: torch.Tensor, blocks: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.from_numpy(np.random.default_rng(seed).standard_normal((blocks, num_heads, n, n), dtype=np.float32))
    return scores, valid[None].expand(blocks, n, n)


def _moments(num_heads: int, n: int, valid: torch.Tensor, per_query: bool):
    """One layer's moments of random rows, enough of them for a full-rank covariance per query."""
    from attnlens.rows.accumulate import UnitSums

    queries = tuple(range(n)) if per_query else None
    sums = UnitSums([(0, head) for head in range(num_heads)], n=n, num_heads=num_heads, quantity="scores", queries=queries)
    blocks = n + 8 if per_query else 16
    for start in range(0, blocks, 16):
        scores, rows = _rows(num_heads, n, valid, min(16, blocks - start), start)
        sums.add(0, scores, rows, np.arange(len(scores)) % 2)
    return sums.halves([0]).total


def _measure_time(maps, num_heads: int, n: int, valid: torch.Tensor, per_query: bool, batch: int) -> float:
    """One held-out batch of ``batch`` blocks measured against ``maps`` (the reconstruction's evaluation of a layer)."""
    from attnlens.analysis.reconstruct import HeldOutBatch

    scores, rows = _rows(num_heads, n, valid, batch, 99)
    mean = torch.zeros(1, num_heads, n if per_query else 1, n)
    held = HeldOutBatch.of(scores, rows, mean)
    return _timed(lambda: held.measure(maps.apply(held.scores)))
