"""Importance: mass against numpy, ablation against a hand-written masked forward pass,
gradient importance against finite differences, and the rules for rows and missing classes."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens import Capture
from attnlens.analysis.changes import random_positions
from attnlens.analysis.evaluation import evaluate_batch, guard_rows, removal, split_blocks
from attnlens.analysis.importance import ImportanceResult
from attnlens.analysis.importance.passes import hidden_projection
from attnlens.analysis.objectives import Objective
from attnlens.data.positions import class_masks
from tiny_models import identical_columns, save_tiny, top_keys

SMALL = dict(seq_len=16, num_seqs=4, batch_size=2, bootstrap=100, progress=False)


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory, minilm_l6):
    return attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("causal"), minilm_l6, "causal")))


def eval_ids(result, model, corpus) -> np.ndarray:
    """The held-out blocks a result was computed on, rebuilt from its provenance."""
    every = corpus.blocks(model, result.meta["settings"]["n"], num_blocks=None)
    return every.ids[result.meta["corpus"]["block_index"]]


# ------------------------------------------------------------------ hand-written BERT


def layer_norm(x, module):
    mean = x.mean(-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + module.eps) * module.weight.double() + module.bias.double()


def linear(x, module):
    return x @ module.weight.double().T + module.bias.double()


def bert_by_hand(model, ids: torch.Tensor, remove, by_scores: bool = False) -> torch.Tensor:
    """BERT's forward pass in float64, attention by hand: scores, masked softmax, context.

    ``remove(layer)`` (``by_scores``: ``remove(layer, scores)``) gives a boolean (batch, head or 1, n, n)
    mask of keys to drop, or None.
    """
    bert = model.model
    heads, dim = model.num_heads, model.head_dim
    with torch.no_grad():
        x = bert.embeddings(input_ids=ids).double()
        batch, n, _ = x.shape
        for index, layer in enumerate(bert.encoder.layer):
            attention = layer.attention.self
            split = lambda t: t.reshape(batch, n, heads, dim).transpose(1, 2)
            q, k, v = (split(linear(x, getattr(attention, name))) for name in ("query", "key", "value"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
            mask = remove(index, scores) if by_scores else remove(index)
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            context = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(batch, n, heads * dim)
            x = layer_norm(linear(context, layer.attention.output.dense) + x, layer.attention.output.LayerNorm)
            hidden = torch.nn.functional.gelu(linear(x, layer.intermediate.dense))
            x = layer_norm(linear(hidden, layer.output.dense) + x, layer.output.LayerNorm)
    return x


def one_minus_cosine(hidden, reference):
    cosine = (hidden * reference).sum(-1) / hidden.norm(dim=-1) / reference.norm(dim=-1)
    return (1 - cosine.mean(1)).numpy()


# ------------------------------------------------------------------ mass


def test_masses_sum_to_one_over_a_partition_and_match_numpy(minilm_l6, kjv):
    for classes in ("self,prev,next,other", "cls,sep,punct,other"):
        result = attnlens.importance(minilm_l6, corpus=kjv, classes=classes, gradient=False, **SMALL)
        totals = result.mass.groupby(["layer", "head"])["mass"].sum()
        assert len(totals) == 6 * 12 and np.allclose(totals, 1, atol=1e-5), classes
        assert np.isclose(result.mass.groupby(["layer", "head"])["share"].sum(), 1).all()
    # one class by hand, from the captured weights of the same blocks, in the run's own batches: the same
    # float32 forwards (a forward of other batch shapes rounds differently, by more than these tolerances allow)
    ids = torch.from_numpy(eval_ids(result, minilm_l6, kjv))
    captured = []
    for chunk in torch.split(ids, SMALL["batch_size"]):
        with torch.no_grad(), Capture(weights=True) as cap:
            minilm_l6.forward(chunk)
        captured.append(dict(cap.weights))
    weights_of = {layer: torch.cat([part[layer] for part in captured]) for layer in captured[0]}
    tokens = [minilm_l6.tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
    punct = np.array([[t in {",", ".", ";", ":", "?", "!", "'", "(", ")", "-"} for t in row] for row in tokens])
    for layer in (0, 4):
        weights = weights_of[layer].double().numpy()  # (block, head, query, key)
        expected = (weights * punct[:, None, None, :]).sum((0, 2, 3)) / (ids.shape[0] * ids.shape[1])
        got = result.mass[(result.mass["layer"] == layer) & (result.mass["class"] == "punct")]["mass"].to_numpy()
        np.testing.assert_allclose(got, expected, atol=1e-6)
        entropy = -(weights * np.log(weights)).sum(-1).mean((0, 2))
        np.testing.assert_allclose(result.entropy[result.entropy["layer"] == layer]["entropy"], entropy, rtol=1e-5)
    assert np.allclose(result.entropy["uniform_entropy"], np.log(16))


# ------------------------------------------------------------------ ablation


def test_ablating_nothing_reproduces_the_model_exactly(minilm_l6, tiny_causal, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids[:3])
    nothing = removal(lambda layer, valid: torch.zeros(1, 1, 1, 1, dtype=torch.bool))
    with torch.no_grad():
        plain = minilm_l6.forward(ids).last_hidden_state
        with Capture(intervene=nothing, record=False):
            same = minilm_l6.forward(ids).last_hidden_state
    assert torch.equal(plain, same)
    objective = Objective(tiny_causal)
    batch = objective.prepare(ids)
    with torch.no_grad():
        expected = objective.evaluate(batch)["loss"].double().numpy()
    assert np.array_equal(evaluate_batch(objective, batch, nothing)["loss"], expected)


def test_class_ablation_equals_a_hand_written_masked_forward(minilm_l6, kjv):
    # one batch of two blocks: per-head ablations are 2 x classes x 72 forward passes per batch
    result = attnlens.importance(
        minilm_l6, corpus=kjv, classes="self,cls", per="head", gradient=False, **{**SMALL, "num_seqs": 2}
    )
    ids = torch.from_numpy(eval_ids(result, minilm_l6, kjv))
    reference = bert_by_hand(minilm_l6, ids, lambda layer: None)
    np.testing.assert_allclose(reference.numpy(), minilm_l6.forward(ids).last_hidden_state.detach().double().numpy(), atol=2e-5)
    n = ids.shape[1]
    losses = result.arrays["ablation_blocks"]
    table = result.ablation

    def row(**where):
        picked = table
        for key, value in where.items():
            picked = picked[picked[key] == value]
        assert len(picked) == 1
        return picked.index[0]

    eye = torch.eye(n, dtype=torch.bool)[None, None]
    diagonal = one_minus_cosine(bert_by_hand(minilm_l6, ids, lambda layer: eye), reference)
    np.testing.assert_allclose(losses[row(scope="model", **{"class": "self"}, control="class")], diagonal, atol=2e-5)
    cls_column = (ids == 101)[:, None, None, :]
    no_cls = one_minus_cosine(bert_by_hand(minilm_l6, ids, lambda layer: cls_column), reference)
    np.testing.assert_allclose(losses[row(scope="model", **{"class": "cls"}, control="class")], no_cls, atol=2e-5)
    # one head of one layer: the diagonal of layer 2, head 5 only
    head_only = torch.zeros(1, 12, n, n, dtype=torch.bool)
    head_only[0, 5] = torch.eye(n, dtype=torch.bool)
    single = one_minus_cosine(bert_by_hand(minilm_l6, ids, lambda layer: head_only if layer == 2 else None), reference)
    np.testing.assert_allclose(
        losses[row(scope="head", layer=2, head=5, **{"class": "self"}, control="class")], single, atol=2e-5
    )
    # the table's summary numbers are those per-block numbers' means
    assert table.loc[row(scope="model", **{"class": "self"}, control="class"), "delta"] == pytest.approx(
        diagonal.mean(), abs=2e-5
    )
    # unmodified, the hidden loss is a distance to itself, exactly 0: the table leaves it out, as it would repeat delta
    assert (losses[row(scope="none")] == 0).all() and "loss" not in table
    assert (table.loc[table["control"] == "class", "removed"].iloc[0]) == pytest.approx(1 / n)


def test_heavy_hitter_ablation_equals_a_hand_written_top_k_forward(minilm_double, kjv):
    # float64 on both sides, so that the k-th and (k+1)-th scores of a row are never confused
    model = minilm_double
    classes = "cls,heavy(2),other"
    result = attnlens.importance(model, corpus=kjv, classes=classes, gradient=False, **{**SMALL, "num_seqs": 2})
    ids = torch.from_numpy(eval_ids(result, model, kjv))
    reference = bert_by_hand(model, ids, lambda layer: None)
    not_cls = ~(ids == 101)[:, None, None, :].expand(-1, model.num_heads, ids.shape[1], -1)  # the keys heavy(2) chooses among
    table = result.ablation.set_index(["scope", "class", "control"])
    conditions = list(table.index)  # the rows of ablation_blocks, in order
    for name, removed in (
        ("heavy(2)", lambda layer, scores: top_keys(scores, not_cls, 2)),
        ("other", lambda layer, scores: not_cls & ~top_keys(scores, not_cls, 2)),
    ):
        by_hand = one_minus_cosine(bert_by_hand(model, ids, removed, by_scores=True), reference)
        losses = result.arrays["ablation_blocks"][conditions.index(("model", name, "class"))]
        # any class's losses (cls too) agree with this hand-written forward to 1e-8, the judging precision's rounding
        np.testing.assert_allclose(losses, by_hand, atol=1e-7)
    n = ids.shape[1]
    assert table.loc[("model", "heavy(2)", "class"), "removed"] == pytest.approx(2 / n)  # 2 of every row's n keys
    assert table.loc[("model", "other", "class"), "removed"] == pytest.approx((n - 3) / n)
    assert table.loc[("model", "heavy(2)", "random"), "removed"] == pytest.approx(2 / n)


def test_heavy_hitter_mass_matches_the_captured_weights(minilm_l6, kjv):
    """Each head's mass on its top-2 scores among the keys that are not [CLS], from scores and weights
    captured in the run's own batches (the same float32 forwards, so the same scores choose)."""
    result = attnlens.importance(minilm_l6, corpus=kjv, classes="cls,heavy(2),other", gradient=False, **SMALL)
    ids = torch.from_numpy(eval_ids(result, minilm_l6, kjv))
    n, heads = ids.shape[1], minilm_l6.num_heads
    for layer in (0, 5):
        heavy = rest = torch.zeros(heads, dtype=torch.float64)
        for chunk in torch.split(ids, SMALL["batch_size"]):
            with torch.no_grad(), Capture(weights=True) as cap:
                minilm_l6.forward(chunk)
            not_cls = ~(chunk == 101)[:, None, None, :].expand(-1, heads, n, -1)
            weights = cap.weights[layer].double()
            chosen = top_keys(cap.scores[layer], not_cls, 2)
            heavy = heavy + (weights * chosen).sum((0, 2, 3))
            rest = rest + (weights * (not_cls & ~chosen)).sum((0, 2, 3))
        rows = result.mass[(result.mass["layer"] == layer)].set_index(["head", "class"])["mass"]
        np.testing.assert_allclose(rows.xs("heavy(2)", level="class").to_numpy(), heavy.numpy() / ids.numel(), atol=1e-6)
        np.testing.assert_allclose(rows.xs("other", level="class").to_numpy(), rest.numpy() / ids.numel(), atol=1e-6)
    assert np.allclose(result.mass.groupby(["layer", "head"])["mass"].sum(), 1, atol=1e-5), "still a partition"


