"""One way to name a model: every command that runs one takes it as its first argument or as
``--model``, either; two different names are one line of bad input.

The library function behind each command is replaced by a stub that records what it was asked
to run and stops there, so these tests load no model; one real run at the end checks that both
spellings give the same result.
"""

from __future__ import annotations

import pytest

import attnlens
from attnlens.errors import BadInput
from tiny_models import assert_one_line_error, run_cli

# command -> (the library function it calls, as module:name; the options it needs besides --out)
COMMANDS = {
    "eigen": ("attnlens.analysis.eigen:eigen", []),
    "reconstruct": ("attnlens.analysis.reconstruct:reconstruct", []),
    "importance": ("attnlens.analysis.importance:importance", []),
    "dam": ("attnlens.analysis.dam:dam", []),
    "plan": ("attnlens.analysis.plan:plan", ["--max-loss", "0.1"]),
    "extract": ("attnlens.io.extract:extract", []),
    "moments": ("attnlens.rows.jobs:run_moments", []),
    "report": ("attnlens.report.prepare:prepare", []),  # what it checks and sizes first, the model included
}


class Reached(BadInput):
    """What a stub raises: the model it was asked to run (one line on stderr, exit status 2)."""


@pytest.fixture
def stubs(monkeypatch):
    """Every command's library function, replaced by one that says which model reached it."""
    import importlib

    calls = []
    for command, (target, _) in COMMANDS.items():
        module, name = target.split(":")

        def stub(*args, _command=command, **kwargs):
            source = args[0]
            calls.append((_command, source, kwargs.get("model") if _command == "reconstruct" else None))
            raise Reached(f"reached {source}")

        monkeypatch.setattr(importlib.import_module(module), name, stub)
    return calls


def _run(capsys, tmp_path, command, *words):
    return run_cli(capsys, command, *words, "--out", str(tmp_path / command), *COMMANDS[command][1])


@pytest.mark.parametrize("command", COMMANDS)
def test_the_model_is_the_first_argument_or_model_either(command, stubs, tmp_path, capsys):
    for words in (["minilm-l3"], ["--model", "minilm-l3"], ["-m", "minilm-l3"], ["minilm-l3", "--model", "minilm-l3"]):
        assert_one_line_error(*_run(capsys, tmp_path, command, *words)[::2], "reached minilm-l3")
    assert [source for _, source, _ in stubs] == ["minilm-l3"] * 4


@pytest.mark.parametrize("command", COMMANDS)
def test_two_different_models_are_one_line_of_bad_input(command, stubs, tmp_path, capsys):
    code, _, err = _run(capsys, tmp_path, command, "minilm-l3", "--model", "minilm-l6")
    assert_one_line_error(code, err, "'minilm-l3' and --model 'minilm-l6' name different models")
    assert not stubs, "refused before the library was called"


@pytest.mark.parametrize("command", ["importance", "dam", "plan", "extract", "report"])
def test_commands_without_a_source_run_the_default_model(command, stubs, tmp_path, capsys):
    assert_one_line_error(*_run(capsys, tmp_path, command)[::2], "reached minilm-l6")


@pytest.mark.parametrize("command", ["eigen", "reconstruct", "moments"])
def test_commands_with_a_source_need_one(command, stubs, tmp_path, capsys):
    assert_one_line_error(*_run(capsys, tmp_path, command)[::2], "name what to read: SOURCE", "or --model")


def test_with_a_store_as_source_model_is_the_stores_model(stubs, tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")  # what makes a directory a store to the command line
    assert_one_line_error(*_run(capsys, tmp_path, "reconstruct", str(store), "--model", "minilm-l3")[::2], "reached")
    assert stubs == [("reconstruct", str(store), "minilm-l3")]
    assert_one_line_error(*_run(capsys, tmp_path, "eigen", str(store), "--model", "minilm-l3")[::2], "name different models")


@pytest.mark.integration
def test_both_spellings_give_the_same_run(tmp_path, capsys):
    options = ["--seq-len", "16", "--num-seqs", "2", "--no-gradient", "--bootstrap", "50", "--no-figures", "--no-progress"]
    for name, words in (("positional", ["minilm-l3"]), ("option", ["--model", "minilm-l3"])):
        code, _, err = run_cli(capsys, "importance", *words, "--out", str(tmp_path / name), *options)
        assert code == 0, err
    first, second = (attnlens.load_result(tmp_path / name) for name in ("positional", "option"))
    assert first.meta["model"] == second.meta["model"] and first.meta["model"]["name"] == "minilm-l3"
    assert first.tables["ablation"].equals(second.tables["ablation"])
