"""DAM: layouts against hand-built masks, the masked forward pass, what λ does, and the rules."""

from __future__ import annotations

import json

import matplotlib.text
import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens import Capture
from attnlens.analysis.dam import LAYOUTS, DamResult, DamTrainer, evaluate_mask, parse_tau, rescue_rows
from attnlens.analysis.evaluation import removal, valid_masks
from attnlens.analysis.objectives import Objective
from attnlens.data.positions import class_masks, exclusive_index
from tiny_models import identical_columns, save_tiny

TINY = dict(seq_len=16, train_seqs=4, eval_seqs=2, batch_size=2, bootstrap=50, patterns=False, progress=False)


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory, minilm_l6):
    return attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("causal"), minilm_l6, "causal")))


@pytest.fixture(scope="module")
def setting(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids[:3])
    valid = valid_masks(minilm_l6, kjv_blocks.ids)
    classes = ("self", "prev", "cls", "punct", "other")
    context = exclusive_index(class_masks(ids, minilm_l6, classes))
    return ids, valid, classes, context


def test_layouts_expand_like_hand_built_masks(minilm_l6, setting):
    ids, valid, classes, context = setting
    n, layers, heads = ids.shape[1], 6, 12
    generator = torch.Generator().manual_seed(0)

    structured = LAYOUTS["structured"](layers, heads, n, valid, len(classes))
    values = torch.randn(structured.shape, generator=generator)
    expanded = structured.expand(values, 3, context)[0]
    for h, i, j in [(0, 0, 0), (5, 3, 9), (11, 31, 0), (7, 10, 4)]:
        assert expanded[h, i, j] == values[h, abs(i - j)]
    assert torch.equal(structured.expand(values, 0, context), structured.expand(values, 5, context)), "shared by layers"
    counts = structured.counts(context)
    assert counts[0, 0] == n * layers * 3 and counts[0, 5] == 2 * (n - 5) * layers * 3
    assert counts[0].sum() == n * n * layers * 3

    per_class = LAYOUTS["class"](layers, heads, n, valid, len(classes))
    values = torch.randn(per_class.shape, generator=generator)
    expanded = per_class.expand(values, 2, context)  # (batch, head, n, n)
    for b, h, i, j in [(0, 0, 0, 0), (1, 4, 5, 4), (2, 9, 7, 20), (0, 11, 31, 31)]:
        assert expanded[b, h, i, j] == values[2, h, context[b, i, j]]
    counts = per_class.counts(context)
    assert counts.shape == (layers, heads, len(classes)) and counts[0, 0].sum() == 3 * n * n
    assert counts[0, 0, 0] == (context == 0).sum()

    unstructured = LAYOUTS["unstructured"](layers, heads, n, valid, len(classes))
    values = torch.randn(unstructured.shape, generator=generator)
    assert torch.equal(unstructured.expand(values, 4, context)[0], values[4])
    assert unstructured.counts(context).sum() == layers * heads * n * n * 3


@pytest.mark.parametrize("variant, removal_mode", [("structured", "1e4"), ("class", "inf"), ("unstructured", "1e4")])
def test_mask_forward_equals_a_hard_masked_forward(minilm_l6, setting, variant, removal_mode):
    """The training intervention's forward value is the hard mask, exactly removed."""
    ids, valid, classes, context = setting
    layout = LAYOUTS[variant](6, 12, ids.shape[1], valid, len(classes))
    trainer = DamTrainer(layout, lam=0.0, steps=1, removal=removal_mode).start(minilm_l6)
    noisy = torch.randn(layout.shape, generator=torch.Generator().manual_seed(1))
    hard = (noisy > 0).float()
    with torch.no_grad():
        with Capture(intervene=trainer.intervention(hard, context, noisy), record=False):
            dam_hidden = minilm_l6.forward(ids).last_hidden_state
        removed = [~rescue_rows(layout.expand(noisy, layer, context), valid[layer]) for layer in range(6)]
        with Capture(intervene=removal(lambda layer, v: removed[layer]), record=False):
            hand_hidden = minilm_l6.forward(ids).last_hidden_state
    assert torch.allclose(dam_hidden, hand_hidden, atol=1e-5)


