"""The GGUF conversion's one reader in memory reads what gguf's own reader reads, parsing each file once."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from attnlens.models.gguf import _one_reader_in_memory
from tiny_models import skip_unless_ci


@pytest.fixture(scope="module")
def gguf():
    if importlib.util.find_spec("gguf") is None:
        skip_unless_ci("the GGUF conversion needs gguf (pip install -e '.[gemma3]')")
    import gguf

    return gguf


@pytest.fixture
def small_gguf(tmp_path, gguf):
    """A GGUF file written by gguf's own writer: a vocabulary of strings, numbers, and two tensors."""
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("small.count", 7)
    writer.add_float32("small.scale", 0.25)
    writer.add_array("tokenizer.ggml.tokens", [f"token{index}" for index in range(300)])
    rng = np.random.default_rng(0)
    writer.add_tensor("first", rng.normal(size=(4, 8)).astype(np.float32))
    writer.add_tensor("second", rng.normal(size=(16,)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _contents(reader) -> dict:
    fields = {name: [bytes(part) for part in field.parts] for name, field in reader.fields.items()}
    tensors = {tensor.name: np.array(tensor.data) for tensor in reader.tensors}
    return {"fields": fields, "tensors": tensors}


def test_the_reader_in_memory_reads_what_the_memory_map_reads_and_parses_once(small_gguf, gguf):
    plain = _contents(gguf.GGUFReader(small_gguf))
    assert len(plain["fields"]["tokenizer.ggml.tokens"]) > 300, "the vocabulary was written"
    with _one_reader_in_memory():
        first, again = gguf.GGUFReader(small_gguf), gguf.GGUFReader(str(small_gguf))
        assert not isinstance(first.data, np.memmap) and again is first, "read into memory, once"
        fast = _contents(first)
    assert fast["fields"] == plain["fields"]
    assert fast["tensors"].keys() == plain["tensors"].keys()
    for name, values in plain["tensors"].items():
        np.testing.assert_array_equal(fast["tensors"][name], values)
    assert isinstance(gguf.GGUFReader(small_gguf).data, np.memmap), "gguf is as it was once the conversion ends"
