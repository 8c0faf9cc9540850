"""What the command line prints, as a new user meets it: help in groups, whole command summaries,
results through their own text, progress on every command that takes more than a few seconds,
and one line for the inputs a user got wrong."""

from __future__ import annotations

import re

import pytest

import attnlens
from tiny_models import assert_one_line_error, run_cli


def _help(capsys, *command: str) -> str:
    code, out, _ = run_cli(capsys, *command, "--help")
    assert code == 0
    return out


@pytest.mark.integration  # runs a real model by name
def test_command_summaries_are_whole_sentences(capsys):
    """`attnlens --help` lists every command with its whole first sentence, never cut off with '...'."""
    out = _help(capsys)
    from attnlens.cli import app

    for command in app.registered_commands:
        summary = (command.callback.__doc__ or "").strip().splitlines()[0]
        assert " ".join(summary.split()) in " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split()), command.name
    listing = out[out.index("Commands") :]
    assert "..." not in listing, "no summary is cut off"


def test_dam_options_come_in_groups(capsys):
    out = _help(capsys, "dam")
    panels = re.findall(r"╭─ ([^─]+?) ─", out)
    assert panels == [
        "Arguments",
        "Options",
        "Model and corpus",
        "Mask",
        "Analysis",
        "Training",
        "Stopping rule",
        "Task",
        "Output",
    ], panels
    stopping = out[out.index("Stopping rule") : out.index("╭─ Task")]
    assert all(option in stopping for option in ("--stop-window", "--stop-flips", "--stop-plateau", "--stop-margin"))


@pytest.fixture(scope="module")
def two_eigen(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, keep=8, progress=False).save(root / "l6")
    return root


def test_overlap_refuses_the_same_result_twice(capsys, tmp_path, two_eigen):
    path = str(two_eigen / "l6")
    code, _, err = run_cli(capsys, "overlap", path, path, "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, "is given twice", "give each result once")
    assert not (tmp_path / "o").exists()


@pytest.mark.integration  # runs a real model by name
def test_eigen_prints_rounded_numbers(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "eigen", "minilm-l6", "--seq-len", "16", "--num-seqs", "16", "--out", str(tmp_path / "e"), "--no-progress"
    )
    assert code == 0
    numbers = re.findall(r"(?<![\w.])\d+\.\d+", out)
    assert numbers and all(len(number.replace(".", "").lstrip("0")) <= 4 for number in numbers), numbers


@pytest.mark.parametrize(
    "command",
    [
        ["overlap", "{l6}", "--no-figures"],
        ["figures", "{l6}"],
        ["extract", "--seq-len", "16", "--num-seqs", "4"],
    ],
)
@pytest.mark.integration  # runs a real model by name
def test_long_commands_show_progress(capsys, tmp_path, two_eigen, command):
    """Each shows a bar (name, count) on stderr while it works, beside what it prints on stdout."""
    argv = [part.format(l6=two_eigen / "l6") for part in command] + ["--out", str(tmp_path / "out")]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    name = "extract: preparing" if command[0] == "extract" else command[0]
    assert re.search(rf"{re.escape(name)}.*\d+/\d+", err), err


@pytest.mark.integration  # runs a real model by name
def test_dam_prints_what_its_sparsity_columns_mean_and_a_keep_table_without_stray_headers(capsys, tmp_path):
    code, out, _ = run_cli(
        capsys, "dam", "--sparsity", "0.5", "--seq-len", "16", "--train-seqs", "4", "--eval-seqs", "2", "--batch-size", "2",
        "--steps", "4", "--stop-window", "2", "--check-window", "2", "--polish-rounds", "2", "--no-patterns", "--no-progress", "--no-figures", "--out", str(tmp_path / "d"),
    )  # fmt: skip
    assert code == 0
    for column in ("sparsity", "trained_sparsity", "expected_sparsity"):
        assert re.search(rf"^{column}: \S", out, re.M), f"{column} is explained"
    keep = out[out.index("keep-probability σ(α/s) per position class") :].splitlines()
    assert keep[1].split() == ["target", "50%"], "the runs head the table, with no index name or λ value above them"
    assert not any(line.strip() in ("class", "lambda") or line.startswith("lambda") for line in keep[1:8])
    assert "prev = next" in out and "not converged" in out
