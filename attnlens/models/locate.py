"""Where a model name leads: an offline alias, a local model directory, a GGUF file (converted once into the
cache), or a Hugging Face Hub id (cached, or downloadable from here), found without loading anything, so that a
bad name fails in seconds."""

from __future__ import annotations

import re
from pathlib import Path

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models.aliases import ALIASES, cached_conversion, install_hint, missing_distributions
from attnlens.models.gguf import check_gguf, convert_gguf, is_gguf


class ModelNotFound(BadInput):
    """A model name that names nothing here: no local directory, no alias, no Hub id that can be
    downloaded. ``reason`` says so of the name (``"does not exist"``), so that a caller whose
    source may be something else too (a store, moments: :func:`attnlens.rows.sources.open_rows`)
    can say what it was given and name everything it takes."""

    def __init__(self, message: str, reason: str = "names no model") -> None:
        super().__init__(message)
        self.reason = reason


def locate_model(name: str) -> str:
    """Where the model ``name`` (alias, local directory, GGUF file or Hub id) loads from, without loading it.

    A GGUF file (:func:`attnlens.models.gguf.is_gguf`) is checked from its header
    (:func:`attnlens.models.gguf.check_gguf`), then converted once into the cache, and loads from there.

    Raises :class:`ModelNotFound` (a :class:`BadInput`) when the name names nothing here (a path
    that does not exist, a Hub id neither cached nor reachable), :class:`BadInput` for a path
    that is neither a model directory nor a GGUF file transformers can read, and :class:`UnsupportedModel`
    for an alias whose package is not installed or a GGUF file of an architecture transformers does not
    read; each message says what to do.

    >>> locate_model("./no/such/model")
    Traceback (most recent call last):
        ...
    attnlens.models.locate.ModelNotFound: model path './no/such/model' does not exist; give an existing directory, a Hub id, or an alias (minilm-l6, minilm-l3, gemma3-270m)
    """
    if name in ALIASES:
        alias = ALIASES[name]
        missing = missing_distributions(alias)
        if missing:
            raise UnsupportedModel(
                f"model '{name}' needs {', '.join(missing)}, which is not installed; install it with: {install_hint(alias)}"
            )
        return str(alias.locate())
    path = Path(name).expanduser()
    if path.exists():
        if is_gguf(path):
            return str(_gguf_model_dir(path, name))
        if not (path / "config.json").is_file():
            raise BadInput(
                f"'{name}' is a path but neither a Hugging Face model directory (no config.json in it) nor a GGUF file "
                "(.gguf); give one of those, a Hub id or an alias"
            )
        return str(path)
    if name.count("/") > 1 or name.startswith((".", "~")) or name.endswith("/"):
        raise ModelNotFound(
            f"model path '{name}' does not exist; give an existing directory, a Hub id, or an alias ({', '.join(ALIASES)})",
            reason="does not exist",
        )
    if not _in_hub_cache(name) and not _hub_reachable():
        raise ModelNotFound(
            f"cannot load model '{name}': it is not an alias ({', '.join(ALIASES)}) or a local model directory, "
            "and the Hugging Face Hub cannot be reached from here to download it",
            reason="is neither a local directory nor a model alias, and the Hugging Face Hub cannot be reached from here "
            "to download it",
        )
    return name


def _gguf_model_dir(path: Path, name: str) -> Path:
    """The directory GGUF file ``path`` (given as ``name``) loads from: checked from its header first, so that a
    file transformers cannot read fails in a second, then converted once (``gguf-STEM-KEY`` in the cache)."""
    check_gguf(path, name)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem)[:80] or "model"  # a directory name, whatever the file's
    try:
        return cached_conversion(f"gguf-{stem}", path, convert_gguf)
    except (ValueError, KeyError, NotImplementedError, OSError) as error:
        # what transformers raises on a file the header check passed but it cannot convert after all
        # (a tokenizer of a kind it does not build, a tensor it cannot place), and a cache it cannot write
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UnsupportedModel(
            f"cannot convert GGUF file '{name}' ({reason[:200]}); give the model's Hugging Face directory or Hub id instead"
        ) from None


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub answers at all; without this check an offline machine retries for half a minute."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
