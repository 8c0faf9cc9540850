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
from attnlens.io.results import Result, format_table
from attnlens.io.store import Store, is_store
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar, split
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.moments import LEVELS, QUANTITIES, HalfMoments, Moments, level_shape, split_halves, unit_sums
from attnlens.rows.sources import is_moments_source, open_rows
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero, one_of

# ---------------------------------------------------------------------- result


class EigenResult(Result):
    """Spectra of every unit at every level; see :func:`eigen`.

    ``table``: one row per unit (``level`` head / layer / model, ``layer`` and
    ``head`` = -1 where pooled, ``query`` = -1 when rows are pooled over queries).
    ``arrays[f"{level}_eigenvalues"]`` etc. have shape (L, H, Q, ...) with H = 1 for
    layers and L = H = 1 for the model; eigenvectors (..., n, keep) are float32 and in
    full key coordinates; ``_a`` / ``_b`` are the same from two halves of the data.
    """

    kind = "eigen"
    figures_module = "attnlens.figures.eigen"
    shown = {"table": ("level", "layer", "head", "query", "rows", "k90", "k95", "k99", "effective_rank", "baseline_k90")}

    def __init__(
        self,
        meta: dict,
        tables: dict[str, pd.DataFrame],
        arrays: dict[str, np.ndarray],
        path: Path | None = None,
        moments: HalfMoments | None = None,
    ) -> None:
        super().__init__(meta, tables, arrays, path)
        self.moments = moments  # the row moments of the two halves, when computed here (not for moments read from disk)

    @property
    def matrix_table(self) -> pd.DataFrame | None:
        """Spectra of whole score matrices (``full_matrices``), else None."""
        return self.tables.get("matrix_table")

    @property
    def n(self) -> int:
        return int(self.meta["n"])

    @property
    def keep(self) -> int:
        return int(self.meta["settings"]["keep"])

    def eigenvectors(self, level: str, half: str = "") -> np.ndarray:
        """(L, H, Q, n, keep) top eigenvectors at ``level``; ``half`` "a" or "b" for the halves."""
        return self.arrays[f"{level}_eigenvectors" + (f"_{half}" if half else "")]

    def _save_extra(self, directory: Path) -> None:
        if self.moments is not None:
            self.moments.save(directory)

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> EigenResult:
        moments = HalfMoments.load(path) if (path / "moments_a.npz").is_file() else None
        return cls(meta, tables, arrays, path, moments)

    def summary(self) -> str:
        settings = self.settings
        return f"n={self.n}, {settings['quantity']}, {len(self.meta['layers'])} layers x {self.meta['num_heads']} heads"

    def text(self) -> str:
        """Per layer and for the model (heads pooled; the last query analysed): components for 90, 95
        and 99% of the energy, the effective rank, and the Gaussian baseline's k90."""
        table = self.table
        pooled = table[(table["level"] != "head") & (table["query"] == table["query"].max())]
        notes = [f"{unit}: {note}" for unit, note in self.meta.get("notes", {}).items()]  # what a reader should know
        return "\n".join([format_table(self.view(frame=pooled.drop(columns=["head", "query"]))), *self.notes_for(pooled), *notes])


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
    rows, arrays = [], {}
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
        "query": moments.queries[query] if moments.per_query else -1,
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


# ---------------------------------------------------------------------- full matrices


def _matrix_analysis(
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


# ---------------------------------------------------------------------- settings


@dataclass(frozen=True)
class EigenSettings(CorpusSettings):
    """What :func:`eigen` computes, and from which rows (the corpus fields apply when the source is a model).

    ``quantity``: ``scores`` (the default, pre-softmax), ``weights`` or ``log-weights``;
    ``centred``: covariance, else the uncentred second moment; ``project_ones``: remove
    the all-ones direction, which softmax ignores; ``per_query`` / ``queries``: one
    analysis per query position (all, or those listed) instead of pooling rows over
    queries; ``full_matrices``: also the spectra of whole n×n matrices (from a store);
    ``keep``: eigenvectors kept per unit; ``layers``: default all.
    """

    num_seqs: int = 256
    quantity: str | None = None
    centred: bool = True
    project_ones: bool = False
    per_query: bool = False
    queries: tuple[int, ...] | None = None
    full_matrices: bool = False
    keep: int = 32
    layers: tuple[int, ...] | None = None

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 1)
        at_least("keep", self.keep, 1)
        if self.quantity is not None:
            one_of("quantity", self.quantity, QUANTITIES)
        numbered_from_zero("queries", self.queries, "query positions")
        numbered_from_zero("layers", self.layers)


