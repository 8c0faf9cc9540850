"""The report's plan section and claims row: the cheapest attention within a budget of accuracy."""

from __future__ import annotations

import pandas as pd

from attnlens.analysis.plan.result import Form, choices_name
from attnlens.report.html import Figures, section, table
from attnlens.report.verdicts import Claim, Context, Difference, Phrase, Stated, Verdict
from attnlens.report.words import LOSS_UNITS, TOO_FEW, counted, delta_points, number

CLAIM = "A plan head by head is the cheapest attention within the margin (attnlens)"
PAPERS = "both papers allocate uniformly: one k, one λ"


def headline(plan_result, context: Context | None = None) -> pd.DataFrame:
    """The methods at the budget of the report's margin (in points; a share of the unmodified accuracy resolved
    with the plan's task): the budget the report gives the plan (:meth:`ReportSettings.for_run`), or the nearest."""
    summary = plan_result.tables["summary"]
    task = plan_result.meta.get("task") or {}
    margin = 100 * (context or Context("")).margin.fraction(task.get("unmodified_accuracy", 1.0))
    budget = min(summary.budget.unique(), key=lambda value: abs(value - margin))
    return summary[summary.budget == budget].set_index("method")


def plan_claims(plan_result, context: Context) -> list[Claim]:
    """The claims row: the plan holds where its held-out change lies above −δ (it meets its budget, the margin,
    on the held-out half) and no uniform plan that meets it there costs fewer FLOPs; where the change lies below
    −δ it does not hold; below the full size, what the full size takes here."""
    rows = headline(plan_result, context)
    plan, check = rows.loc["plan"], plan_result.settings["units"]["check"]
    said = [f"plan {_flops(plan)}, {_drop(plan, check)}"]
    cheaper = []
    for kind, label in (("partial", "one k"), ("window", "one window")):
        if f"uniform {kind}" in rows.index:
            row = rows.loc[f"uniform {kind}"]
            meets = row.form != Form.EXACT and bool(row.check_meets)
            said.append(f"{label}: " + (f"{row.detail} at {row.flops_ratio:.0%}, {_drop(row, check)}" if meets else "none meets"))
            if meets and row.flops_ratio < plan.flops_ratio:
                cheaper.append(f"{row.detail} at {row.flops_ratio:.0%}")
    said.append(f"random: {_drop(rows.loc['random'], check)}")
    # the held-out change the plan makes (changed − unmodified): accuracy's, or the proxy's loss by its budget
    accuracy = plan.get("budget_kind", "accuracy") == "accuracy"
    sign, unit = (-1, "points") if accuracy else (1, LOSS_UNITS.get(plan_result.settings["objective"], "loss"))
    ends = (plan.check_cost_high, plan.check_cost_low) if accuracy else (plan.check_cost_low, plan.check_cost_high)
    difference = Difference(sign * plan.check_cost, sign * ends[0], sign * ends[1], unit, int(check))
    margin = Stated(float(plan.budget), "points") if accuracy else Stated(float(plan.budget), unit)
    return [Claim(CLAIM, PAPERS, _plan_verdict(plan_result, plan, context, cheaper), _curve_cost(plan_result, plan),
                  "; ".join(said), difference=difference, flops=float(plan.flops_ratio), margin=margin)]  # fmt: skip


def _plan_verdict(plan_result, plan: pd.Series, context: Context, cheaper: list[str]) -> Verdict:
    """The plan's verdict by the rule in :func:`plan_claims`, at the held-out check."""
    units = plan_result.settings["units"]
    check, budget = units["check"], counted(plan.budget, "point")
    if _padding_only(plan):  # no saving but the padding's: decided whatever the size
        return Verdict(Phrase.CHANGES_NOTHING, f"no valid pair of its {check} held-out examples is changed ({_flops(plan)})")
    if context.preset != "full" or min(units["select"], units["check"]) < TOO_FEW:
        return (
            context.at_this_size("plan") if context.preset != "full" else Verdict(Phrase.NOT_DECIDED, f"{check} examples checked")
        )
    margin = f"the margin −{budget}"
    if plan.flops_ratio >= 1:  # every head exact: no plan that computes less met the budget on the choosing half
        return Verdict(
            Phrase.NOT_DECIDED,
            f"no plan that computes less met {margin} on {units['select']:,} examples; {_first_step(plan_result, plan)}",
        )
    if not bool(plan.check_meets):  # below −δ as a whole: does not hold; holding −δ: not decided
        below = plan.check_cost_low > plan.check_allowance
        return Verdict(Phrase.DOES_NOT_HOLD if below else Phrase.NOT_DECIDED,
                       f"the plan's held-out change {'lies below' if below else 'holds'} {margin}: {_drop(plan, check)}")  # fmt: skip
    if cheaper:
        return Verdict(Phrase.DOES_NOT_HOLD, f"one knob is cheaper: {cheaper[0]} against the plan's {plan.flops_ratio:.0%}")
    if plan.form == Form.UNIFORM:  # the cheapest plan found is one choice for every head
        return Verdict(Phrase.TIES, f"the plan is {plan.choice} for every head, at {_flops(plan)}")
    return Verdict(Phrase.HOLDS, f"{_flops(plan)} within {margin} on held-out examples")


