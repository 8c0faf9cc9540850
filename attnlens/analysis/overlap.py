"""Subspace overlap: how much the top-d eigenspaces of heads, layers and models share.

For orthonormal bases U, V (n × d) the normalised overlap ``‖UᵀV‖²_F / d`` is 1 for
the same subspace and 0 for orthogonal ones; two independent random d-dimensional
subspaces of R^n give d/n on average (the chance level, reported beside every
matrix). The principal angles are the arccosines of the singular values of UᵀV.

The split-half check compares a layer's subspace estimated on two disjoint halves of
the sequences: if layers differ from each other by no more than the halves of one
layer differ, the difference is sampling noise, not structure.

>>> import numpy as np
>>> u = np.linalg.qr(np.random.default_rng(0).standard_normal((8, 2)))[0]
>>> round(subspace_overlap(u, u), 6), round(subspace_overlap(u, np.linalg.qr(np.c_[u, np.eye(8)])[0][:, 2:4]), 6)
(1.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnlens.analysis.eigen import EigenResult
from attnlens.errors import AttnlensError
from attnlens.io.provenance import provenance
from attnlens.io.results import Result
from attnlens.settings import Settings, at_least


def subspace_overlap(u: np.ndarray, v: np.ndarray) -> float:
    """``‖UᵀV‖²_F / d`` for bases with d columns each (columns orthonormal)."""
    return float(np.sum((u.T @ v) ** 2) / u.shape[1])


def principal_angles(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spaces of U and V.

    Columns orthonormal; a zero column (an eigenvector a unit with fewer keys lacks)
    is an absent direction, at π/2 from everything. See :func:`_angles`.

    >>> e = np.eye(4)
    >>> principal_angles(e[:, :2], np.c_[e[:, 0], np.cos(1e-9) * e[:, 1] + np.sin(1e-9) * e[:, 2]]).tolist()
    [0.0, 1e-09]
    """
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    return _angles(u[None], v[None], (u.T @ v)[None, None])[0, 0]


