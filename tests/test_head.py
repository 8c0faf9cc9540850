"""The language-model head applied where a loss is read, a chunk of positions at a time
(attnlens/models/head.py): the same losses and gradients as the whole forward's logits, on tiny random
models of the families that transform their logits and of those that do not, without ever holding more
than a chunk of logits; a family whose head it does not reproduce keeps the whole forward."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import attnlens
from attnlens.analysis.objectives import Objective, _mean_loss
from attnlens.models import head as heads
from attnlens.models.capture import Capture
from tiny_models import save_tiny
from zoo import CAPTURED, build, llama_like

# causal families: plain (gpt2, opt, llama), soft-capped logits (gemma2), scaled (granite, cohere2), sliding windows
FAMILIES = ["gpt2", "opt", "llama (GQA 4/2)", "gemma2 (sliding 4 + softcap)", "granite", "cohere2 (sliding 4)",
            "gemma3_text (sliding 4)"]  # fmt: skip


def _loaded(tmp_path, minilm_l6, make) -> attnlens.LoadedModel:
    path, _ = build(tmp_path, minilm_l6, make)
    return attnlens.load_model(str(path))


def _ids(model: attnlens.LoadedModel, blocks: int = 3, n: int = 12) -> torch.Tensor:
    return torch.randint(1000, 20000, (blocks, n), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_chunked_head_gives_the_whole_forwards_losses_and_gradients(family, tmp_path, minilm_l6, monkeypatch):
    """Per block, the loss of the head applied chunk by chunk (3 positions a chunk here) against the cross-entropy
    of the model's own full logits; and the gradient of their sum with respect to an attention weight, through a
    frozen head (the gradient taken chunk by chunk) and through a trained one (recomputed chunk by chunk)."""
    if family == "granite":  # a logits scale other than 1, so that the transform is tested
        make = lambda: (llama_like(T.GraniteConfig, num_key_value_heads=2, attention_multiplier=0.3, logits_scaling=4.0),
                        "GraniteForCausalLM")  # fmt: skip
    elif family == "cohere2 (sliding 4)":
        make = lambda: (llama_like(T.Cohere2Config, num_key_value_heads=2, sliding_window=4, logit_scale=0.25,
                                   layer_types=["sliding_attention", "full_attention"]), "Cohere2ForCausalLM")  # fmt: skip
    else:
        make = CAPTURED[family]
    model = _loaded(tmp_path, minilm_l6, make)
    head = heads.language_head(model)
    assert head is not None, "every one of these families' heads is reproduced"
    monkeypatch.setattr(heads, "CHUNK_BYTES", 3 * 4 * head.vocabulary)  # three positions a chunk: chunks meet inside blocks
    objective = Objective(model, "clm")
    batch = objective.prepare(_ids(model))
    weight = next(p for name, p in model.model.named_parameters() if "layers.0" in name or ".h.0." in name)
    for trained in (False, True):
        for parameter in model.model.parameters():
            parameter.requires_grad_(False)
        weight.requires_grad_(True)
        for module in head.modules:
            module.requires_grad_(trained)
        chunked = objective.evaluate(batch)["loss"]
        (expected_gradient,) = torch.autograd.grad(
            _mean_loss(model.forward(batch.input_ids).logits, batch.labels, "clm").sum(), weight
        )
        with torch.no_grad():
            whole = _mean_loss(model.forward(batch.input_ids).logits, batch.labels, "clm")
        torch.testing.assert_close(chunked.detach(), whole, rtol=1e-5, atol=1e-5)
        (gradient,) = torch.autograd.grad(chunked.sum(), weight)
        torch.testing.assert_close(gradient, expected_gradient, rtol=1e-4, atol=1e-6)


def test_a_masked_lm_reads_the_head_at_its_masked_positions_only(tmp_path, minilm_l6, monkeypatch):
    """BertForMaskedLM: the same per-block loss as the whole logits, with logits computed for the masked
    positions alone (about 15% of the tokens), never for all of them."""
    model = attnlens.load_model(str(save_tiny(tmp_path / "mlm", minilm_l6, "mlm")))
    head = heads.language_head(model)
    assert head is not None
    shapes = []
    original = heads.LanguageHead.logits

    def recorded(self, hidden):
        shapes.append(tuple(hidden.shape))
        return original(self, hidden)

    monkeypatch.setattr(heads.LanguageHead, "logits", recorded)
    objective = Objective(model, "mlm")
    batch = objective.prepare(_ids(model, blocks=4, n=40))
    with torch.no_grad():
        losses = objective.evaluate(batch)["loss"]
        whole = _mean_loss(model.forward(batch.input_ids).logits, batch.labels, "mlm")
    torch.testing.assert_close(losses, whole, rtol=1e-5, atol=1e-5)
    scored = int((batch.labels != -100).sum())
    assert sum(shape[0] for shape in shapes) == scored < batch.input_ids.numel() / 3


def test_no_chunk_holds_more_logits_than_its_budget_and_a_capture_still_changes_the_loss(tmp_path, minilm_l6, monkeypatch):
    model = _loaded(tmp_path, minilm_l6, CAPTURED["llama (GQA 4/2)"])
    head = heads.language_head(model)
    assert head is not None
    monkeypatch.setattr(heads, "CHUNK_BYTES", 5 * 4 * head.vocabulary)
    seen = []
    original = heads.LanguageHead.logits
    monkeypatch.setattr(heads.LanguageHead, "logits", lambda self, hidden: seen.append(hidden.shape[0]) or original(self, hidden))
    objective = Objective(model, "clm")
    batch = objective.prepare(_ids(model, blocks=4, n=12))
    with torch.no_grad():
        plain = objective.evaluate(batch)["loss"]
        # the diagonal removed in every layer: the loss read through the chunked head moves, as the whole forward's does
        diagonal = torch.eye(12, dtype=torch.bool)
        with Capture(intervene=lambda layer, scores, valid: scores.masked_fill(diagonal, float("-inf")), record=False):
            changed = objective.evaluate(batch)["loss"]
            whole = _mean_loss(model.forward(batch.input_ids).logits, batch.labels, "clm")
    assert max(seen) <= 5 and sum(seen[: 4 * 11 // 5 + 1]) >= 4 * 11 - 5
    torch.testing.assert_close(changed, whole, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(changed, plain)


def test_a_head_the_check_does_not_reproduce_keeps_the_whole_forward(tmp_path, minilm_l6, monkeypatch):
    """A family whose forward transforms its logits in a way not listed: the check refuses the chunked head (here
    Gemma 2's soft-capping, taken out of the list), and the losses come from the model's own logits."""
    model = _loaded(tmp_path, minilm_l6, CAPTURED["gemma2 (sliding 4 + softcap)"])
    monkeypatch.setattr(heads, "TRANSFORMS", {})
    monkeypatch.setattr(heads, "_CHECKED", type(heads._CHECKED)())
    assert heads.language_head(model) is None
    objective = Objective(model, "clm")
    batch = objective.prepare(_ids(model))
    with torch.no_grad():
        torch.testing.assert_close(
            objective.evaluate(batch)["loss"], _mean_loss(model.forward(batch.input_ids).logits, batch.labels, "clm")
        )
