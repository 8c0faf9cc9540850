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
from attnlens.analysis.changes import Batch, rescue_rows
from attnlens.analysis.dam import LAYOUTS, DamResult, DamSettings, DamTrainer, StoppingRule
from attnlens.analysis.dam.judging import MaskSplit, evaluate_mask
from attnlens.analysis.dam.reference import top_share
from attnlens.analysis.dam.settings import parse_tau
from attnlens.analysis.dam.training import balancing_lambda
from attnlens.analysis.evaluation import removal, valid_masks
from attnlens.analysis.experiment import Split
from attnlens.analysis.objectives import Objective
from attnlens.data.positions import class_masks, exclusive_index
from tiny_models import identical_columns, save_tiny

# polish_rounds=0: the swap search that finishes a mask has tests of its own, in test_dam_convergence.py
TINY = dict(
    seq_len=16, train_seqs=4, eval_seqs=2, batch_size=2, bootstrap=50, patterns=False, progress=False, stop_window=2,
    check_window=2, polish_rounds=0,
)  # fmt: skip
SMALL = {**TINY, "seq_len": 32, "train_seqs": 8, "eval_seqs": 4, "batch_size": 4}


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

    structured = LAYOUTS["structured"](layers, heads, n, valid, classes)
    values = torch.randn(structured.shape, generator=generator)
    expanded = structured.expand(values, 3, context)[0]
    for h, i, j in [(0, 0, 0), (5, 3, 9), (11, 31, 0), (7, 10, 4)]:
        assert expanded[h, i, j] == values[h, abs(i - j)]
    assert torch.equal(structured.expand(values, 0, context), structured.expand(values, 5, context)), "shared by layers"
    counts = structured.counts(context)
    assert counts[0, 0] == n * layers * 3 and counts[0, 5] == 2 * (n - 5) * layers * 3
    assert counts[0].sum() == n * n * layers * 3

    per_class = LAYOUTS["class"](layers, heads, n, valid, classes)
    values = torch.randn(per_class.shape, generator=generator)
    expanded = per_class.expand(values, 2, context)  # (batch, head, n, n)
    for b, h, i, j in [(0, 0, 0, 0), (1, 4, 5, 4), (2, 9, 7, 20), (0, 11, 31, 31)]:
        assert expanded[b, h, i, j] == values[2, h, context[b, i, j]]
    counts = per_class.counts(context)
    assert counts.shape == (layers, heads, len(classes)) and counts[0, 0].sum() == 3 * n * n
    assert counts[0, 0, 0] == (context == 0).sum()

    unstructured = LAYOUTS["unstructured"](layers, heads, n, valid, classes)
    values = torch.randn(unstructured.shape, generator=generator)
    assert torch.equal(unstructured.expand(values, 4, context)[0], values[4])
    assert unstructured.counts(context).sum() == layers * heads * n * n * 3


@pytest.mark.parametrize("variant, removal_mode", [("structured", "1e4"), ("class", "inf"), ("unstructured", "1e4")])
def test_mask_forward_equals_a_hard_masked_forward(minilm_l6, setting, variant, removal_mode):
    """The training intervention's forward value is the hard mask, exactly removed."""
    ids, valid, classes, context = setting
    layout = LAYOUTS[variant](6, 12, ids.shape[1], valid, classes)
    trainer = DamTrainer(layout, DamSettings.build(steps=2, stop_window=2, removal=removal_mode), lam=0.0).start(minilm_l6)
    noisy = torch.randn(layout.shape, generator=torch.Generator().manual_seed(1))
    hard = (noisy > 0).float()
    with torch.no_grad():
        with Capture(intervene=trainer.intervention(hard, context, noisy), record=False):
            dam_hidden = minilm_l6.forward(ids).last_hidden_state
        removed = [~rescue_rows(layout.expand(noisy, layer, context), valid[layer]) for layer in range(6)]
        with Capture(intervene=removal(lambda layer, v: removed[layer]), record=False):
            hand_hidden = minilm_l6.forward(ids).last_hidden_state
    assert torch.allclose(dam_hidden, hand_hidden, atol=1e-5)


