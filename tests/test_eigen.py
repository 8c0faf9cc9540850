"""Moments, eigen analysis and overlap against numpy / scikit-learn, and on properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

import attnlens
from attnlens.analysis.eigen import analyse_moments, components_for_energy, gaussian_baseline, matrix_spectrum
from attnlens.analysis.overlap import chance_overlap, principal_angles, stable_dim, subspace_overlap
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.moments import HalfMoments, Moments, split_halves
from attnlens.rows.sources import StoreRows
from tiny_models import moments_of_rows


def spectrum(rows: np.ndarray, **settings):
    halves = HalfMoments(moments_of_rows(rows[::2]), moments_of_rows(rows[1::2]))
    table, arrays = analyse_moments(halves, **settings)
    return table.query("level == 'head'").iloc[0], arrays


def test_eigenvalues_and_vectors_equal_scikit_learn_pca():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((400, 12)) @ rng.standard_normal((12, 12)) + rng.standard_normal(12) * 5
    row, arrays = spectrum(rows, keep=12)
    pca = PCA(n_components=12, svd_solver="full").fit(rows)
    np.testing.assert_allclose(arrays["head_eigenvalues"][0, 0, 0], pca.explained_variance_, rtol=1e-10)
    # Same deterministic sign convention: each vector's largest-magnitude entry is positive.
    np.testing.assert_allclose(arrays["head_eigenvectors"][0, 0, 0], pca.components_.T, atol=1e-6)
    energy = np.cumsum(pca.explained_variance_ratio_)
    assert row.k90 == np.searchsorted(energy, 0.9) + 1 and row.k99 == np.searchsorted(energy, 0.99) + 1
    assert row.effective_rank == pytest.approx(pca.explained_variance_.sum() ** 2 / (pca.explained_variance_**2).sum())


def test_uncentred_second_moment_and_ones_direction():
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((300, 8)) + 3.0
    _, arrays = spectrum(rows, centred=False, keep=8)
    second = rows.T @ rows / len(rows)
    np.testing.assert_allclose(arrays["head_eigenvalues"][0, 0, 0], np.sort(np.linalg.eigvalsh(second))[::-1], rtol=1e-10)
    row, arrays = spectrum(rows, project_ones=True, keep=8)
    ones = np.ones(8) / np.sqrt(8)
    assert row.ones_variance == pytest.approx(ones @ np.cov(rows.T) @ ones, rel=1e-10)
    vectors = arrays["head_eigenvectors"][0, 0, 0][:, :7]
    assert np.abs(ones @ vectors).max() < 1e-6, "with the ones direction projected out, eigenvectors are orthogonal to it"
    assert arrays["head_eigenvalues"][0, 0, 0][-1] == pytest.approx(0, abs=1e-9)


def test_store_rows_match_numpy_for_every_quantity(tmp_path, minilm_l6, kjv):
    store = attnlens.extract(
        minilm_l6, tmp_path / "s", corpus=kjv, seq_len=16, num_seqs=12, layers=[1], dtype="float32", progress=False
    )
    halves = {
        q: compute_moments(StoreRows(store), quantity=q, progress=False, batch_size=5)
        for q in ("scores", "weights", "log-weights")
    }
    scores = np.asarray(store.scores(1), dtype=np.float64)[:, 3].reshape(-1, 16)  # head 3, all rows
    transforms = {
        "scores": scores,
        "weights": np.exp(scores - scores.max(1, keepdims=True))
        / np.exp(scores - scores.max(1, keepdims=True)).sum(1, keepdims=True),
        "log-weights": scores - np.log(np.exp(scores).sum(1, keepdims=True)),
    }
    for quantity, rows in transforms.items():
        total = halves[quantity].total
        np.testing.assert_allclose(total.second_moment()[0, 3, 0], np.cov(rows.T), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(total.mean()[0, 3, 0], rows.mean(0), rtol=1e-10, atol=1e-13)


def test_shards_merge_to_the_whole(tmp_path, minilm_l6, kjv):
    store = attnlens.extract(minilm_l6, tmp_path / "s", corpus=kjv, seq_len=16, num_seqs=10, layers=[0, 2], progress=False)
    rows = StoreRows(store)
    halves = compute_moments(rows, progress=False, seed=3)
    whole = halves.total
    first = compute_moments(rows, sequences=np.arange(4), progress=False).total
    second = compute_moments(rows, sequences=np.arange(4, 10), batch_size=3, progress=False).total
    merged = first + second
    for name in ("count", "key_count", "sum", "sum_outer"):
        np.testing.assert_allclose(getattr(merged, name), getattr(whole, name), rtol=1e-12)
    for position, layer in enumerate((0, 2)):  # against numpy's sums over every row of the store
        scores = np.asarray(store.scores(layer), dtype=np.float64)  # (seq, head, query, key)
        np.testing.assert_allclose(whole.sum_outer[position, :, 0], np.einsum("shqi,shqj->hij", scores, scores), rtol=1e-12)
        np.testing.assert_allclose(whole.sum[position, :, 0], scores.sum((0, 2)), rtol=1e-12)
    assert halves.a.count[0, 0, 0] + halves.b.count[0, 0, 0] == 10 * 16
    path = tmp_path / "m.npz"
    merged.save(path)
    np.testing.assert_array_equal(Moments.load(path).sum_outer, merged.sum_outer)


def test_planted_low_rank_signal_is_recovered():
    rng = np.random.default_rng(2)
    basis = np.linalg.qr(rng.standard_normal((64, 5)))[0]
    rows = rng.standard_normal((2000, 5)) * [10, 8, 6, 5, 4] @ basis.T + 0.05 * rng.standard_normal((2000, 64))
    row, arrays = spectrum(rows, keep=8)
    assert row.k99 <= 5 and row.baseline_k90 > 40
    found = arrays["head_eigenvectors"][0, 0, 0][:, :5]
    assert subspace_overlap(found, basis) > 0.999
    for half in ("a", "b"):
        assert subspace_overlap(arrays[f"head_eigenvectors_{half}"][0, 0, 0][:, :5], basis) > 0.99


def test_gaussian_baseline_matches_direct_sampling():
    """The Bartlett (Wishart) shortcut has the distribution of the direct sample covariance."""
    variances = np.linspace(0.5, 3.0, 10)
    bartlett = np.mean([gaussian_baseline(variances, 40, True, np.random.default_rng(seed)) for seed in range(400)], 0)
    rng = np.random.default_rng(999)
    direct = np.mean(
        [np.sort(np.linalg.eigvalsh(np.cov((rng.standard_normal((40, 10)) * np.sqrt(variances)).T)))[::-1] for _ in range(400)], 0
    )
    np.testing.assert_allclose(bartlett, direct, rtol=0.05)
    few = gaussian_baseline(variances, 5, True, np.random.default_rng(0))  # fewer rows than dimensions
    assert (few[4:] < 1e-10).all() and (few[:4] > 0).all()


def test_full_matrix_spectrum_equals_explicit_covariance():
    rng = np.random.default_rng(3)
    matrices = rng.standard_normal((10, 36)) @ rng.standard_normal((36, 36))
    values, factor = matrix_spectrum(matrices)
    explicit = np.sort(np.linalg.eigvalsh(np.cov(matrices.T)))[::-1]
    np.testing.assert_allclose(values, explicit[:10], rtol=1e-8, atol=1e-8)
    covariance = np.cov(matrices.T)
    for column in range(9):  # eigenvectors of the P x P covariance, unit norm
        np.testing.assert_allclose(covariance @ factor[:, column], values[column] * factor[:, column], rtol=1e-6, atol=1e-8)
        assert np.linalg.norm(factor[:, column]) == pytest.approx(1)


def test_overlap_properties():
    rng = np.random.default_rng(4)
    n, d = 40, 6
    u = np.linalg.qr(rng.standard_normal((n, d)))[0]
    complement = np.linalg.qr(np.c_[u, rng.standard_normal((n, n - d))])[0][:, d : 2 * d]
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    assert subspace_overlap(u, u) == pytest.approx(1)
    assert subspace_overlap(u, complement) == pytest.approx(0, abs=1e-12)
    assert subspace_overlap(u, u @ rotation) == pytest.approx(1)
    v = np.linalg.qr(rng.standard_normal((n, d)))[0]  # partly overlapping: invariant to the basis of either
    assert subspace_overlap(u, v) == pytest.approx(subspace_overlap(u @ rotation, v @ rotation.T), rel=1e-10)
    np.testing.assert_allclose(principal_angles(u, u @ rotation), 0, atol=1e-6)
    np.testing.assert_allclose(principal_angles(u, complement), np.pi / 2, atol=1e-6)
    random = [
        subspace_overlap(np.linalg.qr(rng.standard_normal((n, d)))[0], np.linalg.qr(rng.standard_normal((n, d)))[0])
        for _ in range(2000)
    ]
    assert np.mean(random) == pytest.approx(chance_overlap(d, n), rel=0.03)


def test_per_query_rows_of_a_causal_model_use_the_valid_prefix(tmp_path, minilm_l6, kjv):
    """Per-query moments on a causal model: query i has i + 1 keys; eigenvalues equal numpy's on those rows."""
    import transformers

    from tiny_models import tiny_model_dir

    config = transformers.LlamaConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = attnlens.load_model(str(tiny_model_dir(tmp_path, minilm_l6, config)))
    store = attnlens.extract(model, tmp_path / "s", corpus=kjv, seq_len=8, num_seqs=30, dtype="float32", progress=False)
    result = attnlens.eigen(store, per_query=True, keep=8, progress=False)
    heads = result.table.query("level == 'head' and head == 1")
    assert heads.num_keys.tolist() == list(range(1, 9))
    rows = np.asarray(store.scores(0), dtype=np.float64)[:, 1, 5, :6]  # query 5: keys 0..5
    expected = np.sort(np.linalg.eigvalsh(np.cov(rows.T)))[::-1]
    np.testing.assert_allclose(result.arrays["head_eigenvalues"][0, 1, 5, :6], expected, rtol=1e-8, atol=1e-10)
    assert (result.arrays["head_eigenvalues"][0, 1, 5, 6:] == 0).all()
    pooled = attnlens.eigen(store, keep=8, progress=False).table.query("level == 'head'")
    assert (pooled.rows == 30).all(), "pooled rows of a causal model: only the full-length (last) row of each block"


