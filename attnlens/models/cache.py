"""The user cache: converted models and tokenized corpora, kept outside the repository.

``$ATTNLENS_CACHE``, else ``$XDG_CACHE_HOME/attnlens``, else ``~/.cache/attnlens``.
Everything in it can be deleted at any time; it is rebuilt on demand.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    """The root of attnlens' cache.

    >>> cache_dir().name in ("attnlens",) or "ATTNLENS_CACHE" in os.environ
    True
    """
    if os.environ.get("ATTNLENS_CACHE"):
        return Path(os.environ["ATTNLENS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnlens"


def is_cached(kind: str, key: str) -> bool:
    """Whether :func:`cached_array` holds ``key`` (it reads it rather than computing it)."""
    return (cache_dir() / kind / f"{key}.npy").is_file()


def cached_array(kind: str, key: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``compute()`` once per ``key``; later calls read the saved array.

    Written atomically, so concurrent runs or a crash never leave a half-written entry.
    An unwritable cache is not an error: the array is simply not kept.
    """
    path = cache_dir() / kind / f"{key}.npy"
    if path.is_file():
        try:
            return np.load(path)
        except (OSError, ValueError):
            pass  # damaged entry: compute it again
    array = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npy.tmp")
        with os.fdopen(descriptor, "wb") as handle:
            np.save(handle, array)
        os.replace(temporary, path)
    except OSError:
        pass
    return array
