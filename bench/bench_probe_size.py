"""What a smaller probe training set costs the probe: the unmodified accuracy, and one change's paired Δ, of probes
trained on the first m of the same 5,000 training examples (each with its C chosen by cross-validation, as the
report's probe is), on the same held-out examples.

Run:  python bench/bench_probe_size.py [--model minilm-l6] [--task imdb] [--held-out 1536] [--sizes 512,1024,2000,5000]

The change is [SEP] removed in every layer, a small one, whose Δ a weaker probe might read differently. The
report trains its probes on 5,000 examples (attnlens/report/presets.py): this measures what fewer would cost.
"""

from __future__ import annotations

import argparse

import numpy as np

import attnlens
from attnlens.analysis.changes import Ablation
from attnlens.analysis.task import TaskJudge, TaskSettings
from attnlens.analysis.task.probe import choose_c, fit_probe
from attnlens.data.positions import DEFAULT_CLASSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--task", default="imdb")
    parser.add_argument("--held-out", type=int, default=1536)
    parser.add_argument("--sizes", default="512,1024,2000,5000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    model = attnlens.load_model(args.model)
    settings = TaskSettings(name=args.task, task_train=max(sizes), task_eval="auto", task_pool=4000)
    judge = TaskJudge(model, settings, seq_len=128, batch_size=16)
    train, labels = judge.unmodified_features(judge.train), judge.train.labels
    held = judge.pool.take(slice(0, args.held_out))
    unmodified, changed = judge.unmodified_features(held, as_judged=True), judge.features(held, Ablation("sep", DEFAULT_CLASSES))
    print(f"{args.model} on {args.task}, {len(held)} held-out examples")
    print("| training examples | C | accuracy | Δ, [SEP] removed, points [95%] |")
    print("|---|---|---|---|")
    for size in sizes:
        c = choose_c(train[:size], labels[:size], 0)
        probe = fit_probe(train[:size], labels[:size], c)
        right = [(probe.logits(features).argmax(1) == held.labels).astype(float) for features in (unmodified, changed)]
        paired = right[1] - right[0]
        half = 1.96 * paired.std(ddof=1) / np.sqrt(len(paired))
        print(f"| {size:,} | {c:g} | {right[0].mean():.3f} | {100 * paired.mean():+.2f} [{100 * (paired.mean() - half):+.2f}, "
              f"{100 * (paired.mean() + half):+.2f}] |")  # fmt: skip


if __name__ == "__main__":
    main()
