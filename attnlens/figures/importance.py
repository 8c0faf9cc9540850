"""Figures of importance results: attention mass per class, ablation with the random
control, gradient importance, per-layer/per-head ablation maps.

Each ``plot_*`` function takes a result (and an optional Axes) and only draws numbers
read from its tables; :func:`save_importance_figures` writes them all as PNG and PDF.

>>> import attnlens
>>> from attnlens.figures.importance import plot_ablation
>>> result = attnlens.importance("minilm-l6", classes="self,cls,other", seq_len=16, num_seqs=4,
...                              bootstrap=20, gradient=False, progress=False)
>>> ax = plot_ablation(result)
>>> ax.get_ylabel()
'Δ loss (1 − token cosine to the unmodified model)'
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .style import apply_style, figure_of, heatmap, label_points, new_axes, task_describe, task_references

LOSS_LABELS = {
    "hidden": "Δ loss (1 − token cosine to the unmodified model)",
    "clm": "Δ next-token loss (nats)",
    "mlm": "Δ masked-token loss (nats)",
}
CLASS_COLOUR, CONTROL_COLOUR = sns.color_palette("deep")[0], sns.color_palette("deep")[7]


def describe(meta: dict) -> str:
    settings = meta["settings"]
    blocks = settings.get("num_seqs", settings.get("eval_seqs"))
    return f"{meta['model']['name']}, {settings['objective']} objective, n = {settings['n']}, {blocks} held-out blocks"


def grid(count: int, columns: int, cell: tuple[float, float]) -> tuple[plt.Figure, np.ndarray]:
    apply_style()
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(cell[0] * columns, cell[1] * rows), layout="constrained", squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return figure, axes


# Class beside its random control: where each sits on either side of its class's tick.
CONTROLS = (
    (-0.12, "class", CLASS_COLOUR, "class removed"),
    (0.12, "random", CONTROL_COLOUR, "random control (same count per row)"),
)


def paired_points(ax: plt.Axes, x: np.ndarray, rows, value: str, colour, label: str, offset: float) -> None:
    """One control's points with their 95% intervals (``value``, ``value_low``, ``value_high``)."""
    error = np.stack([rows[value] - rows[f"{value}_low"], rows[f"{value}_high"] - rows[value]])
    ax.errorbar(x + offset, rows[value], yerr=error, fmt="o", color=colour, label=label, capsize=3, elinewidth=1, ms=5)


def log_floor(values: np.ndarray) -> float:
    """Where a log axis of Δ stops: below the smallest positive value drawn, so that values
    at or below zero, for which a log axis has no place, can stand on it; kept clear of the
    decade ticks, whose labels would collide with the floor's own ("≤ 0")."""
    positive = values[values > 0]
    if not positive.size:
        return 1e-6  # nothing above zero: every point stands on the floor, its value written
    level = np.log10(positive.min()) - 0.35
    fraction = level - np.floor(level)
    if fraction < 0.2 or fraction > 0.8:
        level = np.round(level) - 0.25
    return float(10**level)


def draw_floor(ax: plt.Axes, floor: float) -> None:
    """The floor as a dotted line labelled "≤ 0" where the y tick labels are."""
    ax.axhline(floor, color="black", lw=0.8, ls=":")
    ax.text(-0.01, floor, "≤ 0", transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=8)
    ax.set_ylim(bottom=floor / 10**0.12)


# ----------------------------------------------------------------------------- plots


def plot_mass(result, cls: str, ax: plt.Axes | None = None) -> plt.Axes:
    """Average attention mass per query on one class, as a layer × head heatmap."""
    ax = new_axes(ax, (6.4, 3.6))
    table = result.mass[result.mass["class"] == cls]
    matrix = table.pivot(index="layer", columns="head", values="mass")
    heatmap(ax, matrix, "viridis", "mass per query", vmin=0)
    ax.set_title(f"{cls}  (uniform attention: {table['share'].mean():.3f})")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return ax


