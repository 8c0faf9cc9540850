"""Figures of a plan result: FLOPs against budget for every method, and the chosen heads' map."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np

from attnlens.analysis.plan.result import choices_name

from .style import new_axes


def flops_by_budget(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Attention FLOPs (share of exact) of the plan, the cheapest uniform plans and the random
    allocation at each budget; hollow markers missed the budget on the held-out check."""
    ax = new_axes(ax)
    summary = result.tables["summary"]
    for method, rows in summary.groupby("method", sort=False):
        rows = rows.sort_values("budget")
        line = ax.plot(rows.budget, rows.flops_ratio, marker="o", label=method)[0]
        missed = rows[~rows.check_meets.astype(bool)]
        ax.scatter(missed.budget, missed.flops_ratio, s=80, facecolors="white", edgecolors=line.get_color(), zorder=3)
    kind = summary.budget_kind.iloc[0]
    ax.set_xlabel("budget: most accuracy may drop (points)" if kind == "accuracy" else "budget: most the proxy loss may be")
    ax.set_ylabel("attention FLOPs / exact")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    ax.set_title(f"{result.model_name}: FLOPs kept within each budget (hollow: missed on held-out data)")
    return ax


def choice_map(result, budget: float, ax: plt.Axes | None = None) -> plt.Axes:
    """Layer × head map of one budget's plan: each head's FLOPs share, its choice written in."""
    ax = new_axes(ax)
    rows = result.tables["choices"].query("budget == @budget")
    layers, heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    cost = result.settings["head_flops"]
    share = np.ones((layers, heads))
    for row in rows.itertuples():
        share[row.layer, row.head] = cost[row.choice] / cost["exact"]
    image = ax.imshow(share, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for row in rows.itertuples():
        label = "" if row.choice == "exact" else row.choice.replace("partial", "k").replace("window", "w")
        ax.text(
            row.head,
            row.layer,
            label,
            ha="center",
            va="center",
            fontsize=6,
            color="white" if share[row.layer, row.head] < 0.5 else "black",
        )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{result.model_name}: plan at budget {budget:g} (k: partial, w: window, blank: exact)")
    ax.figure.colorbar(image, ax=ax, label="FLOPs / exact")
    return ax


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``flops_by_budget`` (main), and the layer × head map of each budget (:func:`choices_name`)."""
    yield "flops_by_budget", flops_by_budget(result).figure
    for budget in result.budgets:
        yield choices_name(budget), choice_map(result, budget).figure
