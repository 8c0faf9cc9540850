"""Reading a store: opened, validated and memory-mapped, complete or (when asked) the finished prefix.

:func:`open_store` checks a store before anything reads it (its manifest, its progress, every
array's shape and dtype) and says what to do about one that is missing, foreign, newer, damaged
or unfinished; a sharded store reads as one, complete when every rank's progress says so. The
format is described in :mod:`attnlens.io.store`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnlens.errors import BadFile, BadInput
from attnlens.io.store_layout import FORMAT, FORMAT_VERSION, ArrayFile, array_files, layer_file, progress_file


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
    def tokens(self) -> np.ndarray:
        """(seq, n) int32 token ids."""
        return np.load(self.path / "tokens.npy", mmap_mode="r")[: self.complete]

    def _layer_array(self, kind: str, layer: int) -> np.memmap:
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
        with open(self.path / layer_file(kind, layer), "rb") as handle:
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
        expected_files = [ArrayFile("tokens.npy", "int32", (manifest["num_seqs"], manifest["n"])), *array_files(manifest)]
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
