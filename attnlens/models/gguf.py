"""GGUF files: checked from their header in a moment, then dequantized once by transformers and kept as
float32 safetensors.

A GGUF file (llama.cpp's and Ollama's format) is given as a model by its path; :func:`check_gguf` reads
its header (not its vocabulary, not its tensors) and refuses, in one line, a file transformers cannot read:
not GGUF, cut short, split in parts, or of an architecture transformers does not read from GGUF. Only then
does :func:`convert_gguf` run, once per file (:func:`attnlens.models.aliases.cached_conversion`).

transformers reads a GGUF file's metadata three times (for the config, the tokenizer and the
weights), each time through gguf's reader, which parses it out of a memory map one small slice at
a time: for Gemma 3's 262,144-token vocabulary that is millions of numpy memmap views a read, about
15 s each on 2 cores. Here the file is read into memory once and that one reader serves all three
reads: the same bytes, so the same model, in a third of the time. The check cannot use that reader:
it parses the whole vocabulary before it answers (20 s for Gemma 3's), so the check walks the header
itself, stepping over the arrays.

>>> import inspect
>>> "save_pretrained" in inspect.getsource(convert_gguf)
True
>>> check_gguf(Path(__file__), "gguf.py")
Traceback (most recent call last):
    ...
attnlens.errors.BadInput: 'gguf.py' is not a GGUF file (it does not start with the GGUF magic bytes); give a .gguf file written by llama.cpp or gguf, a model directory, a Hub id or an alias
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from unittest import mock

import numpy as np
import torch

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models.probe import SUPPORTED_HINT, UNSUPPORTED_ATTENTION

if TYPE_CHECKING:  # transformers is imported when a model converts, not with attnlens
    from transformers import PretrainedConfig

MAGIC = b"GGUF"
SUFFIX = ".gguf"
# what converting a GGUF file needs besides transformers (transformers refuses a GGUF without accelerate)
PACKAGES = ("gguf", "accelerate")

# llama.cpp's names for the architectures transformers spells otherwise; transformers renames them as it
# reads a file (``load_gguf_checkpoint``), and its tables of supported architectures use its own names
TRANSFORMERS_NAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}
# transformers' tables of the architectures it reads from GGUF (module, name): the keys of its config table
# (which also holds two sections of every file's metadata, ``general`` and ``tokenizer``), and in newer
# versions those of its second reader
_TRANSFORMERS_TABLES = (
    ("transformers.modeling_gguf_pytorch_utils", "GGUF_SUPPORTED_ARCHITECTURES"),
    ("transformers.integrations.gguf", "GGUF_CONFIG_ARCHS"),
)
# The header's value types (``gguf.GGUFValueType``) of fixed width, as struct formats; 8 is a string
# and 9 an array, the two of variable length.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file meant as GGUF: named ``.gguf``, or starting with GGUF's magic bytes
    (Ollama keeps its models as GGUF files named by their hash)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == SUFFIX:
        return True
    with path.open("rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


def supported_architectures() -> frozenset[str]:
    """The ``general.architecture`` values transformers reads from GGUF, from its own tables (in
    transformers' spelling; :data:`TRANSFORMERS_NAMES` maps llama.cpp's)."""
    names: set[str] = set()
    for module, table in _TRANSFORMERS_TABLES:
        with contextlib.suppress(ImportError, AttributeError):  # a table this transformers does not have
            names |= set(getattr(importlib.import_module(module), table))
    return frozenset(names - {"general", "tokenizer"})


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says: its scalar and string metadata (arrays, the vocabulary above all,
    are stepped over) and how many bytes the file needs to hold every tensor it lists."""

    metadata: dict[str, int | float | str]  # an array's value is its length
    needed_bytes: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def family(self) -> str:
        """The architecture in transformers' spelling (its config's ``model_type``, give or take a suffix)."""
        return TRANSFORMERS_NAMES.get(self.architecture, self.architecture)