def test_random_control_removes_as_many_valid_positions_per_row():
    generator = torch.Generator().manual_seed(0)
    valid = torch.ones(4, 10, 10, dtype=torch.bool).tril()
    remove = guard_rows(torch.rand(4, 10, 10, generator=generator) < 0.5, valid)
    chosen = random_positions(remove, valid, torch.rand(4, 10, 10, generator=generator))
    assert torch.equal(chosen.sum(-1), remove.sum(-1))
    assert not (chosen & ~valid).any()
    assert (valid & ~chosen).any(-1).all(), "no row loses every key"
    assert not torch.equal(chosen, remove)


def test_per_layer_random_control_and_determinism(minilm_l6, kjv):
    first = attnlens.importance(minilm_l6, corpus=kjv, classes="prev,punct", per="layer", gradient=False, **SMALL)
    again = attnlens.importance(minilm_l6, corpus=kjv, classes="prev,punct", per="model", gradient=False, **SMALL)
    table = first.ablation
    pd.testing.assert_frame_equal(table[table["scope"] != "layer"], again.ablation, check_index_type=False)
    assert sorted(table["scope"].unique()) == ["layer", "model", "none"]
    assert len(table[table["scope"] == "layer"]) == 6 * 2 * 2
    for (_scope, _layer, _cls), group in table[table["scope"] != "none"].groupby(["scope", "layer", "class"]):
        removed = group.set_index("control")["removed"]
        assert removed["class"] == pytest.approx(removed["random"]), "the control removes as many positions"
    excess = table.dropna(subset=["excess"])
    pairs = table.set_index(["scope", "layer", "class", "control"])["delta"]
    for _, row in excess.iterrows():
        key = (row["scope"], row["layer"], row["class"])
        assert row["excess"] == pytest.approx(pairs[key + ("class",)] - pairs[key + ("random",)])


