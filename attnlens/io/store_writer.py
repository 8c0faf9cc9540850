"""Writing a store: created and preallocated, written batch by batch, resumed after a crash.

Every array is preallocated at creation, so a full disk shows up before any work is
done. A batch is written into all files, flushed to disk, and only then counted in its
progress file: a crash leaves the store as it was after the last finished batch, and
:meth:`StoreWriter.resume` continues from there. Batches are written with O_DIRECT where
the file system allows it (:mod:`attnlens.io.direct_io`), from memory laid out by
:class:`BatchBuffers`. The ranks of a sharded store each write their own range of sequences
(:meth:`StoreWriter.open_shard`). The format is described in :mod:`attnlens.io.store`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np

from attnlens.errors import BadInput
from attnlens.io.direct_io import DIRECT_ALIGNMENT, pwrite_direct
from attnlens.io.files import flatten, short, write_json_atomic
from attnlens.io.store_layout import FORMAT, KINDS, array_files, layer_file, progress_file, store_bytes, version_for
from attnlens.io.store_reader import open_store


class StoreWriter:
    """Writes a store batch by batch. Create with :meth:`create` or :meth:`resume`; the other
    ranks of a sharded store open their shard with :meth:`open_shard`.

    ``complete`` is the index of the next sequence to write; ``stop`` the end of the
    range this writer owns (all sequences, or its shard).
    """

    def __init__(self, path: Path, manifest: dict, complete: int, shard: int | None = None) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self.complete = complete
        self.shard = shard
        self.start: int
        self.stop: int
        self.start, self.stop = manifest["shards"][shard] if shard is not None else (0, manifest["num_seqs"])
        self._files = {spec.relative: spec for spec in array_files(manifest)}
        self._descriptors: dict[str, tuple[int, int]] = {}
        for spec in self._files.values():
            file_path = self.path / spec.relative
            data_start = os.path.getsize(file_path) - spec.row_bytes * spec.shape[0]
            self._descriptors[spec.relative] = (os.open(file_path, os.O_RDWR), data_start)

    @classmethod
    def create(
        cls, path: str | Path, manifest: dict, tokens: np.ndarray, *, shards: list[tuple[int, int]] | None = None, shard: int = 0
    ) -> StoreWriter:
        """Create the directory, preallocate every array, write manifest and tokens.

        With ``shards`` (one [start, stop) range per rank) the store is sharded; the
        writer returned is that of ``shard``.
        """
        path = Path(path)
        manifest = {"format": FORMAT, "format_version": version_for(shards), **manifest, "num_seqs": int(tokens.shape[0])}
        if shards:
            manifest["shards"] = [[int(start), int(stop)] for start, stop in shards]
        try:
            path.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(path).free
            needed = store_bytes(manifest) + tokens.nbytes
            if needed > free:
                raise BadInput(
                    f"not enough disk space for the store in {path}: it needs {needed / 1e6:.0f} MB and "
                    f"{free / 1e6:.0f} MB are free; free space, choose another `out`, or ask for fewer `num_seqs` or `layers`"
                )
            for kind in ("scores", "valid", "weights") if manifest["weights"] else ("scores", "valid"):
                (path / kind).mkdir(exist_ok=True)
            np.save(path / "tokens.npy", np.ascontiguousarray(tokens, dtype=np.int32))
            for spec in array_files(manifest):
                array = np.lib.format.open_memmap(path / spec.relative, mode="w+", dtype=spec.dtype, shape=spec.shape)
                del array
                descriptor = os.open(path / spec.relative, os.O_RDWR)
                try:
                    # Reserve the blocks now: a full disk fails here, not halfway through.
                    os.posix_fallocate(descriptor, 0, os.fstat(descriptor).st_size)
                except OSError as error:
                    if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                finally:
                    os.close(descriptor)
            if shards:
                for rank, (start, stop) in enumerate(manifest["shards"]):
                    write_json_atomic(
                        path / progress_file(rank), {"shard": rank, "start": start, "stop": stop, "complete": start}
                    )
            else:
                write_json_atomic(path / "progress.json", {"complete": 0})
            write_json_atomic(path / "manifest.json", manifest)
        except PermissionError:
            raise BadInput(f"cannot write to {path}: permission denied; choose a writable `out`") from None
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise BadInput(f"disk full while creating the store in {path}; free space or choose another `out`") from None
            raise BadInput(f"cannot create the store in {path}: {error.strerror or error}; choose a writable `out`") from None
        return cls.open_shard(path, shard) if shards else cls(path, manifest, complete=0)

    @classmethod
    def open_shard(cls, path: str | Path, shard: int) -> StoreWriter:
        """The writer of one rank's shard of a sharded store, from that rank's progress."""
        path = Path(path)
        manifest = json.loads((path / "manifest.json").read_text())
        progress = json.loads((path / progress_file(shard)).read_text())
        return cls(path, manifest, complete=int(progress["complete"]), shard=shard)

    @classmethod
    def resume(
        cls, path: str | Path, manifest: dict, tokens: np.ndarray, *, shards: list[tuple[int, int]] | None = None, shard: int = 0
    ) -> StoreWriter:
        """Reopen an unfinished store, checking that it was made with the same settings
        (and, sharded, by as many ranks); returns the writer of ``shard``."""
        store = open_store(path, allow_partial=True)
        made_ranks, asked_ranks = len(store.manifest.get("shards") or [0]), len(shards or [0])
        if made_ranks != asked_ranks:
            how = (
                "without torchrun"
                if made_ranks == 1
                else f"with torchrun --nproc-per-node {made_ranks} (or as many ranks in all)"
            )
            raise BadInput(
                f"cannot resume {path}: it was extracted by {made_ranks} rank(s), this run has {asked_ranks}; resume it {how}, "
                "or use `overwrite` to start again"
            )
        expected = {"format": FORMAT, "format_version": version_for(shards), **manifest, "num_seqs": int(tokens.shape[0])}
        if shards:
            expected["shards"] = [[int(start), int(stop)] for start, stop in shards]
        ignored = ("command", "created", "versions", "attnlens_version")
        made, asked = flatten(store.manifest), flatten({k: v for k, v in expected.items() if k not in ignored})
        # Plain settings (n, dtype, layers, ...) first: they explain differences in the nested ones.
        differing = sorted((key for key in asked if made.get(key) != asked[key]), key=lambda key: ("." in key, key))
        if differing:
            key = differing[0]
            raise BadInput(
                f"cannot resume {path}: it was made with {key} = {short(made.get(key))}, this run has "
                f"{short(asked[key])}; rerun with the original settings, or use `overwrite` to start again"
            )
        if not np.array_equal(np.load(store.path / "tokens.npy", mmap_mode="r"), tokens):
            raise BadInput(f"cannot resume {path}: its token blocks differ from this run's; use `overwrite` to start again")
        if shards:
            return cls.open_shard(path, shard)
        return cls(Path(path), store.manifest, complete=store.complete)

    def offset(self, relative: str, start: int) -> int:
        """Byte offset of sequence ``start`` in the array file ``relative`` (e.g. ``scores/L00.npy``)."""
        return self._descriptors[relative][1] + start * self._files[relative].row_bytes

    def batch_buffers(self, rows: int) -> BatchBuffers:
        """Memory for batches of up to ``rows`` sequences that :meth:`write_batch` writes without a copy."""
        return BatchBuffers(self, rows)

    def write_batch(self, start: int, layers: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> None:
        """Write sequences ``start…`` of every layer, flush, then count them as finished.

        ``layers[layer] = (scores, valid, weights)``. Batches must arrive in order.
        """
        if start != self.complete:
            raise BadInput(
                f"a batch starts at sequence {start}, but the next unwritten one is {self.complete}; write batches in order"
            )
        count = None
        for layer, arrays in layers.items():
            for kind, array in zip(KINDS, arrays):
                if array is None:
                    continue
                spec = self._files[layer_file(kind, layer)]
                array = np.ascontiguousarray(array, dtype=spec.dtype)  # no copy for arrays from batch_buffers
                if array.shape[1:] != spec.shape[1:]:
                    raise BadInput(
                        f"{spec.relative}: got rows of shape {array.shape[1:]}, the store holds rows of shape {spec.shape[1:]}"
                    )
                count = array.shape[0]
                descriptor, _ = self._descriptors[spec.relative]
                self._write_at(descriptor, array.data.cast("B"), self.offset(spec.relative, start))
        for descriptor, _ in self._descriptors.values():
            os.fsync(descriptor)
        self.complete = start + (count or 0)
        progress = (
            {"complete": self.complete}
            if self.shard is None
            else {"shard": self.shard, "start": self.start, "stop": self.stop, "complete": self.complete}
        )
        write_json_atomic(self.path / progress_file(self.shard), progress)

    # A seam for tests that simulate a full disk or a crash; called once per array and batch.
    _write_at = staticmethod(pwrite_direct)

    def close(self) -> None:
        for descriptor, _ in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BatchBuffers:
    """Reusable memory for one batch of every array a :class:`StoreWriter` writes.

    :meth:`arrays` places each batch's arrays at an address congruent to their offset in
    the file modulo :data:`DIRECT_ALIGNMENT`: their whole blocks are then aligned in memory
    as on disk, and :func:`pwrite_direct` writes them with O_DIRECT, without a copy. (Batch
    offsets need not be aligned themselves: each file's data follows a short ``.npy`` header.)
    """

    def __init__(self, writer: StoreWriter, rows: int) -> None:
        self._writer = writer
        self._raw = {
            relative: np.empty(rows * spec.row_bytes + DIRECT_ALIGNMENT, np.uint8) for relative, spec in writer._files.items()
        }

    def arrays(self, start: int, rows: int) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """``{layer: (scores, valid, weights or None)}`` to fill with sequences ``start…start + rows``."""
        return {layer: self._layer(layer, start, rows) for layer in self._writer.manifest["layers"]}

    def _layer(self, layer: int, start: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One layer's arrays: every store holds scores and valid, and weights only when made with them."""
        weights = layer_file("weights", layer)
        return (
            self._view(layer_file("scores", layer), start, rows),
            self._view(layer_file("valid", layer), start, rows),
            self._view(weights, start, rows) if weights in self._raw else None,
        )

    def _view(self, relative: str, start: int, rows: int) -> np.ndarray:
        spec, raw = self._writer._files[relative], self._raw[relative]
        shift = (self._writer.offset(relative, start) - raw.ctypes.data) % DIRECT_ALIGNMENT
        return raw[shift : shift + rows * spec.row_bytes].view(spec.dtype).reshape(rows, *spec.shape[1:])
