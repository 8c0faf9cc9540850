"""Plans in seconds: "attnlens-kernels" against the eager partial path, the timing table, --cost seconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlens
from attnlens.analysis.plan import seconds
from attnlens.analysis.plan.choices import EXACT, Choice, window_keep
from attnlens.analysis.plan.seconds import Geometry, Timings, measure
from attnlens.models.kernels import KERNEL_IMPLEMENTATION
from attnlens.models.partial import PARTIAL_IMPLEMENTATION, LayerPlan, MaskedHeads, PartialHeads, planned
from tiny_models import assert_one_line_error, run_cli

N = 16
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    """FlexAttention uncompiled: the same block masks and the same kernel wiring, without a compile of
    ~20 s per shape on 2 cores (bench/bench_plan_seconds.py checks the compiled kernel on gemma3-270m)."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr("attnlens.models.sparse.compiled_flex", lambda: flex_attention)


def _mixed_plans(model, n: int, kernel: str) -> dict[int, LayerPlan]:
    """Every layer: two window heads (one narrow, one wide), one partial head, the rest exact."""
    causal, heads = model.causal, model.num_heads
    return {
        layer: LayerPlan(
            n,
            partial=[_random_partial(model, heads - 1, n, layer)],
            masked=[MaskedHeads([0], window_keep(n, 1, causal), kernel), MaskedHeads([1], window_keep(n, 4, causal), kernel)],
        )
        for layer in range(model.num_layers)
    }


def _random_partial(model, head: int, n: int, seed: int) -> PartialHeads:
    """One partial head at k = 4 with random keys and maps (per query for a causal model)."""
    geometry = Geometry(1, 1, model.head_dim, model.causal)
    maps = seconds._random_maps(geometry, n, 4, torch.Generator().manual_seed(seed))
    return PartialHeads([head], maps.positions, maps.weights, maps.offset)


def _outputs(model, ids, mask, plans, implementation) -> torch.Tensor:
    with torch.no_grad(), planned(model, plans, implementation):
        return model.forward(ids, mask)[0]  # last hidden states, or logits


