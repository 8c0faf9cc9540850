"""Row sources: batches of captured scores, from a store on disk or straight from a model.

Analyses that stream over rows (moments, reconstruction error) take a source and a
``consumer(layer, scores, valid, sequences)`` that is called once per layer and batch:
``scores`` (batch, head, n, n), ``valid`` (batch, n, n), ``sequences`` the indices of
the batch's sequences. From a model the consumer runs inside the forward pass, as each
layer is computed, so nothing beyond one layer of one batch is held in memory. Scores
reach the consumer on the CPU, or, with ``to_cpu=False``, where the model computed them
(a GPU), so that accumulation can stay there.

>>> import numpy as np
>>> from attnlens import load_corpus, load_model
>>> model = load_model("minilm-l6")
>>> rows = ModelRows(model, load_corpus("kjv").blocks(model, n=8, num_blocks=4))
>>> seen = []
>>> rows.for_each_batch(np.arange(4), [0, 3], lambda layer, scores, valid, seqs: seen.append((layer, tuple(scores.shape))),
...                     batch_size=2, progress=False)
>>> seen[:2]
[(0, (2, 12, 8, 8)), (3, (2, 12, 8, 8))]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Unpack

import numpy as np
import torch

from attnlens.data.corpus import Blocks, Corpus, load_corpus
from attnlens.errors import BadInput
from attnlens.io.store import Store, is_store, open_store
from attnlens.models.aliases import ALIASES
from attnlens.models.capture import Capture
from attnlens.models.gguf import is_gguf
from attnlens.models.loading import LoadedModel, LoadOptions, load_model
from attnlens.models.locate import ModelNotFound
from attnlens.progress import progress_bar

Consumer = Callable[[int, torch.Tensor, torch.Tensor, np.ndarray], None]


class StoreRows:
    """Rows read from a store, one layer and batch at a time (no memory map kept)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.n, self.num_heads, self.num_seqs, self.layers = store.n, store.num_heads, store.num_seqs, store.layers
        self.model_info = store.manifest["model"]
        corpus = {key: value for key, value in store.manifest["corpus"].items() if key != "block_index"}
        self.corpus_info = {**corpus, "store": str(store.path)}
        self.block_index = np.asarray(store.manifest["corpus"].get("block_index", range(store.num_seqs)))

    def tokens(self, sequences: np.ndarray) -> np.ndarray:
        return np.asarray(self.store.tokens)[sequences].astype(np.int64)

    def check_layers(self, layers: Iterable[int] | None) -> list[int]:
        layers = self.layers if layers is None else sorted(set(layers))
        missing = [layer for layer in layers if layer not in self.layers]
        if missing:
            raise BadInput(f"layer {missing[0]} is not in the store {self.store.path}; it holds layers {self.layers}")
        return layers

    def for_each_batch(
        self,
        sequences: np.ndarray,
        layers: list[int],
        consume: Consumer,
        *,
        batch_size: int = 32,
        progress: bool = True,
        desc: str = "rows",
        to_cpu: bool = True,
    ) -> None:
        sequences = np.sort(np.asarray(sequences))
        # A store is read layer by layer: the bar counts (sequence, layer) pairs, and says so.
        with progress_bar(total=len(sequences) * len(layers), desc=desc, unit="seq×layer", enabled=progress) as bar:
            for layer in layers:
                for chunk in _chunks(sequences, batch_size):
                    start, stop = int(chunk[0]), int(chunk[-1]) + 1
                    pick = chunk - start  # the chunk's sequences inside the contiguous range read
                    scores = self.store.read("scores", layer, start, stop)[pick]
                    valid = self.store.read("valid", layer, start, stop)[pick]
                    consume(layer, torch.from_numpy(scores), torch.from_numpy(valid), chunk)
                    bar.update(len(chunk))


class ModelRows:
    """Rows computed by forward passes over corpus blocks; nothing is written to disk."""

    def __init__(self, model: LoadedModel, blocks: Blocks, corpus: Corpus | None = None, seed: int | None = None) -> None:
        self.model, self.blocks = model, blocks
        self.n, self.num_heads, self.num_seqs = blocks.n, model.num_heads, len(blocks)
        self.layers = list(range(model.num_layers))
        self.model_info = model.describe()
        self.corpus_info = {**(corpus.describe() if corpus is not None else {}), "num_seqs": len(blocks), "seed": seed}
        self.block_index = np.asarray(blocks.index)

    def tokens(self, sequences: np.ndarray) -> np.ndarray:
        return self.blocks.ids[sequences]

    def check_layers(self, layers: Iterable[int] | None) -> list[int]:
        return self.model.check_layers(layers)

    def for_each_batch(
        self,
        sequences: np.ndarray,
        layers: list[int],
        consume: Consumer,
        *,
        batch_size: int = 32,
        progress: bool = True,
        desc: str = "rows",
        to_cpu: bool = True,
    ) -> None:
        sequences = np.sort(np.asarray(sequences))
        place = (lambda tensor: tensor.cpu()) if to_cpu else (lambda tensor: tensor)
        with progress_bar(total=len(sequences), desc=desc, unit="seq", enabled=progress) as bar:
            for chunk in _chunks(sequences, batch_size):
                sink = lambda layer, scores, valid, weights: consume(layer, place(scores), place(valid), chunk)
                with torch.no_grad(), Capture(layers, sink=sink):
                    self.model.run_attention(torch.from_numpy(self.blocks.ids[chunk]))
                bar.update(len(chunk))


