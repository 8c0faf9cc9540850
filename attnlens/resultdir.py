"""Result directories: written atomically, never overwritten silently, reloadable by kind.

A result directory holds ``result.json`` (``kind``, ``format_version``, provenance,
settings, and the names of its tables and arrays), tidy CSV tables, ``.npy`` arrays and
optionally ``figures/``. It is written into a hidden sibling directory and renamed into
place, so a crash never leaves half a result.

>>> import tempfile, numpy as np, pandas as pd
>>> out = tempfile.mkdtemp() + "/r"
>>> _ = write_result(out, "demo", {"answer": 42}, tables={"t": pd.DataFrame({"a": [1.0, None]})},
...                  arrays={"x": np.arange(3)})
>>> meta, tables, arrays = read_result_dir(out, "demo")
>>> meta["kind"], meta["format_version"], meta["answer"], arrays["x"].tolist()
('demo', 1, 42, [0, 1, 2])
>>> tables["t"]["a"].isna().tolist()          # missing numbers stay missing, never a number
[False, True]
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

from .errors import AttnlensError

FORMAT_VERSION = 1


def is_result_dir(path: str | Path) -> bool:
    return (Path(path) / "result.json").is_file()


def check_out(out: str | Path, overwrite: bool = False) -> Path:
    """Fail before any work if ``out`` cannot receive a result (a file, a foreign directory,
    or an existing result without ``overwrite``)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AttnlensError(f"--out {out} is a file; give a directory path")
    if out.exists() and any(out.iterdir()):
        if not is_result_dir(out):
            raise AttnlensError(f"--out {out} is a non-empty directory that is not an attnlens result; choose another --out")
        if not overwrite:
            raise AttnlensError(f"a result already exists in {out}; pass --overwrite to replace it, or choose another --out")
    return out


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
    """Write a result directory atomically; ``extra(directory)`` may add files (figures)."""
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
            np.save(staging / f"{name}.npy", np.asarray(array))
        if extra is not None:
            extra(staging)
        payload = {"kind": kind, "format_version": FORMAT_VERSION, **meta,
                   "tables": sorted(tables or {}), "arrays": sorted(arrays or {})}
        (staging / "result.json").write_text(json.dumps(_json_safe(payload), indent=2, allow_nan=False))
        if out.exists():
            retired = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Free-text columns (``note``) read back as the empty strings they were written as."""
    for column in ("note",):
        if column in table:
            table[column] = table[column].fillna("").astype(str)
    return table


def read_result_dir(path: str | Path, kind: str | None = None) -> tuple[dict, dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """(meta, tables, arrays) of a result directory, checked to be of ``kind``."""
    path = Path(path)
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
    if kind is not None and meta["kind"] != kind:
        raise AttnlensError(f"'{path}' holds a {meta['kind']} result, not the {kind} result this needs")
    try:
        tables = {name: _text_columns(pd.read_csv(path / f"{name}.csv")) for name in meta.get("tables", [])}
        arrays = {name: np.load(path / f"{name}.npy") for name in meta.get("arrays", [])}
    except (OSError, ValueError) as error:
        raise AttnlensError(f"result '{path}' is damaged ({error})") from None
    return meta, tables, arrays
