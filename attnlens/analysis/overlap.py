"""Subspace overlap: how much the top-d eigenspaces of heads, layers and models share.

For orthonormal bases U, V (n × d) the normalised overlap ``‖UᵀV‖²_F / d`` is 1 for
the same subspace and 0 for orthogonal ones; two independent random d-dimensional
subspaces of R^n give d/n on average (the chance level, reported beside every
matrix). The principal angles are the arccosines of the singular values of UᵀV.

The split-half check compares a unit's subspace estimated on two disjoint halves of
the sequences: if layers differ from each other by no more than the halves of one
layer differ, the difference is sampling noise, not structure. Every overlap is
computed at every d from 1 to a maximum, because the answer depends on d: past a
unit's spectral gap its eigenvectors are not determined by the data and its split-half
overlap falls away. Two units are compared at the largest d at which both their
split-half overlaps stay at or above a stated level (:func:`stable_dim`).

>>> import numpy as np
>>> u = np.linalg.qr(np.random.default_rng(0).standard_normal((8, 2)))[0]
>>> round(subspace_overlap(u, u), 6), round(subspace_overlap(u, np.linalg.qr(np.c_[u, np.eye(8)])[0][:, 2:4]), 6)
(1.0, 0.0)
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnlens.analysis.comparisons import Comparison, comparisons, comparisons_of_old_layout
from attnlens.analysis.eigen import EigenResult
from attnlens.errors import BadInput
from attnlens.io.provenance import provenance
from attnlens.io.results import Result
from attnlens.progress import Progress, progress_bar
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


def overlap_curves(bases_a: np.ndarray, bases_b: np.ndarray, chunk_bytes: int = 1 << 27) -> np.ndarray:
    """Overlap at every d from 1 to D between every basis of A (k_a, n, D) and of B (k_b, n, D),
    both ordered by eigenvalue: (k_a, k_b, D), entry d − 1 the overlap of their first d columns.

    >>> u = np.linalg.qr(np.random.default_rng(0).standard_normal((6, 3)))[0]
    >>> overlap_curves(u[None], u[None]).round(6).tolist()
    [[[1.0, 1.0, 1.0]]]
    """
    a, b = np.asarray(bases_a, dtype=np.float64), np.asarray(bases_b, dtype=np.float64)
    dims = a.shape[-1]
    curves = np.empty((len(a), len(b), dims))
    step = max(1, chunk_bytes // (8 * len(b) * dims * dims))  # rows of A per chunk: bounded memory for many heads
    for start in range(0, len(a), step):
        curves[start : start + step] = _curves(np.matmul(a[start : start + step].swapaxes(-1, -2)[:, None], b[None]))
    return curves


def paired_curves(bases_a: np.ndarray, bases_b: np.ndarray) -> np.ndarray:
    """Overlap at every d of each basis of A (k, n, D) with the same unit's basis of B: (k, D).
    The split-half curves: the two bases are one unit's estimates from two halves of the data."""
    a, b = np.asarray(bases_a, dtype=np.float64), np.asarray(bases_b, dtype=np.float64)
    return _curves(np.matmul(a.swapaxes(-1, -2), b))


def _curves(products: np.ndarray) -> np.ndarray:
    """From products aᵀb (..., D, D) the overlap at every d (..., D): the sum of the squared
    entries of the top-left d × d block, over d (a running sum along both axes)."""
    blocks = (products**2).cumsum(-1).cumsum(-2)
    return np.diagonal(blocks, axis1=-2, axis2=-1) / np.arange(1, products.shape[-1] + 1)


def stable_dim(split_half_curve: np.ndarray, level: float) -> int:
    """The largest d at which a unit's split-half overlap has stayed at or above ``level`` for
    every d' ≤ d (0 when even its top direction is below): the dimensions the data determine.

    Past the spectral gap the eigenvectors of one half are a rotation of nearly equal
    eigenvalues and the split-half overlap falls away; comparing subspaces there compares noise.

    >>> stable_dim(np.array([1.0, 0.98, 0.95, 0.7, 0.92]), 0.9)
    3
    """
    below = np.flatnonzero(np.asarray(split_half_curve) < level)
    return int(below[0]) if len(below) else len(split_half_curve)


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


def _unit_keys(result: EigenResult, level: str, query: int) -> list[int]:
    """The number of keys each unit's rows span, in :func:`_unit_labels` order: n, or a windowed
    layer's window (the dimension its subspace lives in, which sets the chance level)."""
    table = result.table
    assert table is not None, "an eigen result always has its table"
    table = table[(table["level"] == level) & (table["query"] == query)]
    keys = {(int(row.layer), int(row.head)): int(row.num_keys) for row in table.itertuples()}
    return [keys.get(unit, result.n) for unit in _unit_labels(result, level)]


