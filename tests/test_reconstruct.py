"""Selection, least-squares maps, held-out evaluation, plug-in and learned maps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens.analysis.reconstruct import MapFitter, ReconstructResult, attention_flops, reconstruct
from attnlens.analysis.reconstruct.pairs import fit_pairs, greedy_pairs
from attnlens.analysis.reconstruct.selection import greedy_path, naive_greedy_path
from tiny_models import assert_one_line_error, identical_columns, moments_of_rows, run_cli


def fitter_for(rows: np.ndarray, per_query: bool = False, ridge: float = 0.0) -> MapFitter:
    """A fitter over plain rows (R, n), one layer and head; per_query makes every row its own query position."""
    # per query: each block holds n copies of its row, one per query position, so rows enter every unit
    moments = moments_of_rows(rows, queries=rows.shape[1] if per_query else None)
    return MapFitter(moments, ridge=ridge, seed=0, global_positions=(0,))


def predict(fitter: MapFitter, strategy: str, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    maps, selections = fitter.layer_maps(strategy, "head", k, 0)
    queries = maps.positions.shape[1]
    scores = torch.from_numpy(rows)[:, None, None, :].expand(-1, 1, queries, -1).double()
    return maps.apply(scores)[:, 0].numpy(), selections[0]


def lstsq_prediction(rows: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Brute force: every coordinate regressed on [1, s_S] by numpy.linalg.lstsq."""
    design = np.c_[np.ones(len(rows)), rows[:, selected]]
    coefficients = np.linalg.lstsq(design, rows, rcond=None)[0]
    return design @ coefficients


@pytest.fixture(scope="module")
def planted():
    """Rows with a planted rank-4 structure plus noise: 600 to fit, 300 held out."""
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((4, 24)) * np.linspace(3, 0.2, 24)
    make = lambda count: rng.standard_normal((count, 4)) @ basis + 0.3 * rng.standard_normal((count, 24)) + 2.0
    return make(600), make(300)


@pytest.mark.parametrize("strategy", ["greedy", "random", "stride", "eigen", "local+global"])
def test_closed_form_equals_brute_force_lstsq(planted, strategy):
    fit, _ = planted
    per_query = strategy == "local+global"
    fitter = fitter_for(fit, per_query=per_query)
    predictions, selections = predict(fitter, strategy, 6, fit)
    for query in [0, 7, 23] if per_query else [0]:
        chosen = selections[query]
        expected = lstsq_prediction(fit, chosen)
        np.testing.assert_allclose(predictions[:, query], expected, atol=1e-8)
        np.testing.assert_array_equal(predictions[:, query][:, chosen], fit[:, chosen])  # chosen scores are exact


def test_greedy_path_matches_naive_greedy_and_lstsq_errors(planted):
    fit, _ = planted
    covariance = np.cov(fit.T)
    order, errors = greedy_path(covariance[None])
    np.testing.assert_array_equal(order[0, :8], naive_greedy_path(covariance, steps=8))
    assert (np.diff(errors[0]) <= 1e-9).all(), "greedy error never rises with k"
    assert errors[0, -1] == pytest.approx(0, abs=1e-9)
    for k in (1, 3, 8):  # the path's error is the in-sample least-squares error of the chosen keys
        residual = fit - lstsq_prediction(fit, order[0, :k])
        assert errors[0, k] == pytest.approx((residual**2).sum() / (len(fit) - 1), rel=1e-6)


