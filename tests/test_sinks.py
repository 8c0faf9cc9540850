"""The first-token sink and heavy hitters (attnlens.analysis.sinks), re-derived with numpy from weights that
transformers' own eager attention gives (``output_attentions``), independently of attnlens's capture."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnlens
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.sinks import sinks
from attnlens.data.positions import class_masks, parse_classes
from attnlens.errors import BadInput
from test_capture import eager_twin
from tiny_models import assert_one_line_error, run_cli, save_tiny

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def numpy_sinks(weights: np.ndarray, epsilon: float, fraction: float, min_keys: int) -> dict[str, np.ndarray]:
    """Gu et al.'s and H2O's numbers from eager weights (block, layer, head, query, key) of a causal model,
    written from the papers' definitions: α = mean over queries of A[i, 0]; negligible: below ``fraction`` of the
    row's largest among its keys j <= i; the top ⌈q·(i + 1)⌉ weights of rows with at least ``min_keys`` keys."""
    blocks, layers, heads, n, _ = weights.shape
    alpha = weights[..., 0].mean(-1).mean(0)  # (layer, head)
    below = np.zeros((layers, heads))
    top = np.zeros((layers, heads, len(FRACTIONS)))
    rows = [i for i in range(n) if i + 1 >= min_keys]
    for i in range(n):
        row = weights[..., i, : i + 1]  # the keys query i sees
        below += (row < fraction * row.max(-1, keepdims=True)).sum(-1).sum(0)
    for at, q in enumerate(FRACTIONS):
        for i in rows:
            ordered = -np.sort(-weights[..., i, : i + 1], axis=-1)
            top[..., at] += ordered[..., : math.ceil(q * (i + 1))].sum(-1).sum(0)
    pairs = blocks * n * (n + 1) / 2
    return {"alpha": alpha, "sink_share": (alpha > epsilon).mean(), "below": below / pairs, "top": top / (blocks * len(rows))}


@pytest.mark.integration
def test_gu_and_h2o_numbers_re_derived_from_eager_weights(gemma3, kjv):
    result = sinks(gemma3, num_seqs=4, seq_len=64, progress=False)
    ids = torch.from_numpy(kjv.blocks(gemma3, 64, 4, 0).ids)
    assert result.meta["corpus"]["block_index"] == kjv.blocks(gemma3, 64, 4, 0).index.tolist()
    with torch.no_grad():
        eager = eager_twin(gemma3)(input_ids=ids, output_attentions=True).attentions
    weights = torch.stack(list(eager), dim=1).double().numpy()  # (block, layer, head, query, key)
    s = result.settings
    expected = numpy_sinks(weights, s["epsilon"], s["fraction"], s["min_keys"])
    heads = result.tables["heads"]
    shape = (gemma3.num_layers, gemma3.num_heads)
    # float32 eager against float32 capture: the same softmax of the same scores, up to their kernels' rounding
    np.testing.assert_allclose(heads["first_weight"].to_numpy().reshape(shape), expected["alpha"], atol=1e-5)
    measures = result.table.set_index("measure")
    assert measures.loc["sink_share", "value"] == expected["sink_share"]
    assert measures.loc["sink_share", "low"] <= expected["sink_share"] <= measures.loc["sink_share", "high"]
    # a weight within rounding of 1% of its row's largest may fall on either side: a few pairs of 8,320 a head
    np.testing.assert_allclose(heads["below"].to_numpy().reshape(shape), expected["below"], atol=2e-3)
    np.testing.assert_allclose(measures.loc["below", "value"], expected["below"].mean(), atol=1e-3)
    top = result.arrays["top_mass"].mean(0)  # every block reads the same rows: the mean over blocks is the head's
    np.testing.assert_allclose(top, expected["top"], atol=1e-5)
    assert list(result.tables["curve"]["fraction"]) == list(FRACTIONS)
    rows = [keys for keys in range(1, 65) if keys >= s["min_keys"]]  # query i sees i + 1 keys
    uniform = [np.mean([math.ceil(q * keys) / keys for keys in rows]) for q in FRACTIONS]
    np.testing.assert_allclose(result.tables["curve"]["uniform"], uniform, rtol=1e-12)
    assert 0.3 < measures.loc["sink_share", "value"] <= 1, "gemma3-270m's heads sink on its first token (<bos>)"


@pytest.mark.integration
def test_an_encoder_measures_its_first_token_and_reloads(minilm_l3, tmp_path):
    result = sinks(minilm_l3, num_seqs=4, seq_len=32, progress=False)
    heads = result.tables["heads"]
    assert len(heads) == minilm_l3.num_layers * minilm_l3.num_heads
    # every query of an encoder sees every key: the top 50% of 32 keys hold at least half of any row's weight
    assert (result.tables["curve"].set_index("fraction").loc[0.5, ["mass", "q1"]] >= 0.5).all()
    assert (result.tables["curve"]["mass"].diff().dropna() >= 0).all(), "more keys kept hold more weight"
    result.save(tmp_path / "sinks")
    again = attnlens.load_result(tmp_path / "sinks")
    assert type(again).__name__ == "SinkResult" and again.table.equals(result.table)
    assert "sink heads by layer: L0" in again.text()