def test_eigen_and_overlap_from_a_real_model_and_reload(tmp_path, minilm_l6, minilm_l3):
    a = attnlens.eigen(minilm_l6, seq_len=32, num_seqs=48, keep=8, progress=False)
    b = attnlens.eigen(minilm_l3, seq_len=32, num_seqs=48, keep=8, progress=False)
    a.save(tmp_path / "a")
    a.save_figures(tmp_path / "a" / "figures")
    reloaded = attnlens.load_result(tmp_path / "a")
    np.testing.assert_array_equal(reloaded.arrays["layer_eigenvalues"], a.arrays["layer_eigenvalues"])
    assert list(reloaded.table.columns) == list(a.table.columns)
    result = attnlens.overlap([reloaded, b], dim=4)
    assert result.matrix("layers_0").shape == (6, 6) and result.matrix("layers_0_1").shape == (6, 3)
    np.testing.assert_allclose(np.diag(result.matrix("layers_0")), 1, atol=1e-5)
    assert result.chance == 4 / 32
    # Cross-model overlaps lie in [0, 1]; split-half has one row per unit and level.
    assert ((result.matrix("layers_0_1") >= 0) & (result.matrix("layers_0_1") <= 1 + 1e-6)).all()
    assert len(result.split_half) == (72 + 6 + 1) + (36 + 3 + 1)
    with pytest.raises(attnlens.BadInput, match="given twice"):  # the same result twice compares nothing
        attnlens.overlap([reloaded, a], dim=4)
    other = attnlens.eigen(minilm_l6, seq_len=32, num_seqs=48, keep=8, seed=1, progress=False)
    same = attnlens.overlap([reloaded, other], dim=4)  # one model on two samples of text: kept apart
    same.save(tmp_path / "same")
    assert same.meta["models"] == ["minilm-l6", "minilm-l6"] and same.matrix("layers_0_1").shape == (6, 6)
    assert (same.matrix("layers_0_1") <= 1 + 1e-6).all() and (np.diag(same.matrix("layers_0_1")) > same.chance).all()
    result.save(tmp_path / "o")
    attnlens.load_result(tmp_path / "o").save_figures(tmp_path / "o" / "figures")
    assert attnlens.load_result(tmp_path / "o").matrix("layers_0_1").shape == (6, 3)
    assert (tmp_path / "o" / "figures" / "overlap_layers_0_1.png").is_file()
    assert (tmp_path / "a" / "figures" / "spectra.pdf").is_file()
    # saved before overlaps recorded their comparisons: the same matrices, read from the old layout
    said = attnlens.load_result(tmp_path / "o").text()
    manifest = json.loads((tmp_path / "o" / "result.json").read_text())
    recorded = manifest.pop("comparisons")
    (tmp_path / "o" / "result.json").write_text(json.dumps(manifest))
    old = attnlens.load_result(tmp_path / "o")
    assert [vars(c) for c in old.comparisons] == recorded and old.layer_matrices == ["layers_0", "layers_0_1", "layers_1"]
    assert old.results_of("heads_0_1") == (0, 1) and old.text() == said