def _query_index(result: EigenResult, query: int | None) -> tuple[int, int]:
    """Position on the query axis, and the query it stands for (-1 when rows are pooled)."""
    queries = result.meta["settings"]["queries"]
    if queries is None:
        return 0, -1
    chosen = queries[-1] if query is None else query
    if chosen not in queries:
        raise BadInput(f"`query` {chosen} is not among the query positions of the eigen result ({queries[0]}…{queries[-1]})")
    return queries.index(chosen), chosen


class OverlapResult(Result):
    """Overlap matrices at one d (``arrays``), the overlap at every d up to ``max_dim``
    (``curve``), a tidy table of every pair (``table``), the split-half check of every unit
    (``split_half``, ``split_half_curves``) and the layer pairs compared at the d their data
    determine (``pairs``)."""

    kind = "overlap"
    figures_module = "attnlens.figures.overlap"

    @property
    def split_half(self) -> pd.DataFrame:
        return self.tables["split_half"]

    @property
    def split_half_curves(self) -> pd.DataFrame:
        return self.tables["split_half_curves"]

    @property
    def pairs(self) -> pd.DataFrame:
        return self.tables["pairs"]

    def summary(self) -> str:
        return f"d={self.dim} of n={self.meta['n']} ({self.meta['dim_rule']}), models {', '.join(self.meta['models'])}"

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def max_dim(self) -> int:
        return int(self.meta["max_dim"])

    @property
    def chance(self) -> float:
        return float(self.meta["chance"])

    def matrix(self, name: str) -> np.ndarray:
        """``layers_0`` (layer × layer of model 0), ``heads_0``, ``layers_0_1`` (model 0 × model 1), ..."""
        return self.arrays[f"{name}_overlap"]

    @property
    def comparisons(self) -> list[Comparison]:
        """Every matrix: its name, the level of its units and the two eigen results it compares,
        as recorded in ``meta["comparisons"]`` (results saved before that field: :func:`comparisons_of_old_layout`)."""
        recorded = self.meta.get("comparisons")
        if recorded is None:
            return comparisons_of_old_layout(len(self.meta["models"]), self.arrays)
        return [Comparison(**comparison) for comparison in recorded]

    def comparison(self, name: str) -> Comparison:
        """The comparison of matrix ``name`` (``layers_0``, ``heads_0_1``, ...)."""
        for comparison in self.comparisons:
            if comparison.name == name:
                return comparison
        raise BadInput(f"no overlap matrix '{name}'; the matrices are {', '.join(c.name for c in self.comparisons)}")

    def results_of(self, name: str) -> tuple[int, int]:
        """The two eigen results a matrix compares: ``layers_0`` -> (0, 0), ``heads_0_1`` -> (0, 1)."""
        comparison = self.comparison(name)
        return comparison.result_a, comparison.result_b

    def matrices(self, level: str) -> list[str]:
        """The names of the matrices of units at ``level`` ("layer", "head" or "model"), sorted."""
        return sorted(comparison.name for comparison in self.comparisons if comparison.level == level)

    @property
    def layer_matrices(self) -> list[str]:
        """The names of the layer × layer matrices: ``layers_0``, ``layers_0_1``, ``layers_1``, ..."""
        return self.matrices("layer")

    def curve(self, name: str) -> np.ndarray:
        """(units_a, units_b, max_dim): the overlap of matrix ``name`` at every d, entry d − 1 at d."""
        return self.arrays[f"{name}_curve"]

    def text(self) -> str:
        """The d of the matrices, every layer × layer matrix at it, and the layer pairs at the d their data determine."""
        lines = [f"matrices at d = {self.dim} ({self.meta['dim_rule']}); chance level d/n = {self.chance:.3f}"]
        for name in self.layer_matrices:
            first, last = self.results_of(name)
            models = self.meta["models"]
            lines.append(
                f"{models[first] if first == last else f'{models[first]} x {models[last]}'}: layer x layer overlap at d = {self.dim}"
            )
            lines.append(_format_matrix(self.matrix(name), self.meta["layers"][first], self.meta["layers"][last]))
        lines.append(f"layer pairs at the largest d where both split-half overlaps stay >= {self.meta['level']:g}:")
        lines.append(_format_pairs(self.pairs))
        return "\n".join(lines)


def _format_matrix(matrix: np.ndarray, rows: list[int], columns: list[int]) -> str:
    header = "      " + " ".join(f"L{label:<4}" for label in columns)
    lines = [f"L{label:<4} " + " ".join(f"{value:5.2f}" for value in row) for label, row in zip(rows, matrix)]
    return "\n".join([header, *lines])


