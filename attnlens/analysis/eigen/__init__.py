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

The parts: :mod:`~attnlens.analysis.eigen.settings` (:class:`EigenSettings`),
:mod:`~attnlens.analysis.eigen.units` (every unit's spectrum, from moments or whole matrices),
:mod:`~attnlens.analysis.eigen.notes` (what the result says in words),
:mod:`~attnlens.analysis.eigen.moments` (moments computed beforehand) and
:mod:`~attnlens.analysis.eigen.result` (:class:`EigenResult`); the spectra themselves are
:mod:`attnlens.analysis.spectra`.

>>> import attnlens
>>> result = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0], progress=False)
>>> row = result.table.query("level == 'layer'").iloc[0]
>>> int(row.layer), bool(1 <= row.k90 <= 16), bool(row.k90 <= row.baseline_k90)
(0, True, True)
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnlens.analysis.eigen.moments import eigen_of_moments
from attnlens.analysis.eigen.notes import fixed_tokens, last_direction_notes, window_notes, windowed_layers
from attnlens.analysis.eigen.result import EigenResult
from attnlens.analysis.eigen.settings import EigenSettings
from attnlens.analysis.eigen.units import analyse_moments, matrix_analysis

# the spectra themselves (re-exported: callers import them from here too)
from attnlens.analysis.spectra import (  # noqa: F401
    ENERGY_LEVELS,
    ISOLATED_GAP,
    LastDirection,
    UnitSpectrum,
    components_for_energy,
    deterministic_sign,
    effective_rank,
    gaussian_baseline,
    last_direction,
    matrix_baseline,
    matrix_spectrum,
    summarise,
    unit_spectrum,
)
from attnlens.errors import BadInput
from attnlens.io.provenance import provenance
from attnlens.io.store_layout import is_store
from attnlens.io.store_reader import Store
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, split
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.moments import split_halves
from attnlens.rows.sources import StoreRows, is_moments_source, open_rows


def eigen(
    source: str | Path | Store | LoadedModel = "minilm-l6",
    settings: EigenSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: object,
) -> EigenResult:
    """Eigen analysis of attention rows, from a store directory, straight from a model, or
    from moments computed beforehand; ``settings`` (:class:`EigenSettings`) with
    ``changes`` applied (``eigen("minilm-l6", num_seqs=64)``).

    ``source`` is a store path (or :class:`Store`) or a model (alias, path, Hub id, or
    :class:`LoadedModel`); with a model, the corpus settings choose the blocks and nothing
    is written to disk. ``source`` may also be merged moments: the work directory of
    ``attnlens moments`` or a moments result (``attnlens merge``). Their rows were chosen
    when the moments were computed; ``layers`` and ``queries`` may pick among theirs, and
    the result refers to the moments (it does not copy them).
    """
    settings = EigenSettings.build(settings, **changes)
    if isinstance(source, (str, Path)) and is_moments_source(source):
        return eigen_of_moments(source, settings, progress=progress, command=command)
    if settings.full_matrices and not isinstance(source, Store) and not is_store(Path(str(source))):
        raise BadInput(
            "`full_matrices` analysis reads the matrices of each sequence from a store; run 'attnlens extract' first and give its directory"
        )
    quantity = settings.quantity or "scores"
    s = settings.replace(quantity=quantity)
    rows = open_rows(source, corpus=s.corpus, seq_len=s.seq_len, num_seqs=s.num_seqs, seed=s.seed, device=device)
    queries = _queries(s, rows.n)
    # The moments' pass over the blocks takes most of the time (from a model, 2 CPU cores: 4/5 to 19/20).
    moments_progress, analysis_progress, matrices_progress = split(progress, 9, 1, 1 if s.full_matrices else 0)
    halves = compute_moments(
        rows,
        quantity=quantity,
        queries=queries,
        layers=s.layers,
        batch_size=s.batch_size,
        seed=s.seed,
        progress=moments_progress,
    )
    table, arrays = analyse_moments(
        halves, centred=s.centred, project_ones=s.project_ones, keep=s.keep, seed=s.seed, progress=analysis_progress
    )
    check_rows(table)
    tables = {"table": table}
    if s.full_matrices:
        assert isinstance(rows, StoreRows), "full_matrices reads the matrices from a store (checked above)"
        tables["matrix_table"], matrix_arrays = matrix_analysis(
            rows.store, list(halves.a.layers), quantity, s.centred, min(s.keep, 8), s.seed, matrices_progress
        )
        arrays.update(matrix_arrays)
    meta = {
        "model": rows.model_info,
        "corpus": {
            **rows.corpus_info,
            "block_index": rows.block_index.tolist(),
            "half_of_block": split_halves(rows.num_seqs, s.seed).tolist(),
        },
        "n": rows.n,
        "layers": list(halves.a.layers),
        "num_heads": halves.a.num_heads,
        "settings": {**s.to_dict(), "corpus": rows.corpus_info.get("source"), "queries": queries, "keep": min(s.keep, rows.n)},
        **provenance(command),
    }
    windows = windowed_layers(table, rows.n)
    if windows:
        meta["windows"] = windows
    positions = fixed_tokens(rows)
    if positions:
        meta["fixed_tokens"] = positions
    notes = last_direction_notes(table, positions, windows) | window_notes(windows, rows.n, bool(rows.model_info.get("causal")))
    if notes:
        meta["notes"] = notes
    return EigenResult(meta, tables, arrays, moments=halves)


def check_rows(table: pd.DataFrame) -> None:
    """Refuse a result with a layer that no row entered, naming the layer and what fits (never zeros)."""
    empty = table[(table["level"] == "layer") & (table["rows"] == 0)]
    if len(empty):
        row = empty.iloc[0]
        where = f"query {row.query}" if row.query >= 0 else "pooled rows"
        raise BadInput(
            f"layer {row.layer} has no rows for {where} (no query there sees its keys); "
            "choose query positions it sees (`queries`), or pooled rows (no `per_query`)"
        )


def _queries(settings: EigenSettings, n: int) -> list[int] | None:
    """The query positions analysed one by one (None: rows pooled over queries)."""
    if settings.per_query and settings.queries is None:
        return list(range(n))
    if settings.queries is None:
        return None
    bad = [q for q in settings.queries if q >= n]
    if bad:
        raise BadInput(f"`queries` {bad[0]} is out of range; query positions run from 0 to {n - 1}")
    return sorted(set(settings.queries))
