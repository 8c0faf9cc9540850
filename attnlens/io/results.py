"""Results on disk: one directory per result, written atomically, reloadable by kind.

A result directory holds ``result.json`` (``kind``, ``format_version``, provenance and
settings), tidy CSV tables and ``.npy`` arrays. It is written into a hidden sibling
directory and renamed into place, so a crash never leaves half a result, and an
existing result is only replaced when the caller says ``overwrite``.

>>> import tempfile, numpy as np, pandas as pd
>>> from attnlens.io.results import write_result, read_result_dir
>>> out = tempfile.mkdtemp() + "/r"
>>> _ = write_result(out, "demo", {"answer": 42}, tables={"table": pd.DataFrame({"a": [1, 2]})},
...                  arrays={"x": np.arange(3)})
>>> meta, tables, arrays = read_result_dir(out, "demo")
>>> meta["answer"], tables["table"]["a"].tolist(), arrays["x"].tolist()
(42, [1, 2], [0, 1, 2])
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from attnlens.errors import AttnlensError

FORMAT_VERSION = 1
_LOADERS: dict[str, Callable[[Path], object]] = {}


def register_result(kind: str) -> Callable:
    """Class decorator: ``load_result`` dispatches directories of ``kind`` to ``cls.load``."""

    def decorate(cls):
        _LOADERS[kind] = cls.load
        cls.kind = kind
        return cls

    return decorate


class TabularResult:
    """A result made of ``meta``, named tables and named arrays, saved with its figures.

    Subclasses are registered with :func:`register_result`, which gives them their ``kind``.
    """

    kind: str

    def __init__(self, meta: dict, tables: dict[str, pd.DataFrame], arrays: dict[str, np.ndarray]) -> None:
        self.meta = meta
        self.tables = tables
        self.arrays = arrays

    def save(self, out: str | Path, overwrite: bool = False, figures: bool = True) -> Path:
        """Write the result directory (tables as CSV, arrays as .npy, figures as PNG and PDF)."""

        def extra(directory: Path) -> None:
            if figures:
                from attnlens.figures import save_figures

                save_figures(self, directory / "figures")

        return write_result(out, self.kind, self.meta, tables=self.tables, arrays=self.arrays, overwrite=overwrite, extra=extra)

    @classmethod
    def load(cls, path: str | Path):
        meta, tables, arrays = read_result_dir(path, cls.kind)
        return cls(meta, tables, arrays)


def is_result_dir(path: Path) -> bool:
    return (Path(path) / "result.json").is_file()


def check_out(out: str | Path, overwrite: bool) -> Path:
    """Fail early (before any work) if ``out`` cannot receive a result."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AttnlensError(f"--out {out} is a file; give a directory path")
    if out.exists() and any(out.iterdir()):
        if not is_result_dir(out):
            raise AttnlensError(f"--out {out} is a non-empty directory that is not an attnlens result; choose another --out")
        if not overwrite:
            raise AttnlensError(f"a result already exists in {out}; pass --overwrite to replace it, or choose another --out")
    return out


def check_resumable_out(out: Path, *, resume: bool, overwrite: bool, owned: Callable[[Path], bool], what: str) -> bool:
    """Fail early if ``out`` cannot take a resumable job (a store, a moments job).

    ``owned(out)`` says whether a non-empty ``out`` holds such a job; ``what`` names it in
    the messages. Returns whether an existing job is to be replaced (``overwrite``).
    """
    if resume and overwrite:
        raise AttnlensError("--resume and --overwrite contradict each other; choose one")
    if out.exists() and not out.is_dir():
        raise AttnlensError(f"--out {out} is a file; give a directory path")
    if not out.exists() or not any(out.iterdir()):
        if resume:
            raise AttnlensError(f"nothing to resume in {out}; run without --resume to start a new {what}")
        return False
    if not owned(out):
        raise AttnlensError(f"--out {out} is a non-empty directory that is not an attnlens {what}; choose another --out")
    if not resume and not overwrite:
        raise AttnlensError(f"a {what} already exists in {out}; pass --resume to finish it or --overwrite to replace it")
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
    """Write a result directory atomically; ``extra(dir)`` may add files (e.g. figures)."""
    out = check_out(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise AttnlensError(f"cannot write to {out}: {error.strerror or error}; choose a writable --out") from None
    try:
        for name, table in (tables or {}).items():
            table.to_csv(staging / f"{name}.csv", index=False)
        for name, array in (arrays or {}).items():
            np.save(staging / f"{name}.npy", array)
        if extra is not None:
            extra(staging)
        payload = {"kind": kind, "format_version": FORMAT_VERSION, **meta,
                   "tables": sorted(tables or {}), "arrays": sorted(arrays or {})}
        (staging / "result.json").write_text(json.dumps(_json_safe(payload), indent=2, allow_nan=False))
        swap_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def swap_into_place(staging: Path, out: Path) -> None:
    if out.exists():
        retired = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(retired)
        staging.rename(out)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(out)


def _json_safe(value: object) -> object:
    """JSON without NaN: a missing number is written as null, never as a number."""
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Free-text columns (``note``) read back as the empty strings they were written as."""
    for column in ("note",):
        if column in table:
            table[column] = table[column].fillna("").astype(str)
    return table


def read_result_dir(path: str | Path, kind: str | None = None) -> tuple[dict, dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """Read and validate a result directory: (meta, tables, arrays); arrays are memory-mapped."""
    path = Path(path)
    meta = _read_meta(path)
    if kind is not None and meta["kind"] != kind:
        raise AttnlensError(f"'{path}' holds a {meta['kind']} result, not the {kind} result this needs")
    try:
        tables = {name: _text_columns(pd.read_csv(path / f"{name}.csv")) for name in meta.get("tables", [])}
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in meta.get("arrays", [])}
    except (OSError, ValueError) as error:
        raise AttnlensError(f"result '{path}' is damaged ({error})") from None
    return meta, tables, arrays


def _read_meta(path: Path) -> dict:
    if not path.is_dir():
        raise AttnlensError(f"result '{path}' does not exist")
    if not is_result_dir(path):
        raise AttnlensError(f"'{path}' is not an attnlens result (no result.json); give a directory an attnlens command wrote")
    try:
        meta = json.loads((path / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise AttnlensError(f"result '{path}' is damaged ({type(error).__name__} reading result.json)") from None
    if not isinstance(meta, dict) or "kind" not in meta:
        raise AttnlensError(f"'{path}' is not an attnlens result (its result.json has no kind)")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise AttnlensError(f"result '{path}' was written by a newer attnlens (format {meta['format_version']}); upgrade attnlens")
    return meta


def load_result(path: str | Path) -> object:
    """Read any attnlens result back (eigen, overlap, ...), as the object that wrote it."""
    path = Path(path)
    kind = _read_meta(path)["kind"]
    if kind not in _LOADERS:
        # Importing the analysis modules registers their loaders.
        from attnlens.analysis import dam, eigen, importance, overlap, reconstruct  # noqa: F401
        from attnlens import report  # noqa: F401
    if kind not in _LOADERS:
        raise AttnlensError(f"result '{path}' is of kind '{kind}', which this attnlens cannot read")
    return _LOADERS[kind](path)
