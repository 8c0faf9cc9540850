"""Scaling out: moments throughput with 1 and 2 CPU ranks, peak memory per rank against the
budget, measured per-layer costs, float32 error, and a projection to a 7B decoder on 8 GPUs.

Run:  python bench/bench_scale.py [--num-seqs 128] [--rounds 2] [--gemma]

1. Throughput. The real command line, ``attnlens moments minilm-l6 --seq-len 128`` on the
   same blocks, as 1 process with 1 thread, 1 process with 2 threads, and 2 ranks of 1
   thread each (``torchrun --nproc-per-node 2``, gloo), rounds alternating, medians. The
   accumulation loop (forward passes + sums) and the final reduce are timed inside each
   rank; end-to-end wall time includes starting Python and loading the model.
2. Memory. n = 512 (minilm's longest), every layer and head: the sums of all units
   (303 MB in float64) against ``--max-memory 64MB``, 1 process and 2 ranks; peak RSS
   (VmHWM) per rank, next to a forward-only process of the same batches (the model's
   own activations, outside the budget).
3. Per-layer costs, one thread: the forward pass per layer per sequence at n = 128, 256,
   512, and the accumulation per head per sequence (float64 and float32), as seconds and
   achieved GFLOP/s; bytes per layer per sequence and per unit.
4. float32 sums against float64 on real rows (minilm-l6, n = 128): the error of the
   covariance after K batches, against the bound documented in docs/scaling.md ("float32 sums").
5. Projection: a 7B decoder (32 layers x 32 heads, d = 128, d_model 4096, d_ff 11008)
   at n = 4096 on 8 GPUs, from the measured rates and stated GPU assumptions, for the
   plans attnlens' planner makes under a per-GPU budget.
With --gemma, also gemma3-270m at n = 2048 (causal: the last, full-length row of each block) streaming.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _memory import peak_rss_mb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


# ---------------------------------------------------------------------- worker (one rank)


def worker(argv: list[str]) -> None:
    """Run ``attnlens ARGV`` with timers around the accumulation and the reduce; print one JSON line."""
    import attnlens.rows.jobs as job
    from attnlens.cli import main

    record: dict[str, float] = {"accumulate_s": 0.0}
    accumulate, combine = job._accumulate_pass, job._combine

    def timed_pass(*args, **kwargs):
        record.setdefault("hwm_before_mb", peak_rss_mb())
        start = time.perf_counter()
        accumulate(*args, **kwargs)
        record["accumulate_s"] += time.perf_counter() - start

    def timed_combine(*args, **kwargs):
        start = time.perf_counter()
        try:
            return combine(*args, **kwargs)
        finally:
            record["combine_s"] = time.perf_counter() - start

    job._accumulate_pass, job._combine = timed_pass, timed_combine
    try:
        main(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    print("BENCH " + json.dumps({"rank": int(os.environ.get("RANK", 0)), **record, "hwm_mb": peak_rss_mb()}), flush=True)


def forward_only(seq_len: int, num_seqs: int, batch_size: int) -> None:
    """Forward passes of the same batches through the capture, keeping nothing: the model's own peak."""
    import numpy as np

    import attnlens
    from attnlens.rows.sources import ModelRows

    model = attnlens.load_model("minilm-l6")
    rows = ModelRows(model, attnlens.load_corpus("kjv").blocks(model, seq_len, num_seqs))
    rows.for_each_batch(
        np.arange(num_seqs), list(range(model.num_layers)), lambda *a: None, batch_size=batch_size, progress=False
    )
    print("BENCH " + json.dumps({"rank": 0, "hwm_mb": peak_rss_mb()}), flush=True)


def launch(args: list[str], *, ranks: int, threads: int) -> dict:
    """Run the worker as 1 process or as ``ranks`` torchrun ranks; per-rank records and wall time."""
    env = {**ENV, "OMP_NUM_THREADS": str(threads)}
    me = [str(Path(__file__).resolve()), "--worker"]
    if ranks == 1:
        command = [sys.executable, *me, *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *me, *args]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    records = [json.loads(line[6:]) for line in result.stdout.splitlines() if line.startswith("BENCH ")]
    return {"wall_s": wall, "ranks": sorted(records, key=lambda r: r["rank"])}