def test_greedy_path_with_few_candidates_is_naive_greedy_on_them_then_the_rest_in_order():
    """Units with different numbers of candidate keys (a causal model's queries) in one batch: each unit's order
    begins with brute-force greedy on its candidates alone, then its other positions ascending, its error flat
    after the last candidate; and a path cut at ``steps`` is the whole path's prefix."""
    rng = np.random.default_rng(3)
    n, units = 12, 6
    factors = rng.standard_normal((units, n, n))
    covariance = factors @ factors.transpose(0, 2, 1) / n
    counts = np.array([1, 2, 4, 5, 7, 8])
    candidates = np.arange(n)[None, :] < counts[:, None]
    order, errors = greedy_path(covariance, candidates)
    for unit, m in enumerate(counts):
        own = covariance[unit][:m, :m]
        np.testing.assert_array_equal(order[unit, :m], naive_greedy_path(own, steps=m))
        np.testing.assert_array_equal(order[unit, m:], np.arange(m, n))
        assert errors[unit, 0] == pytest.approx(np.trace(own)) and np.allclose(errors[unit, m:], errors[unit, m], atol=1e-9)
    cut_order, cut_errors = greedy_path(covariance, candidates, steps=3)
    np.testing.assert_array_equal(cut_order[:, :3], order[:, :3])
    np.testing.assert_allclose(cut_errors[:, :4], errors[:, :4])
    assert not cut_order[:, 3:].any() and not cut_errors[:, 4:].any()


def test_greedy_beats_random_on_held_out_planted_data(planted):
    fit, held_out = planted
    fitter = fitter_for(fit)
    centred = ((held_out - fit.mean(0)) ** 2).sum()
    for k in (2, 4, 8):
        errors = {s: ((held_out - predict(fitter, s, k, held_out)[0][:, 0]) ** 2).sum() / centred for s in ("greedy", "random")}
        assert errors["greedy"] <= errors["random"] * 1.001, (k, errors)


def test_greedy_pairs_match_the_dense_greedy_and_lstsq():
    rng = np.random.default_rng(1)
    factor = rng.standard_normal((30, 6)) * np.linspace(2, 0.5, 6)
    dense_order, _ = greedy_path((factor @ factor.T)[None])
    # The last of 6 steps exhausts the rank: all remaining candidates tie, so compare the first 5.
    np.testing.assert_array_equal(greedy_pairs(factor, 5), dense_order[0, :5])
    matrices = rng.standard_normal((200, 6)) @ factor.T + rng.standard_normal(30)
    values, vectors = np.linalg.eigh(np.cov(matrices.T))
    low_rank = vectors[:, -6:] * np.sqrt(values[-6:])
    selected = np.sort(greedy_pairs(low_rank, 4))
    rebuilt = fit_pairs(low_rank, matrices.mean(0), selected, ridge=0.0).apply(matrices)
    np.testing.assert_allclose(rebuilt, lstsq_prediction(matrices, selected), atol=1e-6)


def test_flops_accounting_by_hand():
    flops = attention_flops(n=128, head_dim=64, k=16)
    full = 2 * 128 * 128 * 64 * 2 + 3 * 128 * 128
    partial = 2 * 128 * 16 * 64 + 2 * 128 * 16 * 112 + 128 * 112 + 3 * 128 * 128 + 2 * 128 * 128 * 64
    assert flops["full"] == full and flops["partial"] == partial


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return attnlens.extract(
        "minilm-l6",
        tmp_path_factory.mktemp("r") / "store",
        corpus="kjv",
        seq_len=16,
        num_seqs=48,
        layers=[0, 4],
        dtype="float32",
        progress=False,
    )


def test_held_out_table_plug_in_and_learned_maps(store, minilm_l6):
    result = reconstruct(
        store,
        model=minilm_l6,
        ks=[2, 8, 16],
        strategies=["greedy", "random"],
        scopes=["head", "all"],
        pairs=True,
        plug_in=True,
        learn_r=True,
        learn_steps=4,
        batch_size=8,
        progress=False,
    )
    overall = result.table[result.table.layer == -1].set_index(["strategy", "scope", "k"]).sort_index()
    assert overall.loc[("greedy", "head", 16), "rel_error"] < 1e-10, "k = n is exact"
    for scope in ("head", "all"):
        errors = overall.loc[("greedy", scope)].rel_error
        assert (np.diff(errors.to_numpy()) <= 1e-9).all()
    assert ("greedy-pairs", "head", 8) in overall.index
    plug = result.plug_in.set_index(["strategy", "scope", "k"])
    assert plug.loc[("greedy", "head", 16), "token_cosine"] == pytest.approx(1, abs=1e-5), "k = n reproduces the model"
    assert plug.loc[("greedy", "head", 2), "token_cosine"] < 0.999
    learned = result.learned
    assert (learned.train_loss_learned <= learned.train_loss_closed_form + 1e-12).all()
    assert result.selections["greedy/head/8"].shape == (2, 12, 1, 8)
    # The exact rows fitted and judged are recorded: disjoint, covering the store, and named as corpus blocks.
    splits = result.meta["splits"]
    assert sorted(splits["fit"] + splits["eval"]) == list(range(48)) and len(splits["eval"]) == 12
    block_index = np.asarray(store.manifest["corpus"]["block_index"])
    assert splits["eval_block_index"] == block_index[splits["eval"]].tolist()
    assert splits["fit_block_index"] == block_index[splits["fit"]].tolist()


