"""Store: round trip, resume after a kill, full disk, and damaged or foreign stores."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import attnlens
from attnlens import Capture
from attnlens.io.store import StoreWriter

SETTINGS = dict(seq_len=32, num_seqs=24, batch_size=8, layers=[0, 3], progress=False)


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory, minilm_l6, kjv):
    """An uninterrupted extraction, with weights, in float32."""
    return attnlens.extract(
        minilm_l6, tmp_path_factory.mktemp("ref") / "store", corpus=kjv, dtype="float32", weights=True, **SETTINGS
    )


def test_round_trip_equals_direct_capture(reference_store, minilm_l6, kjv):
    store = attnlens.open_store(reference_store.path)
    blocks = kjv.blocks(minilm_l6, n=32, num_blocks=24, seed=0)
    assert np.array_equal(store.tokens, blocks.ids)
    # Blocks 8 to 15 are the store's second batch (batch_size 8): the same forward pass, in this process with its
    # thread count, so the same bits (another batch composition would round differently).
    with torch.no_grad(), Capture(layers=[0, 3], weights=True) as cap:
        minilm_l6.forward(torch.from_numpy(blocks.ids[8:16]))
    for layer in (0, 3):
        assert store.scores(layer).shape == (24, 12, 32, 32)
        assert isinstance(store.scores(layer), np.memmap)
        np.testing.assert_array_equal(store.scores(layer)[8:16], cap.scores[layer].numpy())
        np.testing.assert_array_equal(store.weights(layer)[8:16], cap.weights[layer].numpy())
        assert store.valid(layer).all()
    manifest = store.manifest
    assert manifest["model"]["name"] == "minilm-l6" and manifest["model"]["weights_sha256"] == minilm_l6.weights_sha256()
    assert manifest["corpus"]["sha256"] == kjv.sha256 and manifest["corpus"]["block_index"] == blocks.index.tolist()
    assert manifest["versions"]["torch"] == torch.__version__.split("+")[0] or manifest["versions"]["torch"].startswith(
        torch.__version__[:4]
    )
    with pytest.raises(attnlens.AttnlensError, match="layer 1 is not in the store"):
        store.scores(1)


def test_float16_store_holds_rounded_scores(tmp_path, reference_store, minilm_l6, kjv):
    half = attnlens.extract(minilm_l6, tmp_path / "half", corpus=kjv, **SETTINGS)
    assert half.scores(0).dtype == np.float16
    # Same batches in the same process as the float32 store: the same float32 scores, rounded once to float16.
    np.testing.assert_array_equal(half.scores(0), reference_store.scores(0).astype(np.float16))
    with pytest.raises(attnlens.AttnlensError, match="holds no weights"):
        half.weights(0)


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import attnlens
    from attnlens.io.files import pwrite_all
    from attnlens.io.store import StoreWriter
    calls = 0
    def write_then_die(descriptor, data, offset):
        global calls
        calls += 1
        if calls == {kill_at}:   # halfway through the second batch: half an array written, then SIGKILL
            pwrite_all(descriptor, data[: len(data) // 2], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        pwrite_all(descriptor, data, offset)
    StoreWriter._write_at = staticmethod(write_then_die)
    attnlens.extract("minilm-l6", sys.argv[1], corpus="kjv", dtype="float32", weights=True, **{settings})
    """
)


