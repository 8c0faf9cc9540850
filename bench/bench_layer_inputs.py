"""Forwards that start at a layer: one head's change judged from its layer on, against a full forward.

Run:  python bench/bench_layer_inputs.py [--ns 64,128] [--blocks 32] [--repeats 3]

minilm-l6 on --blocks kjv blocks of n tokens, all in one batch. Every figure is the best of
--repeats runs, the modes alternating round by round after one warm-up each (the machines
here are shared and noisy); every ratio is against a baseline measured in the same run.

1. **One head's change** (head 0's diagonal removed in layer l), at every layer l:
     full      a full forward under the change (every layer runs)               <- the baseline
     from l    ``LayerInputs.forward_from(l)`` under the same change (layers < l skipped)
   the ratio from/full beside the share of layers that run, (L − l)/L, and the mean over l:
   a planner's per-head curve judges a head in every layer, so the mean is what it saves.
   The one-off ``LayerInputs.record`` is shown against the full forward too.
2. **All heads of layer l, each alone**, at every layer l:
     separate  one ``forward_from(l)`` per head (12 forwards of the batch)        <- the baseline
     stacked   ``LayerInputs.forward_each(l, ...)``: one forward of 12 stacked copies
   and the largest difference between the two, which on CPU is 0 (see tests/test_layer_inputs.py).
3. **The planner's per-head curves** (``attnlens.analysis.plan``: every head alone under a window and a
   partial choice, each judged by the proxy on the curve blocks), per curve:
     full      each curve's forward through every layer                        <- the baseline: one full forward
     started   as ``attnlens plan`` runs them: from the curve's layer (``Split.starts``)
   the ratio started/full is what a curve costs against one full forward of the same blocks.
4. **A family without a row** (not in ``CHECKED_FAMILIES``): its first record checks, once per model, that
   starting at each layer reproduces the full forward on one block:
     full      one full forward of the batch                                   <- the baseline
     check     ``layer_inputs._check_replay`` on one block, from every layer
   Where the check holds, the model then costs what a checked family costs (1.–3.); where it fails, every
   judgement is a full forward: 3.'s "full" against its "started".
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import attnlens
from attnlens import Capture
from attnlens.models.layer_inputs import LayerInputs


def best_of(modes: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time per mode in ms, rounds alternating the modes after one warm-up each."""
    best = dict.fromkeys(modes, float("inf"))
    with torch.no_grad():
        for run in modes.values():
            run()
        for _ in range(repeats):
            for mode, run in modes.items():
                began = time.perf_counter()
                run()
                best[mode] = min(best[mode], time.perf_counter() - began)
    return {mode: seconds * 1e3 for mode, seconds in best.items()}


