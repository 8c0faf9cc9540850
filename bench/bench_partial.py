"""Partial attention and sparse masks in seconds, against sdpa and eager attention.

Run:  python bench/bench_partial.py [--ns 128,512,2048] [--ks 16,32] [--repeats 3] [--no-model]

Three tables, every time the best of --repeats runs, every ratio against a baseline
measured in the same run (machines here are shared and noisy):

1. **The attention call alone**, at the geometry of minilm-l6 (12 heads of 32, an encoder:
   one map per head) and gemma3-270m (4 query heads sharing 1 key head of 256, causal: one
   map per head and query position), batch 1: sdpa, eager (``"attnlens"``, no capture) and
   partial (``"attnlens-partial"``, every head at k), beside the FLOPs model's ratio
   partial / full (:func:`attnlens.analysis.reconstruct.attention_flops`). The maps are
   random: time does not depend on their values.
2. **The whole model** (backbone, no output head), batch 1: the model with sdpa, with
   ``"attnlens"``, and under a plan with every head partial at k. minilm-l6 has 512
   positions, so it stops there.
3. **A mask run as sparse attention** at 90% sparsity, minilm-l6's geometry: dense sdpa
   (no mask), sdpa with the boolean mask, and compiled FlexAttention with a block mask,
   for a window (a band: whole blocks empty) and for random holes (no block empty).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

GEOMETRIES = {"minilm-l6": (12, 12, 32, False), "gemma3-270m": (4, 1, 256, True)}  # heads, kv heads, head dim, causal


def timed(function: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``repeats`` calls, after one warm-up, in milliseconds."""
    with torch.no_grad():
        function()
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            function()
            best = min(best, time.perf_counter() - start)
    return best * 1e3


def random_plan(heads: int, n: int, k: int, per_query: bool, generator: torch.Generator):
    """A layer plan with every head partial at k: random keys and random maps of the right shapes."""
    from attnlens.models.partial import LayerPlan, PartialHeads

    queries = n if per_query else 1
    positions = torch.stack([torch.randperm(n, generator=generator)[:k].sort().values for _ in range(heads * queries)])
    positions = positions.reshape(heads, queries, k)
    if per_query:  # a causal query's keys are at or before it
        positions = torch.minimum(positions, torch.arange(n)[None, :, None])
    weights = torch.randn(heads, queries, n, k, generator=generator) / k**0.5
    return LayerPlan(n, partial=[PartialHeads(list(range(heads)), positions, weights, torch.zeros(heads, queries, n))])


def attention_call(ns: list[int], ks: list[int], repeats: int) -> None:
    from attnlens.analysis.reconstruct import attention_flops
    from attnlens.models.capture import attnlens_attention
    from attnlens.models.partial import partial_attention

    print("1. the attention call alone (batch 1), ms; ratios against sdpa and eager measured in this run")
    print(
        f"{'geometry':12s} {'n':>5s} {'k':>3s} {'sdpa':>9s} {'eager':>9s} {'partial':>9s} {'part/sdpa':>9s} {'part/eager':>10s} {'FLOPs part/full':>15s}"
    )
    generator = torch.Generator().manual_seed(0)
    for name, (heads, kv, dim, causal) in GEOMETRIES.items():
        for n in ns:
            q, key, v = torch.randn(1, heads, n, dim), torch.randn(1, kv, n, dim), torch.randn(1, kv, n, dim)
            mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None] if causal else None
            module = nn.Module().eval()
            sdpa = timed(
                lambda: nn.functional.scaled_dot_product_attention(q, key, v, is_causal=causal, enable_gqa=kv < heads), repeats
            )
            eager = timed(lambda: attnlens_attention(module, q, key, v, mask), repeats)
            for k in ks:
                module.attnlens_plan = random_plan(heads, n, k, causal, generator)
                partial = timed(lambda: partial_attention(module, q, key, v, mask), repeats)
                flops = attention_flops(n, dim, k)["ratio"]
                print(
                    f"{name:12s} {n:5d} {k:3d} {sdpa:9.2f} {eager:9.2f} {partial:9.2f} {partial / sdpa:9.2f} {partial / eager:10.2f} {flops:15.2f}"
                )
                del module.attnlens_plan


