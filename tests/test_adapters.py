"""Adapters (attnlens.models.adapters): DeBERTa v1/v2/v3 and ALBERT, captured exactly.

Each family is a tiny random model saved with the minilm tokenizer, loaded by
:func:`attnlens.load_model`, and compared with the same checkpoint under transformers'
own eager code: softmax of the captured scores against its attention weights on valid
positions, and its hidden states and logits. DeBERTa's layer-0 scores are also rebuilt by
hand from the weights (q·k plus the c2p and p2c terms, gathered one position at a time).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

import attnlens
from attnlens import Capture
from attnlens.errors import UnsupportedModel
from attnlens.models.adapters import ADAPTERS, adapt
from attnlens.models.loading import module_sha256
from attnlens.models.partial import LayerPlan, MaskedHeads, attention_modules, planned
from tiny_models import save_with_minilm_tokenizer

TINY = dict(
    vocab_size=30522,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
    initializer_range=0.2,  # larger than real models' 0.02: attention far from uniform, so differences would show
)

# name: (config class, what the variant sets) -- v3's bucketed positions and shared keys, v2's own
# position projections and convolution, v1's single in_proj; short spans so that positions clamp.
DEBERTAS = {
    "deberta-v3": (
        transformers.DebertaV2Config,
        dict(
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=4,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
        ),
    ),
    "deberta-v2": (
        transformers.DebertaV2Config,
        dict(
            relative_attention=True,
            pos_att_type=["c2p", "p2c"],
            max_relative_positions=4,
            share_att_key=False,
            conv_kernel_size=3,
        ),
    ),
    "deberta-v1": (
        transformers.DebertaConfig,
        dict(relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=4, position_biased_input=False),
    ),
}

TEXTS = ["the quick brown fox jumps over the lazy dog again", "a short one"]


def tiny_masked_lm(config: transformers.PretrainedConfig) -> transformers.PreTrainedModel:
    """A random masked LM of ``config``, its biases random too (transformers starts them at 0)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForMaskedLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.2)
    return model


def load_pair(tmp_path, minilm, model) -> tuple[attnlens.LoadedModel, transformers.PreTrainedModel]:
    """The model loaded by attnlens, and the same checkpoint loaded by transformers alone with its eager code."""
    path = save_with_minilm_tokenizer(tmp_path / "model", model, minilm)
    loaded = attnlens.load_model(str(path))
    eager = transformers.AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager").eval()
    return loaded, eager


