"""Do plans hold on data they never saw? The held-out meet rate of ``attnlens plan`` over many seeds of
the selection/held-out draw, under its selection rule and under the rule it replaced.

Run:  python bench/bench_plan_coverage.py [--seeds 20] [--seq-len 64] [--budgets 0.02,0.05]

For each seed (the fit, selection and held-out blocks drawn anew, at the command's default sizes),
the planner's curves are measured once, then each budget's plan is chosen twice on the same curves
and the same judged changes:

  forecast   the rule ``attnlens plan`` uses: the check's upper end forecast from the selection
             data (``attnlens.analysis.plan.judging.forecast_high``) within the allowance   <- the rule
  margin     the rule before it: the selection's upper end plus its half-width scaled by
             √(n_select / n_check) within the allowance                                   <- the baseline

and each plan is checked on the held-out blocks. Printed per budget and rule: how often the plan met
its budget on held-out data (with a Wilson 95% interval), its mean FLOPs, and the FLOPs of the
forecast rule's plan minus the margin rule's where the margin rule's met. The rule promises at least
90% (it forecasts at 95%).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import numpy as np

import attnlens
from attnlens.analysis.plan import PlanSettings, _check_meetable, _plan_budget, _planner
from attnlens.analysis.plan.allocate import greedy_path, head_curves, uniform
from attnlens.analysis.plan.choices import EXACT
from attnlens.analysis.plan.judging import Costs


def margin_rule(self: Costs, change, part, budget) -> dict:
    """The rule ``attnlens plan`` used before the forecast (kept here, as the baseline)."""
    mean, low, high = self.interval(self.costs(change, part))
    allowance = budget.allowance(self)
    margin = (high - low) / 2 * (self.units("select") / self.units("check")) ** 0.5 if part == "select" else 0.0
    return {"cost": mean, "cost_low": low, "cost_high": high, "allowance": allowance, "margin": margin,
            "meets": bool(high + margin <= allowance)}  # fmt: skip


@contextlib.contextmanager
def rule(name: str):
    """Plans chosen under ``name`` inside the ``with``."""
    original = Costs.judged
    if name == "margin":
        Costs.judged = margin_rule
    try:
        yield
    finally:
        Costs.judged = original


def wilson(hits: int, count: int) -> tuple[float, float]:
    """The Wilson 95% interval of a rate."""
    if not count:
        return float("nan"), float("nan")
    z, rate = 1.959964, hits / count
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return centre - half, centre + half


def one_seed(model, settings: PlanSettings) -> list[dict]:
    """Every budget's plan under both rules, on one draw of the blocks."""
    planner = _planner(model, settings, "cpu", False)
    for budget in settings.budgets:
        _check_meetable(planner.judge, budget)
    curves = head_curves(planner.units, planner.choices, planner.change, lambda change: planner.proxy.costs(change, "select"),
                         planner.flops, progress=False)  # fmt: skip
    path = greedy_path(curves, planner.flops(EXACT))
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    rows = []
    for number, budget in enumerate(settings.budgets):
        for name in ("forecast", "margin"):
            with rule(name):
                judged, _, _ = _plan_budget(planner, path, uniforms, budget, settings.seed * 100 + number)
            plan = next(row for row in judged if row["method"] == "plan")
            rows.append({"budget": budget.value, "rule": name, "flops": plan["flops_ratio"], "meets": plan["check_meets"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--budgets", default="0.02,0.05")
    parser.add_argument("--ks", default=None, help="the command's default unless given, e.g. 1,4,16")
    parser.add_argument("--widths", default=None, help="the command's default unless given, e.g. 4,16,64")
    args = parser.parse_args()
    model = attnlens.load_model("minilm-l6")
    chosen = {}
    if args.ks:
        chosen["ks"] = tuple(int(k) for k in args.ks.split(","))
    if args.widths:
        chosen["widths"] = tuple(int(w) for w in args.widths.split(","))
    budgets = tuple(float(value) for value in args.budgets.split(","))
    rows = []
    for seed in range(args.seeds):
        began = time.perf_counter()
        settings = PlanSettings(seq_len=args.seq_len, max_loss=budgets, seed=seed, **chosen)
        found = one_seed(model, settings)
        rows += [{**row, "seed": seed} for row in found]
        said = ", ".join(
            f"{row['budget']:g} {row['rule']} {row['flops']:.0%} {'meets' if row['meets'] else 'MISSES'}" for row in found
        )
        print(f"seed {seed}: {said} ({time.perf_counter() - began:.0f} s)", flush=True)
    print(f"\nminilm-l6, n = {args.seq_len}, {args.seeds} seeds of the fit/selection/held-out draw, default sizes")
    for budget in budgets:
        for name in ("forecast", "margin"):
            mine = [row for row in rows if row["budget"] == budget and row["rule"] == name]
            hits = sum(row["meets"] for row in mine)
            low, high = wilson(hits, len(mine))
            print(f"budget {budget:g}, {name:8}: met {hits} of {len(mine)} ({hits / len(mine):.0%}, Wilson [{low:.0%}, {high:.0%}]), "
                  f"mean FLOPs {np.mean([row['flops'] for row in mine]):.1%}")  # fmt: skip
        paired = [
            (forecast["flops"] - margin["flops"])
            for forecast in rows if forecast["budget"] == budget and forecast["rule"] == "forecast"
            for margin in rows if margin["budget"] == budget and margin["rule"] == "margin" and margin["seed"] == forecast["seed"]
            and margin["meets"]
        ]  # fmt: skip
        if paired:
            print(f"budget {budget:g}: forecast − margin FLOPs where the margin rule's plan met: mean {np.mean(paired):+.1%}, "
                  f"most {max(paired):+.1%} ({len(paired)} seeds)")  # fmt: skip


if __name__ == "__main__":
    main()
