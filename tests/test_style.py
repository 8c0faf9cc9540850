"""The code passes the lint and format settings in pyproject.toml (ruff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    pytest.importorskip("ruff", reason="ruff is in the test extra")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "attnlens", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
