"""Moments accumulation against its bare cost and against scikit-learn, time and peak memory.

Run:  python bench/bench_moments.py [--num-seqs 256] [--rounds 3]

On one float16 store of minilm-l6 (n=128, all 6 layers x 12 heads), each mode in its
own process (peak RSS is its own), rounds alternating the modes, medians reported:

  bare      read every layer's arrays batch by batch, convert to float64, one BLAS XᵀX
            per head on the same rows                                     <- the baseline
  moments   attnlens.rows.accumulate.compute_moments from the store (scores, pooled, two halves)
  pca       scikit-learn PCA fitted on each head's rows (all rows in memory)
  ipca      scikit-learn IncrementalPCA, partial_fit batch by batch, per head

Then the streaming paths' peak memory at two corpus sizes (it must not grow with the
number of sequences): moments from a store of N and 4N sequences, and moments straight
from the model for N/4 and N sequences.

Target (issue 3): moments <= 1.5x bare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _memory import peak_rss_mb  # noqa: E402

MODES = ("bare", "moments", "pca", "ipca")


def run_mode(mode: str, store_path: str, batch_size: int, num_seqs: int) -> dict:
    import numpy as np
    import torch

    import attnlens
    from attnlens.rows.accumulate import compute_moments
    from attnlens.rows.sources import ModelRows, StoreRows

    start = time.perf_counter()
    if mode == "model":
        model = attnlens.load_model("minilm-l6")
        compute_moments(ModelRows(model, attnlens.load_corpus("kjv").blocks(model, 128, num_seqs)), progress=False)
        return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb()}
    store = attnlens.open_store(store_path)
    start = time.perf_counter()
    if mode == "moments":
        compute_moments(StoreRows(store), batch_size=batch_size, progress=False)
    elif mode == "bare":
        for layer in store.layers:
            for begin in range(0, store.num_seqs, batch_size):
                x = torch.from_numpy(store.read("scores", layer, begin, begin + batch_size)).to(torch.float64)
                rows = x.transpose(0, 1).reshape(store.num_heads, -1, store.n)
                torch.bmm(rows.transpose(1, 2), rows)
    else:
        from sklearn.decomposition import PCA, IncrementalPCA

        for layer in store.layers:
            if mode == "pca":
                rows = (
                    store.read("scores", layer, 0, store.num_seqs)
                    .astype(np.float64)
                    .transpose(1, 0, 2, 3)
                    .reshape(store.num_heads, -1, store.n)
                )
                for head in range(store.num_heads):
                    PCA(svd_solver="full").fit(rows[head])
            else:
                models = [IncrementalPCA() for _ in range(store.num_heads)]
                for begin in range(0, store.num_seqs, batch_size):
                    x = store.read("scores", layer, begin, begin + batch_size).astype(np.float64).transpose(1, 0, 2, 3)
                    for head, model in enumerate(models):
                        model.partial_fit(x[head].reshape(-1, store.n))
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb()}


def measure(mode: str, store: str, args, num_seqs: int | None = None) -> dict:
    command = [
        sys.executable,
        __file__,
        "--mode",
        mode,
        "--store",
        store,
        "--batch-size",
        str(args.batch_size),
        "--num-seqs",
        str(num_seqs or args.num_seqs),
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.store, args.batch_size, args.num_seqs)))
        return

    import attnlens

    with tempfile.TemporaryDirectory(prefix="attnlens-bench-") as root:
        small, large = Path(root) / "small", Path(root) / "large"
        print(f"building stores of {args.num_seqs} and {4 * args.num_seqs} sequences ...", file=sys.stderr)
        attnlens.extract("minilm-l6", small, corpus="kjv", seq_len=128, num_seqs=args.num_seqs, progress=False)
        attnlens.extract("minilm-l6", large, corpus="kjv", seq_len=128, num_seqs=4 * args.num_seqs, progress=False)
        results: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for round_ in range(args.rounds):
            for mode in MODES:
                results[mode].append(measure(mode, str(small), args))
                print(f"round {round_ + 1} {mode:8s} {results[mode][-1]['seconds']:7.2f} s", file=sys.stderr)
        median = {mode: statistics.median(r["seconds"] for r in runs) for mode, runs in results.items()}
        peak = {mode: max(r["peak_rss_mb"] for r in runs) for mode, runs in results.items()}
        rows = args.num_seqs * 128
        print(
            f"minilm-l6 store, n=128, {args.num_seqs} sequences = {rows} rows per head, 72 heads, median of {args.rounds} rounds"
        )
        print(f"{'mode':8s} {'seconds':>8s} {'x bare':>7s} {'peak RSS MB':>12s}")
        for mode in MODES:
            print(f"{mode:8s} {median[mode]:8.2f} {median[mode] / median['bare']:7.2f} {peak[mode]:12.0f}")
        print(
            f"moments / bare = {median['moments'] / median['bare']:.2f}x (target <= 1.5x); "
            f"PCA / moments = {median['pca'] / median['moments']:.1f}x, IncrementalPCA / moments = {median['ipca'] / median['moments']:.1f}x"
        )
        store_small, store_large = measure("moments", str(small), args), measure("moments", str(large), args)
        quarter = max(args.num_seqs // 4, 8)
        model_small, model_large = measure("model", "", args, quarter), measure("model", "", args, args.num_seqs)
        print("streaming peak RSS (MB), must not grow with the number of sequences:")
        print(
            f"  from a store: {args.num_seqs} seqs {store_small['peak_rss_mb']:.0f}, {4 * args.num_seqs} seqs {store_large['peak_rss_mb']:.0f}"
        )
        print(
            f"  from the model: {quarter} seqs {model_small['peak_rss_mb']:.0f}, {args.num_seqs} seqs {model_large['peak_rss_mb']:.0f}"
        )


if __name__ == "__main__":
    main()
