"""Eigen analysis of attention rows (and of whole score matrices), against a baseline.

The first paper's claim: pre-softmax score rows vary mostly inside a low-dimensional
subspace. :func:`eigen` reads moments (from a store, or straight from a model) and,
for every head, every layer (heads pooled) and the whole model, reports the spectrum
of the row covariance: eigenvalues in descending order, the top eigenvectors with a
deterministic sign, the explained-energy curve, the number of components reaching
90/95/99% of the energy, and the effective rank (participation ratio). "Low" is read
against a baseline of the same shape: Gaussian rows with the same per-key variances
and the same number of rows (so that sampling noise is in the baseline too).

Options: ``quantity`` (scores, weights, log-weights), ``centred`` (covariance) or the
uncentred second moment, ``project_ones`` (remove the all-ones direction, which
softmax ignores; the variance it held is reported either way), per query position
(``queries``), and ``full_matrices``: the flattened n×n matrices of each sequence,
through the Gram matrix of the sequences (never an n²×n² covariance).

>>> import attnlens
>>> result = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0], progress=False)
>>> row = result.table.query("level == 'layer'").iloc[0]
>>> int(row.layer), bool(1 <= row.k90 <= 16), bool(row.k90 <= row.baseline_k90)
(0, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnlens.data.corpus import Corpus
from attnlens.errors import AttnlensError
from attnlens.models.loading import LoadedModel
from attnlens.rows.moments import LEVELS, QUANTITIES, HalfMoments, Moments, compute_moments, level_shape, unit_sums
from attnlens.progress import progress_bar
from attnlens.io.provenance import provenance
from attnlens.io.results import read_result_dir, register_result, write_result
from attnlens.rows.sources import open_rows
from attnlens.rows.partials import is_moments_source
from attnlens.io.store import Store, is_store

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
    summary = {f"{prefix}k{round(level * 100)}": components_for_energy(values, level) for level in ENERGY_LEVELS}
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
    return UnitSpectrum(values, vectors, ones_variance, float(np.trace(moment[np.ix_(keys, keys)])), len(keys))


# ---------------------------------------------------------------------- result


@register_result("eigen")
class EigenResult:
    """Spectra of every unit at every level; see :func:`eigen`.

    ``table``: one row per unit (``level`` head / layer / model, ``layer`` and
    ``head`` = -1 where pooled, ``query`` = -1 when rows are pooled over queries).
    ``arrays[f"{level}_eigenvalues"]`` etc. have shape (L, H, Q, ...) with H = 1 for
    layers and L = H = 1 for the model; eigenvectors (..., n, keep) are float32 and in
    full key coordinates; ``_a`` / ``_b`` are the same from two halves of the data.
    """

    def __init__(self, meta: dict, table: pd.DataFrame, arrays: dict[str, np.ndarray],
                 matrix_table: pd.DataFrame | None = None, moments: HalfMoments | None = None) -> None:
        self.meta = meta
        self.table = table
        self.arrays = arrays
        self.matrix_table = matrix_table
        self.moments = moments

    @property
    def n(self) -> int:
        return int(self.meta["n"])

    @property
    def keep(self) -> int:
        return int(self.meta["settings"]["keep"])

    def eigenvectors(self, level: str, half: str = "") -> np.ndarray:
        """(L, H, Q, n, keep) top eigenvectors at ``level``; ``half`` "a" or "b" for the halves."""
        return self.arrays[f"{level}_eigenvectors" + (f"_{half}" if half else "")]

    def save(self, out: str | Path, overwrite: bool = False, figures: bool = True) -> Path:
        tables = {"table": self.table}
        if self.matrix_table is not None:
            tables["matrix_table"] = self.matrix_table

        def extra(directory: Path) -> None:
            if self.moments is not None:
                self.moments.save(directory)
            if figures:
                from attnlens.figures import save_figures

                save_figures(self, directory / "figures")

        return write_result(out, "eigen", self.meta, tables=tables, arrays=self.arrays, overwrite=overwrite, extra=extra)

    @classmethod
    def load(cls, path: str | Path) -> EigenResult:
        meta, tables, arrays = read_result_dir(path, "eigen")
        moments = HalfMoments.load(path) if (Path(path) / "moments_a.npz").is_file() else None
        return cls(meta, tables["table"], arrays, tables.get("matrix_table"), moments)

    def __repr__(self) -> str:
        return f"EigenResult(model={self.meta['model']['name']!r}, n={self.n}, quantity={self.meta['settings']['quantity']!r})"


def analyse_moments(
    halves: HalfMoments, *, centred: bool = True, project_ones: bool = False, keep: int = 32, seed: int = 0,
    progress: bool = False,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Spectra of every unit at every level, from the moments of two halves.

    One unit at a time: its sums (pooled over heads, or heads and layers, at the coarser
    levels) are read, its covariance formed and decomposed, so memory holds a few n × n
    matrices, whatever the number of units; the moments may be memory-mapped
    (:func:`attnlens.rows.partials.load_moments`) and larger than memory.
    """
    rng = np.random.default_rng(seed)
    a, b = halves.a, halves.b
    n = a.n
    keep = min(keep, n)
    rows, arrays = [], {}
    shapes = {level: level_shape(a, level) for level in LEVELS}
    with progress_bar(total=int(sum(np.prod(shape) for shape in shapes.values())), desc="eigen", unit="unit",
                      enabled=progress) as bar:
        for level, shape in shapes.items():
            values = np.zeros((*shape, n))
            baseline = np.zeros((*shape, n))
            means = np.zeros((*shape, n))
            vectors = {suffix: np.zeros((*shape, n, keep), dtype=np.float32) for suffix in ("", "_a", "_b")}
            for index in np.ndindex(shape):
                units = {"": unit_sums((a, b), level, index), "_a": unit_sums((a,), level, index), "_b": unit_sums((b,), level, index)}
                total = units[""]
                moment, complete = total.second_moment(centred), total.complete_keys()
                spectrum = unit_spectrum(moment, complete, keep, project_ones)
                values[index], vectors[""][index] = spectrum.eigenvalues, spectrum.eigenvectors
                for suffix in ("_a", "_b"):
                    part = units[suffix]
                    vectors[suffix][index] = unit_spectrum(part.second_moment(centred), part.complete_keys(), keep, project_ones).eigenvectors
                variances = np.diag(moment)[complete]
                if project_ones and complete.any():  # the baseline loses the same direction
                    variances = variances * (1 - 1 / complete.sum())
                baseline[index][: complete.sum()] = gaussian_baseline(variances, int(total.count), centred, rng)
                means[index] = total.mean()
                rows.append(_table_row(level, index, a, int(total.count), spectrum, baseline[index]))
                bar.update(1)
            arrays[f"{level}_eigenvalues"] = values
            arrays[f"{level}_baseline"] = baseline
            arrays[f"{level}_mean"] = means
            for suffix, array in vectors.items():
                arrays[f"{level}_eigenvectors{suffix}"] = array
    return pd.DataFrame(rows), arrays


