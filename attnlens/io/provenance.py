"""Provenance: what every result records about how it was made."""

from __future__ import annotations

import datetime
import platform
import shlex
import sys
from importlib.metadata import PackageNotFoundError, version


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of Python and of the packages that decide the numbers.

    >>> sorted(versions())
    ['attnlens', 'numpy', 'python', 'torch', 'transformers']
    """
    return {
        "attnlens": package_version("attnlens"),
        "python": platform.python_version(),
        **{name: package_version(name) for name in ("torch", "transformers", "numpy")},
    }


_cli_command: str | None = None


def set_cli_command(arguments: list[str]) -> None:
    """Record the ``attnlens`` command being run, for the provenance of what it writes."""
    global _cli_command
    _cli_command = shlex.join(["attnlens", *arguments])


def command_line() -> str:
    """The attnlens command that is running (set by the CLI), else the Python command line."""
    if _cli_command is not None:
        return _cli_command
    return shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]) if sys.argv else "python"


def provenance(command: str | None = None) -> dict[str, object]:
    """The ``created``, ``command`` and ``versions`` fields of a manifest."""
    return {
        "attnlens_version": package_version("attnlens"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command or command_line(),
        "versions": versions(),
    }


def result_meta(*, model: dict, corpus: dict, settings: dict, command: str | None = None, **extra: object) -> dict[str, object]:
    """The ``meta`` of a result made from one model and one corpus: the model and corpus as they
    describe themselves, the settings (with the corpus by name), what else the analysis records
    (``extra``), and :func:`provenance`.

    >>> meta = result_meta(model={"name": "m"}, corpus={"source": "kjv"}, settings={"seed": 0}, n=16)
    >>> meta["settings"], meta["n"], sorted(meta)[:3]
    ({'seed': 0, 'corpus': 'kjv'}, 16, ['attnlens_version', 'command', 'corpus'])
    """
    return {
        "model": model,
        "corpus": corpus,
        "settings": {**settings, "corpus": corpus.get("source")},
        **extra,
        **provenance(command),
    }