@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(tmp_path, reference_store):
    out = tmp_path / "killed"
    # Each batch writes scores, valid and weights for 2 layers: 6 writes; die in the 9th.
    script = KILLER.format(kill_at=9, settings=repr(SETTINGS))
    killed = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    partial = attnlens.open_store(out, allow_partial=True)
    assert partial.complete == 8, "only the finished first batch counts"
    with pytest.raises(attnlens.AttnlensError, match="unfinished"):
        attnlens.open_store(out)
    with pytest.raises(attnlens.AttnlensError, match="already exists"):
        attnlens.extract("minilm-l6", out, corpus="kjv", dtype="float32", weights=True, **SETTINGS)
    resumed = attnlens.extract("minilm-l6", out, corpus="kjv", dtype="float32", weights=True, resume=True, **SETTINGS)
    # Bit for bit: every batch (8 blocks) is the reference's, and the killed child process runs torch's default thread
    # count as this one does (the suite never changes it), so each forward pass is the same computation.
    for layer in (0, 3):
        for kind in ("scores", "valid", "weights"):
            expected, got = getattr(reference_store, kind)(layer), getattr(resumed, kind)(layer)
            assert got.tobytes() == expected.tobytes(), f"{kind} of layer {layer} differs after resume"


def test_resume_refuses_other_settings(tmp_path, minilm_l6, kjv):
    out = tmp_path / "s"
    attnlens.extract(minilm_l6, out, corpus=kjv, **SETTINGS)
    with pytest.raises(attnlens.AttnlensError, match="made with n = 32"):
        attnlens.extract(minilm_l6, out, corpus=kjv, resume=True, **{**SETTINGS, "seq_len": 16})


def test_full_disk_mid_write_keeps_finished_batches(tmp_path, monkeypatch, reference_store, minilm_l6, kjv):
    calls = {"n": 0}
    original = StoreWriter.__dict__["_write_at"]  # the staticmethod itself

    def fill_up(descriptor, data, offset):
        calls["n"] += 1
        if calls["n"] == 14:  # in the third batch
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original.__func__(descriptor, data, offset)

    monkeypatch.setattr(StoreWriter, "_write_at", staticmethod(fill_up))
    out = tmp_path / "full"
    with pytest.raises(attnlens.AttnlensError, match="after 16 finished sequences, which are safe"):
        attnlens.extract(minilm_l6, out, corpus=kjv, dtype="float32", weights=True, **SETTINGS)
    partial = attnlens.open_store(out, allow_partial=True)
    assert partial.complete == 16
    # The reference's batches, in this process: the same forward passes, so the same bits.
    np.testing.assert_array_equal(partial.scores(3), reference_store.scores(3)[:16])
    monkeypatch.setattr(StoreWriter, "_write_at", original)
    finished = attnlens.extract(minilm_l6, out, corpus=kjv, dtype="float32", weights=True, resume=True, **SETTINGS)
    np.testing.assert_array_equal(finished.scores(3), reference_store.scores(3))


def test_not_enough_space_fails_before_any_work(tmp_path, monkeypatch, minilm_l6, kjv):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(attnlens.AttnlensError, match="not enough disk space"):
        attnlens.extract(minilm_l6, tmp_path / "s", corpus=kjv, **SETTINGS)


