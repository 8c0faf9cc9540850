"""Does a next-token loss read on a seeded subset of each block's positions judge a change as well, for less?

A decoder's language-model head is most of a proxy forward's cost on a large vocabulary (gemma3-270m: a
262,144-word head on a 640-wide backbone). Reading the loss on a share s of each block's positions cuts the
head's part by s, but each block's mean change is then an estimate, with a variance of its own. This bench
measures, for changes a report judges (the first token removed; a sink of 4 keys and a recent window; a band),
what the subset costs in precision and what it saves in time, both in the same run:

- each change's paired per-position loss change on ``--blocks`` blocks of ``--seq-len`` tokens;
- the variance of the mean change over blocks with every position read, and with a share s read (a simple
  random sample of each block's positions: the between-block variance plus the within-block sampling
  variance, exact for such a sample, and checked against ``--draws`` seeded draws);
- the seconds of the backbone and of the head on a batch, timed in alternating rounds.

The time at equal precision is (variance ratio) × (time ratio): below 1 the subset pays; above 1 fewer blocks,
every position read, give the same interval for less.

Run:  python bench/bench_loss_positions.py [--model gemma3-270m] [--blocks 64] [--seq-len 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import rounds  # noqa: E402

import attnlens  # noqa: E402
from attnlens.analysis import patterns  # noqa: E402
from attnlens.models.head import language_head  # noqa: E402

SHARES = (0.5, 0.25, 0.125)
BATCH = 16


def keeps(n: int) -> dict[str, torch.Tensor]:
    """The changes judged, as the (query, key) positions each keeps: the report's own fixed patterns."""
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    none = torch.zeros(1, n, dtype=torch.bool)  # no global tokens: the patterns take them beside their window
    return {
        "first token removed": ~((k == 0) & (q > 0)),
        **{f"sink-window({w})": patterns.sink_window(n, w, none)[0] for w in (48, 32, 16)},
        "band(16)": patterns.band(n, 16, none)[0],
    }


def per_position(model, head, ids: torch.Tensor, keep: torch.Tensor | None) -> np.ndarray:
    """Each block's next-token loss at every position (blocks, n - 1), with attention kept to ``keep``."""
    change = None if keep is None else lambda layer, scores, valid: scores.masked_fill(~keep, float("-inf"))
    out = []
    with torch.no_grad(), attnlens.Capture(intervene=change, record=False):
        for at in range(0, len(ids), BATCH):
            x = ids[at : at + BATCH]
            logits = head.logits(model.final_hidden(x)[:, :-1]).float()
            out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none"))
    return torch.cat(out).double().numpy()


def variances(delta: np.ndarray, share: float, draws: int) -> tuple[float, float, float]:
    """The variance of the mean change over blocks with every position read, with ``share`` of them read
    (exact for a simple random sample per block), and the latter from ``draws`` seeded draws."""
    blocks, positions = delta.shape
    m = max(1, round(share * positions))
    between = delta.mean(1).var(ddof=1) / blocks
    within = (delta.var(1, ddof=1) / m * (1 - m / positions)).mean() / blocks
    rng = np.random.default_rng(0)
    means = [np.take_along_axis(delta, np.argsort(rng.random(delta.shape), 1)[:, :m], 1).mean() for _ in range(draws)]
    return between, between + within, between + float(np.var(means))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    model = attnlens.load_model(args.model)
    head = language_head(model)
    if head is None:
        sys.exit(f"bench_loss_positions: {args.model} has no language-model head this can run apart")
    ids = torch.as_tensor(attnlens.load_corpus("kjv").blocks(model, n=args.seq_len, num_blocks=args.blocks, seed=0).ids)
    batch = ids[:BATCH]
    with torch.no_grad():  # the head as a loss reads it: its logits and their cross-entropy, a chunk at a time
        hidden = model.final_hidden(batch)[:, :-1]
        parts = {"backbone": lambda: model.final_hidden(batch), "head": lambda: head.losses(hidden, batch[:, 1:])}
        seconds = rounds(parts, args.rounds)
    print(
        f"{args.model}, a batch of {BATCH} × {args.seq_len}: backbone {seconds['backbone']:.2f} s, head {seconds['head']:.2f} s"
    )
    base = per_position(model, head, ids, None)
    print(f"\n{args.blocks} blocks; time at equal precision = variance ratio × time ratio (below 1: the subset pays)\n")
    print(
        f"{'change':22} {'mean Δ (nats)':>14} {'share':>6} {'variance ×':>11} {'(draws)':>8} {'time ×':>7} {'at equal precision':>19}"
    )
    for name, keep in keeps(args.seq_len).items():
        delta = per_position(model, head, ids, keep) - base
        for share in SHARES:
            full, subset, drawn = variances(delta, share, args.draws)
            cost = (seconds["backbone"] + share * seconds["head"]) / (seconds["backbone"] + seconds["head"])
            print(
                f"{name:22} {delta.mean():>+14.4f} {share:>6.3f} {subset / full:>11.2f} {drawn / full:>8.2f} "
                f"{cost:>7.2f} {subset / full * cost:>19.2f}"
            )


if __name__ == "__main__":
    main()