def test_renormalised_gate_forward_is_the_hard_mask_and_removed_positions_get_a_gradient(minilm_l6, setting):
    """removal="renormalise": the forward pass equals removing the hard mask's positions by -inf;
    unlike the additive -1e4, whose softmax Jacobian carries the removed weight (0), the
    logits of removed positions receive a gradient."""
    ids, valid, classes, context = setting
    layout = LAYOUTS["unstructured"](6, 12, ids.shape[1], valid, classes)
    noisy = torch.randn(layout.shape, generator=torch.Generator().manual_seed(1))
    removed = [~rescue_rows(layout.expand(noisy, layer, context), valid[layer]) for layer in range(6)]
    with torch.no_grad(), Capture(intervene=removal(lambda layer, v: removed[layer]), record=False):
        hand_hidden = minilm_l6.forward(ids).last_hidden_state
    gradients = {}
    for mode in ("renormalise", "1e4"):
        trainer = DamTrainer(layout, DamSettings.build(steps=2, stop_window=2, removal=mode), lam=0.0).start(minilm_l6)
        logits = noisy.clone().requires_grad_(True)
        soft = torch.sigmoid(logits)
        mask = (logits > 0).float() + soft - soft.detach()  # straight-through, as DamTrainer.sample makes it
        intervene = (
            {"intervene_weights": trainer.gate(mask, context, noisy)}
            if mode == "renormalise"
            else {"intervene": trainer.intervention((logits > 0).float() + (soft - soft.detach()) / 1e4, context, noisy)}
        )
        with attnlens.analysis.evaluation.frozen(minilm_l6.model), Capture(record=False, **intervene):
            hidden = minilm_l6.forward(ids).last_hidden_state
        if mode == "renormalise":
            assert torch.allclose(hidden, hand_hidden, atol=1e-5)
        hidden.square().sum().backward()
        gradients[mode] = logits.grad
    gone = torch.stack(removed)[:, 0] & valid[:, None]  # (layer, head, n, n) valid positions removed in every block
    assert gone.any()
    assert gradients["renormalise"][gone].abs().max() > 0, "a removed position learns whether to come back"
    assert gradients["1e4"][gone].abs().max() == 0, "the additive -1e4 gives removed positions no gradient"


def test_gradient_scale_multiplies_the_task_gradient(minilm_l6, setting):
    ids, valid, classes, context = setting
    objective = Objective(minilm_l6)
    batch = objective.prepare(ids)
    layout = LAYOUTS["structured"](6, 12, ids.shape[1], valid, classes)
    grads = []
    for scale in (1.0, 10.0):
        trainer = DamTrainer(layout, DamSettings.build(steps=2, stop_window=2, removal="1e4"), lam=0.0).start(minilm_l6)
        trainer.gradient_scale = scale
        with attnlens.analysis.evaluation.frozen(minilm_l6.model):
            trainer.step(objective, batch, context)
        grads.append(trainer.logits_.grad.clone())
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[1], 10 * grads[0], rtol=1e-4, atol=1e-12)


@pytest.mark.slow
def test_lambda_zero_keeps_almost_everything_and_a_large_lambda_removes(minilm_l3, kjv):
    # default learning rate and initial keep-probability; in 60 steps λ = 10 takes minilm-l3's logits from +2.2 below 0
    result = attnlens.dam(
        minilm_l3,
        corpus=kjv,
        variant="class",
        lambdas=[0.0, 10.0],
        steps=60,
        **{**TINY, "seq_len": 32, "train_seqs": 8, "eval_seqs": 4, "batch_size": 4, "stop_window": 60},
    )
    table = result.table.set_index("lambda")
    assert table.loc[0.0, "sparsity"] < 0.05
    assert table.loc[10.0, "sparsity"] > 0.5
    assert table.loc[10.0, "delta"] > table.loc[0.0, "delta"]
    keep = result.keep_summary.set_index(["lambda", "class"])["keep_probability"]
    assert (keep.loc[0.0] > 0.8).all() and keep.loc[10.0].mean() < keep.loc[0.0].mean()


