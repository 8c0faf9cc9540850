"""Key-position selection: which k of a row's n scores to compute exactly.

Every strategy returns, for each k asked for, the chosen positions. ``greedy`` adds, at
each step, the position that most reduces the least-squares error of predicting the
whole row from the chosen ones. From the covariance this is exact and cheap: the
residual covariance after conditioning on position j is the Schur complement
``Σ − Σ[:, j] Σ[j, :] / Σ[j, j]``, a rank-one update, and the error reduction of a
candidate j is ``‖Σ[:, j]‖² / Σ[j, j]``; the whole path k = 1…n costs O(n³) for a
unit, instead of a least-squares refit per candidate per step.

>>> import numpy as np
>>> covariance = np.diag([1.0, 5.0, 3.0])
>>> order, errors = greedy_path(covariance[None])
>>> order[0].tolist(), errors[0].tolist()
([1, 2, 0], [9.0, 4.0, 1.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from attnlens.errors import BadInput

STRATEGIES = ("greedy", "random", "stride", "local+global", "eigen")
QUERY_DEPENDENT = ("local+global",)


def greedy_path(
    covariance: np.ndarray, candidates: np.ndarray | None = None, steps: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy selection order for a batch of units, and the residual error after each step.

    ``covariance`` (units, n, n); ``candidates`` (units, n) bool marks the positions
    that may be chosen (the unit's valid keys; default all). Returns ``order``
    (units, n) — candidates first in greedy order, then the rest — and ``errors``
    (units, n + 1): the trace of the residual covariance over the candidates after
    0, 1, … selections (the in-sample squared error of the least-squares predictor).
    ``steps`` stops the path early (order and errors beyond it are 0). Once every candidate of
    every unit is chosen the rest of the path is no longer searched: each unit takes its
    unchosen positions in ascending order, and its error stays where it is (a causal model's
    early queries have few keys: sorted by their candidates, batches stop early).
    """
    residual = np.array(covariance, dtype=np.float64)
    units, n, _ = residual.shape
    allowed = np.ones((units, n), bool) if candidates is None else np.array(candidates, bool)
    chosen = np.zeros((units, n), bool)
    order = np.zeros((units, n), dtype=np.int64)
    errors = np.zeros((units, n + 1))
    diagonal_floor = 1e-12 * np.maximum(np.einsum("uii->u", residual), 1e-300)[:, None]
    rows = np.arange(units)
    steps = n if steps is None else min(steps, n)
    searched = min(steps, int(allowed.sum(1).max(initial=0)))  # past this every unit has chosen all its candidates
    for step in range(searched):
        diagonal = np.einsum("uii->ui", residual)
        errors[:, step] = np.where(allowed, diagonal, 0).sum(1)
        gains = np.einsum("uij,uij->uj", residual, residual * allowed[:, :, None]) / np.maximum(diagonal, diagonal_floor)
        gains[~allowed | chosen] = -np.inf
        # A candidate whose residual variance is ~0 adds nothing; among equals take the lowest position.
        gains[(diagonal <= diagonal_floor) & allowed & ~chosen] = 0.0
        pick = np.argmax(gains, axis=1)
        fallback = ~np.isfinite(gains[rows, pick])  # no candidate left: take the lowest unchosen position
        pick[fallback] = np.argmax(~chosen[fallback], axis=1)
        order[:, step] = pick
        chosen[rows, pick] = True
        pivot = residual[rows, :, pick]  # (units, n): Σ[:, j]
        scale = np.where(diagonal[rows, pick] > diagonal_floor[:, 0], 1 / np.maximum(diagonal[rows, pick], 1e-300), 0.0)
        residual -= scale[:, None, None] * pivot[:, :, None] * pivot[:, None, :]
    errors[:, searched:] = np.where(allowed, np.einsum("uii->ui", residual), 0).sum(1)[:, None]
    order[:, searched:steps] = np.argsort(chosen, axis=1, kind="stable")[:, : steps - searched]  # unchosen, ascending
    errors[:, steps + 1 :] = 0.0
    return order, np.clip(errors, 0, None)


