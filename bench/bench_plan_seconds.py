"""A plan that spends seconds: gemma3-270m at n = 2,048, windows only, against sdpa.

Run:  python bench/bench_plan_seconds.py [--model gemma3-270m] [--n 2048] [--widths 128,256,512,1024]
                                        [--slack 0.05] [--curve-seqs 1] [--select-seqs 2] [--eval-seqs 2] [--repeats 3]
                                        [--result DIR]

1. **The timing table** the plan measures (``attnlens.analysis.plan.seconds``): seconds per head
   and call of exact attention (sdpa) and of each window, with the kernel each window runs on
   (the faster of compiled FlexAttention and sdpa with the mask), and each as a share of exact.
2. **The plan**, ``cost="seconds"``, ``ks`` none: a proxy budget of the unmodified next-token
   loss on the selection blocks plus ``--slack`` nats. Small sizes, since every curve is a
   forward at n = 2,048 on the CPU; the plan's check is printed, and whether it meets.
3. **The backbone under the plan**, batch 1, best of ``--repeats`` after a warm-up, every ratio
   against sdpa measured in this run: the model with sdpa, under the plan through
   ``"attnlens-kernels"`` (``apply(fast=True)``: exact heads on sdpa, windows on their kernel),
   and under the plan through ``"attnlens-partial"`` (eager), beside the share of attention
   seconds the table predicts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from bench_partial import timed  # best of repeats after a warm-up, in ms

import attnlens
from attnlens.analysis.plan import PlanSettings, _planner, seconds


def budget_of(model, settings: PlanSettings, slack: float) -> float:
    """The unmodified next-token loss on the plan's selection blocks, plus ``slack`` nats."""
    planner = _planner(model, settings, "cpu", False)
    return planner.costs.unmodified_loss("select") + slack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--widths", default="128,256,512,1024")
    parser.add_argument("--slack", type=float, default=0.05)
    parser.add_argument("--curve-seqs", type=int, default=1)
    parser.add_argument("--select-seqs", type=int, default=2)
    parser.add_argument("--eval-seqs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--result", default=None, help="save the plan here, or load it from here if it exists")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    model = attnlens.load_model(args.model)
    sizes = dict(
        seq_len=args.n, ks=(), widths=tuple(int(w) for w in args.widths.split(",")), cost="seconds", fit_seqs=2,
        curve_seqs=args.curve_seqs, select_seqs=args.select_seqs, eval_seqs=args.eval_seqs, batch_size=1,
    )  # fmt: skip
    start = time.perf_counter()
    if args.result and Path(args.result).exists():  # a plan this bench saved before: time it again
        result = attnlens.load_result(args.result)
    else:
        budget = budget_of(model, PlanSettings.build(max_loss=(1e9,), **sizes), args.slack)
        result = attnlens.plan(model, max_loss=[budget], progress=True, **sizes)
        if args.result:
            result.save(args.result)
    budget, planning = result.budgets[0], time.perf_counter() - start
    table = result.settings["timings"]
    print(f"\n1. timing table at n = {args.n} ({table['machine']['processor']}), per head and call, by the layers' own mask")
    for kind, prices in table["seconds_per_head"].items():
        layers = sum(seconds.span_name(span) == kind for span in table["spans"])
        print(f"   layers seeing {kind} keys ({layers} layers):")
        for choice, value in prices.items():
            kernel = table["window_kernels"][kind].get(choice, "sdpa")
            print(f"     {choice:14s} {1e3 * value:8.3f} ms  {value / prices['exact']:6.2f} of exact  on {kernel}")
    row = result.methods.query("method == 'plan'").iloc[0]
    counts = result.tables["choices"].choice.value_counts().to_dict()
    print(f"\n2. plan for a next-token loss of at most {budget:.4f} nats ({planning:.0f} s to plan): {row.detail}; {counts}")
    print(
        f"   predicted attention seconds {row.seconds_ratio:.3f} of exact, FLOPs {row.flops_ratio:.3f}; "
        f"check {row.check_cost:.4f} [{row.check_cost_low:.4f}, {row.check_cost_high:.4f}], meets {bool(row.check_meets)}"
    )
    ids = torch.from_numpy(attnlens.load_corpus("kjv").blocks(model, args.n, 1, 0).ids)
    model.model.set_attn_implementation("sdpa")
    sdpa = timed(lambda: model.run_attention(ids), args.repeats) / 1e3
    model.model.set_attn_implementation("attnlens")
    with result.apply(model, budget, fast=True):
        fast = timed(lambda: model.run_attention(ids), args.repeats) / 1e3
        with torch.no_grad():
            fast_out = model.model.base_model(ids)[0]
    with result.apply(model, budget):
        eager = timed(lambda: model.run_attention(ids), args.repeats) / 1e3
        with torch.no_grad():
            eager_out = model.model.base_model(ids)[0]
    difference = float((fast_out - eager_out).abs().max() / eager_out.abs().max())
    print(f"\n3. the backbone at n = {args.n}, batch 1, best of {args.repeats}; ratios against sdpa in this run")
    print(
        f"   sdpa {sdpa:.3f} s; plan on its kernels {fast:.3f} s ({fast / sdpa:.3f}); plan eager {eager:.3f} s ({eager / sdpa:.3f})"
    )
    print(f"   the plan's last hidden states, kernels against eager: largest difference {difference:.1e} of the largest value")


if __name__ == "__main__":
    main()