# ---------------------------------------------------------------------- 1 and 2: throughput, memory


def throughput(args) -> dict:
    import numpy as np

    from attnlens.rows.partials import load_moments

    configs = {"1 process, 1 thread": (1, 1), "1 process, 2 threads": (1, 2), "2 ranks x 1 thread": (2, 1)}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="attnlens-bench-") as root:
        for round_ in range(args.rounds):
            for name, (ranks, threads) in configs.items():
                out = Path(root) / f"{ranks}-{threads}-{round_}"
                runs[name].append(
                    launch(
                        [
                            "moments",
                            "minilm-l6",
                            "--seq-len",
                            "128",
                            "--num-seqs",
                            str(args.num_seqs),
                            "--batch-size",
                            "8",
                            "--no-progress",
                            "--out",
                            str(out),
                        ],
                        ranks=ranks,
                        threads=threads,
                    )
                )
                print(f"  round {round_ + 1} {name}: {runs[name][-1]['wall_s']:.1f} s", file=sys.stderr)
        one = load_moments(Path(root) / "1-1-0").halves.total.sum_outer
        two = load_moments(Path(root) / "2-1-0").halves.total.sum_outer
        difference = float(np.abs(np.asarray(one) - np.asarray(two)).max() / np.abs(np.asarray(one)).max())
    print(
        f"\n== 1. moments throughput: minilm-l6, n = 128, {args.num_seqs} sequences, batch 8, all 6 x 12 heads, float64; "
        f"median of {args.rounds} rounds"
    )
    print(
        f"{'configuration':24s} {'loop s':>7s} {'seq/s':>7s} {'reduce s':>9s} {'end-to-end s':>13s} {'peak RSS MB per rank':>22s}"
    )
    table = {}
    for name, results in runs.items():
        loop = statistics.median(max(rank["accumulate_s"] for rank in r["ranks"]) for r in results)
        reduce = statistics.median(max(rank.get("combine_s", 0.0) for rank in r["ranks"]) for r in results)
        wall = statistics.median(r["wall_s"] for r in results)
        peaks = [max(r["ranks"][i]["hwm_mb"] for r in results) for i in range(len(results[0]["ranks"]))]
        table[name] = args.num_seqs / loop
        print(
            f"{name:24s} {loop:7.2f} {args.num_seqs / loop:7.1f} {reduce:9.2f} {wall:13.1f} {' '.join(f'{p:.0f}' for p in peaks):>22s}"
        )
    base = table["1 process, 1 thread"]
    print(
        f"speed-up over 1 process x 1 thread: 2 threads {table['1 process, 2 threads'] / base:.2f}x, "
        f"2 ranks {table['2 ranks x 1 thread'] / base:.2f}x (2 cores shared with other work: not a clean 2x)"
    )
    print(f"2 ranks vs 1 process, max |difference| of Σxxᵀ relative to its largest entry: {difference:.1e}")
    return {"seq_per_s": table}


