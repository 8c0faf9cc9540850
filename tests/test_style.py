"""The code passes the lint and format settings in pyproject.toml (ruff)."""

from __future__ import annotations

import ast
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


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_body_is_longer_than_100_lines():
    """A long function holds several steps: name them. The body is counted from its first
    statement, so a command's typer option declarations (its signature) do not count."""
    long = [
        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.body[0].lineno + 1} lines)"
        for path in sorted((ROOT / "attnlens").rglob("*.py"))
        for node in _functions(path)
        if node.end_lineno - node.body[0].lineno + 1 > 100
    ]
    assert not long, long


def test_dam_reads_as_a_short_sequence_of_steps():
    (run,) = [node for node in _functions(ROOT / "attnlens/analysis/dam/run.py") if node.name == "dam"]
    assert run.end_lineno - run.lineno + 1 <= 80
