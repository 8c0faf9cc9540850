"""Figures of DAM results: keep-probability per class, learned mask images, loss against
sparsity for the λ sweep and the fixed patterns, and the training curves.

>>> import attnlens
>>> from attnlens.figures.dam import plot_loss_vs_sparsity
>>> result = attnlens.dam("minilm-l6", lambdas=[0.0], steps=3, stop_window=2, seq_len=16, train_seqs=2, eval_seqs=2,
...                       batch_size=2, bootstrap=20, patterns=False, progress=False)
>>> ax = plot_loss_vs_sparsity(result)
>>> ax.get_xlabel()
'sparsity (fraction of valid attention positions removed)'
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .importance import LOSS_LABELS, describe
from .style import apply_style, figure_of, label_points, new_axes, task_describe, task_references, thinned

PATTERN_MARKERS = {
    "strided": "s",
    "fixed": "D",
    "band": "*",
    "local": "^",
    "bigbird": "v",
    "sink-window": "P",
    "no-diagonal": "X",
}


def _lambda_label(value: float) -> str:
    return f"λ = {value:g}"


def plot_keep(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Keep-probability σ(α) per position class, one bar per λ (dashed: the hard mask's kept fraction is in the table)."""
    ax = new_axes(ax, (7.6, 4.2))
    table = result.keep_summary
    if "same_as" in table:  # a class equal to another by construction is shown once, under both names
        shown = table[table["same_as"] == table["class"]]
        also = table[table["same_as"] != table["class"]].groupby("same_as")["class"].unique()
    else:
        shown, also = table, {}
    classes = list(dict.fromkeys(shown["class"]))
    names = [" = ".join([name, *also.get(name, [])]) for name in classes]
    labels = result.run_labels()
    table = shown
    lambdas = list(dict.fromkeys(table["lambda"]))
    palette = sns.color_palette("flare", len(lambdas))
    width = 0.8 / len(lambdas)
    x = np.arange(len(classes))
    sparsity = result.table.set_index("lambda")["sparsity"]
    for index, (lam, colour) in enumerate(zip(lambdas, palette)):
        rows = table[table["lambda"] == lam].set_index("class").loc[classes]
        ax.bar(
            x - 0.4 + width * (index + 0.5),
            rows["keep_probability"],
            width,
            color=colour,
            label=f"{labels[lam]} (sparsity {sparsity[lam]:.0%})",
        )
    ax.set_xticks(x, names)
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position class (a = b: equal by construction in this layout)" if len(also) else "position class")
    ax.set_ylabel("keep probability σ(α), mean over positions")
    ax.set_title(f"DAM ({result.meta['settings']['variant']}): what the learned masks keep\n{describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_loss_vs_sparsity(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Change of the held-out objective against sparsity: DAM's λ sweep and every fixed
    pattern, each with its paired 95% interval, against the unmodified model at 0."""
    ax = new_axes(ax, (7.6, 4.6))
    objective = result.meta["settings"]["objective"]
    _pattern_lines(ax, result.patterns, "sparsity", "delta")
    table = result.table
    error = np.stack([table["delta"] - table["delta_low"], table["delta_high"] - table["delta"]])
    ax.errorbar(table["sparsity"], table["delta"], yerr=error, fmt="o-", color="black", lw=1.8, ms=6, capsize=3,
                label=f"DAM {result.meta['settings']['variant']}", zorder=5)  # fmt: skip
    adapted = result.tables.get("patterns_adapted")
    if adapted is not None and len(adapted):  # the patterns given the same weight training, at each mask's sparsity
        palette = _pattern_colours()
        for name, points in adapted.groupby("pattern", sort=False):
            ax.plot(points["sparsity"], points["delta"], ls="none", marker=PATTERN_MARKERS.get(name, "o"), ms=9,
                    mec="black", color=palette.get(name), label=f"{name}, weights trained alike", zorder=6)  # fmt: skip
    labels = result.run_labels()
    label_points(ax, table["sparsity"], table["delta"], [labels[value] for value in table["lambda"]])
    ax.axhline(0, color="grey", ls="--", lw=1, label=_unmodified(result.meta))
    ax.set_xlabel("sparsity (fraction of valid attention positions removed)")
    ax.set_ylabel(LOSS_LABELS[objective])  # held-out: the title says so
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(f"Loss against sparsity: learned masks and fixed patterns (95% intervals)\n{describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def _pattern_colours() -> dict[str, tuple]:
    return dict(zip(PATTERN_MARKERS, sns.color_palette("deep", len(PATTERN_MARKERS))))


def _pattern_lines(ax: plt.Axes, table, x: str, y: str) -> None:
    """One line per fixed pattern (colour and marker by pattern), its points against ``x``
    with thin error bars from the table's ``{y}_low`` and ``{y}_high`` (when it has them)."""
    palette = _pattern_colours()
    for name, points in table.groupby("pattern", sort=False):
        points = points.sort_values(x)
        error = None
        if f"{y}_low" in points:
            error = np.stack([points[y] - points[f"{y}_low"], points[f"{y}_high"] - points[y]])
        ax.errorbar(points[x], points[y], yerr=error, marker=PATTERN_MARKERS.get(name, "o"), color=palette.get(name), lw=1,
                    ms=5, alpha=0.85, elinewidth=0.8, capsize=2, label=name)  # fmt: skip


def _unmodified(meta: dict) -> str:
    """The baseline's legend entry; with a loss of its own (not ``hidden``, whose loss is 0
    by definition) the entry says how large it is, which the Δ axis no longer shows."""
    if meta["settings"]["objective"] == "hidden":
        return "unmodified model"
    return f"unmodified model (loss {meta['baseline']['loss']:.3g} nats)"


def plot_accuracy_vs_sparsity(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Task accuracy against the sparsity on the task's own examples (valid positions removed,
    padding aside: short texts lose less to a window than full blocks): the learned masks
    and every fixed pattern, each with its 95% interval."""
    ax = new_axes(ax, (7.6, 4.6))
    task, table = result.meta["task"], result.tables["task"]
    _pattern_lines(ax, table[table["kind"] == "pattern"], "task_sparsity", "accuracy")
    masks = table[table["kind"] == "dam"].sort_values("task_sparsity")
    error = np.stack([masks["accuracy"] - masks["accuracy_low"], masks["accuracy_high"] - masks["accuracy"]])
    ax.errorbar(masks["task_sparsity"], masks["accuracy"], yerr=error, fmt="o-", color="black", lw=1.8, ms=6, capsize=3,
                label=f"DAM {result.meta['settings']['variant']}", zorder=5)  # fmt: skip
    labels = result.run_labels()
    label_points(
        ax, masks["task_sparsity"], masks["accuracy"], [labels.get(value, _lambda_label(value)) for value in masks["lambda"]]
    )
    task_references(ax, task)
    ax.set_xlabel("sparsity on the task's examples (fraction of valid positions removed)")
    ax.set_ylabel("held-out accuracy")
    shown = table["task_sparsity"].dropna()
    low, high = float(shown.min()), float(shown.max())
    margin = max(0.02, 0.08 * (high - low))  # fitted to the points: masks at one target sit close together
    ax.set_xlim(max(-0.02, low - margin), min(1.02, high + margin))
    trained = result.meta["settings"].get("trained_on", result.meta["settings"]["objective"])
    ax.set_title(
        f"Task accuracy against sparsity (masks trained on: {trained}; 95% intervals)\n{task_describe(result.meta)}", fontsize=10
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_training(result) -> plt.Figure:
    """Per λ, against the step: the training objective, the density of the sampled and of
    the hard (α > 0) mask, and the fraction of undecided logits (σ(α/s) in (0.1, 0.9) at the
    step's noise scale s, weighted by the positions each decides); a ring marks where a run stopped, filled when the
    stopping rule held, open when it hit the step cap."""
    apply_style()
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6), layout="constrained")
    lambdas = list(dict.fromkeys(result.training["lambda"]))
    labels = result.run_labels()
    table = result.table.set_index("lambda")
    for lam, colour in zip(lambdas, sns.color_palette("flare", len(lambdas))):
        curve = result.training[result.training["lambda"] == lam]
        converged = bool(table.loc[lam, "converged"]) if "converged" in table else False
        axes[0].plot(curve["step"], curve["objective"], color=colour, label=labels[lam])
        axes[1].plot(curve["step"], curve["density"], color=colour, alpha=0.5, lw=1)
        if "hard_density" in curve:
            axes[1].plot(curve["step"], curve["hard_density"], color=colour, lw=1.8)
        target = table.loc[lam, "target_sparsity"] if "target_sparsity" in table else float("nan")
        if np.isfinite(target):  # what dual ascent aims the hard mask's density at, and the mask judged after the shift
            axes[1].axhline(1 - target, color=colour, ls=":", lw=1)
            axes[1].plot(curve["step"].iloc[-1], 1 - table.loc[lam, "sparsity"], "x", ms=8, mew=2, color=colour)
            axes[2].plot(curve["step"], curve["undecided"], color=colour, lw=1.5)
        last = curve.iloc[-1]
        for ax, column in zip(axes, ("objective", "hard_density", "undecided")):
            if column in curve:
                ax.plot(last["step"], last[column], "o", ms=6, color=colour, mfc=colour if converged else "white")
    axes[0].set_ylabel("training objective")
    axes[1].set_ylabel("density (kept fraction)")
    axes[1].plot([], [], color="grey", alpha=0.5, lw=1, label="sampled mask")
    axes[1].plot([], [], color="grey", lw=1.8, label="hard mask α > 0")
    if "target_sparsity" in table:
        axes[1].plot([], [], color="grey", ls=":", lw=1, label="target density")
        axes[1].plot([], [], "x", color="grey", mew=2, label="judged, after the threshold shift")
    axes[1].legend(fontsize=7)
    axes[1].set_ylim(0, 1.02)
    axes[2].set_ylabel("undecided logits (fraction)")
    axes[2].set_title("undecided: 0.1 < σ(α/s) < 0.9, s the step's noise scale", fontsize=8)
    axes[2].set_ylim(0, 1.02)
    for ax in axes:
        ax.set_xlabel("training step")
    axes[0].plot([], [], "o", color="grey", label="stopped: rule held")
    axes[0].plot([], [], "o", color="grey", mfc="white", label="stopped: step cap")
    axes[0].legend(fontsize=7)
    figure.suptitle(f"DAM training ({result.meta['settings']['variant']})", fontsize=10)
    return figure


# Up to this many images (a layer × head grid, or the heads of a layout shared by layers) the masks figure gives each
# image its own panel (minilm-l6: 72); more are tiles of one picture (a panel each, a 30-layer model of 16 heads would
# make a figure of 480 axes and 5,000 pixels), the picture at most MOST_PIXELS a side, so that the figure's pixels
# and its cost stay bounded however many layers and heads the model has.
PANELLED = 72
MOST_PIXELS = 1000
SHARED_COLUMNS = 6  # a layout shared by layers: its heads wrapped this many to a row of panels (16 to a row of tiles)


def plot_masks(result, index: int | None = None) -> plt.Figure:
    """Keep-probability images per layer and head for one λ (default: nearest 85% sparsity): a panel each
    up to :data:`PANELLED` images, tiles of one image above (:func:`mosaic`).

    The images are of the first held-out block (the class variant depends on its tokens);
    the structured variant is the same in every layer, so one row shows it.
    """
    apply_style()
    index = result.nearest() if index is None else index
    images = result.arrays["keep_images"][index]  # (layer, head, n, n)
    shared = result.layout["shared_by_layers"]
    layers, heads = images.shape[:2]
    figure = _mask_panels(images, shared) if (heads if shared else layers * heads) <= PANELLED else _mask_tiles(images, shared)
    row = result.table.iloc[index]
    scope = ", the same in every layer" if shared else ""
    figure.suptitle(
        f"Learned masks (query ↓, key →), {result.meta['settings']['variant']}{scope}, λ = {row['lambda']:g}, "
        f"sparsity {row['sparsity']:.0%}\n{describe(result.meta)}",
        fontsize=9,
    )
    return figure


def mask_panels(layers: int, heads: int, shared: bool) -> int:
    """How many panels the masks figure of a model of ``layers`` × ``heads`` has: an image each up to
    :data:`PANELLED`, else one of tiles.

    >>> mask_panels(6, 12, shared=False), mask_panels(6, 12, shared=True), mask_panels(80, 64, shared=False)
    (72, 12, 1)
    """
    count = heads if shared else layers * heads
    return count if count <= PANELLED else 1


def _mask_panels(images: np.ndarray, shared: bool) -> plt.Figure:
    """One panel per image: the heads (shared by layers, wrapped six to a row), or a layer × head grid."""
    heads = images.shape[1]
    cells = (
        [(0, head) for head in range(heads)] if shared else [(layer, h) for layer in range(images.shape[0]) for h in range(heads)]
    )
    columns = min(heads, SHARED_COLUMNS) if shared else heads
    rows = -(-len(cells) // columns)
    size = 1.25 if shared else 1.05
    figure, axes = plt.subplots(
        rows, columns, figsize=(size * columns + 1.4, size * rows + 1.1), squeeze=False, layout="constrained"
    )
    for number, (layer, head) in enumerate(cells):
        ax = axes.flat[number]
        picture = ax.imshow(images[layer, head].astype(np.float32), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if shared or layer == 0:
            ax.set_title(f"head {head}", fontsize=7)
        if not shared and head == 0:
            ax.set_ylabel(f"layer {layer}", fontsize=7)
    for ax in axes.flat[len(cells) :]:
        ax.set_visible(False)
    figure.colorbar(picture, ax=axes, shrink=0.8, label="keep probability σ(α)")
    return figure


def _mask_tiles(images: np.ndarray, shared: bool) -> plt.Figure:
    """Every image as a tile of one picture: rows of layers and columns of heads, or (shared by layers) the
    heads sixteen to a row; ticks thinned."""
    layers, heads = images.shape[:2]
    if shared:
        columns = 16
        grid = [[images[0, head] for head in range(start, min(start + columns, heads))] for start in range(0, heads, columns)]
        row_labels, column_labels = (
            [f"{start}–{min(start + columns, heads) - 1}" for start in range(0, heads, columns)],
            [f"+{column}" for column in range(columns)],
        )
        names = ("heads", "head (the row's first + column)")
    else:
        grid = [[images[layer, head] for head in range(heads)] for layer in range(layers)]
        row_labels, column_labels = [str(layer) for layer in range(layers)], [str(head) for head in range(heads)]
        names = ("layer", "head")
    picture, tile = mosaic(grid, MOST_PIXELS)
    width, height = picture.shape[1] / 150, picture.shape[0] / 150  # one pixel of the picture to one of the PNG (150 dpi)
    scale = min(1.0, 9.0 / max(width, height)) * max(1.0, 4.0 / max(width, height))
    # at least 7 inches wide: the title's first line is about as long
    figure, ax = plt.subplots(figsize=(max(width * scale + 2.0, 7.0), height * scale + 1.3), layout="constrained")
    shown = ax.imshow(picture, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    for axis, labels in ((ax.yaxis, row_labels), (ax.xaxis, column_labels)):
        ticks = thinned(len(labels))
        axis.set_ticks(ticks * (tile + 1) + (tile - 1) / 2, [labels[at] for at in ticks], fontsize=7)
    ax.set_ylabel(names[0])
    ax.set_xlabel(names[1])
    ax.grid(False)
    figure.colorbar(shown, ax=ax, shrink=0.8, label="keep probability σ(α)")
    return figure


def mosaic(grid: list[list[np.ndarray]], most: int) -> tuple[np.ma.MaskedArray, int]:
    """The square images of ``grid`` (rows of them) as tiles of one picture at most ``most`` pixels a side
    (each tile a mean over blocks of its image's pixels where it must shrink), a blank pixel between tiles;
    and the tiles' side.

    >>> picture, tile = mosaic([[np.ones((8, 8)), np.zeros((8, 8))]], 9)
    >>> picture.shape, tile, picture[0].tolist()
    ((4, 9), 4, [1.0, 1.0, 1.0, 1.0, None, 0.0, 0.0, 0.0, 0.0])
    """
    n = grid[0][0].shape[-1]
    columns = max(len(row) for row in grid)
    tile = max(1, min(n, (most + 1) // max(len(grid), columns) - 1))
    bins = np.linspace(0, n, tile + 1).astype(int)[:-1]  # the first pixel of each of the tile's blocks
    picture = np.full((len(grid) * (tile + 1) - 1, columns * (tile + 1) - 1), np.nan, dtype=np.float32)
    for row, images in enumerate(grid):
        for column, image in enumerate(images):
            sums = np.add.reduceat(np.add.reduceat(np.asarray(image, dtype=np.float32), bins, axis=0), bins, axis=1)
            sizes = np.diff(np.r_[bins, n])
            top, left = row * (tile + 1), column * (tile + 1)
            picture[top : top + tile, left : left + tile] = sums / np.outer(sizes, sizes)
    return np.ma.masked_invalid(picture), tile


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``loss_vs_sparsity`` (main), ``keep_per_class``, ``training``, ``masks``."""
    yield "loss_vs_sparsity", figure_of(plot_loss_vs_sparsity(result))
    yield "keep_per_class", figure_of(plot_keep(result))
    yield "training", plot_training(result)
    if "task" in result.tables:
        yield "accuracy_vs_sparsity", figure_of(plot_accuracy_vs_sparsity(result))
    yield "masks", plot_masks(result)
