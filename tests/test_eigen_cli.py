"""``attnlens eigen`` and ``attnlens overlap`` end to end, and their bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import attnlens
from tiny_models import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def eigen_dirs(tmp_path_factory):
    """Eigen results of minilm-l6 (from a store, per query too) and minilm-l3 (streamed), n = 24."""
    root = tmp_path_factory.mktemp("eigen")
    attnlens.extract("minilm-l6", root / "store", corpus="kjv", seq_len=24, num_seqs=30, progress=False)
    attnlens.eigen(root / "store", keep=8, progress=False).save(root / "l6")
    attnlens.eigen("minilm-l3", seq_len=24, num_seqs=30, keep=8, progress=False).save(root / "l3")
    attnlens.eigen("minilm-l3", seq_len=16, num_seqs=20, keep=8, progress=False).save(root / "l3-n16")
    return root


@pytest.mark.integration  # runs a real model by name
def test_eigen_cli_from_model_and_store(capsys, tmp_path, eigen_dirs):
    code, out, _ = run_cli(
        capsys,
        "eigen",
        "minilm-l6",
        "--out",
        str(tmp_path / "e"),
        "--seq-len",
        "16",
        "--num-seqs",
        "20",
        "--layers",
        "0,5",
        "--keep",
        "4",
        "--no-progress",
    )
    assert code == 0 and "wrote eigen result" in out and "k90" in out
    result = attnlens.load_result(tmp_path / "e")
    assert result.meta["layers"] == [0, 5] and result.meta["corpus"]["source"] == "kjv"
    assert sorted(result.table.level.unique()) == ["head", "layer", "model"]
    code, out, _ = run_cli(
        capsys,
        "eigen",
        str(eigen_dirs / "store"),
        "--out",
        str(tmp_path / "f"),
        "--quantity",
        "weights",
        "--full-matrices",
        "--project-ones",
        "--no-progress",
    )
    assert code == 0
    result = attnlens.load_result(tmp_path / "f")
    assert result.meta["settings"]["quantity"] == "weights" and len(result.matrix_table) == 6 * 13
    assert (result.matrix_table.k90 <= result.matrix_table.baseline_k90).all()


@pytest.mark.slow
def test_overlap_cli_across_models(capsys, tmp_path, eigen_dirs):
    code, out, _ = run_cli(
        capsys, "overlap", str(eigen_dirs / "l6"), str(eigen_dirs / "l3"), "--dim", "4", "--out", str(tmp_path / "o")
    )
    assert code == 0 and "chance level d/n = 0.167" in out
    result = attnlens.load_result(tmp_path / "o")
    assert result.meta["models"] == ["minilm-l6", "minilm-l3"]
    for name in ("layers_0", "heads_0", "layers_1", "layers_0_1", "heads_0_1"):
        assert (tmp_path / "o" / "figures" / f"overlap_{name}.png").is_file()
    assert (tmp_path / "o" / "figures" / "split_half_1.pdf").is_file()
    for name in ("layers_0", "layers_0_1", "layers_1"):
        assert (tmp_path / "o" / "figures" / f"curves_{name}.png").is_file()
    # every comparison it computed is printed: both models' layer matrices, the cross-model one, the pairs
    assert "minilm-l6: layer x layer" in out and "minilm-l3: layer x layer" in out and "minilm-l6 x minilm-l3" in out
    lines = out.splitlines()
    start = lines.index("minilm-l6 x minilm-l3: layer x layer overlap at d = 4") + 2  # after the column labels
    printed = np.array([[float(value) for value in line.split()[1:]] for line in lines[start : start + 6]])
    np.testing.assert_allclose(printed, result.matrix("layers_0_1"), atol=0.005 + 1e-9)
    assert out.count("minilm-l6 all") == 1, "the model-level pair is among the printed pairs"


def test_overlap_cli_picks_d_from_the_data(capsys, tmp_path, eigen_dirs):
    code, out, _ = run_cli(
        capsys, "overlap", str(eigen_dirs / "l6"), "--level", "0.95", "--out", str(tmp_path / "o"), "--no-figures"
    )
    assert code == 0
    result = attnlens.load_result(tmp_path / "o")
    layers = result.split_half.query("level == 'layer'").stable_dim
    assert result.dim == max(1, int(np.median(layers))) and f"matrices at d = {result.dim} (median over layers" in out
    assert result.max_dim == 8, "n/2 = 12, capped by the 8 eigenvectors kept"


def test_overlap_bad_inputs(capsys, tmp_path, eigen_dirs):
    out = ["--out", str(tmp_path / "o")]
    assert_one_line_error(
        *run_cli(capsys, "overlap", str(eigen_dirs / "l6"), str(eigen_dirs / "l3-n16"), *out)[::2],
        "different n (24 for minilm-l6, 16 for minilm-l3)",
    )
    assert_one_line_error(*run_cli(capsys, "overlap", str(eigen_dirs / "l6"), "--dim", "25", *out)[::2], "between 1 and n = 24")
    assert_one_line_error(*run_cli(capsys, "overlap", str(eigen_dirs / "l6"), "--dim", "9", *out)[::2], "--keep 9")
    assert_one_line_error(
        *run_cli(capsys, "overlap", str(eigen_dirs / "l6"), "--max-dim", "9", *out)[::2], "--max-dim 9", "--keep 9"
    )
    assert_one_line_error(*run_cli(capsys, "overlap", str(eigen_dirs / "l6"), "--level", "0", *out)[::2], "--level", "(0, 1]")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(*run_cli(capsys, "overlap", str(tmp_path / "empty"), *out)[::2], "not an attnlens result")
    assert_one_line_error(*run_cli(capsys, "overlap", str(eigen_dirs / "store"), *out)[::2], "not an attnlens result")


@pytest.mark.integration  # runs a real model by name
def test_eigen_bad_inputs(capsys, tmp_path, eigen_dirs):
    out = ["--out", str(tmp_path / "e"), "--no-progress"]
    attnlens.extract("minilm-l6", tmp_path / "small", corpus="kjv", seq_len=24, num_seqs=10, layers=[0], progress=False)
    assert_one_line_error(
        *run_cli(capsys, "eigen", str(tmp_path / "small"), "--per-query", *out)[::2], "from 10 sequences", "at least 25 sequences"
    )
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("x")
    assert_one_line_error(*run_cli(capsys, "eigen", str(tmp_path / "foreign"), *out)[::2], "neither an attnlens store")
    assert_one_line_error(
        *run_cli(capsys, "eigen", str(eigen_dirs / "store"), "--quantity", "probs", *out)[::2], "--quantity probs"
    )
    assert_one_line_error(
        *run_cli(capsys, "eigen", "minilm-l6", "--full-matrices", "--seq-len", "8", "--num-seqs", "4", *out)[::2],
        "reads the matrices of each sequence from a store",
    )
    assert_one_line_error(
        *run_cli(capsys, "eigen", str(eigen_dirs / "store"), "--out", str(tmp_path / "foreign"))[::2], "not an attnlens result"
    )