def test_sink_classes_are_the_first_positions(minilm_l3):
    ids = torch.tensor([[101, 1999, 1996, 2927, 1010, 102]])
    masks = class_masks(ids, minilm_l3, parse_classes("sink,sink(3)"))
    keys = torch.arange(6)
    assert torch.equal(masks["sink"][0], (keys == 0).expand(6, 6))
    assert torch.equal(masks["sink(3)"][0], (keys < 3).expand(6, 6))
    assert parse_classes(None, causal=True) == ("self", "prev", "sink", "punct", "other")
    with pytest.raises(BadInput, match=r"sink\(0\): the size s of sink\(s\) must be at least 1"):
        parse_classes("sink(0)")


def test_bad_settings_are_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "sinks", "--seq-len", "16", "--out", str(tmp_path / "s"))
    assert_one_line_error(code, err, "--min-keys 20 is more than the 16 keys", "give --min-keys 16 or less")
    code, _, err = run_cli(capsys, "sinks", "--epsilon", "1.5", "--out", str(tmp_path / "s"))
    assert_one_line_error(code, err, "--epsilon 1.5")


@pytest.mark.integration
def test_a_head_kept_to_the_sink_and_a_window_costs_what_a_full_forward_says(gemma3, kjv):
    """Each head's cost (a forward from its layer, attnlens.analysis.sinks.far) against a full forward with that head's
    far scores set to -inf by hand and the next-token loss taken from the model's own logits."""
    result = sinks(gemma3, num_seqs=4, seq_len=32, min_keys=8, far=True, far_seqs=2, far_max_seqs=2, window=4, progress=False)
    heads = result.tables["heads"].set_index(["layer", "head"])
    ids = torch.from_numpy(kjv.blocks(gemma3, 32, 4, 0).ids[:2])
    i, j = torch.arange(32)[:, None], torch.arange(32)[None, :]
    far_keys = (j >= 4) & (i - j > 4)  # neither one of the first 4 keys nor within 4 before the query (causal: j <= i)

    def loss(layer: int | None = None, head: int = 0) -> np.ndarray:
        def intervene(at, scores, valid):
            if at != layer:
                return None
            scores = scores.clone()
            scores[:, head] = scores[:, head].masked_fill(far_keys & valid, float("-inf"))
            return scores

        with torch.no_grad(), attnlens.Capture(intervene=intervene, record=False):
            logits = gemma3.forward(ids).logits.double()
        each = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        return each.mean(1).numpy()

    unmodified = loss()
    for layer, head in ((0, 0), (gemma3.num_layers - 1, gemma3.num_heads - 1)):
        expected = (loss(layer, head) - unmodified).mean()
        # float32 forwards along two paths (from the layer's recorded inputs, chunked head; the whole model): rounding
        assert heads.loc[(layer, head), "far_cost"] == pytest.approx(expected, abs=2e-4)
    share = result.table.set_index("measure").loc["far_share"]
    looks = result.tables["heads"]["looks"]
    assert share["value"] == (looks == "far").mean() and share["high"] == (looks != "near").mean()


def test_a_head_not_decided_is_measured_on_more_blocks(tmp_path, minilm_l6):
    """Rounds of 4, 8 and 12 blocks: a head measured on more blocks was not decided on the blocks before, a head
    measured on fewer was, and every head's verdict is its interval over the blocks it was measured on."""
    causal = attnlens.load_model(str(save_tiny(tmp_path / "causal", minilm_l6, "causal")))
    s = dict(num_seqs=12, seq_len=16, batch_size=4, min_keys=8, far=True, far_seqs=4, window=2)
    first = sinks(causal, progress=False, far_max_seqs=4, **s).tables["heads"]
    costliest = first.loc[first["far_cost"].idxmax()]
    margin = (costliest["far_cost_low"] + costliest["far_cost_high"]) / 2  # inside its interval: not decided on 4 blocks
    result = sinks(causal, progress=False, far_max_seqs=12, far_margin=margin, **s)
    heads = result.tables["heads"]
    change = (result.arrays["far_loss"] - result.arrays["far_unmodified"]).reshape(len(heads), -1)
    assert set(heads["far_blocks"]) <= {4, 8, 12} and (heads["far_blocks"] > 4).any(), "some head needs a second round"
    for (_, head), row in zip(heads.iterrows(), change):
        blocks = int(head["far_blocks"])
        assert np.isfinite(row[:blocks]).all() and np.isnan(row[blocks:]).all()
        for before in (4, 8):
            interval = bootstrap_interval(row[None, :before], 1000, 0)
            decided = interval[1][0] > margin or interval[2][0] < margin
            assert decided == (blocks == before) if blocks >= before else True
        mean, low, high = (value[0] for value in bootstrap_interval(row[None, :blocks], 1000, 0))
        assert (head["far_cost"], head["far_cost_low"], head["far_cost_high"]) == pytest.approx((mean, low, high))
