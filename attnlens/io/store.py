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

Batches are written with O_DIRECT where the file system allows it
(:func:`~attnlens.io.direct_io.pwrite_direct`, into memory laid out by
:class:`~attnlens.io.store_writer.BatchBuffers`): what is stored is the same, byte for
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

The parts, one idea each, whose public names this module gathers:

- :mod:`~attnlens.io.store_layout`: the format versions, the files a manifest implies, progress files;
- :mod:`~attnlens.io.store_writer`: :class:`StoreWriter` (create, resume, write batches) and its batch memory;
- :mod:`~attnlens.io.store_reader`: :class:`Store` and :func:`open_store`, which validates a store;
- :mod:`~attnlens.io.direct_io`: writes that bypass the page cache.
"""

from attnlens.io.store_layout import DTYPES, is_store
from attnlens.io.store_reader import Store, open_store
from attnlens.io.store_writer import StoreWriter

__all__ = ["DTYPES", "Store", "StoreWriter", "is_store", "open_store"]
