"""Spectra of second moments, and their summaries: what :mod:`attnlens.analysis.eigen` reports per unit.

The eigenvalues of one unit's row covariance (or uncentred second moment) over its valid keys,
with the all-ones direction projected out where asked; the top eigenvectors with a deterministic
sign; the energy thresholds and the effective rank; the Gaussian baseline of the same shape; the
last direction's notes; and the spectrum of flattened whole matrices through their Gram matrix.

>>> import numpy as np
>>> values = np.array([4.0, 2.0, 1.0, 1.0])
>>> components_for_energy(values, 0.75), round(effective_rank(values), 3)
(2, 2.909)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ENERGY_LEVELS = (0.90, 0.95, 0.99)


# ---------------------------------------------------------------------- spectra


def components_for_energy(eigenvalues: np.ndarray, energy: float) -> int:
    """Smallest k whose top-k eigenvalues hold at least ``energy`` of the total.

    >>> components_for_energy(np.array([6.0, 3.0, 1.0]), 0.9)
    2
    """
    total = eigenvalues.sum()
    if total <= 0:
        return 0
    cumulative = np.cumsum(eigenvalues) / total
    return int(np.searchsorted(cumulative, energy - 1e-12) + 1)


def effective_rank(eigenvalues: np.ndarray) -> float:
    """Participation ratio (Σλ)² / Σλ²: n for a flat spectrum, 1 for a single direction.

    >>> effective_rank(np.ones(4))
    4.0
    """
    squares = float((eigenvalues**2).sum())
    return float(eigenvalues.sum() ** 2 / squares) if squares > 0 else 0.0


def summarise(eigenvalues: np.ndarray, prefix: str = "") -> dict[str, float]:
    values = np.clip(eigenvalues, 0, None)
    summary: dict[str, float] = {
        f"{prefix}k{round(level * 100)}": components_for_energy(values, level) for level in ENERGY_LEVELS
    }
    summary[f"{prefix}effective_rank"] = effective_rank(values)
    return summary


def deterministic_sign(vectors: np.ndarray) -> np.ndarray:
    """Flip each column so that its largest-magnitude entry is positive (as scikit-learn's svd_flip)."""
    if vectors.size == 0:
        return vectors
    rows = np.argmax(np.abs(vectors), axis=0)
    signs = np.sign(vectors[rows, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1
    return vectors * signs


def gaussian_baseline(variances: np.ndarray, rows: int, centred: bool, rng: np.random.Generator) -> np.ndarray:
    """Eigenvalues of the sample covariance of ``rows`` Gaussian rows with independent
    coordinates of the given variances: what a spectrum looks like with no structure.

    Sampled through the Bartlett decomposition of the Wishart matrix (O(n²) draws, not
    rows × n); with fewer degrees of freedom than dimensions the rows are drawn directly.
    """
    dims = len(variances)
    freedom = rows - 1 if centred else rows
    scale = np.sqrt(np.clip(variances, 0, None))
    if freedom <= 0 or dims == 0:
        return np.zeros(dims)
    if freedom >= dims:
        factor = np.tril(rng.standard_normal((dims, dims)), -1)
        factor[np.diag_indices(dims)] = np.sqrt(rng.chisquare(freedom - np.arange(dims)))
        scaled = scale[:, None] * factor
        sample = scaled @ scaled.T
    else:
        draws = rng.standard_normal((freedom, dims)) * scale
        sample = draws.T @ draws
    return np.sort(np.linalg.eigvalsh(sample / freedom))[::-1]


@dataclass(frozen=True)
class UnitSpectrum:
    eigenvalues: np.ndarray  # (n,), descending, zeros for keys outside the unit
    eigenvectors: np.ndarray  # (n, keep), in full key coordinates
    ones_variance: float  # variance along the normalised all-ones direction (before any projection)
    total_variance: float
    keys: int
    last: LastDirection | None = None  # the direction of least variance (None without two keys)


# A last eigenvalue below this fraction of the one before it is a direction of (almost) no
# variance on its own, not the end of a smooth tail: the spectra figure says what it is.
ISOLATED_GAP = 0.05


@dataclass(frozen=True)
class LastDirection:
    """The unit's direction of least variance (the last eigenvector; with ``project_ones``,
    the last besides the projected-out all-ones direction): its eigenvalue, that over the one
    before it (``gap``), its cos² with the all-ones direction, and the two keys it loads on most."""

    eigenvalue: float
    gap: float
    ones: float  # cos² with the normalised all-ones direction over the unit's keys
    key_a: int  # the two keys with the largest |loading|, a < b
    key_b: int
    share: float  # the fraction of the direction's squared norm on those two keys
    sign: int  # sign of loading_a · loading_b: -1 means scores to a and b move together (their difference is the direction)

    def columns(self) -> dict:
        return {
            "last_eigenvalue": self.eigenvalue,
            "last_gap": self.gap,
            "last_isolated": bool(self.gap < ISOLATED_GAP),
            "last_ones": self.ones,
            "last_key_a": self.key_a,
            "last_key_b": self.key_b,
            "last_keys_share": self.share,
            "last_keys_sign": self.sign,
        }


def last_direction(
    eigenvalues: np.ndarray, eigenvectors: np.ndarray, keys: np.ndarray, project_ones: bool
) -> LastDirection | None:
    """:class:`LastDirection` of a unit from its eigen-decomposition over its complete ``keys``
    (eigenvalues ascending, as ``numpy.linalg.eigh`` gives them)."""
    if len(keys) < 2:
        return None
    ones = np.full(len(keys), len(keys) ** -0.5)
    alignment = (ones @ eigenvectors) ** 2
    order = np.arange(len(keys))
    if project_ones:  # the projection left the all-ones direction at eigenvalue 0: not the data's
        order = np.delete(order, np.argmax(alignment))
    if len(order) < 2:
        return None
    last, before = order[0], order[1]
    vector = eigenvectors[:, last]
    top = np.sort(np.argsort(-np.abs(vector))[:2])
    gap = eigenvalues[last] / eigenvalues[before] if eigenvalues[before] > 0 else float("nan")
    return LastDirection(
        eigenvalue=float(eigenvalues[last]),
        gap=float(gap),
        ones=float(alignment[last]),
        key_a=int(keys[top[0]]),
        key_b=int(keys[top[1]]),
        share=float((vector[top] ** 2).sum()),
        sign=int(np.sign(vector[top[0]] * vector[top[1]]) or 1),
    )


def unit_spectrum(moment: np.ndarray, complete: np.ndarray, keep: int, project_ones: bool) -> UnitSpectrum:
    """Eigen-decompose one unit's n×n moment over its complete keys."""
    n = moment.shape[0]
    keys = np.flatnonzero(complete)
    values = np.zeros(n)
    vectors = np.zeros((n, keep))
    if len(keys) == 0:
        return UnitSpectrum(values, vectors, 0.0, 0.0, 0)
    sub = moment[np.ix_(keys, keys)]
    ones = np.full(len(keys), len(keys) ** -0.5)
    ones_variance = float(ones @ sub @ ones)
    if project_ones:
        projector = np.eye(len(keys)) - np.outer(ones, ones)
        sub = projector @ sub @ projector
    sub = (sub + sub.T) / 2
    eigenvalues, eigenvectors = np.linalg.eigh(sub)
    order = np.argsort(eigenvalues)[::-1]
    values[: len(keys)] = eigenvalues[order]
    kept = min(keep, len(keys))
    vectors[keys, :kept] = deterministic_sign(eigenvectors[:, order[:kept]])
    last = last_direction(eigenvalues[order[::-1]], eigenvectors[:, order[::-1]], keys, project_ones)
    return UnitSpectrum(values, vectors, ones_variance, float(np.trace(moment[np.ix_(keys, keys)])), len(keys), last)


def matrix_spectrum(matrices: np.ndarray, centred: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decompose the covariance of flattened matrices through their Gram matrix.

    ``matrices`` (N, P), P = number of entries: the covariance Xᵀ X / (N − 1) is P×P,
    but its nonzero eigenvalues are those of the N×N Gram matrix X Xᵀ / (N − 1), and
    its eigenvectors are Xᵀ u / sqrt((N − 1) λ). Returns eigenvalues (N,) descending and the factor (P, N) of
    eigenvectors (columns of eigenvalue 0 are 0).
    """
    x = torch.from_numpy(np.asarray(matrices, dtype=np.float64))
    if centred:
        x = x - x.mean(0, keepdim=True)
    divisor = max(x.shape[0] - 1, 1) if centred else x.shape[0]  # as in Moments.second_moment
    gram = (x @ x.T).numpy() / divisor
    values, vectors = np.linalg.eigh((gram + gram.T) / 2)
    order = np.argsort(values)[::-1]
    values, vectors = np.clip(values[order], 0, None), vectors[:, order]
    scale = np.where(values > values[0] * 1e-12, 1 / np.sqrt(np.maximum(values, 1e-300) * divisor), 0.0)
    factor = (x.T @ torch.from_numpy(vectors * scale)).numpy()
    return values, deterministic_sign(factor)


def matrix_baseline(variances: np.ndarray, count: int, centred: bool, rng: np.random.Generator) -> np.ndarray:
    """Spectrum of ``count`` Gaussian matrices with matched per-entry variance (via the Gram matrix)."""
    draws = rng.standard_normal((count, len(variances))) * np.sqrt(variances)
    return matrix_spectrum(draws, centred)[0]
