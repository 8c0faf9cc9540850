"""A GGUF file dequantized once by transformers and kept as float32 safetensors.

transformers reads a GGUF file's metadata three times (for the config, the tokenizer and the
weights), each time through gguf's reader, which parses it out of a memory map one small slice at
a time: for Gemma 3's 262,144-token vocabulary that is millions of numpy memmap views a read, about
15 s each on 2 cores. Here the file is read into memory once and that one reader serves all three
reads: the same bytes, so the same model, in a third of the time.

>>> import inspect
>>> "save_pretrained" in inspect.getsource(convert_gguf)
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from unittest import mock

import numpy as np
import torch


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Write the model and tokenizer of ``gguf_file`` into ``target`` with ``save_pretrained``,
    the weights dequantized to float32 (saving them is exact)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_reader_in_memory():
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    # transformers refuses to serialize a model it still marks as GGUF-quantized
    # torch types nn.Module.__setattr__'s value as Tensor | Module; it takes any value, as transformers' own code does
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


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
