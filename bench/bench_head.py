"""The language-model head only where a loss is read (attnlens/models/head.py) against the whole forward's
logits, on a decoder with a large vocabulary: one proxy forward (the next-token loss of a batch, no gradient)
and one training step like DAM's (a learned additive mask on every layer's scores, forward and backward).

Run:  python bench/bench_head.py [--model gemma3-270m] [--batch 16] [--seq-len 128] [--rounds 3]

Prints, per measure, the median seconds of each way in alternating rounds (the chunked head first, the
whole logits as the baseline measured in the same run) and their ratio, then each way's peak resident
memory, measured in a fresh process per way and measure (a process's peak is all it can report).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import peak_rss_mb  # noqa: E402
from _timing import rounds  # noqa: E402

import attnlens  # noqa: E402
from attnlens.analysis.objectives import Objective  # noqa: E402
from attnlens.models import head as heads  # noqa: E402

WAYS = ("chunked head", "whole logits")
MEASURES = ("proxy forward", "training step")


def setup(args: argparse.Namespace):
    model = attnlens.load_model(args.model)
    ids = attnlens.load_corpus("kjv").blocks(model, n=args.seq_len, num_blocks=args.batch, seed=0).ids
    objective = Objective(model, "clm")
    return model, objective, objective.prepare(torch.as_tensor(ids))


def way(name: str, model, head) -> None:
    """Make ``name`` the way the objective takes its losses (the whole logits: as if no head were reproduced)."""
    heads._CHECKED[model.model] = head if name == "chunked head" else None


def measure(name: str, model, objective, batch):
    """A callable that runs one ``name`` measure."""
    if name == "proxy forward":

        def forward():
            with torch.no_grad():
                objective.evaluate(batch)["loss"].sum()

        return forward
    n, heads_count = batch.input_ids.shape[1], model.num_heads
    mask = torch.zeros(heads_count, n, n, requires_grad=True)

    def step():
        with attnlens.Capture(intervene=lambda layer, scores, valid: scores + mask.to(scores.dtype), record=False):
            objective.evaluate(batch)["loss"].mean().backward()
        mask.grad = None

    return step


def checked_head(model):
    head = heads.language_head(model)  # checked once, before anything is timed
    assert head is not None, f"{model.name}'s head is not reproduced: nothing to measure"
    return head


def child(args: argparse.Namespace) -> None:
    model, objective, batch = setup(args)
    way(args.way, model, checked_head(model))
    measure(args.measure, model, objective, batch)()
    print(json.dumps({"peak_mb": peak_rss_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # a child process: one way, one measure
    parser.add_argument("--measure", choices=MEASURES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way is not None:
        child(args)
        return
    model, objective, batch = setup(args)
    head = checked_head(model)
    print(
        f"{args.model}: {args.batch} blocks of {args.seq_len} tokens, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    for name in MEASURES:
        modes = {}
        for each in WAYS:
            run = measure(name, model, objective, batch)
            modes[each] = lambda run=run, each=each: (way(each, model, head), run())
        seconds = rounds(modes, args.rounds)
        print(f"{name}: chunked head {seconds[WAYS[0]]:.2f} s, whole logits {seconds[WAYS[1]]:.2f} s, "
              f"ratio {seconds[WAYS[0]] / seconds[WAYS[1]]:.2f}", flush=True)  # fmt: skip
    for name in MEASURES:
        peaks = {}
        for each in WAYS:
            command = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch), "--seq-len",
                       str(args.seq_len), "--way", each, "--measure", name]  # fmt: skip
            peaks[each] = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])[
                "peak_mb"
            ]
        print(f"{name}, peak memory: chunked head {peaks[WAYS[0]]:.0f} MB, whole logits {peaks[WAYS[1]]:.0f} MB, "
              f"ratio {peaks[WAYS[0]] / peaks[WAYS[1]]:.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
