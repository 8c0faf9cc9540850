"""``attnlens importance`` and ``attnlens dam``: the happy path end to end, and one line per bad input."""

from __future__ import annotations

import pytest

import attnlens
from attnlens.analysis.dam import DamResult
from tiny_models import assert_one_line_error, run_cli, save_tiny

IMPORTANCE = ["importance", "--seq-len", "16", "--num-seqs", "4", "--batch-size", "2", "--bootstrap", "50", "--no-progress"]
DAM = [
    "dam",
    "--seq-len",
    "16",
    "--train-seqs",
    "4",
    "--eval-seqs",
    "2",
    "--batch-size",
    "2",
    "--bootstrap",
    "20",
    "--steps",
    "3",
    "--stop-window",
    "2",
    "--no-progress",
]


@pytest.fixture(scope="module")
def tiny_causal_dir(tmp_path_factory, minilm_l6):
    return str(save_tiny(tmp_path_factory.mktemp("causal"), minilm_l6, "causal"))


@pytest.mark.integration  # runs a real model by name
def test_importance_end_to_end(capsys, tmp_path):
    out = tmp_path / "imp"
    code, stdout, _ = run_cli(capsys, *IMPORTANCE, "--out", str(out), "--classes", "self,other", "--per", "layer")
    assert code == 0 and f"wrote importance result to {out}" in stdout
    assert "self" in stdout and "delta" in stdout
    result = attnlens.ImportanceResult.load(out)
    assert list(result.table["class"]) == ["self", "other"]
    assert result.meta["command"].split()[0] in ("attnlens", "pytest", "python") and result.meta["settings"]["per"] == "layer"
    assert (out / "figures" / "ablation_per_layer.png").is_file() and (out / "figures" / "mass.pdf").is_file()
    assert_one_line_error(*run_cli(capsys, *IMPORTANCE, "--out", str(out))[::2], "already exists", "--overwrite")
    code, _, _ = run_cli(capsys, *IMPORTANCE, "--out", str(out), "--classes", "self", "--overwrite", "--no-figures")
    assert code == 0 and list(attnlens.ImportanceResult.load(out).table["class"]) == ["self"]


@pytest.mark.integration  # runs a real model by name
def test_dam_end_to_end(capsys, tmp_path):
    out = tmp_path / "dam"
    code, stdout, _ = run_cli(capsys, *DAM, "--out", str(out), "--variant", "class", "--lambdas", "0,0.5", "--tau", "2:0.5")
    assert code == 0 and f"wrote dam result to {out}" in stdout and "sparsity" in stdout
    result = DamResult.load(out)
    assert result.table["lambda"].tolist() == [0.0, 0.5] and result.meta["settings"]["tau"] == [2.0, 0.5]
    assert len(result.patterns) > 10 and (out / "figures" / "loss_vs_sparsity.png").is_file()


@pytest.mark.parametrize(
    "command, extra, phrases",
    [
        (IMPORTANCE, ["--classes", "self,diagonal"], ["unknown position class 'diagonal'", "band(w)"]),
        (IMPORTANCE, ["--classes", "band(0)"], ["band(0): the width w of band(w) must be at least 1"]),
        (IMPORTANCE, ["--per", "block"], ["--per block is unknown", "model, layer, head"]),
        (IMPORTANCE, ["--objective", "mlm"], ["--objective mlm needs a masked language-model head"]),
        (DAM, ["--lambdas", "0.1,-1"], ["--lambdas -1: λ must be 0 or more"]),
        (DAM, ["--lambdas", "-1e-3"], ["λ must be 0 or more"]),
        (DAM, ["--lambdas", "small"], ["--lambdas 'small' is not a comma-separated list of numbers"]),
        (DAM, ["--tau", "0"], ["--tau 0: the temperature τ must be greater than 0"]),
        (DAM, ["--tau", "1:-0.5"], ["--tau -0.5: the temperature τ must be greater than 0"]),
        (DAM, ["--steps", "0"], ["--steps 0 must be at least 2", "--stop-window"]),
        (DAM, ["--steps", "-5"], ["--steps -5 must be at least 2"]),
        (DAM, ["--variant", "dense"], ["--variant dense is unknown", "structured"]),
        (DAM, ["--classes", "self,band(-1)"], ["band(-1): the width w"]),
        (DAM, ["--classes", "self,heavy(2)"], ["chosen by each head's scores", "attnlens importance measures it"]),
    ],
)
@pytest.mark.integration  # runs a real model by name
def test_bad_input_is_one_line(capsys, tmp_path, command, extra, phrases):
    assert_one_line_error(*run_cli(capsys, *command, "--out", str(tmp_path / "r"), *extra)[::2], *phrases)
    assert not (tmp_path / "r").exists(), "nothing is written"


@pytest.mark.parametrize("command", [IMPORTANCE, DAM])
def test_a_class_that_never_occurs_is_named(capsys, tmp_path, tiny_causal_dir, command):
    code, _, err = run_cli(capsys, *command, "--out", str(tmp_path / "r"), "--model", tiny_causal_dir, "--classes", "self,next")
    assert_one_line_error(
        code, err, "class 'next' never occurs", "is causal, so no query sees the next token", "drop it from --classes"
    )
