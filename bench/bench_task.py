"""Task judging cost: one change judged on N held-out examples against a plain forward of the same batches.

Run:  python bench/bench_task.py [--task rotten-tomatoes] [--examples 1000] [--rounds 5]

Every mode runs in this process on the same held-out examples, in alternating rounds (a
noisy neighbour slows all alike); the figures are medians.

  plain     transformers' default attention (sdpa), forward only, in the judge's own batches
            (length-bucketed: each batch padded to its own longest example)       <- the baseline
  judge     attnlens.analysis.task.TaskJudge.judge: one change (the diagonal removed in
            every layer) inside attnlens's attention, pooling, the probe, the bootstrap intervals
  pattern   the same for bigbird(2): a pattern on length-bucketed batches, each example's random
            keys drawn at n and cut to its batch
  padded    the plain forward with every batch padded to the longest example of the split
            (how examples were batched before length bucketing), for scale

Target: judge <= 1.1x plain (minilm-l6). The one-off costs (the unmodified model's training
features and the probe fit) are timed once and shown beside; they are cached afterwards.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import attnlens
from attnlens.analysis.changes import Ablation, PatternChange
from attnlens.analysis.task import TaskJudge, TaskSettings, batches

sys.path.insert(0, str(Path(__file__).parent))
from _timing import rounds  # noqa: E402

TARGET = 1.1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="rotten-tomatoes")
    parser.add_argument("--examples", type=int, default=1000, help="held-out examples judged")
    parser.add_argument("--train", type=int, default=512, help="training examples of the probe")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    model = attnlens.load_model("minilm-l6")
    settings = TaskSettings(name=args.task, task_train=args.train, task_eval=args.examples)
    began = time.perf_counter()
    judge = TaskJudge(model, settings, seq_len=args.seq_len, batch_size=args.batch_size)
    one_off = time.perf_counter() - began
    examples, change = judge.held_out, Ablation("self", ("self", "other"))
    plain = transformers.AutoModel.from_pretrained(model.source, attn_implementation="sdpa").eval()

    def plain_pass() -> None:
        with torch.no_grad():
            for batch in batches(examples, args.batch_size, model.device):
                plain(input_ids=batch.ids, attention_mask=batch.attention_mask)

    def padded_pass() -> None:
        with torch.no_grad():
            for start in range(0, len(examples), args.batch_size):
                part = slice(start, start + args.batch_size)
                plain(
                    input_ids=torch.from_numpy(examples.ids[part]), attention_mask=torch.from_numpy(examples.attention_mask[part])
                )

    def judging(change) -> Callable[[], None]:
        def judge_pass() -> None:
            judge._judged.pop(change.key, None)  # a change is judged once per judge: forget it, to time the judgement itself
            judge.judge(change)

        return judge_pass

    pattern = PatternChange("bigbird", 2, args.seq_len)
    modes = {"plain": plain_pass, "judge": judging(change), "pattern": judging(pattern), "padded": padded_pass}
    seconds = rounds(modes, args.rounds)
    report(args, examples, seconds, one_off)


def report(args, examples, median: dict[str, float], one_off: float) -> None:
    tokens = int(examples.lengths.sum())
    print(
        f"task {args.task}: {len(examples)} held-out examples, {tokens} tokens (longest {examples.lengths.max()}), "
        f"batch {args.batch_size}, {args.rounds} rounds"
    )
    for mode, value in median.items():
        print(f"  {mode:7s} {value:7.3f} s  {len(examples) / value:7.1f} ex/s  {tokens / value:8.0f} tokens/s  "
              f"{value / median['plain']:5.2f}x plain")  # fmt: skip
    verdict = "meets" if median["judge"] / median["plain"] <= TARGET else "misses"
    print(f"  judging one change {verdict} the target of {TARGET}x plain")
    print(f"  one-off: split, {args.train} training examples' features, probe (C by 5-fold CV) and the unmodified "
          f"held-out features {one_off:.1f} s (cached for the next run)")  # fmt: skip


if __name__ == "__main__":
    main()