def test_damaged_foreign_and_newer_stores_are_refused(tmp_path, reference_store):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(reference_store.path, copy)
    assert attnlens.open_store(copy).num_seqs == 24

    with open(copy / "scores" / "L03.npy", "r+b") as handle:
        handle.truncate(os.path.getsize(copy / "scores" / "L03.npy") - 1000)
    with pytest.raises(attnlens.AttnlensError, match="damaged: scores/L03.npy"):
        attnlens.open_store(copy)

    manifest = json.loads((reference_store.path / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(attnlens.AttnlensError, match="newer than this attnlens reads"):
        attnlens.open_store(copy)

    (copy / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(attnlens.AttnlensError, match="not an attnlens store"):
        attnlens.open_store(copy)

    (tmp_path / "empty").mkdir()
    with pytest.raises(attnlens.AttnlensError, match="no manifest.json"):
        attnlens.open_store(tmp_path / "empty")
    with pytest.raises(attnlens.AttnlensError, match="does not exist"):
        attnlens.open_store(tmp_path / "nowhere")


def test_overwrite_replaces_a_store_but_never_a_foreign_directory(tmp_path, minilm_l6, kjv):
    out = tmp_path / "s"
    attnlens.extract(minilm_l6, out, corpus=kjv, **SETTINGS)
    replaced = attnlens.extract(minilm_l6, out, corpus=kjv, overwrite=True, **{**SETTINGS, "layers": [1]})
    assert replaced.layers == [1]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(attnlens.AttnlensError, match="not an attnlens store"):
        attnlens.extract(minilm_l6, foreign, corpus=kjv, overwrite=True, **SETTINGS)
    assert (foreign / "thesis.tex").read_text() == "precious"


# ---------------------------------------------------------------------- direct writes


def test_direct_writes_leave_the_same_bytes_as_plain_writes(tmp_path, monkeypatch):
    """O_DIRECT for the aligned middle, the page cache for the ends: byte for byte what pwrite leaves,
    whatever the offset, the length and the alignment of the memory."""
    import fcntl

    from attnlens.io import direct_io
    from attnlens.io.files import pwrite_all

    switched = []
    original = direct_io._set_direct

    def set_direct(descriptor, on):
        switched.append(on and original(descriptor, on))
        return switched[-1] if on else original(descriptor, on)

    monkeypatch.setattr(direct_io, "_set_direct", set_direct)
    align = direct_io.DIRECT_ALIGNMENT
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 6 * align, dtype=np.uint8)
    base = -raw.ctypes.data % align  # raw[base:] is aligned in memory
    paths = tmp_path / "direct.bin", tmp_path / "plain.bin"
    descriptors = [os.open(path, os.O_RDWR | os.O_CREAT) for path in paths]
    try:
        for descriptor in descriptors:
            os.posix_fallocate(descriptor, 0, 16 * align)
        cases = [
            (0, 0, 2 * align),
            (align, 0, 3 * align),
            (128, align - 128, 3 * align),
            (100, align - 100, 2 * align + 7),
            (5, 0, 2 * align),
            (align + 64, align - 64, 100),
            (3 * align, 17, 2 * align),
        ]  # (offset, memory shift, length)
        for offset, shift, length in cases:
            data = memoryview(raw[base + shift : base + shift + length])
            direct_io.pwrite_direct(descriptors[0], data, 4 * align + offset)
            pwrite_all(descriptors[1], data, 4 * align + offset)
            assert fcntl.fcntl(descriptors[0], fcntl.F_GETFL) & direct_io._O_DIRECT == 0, "O_DIRECT is switched off again"
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    if True not in switched:
        pytest.skip("this file system has no O_DIRECT: only the page-cache path was checked")


def test_batch_buffers_are_aligned_as_their_place_in_the_file(tmp_path):
    from attnlens.io.direct_io import DIRECT_ALIGNMENT

    manifest = {"n": 5, "num_heads": 3, "layers": [0, 2], "dtype": "float16", "weights": True}
    with StoreWriter.create(tmp_path / "s", manifest, tokens=np.zeros((11, 5), dtype=np.int32)) as writer:
        memory = writer.batch_buffers(4)
        for start, rows in ((0, 4), (4, 4), (8, 3)):
            arrays = memory.arrays(start, rows)
            assert sorted(arrays) == [0, 2]
            for layer, (scores, valid, weights) in arrays.items():
                assert scores.shape == weights.shape == (rows, 3, 5, 5) and scores.dtype == np.float16
                assert valid.shape == (rows, 5, 5) and valid.dtype == bool
                for kind, array in zip(("scores", "valid", "weights"), (scores, valid, weights)):
                    offset = writer.offset(f"{kind}/L{layer:02d}.npy", start)
                    assert (array.ctypes.data - offset) % DIRECT_ALIGNMENT == 0
                    array[...] = start + 1
            writer.write_batch(start, arrays)
    store = attnlens.open_store(tmp_path / "s")
    assert [float(store.scores(2)[i, 0, 0, 0]) for i in (0, 4, 10)] == [1.0, 5.0, 9.0]
    assert store.weights(0)[8:].min() == 9 and store.valid(0).all()
