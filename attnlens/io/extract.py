"""Extract: run a model over corpus blocks and write the captured attention to a store.

Launched by ``torchrun`` with several ranks, every rank computes its own contiguous
share of the blocks and writes it into one sharded store (see :mod:`attnlens.io.store`);
a rank that dies loses only its unfinished batch, and ``--resume`` with the same number
of ranks continues each rank where it stopped.

>>> import tempfile
>>> from attnlens import extract
>>> store = extract("minilm-l6", tempfile.mkdtemp() + "/s", corpus="kjv", seq_len=16, num_seqs=4,
...                 layers=[0, 5], progress=False)
>>> store.scores(5).shape, store.manifest["model"]["name"]
((4, 12, 16, 16), 'minilm-l6')
"""

from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from attnlens.data.corpus import Blocks, Corpus, load_corpus
from attnlens.errors import BadInput
from attnlens.io.provenance import provenance
from attnlens.io.ranks import World, init_world, shard_range
from attnlens.io.results import check_resumable_out
from attnlens.io.store import DTYPES, Store, StoreWriter, is_store, open_store
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel, load_model
from attnlens.models.locate import locate_model
from attnlens.progress import Progress, progress_bar
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero


def prepare_out(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to touch existing results unless asked; never delete a directory that is not a store."""
    if check_resumable_out(out, resume=resume, overwrite=overwrite, owned=is_store, what="store"):
        shutil.rmtree(out)


def extract(
    source: str | LoadedModel,
    out: str | Path,
    *,
    corpus: str | Path | Corpus = "kjv",
    seq_len: int = 128,
    num_seqs: int | None = 256,
    batch_size: int = 32,
    dtype: str = "float16",
    layers: list[int] | None = None,
    weights: bool = False,
    device: str = "cpu",
    seed: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress = True,
    command: str | None = None,
) -> Store | None:
    """Capture the attention scores of the model ``source`` on ``num_seqs`` blocks of
    ``corpus`` into a store at ``out``.

    Blocks are processed ``batch_size`` at a time, and a batch counts as finished only
    once it is on disk, so ``resume=True`` continues an interrupted run and gives the
    same arrays, bit for bit, as an uninterrupted one. Under torchrun each rank writes
    its share; the store is returned on rank 0 (``None`` on the others) once all are done.
    """
    out = Path(out)
    _check_options(seq_len, num_seqs, batch_size, dtype, layers)
    world = init_world(device)
    world.run_on_main(lambda: prepare_out(out, resume=resume, overwrite=overwrite))
    corpus, model, layers, blocks = _prepare(source, corpus, seq_len, num_seqs, seed, layers, world, device, progress)
    manifest = {
        "model": model.describe(),
        "corpus": {**corpus.describe(), "blocks_available": blocks.available, "block_index": blocks.index.tolist(), "seed": seed},
        "n": seq_len,
        "num_heads": model.num_heads,
        "layers": layers,
        "dtype": dtype,
        "weights": weights,
        "batch_size": batch_size,
        **provenance(command),
    }
    tokens = blocks.ids.astype(np.int32)
    shards = [shard_range(len(blocks), rank, world.size) for rank in range(world.size)] if world.distributed else None
    # Rank 0 creates (or checks) the store; then every rank opens its own shard.
    created = world.run_on_main(
        lambda: (StoreWriter.resume if resume else StoreWriter.create)(out, manifest, tokens, shards=shards)
    )
    # Rank 0 has the writer it made; the others (None) open their own shard.
    writer = created if created is not None else StoreWriter.open_shard(out, world.rank)
    # A batch is written (and flushed to disk) in a background thread while the next one
    # is computed into the other of two reusable buffers: the flush waits on the disk, not
    # the CPU, and no batch allocates fresh memory. The buffers come from the writer, laid
    # out so that it writes them with O_DIRECT: the background thread then hardly uses
    # the CPU, which the forward pass needs (see attnlens.io.store.pwrite_direct).
    buffers = [_BatchBuffers(writer, batch_size, layers, weights) for _ in range(2)]
    pending: Future | None = None
    desc = "extract" if not world.distributed else f"extract rank 0/{world.size}"
    with (
        writer,
        ThreadPoolExecutor(max_workers=1) as background,
        progress_bar(
            total=writer.stop - writer.start,
            initial=writer.complete - writer.start,
            unit="seq",
            desc=desc,
            enabled=progress if world.is_main else False,
        ) as bar,
    ):
        try:
            for number, start in enumerate(range(writer.complete, writer.stop, batch_size)):
                ids = blocks.ids[start : min(start + batch_size, writer.stop)]
                arrays = buffers[number % 2].capture(model, ids, start)
                if pending is not None:
                    pending.result()
                pending = background.submit(writer.write_batch, start, arrays)
                bar.update(len(ids))
            if pending is not None:
                pending.result()
        except OSError as error:
            raise BadInput(
                f"could not write to {out} ({error.strerror or error}) after {writer.complete - writer.start} finished sequences, "
                "which are safe; fix the cause (e.g. free disk space) and rerun with `resume`"
            ) from None
    world.barrier()  # every rank's shard is on disk
    return open_store(out) if world.is_main else None


def _prepare(
    source: str | LoadedModel,
    corpus: str | Path | Corpus,
    seq_len: int,
    num_seqs: int | None,
    seed: int,
    layers: list[int] | None,
    world: World,
    device: str,
    progress: Progress,
) -> tuple[Corpus, LoadedModel, list[int], Blocks]:
    """The corpus, the model, the layers to keep and the blocks. Loading the model and cutting the
    corpus into blocks take most of a small run, so a bar says so; names that are no model or corpus
    fail first, in a second, before any bar is drawn."""
    if not isinstance(corpus, Corpus):
        corpus = load_corpus(corpus)
    if not isinstance(source, LoadedModel):
        locate_model(source)
    with progress_bar(total=2, desc="extract: preparing", unit="step", enabled=progress if world.is_main else False) as bar:
        bar.set_postfix_str("model")
        model = source if isinstance(source, LoadedModel) else load_model(source, device=world.device(device))
        model.check_seq_len(seq_len)
        kept = model.check_layers(layers)
        bar.update(1)
        bar.set_postfix_str("blocks")
        blocks = corpus.blocks(model, seq_len, num_seqs, seed)
        bar.update(1)
    return corpus, model, kept, blocks


def _check_options(seq_len: int, num_seqs: int | None, batch_size: int, dtype: str, layers: list[int] | None) -> None:
    """The checks that need neither the model nor the corpus, so that bad input fails before either loads."""
    CorpusSettings(seq_len=seq_len, batch_size=batch_size)
    if num_seqs is not None:
        at_least("num_seqs", num_seqs, 1)
    if dtype not in DTYPES:
        raise BadInput(f"`dtype` {dtype} is not supported; use one of {', '.join(DTYPES)}")
    numbered_from_zero("layers", layers)


class _BatchBuffers:
    """Reusable memory that one batch's captured layers are copied into (and cast to the store dtype)."""

    def __init__(self, writer: StoreWriter, batch_size: int, layers: list[int], weights: bool) -> None:
        self.memory = writer.batch_buffers(batch_size)
        self.layers = layers
        self.weights = weights

    def capture(
        self, model: LoadedModel, ids: np.ndarray, start: int
    ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """One forward pass over sequences ``start…``; returns views ``{layer: (scores, valid, weights)}`` into the buffers."""
        arrays = self.memory.arrays(start, len(ids))

        def keep(layer: int, scores: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor | None) -> None:
            # torch casts to the store dtype on its own threads, straight into the memory that is written.
            for target, tensor in zip(arrays[layer], (scores, valid, weights)):
                if target is not None:
                    assert tensor is not None, "the store keeps weights only where the capture records them"
                    torch.from_numpy(target).copy_(tensor)

        with torch.no_grad(), Capture(self.layers, weights=self.weights, sink=keep):
            model.run_attention(torch.from_numpy(ids))
        return arrays
