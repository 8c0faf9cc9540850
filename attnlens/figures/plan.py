"""Figures of a plan result: FLOPs against budget for every method, and the chosen heads' map."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from attnlens.analysis.plan.choices import parse
from attnlens.analysis.plan.result import choices_name

from .style import figure_of, new_axes, thinned

# One look per method, so that methods at the same FLOPs stay told apart: marker, line style, and a
# small sideways offset (a fraction of the gap between budgets).
METHOD_LOOKS = {
    "plan": ("o", "-", 0.0),
    "uniform partial": ("s", "--", -0.06),
    "uniform partial at plan FLOPs": ("D", ":", -0.03),
    "uniform window": ("^", "--", 0.03),
    "uniform window at plan FLOPs": ("v", ":", 0.06),
    "random": ("X", "-.", 0.09),
}


def flops_by_budget(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Attention FLOPs (share of exact) of the plan, the cheapest uniform plans and the random
    allocation at each budget; hollow markers missed the budget on the held-out check. Each method
    has its own marker and line and sits a little to the side, so none hides another."""
    ax = new_axes(ax, (7.6, 4.4))
    summary = result.tables["summary"]
    budgets = np.sort(summary.budget.unique())
    gap = float(np.diff(budgets).min()) if len(budgets) > 1 else 1.0
    for method, rows in summary.groupby("method", sort=False):
        rows = rows.sort_values("budget")
        marker, style, offset = METHOD_LOOKS.get(method, ("o", "-", 0.0))
        x = rows.budget + offset * gap
        line = ax.plot(x, rows.flops_ratio, marker=marker, ls=style, lw=2.2 if method == "plan" else 1.3, ms=7, label=method)[0]
        missed = ~rows.check_meets.astype(bool)
        ax.scatter(
            x[missed], rows.flops_ratio[missed], s=70, marker=marker, facecolors="white", edgecolors=line.get_color(), zorder=3
        )
    kind = summary.budget_kind.iloc[0]
    ax.set_xlabel("budget: most accuracy may drop (points)" if kind == "accuracy" else "budget: most the proxy loss may be")
    ax.set_ylabel("attention FLOPs / exact")
    ax.set_xticks(budgets, [f"{value:g}" for value in budgets])
    ax.set_ylim(0, 1.08)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{result.model_name}: FLOPs kept within each budget\n(hollow: missed its budget on held-out data)")
    return ax


def choice_kinds(choices: list[str]) -> dict[str, tuple[float, float, float]]:
    """A colour per choice, readable without its label: exact grey, windows in blues and partial
    heads in oranges, darker for fewer keys (less computed).

    >>> list(choice_kinds(["exact", "window(8)", "window(32)", "window(8)+sink(4)", "partial(16)"]))
    ['exact', 'window(32)', 'window(8)+sink(4)', 'window(8)', 'partial(16)']
    """
    colours = {"exact": (0.86, 0.86, 0.86)}
    for kind, palette in (("window", plt.get_cmap("Blues")), ("partial", plt.get_cmap("Oranges"))):
        # lighter for more keys kept: a wider window, then the same window with its sinks
        named = sorted(
            (choice for choice in set(choices) if choice.startswith(kind)),
            key=lambda text: (-parse(text).size, -parse(text).sinks),
        )
        for rank, choice in enumerate(named):
            colours[choice] = palette(0.45 + 0.5 * (rank + 1) / (len(named) + 1))[:3]
    return colours


# Up to this many heads each cell of the choice map has its choice written in it (minilm-l6: 72); more are read
# by colour alone (the choices table lists them), so that the map's texts do not grow with the model.
WRITTEN_HEADS = 200


def choice_map(result, budget: float, ax: plt.Axes | None = None) -> plt.Axes:
    """Layer × head map of one budget's plan: each head coloured by its choice (a legend per
    choice), with its choice written in (up to :data:`WRITTEN_HEADS` heads; ticks thinned above 16 a side)."""
    rows = result.tables["choices"].query("budget == @budget")
    layers, heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    ax = new_axes(ax, (min(1.6 + 0.55 * heads, 11), min(1.6 + 0.45 * layers, 9)))
    colours = choice_kinds(list(rows["choice"]))
    names = list(colours)
    codes = np.zeros((layers, heads), dtype=int)
    for row in rows.itertuples():
        codes[row.layer, row.head] = names.index(row.choice)
    ax.imshow(codes, cmap=ListedColormap([colours[name] for name in names]), vmin=0, vmax=len(names) - 1, aspect="auto")
    ax.grid(False)
    for row in rows.itertuples() if layers * heads <= WRITTEN_HEADS else ():
        if row.choice != "exact":
            label = row.choice.replace("partial", "k").replace("window", "w").replace("+sink", "+s")
            ax.text(row.head, row.layer, label, ha="center", va="center", fontsize=7, color="black")
    ax.set_xticks(thinned(heads))
    ax.set_yticks(thinned(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    cost = result.settings["head_flops"]
    legend = [Patch(color=colours[name], label=f"{name} ({cost[name] / cost['exact']:.0%} of the FLOPs)") for name in names]
    ax.legend(handles=legend, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    accuracy = result.tables["summary"].budget_kind.iloc[0] == "accuracy"
    within = f"{budget:g} point{'' if budget == 1 else 's'} of accuracy" if accuracy else f"a proxy loss of {budget:g}"
    ax.set_title(f"{result.model_name}: the plan within {within}, each head's choice")
    return ax


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``flops_by_budget`` (main), and the layer × head map of each budget (:func:`choices_name`)."""
    yield "flops_by_budget", figure_of(flops_by_budget(result))
    for budget in result.budgets:
        yield choices_name(budget), figure_of(choice_map(result, budget))