def test_causal_rows_that_would_lose_every_key_are_spared(tiny_causal, kjv):
    result = attnlens.importance(tiny_causal, corpus=kjv, classes="cls,self", gradient=False, **SMALL)
    table = result.ablation.set_index(["scope", "class", "control"])
    n = 16
    # query 0 sees only key 0, which is both [CLS] and itself: that row is left alone
    assert table.loc[("model", "cls", "class"), "rows_spared"] == pytest.approx(1 / n)
    assert table.loc[("model", "self", "class"), "rows_spared"] == pytest.approx(1 / n)
    valid_positions = n * (n + 1) / 2
    assert table.loc[("model", "self", "class"), "removed"] == pytest.approx((n - 1) / valid_positions)
    assert np.isfinite(result.arrays["ablation_blocks"]).all()
    # heavy(2) alone: queries 0 and 1 have no key beside their top 2, so they are spared; every later row loses 2
    heavy = attnlens.importance(tiny_causal, corpus=kjv, classes="heavy(2)", gradient=False, **SMALL).ablation
    heavy = heavy[(heavy["scope"] == "model") & (heavy["class"] == "heavy(2)")].set_index("control")
    assert heavy.loc["class", "rows_spared"] == pytest.approx(2 / n)
    assert heavy.loc["class", "removed"] == heavy.loc["random", "removed"] == pytest.approx(2 * (n - 2) / valid_positions)