def test_reported_sparsity_is_the_share_of_zero_attention_weights(minilm_l6, setting):
    ids, valid, classes, context = setting
    objective = Objective(minilm_l6)
    batch = objective.prepare(ids)
    layout = LAYOUTS["structured"](6, 12, ids.shape[1], valid, classes)
    logits = torch.full(layout.shape, -1.0)
    logits[:, 1] = 1.0  # keep only the neighbours (offset 1): every row keeps 1 or 2 keys
    logits[3, :] = -2.0  # head 3 keeps nothing: its rows keep their largest logits (all -2: every key)
    judged = evaluate_mask(
        layout, logits, objective, MaskSplit.of(Split([batch], [Batch(ids, minilm_l6, 0)], ids), layout, classes)
    )
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
    trainer = DamTrainer(None, DamSettings.build(steps=11, stop_window=2, tau="2:0.02"), lam=0.0)
    assert trainer.temperature(0) == pytest.approx(2.0) and trainer.temperature(10) == pytest.approx(0.02)
    assert trainer.temperature(5) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "settings, phrase",
    [
        (dict(lambdas=[0.1, -1e-3]), "lambdas -0.001: λ must be 0 or more"),
        (dict(tau="0"), "tau 0: the temperature τ must be greater than 0"),
        (dict(tau="1:-0.5"), "tau -0.5: the temperature"),
        (dict(tau="hot"), "tau 'hot' is not a number"),
        (dict(steps=0, stop_window=20), "steps 0 must be at least 20"),
        (dict(steps=19, stop_window=20), "the stopping rule needs stop_window (20) steps"),
        (dict(stop_window=1), "stop_window 1 must be at least 2"),
        (dict(stop_flips=0.0), "stop_flips 0 must be a probability"),
        (dict(variant="dense"), "variant dense is unknown"),
        (dict(init="star(1)"), "init star(1): unknown pattern star"),
        (dict(init="local(16)"), "init local(16): give local's window between 1 and n - 1 = 15"),
        (dict(init="local"), "init local: give local's window"),
        (dict(init="no-diagonal(2)"), "no-diagonal takes no parameter"),
        (dict(sparsity=[0.9], lambdas=[0.1]), "give lambdas or sparsity, not both"),
        (dict(sparsity=[1.0]), "sparsity 1 must be a probability"),
        (dict(sparsity=[0.0]), "sparsity 0 must be a probability"),
        (dict(sparsity=[0.9], dual_start=0.0), "dual_start 0 must be greater than 0"),
        (dict(mask_seeds=0), "mask_seeds 0 must be at least 1"),
        (dict(check_lr=0.0), "check_lr 0: the least learning rate the check judges at"),
        (dict(check_window=1), "check_window 1 must be at least 2"),
        (dict(reference="greedy"), "reference greedy is unknown"),
        (dict(reference="dam", lambdas=[0.1]), "reference searches at a target sparsity"),
        (dict(reference="dam", sparsity=[0.9], train_weights=True), "cannot follow train_weights"),
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
    assert result.meta["settings"]["classes"] == ["self", "prev", "sink", "punct", "other"], "a decoder's defaults"
    assert "next" not in set(result.keep["class"]) and "sink" in set(result.keep["class"])
    assert result.logits.shape == (1, 2, 4, len(result.meta["settings"]["layout_classes"]))
    assert result.table["sparsity"].between(0, 1).all() and np.isfinite(result.table["loss"]).all()
    # a next-token loss of its own: the table keeps it beside its change against the unmodified model
    unmodified = (result.table["loss"] - result.table["delta"]).to_numpy()
    np.testing.assert_allclose(unmodified, result.meta["baseline"]["loss"], rtol=1e-6)
    assert result.meta["baseline"]["loss"] > 1


def test_save_load_round_trip_with_patterns_and_figures(minilm_l6, kjv, tmp_path):
    result = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.0, 0.5], steps=3, **{**TINY, "patterns": True})
    assert set(result.patterns["pattern"]) == {"strided", "fixed", "band", "local", "bigbird", "no-diagonal"}
    assert result.patterns["sparsity"].between(0, 1).all()
    no_diagonal = result.patterns.set_index("pattern").loc["no-diagonal"]
    assert no_diagonal["sparsity"] == pytest.approx(1 / 16)
    everything = result.matched(within=1.0)
    assert len(everything) == 2 * 6, "within 1: every pattern's nearest point, for every λ"
    matched = result.matched()
    assert (abs(matched["sparsity"] - matched["dam_sparsity"]) <= 0.03).all()
    close = abs(everything["sparsity"] - everything["dam_sparsity"]) <= 0.03
    assert len(matched) == int(close.sum()), "exactly the nearest points within 3 points"
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
    pd.testing.assert_frame_equal(loaded.compared(within=1.0), result.compared(within=1.0), check_dtype=False)
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
    return attnlens.dam(
        minilm_l6, corpus=kjv, lambdas=[0.03, 0.3, 3.0], steps=10, lr=0.5, **{**TINY, "patterns": True, "stop_window": 10}
    )


