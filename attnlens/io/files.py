"""Files written so that a crash never leaves half of one: atomic JSON, fsync, positioned writes.

Shared by the store, moments jobs, partial files and results.

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "settings.json"
>>> write_json_atomic(path, {"n": 128, "score": float("nan")})
>>> path.read_text().replace(chr(10), "").replace(" ", "")
'{"n":128,"score":null}'
>>> flatten({"model": {"name": "a"}, "n": 1})
{'model.name': 'a', 'n': 1}
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np


def json_safe(value: object) -> object:
    """JSON-ready data without NaN: a missing number is written as null, never as a number."""
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def fsync_directory(path: Path) -> None:
    """Flush a directory's entries (a rename inside it) to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file so that a crash leaves either the old file or the new one, never half of one."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def write_json_atomic(path: Path, payload: object) -> None:
    """Write JSON atomically (:func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, json.dumps(json_safe(payload), indent=2, allow_nan=False).encode("utf-8"))


def pwrite_all(descriptor: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at byte ``offset`` of an open file (``os.pwrite`` may write less)."""
    while data:
        written = os.pwrite(descriptor, data, offset)
        data, offset = data[written:], offset + written


def swap_into_place(staging: Path, out: Path) -> None:
    """Move a fully written ``staging`` directory to ``out``, replacing what was there."""
    if out.exists():
        retired = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(retired)
        staging.rename(out)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(out)


def flatten(mapping: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, object] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def short(value: object) -> str:
    """A value as JSON, cut to 60 characters (for messages)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
