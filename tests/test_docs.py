"""Every code block of README.md and docs/*.md runs, on small settings.

Blocks are found by their fences and run in document order, one temporary directory per file,
so later blocks read what earlier ones wrote:

- a ``python`` block is executed; a file's blocks share one namespace, and the calls of
  ``SMALL_CALLS`` run on small settings (``attnlens`` is :class:`SmallAttnlens` in there);
- a block of command lines (no language, ``console``, ``sh``, ``bash``, ``shell``) has each
  ``attnlens`` line run in-process (:func:`tiny_models.run_cli`) with ``SMALL`` options appended
  per command (the last of a repeated option wins); ``torchrun --standalone`` lines of the
  commands that split work over ranks run as real jobs of at most 2 ranks; the tour's
  ``attnlens report --quick`` line reuses the ``quick_report`` fixture.

A block that cannot run here says why in an HTML comment on the line just above it,
``<!-- not run: REASON -->``. The fast tests check that every other block is one of the above,
that each command line parses with the real command line and that each Python block compiles;
the slow ones run them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import attnlens
from tiny_models import README, readme_tour, run_cli

ROOT = README.parent
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

COMMAND_LANGUAGES = {"", "console", "sh", "bash", "shell"}
PYTHON_LANGUAGES = {"python", "py"}
NOT_RUN = re.compile(r"<!--\s*not run:(.*?)-->")
SHELL_OPERATORS = {"&&", "||", "|", ";", "&", ">", ">>", "<", "2>"}
# Commands that split their work over torchrun's ranks (the others refuse to start under it).
DISTRIBUTED_COMMANDS = {"extract", "moments"}

# Appended to a command line, after its own options (the last of a repeated option wins): the same
# commands on settings small enough for a test. Not appended when SOURCE is a path (a store, moments),
# whose n the command takes from what it reads.
SMALL = {
    command: options.split()
    for command, options in {
        "extract": "--seq-len 32 --num-seqs 8",
        "moments": "--seq-len 32 --num-seqs 8 --batch-size 2",
        "eigen": "--seq-len 32 --num-seqs 16",
        "reconstruct": "--seq-len 32 --num-seqs 16",
        "importance": "--seq-len 32 --num-seqs 4 --bootstrap 100",
        "sinks": "--seq-len 32 --num-seqs 4 --min-keys 8 --bootstrap 100",
        "dam": "--seq-len 16 --steps 3 --stop-window 2 --train-seqs 4 --eval-seqs 4 --bootstrap 100 --check-window 2 "
        "--reference-rounds 2 --polish-rounds 2",
        "plan": "--seq-len 16 --fit-seqs 24 --curve-seqs 4 --select-seqs 4 --eval-seqs 4 --ks 2,4 --widths 1,4 --bootstrap 100",
    }.items()
}
SMALL_TASK = "--task-train 64 --task-eval 32 --finetune-steps 2".split()  # appended with --task
# On 32 examples one lost example forecasts 34 points (docs/plan.md): a plan's accuracy budgets become 50 points.
SMALL_BUDGETS = {"--max-drop": "50"}
# The same for the Python blocks' calls: keyword changes on top of what the block passes.
SMALL_CALLS = {
    "extract": {"seq_len": 32, "num_seqs": 8},
    "eigen": {"seq_len": 32, "num_seqs": 16},
    "reconstruct": {"seq_len": 32, "num_seqs": 16},
    "importance": {"seq_len": 32, "num_seqs": 4, "bootstrap": 100, "task_train": 64, "task_eval": 32},
    "dam": {
        "seq_len": 16, "steps": 3, "stop_window": 2, "train_seqs": 4, "eval_seqs": 4, "bootstrap": 100, "check_window": 2,
        "polish_rounds": 2,
    },
    "plan": {"seq_len": 16, "fit_seqs": 24, "curve_seqs": 4, "select_seqs": 4, "eval_seqs": 4, "ks": [2, 4], "widths": [1, 4], "bootstrap": 100},
}  # fmt: skip

# What a file's Python blocks leave behind: the blocks ran, on the small settings above.
LEFT_BEHIND = {
    "README.md": lambda names: (
        isinstance(names["masks"], attnlens.DamResult) and names["spectra"].meta["settings"]["seq_len"] == 32
    ),
    "cli.md": lambda names: names["store"].n == 32,
}


class SmallAttnlens:
    """``attnlens`` for the Python blocks: its entry points run on small settings, the rest is attnlens."""

    def __getattr__(self, name: str):
        real = getattr(attnlens, name)
        if name not in SMALL_CALLS:
            return real
        return lambda *args, **kwargs: real(*args, **{**kwargs, **SMALL_CALLS[name], "progress": False})


# ---------------------------------------------------------------------- finding and classifying blocks


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text, and why it is not run (if it says)."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def code_blocks(text: str, path: Path = README) -> list[Block]:
    """Every fenced block of a Markdown text, in order, with the ``not run`` reason from the HTML
    comment lines just above its opening fence."""
    lines = text.splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = re.match(r"^( {0,3})(`{3,}|~{3,})\s*([^\s`]*)", lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, language = opening.groups()
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[index + 1 : end]]
        reasons, above = [], index - 1
        while above >= 0 and re.fullmatch(r"\s*<!--.*-->\s*", lines[above]):
            reasons += [match.strip() for match in NOT_RUN.findall(lines[above])]
            above -= 1
        not_run = reasons[0] if reasons else None
        blocks.append(Block(path, index + 1, language.lower(), "\n".join(body) + "\n", not_run))
        index = end + 1
    return blocks


def blocks_of(path: Path) -> list[Block]:
    return code_blocks(path.read_text(), path)


@dataclass(frozen=True)
class Line:
    """One runnable command line: ``attnlens ARGS`` (or the tour's report), or ``torchrun LAUNCH -m attnlens ARGS``."""

    kind: str  # "attnlens", "report" or "torchrun"
    args: tuple[str, ...]  # after "attnlens"
    launch: tuple[str, ...] = ()  # torchrun's own options

    @property
    def text(self) -> str:
        return shlex.join(["attnlens", *self.args])


def command_lines(block: Block) -> list[list[str]]:
    """The block's logical lines (backslash continuations joined) as shell words, comments dropped."""
    text = block.text.replace("\\\n", " ")
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


def as_runnable(words: list[str]) -> Line | str:
    """A command line as a :class:`Line`, or the reason a test cannot run it."""
    if SHELL_OPERATORS & set(words):
        return "a shell pipeline, not one command"
    if words[0] == "attnlens":
        args = tuple(words[1:])
        if args and args[0] == "report":
            tour = next(line for line in readme_tour() if line[0] == "report")
            return Line("report", args) if list(args) == tour else f"a report other than the tour's `attnlens {shlex.join(tour)}`"
        return Line("attnlens", args)
    if words[0] == "torchrun":
        if "-m" not in words or words[words.index("-m") + 1 : words.index("-m") + 2] != ["attnlens"]:
            return "torchrun of something other than `-m attnlens`"
        at = words.index("-m")
        launch, args = tuple(words[1:at]), tuple(words[at + 2 :])
        if "--standalone" not in launch or any(option.startswith(("--nnodes", "--rdzv")) for option in launch):
            return "torchrun across machines (only --standalone jobs run here)"
        ranks = launch[launch.index("--nproc-per-node") + 1] if "--nproc-per-node" in launch else "1"
        if not ranks.isdigit() or int(ranks) > 2:
            return f"torchrun with {ranks} ranks (at most 2 run here)"
        if not args or args[0] not in DISTRIBUTED_COMMANDS:
            return f"torchrun of a command that does not split its work ({', '.join(sorted(DISTRIBUTED_COMMANDS))} do)"
        return Line("torchrun", args, launch)
    return f"not an attnlens command: {words[0]}"


def plan(block: Block) -> tuple[str, list[Line]] | str:
    """How a block runs: ("skip", []), ("python", []) or ("commands", lines); or why it cannot run."""
    if block.not_run is not None:
        return ("skip", []) if block.not_run else "its <!-- not run: --> comment gives no reason"
    if block.language in PYTHON_LANGUAGES:
        return "python", []
    if block.language not in COMMAND_LANGUAGES:
        return f"a ```{block.language} block: neither Python nor command lines"
    lines = []
    for words in command_lines(block):
        line = as_runnable(words)
        if isinstance(line, str):
            return f"{shlex.join(words)[:80]}: {line}"
        lines.append(line)
    return ("commands", lines) if lines else "a command block without commands"


def cli_command(name: str):
    """The click command behind ``attnlens NAME`` (None for an unknown one)."""
    import typer

    from attnlens.cli import app

    return typer.main.get_command(app).commands.get(name)


def small_options(args: tuple[str, ...]) -> list[str]:
    """What the test appends to ``attnlens ARGS``: small settings, no progress bar, and no figures
    unless the line asks for them (figures are drawn and tested elsewhere; here they would be most
    of a small command's time)."""
    params = cli_command(args[0]).params
    options = {name for param in params for name in [*param.opts, *getattr(param, "secondary_opts", [])]}
    source_is_a_path = len(args) > 1 and not args[1].startswith("-") and Path(args[1]).exists()
    small = [] if source_is_a_path else list(SMALL.get(args[0], []))
    if "--task" in args:  # the task's options this command has
        small += [
            part for option, value in zip(SMALL_TASK[::2], SMALL_TASK[1::2]) if option in options for part in (option, value)
        ]
    small += [part for option, value in SMALL_BUDGETS.items() if option in args for part in (option, value)]
    quiet = [flag for flag in ("--no-progress", "--no-figures") if flag in options and flag.replace("no-", "") not in args]
    return small + quiet


# ---------------------------------------------------------------------- fast: every block can run, or says why not


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_every_block_runs_or_says_why_not(path):
    problems = [f"{block.where}: {how}" for block in blocks_of(path) if isinstance(how := plan(block), str)]
    assert not problems, (
        "blocks the docs test cannot run; make them runnable, or mark them <!-- not run: REASON --> "
        "on the line just above the fence:\n" + "\n".join(problems)
    )
    markers = [line for line in path.read_text().splitlines() if line.strip().startswith("<!--") and NOT_RUN.search(line)]
    marked = sum(block.not_run is not None for block in blocks_of(path))
    assert len(markers) == marked, "a not-run comment is not just above a block"


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_every_command_line_parses_and_every_python_block_compiles(path):
    import typer

    for block in blocks_of(path):
        how = plan(block)
        if how == ("python", []):
            compile(block.text, block.where, "exec")
            imported = re.findall(r"^from attnlens import (.*)$", block.text, flags=re.M)
            small = {name.strip() for names in imported for name in names.split(",")} & set(SMALL_CALLS)
            assert not small, f"{block.where}: call attnlens.{small.pop()}(...), which the test runs on small settings"
        elif isinstance(how, tuple) and how[0] == "commands":
            for line in how[1]:
                command = cli_command(line.args[0]) if line.args else None
                assert command is not None, f"{block.where}: {line.text}: no such command"
                try:
                    command.make_context(line.args[0], list(line.args[1:]))
                except typer.TyperException as error:  # click's usage errors, as vendored by typer
                    pytest.fail(f"{block.where}: {line.text}: {error.format_message()}")


def _anchors(markdown: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^(```|~~~).*?^\1", "", markdown.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_links_stay_in_the_repository_and_resolve(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"https?://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.is_relative_to(ROOT) and linked.exists(), f"{path.name}: link {target} leads nowhere in the repository"
        assert not anchor or anchor in _anchors(linked), f"{path.name}: link {target}: no such heading"


def test_blocks_are_classified_as_the_docs_say():
    text = "\n".join(
        [
            "```python",
            "x = 1",
            "```",
            "```",
            "attnlens models   # a comment",
            "attnlens extract --out runs/s \\",
            "    --num-seqs 8",
            "torchrun --standalone --nproc-per-node 2 -m attnlens moments minilm-l6 --out runs/m",
            "```",
            "<!-- not run: installs packages -->",
            "```sh",
            "pip install attnlens",
            "```",
            "```sh",
            "pip install attnlens",
            "```",
            "```console",
            "torchrun --nnodes 4 --nproc-per-node 8 -m attnlens moments m --out o",
            "```",
            "```",
            "torchrun --standalone --nproc-per-node 2 -m attnlens eigen m --out o",
            "```",
            "```text",
            "a listing",
            "```",
            "<!-- not run: -->",
            "```",
            "attnlens models",
            "```",
            "```",
            "attnlens report --out report",
            "```",
        ]
    )
    plans = [plan(block) for block in code_blocks(text)]
    assert plans[0] == ("python", [])
    assert plans[1] == (
        "commands",
        [
            Line("attnlens", ("models",)),
            Line("attnlens", ("extract", "--out", "runs/s", "--num-seqs", "8")),
            Line("torchrun", ("moments", "minilm-l6", "--out", "runs/m"), ("--standalone", "--nproc-per-node", "2")),
        ],
    )
    assert plans[2] == ("skip", [])
    assert "not an attnlens command: pip" in plans[3], "an unmarked block that cannot run is reported"
    assert "across machines" in plans[4]
    assert "does not split its work" in plans[5]
    assert "```text" in plans[6]
    assert "gives no reason" in plans[7]
    assert "a report other than the tour's" in plans[8]


# ---------------------------------------------------------------------- slow: run them


def _runs_something(path: Path) -> bool:
    return any(isinstance(how := plan(block), tuple) and how[0] != "skip" for block in blocks_of(path))


RUNNABLE = [path for path in DOCS if _runs_something(path)]

# Launched ranks import the attnlens of this repository first.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def run_line(line: Line, block: Block, capsys, request) -> None:
    if line.kind == "report":  # the tour's line, as the quick_report fixture ran it: reuse its output
        shutil.copytree(request.getfixturevalue("quick_report"), line.args[line.args.index("--out") + 1])
        return
    argv = [*line.args, *small_options(line.args)]
    if line.kind == "attnlens":
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, f"{block.where}: {line.text}: {err}"
        return
    command = [sys.executable, "-m", "torch.distributed.run", *line.launch, "-m", "attnlens", *argv]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == 0, f"{block.where}: torchrun {line.text}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"


@pytest.mark.slow  # many commands, torchrun jobs, and the README's report line needs the quick report
@pytest.mark.integration  # runs real models by name
@pytest.mark.parametrize("path", RUNNABLE, ids=[path.name for path in RUNNABLE])
def test_code_blocks_run_as_written(path, capsys, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks_of(path):
        how = plan(block)
        assert not isinstance(how, str), f"{block.where}: {how}"
        how, lines = how
        if how == "python":
            code = re.sub(r"^import attnlens$", "", block.text, flags=re.M)  # the blocks' attnlens is the small one
            namespace["attnlens"] = SmallAttnlens()
            exec(compile(code, block.where, "exec"), namespace)  # noqa: S102 - the documentation's own code
        for line in lines:
            run_line(line, block, capsys, request)
    assert LEFT_BEHIND.get(path.name, lambda names: True)(namespace), "the Python blocks did not leave what they should"