def naive_greedy_path(covariance: np.ndarray, steps: int | None = None) -> np.ndarray:
    """Greedy by brute force, for checking and benchmarking: at each step refit least
    squares for every candidate and keep the one with the smallest error. O(n⁵)."""
    n = covariance.shape[0]
    chosen: list[int] = []
    for _ in range(steps or n):
        best, best_error = -1, np.inf
        for candidate in range(n):
            if candidate in chosen:
                continue
            selected = chosen + [candidate]
            sub = covariance[np.ix_(selected, selected)]
            cross = covariance[:, selected]
            error = np.trace(covariance) - np.trace(cross @ np.linalg.lstsq(sub, cross.T, rcond=None)[0])
            if error < best_error - 1e-12:
                best, best_error = candidate, error
        chosen.append(best)
    return np.array(chosen)


def random_order(n: int, units: int, rng: np.random.Generator) -> np.ndarray:
    """(units, n) seeded random orders; the first k of each are a random selection of k."""
    return np.stack([rng.permutation(n) for _ in range(units)]) if units else np.zeros((0, n), np.int64)


def stride_positions(n: int, k: int) -> np.ndarray:
    """k evenly spaced positions from 0 to n − 1.

    >>> stride_positions(10, 4).tolist()
    [0, 3, 6, 9]
    """
    return np.unique(np.round(np.linspace(0, n - 1, k)).astype(np.int64)) if k > 1 else np.array([0])


def local_global_positions(
    n: int, k: int, query: int, global_positions: Iterable[int] = (0,), keys: Iterable[int] | None = None
) -> np.ndarray:
    """The global positions ([CLS] / first token) and the keys nearest the query, k in all, among ``keys``
    (the keys the row sees: a causal row's prefix, a window; default all n).

    >>> local_global_positions(10, 4, query=6).tolist()
    [0, 5, 6, 7]
    >>> local_global_positions(10, 4, query=6, keys=range(3, 8)).tolist()      # a window: no global key in it
    [4, 5, 6, 7]
    """
    seen = list(range(n)) if keys is None else [int(key) for key in keys]
    globals_ = [p for p in global_positions if p in seen][:k]
    nearest = sorted((p for p in seen if p not in globals_), key=lambda p: (abs(p - query), p))
    return np.sort(np.array(globals_ + nearest[: k - len(globals_)], dtype=np.int64))


def leverage_positions(covariance: np.ndarray, k: int, candidates: np.ndarray | None = None) -> np.ndarray:
    """The k positions of largest leverage Σ_{m<k} U[j, m]² in the top-k eigenvectors."""
    n = covariance.shape[0]
    keys = np.arange(n) if candidates is None else np.flatnonzero(candidates)
    values, vectors = np.linalg.eigh(covariance[np.ix_(keys, keys)])
    top = vectors[:, np.argsort(values)[::-1][:k]]
    leverage = (top**2).sum(1)
    return np.sort(keys[np.argsort(-leverage, kind="stable")[:k]])


def check_ks(ks: Iterable[int], n: int) -> list[int]:
    ks = sorted(set(int(k) for k in ks))
    if not ks:
        raise BadInput("`ks` is empty; give at least one k, e.g. `ks` 16,32")
    if ks[0] < 1:
        raise BadInput(f"k = {ks[0]} selects nothing; every k must be at least 1 (an empty selection cannot reconstruct a row)")
    if ks[-1] > n:
        raise BadInput(f"k = {ks[-1]} is larger than the {n} valid keys of a row; use k <= {n}")
    return ks


def check_strategies(strategies: Iterable[str]) -> list[str]:
    strategies = list(strategies)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise BadInput(f"`strategies` {unknown[0]} is unknown; use some of {', '.join(STRATEGIES)}")
    if not strategies:
        raise BadInput("`strategies` is empty; name at least one strategy, e.g. `strategies` greedy")
    return strategies