def test_causal_model_per_query_maps_reproduce_the_model_at_k_equal_n(tmp_path, minilm_l6, kjv):
    from tiny_models import save_tiny

    model = attnlens.load_model(str(save_tiny(tmp_path, minilm_l6, "causal")))
    result = reconstruct(
        model,
        corpus=kjv,
        seq_len=8,
        num_seqs=40,
        ks=[2, 8],
        strategies=["greedy", "local+global"],
        scopes=["head"],
        plug_in=True,
        progress=False,
    )
    assert result.meta["settings"]["rows"] == "per-query"
    plug = result.plug_in.set_index(["strategy", "k"])
    assert plug.loc[("greedy", 8), "loss_increase"] == pytest.approx(0, abs=1e-5)
    assert abs(plug.loc[("greedy", 2), "loss_increase"]) > 1e-6
    # a next-token loss of its own: kept beside its increase over the unmodified model
    np.testing.assert_allclose(plug["loss"] - plug["loss_increase"], plug["baseline_loss"], rtol=1e-6)
    chosen = result.selections["greedy/head/2"][0, 0]  # (query, k): only keys the query may see
    for query in range(8):
        assert (chosen[query][chosen[query] >= 0] <= query).all()


@pytest.mark.slow
def test_gemma3_plug_in_at_k_equal_n_keeps_the_next_token_loss(gemma3, kjv):
    result = reconstruct(
        gemma3,
        corpus=kjv,
        seq_len=12,
        num_seqs=20,
        ks=[4, 12],
        strategies=["greedy"],
        scopes=["head"],
        layers=[0, 5],
        plug_in=True,
        batch_size=4,
        progress=False,
    )
    plug = result.plug_in.set_index("k")
    assert plug.loc[12, "loss_increase"] == pytest.approx(0, abs=1e-4)
    assert plug.loc[12, "baseline_loss"] > 0


