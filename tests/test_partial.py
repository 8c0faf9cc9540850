"""Partial attention ("attnlens-partial") against the plug-in path, and masks run as sparse attention.

The partial function computes only the k chosen scores of each query and rebuilds the rest;
the plug-in path (reconstruct's ``reconstruction`` inside a capture) computes every score and
replaces them. The two differ only in how the k exact scores are summed (a gather then a
product, against one product over all keys), a few float32 roundings per score: the outputs
must agree to a small multiple of float32 resolution at the output's scale, and differ from
the unmodified model by orders of magnitude more (so the check can fail).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens import BadInput, Capture
from attnlens.analysis.plan.choices import window_keep
from attnlens.analysis.reconstruct import MapFitter, reconstruction
from attnlens.models.partial import LayerPlan, MaskedHeads, PartialHeads, planned
from attnlens.models.sparse import block_mask, masked_attention
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.sources import ModelRows

# float32 has 24 bits; each output goes through every layer, so rounding differences of a few
# ulps per score grow by the layers' gain. 1e-4 of the output's scale is far above that and far
# below what a change of the maps does (the unmodified outputs differ by 1e-1 of the scale).
RELATIVE = 1e-4
MODELS = ["minilm_l6", pytest.param("gemma3", marks=pytest.mark.slow)]


def _fitter(model, kjv, n: int, blocks: int) -> tuple[MapFitter, torch.Tensor]:
    every = kjv.blocks(model, n, blocks, 0)
    queries = list(range(n)) if model.causal else None
    moments = compute_moments(ModelRows(model, every), queries=queries, progress=False).total
    return MapFitter(moments, ridge=1e-3, seed=0, global_positions=(0,)), torch.from_numpy(every.ids[:3])


def _outputs(model, ids, plans=None, intervene=None):
    with torch.no_grad():
        if plans is not None:
            with planned(model, plans):
                return model.forward(ids)[0]
        if intervene is not None:
            with Capture(intervene=intervene, record=False):
                return model.forward(ids)[0]
        return model.forward(ids)[0]


@pytest.mark.integration
@pytest.mark.parametrize("name", MODELS)
def test_partial_attention_equals_the_plug_in_path(name, request, kjv):
    """Every head of every layer partial at k = 4 (gemma: a map per query position): the same
    outputs as reconstruct's plug-in, to float tolerance."""
    model = request.getfixturevalue(name)
    n = 24
    fitter, ids = _fitter(model, kjv, n, 40)
    maps = {layer: fitter.layer_maps("greedy", "head", 4, layer)[0] for layer in range(model.num_layers)}
    assert maps[0].positions.shape[1] == (n if model.causal else 1)
    plans = {
        layer: LayerPlan(n, partial=[PartialHeads(list(range(model.num_heads)), m.positions, m.weights, m.offset)])
        for layer, m in maps.items()
    }
    partial = _outputs(model, ids, plans=plans)
    plug_in = _outputs(model, ids, intervene=reconstruction(maps).intervene)
    unmodified = _outputs(model, ids)
    scale = float(plug_in.abs().max())
    assert float((partial - plug_in).abs().max()) <= RELATIVE * scale
    assert float((unmodified - plug_in).abs().max()) >= 100 * RELATIVE * scale


@pytest.mark.integration
@pytest.mark.parametrize("name", MODELS)
def test_a_mixed_plan_runs_the_same_both_ways(name, request, kjv):
    """Heads at different k, windows and exact heads in one layer: the partial function against the
    layer plans' own plug-in form (every score computed, then replaced)."""
    model = request.getfixturevalue(name)
    n = 24
    fitter, ids = _fitter(model, kjv, n, 40)
    heads = model.num_heads
    plans = {}
    for layer in range(model.num_layers):
        two, four = fitter.layer_maps("greedy", "head", 2, layer)[0], fitter.layer_maps("greedy", "head", 4, layer)[0]
        plans[layer] = LayerPlan(
            n,
            partial=[
                PartialHeads([0], two.positions[[0]], two.weights[[0]].float(), two.offset[[0]].float()),
                PartialHeads([heads - 1], four.positions[[-1]], four.weights[[-1]].float(), four.offset[[-1]].float()),
            ],
            masked=[MaskedHeads([1], window_keep(n, 2, model.causal))],
        )
    partial = _outputs(model, ids, plans=plans)
    plug_in = _outputs(model, ids, intervene=lambda layer, scores, valid: plans[layer].replace(scores))
    scale = float(plug_in.abs().max())
    assert float((partial - plug_in).abs().max()) <= RELATIVE * scale
    assert float((_outputs(model, ids) - plug_in).abs().max()) >= 100 * RELATIVE * scale


@pytest.mark.integration
@pytest.mark.parametrize("name", MODELS)
def test_a_plan_with_every_head_exact_is_the_model_bit_for_bit(name, request):
    model = request.getfixturevalue(name)
    ids = torch.tensor([[2, 101, 7592, 2088, 2003, 1037, 3231, 102]])
    plans = {layer: LayerPlan(8) for layer in range(model.num_layers)}
    assert torch.equal(_outputs(model, ids, plans=plans), _outputs(model, ids))


def test_a_plan_refuses_inputs_of_another_length(minilm_l6):
    with pytest.raises(BadInput, match="made for sequences of 8 tokens, not 5"):
        _outputs(minilm_l6, torch.tensor([[101, 7592, 2088, 2003, 102]]), plans={0: LayerPlan(8)})
    assert _outputs(minilm_l6, torch.tensor([[101, 102]])).shape[1] == 2  # and leaves the model as it was


def test_masked_attention_kernels_agree_with_a_numpy_softmax():
    """sdpa with a boolean mask and FlexAttention (eager: no compiler in a unit test) against numpy."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 8, generator=generator) for _ in range(3))
    keep = window_keep(256, 12, causal=False)
    scores = (q @ k.transpose(-1, -2)).double().numpy() / np.sqrt(8)
    scores = np.where(keep.numpy(), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v.double().numpy()
    for kernel in ("sdpa", "flex"):
        out = masked_attention(q, k, v, keep, kernel=kernel, compiled=False)
        assert np.abs(out.double().numpy() - expected).max() < 1e-5, kernel
    # a band of 25 keys in 256: of the 2 × 2 blocks of 128, the two off the diagonal still hold keys
    assert block_mask(keep).sparsity() == 0.0
    assert block_mask(window_keep(512, 12, causal=False)).sparsity() > 0.0
