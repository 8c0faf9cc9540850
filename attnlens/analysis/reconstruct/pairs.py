"""Pairs mode: select (query, key) pairs of a whole score matrix and rebuild the rest.

Closest to the paper's wording ("greedily select query-key pairs"): each sequence's
n×n score matrix of a head is one vector of P ≤ n² valid entries; about k·n pairs are
computed exactly and the matrix is rebuilt from them by affine least squares.

At n = 128 the P×P covariance (16384²) is too large to update. But it is low rank:
C = G Gᵀ with G (P × r), r ≤ number of sequences, the factor that the full-matrix
eigen analysis gives (:func:`attnlens.analysis.eigen.matrix_spectrum`). Conditioning on entry j
maps G to G (I − f fᵀ/‖f‖²) with f = G[j], so each greedy step costs O(P·r): the
candidate gains ‖C[:, j]‖² / C[j, j] = ‖G Gᵀ[:, j]‖² / ‖G[j]‖² are kept up to date
through M = G GᵀG. After r steps the training residual is exhausted; further pairs
are taken in order of decreasing variance.

>>> import numpy as np
>>> factor = np.diag([3.0, 2.0, 1.0])                     # C = diag(9, 4, 1)
>>> greedy_pairs(factor, 3).tolist()
[0, 1, 2]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def greedy_pairs(factor: np.ndarray, steps: int) -> np.ndarray:
    """The first ``steps`` entries in greedy order, for a covariance ``factor @ factor.T``."""
    g = np.array(factor, dtype=np.float64)
    entries = g.shape[0]
    steps = min(steps, entries)
    variance = (g**2).sum(1)
    diagonal = variance.copy()
    m = g @ (g.T @ g)
    chosen = np.zeros(entries, bool)
    order: list[int] = []
    floor = 1e-12 * max(variance.max(), 1e-300)
    while len(order) < steps:
        gains = np.where(chosen | (diagonal <= floor), -np.inf, (m * g).sum(1) / np.maximum(diagonal, floor))
        pick = int(np.argmax(gains))
        if not np.isfinite(gains[pick]) or gains[pick] <= floor:
            break  # the residual is exhausted
        f = g[pick].copy()
        norm = f @ f
        column = g @ f  # C[:, pick]
        g_f = g.T @ column  # (GᵀG) f
        m = m - np.outer(column, g_f) / norm
        m = m - np.outer(m @ f, f) / norm
        g = g - np.outer(column, f) / norm
        diagonal = np.maximum(diagonal - column**2 / norm, 0.0)
        chosen[pick] = True
        order.append(pick)
    rest = [int(j) for j in np.argsort(-variance, kind="stable") if not chosen[j]]
    return np.array(order + rest[: steps - len(order)], dtype=np.int64)


@dataclass(frozen=True)
class PairsMap:
    """ŝ = mean + left (right (s_S − mean_S)), with the chosen entries S exact: low rank, never P × m."""

    selected: np.ndarray
    mean: np.ndarray
    left: np.ndarray  # (P, r)
    right: np.ndarray  # (r, m)

    def apply(self, matrices: np.ndarray) -> np.ndarray:
        """Rebuild flattened matrices (E, P) from their chosen entries."""
        exact = matrices[:, self.selected]
        rebuilt = self.mean + ((exact - self.mean[self.selected]) @ self.right.T) @ self.left.T
        rebuilt[:, self.selected] = exact
        return rebuilt


def fit_pairs(factor: np.ndarray, mean: np.ndarray, selected: np.ndarray, ridge: float) -> PairsMap:
    """Affine least squares from the chosen entries, in low rank:

    C[:, S] (C[S, S] + λ)⁻¹ = G G_Sᵀ (G_S G_Sᵀ + λ I_m)⁻¹ = G (G_SᵀG_S + λ I_r)⁻¹ G_Sᵀ,

    solving whichever system is smaller (m chosen entries or rank r); λ = ridge × the
    mean variance of the chosen entries.
    """
    g_s = factor[selected]
    m, rank = g_s.shape
    scale = max(float((g_s**2).sum() / max(m, 1)), 1e-12)
    if m <= rank:
        right = np.linalg.solve(g_s @ g_s.T + ridge * scale * np.eye(m), g_s).T
    else:
        right = np.linalg.solve(g_s.T @ g_s + ridge * scale * np.eye(rank), g_s.T)
    return PairsMap(selected, mean, factor, right)
