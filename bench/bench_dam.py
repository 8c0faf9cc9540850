"""One DAM training step against a plain forward + backward of the same model on the same batch,
and the time a DAM run takes to converge.

Run:  python bench/bench_dam.py [--variants structured,unstructured,structured+global,class] [--repeats 7]
                                [--converge-sparsity 0.9] [--converge-seq-len 64]

In one process, on one batch of real blocks (minilm-l6, n=128, batch 16 by default):

  plain     objective forward (no capture, no mask) + backward to the model's weights,
            i.e. what one fine-tuning step of the model costs without the optimiser
  dam:V     one DAM step of variant V with the product's own recipe (``DamSettings()``, the
            defaults ``attnlens dam`` runs): Gumbel-sigmoid sample, forward with the mask
            applied in every layer (removal renormalise: the weights gated and renormalised),
            loss + λ·density, backward, Adam update of the mask logits (weights frozen)

Repeats interleave the modes (so a noisy neighbour slows all of them alike); the figures
are medians. Target: dam / plain <= 1.5x.

Then one ``attnlens.dam`` run of DAM_s at the target ``--converge-sparsity`` with the default
recipe (n = ``--converge-seq-len``, 64 training blocks): its wall time, the steps the stopping
rule let it take, and that time against as many plain forward + backward steps at that n,
measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnlens
from attnlens.analysis.changes import Batch
from attnlens.analysis.dam import LAYOUTS, DamSettings, DamTrainer
from attnlens.analysis.evaluation import valid_masks
from attnlens.analysis.objectives import Objective
from attnlens.data.positions import DEFAULT_CLASSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--variants", default="structured,unstructured,structured+global,class")
    parser.add_argument("--converge-sparsity", type=float, default=0.9)
    parser.add_argument("--converge-seq-len", type=int, default=64)
    args = parser.parse_args()

    model = attnlens.load_model(args.model)
    blocks = attnlens.load_corpus("kjv").blocks(model, n=args.seq_len, num_blocks=args.batch_size, seed=0)
    ids = torch.from_numpy(blocks.ids)
    judge = Objective(model)
    batch = judge.prepare(ids)
    valid = valid_masks(model, blocks.ids)

    def plain() -> None:
        loss = judge.evaluate(batch)["loss"].mean()
        model.model.zero_grad(set_to_none=True)
        loss.backward()

    modes = {"plain": plain}
    for variant in args.variants.split(","):
        layout = LAYOUTS[variant](model.num_layers, model.num_heads, args.seq_len, valid, DEFAULT_CLASSES)
        trainer = DamTrainer(layout, DamSettings.build(seq_len=args.seq_len), lam=0.1).start(model)  # the recipe dam() runs
        layout_context = layout.context(Batch(ids, model, 0))

        def step(trainer=trainer, layout_context=layout_context) -> None:
            with attnlens.analysis.evaluation.frozen(model.model):
                trainer.step(judge, batch, layout_context)

        modes[f"dam:{variant}"] = step

    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for run in modes.values():  # warm-up: allocator, kernels, first-call costs
        run()
    for _repeat in range(args.repeats):
        for mode, run in modes.items():
            start = time.perf_counter()
            run()
            times[mode].append(time.perf_counter() - start)
    median = {mode: statistics.median(values) for mode, values in times.items()}
    print(
        f"{args.model}, n={args.seq_len}, batch {args.batch_size}, {torch.get_num_threads()} threads, "
        f"median of {args.repeats} interleaved repeats"
    )
    print(f"{'mode':18s} {'seconds':>8s} {'x plain':>8s}")
    for mode in modes:
        print(f"{mode:18s} {median[mode]:8.3f} {median[mode] / median['plain']:8.2f}")
    worst = max(median[mode] / median["plain"] for mode in modes if mode != "plain")
    print(f"worst dam / plain = {worst:.2f}x (target <= 1.5x)")
    converge(model, args)


def converge(model, args) -> None:
    """Time to convergence of DAM_s at one target sparsity, against plain steps at the same n."""
    n = args.converge_seq_len
    blocks = attnlens.load_corpus("kjv").blocks(model, n=n, num_blocks=args.batch_size, seed=1)
    judge = Objective(model)
    batch = judge.prepare(torch.from_numpy(blocks.ids))
    plain = []
    for _ in range(args.repeats + 1):
        start = time.perf_counter()
        loss = judge.evaluate(batch)["loss"].mean()
        model.model.zero_grad(set_to_none=True)
        loss.backward()
        plain.append(time.perf_counter() - start)
    step = statistics.median(plain[1:])
    start = time.perf_counter()
    result = attnlens.dam(
        model, sparsity=[args.converge_sparsity], seq_len=n, train_seqs=64, eval_seqs=32, batch_size=args.batch_size,
        patterns=False, bootstrap=200, progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    row = result.table.iloc[0]
    print(
        f"converge: DAM_s at target {args.converge_sparsity:.0%} (n={n}): {seconds:.1f} s in all, "
        f"{int(row['steps'])} steps, converged {bool(row['converged'])}, sparsity {row['sparsity']:.3f}; "
        f"{row['seconds'] / row['steps'] / step:.2f}x a plain forward + backward per training step ({step:.3f} s)"
    )


if __name__ == "__main__":
    main()