def _blocks_with_padding(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three kjv blocks, the last padded after its first n/2 tokens (so masks reach every kernel)."""
    ids = torch.from_numpy(attnlens.load_corpus("kjv").blocks(model, n, 3, 0).ids)
    mask = torch.ones_like(ids)
    mask[-1, n // 2 :] = 0
    return ids, mask


@pytest.mark.parametrize("kernel", ["sdpa", "flex"])
def test_the_kernels_run_a_plan_as_the_eager_partial_path_does(minilm_l3, kernel):
    """A real encoder on real text with padding: the same plan through "attnlens-kernels" (exact heads on
    sdpa, windows on ``kernel``, partial heads) and through "attnlens-partial" (eager) agree at every valid
    position to float32 rounding (sums in another order: a few ulps of values of order 1 through 3 layers,
    bounded here by 1e-4), while the plan moves the outputs by far more; with no plan, the kernels are sdpa."""
    ids, mask = _blocks_with_padding(minilm_l3, N)
    valid = mask.bool()
    plans = _mixed_plans(minilm_l3, N, kernel)
    eager = _outputs(minilm_l3, ids, mask, plans, PARTIAL_IMPLEMENTATION)
    fast = _outputs(minilm_l3, ids, mask, plans, KERNEL_IMPLEMENTATION)
    exact = _outputs(minilm_l3, ids, mask, {}, PARTIAL_IMPLEMENTATION)
    assert (eager - fast)[valid].abs().max() < 1e-4
    assert (eager - exact)[valid].abs().max() > 1e-1
    minilm_l3.model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            sdpa = minilm_l3.forward(ids, mask).last_hidden_state
    finally:
        minilm_l3.model.set_attn_implementation("attnlens")
    assert (_outputs(minilm_l3, ids, mask, {}, KERNEL_IMPLEMENTATION) - sdpa)[valid].abs().max() < 1e-5


def test_the_kernels_run_a_causal_plan_as_the_eager_partial_path_does(gemma3):
    """gemma3-270m (causal, grouped-query, sliding-window layers): per-query partial maps and windows on both
    kernels, the kernels against the eager path on real text."""
    ids = torch.from_numpy(attnlens.load_corpus("kjv").blocks(gemma3, N, 2, 0).ids)
    mask = torch.ones_like(ids)
    exact = _outputs(gemma3, ids, mask, {}, PARTIAL_IMPLEMENTATION)
    for kernel in ("sdpa", "flex"):
        plans = _mixed_plans(gemma3, N, kernel)
        eager = _outputs(gemma3, ids, mask, plans, PARTIAL_IMPLEMENTATION)
        fast = _outputs(gemma3, ids, mask, plans, KERNEL_IMPLEMENTATION)
        scale = eager.abs().max()  # gemma3's hidden states reach hundreds: the bound is relative
        assert (eager - fast).abs().max() < 1e-4 * scale
        assert (eager - exact).abs().max() > 1e-2 * scale


# ---------------------------------------------------------------------------- the timing table


def test_the_timing_table_is_measured_once_per_machine_and_shape(tmp_path, monkeypatch):
    """A second table of the same shapes on the same machine is read from the cache (timing again would
    fail here); other shapes are timed; a model with two kinds of layer gets a table for each."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    geometry, choices = Geometry(2, 1, 8, causal=True, spans=(None, 3, 3)), [Choice("partial", 2), Choice("window", 2)]
    first = measure(geometry, N, choices, repeats=1)
    assert set(first.seconds) == {"all", "within 3"}
    assert all(set(table) == {"exact", "partial(2)", "window(2)"} for table in first.seconds.values())
    assert all(value > 0 for table in first.seconds.values() for value in table.values())
    timed = seconds._timed
    monkeypatch.setattr(seconds, "_timed", lambda *args: pytest.fail("timed again"))
    assert measure(geometry, N, choices, repeats=1) == first
    monkeypatch.setattr(seconds, "_timed", timed)
    assert measure(geometry, 2 * N, choices, repeats=1).seconds.keys() == first.seconds.keys()


def test_each_window_runs_on_its_faster_kernel(monkeypatch):
    """The table's two columns (sdpa or the choice's own path; FlexAttention, NaN where it did not run):
    a window's price and kernel are the faster column's."""
    choices = [Choice("partial", 2), Choice("window", 1), Choice("window", 4)]
    table = np.array([[4.0, np.nan], [6.0, np.nan], [3.0, 1.0], [2.0, np.nan]])
    monkeypatch.setattr(seconds, "_timed", lambda *args: table)
    timings = measure(Geometry(2, 1, 8, causal=False), N, choices, cached=False)
    assert [timings.price(0, c) for c in [EXACT, *choices]] == [4.0, 6.0, 1.0, 2.0]
    assert timings.kernels_of(0) == {"window(1)": "flex", "window(4)": "sdpa"}
    assert Timings.read(timings.describe()) == timings


def test_each_layer_is_timed_under_the_mask_the_model_gives_it(gemma3):
    """gemma3-270m's sliding layers (a window of 512 keys) and full layers, past 512 tokens: the mask each
    layer's attention receives in a forward is the mask its table is timed under (layer_spans, from the config)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from attnlens.models.attention import attnlens_mask
    from attnlens.models.kernels import kernel_attention

    n, received = 520, {}

    def recording(module, query, key, value, attention_mask, *args, **kwargs):
        received[module.attnlens_layer] = attention_mask[0, 0].clone()
        return kernel_attention(module, query, key, value, attention_mask, *args, **kwargs)

    AttentionInterface.register("attnlens-test-recording", recording)
    AttentionMaskInterface.register("attnlens-test-recording", attnlens_mask)
    ids = torch.from_numpy(attnlens.load_corpus("kjv").blocks(gemma3, n, 1, 0).ids)
    with torch.no_grad(), planned(gemma3, {}, "attnlens-test-recording"):
        gemma3.run_attention(ids)
    spans = seconds.layer_spans(gemma3)
    assert set(spans) == {None, 511}
    for layer, span in enumerate(spans):
        assert torch.equal(received[layer], seconds._layer_mask(n, span, True, "cpu")[0, 0]), layer


def test_a_seconds_plan_spends_measured_time_and_runs_its_windows_on_their_kernels(minilm_l3, monkeypatch):
    """With a timing table where only the wide window is faster than exact (and runs on flex), a seconds plan
    offers nothing else, reports the table's predicted seconds share beside the FLOPs share, keeps the table in
    its provenance, and applies with the table's kernel."""
    table = {"exact": 1.0, "partial(2)": 3.0, "window(1)": 1.5, "window(4)": 0.4}
    fake = Timings((None,) * 3, {"all": table}, {"all": {"window(1)": "sdpa", "window(4)": "flex"}}, {"processor": "test"})
    monkeypatch.setattr("attnlens.analysis.plan.measure", lambda *args, **kwargs: fake)
    settings = dict(seq_len=N, fit_seqs=8, curve_seqs=4, select_seqs=4, eval_seqs=4, ks=[2], widths=[1, 4], batch_size=8)
    result = attnlens.plan(minilm_l3, max_loss=[0.5], cost="seconds", progress=False, **settings)
    assert set(result.tables["curves"].choice) == {"window(4)"}
    plan = result.methods.query("method == 'plan'").iloc[0]
    chosen = result.assignment(0.5)
    windows = sum(choice == Choice("window", 4) for choice in chosen.values())
    assert windows > 0
    assert plan.seconds_ratio == pytest.approx(1 - windows * 0.6 / len(chosen))
    kernels = {part.kernel for layer in result.layer_plans(0.5).values() for part in layer.masked}
    assert kernels == {"flex"}


@pytest.mark.integration
def test_seconds_with_nothing_faster_than_exact_is_refused_in_one_line(capsys, tmp_path, monkeypatch):
    table = {"exact": 1.0, "partial(2)": 2.0, "window(2)": 1.0}
    fake = Timings((None,) * 3, {"all": table}, {"all": {"window(2)": "sdpa"}}, {})
    monkeypatch.setattr("attnlens.analysis.plan.measure", lambda *args, **kwargs: fake)
    code, _, err = run_cli(
        capsys, "plan", "--model", "minilm-l3", "--max-loss", "0.1", "--cost", "seconds", "--ks", "2", "--widths", "2",
        "--seq-len", str(N), "--fit-seqs", "2", "--curve-seqs", "2", "--select-seqs", "2", "--eval-seqs", "2",
        "--out", str(tmp_path / "p"), "--no-progress",
    )  # fmt: skip
    assert_one_line_error(code, err, "runs faster than exact attention", "--cost flops")
    assert not (tmp_path / "p").exists()


def test_an_unknown_cost_is_refused_in_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "plan", "--max-loss", "0.1", "--cost", "joules", "--out", str(tmp_path / "p"))
    assert_one_line_error(code, err, "cost 'joules' is unknown", "flops, seconds")
