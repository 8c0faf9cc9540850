"""A store's layout: its format versions, the files it holds and their shapes, and where it counts progress.

The writer (:mod:`attnlens.io.store_writer`) and the reader (:mod:`attnlens.io.store_reader`)
both derive every file of a store from its manifest through these functions; the format itself
is described in :mod:`attnlens.io.store`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "attnlens-store"
FORMAT_VERSION = 2  # the newest this attnlens reads
PLAIN_FORMAT_VERSION = 1  # single-process stores: unchanged, so older attnlens versions read them
SHARDED_FORMAT_VERSION = 2
DTYPES = ("float16", "float32")
KINDS = ("scores", "valid", "weights")


def layer_file(kind: str, layer: int) -> str:
    return f"{kind}/L{layer:02d}.npy"


@dataclass(frozen=True)
class ArrayFile:
    """One preallocated ``.npy`` file, written by absolute byte offset."""

    relative: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


def array_files(manifest: dict) -> list[ArrayFile]:
    """Every per-layer array a store with this manifest holds."""
    seqs, n, heads = manifest["num_seqs"], manifest["n"], manifest["num_heads"]
    files = []
    for layer in manifest["layers"]:
        files.append(ArrayFile(layer_file("scores", layer), manifest["dtype"], (seqs, heads, n, n)))
        files.append(ArrayFile(layer_file("valid", layer), "bool", (seqs, n, n)))
        if manifest["weights"]:
            files.append(ArrayFile(layer_file("weights", layer), manifest["dtype"], (seqs, heads, n, n)))
    return files


def store_bytes(manifest: dict) -> int:
    """Bytes the arrays of a store with this manifest take on disk."""
    return sum(spec.row_bytes * spec.shape[0] for spec in array_files(manifest))


def is_store(path: Path) -> bool:
    return (Path(path) / "manifest.json").is_file()


def progress_file(shard: int | None) -> str:
    """Where a store counts its finished sequences: one file, or one per rank of a sharded store.

    >>> progress_file(None), progress_file(3)
    ('progress.json', 'progress-rank00003.json')
    """
    return "progress.json" if shard is None else f"progress-rank{shard:05d}.json"


def version_for(shards: list | None) -> int:
    return SHARDED_FORMAT_VERSION if shards else PLAIN_FORMAT_VERSION