# ------------------------------------------------------------------ gradient


def gate_forward(model, ids, layer, head, mask, gate):
    """Weights of one head of one layer multiplied by ``gate`` on ``mask`` (by hand, post-softmax)."""

    def scale(index, weights, valid):
        if index != layer:
            return None
        factor = torch.ones_like(weights)
        factor[:, head] = torch.where(mask, torch.full_like(weights[:, head], gate), factor[:, head])
        return weights * factor

    with torch.no_grad(), Capture(intervene_weights=scale, record=False):
        return model.forward(ids, output_hidden_states=True)


@pytest.fixture(scope="module")
def minilm_double():
    return attnlens.load_model("minilm-l6", dtype=torch.float64)


def test_gradient_importance_equals_finite_differences_hidden(minilm_double, kjv):
    model = minilm_double
    result = attnlens.importance(model, corpus=kjv, classes="prev,cls,heavy(2)", **{**SMALL, "num_seqs": 2})
    ids = torch.from_numpy(eval_ids(result, model, kjv))
    masks = class_masks(ids, model, ("prev", "cls"))
    blocks = result.meta["corpus"]["block_index"]
    with torch.no_grad():
        reference = model.forward(ids).last_hidden_state
    tokens, width = reference.shape[1:]
    projection = torch.stack([hidden_projection((tokens, width), 0, block, torch.float64) for block in blocks])

    def f(layer, head, mask, gate):  # the documented projection, per block
        hidden = gate_forward(model, ids, layer, head, mask, gate).hidden_states[-1]
        inner = (projection * hidden / reference.norm(dim=-1, keepdim=True)).sum((1, 2))
        return (inner * math.sqrt(math.pi / 2) / math.sqrt(tokens * width)).numpy()

    grads = result.arrays["gradient_blocks"]  # (block, layer, head, class + all)
    step = 1e-4
    for layer, head, index, name in ((1, 4, 0, "prev"), (3, 0, 1, "cls")):
        mask = masks[name]
        numeric = (f(layer, head, mask, 1 + step) - f(layer, head, mask, 1 - step)) / (2 * step)
        np.testing.assert_allclose(grads[:, layer, head, index], numeric, rtol=1e-5, atol=1e-10)
    # heavy(2): the head's top-2 scores among the keys neither prev nor cls holds, chosen at gate 1
    with torch.no_grad(), Capture() as cap:
        model.forward(ids)
    heavy = top_keys(cap.scores[4][:, 2], ~(masks["prev"] | masks["cls"]), 2)
    numeric = (f(4, 2, heavy, 1 + step) - f(4, 2, heavy, 1 - step)) / (2 * step)
    np.testing.assert_allclose(grads[:, 4, 2, 2], numeric, rtol=1e-5, atol=1e-10)
    everything = torch.ones_like(masks["prev"])
    numeric = (f(2, 7, everything, 1 + step) - f(2, 7, everything, 1 - step)) / (2 * step)
    np.testing.assert_allclose(grads[:, 2, 7, 3], numeric, rtol=1e-5, atol=1e-10)
    # levels: a gate shared by a layer's heads has the sum of their derivatives
    table = result.gradient.set_index(["level", "layer", "head", "class"])
    assert table.loc[("layer", 1, -1, "prev"), "importance"] == pytest.approx(np.abs(grads[:, 1, :, 0].sum(1)).mean())
    assert table.loc[("head", 1, 4, "prev"), "importance"] == pytest.approx(np.abs(grads[:, 1, 4, 0]).mean())