def test_no_dam_table_repeats_a_column(sparse_run):
    assert sparse_run.table["sparsity"].max() > 0.3 and sparse_run.meta["settings"]["objective"] == "hidden"
    for name, table in sparse_run.tables.items():
        assert identical_columns(table) == [], name
    assert "delta" in sparse_run.table and "delta" in sparse_run.patterns
    assert "hidden" in sparse_run.meta["columns"]["loss"], "where the loss went is said"


def line_points(ax) -> np.ndarray:
    """Display points every half pixel or closer along every line and error bar of ``ax``."""
    pieces = []
    polylines = []
    for line in ax.lines:
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        drawn = line.get_linestyle() not in ("None", "", " ")  # markers alone (error-bar caps) are points, not a polyline
        polylines += [xy] if drawn else [point[None] for point in xy]
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


# ---------------------------------------------------------------------- stopping rule


def _stop_step(curve, rule) -> int | None:
    """The step the rule should stop at, recomputed from the recorded curve (None: never)."""
    for step in range(len(curve)):
        flipped = curve["flipped"].iloc[step]
        if flipped == flipped and flipped < rule.flips and rule.plateaued(list(curve["loss"].iloc[: step + 1])):
            return step
    return None


@pytest.mark.slow
def test_the_stopping_rule_stops_a_mask_that_no_longer_changes_and_not_one_that_does(minilm_l6, kjv):
    # full noise throughout: samples keep dropping positions, so the objective keeps moving a little
    still = dict(lambdas=[0.0], steps=12, lr=1e-7, noise_end=1.0, **{**TINY, "stop_window": 4})
    stopped = attnlens.dam(minilm_l6, corpus=kjv, stop_plateau=10.0, **still)  # any plateau: the mask alone decides
    row = stopped.table.iloc[0]
    assert row["schedule_end"] == "annealed" and row["steps"] == 4, "logits that cannot move: the first window already holds"
    capped = attnlens.dam(minilm_l6, corpus=kjv, stop_plateau=1e-12, **still)  # an objective that never settles that far
    assert capped.table.iloc[0]["schedule_end"] == "cap" and capped.table.iloc[0]["steps"] == 12
    moving = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[3.0], steps=30, lr=0.5, **{**TINY, "stop_window": 3})
    curve = moving.training
    rule = StoppingRule(3, moving.settings["stop_flips"], moving.settings["stop_plateau"], moving.settings["stop_margin"])
    expected = _stop_step(curve, rule)
    assert (curve["flipped"].dropna() > 0).any(), "a mask pushed by a large λ at a large rate flips"
    assert (moving.table.iloc[0]["schedule_end"] == "annealed") == (expected is not None)
    assert moving.table.iloc[0]["steps"] == (expected + 1 if expected is not None else 30)


def test_training_curves_record_hard_density_and_undecided_logits(minilm_l6, kjv):
    result = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.3], steps=4, lr=0.3, **TINY)
    curve = result.training
    assert curve[["density", "hard_density", "undecided"]].apply(lambda c: c.between(0, 1)).all().all()
    # undecided by hand from the final logits: the weighted share of σ(α) in (0.1, 0.9), structured layout (head, offset)
    logits = torch.as_tensor(np.asarray(result.logits[0]))
    n = result.meta["settings"]["seq_len"]
    positions = torch.tensor([float(n) if d == 0 else 2.0 * (n - d) for d in range(n)])  # pairs (i, j) with |i − j| = d
    # a sample keeps a position with probability σ(α / s), s the noise scale of the last step: a cosine from 1 to noise_end
    end, last = result.meta["settings"]["noise_end"], int(curve["step"].iloc[-1])
    scale = end + (1 - end) * 0.5 * (1 + np.cos(np.pi * last / (4 - 1)))
    keep = torch.sigmoid(logits / scale)
    weights = positions[None].expand_as(keep)
    expected = float((weights * ((keep > 0.1) & (keep < 0.9))).sum() / weights.sum())
    assert curve["undecided"].iloc[-1] == pytest.approx(expected, abs=1e-6)
    assert curve["hard_density"].iloc[-1] == pytest.approx(float((weights * (logits > 0)).sum() / weights.sum()), abs=1e-6)