def test_components_for_energy_edges():
    assert components_for_energy(np.array([1.0, 0, 0]), 0.99) == 1
    assert components_for_energy(np.zeros(3), 0.9) == 0
    assert split_halves(7, 0).sum() == 3


# ---------------------------------------------------------------------- overlap against d


@pytest.fixture(scope="module")
def two_spectra(minilm_l6, minilm_l3):
    """Real eigen results of two models, n = 32, keeping 12 eigenvectors."""
    a = attnlens.eigen(minilm_l6, seq_len=32, num_seqs=48, keep=12, progress=False)
    b = attnlens.eigen(minilm_l3, seq_len=32, num_seqs=48, keep=12, progress=False)
    return a, b


def test_overlap_at_every_d_equals_the_single_d_computation(two_spectra):
    a, b = two_spectra
    curves = attnlens.overlap([a, b], max_dim=12)
    assert curves.max_dim == 12
    for d in range(1, 13):
        single = attnlens.overlap([a, b], dim=d, max_dim=d)
        for name in ("layers_0", "heads_0", "layers_0_1", "heads_0_1", "model_0_1", "layers_1"):
            np.testing.assert_allclose(curves.curve(name)[..., d - 1], single.matrix(name), rtol=1e-10, atol=1e-12, err_msg=name)
        # the split-half curves, against subspace_overlap of the two halves' bases by hand
        for index, result in enumerate((a, b)):
            for level in ("head", "layer", "model"):
                halves = [result.eigenvectors(level, half)[:, :, 0, :, :d].astype(np.float64) for half in "ab"]
                first, second = (h.reshape(-1, result.n, d) for h in halves)
                expected = [subspace_overlap(u, v) for u, v in zip(first, second)]
                got = curves.arrays[f"split_half_{index}_{level}_curve"][:, d - 1]
                np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_split_half_curves_reach_one_for_identical_halves(two_spectra):
    a, _ = two_spectra
    twin = type(a)(a.meta, a.tables, dict(a.arrays))
    for level in ("head", "layer", "model"):
        twin.arrays[f"{level}_eigenvectors_b"] = twin.arrays[f"{level}_eigenvectors_a"].copy()
    result = attnlens.overlap(twin, max_dim=12)
    for level in ("head", "layer", "model"):
        curve = result.arrays[f"split_half_0_{level}_curve"]
        np.testing.assert_allclose(curve, 1, atol=1e-5)  # float32 bases: orthonormal to about 1e-7
    assert (result.split_half.stable_dim == 12).all()
    assert result.dim == 12, "every layer determined up to max_dim: the median is max_dim"