def test_gradient_importance_equals_finite_differences_clm(tmp_path, minilm_l6, kjv):
    model = attnlens.load_model(str(save_tiny(tmp_path, minilm_l6, "causal-bert")), dtype=torch.float64)
    assert model.causal and model.objective == "clm"
    result = attnlens.importance(model, corpus=kjv, classes="self,punct,other", **{**SMALL, "num_seqs": 3, "batch_size": 3})
    ids = torch.from_numpy(eval_ids(result, model, kjv))
    masks = class_masks(ids, model, ("self", "punct", "other"))
    objective = Objective(model)
    batch = objective.prepare(ids)

    def loss(layer, head, mask, gate):
        logits = gate_forward(model, ids, layer, head, mask, gate).logits
        return (
            torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), batch.labels[:, 1:], reduction="none")
            .mean(1)
            .numpy()
        )

    grads = result.arrays["gradient_blocks"]
    step = 1e-4
    for layer, head, index, name in ((0, 1, 0, "self"), (1, 3, 2, "other")):
        numeric = (loss(layer, head, masks[name], 1 + step) - loss(layer, head, masks[name], 1 - step)) / (2 * step)
        np.testing.assert_allclose(grads[:, layer, head, index], numeric, rtol=1e-5, atol=1e-10)


# ------------------------------------------------------------------ classes that never occur, saving