def test_structured_global_layout_by_hand():
    """Offsets decide every position but the cls/sep rows and columns, which four logits per head decide."""
    from attnlens.data.positions import TokenRoles

    n, heads, layers = 6, 2, 3
    valid = torch.ones(layers, n, n, dtype=torch.bool)
    layout = LAYOUTS["structured+global"](layers, heads, n, valid, ())
    cls = torch.zeros(2, n, dtype=torch.bool)
    sep = torch.zeros(2, n, dtype=torch.bool)
    cls[:, 0], sep[0, 5], sep[1, 3] = True, True, True
    roles = TokenRoles(cls, sep, torch.zeros(2, n, dtype=torch.bool), "")
    context = layout.context(Batch(torch.zeros(2, n, dtype=torch.long), None, 0, _cache={"roles": roles}))
    values = torch.randn(layout.shape, generator=torch.Generator().manual_seed(0))
    got = layout.expand(values, 1, context)
    assert got.shape == (2, heads, n, n)
    for b in range(2):
        for i in range(n):
            for j in range(n):
                # priority: cls column, cls row, sep column, sep row, else the offset
                index = n + 1 if cls[b, j] else n if cls[b, i] else n + 3 if sep[b, j] else n + 2 if sep[b, i] else abs(i - j)
                assert torch.equal(got[b, :, i, j], values[:, index]), (b, i, j)
    counts = layout.counts(context)
    assert counts.sum() == heads * layers * n * n * 2, "every valid position of every layer and block, once per head"
    assert counts[0, n + 1] == layers * n * 2, "the cls column: n positions per block and layer"


@pytest.mark.parametrize(
    "variant, init", [("structured", "band(3)"), ("structured+global", "local(2)"), ("unstructured", "bigbird(2)")]
)
def test_warm_start_begins_at_the_pattern(minilm_l6, kjv, variant, init):
    """With `init` a pattern the layout can express, the starting hard mask is exactly the pattern:
    zero steps' worth of training (λ = 0 and a learning rate too small to move a logit)."""
    from attnlens.analysis.patterns import build

    result = attnlens.dam(minilm_l6, corpus=kjv, variant=variant, init=init, lambdas=[0.0], steps=2, lr=1e-9, **TINY)
    n = TINY["seq_len"]
    logits = torch.as_tensor(np.asarray(result.logits[0]))
    layout = LAYOUTS[variant](6, 12, n, torch.ones(6, n, n, dtype=torch.bool), ())
    ids = torch.as_tensor(np.asarray(kjv.blocks(minilm_l6, n=n, num_blocks=1, seed=0).ids))
    roles = attnlens.data.positions.token_roles(ids, minilm_l6)
    name, value = init.removesuffix(")").split("(")
    keep = build(name, n, int(value), roles.cls)
    context = layout.context(Batch(ids, minilm_l6, 0))
    for layer in (0, 5):
        kept = layout.expand(logits, layer, context)[0] > 0  # (head, n, n)
        if name == "bigbird":  # its random keys are drawn per block: the logits keep what every block keeps, at least
            assert (kept >= (build("local", n, int(value), roles.cls)[0] & keep[0])).all()
        elif variant == "structured+global":  # the sep row and column have logits of their own: off them, exactly the pattern
            off = ~(roles.sep[0][:, None] | roles.sep[0][None, :])
            assert torch.equal(kept[:, off], keep[0][off].expand_as(kept[:, off])), (variant, init, layer)
        else:
            assert torch.equal(kept, keep[0].expand_as(kept)), (variant, init, layer)


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory, minilm_l6):
    return attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("mlm"), minilm_l6, "mlm")))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["structured", "unstructured", "structured+global"])