def memory(args) -> None:
    from attnlens.rows.budgets import MomentsCost, format_bytes, parse_bytes, plan_units

    n, seqs, batch, budget = 512, 8, 2, args.budget
    units = [(layer, head) for layer in range(6) for head in range(12)]
    cost = MomentsCost(n, None, "float64", batch)
    common = ["moments", "minilm-l6", "--seq-len", str(n), "--num-seqs", str(seqs), "--batch-size", str(batch), "--no-progress"]
    forward = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--forward-only", str(n), str(seqs), str(batch)],
        capture_output=True,
        text=True,
        env={**ENV, "OMP_NUM_THREADS": "1"},
        check=True,
    )
    forward_peak = json.loads(forward.stdout.splitlines()[-1][6:])["hwm_mb"]
    print(
        f"\n== 2. peak memory per rank: minilm-l6, n = {n}, {seqs} sequences, batch {batch}, 72 units of "
        f"{format_bytes(cost.unit_bytes)} (all: {format_bytes(72 * cost.unit_bytes)})"
    )
    print(f"forward passes alone (model, activations, capture; outside the budget): peak {forward_peak:.0f} MB")
    print(f"{'run':34s} {'plan: sums + working':>22s} {'peak RSS MB per rank':>21s} {'above forward-only':>19s}")
    with tempfile.TemporaryDirectory(prefix="attnlens-bench-") as root:
        for label, ranks, limit in (
            ("no budget, 1 process", 1, None),
            (f"--max-memory {budget}, 1 process", 1, budget),
            (f"--max-memory {budget}, 2 ranks", 2, budget),
        ):
            extra = ["--max-memory", limit] if limit else []
            plan = plan_units(units, cost, budget=parse_bytes(limit) if limit else None, world_size=ranks)
            result = launch([*common, *extra, "--out", f"{root}/{ranks}-{limit}"], ranks=ranks, threads=1)
            peaks = [rank["hwm_mb"] for rank in result["ranks"]]
            planned = f"{format_bytes(plan.max_group_units * plan.unit_bytes)} + {format_bytes(plan.working_bytes)}"
            print(
                f"{label:34s} {planned:>22s} {' '.join(f'{p:.0f}' for p in peaks):>21s} "
                f"{' '.join(f'{p - forward_peak:+.0f}' for p in peaks):>19s}   ({plan.passes} passes x {plan.groups_per_pass} groups)"
            )
    print(
        f"budget {budget} = {parse_bytes(budget) / 1e6:.0f} MB: the growth above forward-only stays near the plan's sums + working "
        "(plus transient copies, allocator slack and the partial file read back for the reduce)"
    )


# ---------------------------------------------------------------------- 3: per-layer costs


def layer_costs() -> dict:
    import numpy as np
    import torch

    import attnlens
    from attnlens.rows.accumulate import UnitSums

    torch.set_num_threads(1)
    model = attnlens.load_model("minilm-l6")
    d, d_ff, heads, layers = 384, 1536, model.num_heads, model.num_layers
    corpus = attnlens.load_corpus("kjv")
    rows = {}
    print("\n== 3. measured per-layer costs, one thread (minilm-l6: d_model 384, d_ff 1536, 12 heads of 32)")
    print(
        f"{'n':>5s} {'fwd ms/layer/seq':>17s} {'fwd GFLOP/s':>12s} {'f64 ms/head/seq':>16s} {'GFLOP/s':>8s} "
        f"{'f32 ms/head/seq':>16s} {'GFLOP/s':>8s} {'scores MB/layer/seq':>20s} {'unit MB (f64)':>14s}"
    )
    for n, batch in ((128, 8), (256, 4), (512, 2)):
        ids = torch.from_numpy(corpus.blocks(model, n, batch).ids)
        with torch.no_grad():
            model.forward(ids)
            start = time.perf_counter()
            for _ in range(2):
                model.forward(ids)
            forward = (time.perf_counter() - start) / 2 / layers / batch
            with attnlens.Capture([3]) as cap:
                model.forward(ids)
        scores, valid = cap.scores[3], cap.valid[3]
        timings = {}
        for dtype in ("float64", "float32"):
            sums = UnitSums(
                [(3, h) for h in range(heads)], n=n, num_heads=heads, quantity="scores", queries=None, accumulate=dtype
            )
            sums.add(3, scores, valid, np.zeros(batch, dtype=np.int64))
            start = time.perf_counter()
            for _ in range(3):
                sums.add(3, scores, valid, np.zeros(batch, dtype=np.int64))
            timings[dtype] = (time.perf_counter() - start) / 3 / heads / batch
        forward_flops = 2 * n * (4 * d * d + 2 * d * d_ff) + 4 * n * n * d
        head_flops = 2 * n**3
        rows[n] = {
            "forward_s": forward,
            "forward_gflops": forward_flops / forward / 1e9,
            **{f"{k}_s": v for k, v in timings.items()},
            **{f"{k}_gflops": head_flops / v / 1e9 for k, v in timings.items()},
        }
        print(
            f"{n:5d} {forward * 1e3:17.2f} {forward_flops / forward / 1e9:12.1f} {timings['float64'] * 1e3:16.2f} "
            f"{head_flops / timings['float64'] / 1e9:8.1f} {timings['float32'] * 1e3:16.2f} {head_flops / timings['float32'] / 1e9:8.1f} "
            f"{heads * n * n * 4 / 1e6:20.1f} {2 * (n * n + 2 * n + 1) * 8 / 1e6:14.2f}"
        )
    ns = np.array(sorted(rows), dtype=float)
    times = np.array([rows[n]["forward_s"] for n in sorted(rows)])
    (a, b), *_ = np.linalg.lstsq(np.c_[ns, ns**2], times, rcond=None)
    print(
        f"fit: forward per layer per sequence = {a * 1e6:.2f} us x n + {b * 1e9:.2f} ns x n^2; "
        f"accumulation per head per sequence ~ 2 n^3 flops at the rates above"
    )
    torch.set_num_threads(os.cpu_count() or 1)
    return rows


