"""GGUF files as models: the conversion's one reader in memory reads what gguf's own reader reads, parsing each
file once; a GGUF file of another family than Gemma 3, written here from a tiny random Llama as llama.cpp writes
one, converts once and computes what the original model computes; a file transformers cannot read is refused in
one line before any conversion."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import attnlens
from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models import locate
from attnlens.models.gguf import _one_reader_in_memory, check_gguf
from tiny_models import assert_one_line_error, run_cli, skip_unless_ci


@pytest.fixture(scope="module")
def gguf():
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            skip_unless_ci(f"the GGUF conversion needs {package} (pip install -e '.[gemma3]')")
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


# ---------------------------------------------------------------------------- a GGUF file of another family

# A SentencePiece vocabulary as llama.cpp writes a Llama's: unknown, the two control tokens, the 256 byte
# tokens (any text encodes), single characters, and the prefixes of a few words (whose merges transformers
# rebuilds from the pieces and their scores: longer pieces merge later).
WORDS = ("the", "and", "of", "lord", "unto", "shall", "he", "god", "earth", "beginning", "created", "heaven")
PIECES = ["\u2581", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,.;:'!?"]
PIECES += dict.fromkeys(f"\u2581{word}"[:end] for word in WORDS for end in range(2, len(word) + 2))
TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *PIECES]


def tiny_llama() -> transformers.LlamaForCausalLM:
    """A random Llama (grouped-query attention, 4 query heads on 2 key heads) over :data:`TOKENS`."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(TOKENS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).eval()