def test_target_sparsity_is_met_within_one_point(tiny_mlm, kjv, variant):
    """Dual ascent moves λ towards each target (a higher target ends at a higher λ) and the run's hard
    mask is judged at the target within one point of sparsity, on the held-out blocks."""
    settings = {**SMALL, "stop_window": 10}  # n = 32: one DAM_s logit decides at most 1.5% of the positions
    result = attnlens.dam(tiny_mlm, corpus=kjv, variant=variant, sparsity=[0.5, 0.9], steps=40, objective="mlm", **settings)
    table = result.table
    assert table["target_sparsity"].tolist() == [0.5, 0.9]
    assert (abs(table["sparsity"] - table["target_sparsity"]) <= 0.01).all(), table[["target_sparsity", "sparsity"]]
    assert table["lambda"].iloc[1] > table["lambda"].iloc[0] > 0
    for lam, curve in result.training.groupby("lambda", sort=False):
        assert curve["lambda_now"].iloc[-1] == pytest.approx(lam), "the table's λ is where dual ascent ended"


@pytest.mark.parametrize("keep", [0.05, 0.3, 0.8])
def test_balancing_lambda_keeps_the_target_share_above_it(keep):
    """The starting λ is the weighted quantile: the logits whose ratio exceeds it carry less than
    the target share of the weights, and with it included at least the target share."""
    rng = np.random.default_rng(int(keep * 100))
    ratio, weights = rng.normal(size=500), rng.uniform(0.1, 3.0, size=500)
    lam = balancing_lambda(torch.from_numpy(ratio), torch.from_numpy(weights), keep)
    share = lambda kept: weights[kept].sum() / weights.sum()  # noqa: E731
    assert share(ratio > lam) < keep <= share(ratio >= lam)


@pytest.mark.slow
def test_dual_ascent_starts_where_the_gradients_balance(minilm_l3, kjv):
    """From a warm start at a pattern held at its own sparsity, the balancing λ keeps the first steps
    near the pattern; a λ far too small (0.01, given) undoes it at once. Both record where they began."""
    init, settings = "band(2)", {**SMALL, "steps": 30, "stop_window": 30, "lr": 0.5}  # a logit crosses 0 in ~6 steps
    probe = attnlens.dam(minilm_l3, corpus=kjv, init=init, lambdas=[0.0], steps=2, lr=1e-9, **SMALL)
    density = 1.0 - float(probe.table["init_train_sparsity"].iloc[0])
    runs = {
        start: attnlens.dam(minilm_l3, corpus=kjv, init=init, sparsity=[1 - density], dual_start=start, **settings)
        for start in (None, 0.01)
    }
    balanced, small = (runs[start].training["hard_density"].max() for start in (None, 0.01))
    assert balanced <= density + 0.02 < small, (density, balanced, small)
    assert runs[0.01].table["lambda_start"].iloc[0] == 0.01
    assert runs[None].table["lambda_start"].iloc[0] > 0.01


@pytest.mark.parametrize("share", [0.05, 0.3, 0.8])
def test_top_share_keeps_the_largest_values_up_to_the_share_nearest_the_target(share):
    """Against brute force: the kept set is a prefix of the values sorted from the largest, and no
    other prefix's weight is nearer the share; the cut lies between the kept and the rest."""
    rng = np.random.default_rng(int(share * 100))
    values, weights = rng.normal(size=300), rng.uniform(0.1, 3.0, size=300)
    kept, cut = top_share(torch.from_numpy(values), torch.from_numpy(weights), share)
    kept = kept.numpy()
    order = np.argsort(-values)
    prefixes = np.concatenate([[0.0], np.cumsum(weights[order])]) / weights.sum()
    best = int(np.argmin(np.abs(prefixes - share)))
    assert set(np.flatnonzero(kept)) == set(order[:best].tolist())
    assert values[kept].min() > float(cut) > values[~kept].max()


def test_lambda_zero_keeps_everything(minilm_l6, kjv):
    result = attnlens.dam(minilm_l6, corpus=kjv, lambdas=[0.0], steps=30, **{**TINY, "seq_len": 32})
    assert result.table["sparsity"].iloc[0] == 0.0
    assert (result.training["hard_density"] == 1.0).all(), "no step's hard mask drops a position"