def test_gradient_scale_multiplies_the_task_gradient(minilm_l6, setting):
    ids, valid, classes, context = setting
    objective = Objective(minilm_l6)
    batch = objective.prepare(ids)
    layout = LAYOUTS["structured"](6, 12, ids.shape[1], valid, len(classes))
    grads = []
    for scale in (1.0, 10.0):
        trainer = DamTrainer(layout, lam=0.0, steps=1, gradient_scale=scale).start(minilm_l6)
        with attnlens.analysis.evaluation.frozen(minilm_l6.model):
            trainer.step(objective, batch, context)
        grads.append(trainer.logits_.grad.clone())
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[1], 10 * grads[0], rtol=1e-4, atol=1e-12)


def test_lambda_zero_keeps_almost_everything_and_a_large_lambda_removes(minilm_l6, kjv):
    # default learning rate and initial keep-probability; 60 steps let λ = 3 take logits from +2.2 below 0
    result = attnlens.dam(
        minilm_l6,
        corpus=kjv,
        variant="class",
        lambdas=[0.0, 3.0],
        steps=60,
        **{**TINY, "seq_len": 32, "train_seqs": 8, "eval_seqs": 4, "batch_size": 4},
    )
    table = result.table.set_index("lambda")
    assert table.loc[0.0, "sparsity"] < 0.05
    assert table.loc[3.0, "sparsity"] > 0.5
    assert table.loc[3.0, "delta"] > table.loc[0.0, "delta"]
    keep = result.keep_summary.set_index(["lambda", "class"])["keep_probability"]
    assert (keep.loc[0.0] > 0.8).all() and keep.loc[3.0].mean() < keep.loc[0.0].mean()


def test_reported_sparsity_is_the_share_of_zero_attention_weights(minilm_l6, setting):
    ids, valid, classes, context = setting
    objective = Objective(minilm_l6)
    batch = objective.prepare(ids)
    layout = LAYOUTS["structured"](6, 12, ids.shape[1], valid, len(classes))
    logits = torch.full(layout.shape, -1.0)
    logits[:, 1] = 1.0  # keep only the neighbours (offset 1): every row keeps 1 or 2 keys
    logits[3, :] = -2.0  # head 3 keeps nothing: its rows keep their largest logits (all -2: every key)
    masks = [class_masks(ids, minilm_l6, classes)]
    judged = evaluate_mask(layout, logits, objective, [batch], [context], masks)
    removed = [~rescue_rows(layout.expand(logits, layer, context), valid[layer]) for layer in range(6)]
    with torch.no_grad(), Capture(weights=True, intervene=removal(lambda layer, v: removed[layer])) as cap:
        minilm_l6.forward(ids)
    zeros = np.mean([float((cap.weights[layer] == 0).float().mean()) for layer in range(6)])
    assert float(judged["sparsity"]) == pytest.approx(zeros)
    n = ids.shape[1]
    assert float(judged["sparsity"]) == pytest.approx(11 / 12 * (1 - (2 * n - 2) / n**2))
    assert float(judged["rows_rescued"]) == pytest.approx(1 / 12)
    self_keep = judged["keep_probability"][:, :, 0]
    assert np.allclose(self_keep, torch.sigmoid(torch.tensor(-1.0)).item()) or np.allclose(
        self_keep[:, 3], torch.sigmoid(torch.tensor(-2.0)).item()
    )


def test_same_seed_same_masks(minilm_l6, kjv):
    runs = [attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.1], steps=3, seed=seed, **TINY) for seed in (0, 0, 1)]
    assert np.array_equal(runs[0].logits, runs[1].logits)
    pd.testing.assert_frame_equal(runs[0].training, runs[1].training)
    assert not np.array_equal(runs[0].logits, runs[2].logits)


def test_train_weights_leaves_the_model_as_it_was(minilm_l6, kjv):
    before = {name: p.detach().clone() for name, p in minilm_l6.model.named_parameters()}
    flags = {name: p.requires_grad for name, p in minilm_l6.model.named_parameters()}
    tuned = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.1], steps=3, train_weights=True, weights_lr=1e-3, **TINY)
    frozen = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.1], steps=3, **TINY)
    for name, p in minilm_l6.model.named_parameters():
        assert torch.equal(p, before[name]) and p.requires_grad == flags[name], name
    assert not np.array_equal(tuned.logits, frozen.logits), "fine-tuning changed what the masks saw"
    assert tuned.meta["settings"]["train_weights"] and not frozen.meta["settings"]["train_weights"]