def _padding_only(row: pd.Series) -> bool:
    """Whether a plan's only saving is padding: it changes heads (padded to n it would save), yet no valid
    pair of the examples (a plan with every head exact saves nothing either way, and is judged as one)."""
    return bool(row.get("changes_nothing", False)) and row.get("flops_ratio_padded", 1.0) < 1


def _first_step(plan_result, plan: pd.Series) -> str:
    """What the path's first step tried (the fewest heads changed) cost on the choosing half, in words."""
    probes = plan_result.tables["probes"]
    probes = probes[probes.budget == plan.budget]
    if probes.empty:
        return "the search tried no step"
    first = probes.loc[probes.step.idxmin()]
    drop = _cost_points(first.cost, first.cost_low, first.cost_high, first.get("examples", 10**9))
    return f"the first step tried ({counted(int(first.step), 'head')} changed): {drop}"


def _flops(row: pd.Series) -> str:
    """``62% of the FLOPs on real token pairs (75% padded)``: the padded figure only where it differs."""
    padded = row.get("flops_ratio_padded", row.flops_ratio)
    said = f"{row.flops_ratio:.0%} of the FLOPs on real token pairs"
    return said if round(100 * padded) == round(100 * row.flops_ratio) else f"{said} ({padded:.0%} padded)"


def _curve_cost(plan_result, plan: pd.Series) -> str:
    """The plan's cost on the curves as measured: its heads' single-head costs (each head changed alone, on
    the curves' blocks or task examples) summed, along the path up to the plan's step or over a uniform plan's heads."""
    settings = plan_result.settings
    unit = (
        "nats of KL divergence of the task's predictions"
        if settings.get("curve_cost") == "task"
        else LOSS_UNITS[settings["objective"]]
    )
    if plan.form == Form.UNIFORM:  # a uniform plan: every head under one choice
        curves = plan_result.tables["curves"]
        chosen = curves[curves.choice == plan.choice]
        changed, summed = len(chosen), float(chosen.cost.sum())
    else:
        changed = int(plan.path_step)
        summed = float(plan_result.tables["path"]["added"].iloc[:changed].sum()) if changed else 0.0
    return f"{counted(changed, 'head')} changed, each measured alone: summed cost {number(summed, 2, significant=True)} ({unit})"


def _drop(row: pd.Series, examples: int) -> str:
    """The held-out change of accuracy in points (changed − unmodified) with its interval, over ``examples``."""
    return _cost_points(row.check_cost, row.check_cost_low, row.check_cost_high, examples)


def _cost_points(cost: float, low: float, high: float, examples: int) -> str:
    """A cost (accuracy lost) with its interval, as the change of accuracy in points it is."""
    return delta_points(pd.Series({"delta_accuracy": -cost, "delta_accuracy_low": -high, "delta_accuracy_high": -low,
                                   "held_out": examples}))  # fmt: skip


def plan_section(results: dict, names: dict[str, str], figures: Figures, claim: Claim | None, context: Context) -> str:
    """Section 7: FLOPs against budget, the chosen heads, and every method's held-out verdict."""
    if "plan" not in results or claim is None:
        return ""
    plan_result = results["plan"]
    shown = figures.directory / names["plan"] / "figures"
    rows, settings = headline(plan_result, context), plan_result.settings
    budget, units = rows.budget.iloc[0], settings["units"]
    plan = rows.loc["plan"]
    verdict = claim.verdict
    answer = (
        f"Within {counted(budget, 'point')}, the plan computes {_flops(plan).replace(' of the FLOPs', ' of the attention FLOPs')} "
        f"and {'meets' if plan.check_meets else 'misses'} its budget on {units['check']:,} held-out examples"
    )
    if _padding_only(plan):
        answer += ", but it changes nothing on this task: every valid pair of its examples is kept"
    if verdict.phrase is Phrase.AT_THIS_SIZE:
        answer = f"Not decided at this size ({units['check']:,} examples to check on): {verdict.aside}; here {answer[0].lower()}{answer[1:]}"
    elif verdict.phrase is Phrase.NOT_DECIDED:
        answer = f"Not decided: {verdict.said}; {answer[0].lower()}{answer[1:]}"
    body = [
        figures.embed(shown / "flops_by_budget.png", "Attention FLOPs within each budget: the plan, uniform and random"),
        figures.embed(shown / f"{choices_name(budget)}.png", f"The plan within {counted(budget, 'point')}: each head's choice"),
        f"<p>{'; '.join(plan_result.misses())}.</p>",
        table(plan_result.view(frame=plan_result.tables["summary"]), notes=plan_result.column_notes),
    ]
    method = (
        f"Per layer and head: exact, partial with its own k (greedy keys, a closed-form map fitted on {settings['fit_seqs']} "
        f"blocks) or a window, at the fewest attention FLOPs within each budget of task accuracy ({', '.join(settings['budgets'])}). "
        f"Curves of every head alone (how far it moves the classifier's predictions, KL divergence, on {settings['curve_seqs']} of "
        "the task's training examples) give a greedy "
        "path; the plan is the cheapest of its last step "
        f"that meets the budget and the uniform plans that meet it, on {units['select']:,} task examples, then checked on {units['check']:,} others, beside the "
        "cheapest uniform plans and a random allocation of the plan's FLOPs. FLOPs count the valid (query, key) pairs of "
        "the examples at their own lengths, no padding, and a window's kept pairs as a sparse kernel would."
    )
    return section("7. What is the cheapest attention that keeps the model?", answer + ".", body, method)
