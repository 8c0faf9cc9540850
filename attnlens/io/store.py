"""Store: captured attention on disk, written batch by batch, memory-mapped on read.

A store is a directory::

    manifest.json        format, versions, model, corpus, n, dtype, layers, command (written once)
    progress.json        how many sequences are finished (replaced atomically after each batch)
    tokens.npy           (seq, n) int32
    scores/L00.npy ...   (seq, head, n, n) float16 or float32, one file per layer
    valid/L00.npy ...    (seq, n, n) bool: the (query, key) pairs the model may attend to
    weights/L00.npy ...  (seq, head, n, n), only with --weights

Every array is preallocated at creation, so a full disk shows up before any work is
done. A batch is written into all files, flushed to disk, and only then counted in
``progress.json``: a crash leaves the store as it was after the last finished batch,
and :meth:`StoreWriter.resume` continues from there.

Batches are written with O_DIRECT where the file system allows it (:func:`pwrite_direct`,
into memory laid out by :class:`BatchBuffers`): what is stored is the same, byte for
byte, but writing it takes almost no CPU away from the forward pass that extraction runs
meanwhile.

**Sharded stores** (format version 2) are written by several ranks at once
(``torchrun ... -m attnlens extract``): rank 0 creates and preallocates the store, then
every rank writes its own contiguous range of sequences into the same files at their
offsets, and counts them in its own ``progress-rankRRRRR.json``; the manifest lists the
ranges (``shards``). :func:`open_store` reads a sharded store as one, complete when
every rank's progress says so, and each rank resumes from its own progress. (The ranks
must see the same directory: one machine, or a shared file system.) Single-process
stores keep format version 1 and ``progress.json``.

>>> import tempfile, numpy as np
>>> from attnlens.io.store import StoreWriter, open_store
>>> path = tempfile.mkdtemp() + "/store"
>>> writer = StoreWriter.create(path, {"n": 3, "num_heads": 1, "layers": [0], "dtype": "float32",
...                                    "weights": False}, tokens=np.zeros((2, 3), dtype=np.int32))
>>> writer.write_batch(0, {0: (np.ones((2, 1, 3, 3), np.float32), np.ones((2, 3, 3), bool), None)})
>>> writer.close()
>>> store = open_store(path)
>>> store.scores(0).shape, float(store.scores(0).sum())
((2, 1, 3, 3), 18.0)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlens.errors import BadFile, BadInput
from attnlens.io.files import flatten, pwrite_all, short, write_json_atomic

FORMAT = "attnlens-store"
FORMAT_VERSION = 2  # the newest this attnlens reads
PLAIN_FORMAT_VERSION = 1  # single-process stores: unchanged, so older attnlens versions read them
SHARDED_FORMAT_VERSION = 2
DTYPES = ("float16", "float32")


def layer_file(kind: str, layer: int) -> str:
    return f"{kind}/L{layer:02d}.npy"


KINDS = ("scores", "valid", "weights")

# Batches go to disk with O_DIRECT where they can: from the batch's own memory straight to
# the disk, instead of being copied into the page cache and written back by the kernel.
# Extraction keeps every core busy with the forward pass, and that copy and writeback
# (about 1.2 CPU-seconds per 600 MB, measured on minilm-l6) were most of what writing
# the store cost it. The alignment is the strictest O_DIRECT asks for on Linux (4 KiB
# sectors and pages): for file offsets, lengths and memory addresses.
DIRECT_ALIGNMENT = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # absent on macOS: everything goes through the page cache


def pwrite_direct(descriptor: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at byte ``offset``, as :func:`pwrite_all` does, but the whole
    aligned blocks in its middle with O_DIRECT when the memory is aligned as the file is
    (see :class:`BatchBuffers`) and the file system allows it.

    The partial blocks at either end, which a batch shares with its neighbours, always go
    through the page cache, so no block is ever written both ways. O_DIRECT does not make
    a write durable by itself (the disk's cache, the file's extents): the writer still
    fsyncs every file before it counts a batch.
    """
    head = -offset % DIRECT_ALIGNMENT
    body = max(len(data) - head, 0) // DIRECT_ALIGNMENT * DIRECT_ALIGNMENT
    if not body or _address(data[head:]) % DIRECT_ALIGNMENT or not _set_direct(descriptor, True):
        pwrite_all(descriptor, data, offset)
        return
    try:
        pwrite_all(descriptor, data[head : head + body], offset + head)
    except OSError as error:
        if error.errno != errno.EINVAL:  # some file systems accept O_DIRECT, then refuse the write
            raise
        _set_direct(descriptor, False)
        pwrite_all(descriptor, data[head : head + body], offset + head)
    finally:
        _set_direct(descriptor, False)
    pwrite_all(descriptor, data[:head], offset)
    pwrite_all(descriptor, data[head + body :], offset + head + body)


def _address(data: memoryview) -> int:
    return np.frombuffer(data, dtype=np.uint8).ctypes.data