def test_tau_schedule():
    assert parse_tau("0.5") == (0.5, 0.5) and parse_tau("2:0.1") == (2.0, 0.1)
    trainer = DamTrainer(None, lam=0.0, steps=11, tau=(2.0, 0.02))
    assert trainer.temperature(0) == pytest.approx(2.0) and trainer.temperature(10) == pytest.approx(0.02)
    assert trainer.temperature(5) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "settings, phrase",
    [
        (dict(lambdas=[0.1, -1e-3]), "lambdas -0.001: λ must be 0 or more"),
        (dict(tau="0"), "tau 0: the temperature τ must be greater than 0"),
        (dict(tau="1:-0.5"), "tau -0.5: the temperature"),
        (dict(tau="hot"), "tau 'hot' is not a number"),
        (dict(steps=0), "steps 0 must be at least 1"),
        (dict(variant="dense"), "variant dense is unknown"),
        (dict(init_keep=1.0), "init_keep 1 must be a probability"),
        (dict(removal="zero"), "removal zero is unknown"),
        (dict(classes="self,band(0)"), "band(0): the width"),
    ],
)
def test_bad_settings(minilm_l6, kjv, settings, phrase):
    with pytest.raises(attnlens.AttnlensError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        attnlens.dam(minilm_l6, corpus=kjv, **{**TINY, **settings})


def test_causal_model_per_class_masks(tiny_causal, kjv):
    with pytest.raises(attnlens.AttnlensError, match="class 'next' never occurs"):
        attnlens.dam(tiny_causal, corpus=kjv, variant="class", classes="self,next", steps=2, **TINY)
    result = attnlens.dam(tiny_causal, corpus=kjv, variant="class", lambdas=[0.0], steps=2, **TINY)
    assert result.meta["settings"]["classes_dropped"] == ["next"]
    assert "next" not in set(result.keep["class"])
    assert result.logits.shape == (1, 2, 4, len(result.meta["settings"]["layout_classes"]))
    assert result.table["sparsity"].between(0, 1).all() and np.isfinite(result.table["loss"]).all()
    # a next-token loss of its own: the table keeps it beside its change against the unmodified model
    unmodified = (result.table["loss"] - result.table["delta"]).to_numpy()
    np.testing.assert_allclose(unmodified, result.meta["baseline"]["loss"], rtol=1e-6)
    assert result.meta["baseline"]["loss"] > 1


def test_save_load_round_trip_with_patterns_and_figures(minilm_l6, kjv, tmp_path):
    result = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.0, 0.5], steps=3, **{**TINY, "patterns": True})
    assert set(result.patterns["pattern"]) == {"strided", "fixed", "local", "bigbird", "star", "no-diagonal"}
    assert result.patterns["sparsity"].between(0, 1).all()
    no_diagonal = result.patterns.set_index("pattern").loc["no-diagonal"]
    assert no_diagonal["sparsity"] == pytest.approx(1 / 16)
    matched = result.matched()
    assert len(matched) == 2 * 6
    out = result.save(tmp_path / "dam")
    assert not (out / "figures").exists(), "saving does not draw"
    result.save_figures(out / "figures")
    meta = json.loads((out / "result.json").read_text())
    assert meta["kind"] == "dam" and meta["format_version"] == 1 and meta["settings"]["variant"] == "structured"
    loaded = DamResult.load(out)
    assert set(loaded.tables) == set(result.tables)
    for name in result.tables:
        pd.testing.assert_frame_equal(loaded.tables[name], result.tables[name], check_dtype=False)
    np.testing.assert_array_equal(loaded.logits, result.logits)
    for figure in ("keep_per_class", "loss_vs_sparsity", "masks", "training"):
        assert (out / "figures" / f"{figure}.png").stat().st_size > 10_000, figure


@pytest.mark.slow
def test_gemma_dam_runs_end_to_end(gemma3, kjv):
    result = attnlens.dam(gemma3, corpus=kjv, variant="class", lambdas=[1.0], steps=2, **{**TINY, "train_seqs": 2})
    assert result.meta["settings"]["objective"] == "clm" and result.logits.shape[1:3] == (18, 4)
    assert np.isfinite(result.table["loss"]).all() and result.meta["baseline"]["loss"] > 0.5