def test_a_class_that_never_occurs(tiny_causal, kjv, tmp_path, monkeypatch):
    with pytest.raises(attnlens.AttnlensError, match="class 'next' never occurs .* is causal, so no query sees the next token"):
        attnlens.importance(tiny_causal, corpus=kjv, classes="self,next", **SMALL)
    own = attnlens.importance(tiny_causal, corpus=kjv, gradient=False, **SMALL)
    assert own.meta["settings"]["classes"] == ["self", "prev", "sink", "punct", "other"], "a decoder's defaults"
    assert own.meta["settings"]["classes_dropped"] == []
    # defaults that hold a class the model never has (an encoder's, on a decoder) drop it with a note
    monkeypatch.setattr("attnlens.data.positions.DECODER_CLASSES", ("self", "prev", "next", "cls", "sep", "punct", "other"))
    result = attnlens.importance(tiny_causal, corpus=kjv, gradient=False, **SMALL)
    assert result.meta["settings"]["classes_dropped"] == ["next"]
    row = result.table.set_index("class").loc["next"]
    assert not row["occurs"] and "causal" in row["note"]
    assert row[["mass", "delta", "random"]].isna().all(), "missing, not a number"
    assert "next" not in set(result.ablation["class"]) and "next" not in set(result.mass["class"])
    result.save(tmp_path / "r")
    text = (tmp_path / "r" / "summary.csv").read_text()
    assert "nan" not in text.lower() and "NaN" not in (tmp_path / "r" / "result.json").read_text()


def test_save_load_round_trip_with_figures(minilm_l6, kjv, tmp_path):
    result = attnlens.importance(minilm_l6, corpus=kjv, classes="self,prev,cls,other", **SMALL)
    out = result.save(tmp_path / "imp")
    result.save_figures(out / "figures")
    meta = json.loads((out / "result.json").read_text())
    assert meta["kind"] == "importance" and meta["format_version"] == 1
    assert meta["model"]["weights_sha256"] == minilm_l6.weights_sha256() and meta["roles"]["cls"] == "[CLS] (id 101)"
    loaded = ImportanceResult.load(out)
    assert set(loaded.tables) == set(result.tables)
    for name in result.tables:
        pd.testing.assert_frame_equal(loaded.tables[name], result.tables[name], check_dtype=False)
    np.testing.assert_array_equal(loaded.arrays["gradient_blocks"], result.arrays["gradient_blocks"])
    for figure in ("mass", "ablation", "gradient", "head_importance"):
        assert (out / "figures" / f"{figure}.png").stat().st_size > 10_000 and (out / "figures" / f"{figure}.pdf").is_file()
    with pytest.raises(attnlens.AttnlensError, match="already exists .* overwrite"):
        result.save(out)
    result.save(out, overwrite=True)
    assert not (out / "figures").exists()


def test_held_out_split_is_disjoint_and_seeded(minilm_l6, kjv):
    eval_a, train_a = split_blocks(kjv, minilm_l6, 32, 5, 7, seed=3)
    eval_b, _ = split_blocks(kjv, minilm_l6, 32, 5, 0, seed=3)
    assert np.array_equal(eval_a.index, eval_b.index), "held-out blocks do not depend on the training count"
    assert not set(eval_a.index) & set(train_a.index) and len(train_a) == 7
    every = kjv.blocks(minilm_l6, 32, None)
    assert np.array_equal(eval_a.ids, every.ids[eval_a.index])
    with pytest.raises(attnlens.AttnlensError, match="at least 2 blocks"):
        split_blocks(kjv, minilm_l6, 32, 1)