def _set_direct(descriptor: int, direct: bool) -> bool:
    """Switch O_DIRECT on or off for an open file; ``False`` where the file system has no direct I/O."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
    try:
        fcntl.fcntl(descriptor, fcntl.F_SETFL, flags | _O_DIRECT if direct else flags & ~_O_DIRECT)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class ArrayFile:
    """One preallocated ``.npy`` file, written by absolute byte offset."""

    relative: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _array_files(manifest: dict) -> list[ArrayFile]:
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
    return sum(spec.row_bytes * spec.shape[0] for spec in _array_files(manifest))


def is_store(path: Path) -> bool:
    return (Path(path) / "manifest.json").is_file()


def progress_file(shard: int | None) -> str:
    """Where a store counts its finished sequences: one file, or one per rank of a sharded store.

    >>> progress_file(None), progress_file(3)
    ('progress.json', 'progress-rank00003.json')
    """
    return "progress.json" if shard is None else f"progress-rank{shard:05d}.json"


def _version_for(shards: list | None) -> int:
    return SHARDED_FORMAT_VERSION if shards else PLAIN_FORMAT_VERSION


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
        self.start, self.stop = manifest["shards"][shard] if shard is not None else (0, manifest["num_seqs"])
        self._files = {spec.relative: spec for spec in _array_files(manifest)}
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
        manifest = {"format": FORMAT, "format_version": _version_for(shards), **manifest, "num_seqs": int(tokens.shape[0])}
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
            for spec in _array_files(manifest):
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
        expected = {"format": FORMAT, "format_version": _version_for(shards), **manifest, "num_seqs": int(tokens.shape[0])}
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
                self._write_at(descriptor, memoryview(array).cast("B"), self.offset(spec.relative, start))
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
        return {
            layer: tuple(
                self._view(layer_file(kind, layer), start, rows) if layer_file(kind, layer) in self._raw else None
                for kind in KINDS
            )
            for layer in self._writer.manifest["layers"]
        }

    def _view(self, relative: str, start: int, rows: int) -> np.ndarray:
        spec, raw = self._writer._files[relative], self._raw[relative]
        shift = (self._writer.offset(relative, start) - raw.ctypes.data) % DIRECT_ALIGNMENT
        return raw[shift : shift + rows * spec.row_bytes].view(spec.dtype).reshape(rows, *spec.shape[1:])


class Store:
    """A store opened for reading; arrays are memory-mapped and read lazily, layer by layer."""

    def __init__(self, path: Path, manifest: dict, complete: int) -> None:
        self.path = path
        self.manifest = manifest
        self.complete = complete

    @property
    def n(self) -> int:
        return int(self.manifest["n"])

    @property
    def num_seqs(self) -> int:
        """Finished sequences (all of them unless opened with ``allow_partial``)."""
        return self.complete

    @property
    def num_heads(self) -> int:
        return int(self.manifest["num_heads"])

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def is_complete(self) -> bool:
        return self.complete == self.manifest["num_seqs"]

    @property
    def tokens(self) -> np.ndarray:
        """(seq, n) int32 token ids."""
        return np.load(self.path / "tokens.npy", mmap_mode="r")[: self.complete]

    def _layer_array(self, kind: str, layer: int) -> np.ndarray:
        if layer not in self.manifest["layers"]:
            raise BadInput(f"layer {layer} is not in the store {self.path}; it holds layers {self.layers}")
        if kind == "weights" and not self.manifest["weights"]:
            raise BadFile(f"the store {self.path} holds no weights; extract it again with `weights`")
        return np.load(self.path / layer_file(kind, layer), mmap_mode="r")[: self.complete]

    def read(self, kind: str, layer: int, start: int, stop: int) -> np.ndarray:
        """Sequences ``start:stop`` of one layer's ``scores``, ``valid`` or ``weights``, read into memory.

        Unlike slicing the memory map, this leaves no file pages mapped into the
        process, so streaming over a large store keeps its memory bounded.
        """
        array = self._layer_array(kind, layer)  # validates layer and kind; the header gives the layout
        stop = min(stop, self.complete)
        per_sequence = int(np.prod(array.shape[1:]))
        with open(array.filename, "rb") as handle:
            data = np.fromfile(
                handle,
                dtype=array.dtype,
                count=(stop - start) * per_sequence,
                offset=array.offset + start * per_sequence * array.dtype.itemsize,
            )
        return data.reshape(stop - start, *array.shape[1:])

    def scores(self, layer: int) -> np.ndarray:
        """(seq, head, n, n) pre-softmax scores of one layer; invalid entries are meaningless."""
        return self._layer_array("scores", layer)

    def valid(self, layer: int) -> np.ndarray:
        """(seq, n, n) boolean mask of the (query, key) pairs the model may attend to."""
        return self._layer_array("valid", layer)

    def weights(self, layer: int) -> np.ndarray:
        """(seq, head, n, n) post-softmax weights of one layer (stores made with ``--weights``)."""
        return self._layer_array("weights", layer)

    def __repr__(self) -> str:
        model = self.manifest.get("model", {}).get("name", "?")
        return f"Store({str(self.path)!r}, model={model!r}, n={self.n}, seqs={self.complete}/{self.manifest['num_seqs']})"


# What a damaged store's message says to do. Extraction preallocates every array and writes the
# manifest last, so an interrupted extraction leaves an unfinished store (resume finishes it), never
# a damaged one: a damaged store is extracted again.
REEXTRACT = (
    "extract it again by rerunning the extract command with `overwrite` "
    "(`resume` finishes only an interrupted extraction, in an undamaged store)"
)


def open_store(path: str | Path, *, allow_partial: bool = False) -> Store:
    """Open and validate a store; raise :class:`BadFile` if it is missing, foreign, newer, damaged or unfinished.

    A damaged store's message says to extract it again with ``overwrite``; an unfinished one's,
    to finish it with ``resume``.
    """
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not path.is_dir():
        raise BadFile(f"store '{path}' does not exist; make one with 'attnlens extract --out {path}'")
    if not manifest_path.is_file():
        if (path / "tokens.npy").is_file() or (path / "scores").is_dir():
            # The manifest is written last: an extraction stopped while it created the store.
            raise BadFile(
                f"'{path}' is not an attnlens store (no manifest.json): an extraction stopped while it created the store; "
                "delete the directory and extract again"
            )
        raise BadFile(f"'{path}' is not an attnlens store (no manifest.json); give a directory made by 'attnlens extract'")
    try:
        manifest = json.loads(manifest_path.read_text())
        shards = manifest.get("shards") if isinstance(manifest, dict) else None
        progress = (
            [json.loads((path / progress_file(rank)).read_text()) for rank in range(len(shards))]
            if shards
            else [json.loads((path / "progress.json").read_text())]
        )
    except (OSError, json.JSONDecodeError) as error:
        raise BadFile(
            f"store '{path}' is damaged ({type(error).__name__} reading its manifest or progress); {REEXTRACT}"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadFile(f"'{path}' is not an attnlens store (its manifest.json is of another format)")
    try:
        if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
            raise BadFile(
                f"store '{path}' has format version {manifest['format_version']}, newer than this attnlens reads "
                f"({FORMAT_VERSION}); upgrade attnlens"
            )
        complete, unfinished = _completion(progress, shards, manifest["num_seqs"])
        expected_files = [ArrayFile("tokens.npy", "int32", (manifest["num_seqs"], manifest["n"])), *_array_files(manifest)]
    except (KeyError, TypeError, ValueError, AttributeError) as error:  # a manifest or progress file that lacks a field
        what = f"no {error}" if isinstance(error, KeyError) else type(error).__name__
        raise BadFile(f"store '{path}' is damaged ({what} in its manifest or progress); {REEXTRACT}") from None
    for spec in expected_files:
        try:
            array = np.load(path / spec.relative, mmap_mode="r")
        except (OSError, ValueError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise BadFile(f"store '{path}' is damaged: {spec.relative} is missing or truncated ({reason}); {REEXTRACT}") from None
        if array.shape != spec.shape or array.dtype != np.dtype(spec.dtype):
            raise BadFile(
                f"store '{path}' is damaged: {spec.relative} holds {array.dtype}{list(array.shape)}, "
                f"the manifest says {spec.dtype}{list(spec.shape)}; {REEXTRACT}"
            )
    if unfinished and not allow_partial:
        ranks = f", with torchrun and {len(shards)} ranks" if shards else ""
        raise BadFile(
            f"store '{path}' is unfinished ({unfinished}); finish it by rerunning the same extract command with `resume`{ranks}"
        )
    return Store(path, manifest, complete)


def _completion(progress: list[dict], shards: list | None, num_seqs: int) -> tuple[int, str]:
    """How many leading sequences are finished (a store reads as that prefix), and a
    description of what is not (empty when everything is).

    >>> _completion([{"complete": 5}], None, 8)
    (5, '5 of 8 sequences')
    >>> _completion([{"start": 0, "stop": 4, "complete": 4}, {"start": 4, "stop": 8, "complete": 6}], [[0, 4], [4, 8]], 8)
    (6, 'rank 1: 2 of 4 sequences')
    """
    if not shards:
        complete = int(progress[0].get("complete", 0))
        return complete, "" if complete >= num_seqs else f"{complete} of {num_seqs} sequences"
    prefix, missing = 0, []
    for rank, ((start, stop), state) in enumerate(zip(shards, progress)):
        done = int(state.get("complete", start))
        if prefix == start:
            prefix = done
        if done < stop:
            missing.append(f"rank {rank}: {done - start} of {stop - start} sequences")
    return prefix, "; ".join(missing)
