"""Windowed layers (sliding or local attention shorter than n) are analysed, not emptied.

A full row of a windowed layer is a query whose window lies inside the block; its keys enter
end-aligned on the last w key coordinates. The spectra are checked against numpy on the same
rows, gathered here by brute force from captured scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import attnlens
from attnlens.models.capture import Capture
from tiny_models import save_with_minilm_tokenizer

N = 24


def _windowed_model(tmp_path, minilm_l6, family: str):
    torch.manual_seed(0)
    common = dict(vocab_size=30522, hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=64)
    if family == "mistral":  # causal, sliding window of 8 keys in every layer
        config = transformers.MistralConfig(**common, num_hidden_layers=2, num_key_value_heads=2, sliding_window=8)
        model = transformers.MistralForCausalLM(config)
    else:  # encoder: layer 0 global, layers 1 and 2 local (|i - j| <= 4: 9 keys)
        config = transformers.ModernBertConfig(
            **common, num_hidden_layers=3, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0
        )
        model = transformers.ModernBertForMaskedLM(config)
    return attnlens.load_model(str(save_with_minilm_tokenizer(tmp_path / family, model, minilm_l6)))


def _brute_force_rows(model, ids: np.ndarray, layer: int, head: int) -> np.ndarray:
    """The full rows of one head: every query that sees the most keys, its visible keys in order."""
    with torch.no_grad(), Capture([layer]) as capture:
        model.run_attention(torch.as_tensor(ids))
    scores, valid = capture.scores[layer][:, head].double().numpy(), capture.valid[layer].numpy()
    width = valid.sum(-1).max()
    full = [(s, q) for s in range(len(ids)) for q in range(ids.shape[1]) if valid[s, q].sum() == width]
    return np.array([scores[s, q][valid[s, q]] for s, q in full])


@pytest.mark.parametrize("family", ["mistral", "modernbert"])
def test_windowed_layers_have_spectra_equal_to_numpy(tmp_path, minilm_l6, kjv, family):
    model = _windowed_model(tmp_path, minilm_l6, family)
    result = attnlens.eigen(model, corpus=kjv, seq_len=N, num_seqs=48, keep=N, progress=False)
    layers = result.table.query("level == 'layer'")
    assert (layers.rows > 0).all() and (layers.k90 > 0).all(), "every layer has rows and a spectrum"
    ids = kjv.blocks(model, N, 48, 0).ids  # the blocks eigen read (seed 0)
    windowed = {int(layer): keys for layer, keys in result.meta["windows"].items()}
    assert windowed == ({0: 8, 1: 8} if family == "mistral" else {1: 9, 2: 9})
    for layer in range(model.num_layers):
        rows = _brute_force_rows(model, ids, layer, head=1)
        width = rows.shape[1]
        expected = np.sort(np.linalg.eigvalsh(np.cov(rows.T)))[::-1]
        got = result.arrays["head_eigenvalues"][layer, 1, 0]
        np.testing.assert_allclose(got[:width], expected, rtol=1e-6, atol=1e-9)
        assert not got[width:].any(), "no variance outside the window's coordinates"
        unit = result.table.query(f"level == 'head' and layer == {layer} and head == 1").iloc[0]
        assert unit.rows == len(rows) and unit.num_keys == width
    assert "windowed layers" in result.meta["notes"]


def test_pooled_maps_refused_for_windowed_encoder_layers(tmp_path, minilm_l6, kjv):
    model = _windowed_model(tmp_path, minilm_l6, "modernbert")
    with pytest.raises(attnlens.BadInput, match="layers 1, 2 are windowed"):
        attnlens.reconstruct(model, corpus=kjv, seq_len=N, num_seqs=32, ks=[2], rows="pooled", progress=False)
    result = attnlens.reconstruct(model, corpus=kjv, seq_len=N, num_seqs=64, ks=[2], progress=False)
    assert result.meta["settings"]["rows"] == "per-query" and np.isfinite(result.table.rel_error).all()


@pytest.mark.slow
def test_gemma3_every_layer_has_a_spectrum_at_1024(gemma3, kjv):
    """gemma3-270m at n = 1,024: 15 sliding-window layers (512 keys) and 3 full ones, spectra
    against numpy for one sliding and one full layer (the full layers' pooled rows are the last
    query of each block, as in any causal model)."""
    result = attnlens.eigen(gemma3, corpus=kjv, seq_len=1024, num_seqs=2, layers=[4], keep=8, progress=False)
    layers = result.table.query("level == 'layer'").set_index("layer")
    assert result.meta["windows"] == {"4": 512}
    assert layers.loc[4].rows == 2 * 513 * 4  # every query from 511 on sees a whole window
    ids = kjv.blocks(gemma3, 1024, 2, 0).ids
    rows = _brute_force_rows(gemma3, ids, 4, head=0)
    expected = np.sort(np.linalg.eigvalsh(np.cov(rows.T)))[::-1][:8]
    np.testing.assert_allclose(result.arrays["head_eigenvalues"][0, 0, 0][:8], expected, rtol=1e-5)


def test_overlap_and_importance_read_every_windowed_layer(tmp_path, minilm_l6, kjv):
    """Overlap's chance level is set by the space the rows span (the window), and importance
    measures every layer of a windowed model: mass and entropy over the keys each query sees."""
    model = _windowed_model(tmp_path, minilm_l6, "mistral")
    spectra = attnlens.eigen(model, corpus=kjv, seq_len=N, num_seqs=48, keep=8, progress=False)
    shared = attnlens.overlap(spectra, dim=2, level=0.01, progress=False)  # a low level: every pair compared at some d
    pairs = shared.pairs
    assert len(pairs) and np.allclose(pairs.chance, pairs.d / 8), "two 8-key windows meet by chance at d / 8, not d / n"
    found = attnlens.importance(model, corpus=kjv, seq_len=N, num_seqs=16, progress=False)
    entropy = found.tables["entropy"]
    assert sorted(set(entropy.layer)) == [0, 1] and (entropy.entropy > 0).all()
    # uniform attention over a window of 8 (or fewer, at the block's start) keys: at most log 8
    assert (entropy.uniform_entropy <= np.log(8) + 1e-9).all()