def check_gguf(path: Path, shown: str) -> GgufHeader:
    """The header of GGUF file ``path``, once it shows a file that transformers can read and attnlens capture.

    Raises :class:`BadInput` for a file that is not GGUF, is cut short or damaged, or is one part of a split
    model, and :class:`UnsupportedModel` for a missing package or an architecture transformers does not
    read from GGUF (or whose attention attnlens cannot capture); each message names the file as ``shown``
    and says what to do. Reads the header only: a second even for a file of many gigabytes.
    """
    missing = [package for package in PACKAGES if importlib.util.find_spec(package) is None]
    if missing:
        raise UnsupportedModel(
            f"GGUF file '{shown}' needs {' and '.join(missing)} (not installed); install with: pip install {' '.join(missing)}"
        )
    header = _read_header(path, shown)
    parts = int(header.metadata.get("split.count", 1))
    if parts > 1:
        raise BadInput(
            f"'{shown}' is one part of a GGUF model split into {parts} files; merge them into one with "
            "llama.cpp's llama-gguf-split --merge and give that file"
        )
    supported = supported_architectures()
    if header.architecture not in supported and header.family not in supported:
        raise UnsupportedModel(
            f"GGUF file '{shown}' holds architecture '{header.architecture or '(none)'}', which transformers cannot read "
            f"from GGUF (it reads {', '.join(sorted(supported))}); give the model's Hugging Face directory or Hub id instead"
        )
    if header.family in UNSUPPORTED_ATTENTION:
        raise UnsupportedModel(
            f"GGUF file '{shown}' holds a {header.family} model, which uses {UNSUPPORTED_ATTENTION[header.family]} "
            f"in its attention, which attnlens capture does not support; {SUPPORTED_HINT}"
        )
    size = path.stat().st_size
    if size < header.needed_bytes:
        raise BadInput(
            f"GGUF file '{shown}' is cut short: it holds {size:,} of the {header.needed_bytes:,} bytes its header "
            "lists; download or write it again"
        )
    return header


