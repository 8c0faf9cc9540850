"""Do plans hold on data they never saw? The held-out meet rate of ``attnlens plan`` over many seeds of
the fit/curve/selection/held-out draw, under its rule and under the rules it replaced.

Run:  python bench/bench_plan_coverage.py [--seeds 20] [--first-seed 0] [--rules rule,margin] [--seq-len 64] [--budgets 0.02,0.05]

For each seed (every part's blocks drawn anew, at the command's default sizes), each budget's plan is
chosen two ways on the same blocks:

  rule      the rule ``attnlens plan`` uses: the path from curves on the curve blocks, each step
            judged on the selection blocks by its forecast of the check's upper end at a one-sided
            97.5% quantile (``attnlens.analysis.plan.judging.forecast_high``) within the allowance  <- the rule
  margin    the rule of the issue: the path from curves on the selection blocks themselves, each
            step meeting when its upper end plus its half-width scaled by √(n_select / n_check) is
            within the allowance                                                             <- the baseline

and each plan is checked on the held-out blocks. Printed per budget and rule: how often the plan met
its budget on held-out data (with a Wilson 95% interval), its mean FLOPs, and the paired FLOPs of the
rule's plan minus the baseline's where the baseline's met. The rule promises at least 90%.

With ``--pool P --draws D`` (e.g. 480 and 600) it measures the rate more finely, for one seed's maps and
path: the plan's own code (``_plan_budget``) chooses on D draws of selection and check blocks from P
held-out blocks, every change run once on the pool, at the forecast's one-sided quantile of 5% and of
2.5% (the rule's), on the same draws.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import time

import numpy as np

import attnlens
from attnlens.analysis.plan import PlanSettings, _check_meetable, _plan_budget, _planner, judging
from attnlens.analysis.plan.allocate import greedy_path, head_curves, uniform
from attnlens.analysis.plan.judging import Costs, ProxyCosts


def margin_rule(self: Costs, change, part, budget) -> dict:
    """The rule ``attnlens plan`` used before the forecast (kept here, as the baseline)."""
    mean, low, high = self.interval(self.per_unit(change, part))
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


RULES = {"rule": ("curve", "forecast"), "margin": ("select", "margin")}  # curves on, judged by


def one_seed(model, settings: PlanSettings, rules: dict[str, tuple[str, str]]) -> list[dict]:
    """Every budget's plan under each of ``rules``, on one draw of the blocks."""
    planner = _planner(model, settings, "cpu", False)
    for budget in settings.budgets:
        _check_meetable(planner.costs, budget)
    paths = {}
    for part in {part for part, _ in rules.values()}:
        curves = head_curves(planner.units, planner.choices, planner.change, lambda change, part=part: planner.proxy.per_unit(change, part),
                             planner.price, progress=False)  # fmt: skip
        paths[part] = greedy_path(curves)
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    rows = []
    for number, budget in enumerate(settings.budgets):
        for name, (part, judged_by) in rules.items():
            with rule(judged_by):
                judged, _, _ = _plan_budget(planner, paths[part], uniforms, budget, settings.seed * 100 + number)
            plan = next(row for row in judged if row["method"] == "plan")
            rows.append({"budget": budget.value, "rule": name, "flops": plan["flops_ratio"], "meets": plan["check_meets"]})
    return rows


class Drawn(Costs):
    """One draw of selection and check blocks from a pool of held-out blocks, every change's per-block
    costs computed once on the whole pool (``pool``'s check part) and read at the draw's blocks."""

    def __init__(self, pool: ProxyCosts, select: np.ndarray, check: np.ndarray) -> None:
        super().__init__()
        self.pool, self.parts, self.bootstrap, self.seed = pool, {"select": select, "check": check}, pool.bootstrap, pool.seed

    def _compute(self, change, part: str) -> np.ndarray:
        return self.pool.per_unit(change, "check")[self.parts[part]]

    def unmodified_loss(self, part: str) -> float:
        return float(self.pool.baseline("check")[self.parts[part]].mean())

    def units(self, part: str) -> int:
        return len(self.parts[part])


