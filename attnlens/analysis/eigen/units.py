"""Every unit's spectrum: of its rows, from the moments of two halves (:func:`analyse_moments`), and of
its whole score matrices, from a store (:func:`matrix_analysis`), each beside its Gaussian baseline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.spectra import UnitSpectrum, gaussian_baseline, matrix_baseline, matrix_spectrum, summarise, unit_spectrum
from attnlens.io.store_reader import Store
from attnlens.progress import Progress, progress_bar
from attnlens.rows.moments import LEVELS, HalfMoments, Moments, level_shape, unit_sums


def analyse_moments(
    halves: HalfMoments,
    *,
    centred: bool = True,
    project_ones: bool = False,
    keep: int = 32,
    seed: int = 0,
    progress: Progress = False,
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
    rows: list[dict] = []
    arrays: dict[str, np.ndarray] = {}
    shapes = {level: level_shape(a, level) for level in LEVELS}
    with progress_bar(
        total=int(sum(np.prod(shape) for shape in shapes.values())), desc="eigen", unit="unit", enabled=progress
    ) as bar:
        for level, shape in shapes.items():
            values = np.zeros((*shape, n))
            baseline = np.zeros((*shape, n))
            means = np.zeros((*shape, n))
            vectors = {suffix: np.zeros((*shape, n, keep), dtype=np.float32) for suffix in ("", "_a", "_b")}
            for index in np.ndindex(shape):
                units = {
                    "": unit_sums((a, b), level, index),
                    "_a": unit_sums((a,), level, index),
                    "_b": unit_sums((b,), level, index),
                }
                total = units[""]
                moment, complete = total.second_moment(centred), total.complete_keys()
                spectrum = unit_spectrum(moment, complete, keep, project_ones)
                values[index], vectors[""][index] = spectrum.eigenvalues, spectrum.eigenvectors
                for suffix in ("_a", "_b"):
                    part = units[suffix]
                    vectors[suffix][index] = unit_spectrum(
                        part.second_moment(centred), part.complete_keys(), keep, project_ones
                    ).eigenvectors
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
        "query": moments.queries[query] if moments.queries is not None else -1,  # per query position
        "rows": count,
        "num_keys": spectrum.keys,
        "total_variance": spectrum.total_variance,
        "ones_variance": spectrum.ones_variance,
        "ones_fraction": spectrum.ones_variance / spectrum.total_variance if spectrum.total_variance > 0 else 0.0,
        "top_eigenvalue": float(spectrum.eigenvalues[0]),
        **summarise(spectrum.eigenvalues),
        **summarise(baseline, "baseline_"),
        **(spectrum.last.columns() if spectrum.last is not None else {}),
    }


def matrix_analysis(
    store: Store, layers: list[int], quantity: str, centred: bool, keep: int, seed: int, progress: Progress
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    from attnlens.rows.accumulate import row_values

    rng = np.random.default_rng(seed)
    rows, values_by_unit, vectors_by_unit = [], [], []
    with progress_bar(total=len(layers), desc="matrices", unit="layer", enabled=progress) as bar:
        for layer in layers:
            x = row_values(
                torch.from_numpy(np.array(store.scores(layer))), torch.from_numpy(np.array(store.valid(layer))), quantity
            )
            entries = np.asarray(store.valid(layer)).all(0).ravel()  # entries valid in every sequence
            flat = x.reshape(x.shape[0], x.shape[1], -1)[:, :, torch.from_numpy(entries)].numpy()
            units = [(head, flat[:, head]) for head in range(store.num_heads)] + [(-1, flat.reshape(-1, flat.shape[-1]))]
            for head, matrices in units:
                values, factor = matrix_spectrum(matrices, centred)
                variances = matrices.var(0, ddof=1) if centred else (matrices**2).mean(0)
                baseline = matrix_baseline(variances, len(matrices), centred, rng)
                rows.append(
                    {
                        "level": "head" if head >= 0 else "layer",
                        "layer": layer,
                        "head": head,
                        "sequences": len(matrices),
                        "entries": int(entries.sum()),
                        "total_variance": float(values.sum()),
                        "top_eigenvalue": float(values[0]),
                        **summarise(values),
                        **summarise(baseline, "baseline_"),
                    }
                )
                padded = np.zeros(store.num_seqs * store.num_heads)
                padded[: len(values)] = values
                values_by_unit.append(padded)
                full = np.zeros((store.n * store.n, keep), dtype=np.float32)
                full[entries, : min(keep, factor.shape[1])] = factor[:, :keep]
                vectors_by_unit.append(full)
            bar.update(1)
    return pd.DataFrame(rows), {"matrix_eigenvalues": np.stack(values_by_unit), "matrix_eigenvectors": np.stack(vectors_by_unit)}
