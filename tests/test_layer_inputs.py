"""Forwards that start at a layer (attnlens.models.layer_inputs) against full forwards of the same model.

Tolerances. ``forward_from(l)`` hands layer ``l`` the very values the full forward hands it
(the cached tensor is that forward's), with the same masks, positions, shapes and threads,
so layers ≥ l do the same float32 arithmetic in the same order: the outputs must be
bit-identical, and are checked with ``torch.equal``.

A stacked forward (``copies`` > 1) runs the same arithmetic on a larger batch. Each output
is still a function of its own row only, but a kernel may pick another blocking, vector
path or (on GPUs) split of a reduction for another batch size, which changes the order of
its sums. A sum of K float32 terms reordered moves by at most about K ulps of its magnitude
(the γ_K bound, γ_K ≈ K·2⁻²⁴); let the layers that run pass that on without amplifying it
and add up, and the bound on an output is ``layers × K × ulp(max |output|)``, with K the
longest reduction of a layer (the MLP's inner width here). That is loose (CPU kernels here
give bit-identical results); the tests check it, and also that the changes they judge move
the outputs at least ten times as far, so that the comparison can fail.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import attnlens
from attnlens import Capture
from attnlens.errors import BadInput
from attnlens.models import layer_inputs
from attnlens.models.layer_inputs import CHECKED_FAMILIES, LayerInputs, by_copy, cache_bytes, family, layer_modules, split_copies
from attnlens.models.partial import LayerPlan, attention_modules, planned
from zoo import CAPTURED, build


def verses(model: attnlens.LoadedModel, kjv: attnlens.Corpus, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Real verses of different lengths, padded as the model's tokenizer pads them (padding in the batch)."""
    batch = model.tokenizer(list(kjv.documents[:count]), padding=True, return_tensors="pt")
    assert not batch["attention_mask"].all(), "the batch must hold padding"
    return batch["input_ids"], batch["attention_mask"]