def test_stable_dim_is_the_prefix_rule_by_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(200):
        curve = rng.uniform(0.5, 1.0, size=rng.integers(1, 12))
        level = rng.uniform(0.5, 1.0)
        expected = max([d for d in range(len(curve) + 1) if all(curve[:d] >= level)])
        assert stable_dim(curve, level) == expected


def test_pairs_are_compared_at_the_smaller_determined_d(two_spectra):
    a, b = two_spectra
    result = attnlens.overlap([a, b], max_dim=12, level=0.8)
    split = result.split_half.set_index(["result", "level", "layer"]).stable_dim
    pairs = result.pairs
    assert len(pairs) == 6 * 5 // 2 + 6 * 3 + 3 * 2 // 2 + 1  # within l6, l6 × l3, within l3, the two models
    for _, row in pairs.iterrows():
        ia, ib = result.meta["models"].index(row.model_a), result.meta["models"].index(row.model_b)
        level = "model" if row.layer_a < 0 else "layer"
        d = min(split[(ia, level, row.layer_a)], split[(ib, level, row.layer_b)])
        assert row.d == d
        if d:
            assert row.chance == d / result.meta["n"]
            key = {"layer": "layers", "model": "model"}[level] + (f"_{ia}" if ia == ib else f"_{ia}_{ib}")
            x = result.meta["layers"][ia].index(row.layer_a) if level == "layer" else 0
            y = result.meta["layers"][ib].index(row.layer_b) if level == "layer" else 0
            assert row.overlap == result.curve(key)[x, y, d - 1]
            assert min(row.split_half_a, row.split_half_b) >= 0.8


