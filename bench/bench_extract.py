"""Extraction throughput and peak memory against a plain forward pass of the same model.

Run:  python bench/bench_extract.py [--num-seqs 256] [--rounds 3]

Each mode runs in its own process (so peak RSS is its own), rounds alternate the modes
(so a noisy neighbour slows all of them alike), and the figures are medians. ``cpu s`` is
the process's own CPU time (all threads, user + system) over the same span: steadier than
the wall clock on a shared machine, though it misses work the kernel does elsewhere (such
as writing back the page cache):

  plain    transformers' default attention (sdpa), forward only          <- the baseline
  eager    transformers' eager attention, forward only
  capture  attnlens, every layer's scores recorded, nothing written
  extract  attnlens.io.extract: capture + float16 store on disk (all layers)

Target: extract <= 1.15x plain at n=128, batch 32 on minilm-l6 (it was 1.3x, issue 2).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _memory import peak_rss_mb  # noqa: E402

MODES = ("plain", "eager", "capture", "extract")
TARGET = 1.15


def run_mode(mode: str, num_seqs: int, seq_len: int, batch_size: int) -> dict:
    import torch
    import transformers

    import attnlens

    model = attnlens.load_model("minilm-l6")
    blocks = attnlens.load_corpus("kjv").blocks(model, n=seq_len, num_blocks=num_seqs, seed=0)
    batches = [torch.from_numpy(blocks.ids[i : i + batch_size]) for i in range(0, num_seqs, batch_size)]
    if mode in ("plain", "eager"):
        implementation = "sdpa" if mode == "plain" else "eager"
        twin = transformers.AutoModel.from_pretrained(model.source, attn_implementation=implementation).eval()
        forward = lambda ids: twin(input_ids=ids)
    elif mode == "capture":

        def forward(ids):
            with attnlens.Capture() as cap:
                model.forward(ids)
            return {layer: s.to(torch.float16).numpy() for layer, s in cap.scores.items()}
    else:
        forward = model.forward
    corpus = attnlens.load_corpus("kjv")
    out = tempfile.mkdtemp(prefix="attnlens-bench-")
    try:
        with torch.no_grad():
            forward(batches[0])  # warm-up (allocator, kernels), the same for every mode
            start, cpu_start = time.perf_counter(), time.process_time()
            if mode == "extract":
                attnlens.extract(
                    model,
                    f"{out}/store",
                    corpus=corpus,
                    seq_len=seq_len,
                    num_seqs=num_seqs,
                    batch_size=batch_size,
                    progress=False,
                )
            else:
                for ids in batches:
                    forward(ids)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    peak_mb = peak_rss_mb()
    return {
        "mode": mode,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "seqs_per_s": num_seqs / seconds,
        "peak_rss_mb": peak_mb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.num_seqs, args.seq_len, args.batch_size)))
        return
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES:
            command = [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--num-seqs",
                str(args.num_seqs),
                "--seq-len",
                str(args.seq_len),
                "--batch-size",
                str(args.batch_size),
            ]
            output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            results[mode].append(json.loads(output.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {mode:8s} {results[mode][-1]['seconds']:7.2f} s", file=sys.stderr)
    median = {mode: statistics.median(r["seconds"] for r in runs) for mode, runs in results.items()}
    cpu = {mode: statistics.median(r["cpu_seconds"] for r in runs) for mode, runs in results.items()}
    peak = {mode: max(r["peak_rss_mb"] for r in runs) for mode, runs in results.items()}
    print(f"minilm-l6, n={args.seq_len}, batch {args.batch_size}, {args.num_seqs} sequences, median of {args.rounds} rounds")
    print(f"{'mode':8s} {'seconds':>8s} {'seq/s':>8s} {'x plain':>8s} {'cpu s':>7s} {'peak RSS MB':>12s}")
    for mode in MODES:
        print(
            f"{mode:8s} {median[mode]:8.2f} {args.num_seqs / median[mode]:8.1f} {median[mode] / median['plain']:8.2f} "
            f"{cpu[mode]:7.2f} {peak[mode]:12.0f}"
        )
    # What writing the store adds to capturing (the rest is the eager attention capture needs).
    writing = (median["extract"] - median["capture"]) / median["plain"]
    print(
        f"extract / plain = {median['extract'] / median['plain']:.2f}x (target <= {TARGET}x); "
        f"writing the store adds {writing:+.2f}x over capture"
    )


if __name__ == "__main__":
    main()
