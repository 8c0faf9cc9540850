"""The README's own code runs: the tour's command lines and every Python snippet, on small
settings, and its claims section is what the generator writes from a saved report."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

import attnlens
from tiny_models import README, readme_python_blocks, readme_tour, run_cli

# Appended to a tour line of the command, after the line's own options (the last of a
# repeated option wins): the same commands, on settings small enough for a test.
SMALL = {
    "extract": ["--seq-len", "32", "--num-seqs", "8"],
    "eigen": ["--seq-len", "32", "--num-seqs", "16"],
    "reconstruct": ["--seq-len", "32", "--num-seqs", "16"],
    "importance": ["--seq-len", "32", "--num-seqs", "4"],
    "dam": ["--seq-len", "32", "--steps", "3", "--stop-window", "2", "--train-seqs", "4", "--eval-seqs", "4"],
}
# The same for the snippets' calls: keyword changes on top of what the snippet passes.
SMALL_CALLS = {
    "eigen": {"seq_len": 32, "num_seqs": 16},
    "reconstruct": {"seq_len": 32, "num_seqs": 16},
    "importance": {"seq_len": 32, "num_seqs": 4, "task_train": 64, "task_eval": 32},
    "dam": {"seq_len": 32, "steps": 3, "stop_window": 2, "train_seqs": 4, "eval_seqs": 4},
}


class SmallAttnlens:
    """``attnlens`` for the snippets: its entry points run on small settings, the rest is attnlens."""

    def __getattr__(self, name: str):
        real = getattr(attnlens, name)
        if name not in SMALL_CALLS:
            return real
        return lambda *args, **kwargs: real(*args, **{**kwargs, **SMALL_CALLS[name], "progress": False})


def _source_is_a_path(line: list[str]) -> bool:
    return len(line) > 1 and not line[1].startswith("-") and Path(line[1]).exists()


@pytest.mark.slow
def test_tour_and_snippets_run_as_written(capsys, tmp_path, monkeypatch, quick_report):
    monkeypatch.chdir(tmp_path)
    tour = readme_tour()
    for line in tour:
        if line[0] == "report":  # run as written by the quick_report fixture: reuse its output
            shutil.copytree(quick_report, line[line.index("--out") + 1])
            continue
        small = SMALL.get(line[0], []) if not _source_is_a_path(line) else []
        code, out, err = run_cli(capsys, *line, *small, *(["--no-progress"] if line[0] in SMALL else []))
        assert code == 0, f"attnlens {' '.join(line)}: {err}"
    assert {line[0] for line in tour} >= {"report", "models", "extract", "eigen", "overlap", "reconstruct", "importance", "dam"}
    namespace = {}
    for block in readme_python_blocks():
        code = re.sub(r"^import attnlens$", "", block, flags=re.M)  # the snippets' attnlens is the small one
        namespace["attnlens"] = SmallAttnlens()
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    assert isinstance(namespace["masks"], attnlens.DamResult) and namespace["store"].n == 32


def _generator():
    spec = importlib.util.spec_from_file_location("readme_claims", README.parent / "scripts" / "readme_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_claims_section_is_what_the_generator_writes_from_a_saved_report(tmp_path, quick_report):
    generator = _generator()
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    section = generator.update(quick_report, readme, figure=tmp_path / "overlap.png")
    text = readme.read_text()
    assert section in text and text.count(generator.BEGIN) == 1
    before, after = README.read_text().split(generator.BEGIN)[0], README.read_text().split(generator.END)[1]
    assert text.startswith(before) and text.endswith(after), "only the claims section changes"
    report = attnlens.load_result(quick_report)
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(report.claims)
    for line, (_, claim) in zip(rows, report.claims.iterrows()):
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert cells == list(claim), "each cell exactly as the report prints it"
    assert (tmp_path / "overlap.png").read_bytes() == quick_report.joinpath(*generator.FIGURE).read_bytes()


def test_the_readme_claims_section_is_untouched_generator_output():
    generator = _generator()
    text = README.read_text()
    section = text[text.index(generator.BEGIN) : text.index(generator.END)]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    (stated,) = re.findall(r"<!-- claims digest ([0-9a-f]{16}) -->", section)
    assert stated == generator.digest(table), "edit the report and rerun scripts/readme_claims.py, not the table"
    assert table.splitlines()[0] == "| " + " | ".join(generator.COLUMNS) + " |"


def test_the_generator_refuses_what_is_not_a_default_report(tmp_path, capsys):
    generator = _generator()
    assert generator.main([str(tmp_path)]) == 2
    assert "not a report directory" in capsys.readouterr().err