# ---------------------------------------------------------------------- 4: float32


def float32_error() -> None:
    import numpy as np
    import torch

    import attnlens
    from attnlens.rows.sources import ModelRows

    model = attnlens.load_model("minilm-l6")
    n = 128
    rows = ModelRows(model, attnlens.load_corpus("kjv").blocks(model, n=n, num_blocks=64, seed=0))
    products = []  # eight real batches of 1024 rows, heads 0 and 5 of layer 3: Σx and Σxxᵀ in both precisions

    def keep(layer, scores, valid, sequences):
        x = scores[:, [0, 5]].transpose(0, 1).reshape(2, -1, n)
        products.append(
            {
                dtype: (x.to(dtype).sum(1), torch.bmm(x.to(dtype).transpose(1, 2), x.to(dtype)))
                for dtype in (torch.float64, torch.float32)
            }
        )

    rows.for_each_batch(np.arange(64), [3], keep, batch_size=8, progress=False)
    eps = float(np.finfo(np.float32).eps)
    print("\n== 4. float32 sums against float64: minilm-l6 layer 3, heads 0 and 5, n = 128, real batches of 1024 rows;")
    print("   K batches added into one float32 sum (each batch scaled by a random factor in [0.5, 1.5) so that long runs")
    print("   add different numbers, as real corpora do); error = |C32 - C64|_F / |C64|_F of the covariance")
    print(
        f"{'K':>7s} {'rows':>10s} {'error':>9s} {'kappa':>6s} {'error/(kappa eps32 sqrt K)':>27s} {'bound kappa eps32 (2 + 0.3 sqrt K)':>36s}"
    )
    generator = torch.Generator().manual_seed(0)
    sums = {
        dtype: [torch.zeros(2, n, dtype=dtype), torch.zeros(2, n, n, dtype=dtype)] for dtype in (torch.float64, torch.float32)
    }
    added = 0
    for target in (1, 8, 64, 512, 4096, 32768):
        while added < target:
            factor = float(torch.rand(1, generator=generator)) + 0.5
            for dtype, (total, outer) in sums.items():
                s, o = products[added % len(products)][dtype]
                total += s * factor
                outer += o * factor
            added += 1
        count = added * 1024

        def covariance(total, outer):
            mean = total.double() / count
            return (outer.double() - count * mean[:, :, None] * mean[:, None, :]) / (count - 1)

        c64, c32 = covariance(*sums[torch.float64]), covariance(*sums[torch.float32])
        error = (torch.linalg.norm(c32 - c64, dim=(-2, -1)) / torch.linalg.norm(c64, dim=(-2, -1))).numpy()
        kappa = (torch.linalg.norm(sums[torch.float64][1] / count, dim=(-2, -1)) / torch.linalg.norm(c64, dim=(-2, -1))).numpy()
        worst = int(np.argmax(error / kappa))
        bound = kappa[worst] * eps * (2 + 0.3 * np.sqrt(added))
        print(
            f"{added:7d} {count:10d} {error[worst]:9.2e} {kappa[worst]:6.2f} {error[worst] / (kappa[worst] * eps * np.sqrt(added)):27.3f} "
            f"{bound:36.2e} {'ok' if error[worst] <= bound else 'EXCEEDED'}"
        )