def assert_matches_eager(loaded, eager) -> tuple[Capture, dict]:
    """Capture a padded batch of two; check it against eager and return the capture and the eager outputs."""
    batch = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert not batch["attention_mask"][1].all(), "the second text is padded"
    with torch.no_grad():
        reference = eager(**batch, output_attentions=True, output_hidden_states=True)
        with Capture(weights=True) as cap:
            ours = loaded.forward(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
    assert loaded.num_layers == eager.config.num_hidden_layers
    assert sorted(cap.scores) == list(range(loaded.num_layers)), "every layer captured"
    for layer in range(loaded.num_layers):
        valid = cap.valid[layer][:, None].expand_as(cap.scores[layer])
        assert torch.equal(cap.valid[layer][1, 0], batch["attention_mask"][1].bool()), "padding keys are invalid"
        weights = torch.softmax(cap.scores[layer].masked_fill(~valid, float("-inf")), dim=-1)
        assert (weights - reference.attentions[layer])[valid].abs().max() < 1e-5
        assert (cap.weights[layer] - reference.attentions[layer])[valid].abs().max() < 1e-5
    assert (ours.hidden_states[-1] - reference.hidden_states[-1]).abs().max() < 1e-5
    assert (ours.logits - reference.logits).abs().max() < 1e-5
    return cap, reference


def test_adapters_are_registered():
    assert ADAPTERS["deberta-v2"] == "deberta_v2" and ADAPTERS["deberta"] == "deberta" and ADAPTERS["albert"] == "albert"


# ---------------------------------------------------------------------------- DeBERTa


def bucket(relative: int, buckets: int, max_position: int) -> int:
    """DeBERTa-v2's log-bucketed relative position, in plain Python (no buckets: the position itself)."""
    mid = buckets // 2
    if buckets <= 0 or abs(relative) <= mid:
        return relative
    log_position = math.ceil(math.log(abs(relative) / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return int(math.copysign(log_position, relative))


def hand_scores(model: transformers.PreTrainedModel, hidden: torch.Tensor, head: int) -> torch.Tensor:
    """Layer 0's scores (n, n) of one head, in float64, from the weights and the layer's input ``hidden`` (n, hidden):

    score(i, j) = (q_i·k_j + q_i·Kr[c2p(i, j)] + k_j·Qr[p2c(i, j)]) / sqrt(3·head_dim)

    with Kr, Qr the relative embeddings projected to keys and queries, and each index found
    position by position as DeBERTa's code defines it (not by its gathers)."""
    base = model.base_model
    attention = base.encoder.layer[0].attention.self
    heads, n = model.config.num_attention_heads, len(hidden)
    dim = model.config.hidden_size // heads
    x = hidden.double()

    def project(linear: torch.nn.Linear, states: torch.Tensor) -> torch.Tensor:  # (rows, dim) of the head
        out = states @ linear.weight.double().T + (0 if linear.bias is None else linear.bias.double())
        return out.view(len(states), heads, -1)[:, head]

    if model.config.model_type == "deberta":  # one in_proj: each head's q, k, v side by side, plus q_bias
        qkv = project(attention.in_proj, x)
        q = qkv[:, :dim] + attention.q_bias.double().view(heads, dim)[head]
        k = qkv[:, dim : 2 * dim]
        span, rows = min(n, attention.max_relative_positions), attention.max_relative_positions
        relative = base.encoder.rel_embeddings.weight.double()[rows - span : rows + span]
        position_key, position_query = project(attention.pos_proj, relative), project(attention.pos_q_proj, relative)
        position = lambda r: r  # noqa: E731
    else:
        q, k = project(attention.query_proj, x), project(attention.key_proj, x)
        span = attention.pos_ebd_size
        relative = base.encoder.get_rel_embedding().double()[: 2 * span]
        shared = attention.share_att_key
        position_key = project(attention.key_proj if shared else attention.pos_key_proj, relative)
        position_query = project(attention.query_proj if shared else attention.pos_query_proj, relative)
        position = lambda r: bucket(r, attention.position_buckets, base.encoder.max_relative_positions)  # noqa: E731
    clamp = lambda index: min(max(index, 0), 2 * span - 1)  # noqa: E731
    scores = torch.empty(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            c2p = clamp(position(i - j) + span)  # the query's content against the key's position relative to it
            p2c = clamp(-position(j - i) + span)  # the key's content against the query's position relative to it
            scores[i, j] = q[i] @ k[j] + q[i] @ position_key[c2p] + k[j] @ position_query[p2c]
    return scores / math.sqrt(3 * dim)


@pytest.mark.parametrize("variant", sorted(DEBERTAS))
def test_deberta_capture_is_exact(tmp_path, minilm_l6, variant):
    config_class, settings = DEBERTAS[variant]
    loaded, eager = load_pair(tmp_path, minilm_l6, tiny_masked_lm(config_class(**TINY, **settings)))
    cap, reference = assert_matches_eager(loaded, eager)

    # layer 0 by hand, from the weights and the embeddings eager computed, on the unpadded text
    for head in (0, 3):
        expected = hand_scores(eager, reference.hidden_states[0][0], head)
        assert (cap.scores[0][0, head].double() - expected).abs().max() < 1e-5


def test_deberta_routes_every_layer_once_and_survives_deepcopy(tmp_path, minilm_l6):
    config_class, settings = DEBERTAS["deberta-v3"]
    loaded, _ = load_pair(tmp_path, minilm_l6, tiny_masked_lm(config_class(**TINY, **settings)))
    modules = attention_modules(loaded.model)
    assert sorted(modules) == [0, 1] and all(type(module).__name__ == "DisentangledSelfAttention" for module in modules.values())
    twin = copy.deepcopy(loaded.model)  # as fine-tuning copies the model: each forward must stay bound to its own module
    for module in attention_modules(twin).values():
        assert module.forward.__self__ is module


def test_deberta_partial_plan_refuses_the_relative_terms(tmp_path, minilm_l6):
    """A plan switches the model to "attnlens-partial", which cannot rebuild the c2p/p2c terms: refused, not ignored."""
    config_class, settings = DEBERTAS["deberta-v2"]
    loaded, _ = load_pair(tmp_path, minilm_l6, tiny_masked_lm(config_class(**TINY, **settings)))
    ids = torch.tensor([[101, 7592, 2088, 2003, 102]])
    plans = {0: LayerPlan(n=5, masked=[MaskedHeads([0], torch.ones(5, 5, dtype=torch.bool).triu(), kernel="sdpa")])}
    with pytest.raises(UnsupportedModel, match="position bias"), planned(loaded, plans):
        loaded.forward(ids)
    with Capture() as cap:  # and back under "attnlens" afterwards
        loaded.forward(ids)
    assert sorted(cap.scores) == [0, 1]


def test_deberta_talking_head_is_refused():
    model = transformers.DebertaModel(transformers.DebertaConfig(**TINY, talking_head=True))
    with pytest.raises(UnsupportedModel, match="talking_head"):
        adapt(model, "deberta")


# ---------------------------------------------------------------------------- ALBERT


@pytest.mark.parametrize(("layers", "groups"), [(2, 1), (4, 2)])
def test_albert_capture_is_exact_over_shared_weights(tmp_path, minilm_l6, layers, groups):
    config = transformers.AlbertConfig(**{**TINY, "num_hidden_layers": layers}, num_hidden_groups=groups, embedding_size=32)
    loaded, eager = load_pair(tmp_path, minilm_l6, tiny_masked_lm(config))
    assert_matches_eager(loaded, eager)

    # one distinct attention module per layer, each over the very tensors of its layer's group
    modules = attention_modules(loaded.model)
    assert sorted(modules) == list(range(layers)) and len({id(module) for module in modules.values()}) == layers
    transformer = loaded.model.albert.encoder
    for layer, module in modules.items():
        shared = transformer.albert_layer_groups[layer * groups // layers].albert_layers[0].attention
        for (name, ours), (_, theirs) in zip(module.named_parameters(), shared.named_parameters()):
            assert ours is theirs and ours.data_ptr() == theirs.data_ptr(), name

    # nothing added to the parameters, their hash, or the checkpoint's keys
    assert module_sha256(loaded.model) == module_sha256(eager)
    assert sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in eager.parameters())
    assert list(loaded.model.state_dict()) == list(eager.state_dict())
    loaded.model.load_state_dict(eager.state_dict())  # strict: the copies ask for no keys of their own

    # training sees each shared weight once, its gradient summed over the layers that use it
    ids = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")
    loaded.model(**ids).logits.square().sum().backward()
    eager(**ids).logits.square().sum().backward()
    for (name, ours), (_, theirs) in zip(loaded.model.named_parameters(), eager.named_parameters()):
        assert (ours.grad - theirs.grad).abs().max() <= 1e-5 * max(1.0, theirs.grad.abs().max().item()), name

    # a deep copy (fine-tuning makes one) keeps the sharing, among its own tensors
    twin = copy.deepcopy(loaded.model).albert.encoder
    weight = twin.albert_layer_groups[0].albert_layers[0].attention.query.weight
    assert twin.attnlens_layers[0].albert_layers[0].attention.query.weight is weight
    assert weight is not transformer.albert_layer_groups[0].albert_layers[0].attention.query.weight


def test_albert_inner_groups_are_refused():
    model = transformers.AlbertModel(transformers.AlbertConfig(**TINY, inner_group_num=2, embedding_size=32))
    with pytest.raises(UnsupportedModel, match="inner_group_num 2"):
        adapt(model, "albert")
