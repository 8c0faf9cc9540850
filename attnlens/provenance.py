"""Provenance: what every result records about how it was made."""

from __future__ import annotations

import datetime
import platform
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
    ['attnlens', 'numpy', 'python', 'scipy', 'torch', 'transformers']
    """
    return {
        "attnlens": package_version("attnlens"),
        "python": platform.python_version(),
        **{name: package_version(name) for name in ("torch", "transformers", "numpy", "scipy")},
    }


def command_line() -> str:
    """The command that is running, as the user typed it (for the CLI) or ``sys.argv``."""
    program = sys.argv[0].rsplit("/", 1)[-1] if sys.argv else "python"
    if program in ("attnlens", "__main__.py"):
        program = "attnlens"
    return " ".join([program, *sys.argv[1:]])


def provenance(command: str | None = None) -> dict[str, object]:
    """The ``created``, ``command`` and ``versions`` fields of a manifest."""
    return {
        "attnlens_version": package_version("attnlens"),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or command_line(),
        "versions": versions(),
    }