def _table_row(level: str, index: tuple, moments: Moments, count: int, spectrum: UnitSpectrum, baseline: np.ndarray) -> dict:
    layer, head, query = index
    return {
        "level": level,
        "layer": moments.layers[layer] if level != "model" else -1,
        "head": head if level == "head" else -1,
        "query": moments.queries[query] if moments.per_query else -1,
        "rows": count,
        "num_keys": spectrum.keys,
        "total_variance": spectrum.total_variance,
        "ones_variance": spectrum.ones_variance,
        "ones_fraction": spectrum.ones_variance / spectrum.total_variance if spectrum.total_variance > 0 else 0.0,
        "top_eigenvalue": float(spectrum.eigenvalues[0]),
        **summarise(spectrum.eigenvalues),
        **summarise(baseline, "baseline_"),
    }


# ---------------------------------------------------------------------- full matrices


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


def _matrix_analysis(store: Store, layers: list[int], quantity: str, centred: bool, keep: int, seed: int,
                     progress: bool) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    from attnlens.rows.moments import row_values

    rng = np.random.default_rng(seed)
    rows, values_by_unit, vectors_by_unit = [], [], []
    with progress_bar(total=len(layers), desc="matrices", unit="layer", enabled=progress) as bar:
        for layer in layers:
            x = row_values(torch.from_numpy(np.array(store.scores(layer))), torch.from_numpy(np.array(store.valid(layer))), quantity)
            entries = np.asarray(store.valid(layer)).all(0).ravel()  # entries valid in every sequence
            flat = x.reshape(x.shape[0], x.shape[1], -1)[:, :, torch.from_numpy(entries)].numpy()
            units = [(head, flat[:, head]) for head in range(store.num_heads)] + [(-1, flat.reshape(-1, flat.shape[-1]))]
            for head, matrices in units:
                values, factor = matrix_spectrum(matrices, centred)
                variances = matrices.var(0, ddof=1) if centred else (matrices**2).mean(0)
                baseline = _matrix_baseline(variances, len(matrices), centred, rng)
                rows.append({"level": "head" if head >= 0 else "layer", "layer": layer, "head": head,
                             "sequences": len(matrices), "entries": int(entries.sum()),
                             "total_variance": float(values.sum()), "top_eigenvalue": float(values[0]),
                             **summarise(values), **summarise(baseline, "baseline_")})
                padded = np.zeros(store.num_seqs * store.num_heads)
                padded[: len(values)] = values
                values_by_unit.append(padded)
                full = np.zeros((store.n * store.n, keep), dtype=np.float32)
                full[entries, : min(keep, factor.shape[1])] = factor[:, :keep]
                vectors_by_unit.append(full)
            bar.update(1)
    return pd.DataFrame(rows), {"matrix_eigenvalues": np.stack(values_by_unit), "matrix_eigenvectors": np.stack(vectors_by_unit)}