def layer_pairs(rows: StoreRows | ModelRows, layers: Iterable[int]) -> dict[int, np.ndarray]:
    """Each of ``layers``' (query, key) pairs on the first block, (n, n) boolean: what the layer computes
    on a text of n tokens (every pair, its causal triangle, its window), as the costs count it
    (:mod:`attnlens.analysis.costs`). One forward of one block, or one read of a store."""
    found: dict[int, np.ndarray] = {}

    def consume(layer: int, scores: torch.Tensor, valid: torch.Tensor, chunk: np.ndarray) -> None:
        found.setdefault(layer, valid[0].cpu().numpy().astype(bool))

    rows.for_each_batch(np.arange(1), list(layers), consume, batch_size=1, progress=False)
    return dict(sorted(found.items()))


def model_pairs(model: LoadedModel, n: int, layers: Iterable[int] | None = None) -> dict[int, np.ndarray]:
    """:func:`layer_pairs` of ``model`` on a text of ``n`` tokens: one forward of one block of a repeated word
    (which tokens does not matter: a layer's mask depends on positions, not on words).

    >>> from attnlens import load_model
    >>> pairs = model_pairs(load_model("minilm-l6"), 8, layers=[0])
    >>> list(pairs), pairs[0].shape, bool(pairs[0].all())
    ([0], (8, 8), True)
    """
    word = model.tokenizer("the", add_special_tokens=False)["input_ids"][:1] or [0]
    block = Blocks(ids=np.full((1, n), word[0], dtype=np.int64), index=np.arange(1), available=1)
    return layer_pairs(ModelRows(model, block), model.check_layers(layers))


def partial_row_layers(pairs: dict[int, np.ndarray]) -> list[int]:
    """The layers (of :func:`layer_pairs`) in which some query does not see every key: causal layers, and
    windowed ones (a sliding or local window shorter than n). Their rows differ in which keys they hold,
    so an analysis that pools rows over queries cannot use them all.

    >>> partial_row_layers({0: np.ones((3, 3), dtype=bool), 1: np.tril(np.ones((3, 3), dtype=bool))})
    [1]
    """
    return [layer for layer, valid in pairs.items() if not valid.all()]


def _chunks(sequences: np.ndarray, size: int) -> list[np.ndarray]:
    return [sequences[start : start + size] for start in range(0, len(sequences), size)]


def source_kinds(*, moments: bool = True) -> str:
    """What a SOURCE may be, for messages about one that is none of them.

    >>> source_kinds(moments=False)
    'a store directory (attnlens extract), or a model alias (minilm-l6, minilm-l3, gemma3-270m), local directory, GGUF file or Hub id'
    """
    kinds = ["a store directory (attnlens extract)"]
    if moments:
        kinds.append("a moments directory (attnlens moments / merge)")
    kinds.append(f"or a model alias ({', '.join(ALIASES)}), local directory, GGUF file or Hub id")
    return ", ".join(kinds)


def is_moments_source(path: str | Path) -> bool:
    """A moments result directory, or a moments job's work directory."""
    path = Path(str(path))
    if (path / "job.json").is_file():
        return True
    try:
        return json.loads((path / "result.json").read_text()).get("kind") == "moments"
    except (OSError, ValueError, AttributeError):
        return False


def check_source_path(source: str | Path, *, moments: bool = True) -> None:
    """Refuse a SOURCE that is an existing file or directory but neither a store nor a model
    directory (nor, with ``moments``, merged moments), naming what SOURCE may be. A moments
    directory given where only rows will do is refused too.

    ``moments`` says whether the caller also takes moments (:func:`attnlens.analysis.eigen`
    does, and reads them before it asks for rows); it changes only the messages.
    """
    path = Path(str(source)).expanduser()
    if not path.exists() or is_store(path) or (path / "config.json").is_file() or is_gguf(path):
        return
    if is_moments_source(path):
        raise BadInput(f"`source` '{source}' holds moments, and this analysis reads rows; give {source_kinds(moments=False)}")
    what = (
        "an attnlens store (no manifest.json), moments (no result.json or job.json)"
        if moments
        else "an attnlens store (no manifest.json)"
    )
    raise BadInput(
        f"`source` '{source}' is neither {what} nor a model directory (no config.json); give {source_kinds(moments=moments)}"
    )


def load_source_model(source: str | Path, *, moments: bool = True, **options: Unpack[LoadOptions]) -> LoadedModel:
    """:func:`attnlens.load_model` of a SOURCE that is not a store: a name that names no model
    here is refused with a message that says what SOURCE was given and everything it may be."""
    try:
        return load_model(str(source), **options)
    except ModelNotFound as error:
        raise BadInput(f"`source` '{source}' {error.reason}; give {source_kinds(moments=moments)}") from None


def open_rows(
    source: str | Path | Store | LoadedModel,
    *,
    corpus: str | Path | Corpus = "kjv",
    seq_len: int = 128,
    num_seqs: int = 256,
    seed: int = 0,
    device: str = "cpu",
    moments: bool = True,
) -> StoreRows | ModelRows:
    """A store path / :class:`Store`, or a model (alias, path, Hub id, :class:`LoadedModel`) with corpus blocks.

    A source that is none of these raises :class:`BadInput` naming what it was given and what
    SOURCE may be: also a moments directory, unless ``moments=False`` (for callers that read
    only rows; :func:`attnlens.analysis.eigen`, which reads moments before it calls this, keeps
    the default).
    """
    if isinstance(source, Store):
        return StoreRows(source)
    if not isinstance(source, LoadedModel):
        if is_store(Path(source)):
            return StoreRows(open_store(source))
        check_source_path(source, moments=moments)
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)  # before the model: a bad corpus fails fast
    if not isinstance(source, LoadedModel):
        source = load_source_model(source, moments=moments, device=device)
    source.check_seq_len(seq_len)
    return ModelRows(source, corpus.blocks(source, seq_len, num_seqs, seed), corpus, seed)