def _format_pairs(pairs: pd.DataFrame) -> str:
    lines = [f"{'unit a':<16} {'unit b':<16} {'d':>3} {'overlap':>7} {'split-half a':>12} {'split-half b':>12} {'chance':>6}"]
    for _, row in pairs.iterrows():
        a, b = (f"{row[f'model_{x}']} " + (f"L{row[f'layer_{x}']}" if row[f"layer_{x}"] >= 0 else "all") for x in "ab")
        values = f"{row['overlap']:7.2f} {row['split_half_a']:12.2f} {row['split_half_b']:12.2f} {row['chance']:6.3f}"
        lines.append(f"{a:<16} {b:<16} {row['d']:>3} " + (values if row["d"] else "no d the data determine for both"))
    return "\n".join(lines)


@dataclass(frozen=True)
class OverlapSettings(Settings):
    """Settings of :func:`overlap`.

    ``dim``: the d of the overlap matrices; ``None`` picks it from the data (the median over
    layers of the largest d at which their split-half overlap stays at or above ``level``).
    ``max_dim``: the curves run from d = 1 to it (``None``: n/2, or the eigenvectors the
    eigen results keep if fewer). ``level``: the split-half overlap a d must keep to count as
    determined by the data. ``query``: the query position of per-query results (``None``: the last).
    """

    dim: int | None = None
    max_dim: int | None = None
    level: float = 0.9
    query: int | None = None

    def validate(self) -> None:
        if self.dim is not None:
            at_least("dim", self.dim, 1)
        if self.max_dim is not None:
            at_least("max_dim", self.max_dim, 1)
        if not 0 < self.level <= 1:
            raise BadInput(f"`level` {self.level} must be in (0, 1]: the split-half overlap a determined d keeps")
        if self.query is not None:
            at_least("query", self.query, 0)


