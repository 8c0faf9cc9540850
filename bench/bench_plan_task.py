"""Does a task budget's plan beat one window for every head, on the half it was not chosen on?

Run:  python bench/bench_plan_task.py [--budget 1] [--task-eval 1200] [--seq-len 128] [--seed 0]

minilm-l6 under the probe on Rotten Tomatoes, a budget of ``--budget`` points of accuracy, ``--task-eval``
held-out examples (half choose, half check: 1,148 are the fewest that can forecast 1 point). The plan is
made twice on the same halves and the same judged changes, from two kinds of per-head curves:

  task     the rule ``attnlens plan`` uses: each head's curve is the task's cross-entropy on
           ``--curve-seqs`` of its training examples                                         <- the rule
  proxy    the curves of a loss budget: 1 − cosine of the final hidden states on corpus blocks

Printed for each: the plan's FLOPs, which candidate won, its verdict on the selection half and on the
check half; then every uniform window with its verdicts on both halves, and the cheapest uniform
window that meets on the check half: the plan should cost no more than it and meet there.
"""

from __future__ import annotations

import argparse
import time

import attnlens
from attnlens.analysis.plan import PlanSettings, _plan_budget, _planner
from attnlens.analysis.plan.allocate import greedy_path, head_curves, uniform


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--task-eval", type=int, default=1200)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--curve-seqs", type=int, default=PlanSettings.curve_seqs)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = PlanSettings.build(
        max_drop=(args.budget,), task="rotten-tomatoes", protocol="probe", task_eval=args.task_eval, seq_len=args.seq_len,
        curve_seqs=args.curve_seqs, seed=args.seed,
    )  # fmt: skip
    began = time.perf_counter()
    planner = _planner(attnlens.load_model("minilm-l6"), settings, "cpu", True)
    (budget,) = settings.budgets
    uniforms = {choice: uniform(planner.units, choice) for choice in planner.choices}
    judge = planner.costs
    print(f"minilm-l6, n = {args.seq_len}, Rotten Tomatoes under the probe, budget {budget}: "
          f"{judge.units('select')} examples choose, {judge.units('check')} check")  # fmt: skip
    for name, costs in (("task", judge), ("proxy", planner.proxy)):
        curves = head_curves(planner.units, planner.choices, planner.change, lambda c, costs=costs: costs.per_unit(c, "curve"),
                             planner.price, progress=True)  # fmt: skip
        judged, _, _ = _plan_budget(planner, greedy_path(curves), uniforms, budget, args.seed)
        plan = next(row for row in judged if row["method"] == "plan")
        print(f"{name:5} curves: plan {plan['flops_ratio']:.1%} of the FLOPs ({plan['detail']}); selection "
              f"{'meets' if plan['select_meets'] else 'misses'} (forecast {100 * plan['select_forecast_high']:.2f} points), "
              f"check {'meets' if plan['check_meets'] else 'MISSES'} (drop {100 * plan['check_cost']:.2f} "
              f"[{100 * plan['check_cost_low']:.2f}, {100 * plan['check_cost_high']:.2f}] points)")  # fmt: skip
    print("uniform windows (FLOPs: selection forecast, check upper end, points):")
    cheapest = None
    for flops, choice, assignment in sorted((planner.total(a), c, a) for c, a in uniforms.items() if c.kind == "window"):
        selected, checked = (judge.judged(planner.change(assignment), part, budget) for part in ("select", "check"))
        print(f"  {str(choice):11} {flops:6.1%}: {100 * selected['forecast_high']:5.2f} {'meets ' if selected['meets'] else 'misses'}"
              f"   {100 * checked['cost_high']:5.2f} {'meets' if checked['meets'] else 'misses'}")  # fmt: skip
        if checked["meets"] and cheapest is None:
            cheapest = (flops, choice)
    said = f"{cheapest[1]} at {cheapest[0]:.1%} of the FLOPs" if cheapest else "none"
    print(f"cheapest uniform window that meets on the check half: {said} ({time.perf_counter() - began:.0f} s in all)")


if __name__ == "__main__":
    main()
