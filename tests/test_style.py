"""The code passes the lint and format settings in pyproject.toml (ruff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import import_or_skip

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    import_or_skip("ruff", "ruff is in the test extra")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "attnlens", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