def overlap(
    source: list[EigenResult] | EigenResult,
    settings: OverlapSettings | None = None,
    *,
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> OverlapResult:
    """Overlap of the top eigenspaces of the eigen results in ``source``: layer × layer and
    head × head within each result, layer × layer (and head × head) between every pair of
    results, each at every d from 1 to ``max_dim``, and the split-half overlap of every unit
    at every d. Per-query results use one query position (default: the last, whose keys are
    all valid even in causal models). ``settings`` (:class:`OverlapSettings`) with keyword
    ``changes`` applied.

    >>> import attnlens
    >>> spectra = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1], progress=False)
    >>> shared = overlap(spectra, max_dim=6)
    >>> shared.curve("layers_0").shape, 1 <= shared.dim <= 6
    ((2, 2, 6), True)
    """
    s = OverlapSettings.build(settings, **changes)
    results = [source] if isinstance(source, EigenResult) else list(source)
    n, max_dim = _check_dims(results, s)
    positions = [_query_index(result, s.query) for result in results]
    names = [result.meta["model"]["name"] for result in results]
    matrices = comparisons(len(results))
    bar = progress_bar(total=3 * len(results) + len(matrices), desc="overlap", unit="matrix", enabled=progress)
    halves = {}
    for i, result in enumerate(results):
        for level in ("head", "layer", "model"):
            halves[(i, level)] = paired_curves(*(_bases(result, level, max_dim, positions[i][0], half) for half in "ab"))
            bar.update(1)
    stable = {key: np.array([stable_dim(curve, s.level) for curve in curves]) for key, curves in halves.items()}
    layer_dims = np.concatenate([stable[(i, "layer")] for i in range(len(results))])
    dim = s.dim if s.dim is not None else max(1, int(np.median(layer_dims)))
    rule = "given" if s.dim is not None else f"median over layers of the largest d with split-half overlap ≥ {s.level:g}"
    arrays: dict[str, np.ndarray] = {}
    rows: list[dict] = []
    pairs: list[dict] = []

    def compare(key: str, level: str, i: int, j: int) -> None:
        a = _bases(results[i], level, max_dim, positions[i][0])
        b = _bases(results[j], level, max_dim, positions[j][0])
        overlaps, angles = overlap_matrix(a[..., :dim], b[..., :dim])
        curves = overlap_curves(a, b)
        arrays[f"{key}_overlap"], arrays[f"{key}_angles"], arrays[f"{key}_curve"] = overlaps, angles, curves
        units_a, units_b = _unit_labels(results[i], level), _unit_labels(results[j], level)
        keys_a, keys_b = _unit_keys(results[i], level, positions[i][1]), _unit_keys(results[j], level, positions[j][1])
        for (x, (layer_a, head_a)), (y, (layer_b, head_b)) in itertools.product(enumerate(units_a), enumerate(units_b)):
            unit = {"comparison": key, "level": level, "model_a": names[i], "layer_a": layer_a, "head_a": head_a}
            unit |= {"model_b": names[j], "layer_b": layer_b, "head_b": head_b}
            rows.append(
                unit
                | {
                    "overlap": overlaps[x, y],
                    "mean_angle_deg": float(np.degrees(angles[x, y]).mean()),
                    "max_angle_deg": float(np.degrees(angles[x, y]).max()),
                }
            )
            if level != "head" and (i != j or x < y):
                d = int(min(stable[(i, level)][x], stable[(j, level)][y]))
                space = max(keys_a[x], keys_b[y])  # a random subspace of the larger space meets the other at d / space
                pairs.append(unit | _pair_at(d, curves[x, y], halves[(i, level)][x], halves[(j, level)][y], space))

    for comparison in matrices:
        compare(comparison.name, comparison.level, comparison.result_a, comparison.result_b)
        bar.update(1)
    bar.close()
    split_rows, curve_rows = [], []
    for (i, level), curves in halves.items():
        arrays[f"split_half_{i}_{level}_curve"] = curves
        for unit, (layer, head) in enumerate(_unit_labels(results[i], level)):
            labels = {"result": i, "model": names[i], "level": level, "layer": layer, "head": head}
            split_rows.append(labels | {"overlap": curves[unit, dim - 1], "stable_dim": int(stable[(i, level)][unit])})
            curve_rows += [labels | {"d": d, "overlap": curves[unit, d - 1]} for d in range(1, max_dim + 1)]
    meta = {
        "settings": s.to_dict(),
        "dim": dim,
        "dim_rule": rule,
        "max_dim": max_dim,
        "level": s.level,
        "n": n,
        "chance": chance_overlap(dim, n),
        "models": names,
        "layers": [result.meta["layers"] for result in results],
        "num_heads": [result.meta["num_heads"] for result in results],
        "queries": [q for _, q in positions],
        "comparisons": [dataclasses.asdict(comparison) for comparison in matrices],
        "sources": [{"model": r.meta["model"], "corpus": r.meta["corpus"], "settings": r.meta["settings"]} for r in results],
        **provenance(command),
    }
    tables = {
        "table": pd.DataFrame(rows),
        "split_half": pd.DataFrame(split_rows),
        "split_half_curves": pd.DataFrame(curve_rows),
        "pairs": pd.DataFrame(pairs),
    }
    return OverlapResult(meta, tables, arrays)


def _check_dims(results: list[EigenResult], s: OverlapSettings) -> tuple[int, int]:
    """n of the results (all the same) and the largest d of the curves; the same result twice is refused."""
    if not results:
        raise BadInput("give at least one eigen result")
    for first, second in itertools.combinations(range(len(results)), 2):
        if _same_result(results[first], results[second]):
            where = results[first].path or f"result {first + 1}"
            raise BadInput(
                f"{where} is given twice (results {first + 1} and {second + 1} are the same eigen result); "
                "give each result once, or a second model's to compare across models"
            )
    n = results[0].n
    for result in results[1:]:
        if result.n != n:
            raise BadInput(
                f"eigen results have different n ({n} for {results[0].meta['model']['name']}, {result.n} for "
                f"{result.meta['model']['name']}); overlap compares subspaces of the same R^n: use the same `seq_len`"
            )
    keep = min(result.keep for result in results)
    for name, value in (("dim", s.dim), ("max_dim", s.max_dim)):
        if value is not None and value > n:
            raise BadInput(f"`{name}` {value} is out of range; it must be between 1 and n = {n}")
        if value is not None and value > keep:
            raise BadInput(
                f"`{name}` {value} is above the {keep} eigenvectors the eigen result keeps; rerun eigen with `keep` {value}"
            )
    max_dim = s.max_dim if s.max_dim is not None else min(max(n // 2, 1), keep)
    return n, max(max_dim, s.dim or 1)


def _same_result(a: EigenResult, b: EigenResult) -> bool:
    """The same directory, or the same run (made at the same moment by the same command)."""
    if a.path is not None and b.path is not None and Path(a.path).resolve() == Path(b.path).resolve():
        return True
    return a is b or all(a.meta.get(key) == b.meta.get(key) for key in ("created", "command", "model", "settings"))


def _pair_at(d: int, cross: np.ndarray, split_a: np.ndarray, split_b: np.ndarray, n: int) -> dict:
    """Two units compared at ``d``, the largest d at which both their split-half overlaps stay at
    or above the level (d = 0, overlaps NaN, when one's top direction is already below it); ``n``
    the dimension of the larger of their two spaces (a windowed layer's rows span its window)."""
    at = (lambda curve: float(curve[d - 1])) if d else (lambda curve: float("nan"))
    return {
        "d": d,
        "overlap": at(cross),
        "split_half_a": at(split_a),
        "split_half_b": at(split_b),
        "chance": d / n,
    }