# ---------------------------------------------------------------------- the direction of least variance


def test_last_direction_finds_a_planted_pair_of_keys_and_the_ones_direction():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((500, 10)) * np.linspace(3, 1, 10)
    rows[:, 7] = rows[:, 2] + 0.5 + 1e-3 * rng.standard_normal(500)  # key 7 follows key 2 up to a constant
    row, _ = spectrum(rows, keep=4)
    values, vectors = np.linalg.eigh(np.cov(rows.T))
    assert row.last_eigenvalue == pytest.approx(values[0], rel=1e-8)
    assert row.last_gap == pytest.approx(values[0] / values[1], rel=1e-8) and row.last_isolated
    assert (row.last_key_a, row.last_key_b, row.last_keys_sign) == (2, 7, -1), "the difference of keys 2 and 7"
    assert row.last_keys_share == pytest.approx(vectors[2, 0] ** 2 + vectors[7, 0] ** 2, rel=1e-8) and row.last_keys_share > 0.99
    assert row.last_ones == pytest.approx((vectors[:, 0].sum() / np.sqrt(10)) ** 2, abs=1e-10) and row.last_ones < 1e-3
    # A row sum that barely varies: the all-ones direction has almost no variance.
    summed = rng.standard_normal((500, 10)) * np.linspace(3, 1, 10)
    summed -= summed.mean(1, keepdims=True) - 1e-3 * rng.standard_normal((500, 1))
    row, _ = spectrum(summed, keep=4)
    assert row.last_isolated and row.last_ones > 0.999
    # Projected out, the all-ones direction is no longer the data's last one: the next is, and is not isolated.
    row, _ = spectrum(summed, keep=4, project_ones=True)
    values = np.linalg.eigvalsh(np.cov(summed.T))
    assert row.last_eigenvalue == pytest.approx(values[1], rel=1e-6) and row.last_ones < 1e-6 and not row.last_isolated