def _llama_cpp_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of a Llama's q or k rows (its convert_hf_to_gguf's ``permute``: each head's two rotary
    halves interleaved), which transformers' reader undoes."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_llama_gguf(
    gguf, path: Path, model: transformers.LlamaForCausalLM, dtype=np.float32, architecture: str = "llama"
) -> Path:
    """``model`` as a GGUF file, written as llama.cpp's converter writes a Llama: its config under llama.cpp's
    keys, its vocabulary, and its tensors under gguf's names (matrices in ``dtype``, norms in float32)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * 259 + [-float(len(piece)) for piece in PIECES])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(PIECES))  # unknown, control, byte, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        array = tensor.numpy()
        if name.endswith("q_proj.weight"):
            array = _llama_cpp_rows(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _llama_cpp_rows(array, config.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array.astype(dtype if array.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of this module's own, so that every conversion here is made here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def llama_gguf(gguf, cache, tmp_path_factory) -> tuple[Path, transformers.LlamaForCausalLM]:
    model = tiny_llama()
    return write_llama_gguf(gguf, tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf", model), model


TEXT = "In the beginning God created the heaven and the earth."


@pytest.mark.integration
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_llama_gguf_loads_as_the_model_it_was_written_from(gguf, cache, tmp_path, dtype):
    """The converted model's logits and attention weights are the original's (transformers' eager forward), its
    tokenizer the file's vocabulary, and its provenance the file: path, size and SHA-256, computed here."""
    original = tiny_llama()
    path = write_llama_gguf(gguf, tmp_path / "tiny-llama.gguf", original, dtype)
    if dtype == np.float16:  # the file holds the matrices rounded to half precision: so must the reference
        with torch.no_grad():
            for parameter in original.parameters():
                if parameter.ndim == 2:
                    parameter.copy_(parameter.half().float())
    model = attnlens.load_model(str(path))
    ids = model.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    assert model.tokenizer.convert_ids_to_tokens(ids[0, :5].tolist()) == ["<s>", "\u2581", "I", "n", "\u2581the"]
    assert (model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim, model.causal) == (2, 4, 2, 8, True)
    with torch.no_grad(), attnlens.Capture() as capture:
        logits = model.forward(ids).logits
    with torch.no_grad():
        eager = original(ids, output_attentions=True)
    torch.testing.assert_close(logits, eager.logits, rtol=0, atol=1e-5)
    for layer, scores in capture.scores.items():
        weights = scores.double().masked_fill(~capture.valid[layer][:, None], float("-inf")).softmax(-1)
        torch.testing.assert_close(weights, eager.attentions[layer].double(), rtol=0, atol=1e-6)
    described = model.describe()
    assert described["name"] == str(path) and Path(str(described["source"])).name.startswith("gguf-tiny-llama-")
    assert described["converted_from"] == {
        "file": str(path.resolve()),
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


@pytest.mark.integration
def test_a_gguf_file_is_converted_once_and_again_only_when_it_changes(llama_gguf, tmp_path, monkeypatch):
    path = tmp_path / "copy.gguf"  # a file of its own: it is changed below
    path.write_bytes(llama_gguf[0].read_bytes())
    first = locate.locate_model(str(path))
    assert Path(first).parent == Path(os.environ["ATTNLENS_CACHE"]) / "models"
    converted = []

    def convert(source: Path, target: Path) -> None:  # a stand-in: records the call, writes a config alone
        converted.append(source)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(locate, "convert_gguf", convert)
    assert locate.locate_model(str(path)) == first and not converted, "the second call reads the cache"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # the file changed in place
    again = locate.locate_model(str(path))
    assert converted == [path] and again != first, "a changed file is converted again, into a directory of its own"
    assert not [entry.name for entry in Path(first).parent.iterdir() if entry.name.startswith(".")], "no staging left"


@pytest.mark.integration
def test_attnlens_takes_a_gguf_file_as_the_model(llama_gguf, tmp_path, capsys):
    """``attnlens extract FILE.gguf``, and eigen on what it wrote: the store's model is the file."""
    path, _ = llama_gguf
    out = tmp_path / "store"
    code, stdout, err = run_cli(
        capsys, "extract", str(path), "--out", str(out), "--seq-len", "16", "--num-seqs", "4", "--no-progress"
    )
    assert code == 0, err
    store = attnlens.open_store(out)
    assert store.scores(1).shape == (4, 4, 16, 16)
    assert store.manifest["model"]["converted_from"]["file"] == str(path.resolve())
    code, _, err = run_cli(capsys, "eigen", str(out), "--out", str(tmp_path / "eigen"), "--no-progress")
    assert code == 0, err


# ---------------------------------------------------------------------------- files that are refused, in a second


@pytest.fixture
def no_conversion(monkeypatch):
    """Any conversion fails the test: a refused file is refused from its header, before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("a refused file reached the conversion")

    monkeypatch.setattr(locate, "cached_conversion", refuse)


def _header_only(gguf, path: Path, architecture: str, **keys: int) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in keys.items():
        writer.add_uint32(key.replace("_", "."), value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _refused(capsys, path: Path, tmp_path: Path, *phrases: str) -> None:
    code, _, err = run_cli(capsys, "extract", str(path), "--out", str(tmp_path / "out"), "--no-progress")
    assert_one_line_error(code, err, str(path), *phrases)
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused_in_one_line(gguf, tmp_path, capsys, no_conversion):
    garbage = tmp_path / "model.Q4_1.gguf"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _refused(capsys, garbage, tmp_path, "is not a GGUF file", "give a .gguf file")
    empty = tmp_path / "empty.gguf"
    empty.touch()
    _refused(capsys, empty, tmp_path, "is not a GGUF file")
    text = tmp_path / "weights.bin"  # neither named .gguf nor GGUF inside: neither a model directory nor GGUF
    text.write_text("not a model")
    _refused(capsys, text, tmp_path, "neither a Hugging Face model directory", "nor a GGUF file")


def test_an_architecture_transformers_cannot_read_from_gguf_is_refused_naming_those_it_can(gguf, tmp_path, capsys, no_conversion):
    path = _header_only(gguf, tmp_path / "rwkv.gguf", "rwkv6")
    _refused(capsys, path, tmp_path, "architecture 'rwkv6'", "transformers cannot read from GGUF", "llama", "qwen2")
    with pytest.raises(UnsupportedModel) as refused:
        check_gguf(path, "rwkv.gguf")
    assert "general" not in str(refused.value).split("reads ", 1)[1].split(")")[0].split(", ")
    sinks = _header_only(gguf, tmp_path / "gpt-oss.gguf", "gpt-oss")
    _refused(capsys, sinks, tmp_path, "gpt_oss", "attention sinks")


def test_a_gguf_file_cut_short_or_split_in_parts_is_refused_in_one_line(gguf, llama_gguf, tmp_path, capsys, no_conversion):
    whole = llama_gguf[0].read_bytes()
    for name, length, phrase in (
        ("data.gguf", len(whole) - 100, "is cut short: it holds"),
        ("header.gguf", 300, "cut short or damaged"),
    ):
        (tmp_path / name).write_bytes(whole[:length])
        _refused(capsys, tmp_path / name, tmp_path, phrase, "download or write it again")
    split = _header_only(gguf, tmp_path / "model-00001-of-00002.gguf", "llama", split_count=2)
    _refused(capsys, split, tmp_path, "split into 2 files", "--merge")
    with pytest.raises(BadInput):
        check_gguf(tmp_path / "data.gguf", "data.gguf")


# ---------------------------------------------------------------------------- the report


@pytest.mark.slow
@pytest.mark.integration
def test_the_quick_report_runs_on_a_gguf_file(llama_gguf, tmp_path, monkeypatch, capsys):
    """``attnlens report --quick --model FILE.gguf`` on the tiny Llama, at the zoo's smallest sizes for every stage."""
    from attnlens.report.presets import PRESETS
    from zoo import blank_figure, tiny_report

    path, _ = llama_gguf
    monkeypatch.setitem(PRESETS, ("probe", "quick"), tiny_report())
    monkeypatch.setattr("attnlens.io.result_figures.save_figure", blank_figure)  # the figures' drawing is not what is tested
    out = tmp_path / "report"
    code, _, err = run_cli(capsys, "report", "--quick", "--model", str(path), "--out", str(out), "--no-progress")
    assert code == 0, err
    report = attnlens.load_result(out)
    assert report.meta["model"]["converted_from"]["file"] == str(path.resolve())
    assert len(report.claims) and (out / "report.html").is_file()