def _softmax(rows: np.ndarray) -> np.ndarray:
    shifted = np.exp(rows - rows.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def test_held_out_intervals_are_a_block_bootstrap_of_the_ratio_of_sums(store):
    """Per held-out block, the sums behind each error are recomputed here from the store's
    scores with numpy least squares; resampling blocks by hand and taking each resample's
    ratio of sums gives the table's intervals, overall and per head."""
    from attnlens.analysis.evaluation import bootstrap_weights

    result = reconstruct(store, ks=[2], strategies=["greedy"], scopes=["head"], layers=[0], ridge=0.0, batch_size=5,
                         progress=False)  # fmt: skip
    splits, n = result.meta["splits"], store.n
    scores = store.read("scores", 0, 0, store.num_seqs).astype(np.float64)  # (sequences, heads, n, n)
    held_out = scores[splits["eval"]]
    heads, blocks = scores.shape[1], len(held_out)
    sums = {name: np.zeros((blocks, heads)) for name in ("squared_error", "squared_deviation", "squared_norm", "tv", "kl")}
    for head in range(heads):
        fit_rows = scores[splits["fit"], head].reshape(-1, n)
        chosen = result.selections["greedy/head/2"][0, head, 0]
        coefficients = np.linalg.lstsq(np.c_[np.ones(len(fit_rows)), fit_rows[:, chosen]], fit_rows, rcond=None)[0]
        truth = held_out[:, head]  # (blocks, n queries, n keys)
        estimate = np.concatenate([np.ones((*truth.shape[:2], 1)), truth[..., chosen]], -1) @ coefficients
        weights, estimated_weights = _softmax(truth), _softmax(estimate)
        sums["squared_error"][:, head] = ((truth - estimate) ** 2).sum((1, 2))
        sums["squared_deviation"][:, head] = ((truth - fit_rows.mean(0)) ** 2).sum((1, 2))
        sums["squared_norm"][:, head] = (truth**2).sum((1, 2))
        sums["tv"][:, head] = 0.5 * np.abs(weights - estimated_weights).sum(-1).sum(-1)
        sums["kl"][:, head] = (weights * (np.log(weights) - np.log(estimated_weights))).sum(-1).sum(-1)
    rows_per_block = n  # every query of a block is a row with valid keys
    counts = np.rint(bootstrap_weights(blocks, 1000, seed=0) * blocks).astype(int)  # the resamples: draws per block
    ratios = {"rel_error": ("squared_error", "squared_deviation"), "rel_error_zero": ("squared_error", "squared_norm"),
              "tv": ("tv", None), "kl": ("kl", None)}  # fmt: skip
    table = result.table.set_index(["layer", "head"])
    for unit, columns in (((-1, -1), slice(None)), ((0, 3), [3])):  # all heads together, and one head
        row = table.loc[unit]
        for metric, (top, bottom) in ratios.items():
            numerator = sums[top][:, columns].sum(1)
            rows = np.full(blocks, float(rows_per_block * sums[top][:, columns].shape[1]))  # rows of the unit's heads
            denominator = sums[bottom][:, columns].sum(1) if bottom else rows
            assert row[metric] == pytest.approx(numerator.sum() / denominator.sum(), rel=1e-4), (unit, metric)
            resampled = []
            for draws in counts.T:  # one resample: each block as often as drawn, errors summed, then divided
                picked = np.repeat(np.arange(blocks), draws)
                resampled.append(numerator[picked].sum() / denominator[picked].sum())
            low, high = np.percentile(resampled, [2.5, 97.5])
            interval = (row[f"{metric}_low"], row[f"{metric}_high"])
            assert interval == pytest.approx((low, high), rel=1e-4, abs=1e-12), (unit, metric)
            assert row[f"{metric}_low"] <= row[metric] <= row[f"{metric}_high"]
            assert row[f"{metric}_low"] < row[f"{metric}_high"], "blocks differ: the interval has a width"


def test_held_out_intervals_of_identical_blocks_have_no_width():
    """Every block alike: every resample gives the point estimate; blocks that differ give a
    width, and more of them (the same ones again) a narrower one."""
    from attnlens.analysis.evaluation import bootstrap_weights
    from attnlens.analysis.reconstruct import error_records

    rng = np.random.default_rng(0)
    names = ("squared_error", "squared_deviation", "squared_norm", "tv", "kl", "rows")

    def records(per_block: dict[str, np.ndarray]) -> dict:  # one layer of two heads
        totals = {0: {name: value.sum(0) for name, value in per_block.items()}}
        weights = bootstrap_weights(len(per_block["rows"]), 1000, seed=0)
        return error_records(("greedy", "head", 2), totals, {0: per_block}, weights)[-1]  # all heads together

    one = {name: rng.uniform(1, 2, (1, 2)) for name in names}
    same = records({name: np.repeat(value, 8, 0) for name, value in one.items()})
    for metric in ("rel_error", "rel_error_zero", "tv", "kl"):
        assert same[f"{metric}_low"] == pytest.approx(same[metric]) and same[f"{metric}_high"] == pytest.approx(same[metric])
    distinct = {name: rng.uniform(1, 2, (8, 2)) for name in names}
    few, many = records(distinct), records({name: np.tile(value, (8, 1)) for name, value in distinct.items()})
    for metric in ("rel_error", "rel_error_zero", "tv", "kl"):
        assert few[f"{metric}_low"] < few[metric] < few[f"{metric}_high"]
        assert many[f"{metric}_high"] - many[f"{metric}_low"] < 0.6 * (few[f"{metric}_high"] - few[f"{metric}_low"])


@pytest.mark.integration  # runs a real model by name
def test_reconstruct_cli_and_bad_inputs(capsys, tmp_path, store):
    out = ["--out", str(tmp_path / "r"), "--no-progress"]
    code, stdout, _ = run_cli(
        capsys, "reconstruct", str(store.path), "--ks", "4,16", "--select", "greedy,stride", "--scope", "layer", *out
    )
    assert code == 0 and "wrote reconstruct result" in stdout
    loaded = attnlens.load_result(tmp_path / "r")
    assert set(loaded.table.strategy) == {"greedy", "stride"} and (tmp_path / "r" / "figures" / "error_vs_k.png").is_file()
    bad = ["--out", str(tmp_path / "bad"), "--no-progress"]
    assert_one_line_error(
        *run_cli(capsys, "reconstruct", str(store.path), "--ks", "4,17", *bad)[::2], "larger than the 16 valid keys"
    )
    assert_one_line_error(*run_cli(capsys, "reconstruct", str(store.path), "--ks", "0,4", *bad)[::2], "selects nothing")
    assert_one_line_error(*run_cli(capsys, "reconstruct", str(store.path), "--ks", ",", *bad)[::2], "--ks is empty")
    assert_one_line_error(
        *run_cli(capsys, "reconstruct", str(store.path), "--rows", "per-query", "--eval-fraction", "0.8", *bad)[::2],
        "from 10 sequences",
        "at least 17 sequences",
    )
    assert_one_line_error(
        *run_cli(capsys, "reconstruct", str(store.path), "--plug-in", "--model", "minilm-l3", *bad)[::2],
        "made with model 'minilm-l6'",
    )
    assert_one_line_error(*run_cli(capsys, "reconstruct", str(store.path), "--plug-in", *bad)[::2], "give --model")
    assert_one_line_error(*run_cli(capsys, "reconstruct", str(store.path), "--select", "best", *bad)[::2], "--select best")
    assert_one_line_error(
        *run_cli(capsys, "reconstruct", str(store.path), "--select", "local+global", *bad)[::2], "--rows per-query"
    )


# ------------------------------------------------------------------ tables and figures


@pytest.fixture(scope="module")
def with_plug_in(store, minilm_l6):
    """k up to n = 16, where the reconstruction is exact, with the plug-in judged by the hidden objective."""
    return reconstruct(
        store, model=minilm_l6, ks=[2, 8, 16], strategies=["greedy", "random"], scopes=["head"], plug_in=True, progress=False
    )


def test_no_reconstruct_table_repeats_a_column(with_plug_in):
    assert with_plug_in.plug_in["objective"].iloc[0] == "hidden"
    for name in ("table", "plug_in"):
        assert identical_columns(with_plug_in.tables[name]) == [], name


def with_task(result) -> ReconstructResult:
    """The plug-in table with made-up accuracies for k > 2 only, as when a task judged some runs."""
    plug = result.plug_in.copy()
    plug["accuracy"] = np.where(plug["k"] > 2, 0.7, np.nan)
    plug["accuracy_low"], plug["accuracy_high"] = plug["accuracy"] - 0.05, plug["accuracy"] + 0.05
    task = {"task": "made-up", "protocol": "probe", "held_out_rows": list(range(64)), "unmodified_accuracy": 0.75,
            "majority_accuracy": 0.5}  # fmt: skip
    return ReconstructResult({**result.meta, "task": task}, {**result.tables, "plug_in": plug}, result.arrays)


def test_k_ticks_are_exactly_the_k_values_each_figure_plots(with_plug_in):
    import matplotlib.pyplot as plt

    from attnlens.figures import reconstruct as figures

    result = with_task(with_plug_in)
    plots = {
        "error_vs_k": figures.plot_error_vs_k,
        "tv_vs_k": lambda r: figures.plot_error_vs_k(r, metric="tv"),
        "fidelity_vs_k": figures.plot_fidelity_vs_k,
        "accuracy_vs_k": figures.plot_accuracy_vs_k,
    }
    ticks = {}
    for name, plot in plots.items():
        ax = plot(result)
        drawn = {x for line in ax.lines if line.get_marker() == "o" for x in line.get_xdata()}
        ticks[name] = sorted(int(round(tick)) for tick in ax.get_xticks())
        assert ticks[name] == sorted(drawn), (name, "a tick for every k drawn, and none for a k not drawn")
        assert [label.get_text() for label in ax.get_xticklabels()] == [str(k) for k in ticks[name]]
        plt.close(ax.figure)
    assert 16 not in ticks["error_vs_k"] and 16 in ticks["fidelity_vs_k"], "k = n: exact, drawn only where not 0 on a log axis"
    assert 2 not in ticks["accuracy_vs_k"], "the task judged no run with k = 2"


def _band_extents(band) -> dict[float, tuple[float, float]]:
    """x → (lowest, highest) y of a filled band's outline."""
    extents: dict[float, list[float]] = {}
    for x, y in band.get_paths()[0].vertices:
        extents.setdefault(round(float(x), 9), []).append(float(y))
    return {x: (min(ys), max(ys)) for x, ys in extents.items()}


def test_error_figures_draw_every_lines_interval_as_a_band(with_plug_in):
    """Each (strategy, scope) line of error_vs_k, tv_vs_k and error_vs_flops has a band behind
    it spanning exactly the table's 95% interval at every point drawn."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from attnlens.figures import reconstruct as figures

    overall = with_plug_in.table[with_plug_in.table.layer == -1]
    n = with_plug_in.meta["n"]
    plots = {
        "error_vs_k": (figures.plot_error_vs_k, "rel_error", lambda rows: rows.k),
        "tv_vs_k": (lambda r: figures.plot_error_vs_k(r, metric="tv"), "tv", lambda rows: rows.k),
        "error_vs_flops": (figures.plot_error_vs_flops, "rel_error", lambda rows: 100 * (1 - rows.flops_ratio)),
    }
    for name, (plot, metric, x_of) in plots.items():
        ax = plot(with_plug_in)
        bands = [_band_extents(band) for band in ax.collections if isinstance(band, PolyCollection)]
        groups = list(overall.groupby(["strategy", "scope"]))
        assert len(bands) == len(groups), name
        for (strategy, scope), rows in groups:
            rows = rows[(rows[metric] > 1e-9 * overall[metric].max()) & ((rows.k < n) | (name == "error_vs_flops"))]
            assert (rows[f"{metric}_low"] < rows[metric]).all() and (rows[metric] < rows[f"{metric}_high"]).all()
            expected = {
                round(float(x), 9): (low, high) for x, low, high in zip(x_of(rows), rows[f"{metric}_low"], rows[f"{metric}_high"])
            }
            assert any(band.keys() == expected.keys() and all(band[x] == pytest.approx(expected[x], rel=1e-9) for x in expected)
                       for band in bands), (name, strategy, scope)  # fmt: skip
        assert "95%" in ax.get_title(), name
        plt.close(ax.figure)


def test_k_axis_mentions_pairs_mode_only_when_it_was_run(with_plug_in):
    import matplotlib.pyplot as plt

    from attnlens.figures.reconstruct import plot_error_vs_k

    table = with_plug_in.table
    paired = pd.concat([table, table[table.strategy == "greedy"].assign(strategy="greedy-pairs")], ignore_index=True)
    with_pairs = ReconstructResult(with_plug_in.meta, {**with_plug_in.tables, "table": paired}, with_plug_in.arrays)
    for result, pairs in ((with_plug_in, False), (with_pairs, True)):
        ax = plot_error_vs_k(result)
        assert ("pairs" in ax.get_xlabel()) == pairs, ax.get_xlabel()
        assert ("greedy-pairs" in [text.get_text().split(",")[0] for text in ax.get_legend().get_texts()]) == pairs
        plt.close(ax.figure)