def _angles(a: np.ndarray, b: np.ndarray, products: np.ndarray, chunk_bytes: int = 1 << 25) -> np.ndarray:
    """Principal angles (k_a, k_b, min(d_a, d_b)), ascending, between every basis of ``a``
    (k_a, n, d_a) and of ``b`` (k_b, n, d_b), given ``products`` aᵀb (k_a, k_b, d_a, d_b).

    Above π/4 the angle is the arccosine of a singular value of aᵀb. Below π/4 it is the
    arcsine of a singular value of the narrower basis's part outside the other's span
    (b − a aᵀb): an arccosine near 0 keeps only half the digits (about 1e-8 rad for equal
    subspaces, more for float32 bases). This is the rule of scipy.linalg.subspace_angles
    (Knyazev & Argentati 2002), which is not used here: it works one pair at a time, and
    (scipy 1.17) applies the choice made for the k-th smallest angle to the k-th largest,
    so when angles near 0 and near π/2 occur together both lose half their digits.
    """
    cosines = np.linalg.svd(products, compute_uv=False)  # descending: angles ascending
    angles = np.arccos(np.clip(cosines, -1.0, 1.0))
    small = cosines**2 >= 0.5
    pairs = np.argwhere(small.any(-1))
    if len(pairs) == 0:
        return angles
    narrow_b = b.shape[-1] <= a.shape[-1]
    narrow, width = (b, b.shape[-1]) if narrow_b else (a, a.shape[-1])
    # Zero columns of the narrower basis add sines 0 that stand for no angle: skip them.
    absent = (np.linalg.norm(narrow, axis=-2) < 0.5).sum(-1)
    step = max(1, chunk_bytes // (8 * narrow.shape[-2] * max(a.shape[-1], b.shape[-1])))
    for start in range(0, len(pairs), step):
        i, j = pairs[start : start + step].T
        if narrow_b:
            residual = b[j] - a[i] @ products[i, j]
        else:
            residual = a[i] - b[j] @ products[i, j].swapaxes(-1, -2)
        sines = np.linalg.svd(residual, compute_uv=False)[:, ::-1]  # ascending, as the angles
        index = np.arange(width) + absent[j if narrow_b else i][:, None]
        sines = np.where(index < width, np.take_along_axis(sines, np.minimum(index, width - 1), -1), 1.0)
        angles[i, j] = np.where(small[i, j], np.arcsin(np.clip(sines, 0.0, 1.0)), angles[i, j])
    return angles


def overlap_matrix(bases_a: np.ndarray, bases_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Overlaps and principal angles between every basis of A (k_a, n, d) and of B (k_b, n, d).

    Returns (k_a, k_b) overlaps and (k_a, k_b, d) angles (:func:`_angles`).
    """
    a, b = np.asarray(bases_a, dtype=np.float64), np.asarray(bases_b, dtype=np.float64)
    products = np.matmul(a.swapaxes(-1, -2)[:, None], b[None])  # (k_a, k_b, d, d): aᵀb
    overlaps = (products**2).sum(axis=(2, 3)) / a.shape[-1]
    return overlaps, _angles(a, b, products)


def chance_overlap(dim: int, n: int) -> float:
    """Expected overlap of two independent uniformly random d-dimensional subspaces of R^n."""
    return dim / n


def _bases(result: EigenResult, level: str, dim: int, query: int, half: str = "") -> np.ndarray:
    """(units, n, d) orthonormal bases at ``level``, units in (layer, head) order."""
    vectors = result.eigenvectors(level, half)[:, :, query, :, :dim]
    return np.asarray(vectors, dtype=np.float64).reshape(-1, vectors.shape[-2], dim)


def _unit_labels(result: EigenResult, level: str) -> list[tuple[int, int]]:
    layers = result.meta["layers"] if level != "model" else [-1]
    heads = range(result.meta["num_heads"]) if level == "head" else [-1]
    return [(layer, head) for layer in layers for head in heads]


def _query_index(result: EigenResult, query: int | None) -> tuple[int, int]:
    """Position on the query axis, and the query it stands for (-1 when rows are pooled)."""
    queries = result.meta["settings"]["queries"]
    if queries is None:
        return 0, -1
    chosen = queries[-1] if query is None else query
    if chosen not in queries:
        raise AttnlensError(f"`query` {chosen} is not among the query positions of the eigen result ({queries[0]}…{queries[-1]})")
    return queries.index(chosen), chosen


class OverlapResult(Result):
    """Overlap matrices (``arrays``), a tidy table of every pair (``table``) and the split-half check."""

    kind = "overlap"

    @property
    def split_half(self) -> pd.DataFrame:
        return self.tables["split_half"]

    def summary(self) -> str:
        return f"d={self.dim} of n={self.meta['n']}, models {', '.join(self.meta['models'])}"

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def chance(self) -> float:
        return float(self.meta["chance"])

    def matrix(self, name: str) -> np.ndarray:
        """``layers_0`` (layer × layer of model 0), ``heads_0``, ``layers_0_1`` (model 0 × model 1), ..."""
        return self.arrays[f"{name}_overlap"]


@dataclass(frozen=True)
class OverlapSettings(Settings):
    """Settings of :func:`overlap`: the dimension ``dim`` of the compared eigenspaces, and
    the ``query`` position of per-query results (``None``: the last)."""

    dim: int = 16
    query: int | None = None

    def validate(self) -> None:
        at_least("dim", self.dim, 1)
        if self.query is not None:
            at_least("query", self.query, 0)


def overlap(
    source: list[EigenResult] | EigenResult,
    settings: OverlapSettings | None = None,
    *,
    command: str | None = None,
    **changes: Any,
) -> OverlapResult:
    """Overlap of top-``dim`` eigenspaces of the eigen results in ``source``: layer × layer
    and head × head within each result, layer × layer (and head × head) between every
    pair of results, and the split-half overlap of every unit. Per-query results use one
    query position (default: the last, whose keys are all valid even in causal models).
    ``settings`` (:class:`OverlapSettings`) with keyword ``changes`` applied."""
    s = OverlapSettings.build(settings, **changes)
    dim, query = s.dim, s.query
    results = [source] if isinstance(source, EigenResult) else list(source)
    if not results:
        raise AttnlensError("give at least one eigen result")
    n = results[0].n
    for result in results[1:]:
        if result.n != n:
            raise AttnlensError(
                f"eigen results have different n ({n} for {results[0].meta['model']['name']}, {result.n} for "
                f"{result.meta['model']['name']}); overlap compares subspaces of the same R^n: use the same `seq_len`"
            )
    if dim < 1 or dim > n:
        raise AttnlensError(f"`dim` {dim} is out of range; it must be between 1 and n = {n}")
    for result in results:
        if dim > result.keep:
            raise AttnlensError(
                f"`dim` {dim} is above the {result.keep} eigenvectors the eigen result keeps; rerun eigen with `keep` {dim}"
            )
    positions = [_query_index(result, query) for result in results]
    names = [result.meta["model"]["name"] for result in results]
    arrays: dict[str, np.ndarray] = {}
    rows: list[dict] = []

    def compare(key: str, level: str, i: int, j: int) -> None:
        a = _bases(results[i], level, dim, positions[i][0])
        b = _bases(results[j], level, dim, positions[j][0])
        overlaps, angles = overlap_matrix(a, b)
        arrays[f"{key}_overlap"], arrays[f"{key}_angles"] = overlaps, angles
        for (ia, (layer_a, head_a)), (ib, (layer_b, head_b)) in (
            ((x, la), (y, lb))
            for x, la in enumerate(_unit_labels(results[i], level))
            for y, lb in enumerate(_unit_labels(results[j], level))
        ):
            rows.append(
                {
                    "comparison": key,
                    "level": level,
                    "model_a": names[i],
                    "layer_a": layer_a,
                    "head_a": head_a,
                    "model_b": names[j],
                    "layer_b": layer_b,
                    "head_b": head_b,
                    "overlap": overlaps[ia, ib],
                    "mean_angle_deg": float(np.degrees(angles[ia, ib]).mean()),
                    "max_angle_deg": float(np.degrees(angles[ia, ib]).max()),
                }
            )

    for i in range(len(results)):
        compare(f"layers_{i}", "layer", i, i)
        compare(f"heads_{i}", "head", i, i)
        for j in range(i + 1, len(results)):
            compare(f"layers_{i}_{j}", "layer", i, j)
            compare(f"heads_{i}_{j}", "head", i, j)
            compare(f"model_{i}_{j}", "model", i, j)
    split_rows = []
    for i, result in enumerate(results):
        for level in ("head", "layer", "model"):
            a = _bases(result, level, dim, positions[i][0], "a")
            b = _bases(result, level, dim, positions[i][0], "b")
            for unit, (layer, head) in enumerate(_unit_labels(result, level)):
                split_rows.append(
                    {
                        "result": i,
                        "model": names[i],
                        "level": level,
                        "layer": layer,
                        "head": head,
                        "overlap": subspace_overlap(a[unit], b[unit]),
                    }
                )
    meta = {
        "settings": s.to_dict(),
        "dim": dim,
        "n": n,
        "chance": chance_overlap(dim, n),
        "models": names,
        "layers": [result.meta["layers"] for result in results],
        "num_heads": [result.meta["num_heads"] for result in results],
        "queries": [q for _, q in positions],
        "sources": [{"model": r.meta["model"], "corpus": r.meta["corpus"], "settings": r.meta["settings"]} for r in results],
        **provenance(command),
    }
    return OverlapResult(meta, {"table": pd.DataFrame(rows), "split_half": pd.DataFrame(split_rows)}, arrays)
