"""The report's plan section and claims row: the cheapest attention within a budget of accuracy."""

from __future__ import annotations

import pandas as pd

from attnlens.analysis.plan.result import choices_name

CLAIM = "The cheapest attention within 1 point of accuracy, planned head by head"
PAPERS = (
    "Both allocate uniformly and count FLOPs: A one k (up to 45% fewer attention FLOPs, MNLI 79.7 vs 81.6 at k = 32), "
    "SparseBERT one λ (91.2% sparse)"
)


def _points(row: pd.Series, prefix: str) -> str:
    """A drop in accuracy as a change in points, with its interval: ``−0.27 [−0.71, +0.14]``."""
    values = [0.0 - 100 * row[f"{prefix}{end}"] for end in ("", "_high", "_low")]  # 0.0 -: no "−0.00"
    return "{:+.2f} [{:+.2f}, {:+.2f}]".format(*values).replace("-", "−")


def headline(plan_result) -> pd.DataFrame:
    """The methods at the budget nearest 1 point."""
    summary = plan_result.tables["summary"]
    budget = min(summary.budget.unique(), key=lambda value: abs(value - 1.0))
    return summary[summary.budget == budget].set_index("method")


def plan_claims(plan_result) -> list[tuple[str, ...]]:
    """The claims row: the plan's FLOPs and held-out verdict beside the uniform and random plans."""
    rows = headline(plan_result)
    plan = rows.loc["plan"]
    units = plan_result.settings["units"]
    said = [
        f"plan: {plan.flops_ratio:.0%} of the FLOPs, Δ {_points(plan, 'check_cost')} points "
        f"({'meets' if plan.check_meets else 'misses'} −{plan.budget:g})"
    ]
    for kind, label in (("partial", "one k"), ("window", "one window")):
        if f"uniform {kind}" in rows.index:
            row, matched = rows.loc[f"uniform {kind}"], rows.loc[f"uniform {kind} at plan FLOPs"]
            chosen = "none meets" if row.detail.startswith("none") else f"{row.detail} meets at {row.flops_ratio:.0%}"
            if matched.detail != row.detail:
                chosen += f", {matched.detail} at the plan's FLOPs {_points(matched, 'check_cost')}"
            said.append(f"{label}: {chosen}")
    random = rows.loc["random"]
    said.append(f"random: {_points(random, 'check_cost')}")
    proxy = f"chosen on {units['select']:,} examples, checked on {units['check']:,} others"
    return [(CLAIM, PAPERS, proxy, "; ".join(said))]


def plan_section(plan_result, shown, figures, section, table) -> str:
    """Section 7: FLOPs against budget, the chosen heads, and every method's verdicts."""
    budget = headline(plan_result).budget.iloc[0]
    settings = plan_result.settings
    body = [
        figures.embed(shown / "flops_by_budget.png", "Attention FLOPs within each budget: the plan, uniform and random"),
        figures.embed(shown / f"{choices_name(budget)}.png", f"The plan at {budget:g} points: each head's choice"),
        table(plan_result.view(frame=plan_result.tables["summary"])),
    ]
    return section(
        "7. What is the cheapest attention that keeps the model?",
        f"Per layer and head: exact, partial with its own k (greedy keys, closed-form map fitted on "
        f"{settings['fit_seqs']} blocks) or a window, at the fewest attention FLOPs within each budget of task accuracy "
        f"({', '.join(settings['budgets'])}). Curves of every head alone on {settings['select_seqs']} blocks give a greedy "
        f"path; the plan is the last step of it that meets the budget, run on the model, on {settings['units']['select']} "
        f"task examples (the upper end of the paired 95% interval plus a margin for the check's interval within the "
        f"budget), then checked on {settings['units']['check']} other examples, beside the cheapest uniform plans that meet "
        f"it on the same examples and a random allocation of the plan's FLOPs. FLOPs count a window's kept pairs as a "
        f"sparse kernel would; bench/bench_partial.py says what they become in seconds.",
        body,
    )
