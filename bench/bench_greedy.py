"""Greedy key selection: the Schur-complement path against a naive least-squares refit.

Run:  python bench/bench_greedy.py [--num-seqs 64]

Covariances of every head of minilm-l6 at n=128 (moments streamed from the model) are
built first (not timed). Then, in one run:

  fast   attnlens.analysis.reconstruct.selection.greedy_path: rank-one Schur-complement updates, the whole
         path k = 1…n, all 72 heads in one call
  naive  attnlens.analysis.reconstruct.selection.naive_greedy_path: at each step refit least squares for
         every candidate (numpy.linalg.lstsq) and keep the best

The naive search is O(n⁵) per head, so both are timed on the same workload (one
head, the first S steps, up to the full path S = n), and the fast path also on the
full job for all heads. Target (issue 4): speed-up >= 100x; full path for all heads in seconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def timed(function, *args, repeats: int = 3) -> float:
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        function(*args)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-seqs", type=int, default=64)
    args = parser.parse_args()

    import attnlens
    from attnlens.analysis.reconstruct.selection import greedy_path, naive_greedy_path
    from attnlens.rows.accumulate import compute_moments
    from attnlens.rows.sources import ModelRows

    model = attnlens.load_model("minilm-l6")
    rows = ModelRows(model, attnlens.load_corpus("kjv").blocks(model, 128, args.num_seqs))
    covariance = compute_moments(rows, progress=False).total.second_moment().reshape(-1, 128, 128)
    print(f"minilm-l6, n=128, {len(covariance)} heads, covariances from {args.num_seqs} blocks")
    print(f"{'workload':32s} {'fast s':>9s} {'naive s':>9s} {'speed-up':>9s}")
    head = covariance[:1]
    for steps in (8, 32, 128):
        fast = timed(greedy_path, head, None, steps)
        naive = timed(naive_greedy_path, head[0], steps, repeats=1)
        same = (
            np.array_equal(greedy_path(head, None, steps)[0][0, :steps], naive_greedy_path(head[0], min(steps, 8)))
            if steps == 8
            else None
        )
        label = f"1 head, k = 1..{steps}" + (" (full path)" if steps == 128 else "")
        print(f"{label:32s} {fast:9.4f} {naive:9.2f} {naive / fast:8.0f}x" + ("" if same is None else f"   same order: {same}"))
    full = timed(greedy_path, covariance, repeats=1)
    print(f"fast, all {len(covariance)} heads, full path k=1..128: {full:.2f} s")


if __name__ == "__main__":
    main()
