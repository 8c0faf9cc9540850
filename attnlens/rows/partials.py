"""Partial moment files, and merging them into one moments result.

A **partial file** holds the sums one rank accumulated in one pass of a moments job
(:mod:`attnlens.rows.jobs`): its (layer, head) units, over its range of sequences, of which
``done`` are finished. It is one ``.npz`` (arrays ``count``, ``key_count``, ``sum``,
``sum_outer`` with axes (half, unit, query, ...), and ``meta``, a JSON text), replaced
atomically at every checkpoint: a crash leaves the previous checkpoint, never half of
one.

A **moments result** is a result directory (kind ``moments``, see
:mod:`attnlens.io.results`) of float64 arrays that can be memory-mapped: for each half
``a`` and ``b``, ``{half}_count.npy`` (L, H, Q), ``{half}_key_count.npy`` and
``{half}_sum.npy`` (L, H, Q, n), ``{half}_sum_outer.npy`` (L, H, Q, n, n). Analyses read
one unit at a time from it, so it may be larger than memory.

:func:`merge_partials` adds partial files up (``attnlens merge``), after checking that
they come from one setting, are finished, and cover every unit and sequence exactly
once; a moments job's own all-reduce writes the same result.

>>> import json, tempfile, numpy as np
>>> path = Path(tempfile.mkdtemp()) / "pass000-rank00000.npz"
>>> arrays = {"count": np.ones((2, 1, 1)), "key_count": np.ones((2, 1, 1, 3)), "sum": np.ones((2, 1, 1, 3)),
...           "sum_outer": np.ones((2, 1, 1, 3, 3))}
>>> save_partial(path, {"done": 4}, arrays)
>>> meta, loaded = load_partial(path)
>>> meta["done"], loaded["sum_outer"].shape
(4, (2, 1, 1, 3, 3))
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from attnlens.errors import BadFile, BadInput
from attnlens.io.files import flatten, fsync_directory, pwrite_all, short
from attnlens.io.provenance import provenance
from attnlens.io.results import Result, write_result
from attnlens.progress import progress_bar
from attnlens.rows.moments import ARRAYS, HalfMoments, Moments

PARTIAL_FORMAT = "attnlens-moments-partial"
PARTIAL_FORMAT_VERSION = 1
HALVES = ("a", "b")


# ---------------------------------------------------------------------- partial files


def partial_name(pass_: int, rank: int) -> str:
    """The file name of a rank's partial sums in one pass.

    >>> partial_name(1, 3)
    'pass001-rank00003.npz'
    """
    return f"pass{pass_:03d}-rank{rank:05d}.npz"


def _dump(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write the ``.npz`` and flush it to disk (a seam for tests that kill a rank mid-write)."""
    with open(path, "wb") as handle:
        # numpy >= 2.1's stubs let `**arrays` reach savez's `allow_pickle: bool`; its keys are array names, and
        # numpy 1.26 (supported) has no such parameter, so it cannot be passed explicitly to rule that out.
        np.savez(handle, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
        handle.flush()
        os.fsync(handle.fileno())


def save_partial(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Replace the partial file at ``path`` atomically with these sums."""
    path = Path(path)
    meta = {"format": PARTIAL_FORMAT, "format_version": PARTIAL_FORMAT_VERSION, **meta}
    temporary = path.with_name(f".{path.name}.tmp")
    _dump(temporary, meta, arrays)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def load_partial_meta(path: Path) -> dict:
    """The ``meta`` of a partial file, without reading its arrays."""
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as error:
        raise BadFile(f"'{path}' is not a readable attnlens partial moments file ({type(error).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != PARTIAL_FORMAT:
        raise BadFile(f"'{path}' is not an attnlens partial moments file; give the .npz files of a moments job's partials/")
    if int(meta.get("format_version", 0)) > PARTIAL_FORMAT_VERSION:
        raise BadFile(f"partial file '{path}' was written by a newer attnlens; upgrade attnlens")
    return meta


def load_partial(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of a partial file; the arrays are read into memory."""
    meta = load_partial_meta(path)
    try:
        with np.load(path) as data:
            missing = [name for name in ARRAYS if name not in data.files]
            if missing:
                raise BadFile(f"partial file '{path}' is damaged (it has no {missing[0]} array)")
            return meta, {name: data[name] for name in ARRAYS}
    except (OSError, ValueError) as error:
        raise BadFile(f"partial file '{path}' is damaged ({type(error).__name__} reading its arrays)") from None


def first_difference(made: dict, asked: dict) -> str | None:
    """The first setting (plain ones before nested ones) where two setting dicts differ.

    >>> first_difference({"n": 16, "model": {"name": "a"}}, {"n": 32, "model": {"name": "b"}})
    'n'
    """
    made, asked = flatten(made), flatten(asked)
    keys = sorted(set(made) | set(asked), key=lambda key: ("." in key, key))
    return next((key for key in keys if made.get(key) != asked.get(key)), None)


def values_at(key: str, *settings: dict) -> list[str]:
    """The (shortened) value of a flattened setting in each of ``settings``.

    >>> values_at("model.name", {"model": {"name": "a"}}, {"model": {"name": "b"}})
    ['"a"', '"b"']
    """
    return [short(flatten(one).get(key)) for one in settings]


# ---------------------------------------------------------------------- moments results


class MergedWriter:
    """Preallocated float64 ``.npy`` arrays of a moments result, filled unit by unit.

    Units are written at their byte offsets with ``pwrite``, not through a memory map,
    so the process keeps no file pages mapped: its memory stays that of the sums it is
    writing, however large the result.
    """

    def __init__(self, directory: Path, layers: Sequence[int], num_heads: int, query_units: int, n: int) -> None:
        self.layers = list(layers)
        self.num_heads = num_heads
        shape = (len(self.layers), num_heads, query_units)
        self.shapes = {"count": shape, "key_count": (*shape, n), "sum": (*shape, n), "sum_outer": (*shape, n, n)}
        self.files: dict[tuple[str, str], tuple[int, int]] = {}  # (half, name) -> (descriptor, data offset)
        for half in HALVES:
            for name in ARRAYS:
                array = np.lib.format.open_memmap(
                    directory / f"{half}_{name}.npy", mode="w+", dtype=np.float64, shape=self.shapes[name]
                )
                offset = array.offset
                del array  # preallocated (sparse) with its header; written below by offset
                self.files[half, name] = (os.open(directory / f"{half}_{name}.npy", os.O_RDWR), offset)

    def write_units(self, units: Sequence[tuple[int, int]], sums: dict[str, np.ndarray]) -> None:
        """Write the float64 ``sums`` (axes half, unit, ...) of ``units``."""
        for index, (layer, head) in enumerate(units):
            position = self.layers.index(layer) * self.num_heads + head
            for which, half in enumerate(HALVES):
                for name in ARRAYS:
                    data = np.ascontiguousarray(sums[name][which, index], dtype=np.float64)
                    descriptor, offset = self.files[half, name]
                    pwrite_all(descriptor, data.data.cast("B"), offset + position * data.nbytes)  # the array's own buffer

    def close(self) -> None:
        for descriptor, _ in self.files.values():
            os.fsync(descriptor)
            os.close(descriptor)
        self.files.clear()


class MomentsResult(Result):
    """Merged moments of a job: ``halves`` (memory-mapped :class:`HalfMoments`) and ``meta``
    (settings, model, corpus, how the job was split, provenance)."""

    kind = "moments"

    def __init__(self, meta: dict, halves: HalfMoments, path: Path | None = None) -> None:
        super().__init__(meta, path=path)
        self.halves = halves

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> MomentsResult:
        settings = meta["settings"]
        try:
            parts = [
                Moments(
                    settings["quantity"],
                    settings["n"],
                    settings["layers"],
                    settings["num_heads"],
                    settings["queries"],
                    **{name: np.load(path / f"{half}_{name}.npy", mmap_mode="r") for name in ARRAYS},
                )
                for half in HALVES
            ]
        except (OSError, ValueError) as error:
            raise BadFile(f"moments result '{path}' is damaged ({error})") from None
        return cls(meta, HalfMoments(*parts), path)

    def summary(self) -> str:
        s = self.settings
        return f"n={s['n']}, {s['num_seqs']} sequences, {s['quantity']}"


def load_moments(path: str | Path) -> MomentsResult:
    """Merged moments from a moments result directory or from a job's work directory."""
    path = Path(path)
    if (path / "job.json").is_file():
        if not (path / "moments" / "result.json").is_file():
            raise BadFile(
                f"the moments job in {path} has not finished (no merged moments in {path / 'moments'}); "
                "rerun the same moments job with `resume`"
            )
        path = path / "moments"
    return MomentsResult.load(path)


def merged_meta(settings: dict, parts: list[dict], extra: dict | None = None, command: str | None = None) -> dict:
    """What a moments result records: its settings, how the work was split, provenance."""
    return {
        "settings": settings,
        "n": settings["n"],
        "layers": settings["layers"],
        "num_heads": settings["num_heads"],
        "model": settings["model"],
        "corpus": settings["corpus"],
        "partials": parts,
        **(extra or {}),
        **provenance(command),
    }


def _part_record(meta: dict, name: str | None = None) -> dict:
    units = meta["units"]
    record = {
        "rank": meta["rank"],
        "pass": meta["pass"],
        "group": meta["group"],
        "sequences": meta["sequences"],
        "units": f"L{units[0][0]}H{units[0][1]}-L{units[-1][0]}H{units[-1][1]}" if units else "",
        "world_size": meta["world_size"],
    }
    return {"file": name, **record} if name else record


def merge_partials(
    paths: Iterable[str | Path],
    out: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> MomentsResult:
    """Add the partial files of a moments job into a moments result at ``out``.

    Sums are added in float64 (float32 partials are widened first), group by group, so
    memory holds one group's sums and one partial at a time.
    """
    files = sorted({Path(path) for path in paths})
    if not files:
        raise BadInput("give at least one partial file (the .npz files in a moments job's partials/ directory)")
    metas = {path: load_partial_meta(path) for path in files}
    settings = _common_settings(metas)
    for path, meta in metas.items():
        total = meta["sequences"][1] - meta["sequences"][0]
        if meta["done"] < total:
            raise BadFile(
                f"partial file {path.name} is unfinished ({meta['done']} of {total} sequences); finish the job by rerunning "
                "the same moments job with `resume`, then merge"
            )
    groups = _groups(metas, settings)
    from attnlens.io.results import check_out

    check_out(out, overwrite)

    def fill(directory: Path) -> None:
        writer = MergedWriter(directory, settings["layers"], settings["num_heads"], _query_units(settings), settings["n"])
        with progress_bar(total=len(files), desc="merge", unit="file", enabled=progress) as bar:
            for units, members in groups:
                total: dict[str, np.ndarray] | None = None
                for path in members:
                    arrays = load_partial(path)[1]
                    total = (
                        {name: arrays[name].astype(np.float64) for name in ARRAYS}
                        if total is None
                        else {name: total[name] + arrays[name] for name in ARRAYS}
                    )
                    bar.update(1)
                assert total is not None, "_groups makes no group without files"
                writer.write_units(units, total)
        writer.close()

    parts = [_part_record(metas[path], path.name) for path in files]
    write_result(
        out, "moments", merged_meta(settings, parts, {"merged_by": "attnlens merge"}, command), overwrite=overwrite, extra=fill
    )
    return MomentsResult.load(out)


def _common_settings(metas: dict[Path, dict]) -> dict:
    (first, reference), *others = metas.items()
    for path, meta in others:
        key = first_difference(reference["settings"], meta["settings"])
        if key is not None:
            mine, theirs = values_at(key, reference["settings"], meta["settings"])
            raise BadInput(
                f"partial files come from different settings: {first.name} has {key} = {mine}, {path.name} has {theirs}; "
                "merge the partials of one moments job"
            )
    return reference["settings"]


def _query_units(settings: dict) -> int:
    return 1 if settings["queries"] is None else len(settings["queries"])


def _groups(metas: dict[Path, dict], settings: dict) -> list[tuple[list[tuple[int, int]], list[Path]]]:
    """Partial files grouped by the units they hold; checks that every unit of the setting is
    in exactly one group and that each group's files cover every sequence exactly once."""
    by_units: dict[tuple, list[Path]] = {}
    for path, meta in metas.items():
        by_units.setdefault(tuple(tuple(unit) for unit in meta["units"]), []).append(path)
    expected = {(layer, head) for layer in settings["layers"] for head in range(settings["num_heads"])}
    seen: set[tuple[int, int]] = set()
    groups = []
    for units, members in sorted(by_units.items()):
        overlap = seen & set(units)
        if overlap:
            layer, head = min(overlap)
            raise BadInput(
                f"unit layer {layer} head {head} is in partial files of two different splits; merge the partials of one moments job"
            )
        seen |= set(units)
        members = sorted(members, key=lambda path: metas[path]["sequences"][0])
        position = 0
        for path in members:
            start, stop = metas[path]["sequences"]
            if start != position:
                what = "missing" if start > position else "in more than one partial file"
                low, high = (position, start) if start > position else (start, position)
                raise BadInput(
                    f"sequences {low} to {high - 1} of units from layer {units[0][0]} head {units[0][1]} are {what}; "
                    "give the partial files of every rank of the job, once each"
                )
            position = stop
        if position != settings["num_seqs"]:
            raise BadInput(
                f"sequences {position} to {settings['num_seqs'] - 1} of units from layer {units[0][0]} head {units[0][1]} are missing; "
                "give the partial files of every rank of the job"
            )
        groups.append((list(units), members))
    missing = expected - seen
    if missing:
        layer, head = min(missing)
        raise BadInput(
            f"no partial file holds layer {layer} head {head} ({len(missing)} units missing); give the partial files of every pass and rank"
        )
    return groups


def remove_staging_leftovers(directory: Path, name: str) -> None:
    """Remove hidden staging directories a killed writer of ``directory/name`` left behind."""
    for leftover in directory.glob(f".{name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