def _read_header(path: Path, shown: str) -> GgufHeader:
    """Walk the header of ``path``: the magic, the version, every key (arrays stepped over) and the table
    of tensors, whose last byte says how long the file must be."""
    from gguf import GGML_QUANT_SIZES
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    with path.open("rb") as handle:
        if handle.read(len(MAGIC)) != MAGIC:
            raise BadInput(
                f"'{shown}' is not a GGUF file (it does not start with the GGUF magic bytes); give a .gguf file written "
                "by llama.cpp or gguf, a model directory, a Hub id or an alias"
            )
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            try:
                version, tensors, keys = struct.unpack_from("<IQQ", buffer, len(MAGIC))
                if version not in READER_SUPPORTED_VERSIONS:
                    raise BadInput(
                        f"GGUF file '{shown}' is GGUF version {version}, and gguf reads versions "
                        f"{', '.join(map(str, READER_SUPPORTED_VERSIONS))}; convert it again with a current llama.cpp"
                    )
                metadata, offset = _read_metadata(buffer, 24, keys)
                offset, data_bytes = _read_tensor_table(buffer, offset, tensors, GGML_QUANT_SIZES, shown)
            except (struct.error, UnicodeDecodeError, KeyError):  # KeyError: a value of no type GGUF has
                raise BadInput(
                    f"GGUF file '{shown}' is cut short or damaged: its header cannot be read; download or write it again"
                ) from None
    alignment = max(1, int(metadata.get("general.alignment", 32)))  # the tensors' data starts aligned; llama.cpp's default
    return GgufHeader(metadata, -(-offset // alignment) * alignment + data_bytes)


def _read_metadata(buffer: mmap.mmap, offset: int, keys: int) -> tuple[dict[str, int | float | str], int]:
    """The header's ``keys`` values from ``offset`` on (an array is stepped over: only its length is kept)."""
    metadata: dict[str, int | float | str] = {}
    for _ in range(keys):
        key, offset = _read_string(buffer, offset)
        (kind,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if kind == _ARRAY:
            (element, count) = struct.unpack_from("<IQ", buffer, offset)
            offset += 12
            if element in _SCALARS:
                offset += count * struct.calcsize(_SCALARS[element])
            else:  # strings, each of its own length: a vocabulary is walked, not read
                for _ in range(count):
                    offset += 8 + struct.unpack_from("<Q", buffer, offset)[0]
            metadata[key] = count
        elif kind == _STRING:
            metadata[key], offset = _read_string(buffer, offset)
        else:
            (metadata[key],) = struct.unpack_from(_SCALARS[kind], buffer, offset)
            offset += struct.calcsize(_SCALARS[kind])
    return metadata, offset


def _read_tensor_table(buffer: mmap.mmap, offset: int, tensors: int, sizes: dict, shown: str) -> tuple[int, int]:
    """Step over the table of ``tensors`` tensors from ``offset``: where the table ends, and how many bytes
    of data after it the tensors need (``sizes``: gguf's elements and bytes per block of each ggml type)."""
    data_bytes = 0
    for _ in range(tensors):
        _, offset = _read_string(buffer, offset)
        (dims,) = struct.unpack_from("<I", buffer, offset)
        shape = struct.unpack_from(f"<{dims}Q", buffer, offset + 4)
        kind, start = struct.unpack_from("<IQ", buffer, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12
        if kind not in sizes:
            raise UnsupportedModel(
                f"GGUF file '{shown}' holds tensors of ggml type {kind}, which the installed gguf cannot read; "
                "upgrade it with: pip install -U gguf"
            )
        block, block_bytes = sizes[kind]
        data_bytes = max(data_bytes, start + math.prod(shape) // block * block_bytes)
    return offset, data_bytes


def _read_string(buffer: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buffer, offset)
    (raw,) = struct.unpack_from(f"<{length}s", buffer, offset + 8)  # struct.error where the file ends first
    return raw.decode(), offset + 8 + length


# The class a GGUF's model is built with, by the first of transformers' tables (model_type -> class name)
# that holds its family: the decoders, then the encoder-decoders (T5). A config that names its class
# (transformers' reading of a T5 encoder alone) is built as that class.
_MODEL_TABLES = (
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
)


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Write the model and tokenizer of ``gguf_file`` into ``target`` with ``save_pretrained``,
    the weights dequantized to float32 (saving them is exact)."""
    import transformers

    with _one_reader_in_memory(), _no_tensor_bar():
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        config = transformers.AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = getattr(transformers, _model_class(config)).from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
        )
    # transformers refuses to serialize a model it still marks as GGUF-quantized
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _model_class(config: PretrainedConfig) -> str:
    """The transformers class that builds a GGUF's model (:data:`_MODEL_TABLES`); ``AutoModel`` for a family in none."""
    import transformers
    from transformers.models.auto import modeling_auto

    named = [name for name in getattr(config, "architectures", None) or [] if hasattr(transformers, name)]
    if named:
        return named[0]
    for table, auto_class in _MODEL_TABLES:
        if config.model_type in getattr(modeling_auto, table):
            return auto_class
    return "AutoModel"


@contextlib.contextmanager
def _no_tensor_bar() -> Iterator[None]:
    """No progress bar for the tensors: transformers' reader of most architectures draws one with tqdm itself,
    which its switch for progress bars (:func:`attnlens.models.quiet.quiet_transformers`) does not reach."""
    from transformers import modeling_gguf_pytorch_utils as reader

    bar = getattr(reader, "tqdm", None)
    if bar is None:  # a transformers that draws none
        yield
        return
    with mock.patch.object(reader, "tqdm", partial(bar, disable=True)):
        yield


class _WholeFileNumpy:
    """numpy as gguf's reader sees it, except that its memory map is the whole file read into memory:
    slicing a plain array costs a fraction of slicing a ``np.memmap`` subclass."""

    def __getattr__(self, name: str):
        return getattr(np, name)

    @staticmethod
    def memmap(path, mode: str = "r") -> np.ndarray:  # transformers opens its readers read-only ("r")
        return np.fromfile(path, dtype=np.uint8)


@contextlib.contextmanager
def _one_reader_in_memory() -> Iterator[None]:
    """While open, ``gguf.GGUFReader(path)`` parses each file once, from memory, and returns that
    reader again to later calls (transformers imports the name at each call, so patching it reaches them)."""
    import gguf
    import gguf.gguf_reader

    readers: dict[str, gguf.GGUFReader] = {}
    original = gguf.GGUFReader

    def reader(path: str | os.PathLike[str], mode: Literal["r", "r+", "c"] = "r") -> gguf.GGUFReader:
        key = str(Path(path).resolve())
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    with mock.patch.object(gguf.gguf_reader, "np", _WholeFileNumpy()), mock.patch.object(gguf, "GGUFReader", reader):
        yield
