"""Figures of DAM results: keep-probability per class, learned mask images, loss against
sparsity for the λ sweep and the fixed patterns, and the training curves.

>>> import attnlens
>>> from attnlens.figures.dam import plot_loss_vs_sparsity
>>> result = attnlens.dam("minilm-l6", lambdas=[0.0], steps=2, seq_len=16, train_seqs=2, eval_seqs=2,
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
from .style import apply_style, label_points, new_axes, task_describe, task_references

PATTERN_MARKERS = {"strided": "s", "fixed": "D", "local": "^", "bigbird": "v", "star": "*", "no-diagonal": "X"}


def _lambda_label(value: float) -> str:
    return f"λ = {value:g}"


def nearest_lambda(result, target: float = 0.85) -> int:
    """Index of the λ whose sparsity is nearest ``target`` (the mask images show that one)."""
    return int((result.table["sparsity"] - target).abs().argmin())


def plot_keep(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Keep-probability σ(α) per position class, one bar per λ (dashed: the hard mask's kept fraction is in the table)."""
    ax = new_axes(ax, (7.6, 4.2))
    table = result.keep_summary
    classes = list(dict.fromkeys(table["class"]))
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
            label=f"{_lambda_label(lam)} (sparsity {sparsity[lam]:.0%})",
        )
    ax.set_xticks(x, classes)
    ax.grid(axis="x", visible=False)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position class")
    ax.set_ylabel("keep probability σ(α), mean over positions")
    ax.set_title(f"DAM ({result.meta['settings']['variant']}): what the learned masks keep\n{describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_loss_vs_sparsity(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Change of the held-out objective against sparsity: DAM's λ sweep (with paired 95%
    intervals) and every fixed pattern, each against the unmodified model at 0."""
    ax = new_axes(ax, (7.6, 4.6))
    objective = result.meta["settings"]["objective"]
    palette = dict(zip(PATTERN_MARKERS, sns.color_palette("deep", len(PATTERN_MARKERS))))
    for name, points in result.patterns.groupby("pattern", sort=False):
        points = points.sort_values("sparsity")
        ax.plot(points["sparsity"], points["delta"], marker=PATTERN_MARKERS.get(name, "o"), color=palette.get(name),
                lw=1, ms=5, alpha=0.85, label=name)  # fmt: skip
    table = result.table
    error = np.stack([table["delta"] - table["delta_low"], table["delta_high"] - table["delta"]])
    ax.errorbar(table["sparsity"], table["delta"], yerr=error, fmt="o-", color="black", lw=1.8, ms=6, capsize=3,
                label=f"DAM {result.meta['settings']['variant']} (λ sweep)", zorder=5)  # fmt: skip
    label_points(ax, table["sparsity"], table["delta"], [_lambda_label(value) for value in table["lambda"]])
    ax.axhline(0, color="grey", ls="--", lw=1, label=_unmodified(result.meta))
    ax.set_xlabel("sparsity (fraction of valid attention positions removed)")
    ax.set_ylabel(LOSS_LABELS[objective])  # held-out: the title says so
    ax.set_xlim(-0.02, 1.02)
    ax.set_title(f"Loss against sparsity: learned masks and fixed patterns\n{describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def _unmodified(meta: dict) -> str:
    """The baseline's legend entry; with a loss of its own (not ``hidden``, whose loss is 0
    by definition) the entry says how large it is, which the Δ axis no longer shows."""
    if meta["settings"]["objective"] == "hidden":
        return "unmodified model"
    return f"unmodified model (loss {meta['baseline']['loss']:.3g} nats)"


def plot_accuracy_vs_sparsity(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Task accuracy against the sparsity on the task's own examples (valid positions removed,
    padding aside: short texts lose less to a window than full blocks): the learned masks
    (95% intervals) and every fixed pattern."""
    ax = new_axes(ax, (7.6, 4.6))
    task, table = result.meta["task"], result.tables["task"]
    palette = dict(zip(PATTERN_MARKERS, sns.color_palette("deep", len(PATTERN_MARKERS))))
    for name, points in table[table["kind"] == "pattern"].groupby("pattern", sort=False):
        points = points.sort_values("task_sparsity")
        ax.plot(points["task_sparsity"], points["accuracy"], marker=PATTERN_MARKERS.get(name, "o"), color=palette.get(name),
                lw=1, ms=5, alpha=0.85, label=name)  # fmt: skip
    masks = table[table["kind"] == "dam"].sort_values("task_sparsity")
    error = np.stack([masks["accuracy"] - masks["accuracy_low"], masks["accuracy_high"] - masks["accuracy"]])
    ax.errorbar(masks["task_sparsity"], masks["accuracy"], yerr=error, fmt="o-", color="black", lw=1.8, ms=6, capsize=3,
                label=f"DAM {result.meta['settings']['variant']} (λ sweep)", zorder=5)  # fmt: skip
    label_points(ax, masks["task_sparsity"], masks["accuracy"], [_lambda_label(value) for value in masks["lambda"]])
    task_references(ax, task)
    ax.set_xlabel("sparsity on the task's examples (fraction of valid positions removed)")
    ax.set_ylabel("held-out accuracy")
    ax.set_xlim(-0.02, 1.02)
    trained = result.meta["settings"].get("trained_on", result.meta["settings"]["objective"])
    ax.set_title(f"Task accuracy against sparsity (masks trained on: {trained})\n{task_describe(result.meta)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def plot_training(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Density of the sampled masks over training, one line per λ."""
    ax = new_axes(ax, (6.4, 3.8))
    lambdas = list(dict.fromkeys(result.training["lambda"]))
    for lam, colour in zip(lambdas, sns.color_palette("flare", len(lambdas))):
        curve = result.training[result.training["lambda"] == lam]
        ax.plot(curve["step"], curve["density"], color=colour, label=_lambda_label(lam))
    ax.set_xlabel("training step")
    ax.set_ylabel("density of the sampled mask (kept fraction)")
    ax.set_ylim(0, 1.02)
    ax.set_title("DAM training", fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_masks(result, index: int | None = None) -> plt.Figure:
    """Keep-probability images per layer and head for one λ (default: nearest 85% sparsity).

    The images are of the first held-out block (the class variant depends on its tokens);
    the structured variant is the same in every layer, so one row shows it.
    """
    apply_style()
    index = nearest_lambda(result) if index is None else index
    images = result.arrays["keep_images"][index].astype(np.float32)  # (layer, head, n, n)
    shared = result.meta["settings"]["variant"] == "structured"
    heads = images.shape[1]
    # one image per head (shared by layers, wrapped six to a row), or a layer x head grid
    cells = (
        [(0, head) for head in range(heads)] if shared else [(layer, h) for layer in range(images.shape[0]) for h in range(heads)]
    )
    columns = min(heads, 6) if shared else heads
    rows = -(-len(cells) // columns)
    size = 1.25 if shared else 1.05
    figure, axes = plt.subplots(
        rows, columns, figsize=(size * columns + 1.4, size * rows + 1.1), squeeze=False, layout="constrained"
    )
    for number, (layer, head) in enumerate(cells):
        ax = axes.flat[number]
        picture = ax.imshow(images[layer, head], cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if shared or layer == 0:
            ax.set_title(f"head {head}", fontsize=7)
        if not shared and head == 0:
            ax.set_ylabel(f"layer {layer}", fontsize=7)
    for ax in axes.flat[len(cells) :]:
        ax.set_visible(False)
    figure.colorbar(picture, ax=axes, shrink=0.8, label="keep probability σ(α)")
    row = result.table.iloc[index]
    scope = ", the same in every layer" if shared else ""
    figure.suptitle(
        f"Learned masks (query ↓, key →), {result.meta['settings']['variant']}{scope}, λ = {row['lambda']:g}, "
        f"sparsity {row['sparsity']:.0%}\n{describe(result.meta)}",
        fontsize=9,
    )
    return figure


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``loss_vs_sparsity`` (main), ``keep_per_class``, ``training``, ``masks``."""
    yield "loss_vs_sparsity", plot_loss_vs_sparsity(result).figure
    yield "keep_per_class", plot_keep(result).figure
    yield "training", plot_training(result).figure
    if "task" in result.tables:
        yield "accuracy_vs_sparsity", plot_accuracy_vs_sparsity(result).figure
    yield "masks", plot_masks(result)