def no_self_in(layer: int, head: int):
    """Head ``head``'s diagonal removed in ``layer``, nothing elsewhere."""

    def intervene(at: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
        if at != layer:
            return None
        changed = scores.clone()
        changed[:, head] = changed[:, head].masked_fill(torch.eye(scores.shape[-1], dtype=torch.bool), float("-inf"))
        return changed

    return intervene


def one_head(model, ids: torch.Tensor, repeats: int) -> None:
    layers = model.num_layers
    cache = LayerInputs.record(model, ids)
    with torch.no_grad():
        timing = best_of({"full": lambda: model.forward(ids), "record": lambda: LayerInputs.record(model, ids)}, repeats)
    print(f"  record (one-off): {timing['record']:8.1f} ms = {timing['record'] / timing['full']:.2f}x a full forward "
          f"({timing['full']:.1f} ms); cache {cache.nbytes / 2**20:.1f} MiB")  # fmt: skip
    print(f"  {'layer':>5s} {'full ms':>9s} {'from ms':>9s} {'from/full':>9s} {'(L-l)/L':>8s}")
    ratios = []
    for layer in range(layers):
        with Capture(layers=[layer], intervene=no_self_in(layer, 0), record=False):
            ms = best_of({"full": lambda: model.forward(ids), "from": lambda: cache.forward_from(layer)}, repeats)
        ratios.append(ms["from"] / ms["full"])
        print(f"  {layer:5d} {ms['full']:9.1f} {ms['from']:9.1f} {ratios[-1]:9.2f} {(layers - layer) / layers:8.2f}")
    print(f"  {'mean':>5s} {'':9s} {'':9s} {sum(ratios) / layers:9.2f} {(layers + 1) / (2 * layers):8.2f}")


def all_heads(model, ids: torch.Tensor, repeats: int) -> None:
    cache = LayerInputs.record(model, ids)
    heads = model.num_heads
    print(f"  {'layer':>5s} {'separate ms':>11s} {'stacked ms':>10s} {'stacked/separate':>16s} {'max |diff|':>10s}")
    ratios = []
    for layer in range(model.num_layers):
        changes = [no_self_in(layer, head) for head in range(heads)]

        def separate() -> list[torch.Tensor]:
            outputs = []
            for change in changes:
                with Capture(layers=[layer], intervene=change, record=False):
                    outputs.append(cache.forward_from(layer).last_hidden_state)
            return outputs

        ms = best_of({"separate": separate, "stacked": lambda: cache.forward_each(layer, changes)}, repeats)
        with torch.no_grad():
            stacked = [each["last_hidden_state"] for each in cache.forward_each(layer, changes)]
            diff = max((a - b).abs().max().item() for a, b in zip(stacked, separate()))
        ratios.append(ms["stacked"] / ms["separate"])
        print(f"  {layer:5d} {ms['separate']:11.1f} {ms['stacked']:10.1f} {ratios[-1]:16.2f} {diff:10.2g}")
    print(f"  {'mean':>5s} {'':11s} {'':10s} {sum(ratios) / len(ratios):16.2f}")


def planner_curves(model, n: int, blocks: int, repeats: int) -> None:
    """The planner's per-head curves, as ``plan`` runs them, against each curve as a full forward."""
    from attnlens.analysis.plan import PlanSettings, _planner
    from attnlens.analysis.plan.allocate import head_curves

    settings = PlanSettings.build(
        seq_len=n, fit_seqs=16, curve_seqs=blocks, select_seqs=2, eval_seqs=2, max_loss=[0.05], ks=[4], widths=[8]
    )
    planner = _planner(model, settings, "cpu", False)
    split = planner.proxy.split("curve")
    starts = split.starts
    units = planner.units[:: max(1, len(planner.units) // 24)]  # two heads per layer: the layers' mix of a full curve

    def curves(started: bool) -> Callable[[], object]:
        def run() -> object:
            split.starts = starts if started else None
            planner.proxy._known = {}  # judge every change afresh
            return head_curves(units, planner.choices, planner.change, lambda change: planner.proxy.per_unit(change, "curve"),
                               planner.price, progress=False)  # fmt: skip

        return run

    times = best_of({"full": curves(False), "started": curves(True)}, repeats)
    count = len(units) * len(planner.choices)
    print(
        f"  {count} curves: full {times['full'] / count:8.1f} ms a curve, started {times['started'] / count:8.1f} ms a curve; "
        f"started/full {times['started'] / times['full']:.2f}"
    )


def unchecked(model, ids: torch.Tensor, repeats: int) -> None:
    """The one-off check of a family without a row, against one full forward of the batch."""
    from attnlens.models import layer_inputs

    times = best_of(
        {"full": lambda: model.forward(ids), "check": lambda: layer_inputs._check_replay(model, ids[:1], None)}, repeats
    )
    print(f"  check (once per model, one block, {model.num_layers - 1} starts): {times['check']:8.1f} ms = "
          f"{times['check'] / times['full']:.2f}x a full forward of the batch ({times['full']:.1f} ms)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="64,128")
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = attnlens.load_model("minilm-l6")
    corpus = attnlens.load_corpus("kjv")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; minilm-l6, {args.blocks} kjv blocks, best of {args.repeats}"
    )
    for n in (int(n) for n in args.ns.split(",")):
        ids = torch.from_numpy(corpus.blocks(model, n, num_blocks=args.blocks, seed=0).ids)
        print(f"\nn = {n}\n1. one head's change in layer l (head 0, diagonal removed), ms; ratios against the full forward")
        one_head(model, ids, args.repeats)
        print(f"2. all {model.num_heads} heads of layer l, each alone, ms; ratios against one forward_from(l) per head")
        all_heads(model, ids, args.repeats)
        print("3. the planner's per-head curves, as `attnlens plan` judges them, against the same curves as full forwards")
        planner_curves(model, n, args.blocks, args.repeats)
        print("4. a family without a row: the one-off check, against a full forward of the batch")
        unchecked(model, ids, args.repeats)


if __name__ == "__main__":
    main()