def pooled(model, settings: PlanSettings, pool: int, draws: int) -> None:
    """The meet rate on ``draws`` draws of selection and check blocks from ``pool`` held-out blocks."""
    planner = _planner(model, dataclasses.replace(settings, eval_seqs=pool), "cpu", False)
    curves = head_curves(planner.units, planner.choices, planner.change, lambda change: planner.proxy.per_unit(change, "curve"),
                         planner.price, progress=False)  # fmt: skip
    path = greedy_path(curves)
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    print(f"minilm-l6, n = {settings.seq_len}: {draws} draws of {settings.select_seqs} selection and {settings.eval_seqs} "
          f"check blocks from {pool} held-out blocks (seed {settings.seed}'s maps and path)")  # fmt: skip
    for rate in (0.05, judging.MISS_RATE):
        judging.forecast_high.__defaults__ = (rate,)  # the one-sided quantile the selection's forecast uses
        for number, budget in enumerate(settings.budgets):
            rng, met, spent = np.random.default_rng(settings.seed), 0, []
            for _ in range(draws):
                order = rng.permutation(pool)
                planner.costs = Drawn(
                    planner.proxy, order[: settings.select_seqs], order[settings.select_seqs :][: settings.eval_seqs]
                )
                judged, _, _ = _plan_budget(planner, path, uniforms, budget, number)
                plan = next(row for row in judged if row["method"] == "plan")
                met, spent = met + plan["check_meets"], spent + [plan["flops_ratio"]]
            low, high = wilson(met, draws)
            print(f"budget {budget.value:g}, forecast at {rate:.1%}: met {met} of {draws} ({met / draws:.1%}, Wilson "
                  f"[{low:.1%}, {high:.1%}]), mean FLOPs {np.mean(spent):.2%}", flush=True)  # fmt: skip
    judging.forecast_high.__defaults__ = (judging.MISS_RATE,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, ..., first-seed + seeds - 1")
    parser.add_argument("--rules", default="rule,margin", help="which rules to plan by (rule alone costs half)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--budgets", default="0.02,0.05")
    parser.add_argument("--ks", default=None, help="the command's default unless given, e.g. 1,4,16")
    parser.add_argument("--widths", default=None, help="the command's default unless given, e.g. 4,16,64")
    parser.add_argument("--pool", type=int, default=0, help="draw selection and check blocks from this many held-out blocks")
    parser.add_argument("--draws", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0, help="with --pool: the seed of the maps, the path and the pool")
    args = parser.parse_args()
    model = attnlens.load_model("minilm-l6")
    chosen = {}
    if args.ks:
        chosen["ks"] = tuple(int(k) for k in args.ks.split(","))
    if args.widths:
        chosen["widths"] = tuple(int(w) for w in args.widths.split(","))
    budgets = tuple(float(value) for value in args.budgets.split(","))
    if args.pool:
        return pooled(
            model, PlanSettings.build(seq_len=args.seq_len, max_loss=budgets, seed=args.seed, **chosen), args.pool, args.draws
        )
    rules = {name: RULES[name] for name in args.rules.split(",")}
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        began = time.perf_counter()
        settings = PlanSettings.build(seq_len=args.seq_len, max_loss=budgets, seed=seed, **chosen)
        found = one_seed(model, settings, rules)
        rows += [{**row, "seed": seed} for row in found]
        said = ", ".join(
            f"{row['budget']:g} {row['rule']} {row['flops']:.0%} {'meets' if row['meets'] else 'MISSES'}" for row in found
        )
        print(f"seed {seed}: {said} ({time.perf_counter() - began:.0f} s)", flush=True)
    print(f"\nminilm-l6, n = {args.seq_len}, {args.seeds} seeds of the fit/curve/selection/held-out draw, default sizes")
    for budget in budgets:
        for name in rules:
            mine = [row for row in rows if row["budget"] == budget and row["rule"] == name]
            hits = sum(row["meets"] for row in mine)
            low, high = wilson(hits, len(mine))
            print(f"budget {budget:g}, {name:8}: met {hits} of {len(mine)} ({hits / len(mine):.0%}, Wilson [{low:.0%}, {high:.0%}]), "
                  f"mean FLOPs {np.mean([row['flops'] for row in mine]):.1%}")  # fmt: skip
        for name in ("rule",):
            paired = [
                (mine["flops"] - margin["flops"])
                for mine in rows if mine["budget"] == budget and mine["rule"] == name
                for margin in rows if margin["budget"] == budget and margin["rule"] == "margin" and margin["seed"] == mine["seed"]
                and margin["meets"]
            ]  # fmt: skip
            if paired:
                print(f"budget {budget:g}: {name} − margin FLOPs where the margin rule's plan met: mean {np.mean(paired):+.1%}, "
                      f"most {max(paired):+.1%} ({len(paired)} seeds)")  # fmt: skip


if __name__ == "__main__":
    main()