def _matrix_baseline(variances: np.ndarray, count: int, centred: bool, rng: np.random.Generator) -> np.ndarray:
    """Spectrum of ``count`` Gaussian matrices with matched per-entry variance (via the Gram matrix)."""
    draws = rng.standard_normal((count, len(variances))) * np.sqrt(variances)
    return matrix_spectrum(draws, centred)[0]


# ---------------------------------------------------------------------- entry point


def eigen(
    source: str | Path | Store | LoadedModel = "minilm-l6",
    *,
    corpus: str | Path | Corpus = "kjv",
    seq_len: int = 128,
    num_seqs: int = 256,
    batch_size: int = 32,
    quantity: str | None = None,
    centred: bool = True,
    project_ones: bool = False,
    queries: list[int] | None = None,
    per_query: bool = False,
    full_matrices: bool = False,
    keep: int = 32,
    layers: list[int] | None = None,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
    command: str | None = None,
) -> EigenResult:
    """Eigen analysis of attention rows, from a store directory, straight from a model, or
    from moments computed beforehand.

    ``source`` is a store path (or :class:`Store`) or a model (alias, path, Hub id, or
    :class:`LoadedModel`); with a model, ``corpus``, ``seq_len``, ``num_seqs`` and
    ``seed`` choose the blocks and nothing is written to disk. ``per_query=True``
    analyses every query position separately (``queries`` picks some). ``quantity`` is
    ``"scores"`` unless given.

    ``source`` may also be merged moments: the work directory of ``attnlens moments``
    or a moments result (``attnlens merge``). Their rows were chosen when the moments
    were computed; ``layers`` and ``queries`` may pick among theirs, and the result
    refers to the moments (it does not copy them).
    """
    if quantity is not None and quantity not in QUANTITIES:
        raise AttnlensError(f"--quantity {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
    if keep < 1:
        raise AttnlensError(f"--keep {keep} must be at least 1")
    if isinstance(source, (str, Path)) and is_moments_source(source):
        return _eigen_of_moments(source, quantity=quantity, centred=centred, project_ones=project_ones, queries=queries,
                                 per_query=per_query, full_matrices=full_matrices, keep=keep, layers=layers, seed=seed,
                                 progress=progress, command=command)
    quantity = quantity or "scores"
    if full_matrices and not isinstance(source, Store) and not is_store(Path(str(source))):
        raise AttnlensError("full-matrix analysis reads the matrices of each sequence from a store; run 'attnlens extract' first and give its directory")
    rows = open_rows(source, corpus=corpus, seq_len=seq_len, num_seqs=num_seqs, seed=seed, device=device)
    n = rows.n
    if per_query and queries is None:
        queries = list(range(n))
    if queries is not None:
        bad = [q for q in queries if not 0 <= q < n]
        if bad:
            raise AttnlensError(f"--queries {bad[0]} is out of range; query positions run from 0 to {n - 1}")
    halves = compute_moments(rows, quantity=quantity, queries=queries, layers=layers, batch_size=batch_size, seed=seed,
                             progress=progress)
    table, arrays = analyse_moments(halves, centred=centred, project_ones=project_ones, keep=keep, seed=seed, progress=progress)
    matrix_table = None
    if full_matrices:
        matrix_table, matrix_arrays = _matrix_analysis(rows.store, list(halves.a.layers), quantity, centred, min(keep, 8), seed, progress)
        arrays.update(matrix_arrays)
    meta = {
        "model": rows.model_info,
        "corpus": rows.corpus_info,
        "n": n,
        "layers": list(halves.a.layers),
        "num_heads": halves.a.num_heads,
        "settings": {"quantity": quantity, "centred": centred, "project_ones": project_ones,
                     "queries": queries, "full_matrices": full_matrices, "keep": min(keep, n), "seed": seed},
        **provenance(command),
    }
    return EigenResult(meta, table, arrays, matrix_table, halves)


def _eigen_of_moments(
    source: str | Path, *, quantity: str | None, centred: bool, project_ones: bool, queries: list[int] | None,
    per_query: bool, full_matrices: bool, keep: int, layers: list[int] | None, seed: int, progress: bool,
    command: str | None,
) -> EigenResult:
    """:func:`eigen` of merged moments (see there)."""
    from attnlens.rows.partials import load_moments

    if full_matrices:
        raise AttnlensError(f"full-matrix analysis reads the matrices of each sequence from a store; {source} holds moments only")
    merged = load_moments(source)
    made = merged.settings
    if quantity is not None and quantity != made["quantity"]:
        raise AttnlensError(
            f"the moments in {source} are of {made['quantity']}, not {quantity}; the quantity is chosen when the moments are "
            f"computed: attnlens moments --quantity {quantity}"
        )
    if (per_query or queries is not None) and made["queries"] is None:
        raise AttnlensError(f"the moments in {source} pool rows over queries; compute per-query moments with attnlens moments --per-query or --queries")
    halves = _select(merged.halves, layers, queries, source)
    n = made["n"]
    table, arrays = analyse_moments(halves, centred=centred, project_ones=project_ones, keep=keep, seed=seed, progress=progress)
    meta = {
        "model": merged.meta["model"],
        "corpus": merged.meta["corpus"],
        "n": n,
        "layers": list(halves.a.layers),
        "num_heads": halves.a.num_heads,
        "settings": {"quantity": made["quantity"], "centred": centred, "project_ones": project_ones,
                     "queries": None if halves.a.queries is None else list(halves.a.queries), "full_matrices": False,
                     "keep": min(keep, n), "seed": seed},
        "moments": {"path": str(merged.path), "num_seqs": made["num_seqs"], "seed": made["seed"],
                    "accumulate": made["accumulate"], "run": merged.meta.get("run")},
        **provenance(command),
    }
    return EigenResult(meta, table, arrays)


def _select(halves: HalfMoments, layers: list[int] | None, queries: list[int] | None, source: object) -> HalfMoments:
    """The chosen layers and query positions of (memory-mapped) moments: without a choice the
    moments stay mapped; a choice reads the chosen units into memory."""
    moments = halves.a
    if layers is None and (queries is None or list(queries) == list(moments.queries)):
        return halves
    layers = list(moments.layers) if layers is None else sorted(set(layers))
    missing = [layer for layer in layers if layer not in moments.layers]
    if missing:
        raise AttnlensError(f"layer {missing[0]} is not in the moments in {source}; they hold layers {list(moments.layers)}")
    chosen = list(moments.queries) if queries is None or moments.queries is None else sorted(set(queries))
    if moments.queries is not None:
        absent = [q for q in chosen if q not in moments.queries]
        if absent:
            raise AttnlensError(f"query {absent[0]} is not in the moments in {source}; they hold query positions {list(moments.queries)}")
    layer_at = [moments.layers.index(layer) for layer in layers]
    query_at = [0] if moments.queries is None else [moments.queries.index(q) for q in chosen]

    def pick(part: Moments) -> Moments:
        take = lambda array: np.take(np.take(array, layer_at, axis=0), query_at, axis=2)
        return Moments(part.quantity, part.n, layers, part.num_heads, None if part.queries is None else chosen,
                       count=take(part.count), key_count=take(part.key_count), sum=take(part.sum), sum_outer=take(part.sum_outer))

    return HalfMoments(pick(halves.a), pick(halves.b))
