"""The plan's head screen against its head curves: the time of the step that costs every head under every choice,
against the number of heads, and the plans each picks on a real model at the same budgets.

Run:  python bench/bench_plan_screen.py heads [--heads 2,8,32,128]
      python bench/bench_plan_screen.py plans [--model minilm-l6] [--preset default|full]

``heads``: a random 2-layer BERT (hidden size 256) of each number of heads, the task's probe on IMDB (reviews that
fill n = 64), 32 curve examples, two choices (partial(16), window(8)): seconds of the screen (one forward and a backward pass per class, per
batch) and of the curves (a forward per head and choice), in alternating rounds (the median of the last two), and
their ratio.

``plans``: one planner (the report's preset's plan settings on ``--model``; the maps of every head built first, as
both ways use them), its costs found both ways on the same curve examples (their rank correlation, and the screen's estimate as a share of the measured divergence), then per
budget the plan each picks: its FLOPs, its drop on the check half, and the paired difference of the two plans'
outcomes on the same check examples, with its 95% interval (screen − curves, points of accuracy).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

HOW = ("screen", "forwards")


def curves_of(planner, how: str):
    from attnlens.analysis.plan import _curves

    return _curves(dataclasses.replace(planner, s=planner.s.replace(head_costs=how)), False)


def heads(counts: list[int]) -> None:
    import torch
    import transformers

    import attnlens
    from attnlens.analysis.plan import PlanSettings, _planner
    from tiny_models import save_with_minilm_tokenizer

    minilm = attnlens.load_model("minilm-l6")
    settings = PlanSettings.build(seq_len=64, task="imdb", task_train=64, task_eval=40, max_drop=(50.0,), fit_seqs=4,
                                  curve_seqs=32, ks=(16,), widths=(8,), forecastable_only=False)  # fmt: skip
    print("| heads | screen, s | forwards, s | forwards / screen | screen / its time at 2 heads |")
    print("|---|---|---|---|---|")
    first = None
    for count in counts:
        config = transformers.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=2, num_attention_heads=count,
                                         intermediate_size=512, max_position_embeddings=64)  # fmt: skip
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as directory:
            model = attnlens.load_model(str(save_with_minilm_tokenizer(Path(directory), transformers.BertModel(config), minilm)))
            seconds = {how: [] for how in HOW}
            for _ in range(3):  # alternating rounds, a fresh planner each time (a planner keeps what its forwards measured)
                for how in HOW:
                    planner = _planner(model, settings, "cpu", False)
                    began = time.perf_counter()
                    curves_of(planner, how)
                    seconds[how].append(time.perf_counter() - began)
            seconds = {how: float(np.median(values[1:])) for how, values in seconds.items()}  # the first round warms up
        first = first or seconds["screen"]
        print(f"| {count} | {seconds['screen']:.2f} | {seconds['forwards']:.2f} | {seconds['forwards'] / seconds['screen']:.1f} | "
              f"{seconds['screen'] / first:.2f} |")  # fmt: skip


def plans(model_name: str, preset: str) -> None:
    from scipy.stats import spearmanr

    import attnlens
    from attnlens.analysis.plan import _plan_budget, _planner
    from attnlens.analysis.plan.allocate import greedy_path, uniform
    from attnlens.analysis.plan.choices import parse
    from attnlens.report.presets import DEFAULT, FULL

    model = attnlens.load_model(model_name)
    settings = {"default": DEFAULT, "full": FULL}[preset].sized_for(causal=model.causal).plan
    planner = _planner(model, settings, "cpu", True)
    for choice in planner.choices:  # the maps of every head, which both ways use, built before either is timed
        planner.change(uniform(planner.units, choice))
    tables, seconds = {}, {}
    for how in HOW:
        began = time.perf_counter()
        tables[how] = curves_of(planner, how)
        seconds[how] = time.perf_counter() - began
    found = {how: table.set_index(["layer", "head", "choice"]).cost for how, table in tables.items()}
    screened, measured = found["screen"], found["forwards"].loc[found["screen"].index]
    share = np.quantile(screened / measured, [0.1, 0.5, 0.9])
    print(f"{model_name}, the {preset} preset's plan ({len(planner.units)} heads, {len(planner.choices)} choices): costs in "
          f"{seconds['screen']:.1f} s by the screen, {seconds['forwards']:.1f} s by forwards ({seconds['forwards'] / seconds['screen']:.1f}×); "
          f"rank correlation {spearmanr(screened, measured).statistic:.3f}; the estimate as a share of the measured divergence "
          f"{share[1]:.2f} (10–90%: {share[0]:.2f}–{share[2]:.2f})")  # fmt: skip
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    judge, check = planner.costs, planner.costs.parts["check"]
    print("| budget, points | curves by | plan FLOPs | check: drop, points [95%] | screen − curves, points [95%] |")
    print("|---|---|---|---|---|")
    for budget in settings.budgets:
        outcomes = {}
        for how in HOW:
            judged, choices, _ = _plan_budget(planner, greedy_path(tables[how]), uniforms, budget, settings.seed)
            assignment = {(row["layer"], row["head"]): parse(row["choice"]) for row in choices}
            outcomes[how] = judge._drops(planner.change(assignment), len(judge.baseline))[check]  # per example: 1 lost, −1 gained
            row = judged[0]
            paired = "" if how == "screen" else _paired(outcomes["forwards"] - outcomes["screen"])  # gained by the screen's plan
            print(f"| {budget.value:g} | {how} | {row['flops_ratio']:.1%} | {100 * row['check_cost']:.2f} "
                  f"[{100 * row['check_cost_low']:.2f}, {100 * row['check_cost_high']:.2f}] | {paired} |")  # fmt: skip


def _paired(differences: np.ndarray) -> str:
    mean, half = differences.mean(), 1.96 * differences.std(ddof=1) / np.sqrt(len(differences))
    return f"{100 * mean:+.2f} [{100 * (mean - half):+.2f}, {100 * (mean + half):+.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("heads", "plans"))
    parser.add_argument("--heads", default="2,8,32,128")
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--preset", default="default", choices=("default", "full"))
    args = parser.parse_args()
    if args.what == "heads":
        heads([int(count) for count in args.heads.split(",")])
    else:
        plans(args.model, args.preset)


if __name__ == "__main__":
    main()