def score_noise(model: attnlens.LoadedModel, tokens: int, seed: int) -> torch.Tensor:
    """A random score change per layer and head, (layer, 1, head, query, key)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(model.num_layers, 1, model.num_heads, tokens, tokens, generator=generator)


def layers_that_ran(model: attnlens.LoadedModel) -> tuple[list[int], list]:
    """A log of the layers whose attention module runs, and the hooks that fill it."""
    ran: list[int] = []
    hooks = [
        module.register_forward_hook(lambda module, args, output, layer=layer: ran.append(layer))
        for layer, module in attention_modules(model.model).items()
    ]
    return ran, hooks


def reorder_bound(reference: torch.Tensor, layers: int, reduction: int) -> float:
    """``layers × reduction × ulp(max |reference|)`` in float32 (see the module docstring)."""
    ulp = 2.0 ** (torch.floor(torch.log2(reference.abs().max())).item() - 23)
    return layers * reduction * ulp


def longest_reduction(model: attnlens.LoadedModel, tokens: int) -> int:
    config = model.model.config.get_text_config()
    return max(config.hidden_size, config.intermediate_size, tokens)


def full_forward(model, ids, mask, head: bool) -> torch.Tensor:
    """The output of a plain forward: the head's (logits) or the backbone's (last hidden state)."""
    if head:
        output = model.model(input_ids=ids, attention_mask=mask)
        return output.logits if "logits" in output else output.last_hidden_state
    return model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state


def assert_starts_match_full(model, ids, mask, head_at: set[int]) -> None:
    """At every start layer, under a change in layers ≥ start: only those layers run, and the output is the full
    forward's (through the output head at the starts in ``head_at``, the backbone's at the others)."""
    cache = LayerInputs.record(model, ids, mask)
    assert cache.skips
    kept = [cache.hidden(layer).clone() for layer in range(1, model.num_layers)]
    noise = score_noise(model, ids.shape[1], seed=1)
    change = lambda layer, scores, valid: scores + noise[layer]
    with torch.no_grad():
        unmodified = {head: full_forward(model, ids, mask, head) for head in {False, bool(head_at)}}
    for start in range(model.num_layers):
        later, head = range(start, model.num_layers), start in head_at
        ran, hooks = layers_that_ran(model)
        try:
            with torch.no_grad(), Capture(layers=later, intervene=change, record=False):
                output = cache.forward_from(start, head=head)
                started = (
                    (output.logits if "logits" in output else output.last_hidden_state) if head else output.last_hidden_state
                )
        finally:
            for hook in hooks:
                hook.remove()
        assert ran == list(later), f"start {start}: layers {ran} ran"
        with torch.no_grad(), Capture(layers=later, intervene=change, record=False):
            full = full_forward(model, ids, mask, head)
        assert not torch.equal(full, unmodified[head]), f"start {start}: the change changes nothing, so the check could not fail"
        assert torch.equal(started, full), f"start {start}: {(started - full).abs().max().item():.3g} from the full forward"
    after = [cache.hidden(layer) for layer in range(1, model.num_layers)]
    assert all(torch.equal(before, now) for before, now in zip(kept, after)), "a forward changed the cache"


def test_minilm_forward_from_every_layer_equals_the_full_forward(minilm_l6, kjv):
    ids, mask = verses(minilm_l6, kjv, 6)
    assert_starts_match_full(minilm_l6, ids, mask, head_at=set(range(minilm_l6.num_layers)))


def test_gemma3_forward_from_every_layer_equals_the_full_forward(gemma3, kjv):
    """Causal, one key head for four query heads, sliding-window and full layers, rotary positions. The LM head
    (262k words: most of a forward's time here) is a function of the last hidden state; it runs at two starts."""
    assert {"sliding_attention", "full_attention"} <= set(gemma3.model.config.layer_types)
    ids, mask = verses(gemma3, kjv, 2)
    assert_starts_match_full(gemma3, ids, mask, head_at={1, gemma3.num_layers - 1})


def test_removing_the_diagonal_from_layer_3_on_matches_the_full_forward(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids)
    cache = LayerInputs.record(minilm_l6, ids)
    no_self = lambda layer, scores, valid: scores.masked_fill(torch.eye(scores.shape[-1], dtype=torch.bool), float("-inf"))
    with torch.no_grad(), Capture(layers=[3, 4, 5], intervene=no_self, record=False):
        started = cache.forward_from(3).last_hidden_state
        full = minilm_l6.forward(ids).last_hidden_state
    assert torch.equal(started, full)


def test_the_cache_holds_the_hidden_states_the_model_reports(minilm_l6, kjv):
    """An independent reading: transformers' own ``output_hidden_states`` (entry i is the input of layer i)."""
    ids, mask = verses(minilm_l6, kjv, 4)
    cache = LayerInputs.record(minilm_l6, ids, mask)
    with torch.no_grad():
        reported = minilm_l6.forward(ids, mask, output_hidden_states=True).hidden_states
    for layer in range(1, minilm_l6.num_layers):
        assert torch.equal(cache.hidden(layer), reported[layer])
    assert cache.nbytes == sum(output.nbytes for output in cache.outputs_) == cache_bytes(minilm_l6, *ids.shape)


def test_recording_sets_an_active_capture_aside(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    plain = LayerInputs.record(minilm_l6, ids)
    with Capture(intervene=lambda layer, scores, valid: scores * 0):
        inside = LayerInputs.record(minilm_l6, ids)
    assert all(torch.equal(a, b) for a, b in zip(plain.outputs_, inside.outputs_))


@pytest.mark.parametrize("budget", ["skipping", "over budget"])
def test_a_change_below_start_is_refused(minilm_l6, kjv_blocks, budget):
    """It would be skipped silently; refused whether or not the cache skips layers."""
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    cache = LayerInputs.record(minilm_l6, ids, budget_bytes=0 if budget == "over budget" else 2**30)
    assert cache.skips == (budget == "skipping")
    change = lambda layer, scores, valid: scores + 1.0
    for layers in (None, [2], [2, 3]):
        with Capture(layers=layers, intervene=change), pytest.raises(BadInput, match="reaches layer"):
            cache.forward_from(3)
    with planned(minilm_l6, {1: LayerPlan(n=ids.shape[1])}), pytest.raises(BadInput, match="partial plan"):
        cache.forward_from(3)
    with Capture(layers=None, intervene=change, record=False):  # nothing is skipped from layer 0
        cache.forward_from(0)
    with pytest.raises(BadInput, match="out of range"):
        cache.forward_from(minilm_l6.num_layers)


def test_over_budget_every_forward_is_full_and_equal(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids)
    cost = cache_bytes(minilm_l6, *ids.shape)
    assert LayerInputs.record(minilm_l6, ids, budget_bytes=cost).skips  # the budget is inclusive
    fallback = LayerInputs.record(minilm_l6, ids, budget_bytes=cost - 1)
    assert not fallback.skips and fallback.outputs_ is None and fallback.nbytes == cost
    with pytest.raises(BadInput, match="nothing was cached"):
        fallback.hidden(1)
    noise = score_noise(minilm_l6, ids.shape[1], seed=2)
    change = lambda layer, scores, valid: scores + noise[layer]
    ran, hooks = layers_that_ran(minilm_l6)
    try:
        with torch.no_grad(), Capture(layers=[4, 5], intervene=change, record=False):
            started = fallback.forward_from(4).last_hidden_state
            full = minilm_l6.forward(ids).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    assert ran == [*range(minilm_l6.num_layers)] * 2  # the fallback ran every layer
    assert torch.equal(started, full)


def per_head_changes(model, layer: int, noise: torch.Tensor) -> list:
    """Head h's change alone: a random change of its scores in ``layer``, nothing elsewhere."""

    def change(head: int):
        def intervene(at: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
            if at != layer:
                return None
            changed = scores.clone()
            changed[:, head] += noise[layer, :, head]
            return changed

        return intervene

    return [change(head) for head in range(model.num_heads)]


def assert_stacked_equals_separate(model, ids, mask, layer: int) -> None:
    cache = LayerInputs.record(model, ids, mask)
    changes = per_head_changes(model, layer, score_noise(model, ids.shape[1], seed=3))
    with torch.no_grad():
        stacked = cache.forward_each(layer, [*changes, None], head=False)
        separate = []
        for change in changes:
            with Capture(layers=range(layer, model.num_layers), intervene=change, record=False):
                separate.append(cache.forward_from(layer, head=False).last_hidden_state)
        unmodified = cache.forward_from(layer, head=False).last_hidden_state
    bound = reorder_bound(unmodified, model.num_layers - layer, longest_reduction(model, ids.shape[1]))
    # Real query rows only: a padding query's row is not attention anyone uses.
    rows = mask.bool()
    gap = lambda a, b: (a - b)[rows].abs().max().item()
    assert gap(stacked[-1]["last_hidden_state"], unmodified) <= bound, "the copy without a change moved"
    for head, alone in enumerate(separate):
        assert gap(stacked[head]["last_hidden_state"], alone) <= bound, f"head {head}: stacked and separate differ"
        assert gap(alone, unmodified) > 10 * bound, f"head {head}'s change is too small for the check to fail"
        others = [gap(stacked[head]["last_hidden_state"], other) for index, other in enumerate(separate) if index != head]
        assert min(others) > 10 * bound, f"copy {head} carries another head's change"


def test_minilm_all_heads_of_a_layer_in_one_forward(minilm_l6, kjv):
    ids, mask = verses(minilm_l6, kjv, 4)
    assert_stacked_equals_separate(minilm_l6, ids, mask, layer=2)


def test_gemma3_all_heads_of_a_layer_in_one_forward(gemma3, kjv):
    ids, mask = verses(gemma3, kjv, 3)
    assert_stacked_equals_separate(gemma3, ids, mask, layer=9)


def test_by_copy_slices_and_leaves_unchanged_copies_alone():
    scores = torch.arange(3 * 2 * 1 * 2 * 2, dtype=torch.float32).reshape(6, 1, 2, 2)
    valid = torch.ones(6, 2, 2, dtype=torch.bool)
    seen = []
    record = lambda layer, s, v: seen.append(s.clone())
    assert by_copy([None, None, None], batch=2)(0, scores, valid) is None
    assert by_copy([record, None, record], batch=2)(0, scores, valid) is None
    assert torch.equal(seen[0], scores[:2]) and torch.equal(seen[1], scores[4:])
    negate = lambda layer, s, v: -s
    out = by_copy([None, negate, None], batch=2)(0, scores, valid)
    assert torch.equal(out[2:4], -scores[2:4]) and torch.equal(out[:2], scores[:2]) and torch.equal(out[4:], scores[4:])
    with pytest.raises(BadInput, match="copies"):
        by_copy([negate, negate], batch=2)(0, scores, valid)
    assert torch.equal(split_copies(scores, 3)[1], scores[2:4])
    with pytest.raises(BadInput, match="does not divide"):
        split_copies(scores, 4)


# ---------------------------------------------------------------------------- every family known to replay (tiny random models)

# The families of CHECKED_FAMILIES that tests/zoo.py has no model of, built the same way.
_H = dict(vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
          max_position_embeddings=64, pad_token_id=0, bos_token_id=101, eos_token_id=102)  # fmt: skip
_BART = dict(vocab_size=30522, d_model=64, encoder_layers=3, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=101,
             eos_token_id=102, decoder_start_token_id=102)  # fmt: skip
MORE = {
    "xlm-roberta": lambda: (transformers.XLMRobertaConfig(**{**_H, "max_position_embeddings": 66}), "XLMRobertaModel"),
    "mbart": lambda: (transformers.MBartConfig(**_BART), "MBartModel"),
    "phi": lambda: (transformers.PhiConfig(**_H), "PhiForCausalLM"),
    "cohere": lambda: (transformers.CohereConfig(**_H, num_key_value_heads=2), "CohereForCausalLM"),
    "starcoder2 (sliding 4)": lambda: (
        transformers.Starcoder2Config(**_H, num_key_value_heads=2, sliding_window=4),
        "Starcoder2ForCausalLM",
    ),
    "olmo": lambda: (transformers.OlmoConfig(**_H), "OlmoForCausalLM"),
}
FAMILY_MODELS = {**CAPTURED, **MORE}


def _family(make) -> str:
    return make()[0].get_text_config().model_type


def test_every_family_known_to_replay_has_a_tiny_model_here():
    assert {_family(make) for make in FAMILY_MODELS.values()} == CHECKED_FAMILIES


@pytest.mark.parametrize("architecture", list(FAMILY_MODELS))
def test_each_known_family_finds_its_layers_and_starts_anywhere(architecture, minilm_l6, kjv, tmp_path):
    """A random model of each family (an extra: the real models are above), from every layer under a change."""
    path, _ = build(tmp_path, minilm_l6, FAMILY_MODELS[architecture])
    model = attnlens.load_model(str(path))
    assert family(model) in CHECKED_FAMILIES
    attention = attention_modules(model.model)
    for index, layer in enumerate(layer_modules(model)):
        assert attention[index] in list(layer.modules())
    ids, mask = verses(model, kjv, 3)
    assert_starts_match_full(model, ids, mask, head_at={1})


def test_a_family_not_known_is_checked_once_and_runs_in_full_where_its_replay_fails(minilm_l6, kjv, tmp_path, monkeypatch):
    """Any other family is checked on its first record, once per model; a replay that hands a layer the wrong
    input (here: every recorded output halved) fails the check, says so once, and every forward is full."""
    monkeypatch.setattr(layer_inputs, "CHECKED_FAMILIES", frozenset())
    checks = []
    check = layer_inputs._check_replay
    monkeypatch.setattr(layer_inputs, "_check_replay", lambda *args: checks.append(1) or check(*args))
    path, _ = build(tmp_path, minilm_l6, CAPTURED["bert"])
    ids, mask = verses(minilm_l6, kjv, 3)
    sound = attnlens.load_model(str(path))
    assert LayerInputs.record(sound, ids, mask).skips and LayerInputs.record(sound, ids[:2], mask[:2]).skips
    assert len(checks) == 1
    broken = attnlens.load_model(str(path))
    detached = layer_inputs._detached
    monkeypatch.setattr(layer_inputs, "_detached", lambda output: detached(output) * 0.5)
    with pytest.warns(attnlens.AttnlensWarning, match="judged by a full forward") as warned:
        cache = LayerInputs.record(broken, ids, mask)
        LayerInputs.record(broken, ids, mask)
    assert len(warned) == 1 and not cache.skips and len(checks) == 2
    noise = score_noise(broken, ids.shape[1], seed=4)
    change = lambda layer, scores, valid: scores + noise[layer]
    with torch.no_grad(), Capture(layers=[1, 2], intervene=change, record=False):
        started = cache.forward_from(1).last_hidden_state
        full = broken.forward(ids, mask).last_hidden_state
    assert torch.equal(started, full)