def test_minilm_l3_scores_to_cls_and_sep_move_together_and_the_spectrum_says_so(two_spectra, minilm_l3, kjv):
    """In minilm-l3 after layer 0, [CLS] and [SEP] have nearly the same hidden state, so every
    query scores them alike up to a constant: the last eigenvalue of layers 1 and 2 is
    (almost) only that difference. Checked on scores captured here, against the table, the
    notes and the figure; minilm-l6 has no such direction."""
    import matplotlib.pyplot as plt

    from attnlens.figures.eigen import plot_spectra

    a, b = two_spectra
    n = b.n
    ids = kjv.blocks(minilm_l3, n=n, num_blocks=6, seed=5).ids
    with attnlens.Capture(layers=[1, 2]) as cap:
        minilm_l3.forward(torch.from_numpy(ids))
    layers = b.table.query("level == 'layer'").set_index("layer")
    for layer in (1, 2):
        scores = cap.scores[layer].double().numpy()  # (block, head, query, key)
        difference = (scores[..., 0] - scores[..., n - 1]).ravel()
        assert difference.var() < 1e-3 * scores[..., 0].var(), "scores to [CLS] and [SEP] differ by a near-constant"
        row = layers.loc[layer]
        assert row.last_isolated and (row.last_key_a, row.last_key_b, row.last_keys_sign) == (0, n - 1, -1)
        assert row.last_eigenvalue == pytest.approx(difference.var() / 2, rel=0.5), "the variance along (e₀ − eₙ₋₁)/√2"
        assert "[CLS]" in b.meta["notes"][f"layer {layer}"] and "[SEP]" in b.meta["notes"][f"layer {layer}"]
    assert b.meta["fixed_tokens"] == {"0": "[CLS]", str(n - 1): "[SEP]"}
    assert not layers.loc[0].last_isolated and "notes" not in a.meta
    assert not a.table.query("level == 'layer'").last_isolated.any()
    ax = plot_spectra(b)
    (note,) = [text for text in ax.texts if "last eigenvalue" in text.get_text()]
    assert "L1" in note.get_text() and "L2" in note.get_text() and "[CLS]" in note.get_text()
    arrows = [text.xy for text in ax.texts if text.get_text() == "" and hasattr(text, "xy")]
    expected = [(n, pytest.approx(value)) for value in sorted(layers.loc[[1, 2], "last_eigenvalue"])]
    assert sorted(arrows, key=lambda xy: xy[1]) == expected, "an arrow at each isolated last eigenvalue, at component n"
    plt.close(ax.figure)
    ax = plot_spectra(a)
    assert not [text for text in ax.texts if "last eigenvalue" in text.get_text()]
    plt.close(ax.figure)


def _longest_run(flags: np.ndarray) -> int:
    longest = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        longest = max(longest, current)
    return longest


def test_overlap_heat_maps_leave_no_wide_blank_margin(two_spectra, tmp_path):
    """The saved PNG of a layer × layer map of two models of different depths (6 × 3), of one
    model (6 × 6) and of heads (72 × 36) has no blank band wider or taller than a tenth of
    it: the figure takes the matrix's shape (a fixed 6.4 × 5.2 figure left 30% of 6 × 3 blank)."""
    import matplotlib.pyplot as plt

    from attnlens.figures.overlap import plot_overlap

    result = attnlens.overlap(list(two_spectra), dim=4)
    for name in ("layers_0_1", "layers_0", "layers_1", "heads_0_1"):
        ax = plot_overlap(result, name)
        ax.figure.savefig(tmp_path / f"{name}.png", dpi=100)
        plt.close(ax.figure)
        blank = (plt.imread(tmp_path / f"{name}.png")[..., :3] > 0.98).all(-1)  # white, nothing drawn
        height, width = blank.shape
        assert _longest_run(blank.all(0)) < 0.1 * width, (name, "a blank vertical band")
        assert _longest_run(blank.all(1)) < 0.1 * height, (name, "a blank horizontal band")
