"""Objectives against losses computed by hand, and the masked-token choice's guarantees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlens
from attnlens import Capture
from attnlens.analysis.objectives import MASK_RATE, Objective, resolve_objective
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory, minilm_l6):
    return attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("causal"), minilm_l6, "causal")))


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory, minilm_l6):
    return attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("mlm"), minilm_l6, "mlm")))


def next_token_loss_by_hand(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Mean over positions t = 0..n-2 of -log softmax(logits[t])[ids[t + 1]], per block, in float64."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    n = ids.shape[1]
    picked = np.take_along_axis(log_probs[:, : n - 1], ids[:, 1:, None], axis=-1)[..., 0]
    return -picked.mean(1)


def test_clm_loss_is_next_token_cross_entropy(tiny_causal, kjv):
    ids = kjv.blocks(tiny_causal, n=24, num_blocks=3, seed=0).ids
    objective = Objective(tiny_causal)
    assert objective.name == "clm"
    with torch.no_grad():
        loss = objective.evaluate(objective.prepare(torch.from_numpy(ids)))["loss"].numpy()
        logits = tiny_causal.forward(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(loss, next_token_loss_by_hand(logits, ids), rtol=1e-5)


@pytest.mark.slow
def test_clm_loss_on_gemma(gemma3, kjv):
    ids = kjv.blocks(gemma3, n=16, num_blocks=2, seed=1).ids
    objective = Objective(gemma3, "clm")
    with torch.no_grad():
        loss = objective.evaluate(objective.prepare(torch.from_numpy(ids)))["loss"].numpy()
        logits = gemma3.forward(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(loss, next_token_loss_by_hand(logits, ids), rtol=1e-4)
    assert 0.5 < loss.mean() < 8, "a trained model predicts the Bible far better than chance (ln 262144 = 12.5)"


def test_mlm_masks_are_seeded_per_block_and_never_special(tiny_mlm, kjv):
    ids = torch.from_numpy(kjv.blocks(tiny_mlm, n=48, num_blocks=6, seed=0).ids)
    objective = Objective(tiny_mlm, seed=7)
    assert objective.name == "mlm"
    whole = objective.prepare(ids)
    halves = [objective.prepare(ids[:3], offset=0), objective.prepare(ids[3:], offset=3)]
    assert torch.equal(whole.labels, torch.cat([h.labels for h in halves])), "masks depend on the block, not the batching"
    assert torch.equal(whole.input_ids, torch.cat([h.input_ids for h in halves]))
    assert torch.equal(objective.prepare(ids).labels, whole.labels), "same seed, same masks"
    assert not torch.equal(Objective(tiny_mlm, seed=8).prepare(ids).labels, whole.labels)

    chosen = whole.labels != -100
    special = torch.isin(ids, torch.tensor(sorted(tiny_mlm.special.all_special)))
    assert not (chosen & special).any(), "special tokens are never masked"
    assert torch.equal(whole.labels[chosen], ids[chosen])
    assert (whole.input_ids[chosen] == tiny_mlm.special.mask).all()
    assert torch.equal(whole.input_ids[~chosen], ids[~chosen])
    assert chosen.any(1).all(), "every block scores at least one token"
    rate = chosen.sum() / (~special).sum()
    assert abs(float(rate) - MASK_RATE) < 0.06


def test_mlm_loss_is_cross_entropy_on_masked_tokens(tiny_mlm, kjv):
    ids = torch.from_numpy(kjv.blocks(tiny_mlm, n=32, num_blocks=2, seed=2).ids)
    objective = Objective(tiny_mlm, seed=1)
    batch = objective.prepare(ids)
    with torch.no_grad():
        loss = objective.evaluate(batch)["loss"].numpy()
        logits = tiny_mlm.forward(batch.input_ids).logits.double().numpy()
    for block in range(2):
        positions = (batch.labels[block] != -100).nonzero()[:, 0].numpy()
        rows = logits[block, positions]
        log_probs = rows - rows.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        expected = -log_probs[np.arange(len(positions)), ids[block, positions].numpy()].mean()
        assert loss[block] == pytest.approx(expected, rel=1e-5)


def test_hidden_loss_is_zero_unmodified_and_rises_under_an_intervention(minilm_l6, kjv_blocks):
    objective = Objective(minilm_l6)
    assert objective.name == "hidden"
    batch = objective.prepare(torch.from_numpy(kjv_blocks.ids[:4]))
    with torch.no_grad():
        plain = objective.evaluate(batch)
        with Capture(layers=[1], intervene=lambda layer, scores, valid: scores * 0):  # uniform attention in layer 1
            changed = objective.evaluate(batch)
    assert torch.equal(plain["loss"], torch.zeros(4))
    assert torch.allclose(plain["pooled_cosine"], torch.ones(4))
    assert (changed["loss"] > 1e-3).all() and (changed["pooled_cosine"] < 1).all()
    # by hand: 1 - mean over tokens of the cosine between final hidden states
    with torch.no_grad(), Capture(layers=[1], intervene=lambda layer, scores, valid: scores * 0):
        hidden = minilm_l6.forward(batch.input_ids).last_hidden_state.double()
    reference = batch.reference.double()
    cosine = (hidden * reference).sum(-1) / hidden.norm(dim=-1) / reference.norm(dim=-1)
    assert torch.allclose(changed["loss"].double(), 1 - cosine.mean(1), atol=1e-6)


def test_objective_choice(minilm_l6, tiny_mlm):
    assert resolve_objective(minilm_l6, "auto") == "hidden"
    assert resolve_objective(tiny_mlm, "auto") == "mlm" and resolve_objective(tiny_mlm, "hidden") == "hidden"
    with pytest.raises(attnlens.AttnlensError, match="objective mlm needs a masked language-model head"):
        resolve_objective(minilm_l6, "mlm")
    with pytest.raises(attnlens.AttnlensError, match="objective xent is unknown"):
        resolve_objective(minilm_l6, "xent")


@pytest.mark.slow
def test_hidden_states_of_a_language_model_skip_its_head_and_equal_a_full_forward(gemma3, kjv):
    """gemma's hidden objective asks for the logits of the last position only (its 262k-word head is
    most of a step's cost); the hidden states it compares are those of a full forward."""
    objective = Objective(gemma3, "hidden")
    assert objective._no_head == {"logits_to_keep": 1}
    ids = torch.as_tensor(kjv.blocks(gemma3, n=32, num_blocks=2, seed=0).ids)
    with torch.no_grad():
        full = gemma3.forward(ids, output_hidden_states=True)
        prepared = objective.prepare(ids)
    assert full.logits.shape[1] == 32
    torch.testing.assert_close(prepared.reference, full.hidden_states[-1].float(), rtol=0, atol=0)
    assert float(objective.evaluate(prepared)["loss"].abs().max()) < 1e-5, "unmodified: no loss"