# ---------------------------------------------------------------------- entry point


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
        return _eigen_of_moments(source, settings, progress=progress, command=command)
    if settings.full_matrices and not isinstance(source, Store) and not is_store(Path(str(source))):
        raise BadInput(
            "`full_matrices` analysis reads the matrices of each sequence from a store; run 'attnlens extract' first and give its directory"
        )
    s = settings.replace(quantity=settings.quantity or "scores")
    rows = open_rows(source, corpus=s.corpus, seq_len=s.seq_len, num_seqs=s.num_seqs, seed=s.seed, device=device)
    queries = _queries(s, rows.n)
    # The moments' pass over the blocks takes most of the time (from a model, 2 CPU cores: 4/5 to 19/20).
    moments_progress, analysis_progress, matrices_progress = split(progress, 9, 1, 1 if s.full_matrices else 0)
    halves = compute_moments(
        rows,
        quantity=s.quantity,
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
        tables["matrix_table"], matrix_arrays = _matrix_analysis(
            rows.store, list(halves.a.layers), s.quantity, s.centred, min(s.keep, 8), s.seed, matrices_progress
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


def windowed_layers(table: pd.DataFrame, n: int) -> dict[str, int]:
    """``{layer: keys}`` of the layers whose pooled rows see fewer than n keys: windowed layers
    (a sliding or local window shorter than n), whose rows are the windows, end-aligned."""
    pooled = table[(table["level"] == "layer") & (table["query"] == -1) & (table["num_keys"] < n)]
    return {str(int(row.layer)): int(row.num_keys) for row in pooled.itertuples()}


def window_notes(windows: dict[str, int], n: int, causal: bool) -> dict[str, str]:
    """What a windowed layer's rows are, in words (one note for all of them)."""
    if not windows:
        return {}
    widths = sorted(set(windows.values()))
    frame = (
        "the offset of each key from its query, as in every layer of a causal model"
        if causal
        else "the offset of each key from the window's end, not its position in the block (full layers' rows are in "
        "block positions, so the model level pools two frames)"
    )
    return {
        "windowed layers": f"layers {', '.join(windows)} see windows of {'/'.join(map(str, widths))} of the {n} keys: their "
        f"rows are the keys each query sees, on the last key coordinates; a coordinate is {frame}"
    }


def fixed_tokens(rows) -> dict[str, str]:
    """Key positions that hold the same token in every analysed block (the special tokens a
    block is packed with, e.g. ``[CLS]`` at 0 and ``[SEP]`` last), keyed by position, where
    the source can name tokens (a model; a store keeps ids only)."""
    tokenizer = getattr(getattr(rows, "model", None), "tokenizer", None)
    if tokenizer is None or rows.num_seqs < 2:
        return {}
    ids = np.asarray(rows.tokens(np.arange(rows.num_seqs)))
    fixed = np.flatnonzero((ids == ids[:1]).all(0))
    return {str(position): str(token) for position, token in zip(fixed, tokenizer.convert_ids_to_tokens(ids[0, fixed].tolist()))}


def last_direction_notes(
    table: pd.DataFrame, positions: dict[str, str] | None = None, windows: dict[str, int] | None = None
) -> dict[str, str]:
    """What each layer's isolated last eigenvalue (``last_isolated``) is, in words, from the
    table's ``last_*`` columns: the keys its direction loads on, how many of the layer's heads
    share it, and how much of it lies along the all-ones direction. Keys are named by their
    token (``positions``) except in windowed layers (``windows``), whose coordinates are offsets."""
    if "last_isolated" not in table:
        return {}
    positions, windows = positions or {}, windows or {}
    notes = {}
    last_query = table["query"].max()  # per query position: the last one (the figure's default), whose row sees every key
    layers = table[(table["level"] == "layer") & (table["query"] == last_query) & (table["last_isolated"] == True)]  # noqa: E712
    heads = table[(table["level"] == "head") & (table["last_isolated"] == True)]  # noqa: E712
    for row in layers.itertuples():
        a, b = int(row.last_key_a), int(row.last_key_b)
        named = positions if str(row.layer) not in windows else {}
        name = lambda key: f"{key} ({named[str(key)]})" if str(key) in named else str(key)
        unit = (table["level"] == "head") & (table["layer"] == row.layer) & (table["query"] == row.query)
        alike = heads[unit[heads.index] & (heads["last_key_a"] == a) & (heads["last_key_b"] == b)]
        meaning = (
            "with opposite signs: the scores to these two keys differ by nearly the same amount in every row"
            if row.last_keys_sign < 0
            else "with equal signs: the scores to these two keys nearly cancel in every row"
        )
        where = f"layer {row.layer}" + (f", query {row.query}" if row.query >= 0 else "")
        notes[where] = (
            f"last eigenvalue {row.last_eigenvalue:.2g} ({row.last_gap:.1g} of the one before it); its direction is "
            f"{row.last_keys_share:.0%} on keys {name(a)} and {name(b)} {meaning} (so in {len(alike)} of "
            f"{int(unit.sum())} heads); {row.last_ones:.0%} of it lies along the all-ones direction"
        )
    return notes


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


def _eigen_of_moments(source: str | Path, settings: EigenSettings, *, progress: Progress, command: str | None) -> EigenResult:
    """:func:`eigen` of merged moments (see there)."""
    from attnlens.rows.partials import load_moments

    if settings.full_matrices:
        raise BadInput(f"`full_matrices` analysis reads the matrices of each sequence from a store; {source} holds moments only")
    merged = load_moments(source)
    made = merged.settings
    if settings.quantity is not None and settings.quantity != made["quantity"]:
        raise BadInput(
            f"the moments in {source} are of {made['quantity']}, not {settings.quantity}; the `quantity` is chosen when the "
            f"moments are computed: attnlens moments --quantity {settings.quantity}"
        )
    if (settings.per_query or settings.queries is not None) and made["queries"] is None:
        raise BadInput(
            f"the moments in {source} pool rows over queries; compute per-query moments (moments with `per_query` or `queries`)"
        )
    halves = _select(merged.halves, settings.layers, settings.queries, source)
    n = made["n"]
    table, arrays = analyse_moments(
        halves,
        centred=settings.centred,
        project_ones=settings.project_ones,
        keep=settings.keep,
        seed=settings.seed,
        progress=progress,
    )
    meta = {
        "model": merged.meta["model"],
        "corpus": merged.meta["corpus"],
        "n": n,
        "layers": list(halves.a.layers),
        "num_heads": halves.a.num_heads,
        "settings": {
            **settings.to_dict(),
            "quantity": made["quantity"],
            "corpus": merged.meta["corpus"].get("source"),
            "seq_len": n,
            "num_seqs": made["num_seqs"],
            "seed": settings.seed,
            "queries": None if halves.a.queries is None else list(halves.a.queries),
            "keep": min(settings.keep, n),
        },
        "moments": {
            "path": str(merged.path),
            "num_seqs": made["num_seqs"],
            "seed": made["seed"],
            "accumulate": made["accumulate"],
            "run": merged.meta.get("run"),
        },
        **provenance(command),
    }
    notes = last_direction_notes(table)
    if notes:
        meta["notes"] = notes
    return EigenResult(meta, {"table": table}, arrays)


def _select(halves: HalfMoments, layers: list[int] | None, queries: list[int] | None, source: object) -> HalfMoments:
    """The chosen layers and query positions of (memory-mapped) moments: without a choice the
    moments stay mapped; a choice reads the chosen units into memory."""
    moments = halves.a
    if layers is None and (queries is None or list(queries) == list(moments.queries)):
        return halves
    layers = list(moments.layers) if layers is None else sorted(set(layers))
    missing = [layer for layer in layers if layer not in moments.layers]
    if missing:
        raise BadInput(f"layer {missing[0]} is not in the moments in {source}; they hold layers {list(moments.layers)}")
    chosen = list(moments.queries) if queries is None or moments.queries is None else sorted(set(queries))
    if moments.queries is not None:
        absent = [q for q in chosen if q not in moments.queries]
        if absent:
            raise BadInput(
                f"query {absent[0]} is not in the moments in {source}; they hold query positions {list(moments.queries)}"
            )
    layer_at = [moments.layers.index(layer) for layer in layers]
    query_at = [0] if moments.queries is None else [moments.queries.index(q) for q in chosen]

    def pick(part: Moments) -> Moments:
        take = lambda array: np.take(np.take(array, layer_at, axis=0), query_at, axis=2)
        return Moments(
            part.quantity,
            part.n,
            layers,
            part.num_heads,
            None if part.queries is None else chosen,
            count=take(part.count),
            key_count=take(part.key_count),
            sum=take(part.sum),
            sum_outer=take(part.sum_outer),
        )

    return HalfMoments(pick(halves.a), pick(halves.b))
