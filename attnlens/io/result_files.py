"""Result directories on disk: checking where one goes, writing one atomically, reading one back.

A result directory holds ``result.json`` (the meta, with the result's ``kind``, the format version
and the names of its tables and arrays), one CSV per table and one ``.npy`` per array. It is
written into a hidden sibling directory and renamed into place, so a crash never leaves half a
result, and an existing result is replaced only when the caller says ``overwrite``. The result
classes (:mod:`attnlens.io.results`) read and write themselves through these functions.

>>> import tempfile, numpy as np, pandas as pd
>>> out = tempfile.mkdtemp() + "/r"
>>> _ = write_result(out, "demo", {"answer": 42}, tables={"table": pd.DataFrame({"a": [1, 2]})},
...                  arrays={"x": np.arange(3)})
>>> meta, tables, arrays = read_result_dir(out, "demo")
>>> meta["answer"], tables["table"]["a"].tolist(), arrays["x"].tolist()
(42, [1, 2], [0, 1, 2])
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from attnlens.errors import BadFile, BadInput
from attnlens.io.files import json_safe, swap_into_place
from attnlens.io.legacy import upgraded

FORMAT_VERSION = 1


def is_result_dir(path: Path) -> bool:
    return (Path(path) / "result.json").is_file()


def check_out(out: str | Path, overwrite: bool) -> Path:
    """Fail early (before any work) if ``out`` cannot receive a result."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"`out` {out} is a file; give a directory path")
    if out.exists() and any(out.iterdir()):
        if not is_result_dir(out):
            raise BadInput(f"`out` {out} is a non-empty directory that is not an attnlens result; choose another `out`")
        if not overwrite:
            raise BadInput(f"a result already exists in {out}; pass `overwrite` to replace it, or choose another `out`")
    return out


def check_resumable_out(out: Path, *, resume: bool, overwrite: bool, owned: Callable[[Path], bool], what: str) -> bool:
    """Fail early if ``out`` cannot take a resumable job (a store, a moments job).

    ``owned(out)`` says whether a non-empty ``out`` holds such a job; ``what`` names it in
    the messages. Returns whether an existing job is to be replaced (``overwrite``).
    """
    if resume and overwrite:
        raise BadInput("`resume` and `overwrite` contradict each other; choose one")
    if out.exists() and not out.is_dir():
        raise BadInput(f"`out` {out} is a file; give a directory path")
    if not out.exists() or not any(out.iterdir()):
        if resume:
            raise BadInput(f"nothing to resume in {out}; run without `resume` to start a new {what}")
        return False
    if not owned(out):
        raise BadInput(f"`out` {out} is a non-empty directory that is not an attnlens {what}; choose another `out`")
    if not resume and not overwrite:
        raise BadInput(f"a {what} already exists in {out}; pass `resume` to finish it or `overwrite` to replace it")
    return overwrite


def write_result(
    out: str | Path,
    kind: str,
    meta: dict,
    *,
    tables: dict[str, pd.DataFrame] | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a result directory atomically; ``extra(dir)`` may add files to it."""
    out = check_out(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise BadInput(f"cannot write to {out}: {error.strerror or error}; choose a writable `out`") from None
    try:
        for name, table in (tables or {}).items():
            table.to_csv(staging / f"{name}.csv", index=False)
        for name, array in (arrays or {}).items():
            np.save(staging / f"{name}.npy", array)
        if extra is not None:
            extra(staging)
        payload = {
            **meta,
            "kind": kind,
            "format_version": FORMAT_VERSION,
            "tables": sorted(tables or {}),
            "arrays": sorted(arrays or {}),
        }
        (staging / "result.json").write_text(json.dumps(json_safe(payload), indent=2, allow_nan=False))
        swap_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Text columns that may be empty (``note``; a plan method's ``choice``) read back as the empty strings they were written as."""
    for column in ("note", "choice"):
        if column in table:
            table[column] = table[column].fillna("").astype(str)
    return table


def _read_table(file: Path) -> pd.DataFrame:
    """A saved table; one with neither rows nor columns (nothing matched) is written as an empty file."""
    try:
        return _text_columns(pd.read_csv(file))
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def read_result_dir(path: str | Path, kind: str | None = None) -> tuple[dict, dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """Read and validate a result directory: (meta, tables, arrays); arrays are memory-mapped."""
    path = Path(path)
    meta = read_meta(path)
    if kind is not None and meta["kind"] != kind:
        raise BadFile(f"'{path}' holds a {meta['kind']} result, not the {kind} result this needs")
    try:
        tables = {name: _read_table(path / f"{name}.csv") for name in meta.get("tables", [])}
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in meta.get("arrays", [])}
    except (OSError, ValueError) as error:
        raise BadFile(f"result '{path}' is damaged ({error})") from None
    return meta, upgraded(meta["kind"], tables), arrays  # written by an earlier version: read as this one writes


def read_meta(path: Path) -> dict:
    """``result.json`` of a result directory, checked."""
    if not path.is_dir():
        raise BadFile(f"result '{path}' does not exist")
    if not is_result_dir(path):
        raise BadFile(f"'{path}' is not an attnlens result (no result.json); give a directory an attnlens command wrote")
    try:
        meta = json.loads((path / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadFile(f"result '{path}' is damaged ({type(error).__name__} reading result.json)") from None
    if not isinstance(meta, dict) or "kind" not in meta:
        raise BadFile(f"'{path}' is not an attnlens result (its result.json has no kind)")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise BadFile(f"result '{path}' was written by a newer attnlens (format {meta['format_version']}); upgrade attnlens")
    return meta