def whole_model(ns: list[int], ks: list[int], repeats: int) -> None:
    import attnlens
    from attnlens.models.partial import planned

    print("\n2. the whole model (backbone, batch 1), ms; ratios against sdpa measured in this run")
    print(f"{'model':12s} {'n':>5s} {'k':>3s} {'sdpa':>9s} {'eager':>9s} {'partial':>9s} {'part/sdpa':>9s} {'eager/sdpa':>10s}")
    generator = torch.Generator().manual_seed(1)
    for name in GEOMETRIES:
        model = attnlens.load_model(name)
        for n in ns:
            if n > model.max_positions:
                print(f"{name:12s} {n:5d}  -  not run: the model has {model.max_positions} positions")
                continue
            ids = torch.randint(1000, 2000, (1, n))
            model.model.set_attn_implementation("sdpa")
            sdpa = timed(lambda: model.run_attention(ids), repeats)
            model.model.set_attn_implementation("attnlens")
            eager = timed(lambda: model.run_attention(ids), repeats)
            for k in ks:
                plan = random_plan(model.num_heads, n, k, model.causal, generator)  # one plan object shared by the layers
                with planned(model, dict.fromkeys(range(model.num_layers), plan)):
                    partial = timed(lambda: model.run_attention(ids), repeats)
                print(
                    f"{name:12s} {n:5d} {k:3d} {sdpa:9.1f} {eager:9.1f} {partial:9.1f} {partial / sdpa:9.2f} {eager / sdpa:10.2f}"
                )


def sparse_masks(ns: list[int], repeats: int) -> None:
    from attnlens.analysis.plan.choices import window_keep
    from attnlens.models.sparse import block_mask, masked_attention

    print("\n3. a 90% sparse mask against dense attention (minilm-l6's geometry, batch 1), ms; ratios against dense sdpa")
    print(
        f"{'mask':14s} {'n':>5s} {'kept':>6s} {'blocks skipped':>14s} {'dense':>9s} {'sdpa+mask':>9s} {'flex':>9s} {'mask/dense':>10s} {'flex/dense':>10s}"
    )
    heads, _, dim, _ = GEOMETRIES["minilm-l6"]
    generator = torch.Generator().manual_seed(2)
    for n in ns:
        q, k, v = (torch.randn(1, heads, n, dim) for _ in range(3))
        window = window_keep(n, max(1, round(0.05 * n)), causal=False)
        holes = torch.rand(n, n, generator=generator) < 0.1
        holes |= torch.eye(n, dtype=torch.bool)  # no empty row
        dense = timed(lambda: nn.functional.scaled_dot_product_attention(q, k, v), repeats)
        for label, keep in (("window", window), ("random holes", holes)):
            blocks = block_mask(keep)
            masked = timed(lambda: masked_attention(q, k, v, keep, kernel="sdpa"), repeats)
            flex = timed(lambda: masked_attention(q, k, v, keep, kernel="flex", blocks=blocks), repeats)
            kept = float(keep.float().mean())
            print(
                f"{label:14s} {n:5d} {kept:6.1%} {blocks.sparsity() / 100:14.1%} {dense:9.2f} {masked:9.2f} {flex:9.2f} {masked / dense:10.2f} {flex / dense:10.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="128,512,2048")
    parser.add_argument("--ks", default="16,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-model", action="store_true", help="skip the whole-model table")
    args = parser.parse_args()
    ns, ks = [int(n) for n in args.ns.split(",")], [int(k) for k in args.ks.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    attention_call(ns, ks, args.repeats)
    if not args.no_model:
        whole_model(ns, ks, args.repeats)
    sparse_masks([n for n in ns if n >= 512] or ns, args.repeats)


if __name__ == "__main__":
    main()