@pytest.mark.slow
@pytest.mark.parametrize("variant, init", [("structured", "band(2)"), ("structured+global", "local(2)")])
def test_a_warm_start_never_ends_worse_than_its_pattern(minilm_l3, kjv, variant, init):
    """Started at a pattern and held at its sparsity, training ends no worse than the pattern on the
    blocks it trained on (what it optimised), and never keeps more than the pattern did."""
    probe = attnlens.dam(minilm_l3, corpus=kjv, variant=variant, init=init, lambdas=[0.0], steps=2, lr=1e-9, **SMALL)
    start = probe.table.iloc[0]
    target = round(float(start["init_train_sparsity"]), 4)
    result = attnlens.dam(minilm_l3, corpus=kjv, variant=variant, init=init, sparsity=[target], steps=60, **SMALL)
    row = result.table.iloc[0]
    assert row["init_train_loss"] == pytest.approx(start["init_train_loss"]), "the same pattern on the same blocks"
    assert row["train_loss"] <= row["init_train_loss"], (row["train_loss"], row["init_train_loss"])
    assert row["sparsity"] >= target - 0.01


@pytest.mark.slow
def test_matched_differences_are_paired_over_blocks_and_the_verdicts_follow_them(minilm_l3, kjv):
    result = attnlens.dam(minilm_l3, corpus=kjv, lambdas=[0.0, 3.0], steps=20, lr=0.5, **{**SMALL, "patterns": True})
    matched = result.matched(within=1.0)
    points = result.patterns.reset_index(drop=True)
    for _, row in matched.iterrows():
        run = int(np.flatnonzero(result.table["lambda"].to_numpy() == row["lambda"])[0])
        point = int(points.index[(points["pattern"] == row["pattern"]) & (points["value"] == row["value"])][0])
        by_hand = (result.arrays["eval_losses"][run] - result.arrays["pattern_losses"][point]).mean()
        assert row["difference"] == pytest.approx(by_hand, abs=1e-12)
        assert row["difference_low"] <= row["difference"] <= row["difference_high"]
        assert row["expressible"] == (row["pattern"] in ("band", "no-diagonal")), "DAM_s expresses the offset family"
    compared = result.compared(within=1.0)
    for lam, group in compared.groupby("lambda"):
        own, overall = group.set_index("scope").loc["own family"], group.set_index("scope").loc["overall"]
        candidates = matched[matched["lambda"] == lam]
        assert overall["delta"] == candidates["delta"].min()
        assert own["delta"] == candidates.loc[candidates["expressible"], "delta"].min()
        for _, row in group.iterrows():
            low, high = row["difference_low"], row["difference_high"]  # DAM − pattern, in loss: below zero DAM is better
            within = -0.01 < low and high < 0.01  # on par only within the proxy's margin
            expected = "worse" if low > 0 else "better" if high < 0 else "on par" if within else "not decided"
            assert row["verdict"] == expected


@pytest.mark.slow
def test_train_weights_gives_the_matched_patterns_the_same_training(minilm_l3, kjv):
    before = {name: p.detach().clone() for name, p in minilm_l3.model.named_parameters()}
    settings = {**SMALL, "patterns": True, "stop_window": 10}
    tuned = attnlens.dam(minilm_l3, corpus=kjv, sparsity=[0.85], steps=20, train_weights=True, weights_lr=1e-4, **settings)
    for name, p in minilm_l3.model.named_parameters():
        assert torch.equal(p, before[name]), f"{name}: restored after every mask and pattern"
    adapted, frozen = tuned.tables["patterns_adapted"], tuned.patterns
    assert len(adapted) and set(adapted["pattern"]) <= {"band", "local", "bigbird"}
    assert (adapted["steps"] == tuned.table["steps"].iloc[0]).all(), "as many steps as the mask took"
    for _, row in adapted.iterrows():
        same = frozen[(frozen["pattern"] == row["pattern"]) & (frozen["value"] == row["value"])].iloc[0]
        assert row["sparsity"] == pytest.approx(same["sparsity"]), "the same pattern point"
        assert abs(row["sparsity"] - tuned.table["sparsity"].iloc[0]) <= 0.03
        assert row["delta"] != same["delta"], "the weights it was judged with were trained"
    assert set(tuned.matched()["pattern"]) <= set(adapted["pattern"]), "only patterns trained alike are compared"


def test_an_unknown_adapted_pattern_is_one_line():
    from attnlens.errors import BadInput

    with pytest.raises(BadInput, match="adapted_patterns longformer is unknown; use some of"):
        DamSettings.build(adapted_patterns=("longformer",))