# ---------------------------------------------------------------------- 5: projection


GPU = {  # stated assumptions: NVIDIA H100 SXM 80 GB, achieved fractions of peak
    "name": "H100 SXM 80 GB",
    "bf16_tflops": 989 * 0.35,  # dense bf16 peak x 35%: eager attention with capture, batch 1
    "fp64_tflops": 67 * 0.6,  # FP64 tensor-core DGEMM peak x 60%
    "fp32_tflops": 67 * 0.6,  # FP32 (TF32 off, torch's default for matmul) x 60%
    "memory_gb": 80,
    "reduce_gb_s": 100,  # NVLink reduce of float64 sums onto rank 0
    "disk_gb_s": 2,  # checkpoint writes per rank
}


def projection(rates: dict, args) -> None:
    from attnlens.rows.budgets import MomentsCost, format_bytes, parse_bytes, plan_units

    layers, heads, d_head, d_model, d_ff, n, gpus, seqs = 32, 32, 128, 4096, 11008, 4096, 8, args.project_seqs
    params = layers * (4 * d_model * d_model + 3 * d_model * d_ff) + 2 * 32000 * d_model
    forward_flops = 2 * params * n + layers * 4 * n * n * d_model  # per sequence
    weights_gb = params * 2 / 1e9
    scores_layer_gb = heads * n * n * 2 / 1e9  # bf16 scores of one layer, batch 1
    activations_gb = 4 * scores_layer_gb + 1  # eager attention: scores, masked, float32 softmax, weights; + hidden states
    budget = args.project_budget
    cpu = rates[512]
    print(
        f"\n== 5. projection: 7B decoder ({layers} layers x {heads} heads, d = {d_head}, d_model {d_model}, d_ff {d_ff}, "
        f"{params / 1e9:.1f}B parameters) at n = {n}, {seqs} sequences ({seqs * n / 1e6:.0f}M tokens), {gpus} x {GPU['name']}"
    )
    print(
        f"assumed GPU rates: bf16 forward {GPU['bf16_tflops']:.0f} TFLOP/s, FP64 sums {GPU['fp64_tflops']:.0f} TFLOP/s, "
        f"FP32 sums {GPU['fp32_tflops']:.0f} TFLOP/s; measured here per CPU core at n = 512: forward {cpu['forward_gflops']:.1f}, "
        f"FP64 sums {cpu['float64_gflops']:.1f}, FP32 sums {cpu['float32_gflops']:.1f} GFLOP/s, i.e. ratios "
        f"{GPU['bf16_tflops'] * 1e3 / cpu['forward_gflops']:.0f}x, {GPU['fp64_tflops'] * 1e3 / cpu['float64_gflops']:.0f}x, "
        f"{GPU['fp32_tflops'] * 1e3 / cpu['float32_gflops']:.0f}x"
    )
    print(
        f"per GPU: bf16 weights {weights_gb:.1f} GB, activations of one layer at batch 1 ~{activations_gb:.1f} GB "
        f"(scores {scores_layer_gb:.2f} GB per layer); sums budget --max-memory {budget}"
    )
    print(
        f"{'rows per sequence and head':34s} {'sums':>5s} {'all units':>10s} {'plan (passes x groups)':>23s} {'per-GPU sums':>13s} "
        f"{'fwd h':>7s} {'sums h':>7s} {'ckpt+reduce h':>14s} {'wall h':>7s}"
    )
    for rows_label, rows_per_head in (("1 (causal: last row, or 1 query)", 1), (f"{n} (every row full, e.g. encoder)", n)):
        for accumulate in ("float64", "float32"):
            cost = MomentsCost(n, None, accumulate, 1, causal=rows_per_head == 1)
            units = [(layer, head) for layer in range(layers) for head in range(heads)]
            plan = plan_units(units, cost, budget=parse_bytes(budget), world_size=gpus, heads_per_layer=heads)
            members = gpus // plan.groups_per_pass
            per_rank_seqs = -(-seqs // members)
            forward_s = (
                max(  # a pass stops the forward after the last layer its group needs; the slowest rank counts
                    sum(
                        (max(layer for layer, _ in plan.group_units(plan.group_of(rank, p))) + 1) / layers
                        for p in range(plan.passes)
                    )
                    for rank in range(gpus)
                )
                * per_rank_seqs
                * forward_flops
                / (GPU["bf16_tflops"] * 1e12)
            )
            head_flops = 2 * rows_per_head * n * n
            rate = GPU["fp64_tflops"] if accumulate == "float64" else GPU["fp32_tflops"]
            sums_s = plan.passes * per_rank_seqs * plan.max_group_units * head_flops / (rate * 1e12)
            group_bytes = plan.max_group_units * plan.unit_bytes
            # --checkpoint-every set for a checkpoint every ~10 minutes of work, and one at the end of each pass
            checkpoints = plan.passes + int((forward_s + sums_s) // 600)
            io_s = checkpoints * group_bytes / (GPU["disk_gb_s"] * 1e9) + len(units) * cost.unit_bytes_as(8) / (
                GPU["reduce_gb_s"] * 1e9
            )
            wall = (forward_s + sums_s + io_s) / 3600
            print(
                f"{rows_label:34s} {accumulate[-2:]:>5s} {format_bytes(len(units) * cost.unit_bytes):>10s} "
                f"{f'{plan.passes} x {plan.groups_per_pass}':>23s} {format_bytes(group_bytes):>13s} {forward_s / 3600:7.1f} "
                f"{sums_s / 3600:7.1f} {io_s / 3600:14.2f} {wall:7.1f}"
            )
    fits = weights_gb + activations_gb + parse_bytes(budget) / 1e9
    print(
        f"per-GPU memory: weights + activations + sums budget = {fits:.0f} GB of {GPU['memory_gb']} "
        f"({'fits' if fits < GPU['memory_gb'] else 'DOES NOT FIT: lower --max-memory'}); host RAM per rank holds one partial "
        "(its sums) while checkpointing and reducing"
    )
    print(
        "wall = the slowest rank: its passes x its sequences x (forward to its group's last layer + its units' sums) "
        "+ its checkpoints (every ~10 min of work and at the end of each pass) + one reduce of all sums in float64"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--forward-only":
        forward_only(*(int(value) for value in sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-seqs", type=int, default=128, help="sequences for the throughput runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", default="64MB", help="--max-memory of the memory runs")
    parser.add_argument("--project-seqs", type=int, default=8192, help="sequences of the 7B projection")
    parser.add_argument("--project-budget", default="48GB", help="per-GPU --max-memory of the 7B projection")
    parser.add_argument("--gemma", action="store_true", help="also stream gemma3-270m at n = 2048")
    args = parser.parse_args()
    throughput(args)
    memory(args)
    rates = layer_costs()
    float32_error()
    projection(rates, args)
    if args.gemma:
        gemma()


def gemma() -> None:
    n = 2048
    with tempfile.TemporaryDirectory(prefix="attnlens-bench-") as root:
        result = launch(
            [
                "moments",
                "gemma3-270m",
                "--seq-len",
                str(n),
                "--num-seqs",
                "2",
                "--batch-size",
                "1",
                "--max-memory",
                "2GB",
                "--no-progress",
                "--out",
                f"{root}/g",
            ],
            ranks=1,
            threads=2,
        )
    record = result["ranks"][0]
    print(
        f"\n== gemma3-270m (causal, 18 layers x 4 heads) at n = {n}, 2 sequences, pooled rows (the full-length "
        f"last row of each block), --max-memory 2GB: "
        f"loop {record['accumulate_s']:.0f} s, peak RSS {record['hwm_mb']:.0f} MB (before the loop {record['hwm_before_mb']:.0f} MB); "
        f"one layer's float32 scores at batch 1: {4 * n * n * 4 / 1e6:.0f} MB"
    )


if __name__ == "__main__":
    main()
