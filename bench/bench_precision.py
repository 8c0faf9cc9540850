"""Judging in bfloat16: the judge's own forwards at --precision bfloat16 against float32, per model.

Run:  python bench/bench_precision.py [--models minilm-l6,gemma3-270m] [--blocks 16] [--seq-len 128] [--repeats 5] [--train]

For each model, on the same --blocks blocks of --seq-len tokens of kjv, in alternating rounds (a
noisy neighbour slows all alike; one warm-up each), median seconds of:

  proxy  float32    Objective.evaluate, the proxy's judging forward (1 - cosine of the final hidden
                    states for an encoder, next-token loss for a decoder), as today       <- the baseline
  proxy  bfloat16   the same call with the objective at precision bfloat16 (bfloat16 autocast,
                    attnlens.models.precision.judging): what --precision bfloat16 runs
  task   float32    pooled_features, the task judge's forward (the backbone, no head), as today
  task   bfloat16   the same at bfloat16
  weights bfloat16  the proxy's forward on a bfloat16 copy of the weights, for scale only: attnlens does
                    not run it (docs/science.md, "Judging in bfloat16", says why)
  --train           a training step too (forward and backward of the proxy loss to every weight, as the
                    finetune protocol and DAM with --train-weights take), float32 and bfloat16

Beside the seconds, how far bfloat16 moves what is judged, in relative norm ||x_bf16 - x_fp32|| / ||x_fp32||:
the final hidden states, and the logits of a model with a language-model head. Target: bfloat16 at
most 0.7x float32 (a speed-up of 1.4x or more) for the proxy's forward of every model, on hardware
with bfloat16 matrix units (a GPU, or a CPU with AMX). A CPU with AVX-512 BF16 alone multiplies
bfloat16 matrices no faster than float32 ones, and there bfloat16 only costs: the script prints which
units the CPU reports, and oneDNN's choice of kernel (ONEDNN_VERBOSE=1) shows which it uses.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import attnlens
from attnlens.analysis.objectives import Objective
from attnlens.analysis.task import TaskBatch, pooled_features
from attnlens.models.loading import LoadedModel, backbone
from attnlens.models.precision import judging

sys.path.insert(0, str(Path(__file__).parent))
from _timing import rounds  # noqa: E402

TARGET = 0.7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm-l6,gemma3-270m")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train", action="store_true", help="also time a training step (forward and backward)")
    args = parser.parse_args()
    corpus = attnlens.load_corpus("kjv")
    print(
        f"{args.blocks} blocks x {args.seq_len} tokens of kjv, median of {args.repeats} rounds, {torch.get_num_threads()} threads"
    )
    print(f"CPU's bfloat16 units: {bfloat16_units()}")
    for alias in args.models.split(","):
        began = time.perf_counter()
        model = attnlens.load_model(alias)
        loaded = time.perf_counter() - began
        ids = torch.from_numpy(corpus.blocks(model, args.seq_len, num_blocks=args.blocks).ids)
        seconds = rounds(modes(model, ids, args.train), args.repeats)
        report(alias, model, seconds, moved(model, ids), loaded)


Mode = tuple[str, str]  # (what is timed, its precision)


def modes(model: LoadedModel, ids: torch.Tensor, train: bool) -> dict[Mode, Callable[[], object]]:
    """Each timed call, by its name: the judge's own calls at both precisions, and the bfloat16 copy."""
    objectives = {precision: Objective(model, precision=precision) for precision in ("float32", "bfloat16")}
    prepared = {precision: objective.prepare(ids) for precision, objective in objectives.items()}
    batch = TaskBatch(ids, torch.ones_like(ids), torch.zeros(len(ids), dtype=torch.long), 0)
    pooling = "last" if model.causal else "mean"
    halved = copy.copy(model)  # the same LoadedModel, its module a bfloat16 copy
    halved.model = copy.deepcopy(model.model).to(torch.bfloat16)
    by_copy, copy_batch = Objective(halved), prepared["float32"]

    def forward(objective: Objective, batch) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return objective.evaluate(batch)

        return run

    def features(precision: str) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return pooled_features(model.model, pooling, batch, precision)

        return run

    def step(precision: str) -> Callable[[], object]:
        def run() -> object:
            model.model.zero_grad(set_to_none=True)
            # at the unmodified model 1 - cosine's gradient is zero, but backward costs the same as anywhere
            loss = objectives[precision].evaluate(prepared[precision])["loss"].mean()
            loss.backward()
            return loss

        return run

    timed: dict[Mode, Callable[[], object]] = {
        ("proxy", "float32"): forward(objectives["float32"], prepared["float32"]),
        ("proxy", "bfloat16"): forward(objectives["bfloat16"], prepared["bfloat16"]),
        ("task", "float32"): features("float32"),
        ("task", "bfloat16"): features("bfloat16"),
        ("weights", "bfloat16"): forward(by_copy, copy_batch),
    }
    if train:
        timed |= {("step", "float32"): step("float32"), ("step", "bfloat16"): step("bfloat16")}
    return timed


def bfloat16_units() -> str:
    """What the CPU reports of bfloat16 arithmetic (Linux's /proc/cpuinfo flags): AMX tiles, AVX-512 BF16 dot products."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    named = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16"}
    found = [name for flag, name in named.items() if flag in flags]
    return ", ".join(found) if found else "none"


def moved(model: LoadedModel, ids: torch.Tensor) -> dict[str, float]:
    """Relative norm of the change bfloat16 makes: final hidden states, and logits where the model has a head."""
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for precision in ("float32", "bfloat16"):
        with torch.no_grad(), judging(precision):
            hidden = backbone(model.model)(input_ids=ids).last_hidden_state.float()
            logits = model.forward(ids).logits.float() if model.objective != "hidden" else None
        outputs[precision] = {"hidden": hidden, **({"logits": logits} if logits is not None else {})}
    exact, rounded = outputs["float32"], outputs["bfloat16"]
    return {name: float((rounded[name] - value).norm() / value.norm()) for name, value in exact.items()}


def report(alias: str, model: LoadedModel, median: dict[Mode, float], relative: dict[str, float], loaded: float) -> None:
    print(f"\n{alias} ({model.num_layers} layers, objective {model.objective}; loaded in {loaded:.0f} s)")
    for (kind, precision), value in median.items():
        against = "proxy" if kind == "weights" else kind  # the copy's forward is the proxy's
        base = median[(against, "float32")]
        print(f"  {kind:8s} {precision:9s} {value:7.3f} s  {base / value:5.2f}x speed-up over {against} float32")
    for name, value in relative.items():
        print(
            f"  bfloat16 moves the {'final hidden states' if name == 'hidden' else 'logits'} by {100 * value:.2f}% (relative norm)"
        )
    ratio = median[("proxy", "bfloat16")] / median[("proxy", "float32")]
    print(
        f"  the proxy's forward in bfloat16 {'meets' if ratio <= TARGET else 'misses'} the target of {TARGET}x float32 ({ratio:.2f}x)"
    )


if __name__ == "__main__":
    main()