# ------------------------------------------------------------------ tables and figures


@pytest.fixture(scope="module")
def sparse_run(minilm_l6, kjv):
    """Masks that do remove something (a high learning rate makes ten steps enough), and the patterns."""
    return attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.03, 0.3, 3.0], steps=10, lr=0.5, **{**TINY, "patterns": True})


def test_no_dam_table_repeats_a_column(sparse_run):
    assert sparse_run.table["sparsity"].max() > 0.3 and sparse_run.meta["settings"]["objective"] == "hidden"
    for name, table in sparse_run.tables.items():
        assert identical_columns(table) == [], name
    assert "delta" in sparse_run.table and "delta" in sparse_run.patterns
    assert "hidden" in sparse_run.meta["columns"]["loss"], "where the loss went is said"


def line_points(ax) -> np.ndarray:
    """Display points every half pixel or closer along every line and error bar of ``ax``."""
    pieces = []
    polylines = [line.get_transform().transform(np.asarray(line.get_xydata(), float)) for line in ax.lines]
    for collection in ax.collections:
        polylines += [collection.get_transform().transform(np.asarray(segment, float)) for segment in collection.get_segments()]
    for xy in polylines:
        xy = xy[np.isfinite(xy).all(1)]
        pieces.append(xy)
        for start, end in zip(xy[:-1], xy[1:]):
            steps = int(2 * np.hypot(*(end - start))) + 2
            pieces.append(start + (end - start) * np.linspace(0, 1, steps)[:, None])
    return np.concatenate(pieces)


def crowded(result) -> DamResult:
    """The λ points moved onto pattern points, where lines meet them from every side, and a task
    table made of the same numbers, so that both figures with λ labels are crowded."""
    patterns = result.patterns.sort_values("sparsity").reset_index(drop=True)
    picked = patterns.iloc[np.linspace(2, len(patterns) - 3, len(result.table)).astype(int)]
    table = result.table.copy()
    table[["sparsity", "delta"]] = picked[["sparsity", "delta"]].to_numpy()
    table["delta_low"], table["delta_high"] = table["delta"] - 0.01, table["delta"] + 0.01
    judged = pd.concat([table.assign(kind="dam"), patterns.assign(kind="pattern")], ignore_index=True)
    task = judged.assign(task_sparsity=judged["sparsity"], accuracy=0.9 - judged["delta"])
    task["accuracy_low"], task["accuracy_high"] = task["accuracy"] - 0.01, task["accuracy"] + 0.01
    meta = {**result.meta, "task": {"task": "made-up", "protocol": "probe", "held_out_rows": list(range(64)),
                                    "unmodified_accuracy": 0.9, "majority_accuracy": 0.5}}  # fmt: skip
    return DamResult(meta, {**result.tables, "summary": table, "task": task}, result.arrays)


@pytest.mark.parametrize("figure", ["loss_vs_sparsity", "accuracy_vs_sparsity"])
def test_lambda_labels_sit_clear_of_every_line(sparse_run, figure):
    import matplotlib.pyplot as plt

    from attnlens.figures import dam as figures

    result = crowded(sparse_run)
    ax = getattr(figures, f"plot_{figure}")(result)
    ax.figure.draw_without_rendering()
    renderer = ax.figure.canvas.get_renderer()
    points = line_points(ax)
    values = [f"{lam:g}" for lam in result.table["lambda"]]
    labels = [text for text in ax.texts if text.get_text().split()[-1:] and text.get_text().split()[-1] in values]
    assert sorted(label.get_text().split()[-1] for label in labels) == sorted(values), "one label per λ"
    for label in labels:
        box = matplotlib.text.Text.get_window_extent(label, renderer)  # the text, not its leader line
        gap_x = np.maximum.reduce([box.x0 - points[:, 0], points[:, 0] - box.x1, np.zeros(len(points))])
        gap_y = np.maximum.reduce([box.y0 - points[:, 1], points[:, 1] - box.y1, np.zeros(len(points))])
        assert np.hypot(gap_x, gap_y).min() > 3, (label.get_text(), "sits on a line")
    plt.close(ax.figure)