def plot_entropy(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Attention entropy per query (nats), layer × head."""
    ax = new_axes(ax, (6.4, 3.6))
    matrix = result.entropy.pivot(index="layer", columns="head", values="entropy")
    heatmap(ax, matrix, "mako", "entropy (nats)", vmin=0)
    ax.set_title(f"attention entropy (uniform: {result.entropy['uniform_entropy'].mean():.2f} nats)")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return ax


def plot_ablation(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Loss from removing each class everywhere, beside the random control: points with 95%
    intervals on a log axis. A Δ at or below zero stands on the axis floor ("≤ 0") as an
    open triangle with its value written; interval ends below zero stop at the floor."""
    ax = new_axes(ax, (7.2, 4.2))
    table = result.ablation[result.ablation["scope"] == "model"]
    classes = list(dict.fromkeys(table["class"]))
    x = np.arange(len(classes))
    values = table[["delta_low", "delta", "delta_high"]].to_numpy()
    floor = log_floor(values)
    below_any = False
    for offset, control, colour, label in CONTROLS:
        rows = table[table["control"] == control].set_index("class").loc[classes]
        below_any |= _ablation_points(ax, x + offset, rows, floor, colour, label)
    ax.set_yscale("log")
    if (values <= 0).any():
        draw_floor(ax, floor)
    removed = table[table["control"] == "class"].set_index("class").loc[classes, "removed"]
    ax.set_xticks(x, [f"{name}\n{fraction:.1%}" for name, fraction in zip(classes, removed)])
    ax.set_xlim(-0.5, len(classes) - 0.5)
    ax.set_xlabel("position class (share of valid positions removed)")
    ax.set_ylabel(LOSS_LABELS[result.meta["settings"]["objective"]])
    ax.grid(axis="x", visible=False)
    ax.set_title(f"Ablation importance, 95% bootstrap intervals\n{describe(result.meta)}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if below_any:
        handles.append(plt.Line2D([], [], ls="none", marker="v", mfc="white", mec="black", ms=6))
        labels.append("Δ ≤ 0: on the floor, value written")
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    return ax


def _ablation_points(ax: plt.Axes, x: np.ndarray, rows, floor: float, colour, label: str) -> bool:
    """One control's points; those at or below zero go on the floor, open, with their value.
    Returns whether there was any."""
    shown = rows[["delta", "delta_low", "delta_high"]].clip(lower=floor)  # nothing is drawn below the floor
    below = (rows["delta"] <= 0).to_numpy()
    above = ~below
    paired_points(ax, x[above], shown[above], "delta", colour, label, 0.0)
    if below.any():
        error = np.stack([np.zeros(below.sum()), shown["delta_high"][below] - floor])
        ax.errorbar(x[below], shown["delta"][below], yerr=error, fmt="v", color=colour, mfc="white", mec=colour, ms=6,
                    capsize=3, elinewidth=1)  # fmt: skip
        label_points(
            ax, x[below], shown["delta"][below], [f"Δ = {value:.2g}".replace("-", "−") for value in rows["delta"][below]]
        )
    return bool(below.any())


def plot_task_ablation(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Task accuracy with each class removed everywhere, beside the random control: points
    with 95% intervals, the unmodified model and the majority class as lines."""
    ax = new_axes(ax, (7.2, 4.2))
    task = result.meta["task"]
    table = result.tables["task"]
    table = table[table["scope"] == "model"]
    classes = list(dict.fromkeys(table["class"]))
    x = np.arange(len(classes))
    for offset, control, colour, label in CONTROLS:
        rows = table[table["control"] == control].set_index("class").loc[classes]
        paired_points(ax, x, rows, "accuracy", colour, label, offset)
    task_references(ax, task)
    ax.set_xticks(x, classes)
    ax.set_xlabel("position class removed in every layer and head")
    ax.set_ylabel("held-out accuracy")
    ax.grid(axis="x", visible=False)
    ax.set_title(f"Task accuracy without each class, 95% intervals\n{task_describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside: no line under it
    return ax


# What the gradient importance differentiates (importance.gradient_target): for ``hidden`` the
# loss, 1 − cosine to the unmodified model, has zero gradient at g = 1, so a seeded random
# projection of the final hidden states (each divided by its unmodified norm) stands in.
DIFFERENTIATED = {
    "hidden": "f: random projection of the final hidden states ÷ their norm (|∂f/∂g| ≈ their RMS change)",
    "clm": "f: the block's next-token loss (nats)",
    "mlm": "f: the block's masked-token loss (nats)",
}
GRADIENT_LABEL = "mean over blocks of |∂f / ∂g|"


def gradient_subtitle(meta: dict, gated: str) -> str:
    """The two lines that say what g and f are."""
    return f"g: a gate multiplying {gated}\n{DIFFERENTIATED[meta['settings']['objective']]}"


def plot_gradient(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Gradient importance of one gate per class (all layers and heads), with 95% intervals."""
    ax = new_axes(ax, (7.2, 4.4))
    table = result.gradient[result.gradient["level"] == "model"]
    x = np.arange(len(table))
    error = np.stack([table["importance"] - table["importance_low"], table["importance_high"] - table["importance"]])
    ax.bar(x, table["importance"], 0.6, yerr=error, color=CLASS_COLOUR, capsize=3)
    ax.set_xticks(x, list(table["class"]))
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("gated position class ('all': every position, Michel et al.)")
    ax.set_ylabel(GRADIENT_LABEL)
    subtitle = gradient_subtitle(result.meta, "the class's attention weights in every layer and head")
    ax.set_title(f"Gradient importance at g = 1, 95% intervals\n{subtitle}\n{describe(result.meta)}", fontsize=9)
    return ax


# Up to this many heads, every cell of the head importance map has its 95% interval written in it.
WRITTEN_CELLS = 200
_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def plot_head_importance(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Michel et al. head importance (a gate on all of a head's attention), layer × head; each
    cell has its value and 95% interval written in it (up to :data:`WRITTEN_CELLS` heads), in
    units of a power of ten that the colour bar names."""
    table = result.gradient[(result.gradient["level"] == "head") & (result.gradient["class"] == "all")]
    matrix = table.pivot(index="layer", columns="head", values="importance")
    written = matrix.size <= WRITTEN_CELLS and "importance_low" in table
    layers, heads = matrix.shape
    ax = new_axes(ax, (max(6.4, 1.8 + 0.62 * heads), max(3.8, 2.2 + 0.42 * layers)) if written else (6.4, 3.8))
    largest = float(np.nanmax(matrix.to_numpy())) if matrix.size else 0.0
    exponent = int(np.floor(np.log10(largest))) if largest > 0 else 0  # the largest value reads 1.00 to 9.99
    scale, unit = 10.0**exponent, f" (×10{str(exponent).translate(_SUPERSCRIPTS)})" if exponent else ""
    annot = False
    if written:
        low = table.pivot(index="layer", columns="head", values="importance_low") / scale
        high = table.pivot(index="layer", columns="head", values="importance_high") / scale
        annot = (matrix / scale).map("{:.2f}".format) + "\n" + low.map("{:.2f}".format) + "–" + high.map("{:.2f}".format)
        annot = annot.to_numpy()
    sns.heatmap(matrix / scale, ax=ax, cmap="rocket_r", vmin=0, annot=annot, fmt="", annot_kws={"fontsize": 6},
                cbar_kws={"label": GRADIENT_LABEL + unit})  # fmt: skip
    subtitle = gradient_subtitle(result.meta, "all of one head's attention weights")
    intervals = "in each cell: value, 95% interval" if written else "95% intervals: importance_low/high in the gradient table"
    ax.set_title(f"Head importance at g = 1 ({intervals})\n{subtitle}\n{describe(result.meta)}", fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return ax


def plot_scope(result, cls: str | None = None, ax: plt.Axes | None = None) -> plt.Axes:
    """Per-layer ablations (class × layer), or per-head ablations of one class (layer × head)."""
    ax = new_axes(ax, (6.4, 3.6))
    per = result.meta["settings"]["per"]
    table = result.ablation[(result.ablation["scope"] == per) & (result.ablation["control"] == "class")]
    label = LOSS_LABELS[result.meta["settings"]["objective"]]
    if per == "layer":
        matrix = table.pivot(index="class", columns="layer", values="delta").loc[list(dict.fromkeys(table["class"]))]
        sns.heatmap(
            matrix,
            ax=ax,
            cmap="rocket_r",
            annot=matrix.shape[1] <= 12,
            fmt=".3f",
            annot_kws={"fontsize": 7},
            cbar_kws={"label": label},
        )
        ax.set_title(f"Removing a class in one layer\n{describe(result.meta)}", fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("class")
    else:
        matrix = table[table["class"] == cls].pivot(index="layer", columns="head", values="delta")
        heatmap(ax, matrix, "rocket_r", label.split(" (")[0])
        ax.set_title(f"Removing {cls} in one head")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    return ax


# ----------------------------------------------------------------------------- all


def plot_mass_grid(result) -> plt.Figure:
    """Attention mass per class, one layer × head map per class, and the entropy map."""
    classes = list(result.mass["class"].drop_duplicates())
    layers, heads = result.mass["layer"].nunique(), result.mass["head"].nunique()
    figure, axes = grid(len(classes) + 1, 4 if heads <= 6 else 2, _cell(layers, heads))
    for ax, cls in zip(axes.flat, classes):
        plot_mass(result, cls, ax)
    plot_entropy(result, axes.flat[len(classes)])
    figure.suptitle(f"Attention mass per query on each position class\n{describe(result.meta)}")
    return figure


def _cell(layers: int, heads: int) -> tuple[float, float]:
    return (min(1.2 + 0.42 * heads, 7.0), min(1.3 + 0.32 * layers, 7.0))


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``ablation`` (main), ``mass``, ``gradient`` and ``head_importance`` (with gradients), and
    ``ablation_per_layer`` or ``ablation_per_head`` (with ``per``)."""
    yield "ablation", figure_of(plot_ablation(result))
    yield "mass", plot_mass_grid(result)
    if "task" in result.tables:
        yield "task_ablation", figure_of(plot_task_ablation(result))
    if len(result.gradient):
        yield "gradient", figure_of(plot_gradient(result))
        yield "head_importance", figure_of(plot_head_importance(result))
    classes = list(result.mass["class"].drop_duplicates())
    per = result.meta["settings"]["per"]
    if per == "layer":
        ax = new_axes(None, (7.6, 0.5 * len(classes) + 2.2))
        yield "ablation_per_layer", figure_of(plot_scope(result, ax=ax))
    elif per == "head":
        figure, axes = grid(
            len(classes),
            4 if result.mass["head"].nunique() <= 6 else 2,
            _cell(result.mass["layer"].nunique(), result.mass["head"].nunique()),
        )
        for ax, cls in zip(axes.flat, classes):
            plot_scope(result, cls, ax)
        figure.suptitle(f"Removing a class in one head\n{describe(result.meta)}")
        yield "ablation_per_head", figure