def test_per_head_ablation_figure(minilm_l6, kjv, tmp_path):
    result = attnlens.importance(minilm_l6, corpus=kjv, classes="prev", per="head", gradient=False, **{**SMALL, "num_seqs": 2})
    heads = result.ablation[result.ablation["scope"] == "head"]
    assert len(heads) == 6 * 12 * 2 and heads["removed"].gt(0).all()
    out = result.save(tmp_path / "r")
    result.save_figures(out / "figures")
    assert (out / "figures" / "ablation_per_head.png").stat().st_size > 10_000


@pytest.mark.slow
def test_gemma_causal_path(gemma3, kjv):
    """Next-token loss, <bos> in the cls role, next dropped, query 0 spared, gradients finite."""
    result = attnlens.importance(gemma3, corpus=kjv, seq_len=16, num_seqs=2, batch_size=2, bootstrap=50, progress=False,
                                 classes="self,prev,cls,sink,other")  # fmt: skip
    assert result.meta["settings"]["objective"] == "clm" and result.meta["roles"]["cls"] == "<bos> (id 2)"
    with pytest.raises(attnlens.AttnlensError, match="class 'next' never occurs"):
        attnlens.importance(gemma3, corpus=kjv, seq_len=16, num_seqs=2, classes="self,next", progress=False)
    table = result.ablation.set_index(["scope", "class", "control"])
    assert table.loc[("none", "none", "none"), "loss"] > 0.5, "a next-token loss, not a distance to itself"
    assert table.loc[("model", "cls", "class"), "rows_spared"] == pytest.approx(1 / 16)
    # <bos> is the block's first position: removing cls or sink removes the same pairs, to the bit
    np.testing.assert_array_equal(table.loc[("model", "cls", "class"), "delta"], table.loc[("model", "sink", "class"), "delta"])
    assert np.isfinite(result.arrays["gradient_blocks"]).all() and np.isfinite(result.arrays["ablation_blocks"]).all()
    assert result.meta["model"]["weights_sha256"] == gemma3.weights_sha256()


# ------------------------------------------------------------------ tables and figures


@pytest.fixture(scope="module")
def small_run(minilm_l6, kjv):
    return attnlens.importance(minilm_l6, corpus=kjv, classes="self,prev,sep,other", per="layer", **SMALL)


def model_rows(table) -> pd.DataFrame:
    return table[table["scope"] == "model"].set_index(["class", "control"])


def marker_points(ax) -> list[tuple[float, float, object]]:
    """(x, y, line) of every point drawn as a marker (error bar caps aside)."""
    return [
        (x, y, line)
        for line in ax.lines
        if line.get_marker() not in ("None", None, "", "_")
        for x, y in np.asarray(line.get_xydata(), dtype=float)
    ]


def test_no_importance_table_repeats_a_column(small_run, tiny_causal, kjv):
    for name, table in small_run.tables.items():
        pairs = identical_columns(table)
        # share (uniform-attention mass) and removed (positions removed) agree when every query sees every key ...
        assert pairs == ([("share", "removed")] if name == "summary" else []), (name, pairs)
    causal = attnlens.importance(tiny_causal, corpus=kjv, classes="self,prev,other", gradient=False, **SMALL)
    assert identical_columns(causal.table) == [], "... and part when queries see different keys (causal)"
    assert "loss" in causal.ablation, "a next-token loss of its own, beside its change delta"


