"""Task probe cost: pooled features against a plain forward of the same batches, and the probe fit.

Run:  python bench/bench_task.py [--task rotten-tomatoes] [--examples 512] [--rounds 5]

Both modes run in this process on the same padded batches of the task's examples, in
alternating rounds (a noisy neighbour slows both alike); the figures are medians.

  plain     transformers' default attention (sdpa), forward only, no pooling   <- the baseline
  features  attnlens.analysis.task: forward through attnlens's attention + pooling

Target: features <= 1.1x plain (minilm-l6). The probe fit (cross-validated choice of C,
then the final fit) is timed on the same examples' features, and shown beside the time
of one feature pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import transformers

import attnlens
from attnlens.analysis.task import TaskJudge, TaskSettings, batches, choose_c, fit_probe

TARGET = 1.1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="rotten-tomatoes")
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    model = attnlens.load_model("minilm-l6")
    settings = TaskSettings(task=args.task, task_train=args.examples, task_eval=32)
    judge = TaskJudge(model, settings, seq_len=args.seq_len, batch_size=args.batch_size)
    examples = judge.train
    plain = transformers.AutoModel.from_pretrained(model.source, attn_implementation="sdpa").eval()

    def plain_pass() -> None:
        with torch.no_grad():
            for batch in batches(examples, args.batch_size, model.device):
                plain(input_ids=batch.ids, attention_mask=batch.attention_mask)

    modes = {"plain": plain_pass, "features": lambda: judge.features(examples, None)}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for mode in modes:  # warm-up
        modes[mode]()
    for _ in range(args.rounds):
        for mode, run in modes.items():
            began = time.perf_counter()
            run()
            seconds[mode].append(time.perf_counter() - began)
    median = {mode: statistics.median(values) for mode, values in seconds.items()}

    features = judge.features(examples, None)
    began = time.perf_counter()
    c = choose_c(features, examples.labels)
    chosen = time.perf_counter() - began
    began = time.perf_counter()
    fit_probe(features, examples.labels, c)
    fitted = time.perf_counter() - began

    width = examples.ids.shape[1]
    print(f"task {args.task}: {len(examples)} examples padded to {width} tokens, batch {args.batch_size}, {args.rounds} rounds")
    for mode in modes:
        ratio = median[mode] / median["plain"]
        print(f"  {mode:9s} {median[mode]:7.3f} s  {len(examples) / median[mode]:7.1f} ex/s  {ratio:5.2f}x plain")
    verdict = "meets" if median["features"] / median["plain"] <= TARGET else "misses"
    print(f"  features {verdict} the target of {TARGET}x plain")
    print(f"  probe: choose C by 5-fold CV {chosen:.3f} s (C = {c:g}), final fit {fitted:.3f} s; "
          f"{(chosen + fitted) / median['features']:.2f}x one feature pass")  # fmt: skip
    assert np.isfinite(features).all()


if __name__ == "__main__":
    main()