def test_ablation_figure_draws_points_with_intervals_on_a_log_axis(small_run):
    import matplotlib.pyplot as plt

    from attnlens.figures.importance import plot_ablation

    ablation = small_run.ablation.copy()
    model = ablation["scope"] == "model"
    below = model & (ablation["class"] == "sep") & (ablation["control"] == "class")
    crossing = model & (ablation["class"] == "self") & (ablation["control"] == "random")
    assert ablation.loc[crossing, "delta"].iloc[0] > 0
    ablation.loc[below, ["delta", "delta_low", "delta_high"]] = [-0.0021, -0.005, 0.0012]  # a class below zero change
    ablation.loc[crossing, "delta_low"] = -0.001  # an interval across zero
    result = ImportanceResult(small_run.meta, {**small_run.tables, "ablation": ablation}, small_run.arrays)
    ax = plot_ablation(result)
    assert ax.get_yscale() == "log" and not [patch for patch in ax.patches if isinstance(patch, plt.Rectangle)], "no bars"
    floor = ax.get_ylim()[0] * 10**0.3  # what stands on the floor is within a third of a decade of the bottom
    points, rows = marker_points(ax), model_rows(ablation)
    bars = [segment for collection in ax.collections for segment in collection.get_segments()]
    classes = [tick.get_text().split("\n")[0] for tick in ax.get_xticklabels()]
    assert classes == ["self", "prev", "sep", "other"]
    for position, name in enumerate(classes):
        for control, side in (("class", -1), ("random", 1)):  # the control beside its class
            delta, low, high = rows.loc[(name, control), ["delta", "delta_low", "delta_high"]]
            mine = [y for x, y, _ in points if 0 < side * (x - position) < 0.5]
            assert len(mine) == 1, (name, control)
            assert mine[0] == pytest.approx(delta) if delta > 0 else mine[0] <= floor
            interval = [segment[:, 1] for segment in bars if 0 < side * (segment[0][0] - position) < 0.5]
            assert len(interval) == 1 and max(interval[0]) == pytest.approx(high)
            assert min(interval[0]) == pytest.approx(low) if low > 0 else min(interval[0]) <= floor, "cut at the floor"
    styles = lambda keep: {(line.get_marker(), str(line.get_markerfacecolor())) for _, y, line in points if keep(y)}
    assert styles(lambda y: y <= floor).isdisjoint(styles(lambda y: y > floor)), "a point below zero is marked distinctly"
    assert any("0.0021" in text.get_text() for text in ax.texts), "its value is written"
    assert any("≤ 0" in text.get_text() for text in ax.get_legend().get_texts()), "and the legend says how"
    plt.close(ax.figure)


def test_task_ablation_figure_draws_its_points_like_the_ablation_figure(small_run):
    import matplotlib.pyplot as plt

    from attnlens.figures.importance import plot_ablation, plot_task_ablation

    task = small_run.ablation[small_run.ablation["scope"] != "none"].copy()
    task["accuracy"] = np.linspace(0.55, 0.8, len(task))
    task["accuracy_low"], task["accuracy_high"] = task["accuracy"] - 0.04, task["accuracy"] + 0.03
    meta = {**small_run.meta, "task": {"task": "made-up", "protocol": "probe", "held_out_rows": list(range(64)),
                                       "unmodified_accuracy": 0.8, "majority_accuracy": 0.5}}  # fmt: skip
    ablation = small_run.ablation.copy()  # every Δ above zero: points of one style in both figures
    ablation[["delta", "delta_low", "delta_high"]] = [0.02, 0.01, 0.03]
    result = ImportanceResult(meta, {**small_run.tables, "ablation": ablation, "task": task}, small_run.arrays)
    drawn = []
    for plot in (plot_ablation, plot_task_ablation):
        ax = plot(result)
        drawn.append({(round(x - round(x), 3), line.get_marker(), line.get_color()) for x, _, line in marker_points(ax)})
        plt.close(ax.figure)
    assert drawn[0] == drawn[1] and len(drawn[0]) == 2, "the same two offsets, markers and colours: class, control"


def test_gradient_figures_say_what_the_gate_is_and_what_is_differentiated(small_run):
    import matplotlib.pyplot as plt

    from attnlens.figures.importance import plot_gradient, plot_head_importance

    for plot in (plot_gradient, plot_head_importance):
        ax = plot(small_run)
        words = " ".join([ax.get_ylabel(), ax.get_title(), *(other.get_ylabel() for other in ax.figure.axes)])
        assert "gate" in words and "multipl" in words and "attention weights" in words, words
        assert "hidden states" in words and "projection" in words, "hidden: what stands in for the loss"
        plt.close(ax.figure)
