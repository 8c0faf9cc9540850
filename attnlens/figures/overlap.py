"""Figures of overlap results: overlap heatmaps of layers, heads and models, and the split-half check.

>>> import attnlens
>>> spectra = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1], progress=False)
>>> ax = plot_overlap(attnlens.overlap(spectra, dim=4), "layers_0")
>>> ax.get_xlabel()
'minilm-l6'
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .style import new_axes


def _matrix_labels(overlap_result, name: str) -> tuple[list[str], list[str], str, str]:
    """Tick labels of both axes of a matrix named ``layers_0``, ``heads_0_1``, ... and the two model names."""
    kind, *models = name.split("_")
    first, last = int(models[0]), int(models[-1])
    meta = overlap_result.meta

    def labels(index: int) -> list[str]:
        layers = meta["layers"][index]
        if kind == "layers":
            return [f"L{layer}" for layer in layers]
        return [f"L{layer}H{head}" for layer in layers for head in range(meta["num_heads"][index])]

    return labels(first), labels(last), meta["models"][first], meta["models"][last]


def plot_overlap(overlap_result, name: str = "layers_0", ax: plt.Axes | None = None) -> plt.Axes:
    """Heatmap of one overlap matrix (0 = orthogonal, 1 = same subspace) with the chance level d/n marked."""
    matrix = overlap_result.matrix(name)
    rows, columns, model_a, model_b = _matrix_labels(overlap_result, name)
    big = max(matrix.shape) > 16
    ax = new_axes(ax, size=(7.5, 6.2) if big else (6.4, 5.2))
    chance = overlap_result.chance
    sns.heatmap(
        matrix,
        vmin=0,
        vmax=1,
        cmap="viridis",
        square=True,
        ax=ax,
        annot=not big,
        fmt=".2f",
        annot_kws={"fontsize": 7},
        xticklabels=columns,
        yticklabels=rows,
        cbar_kws={"label": "normalised overlap ‖UᵀV‖²/d", "shrink": 0.8},
    )
    colorbar = ax.collections[0].colorbar
    colorbar.ax.axhline(chance, color="white", lw=2)
    colorbar.ax.text(
        -0.1,
        chance,
        f"chance {chance:.3f} ",
        color="black",
        ha="right",
        va="center",
        fontsize=8,
        transform=colorbar.ax.get_yaxis_transform(),
    )
    if big:
        step = max(1, len(rows) // 12)
        ax.set_xticks(np.arange(0, len(columns), step) + 0.5, columns[::step], rotation=90, fontsize=7)
        ax.set_yticks(np.arange(0, len(rows), step) + 0.5, rows[::step], rotation=0, fontsize=7)
    ax.set_xlabel(model_b)
    ax.set_ylabel(model_a)
    kind = "layers" if name.startswith("layers") else ("heads" if name.startswith("heads") else "models")
    ax.set_title(
        f"Overlap of top-{overlap_result.dim} eigenspaces, {kind} (n = {overlap_result.meta['n']})\n"
        f"chance level d/n = {chance:.3f}",
        fontsize=10,
    )
    return ax


def plot_split_half(overlap_result, ax: plt.Axes | None = None, *, model: int = 0) -> plt.Axes:
    """Per layer: overlap of its subspace from two halves of the data, against its mean
    overlap with the other layers, and the chance level."""
    ax = new_axes(ax)
    name = overlap_result.meta["models"][model]
    table = overlap_result.split_half
    halves = table[(table["result"] == model) & (table["level"] == "layer")]  # two results may share a model
    matrix = overlap_result.matrix(f"layers_{model}")
    others = (matrix.sum(1) - np.diag(matrix)) / max(len(matrix) - 1, 1)
    x = np.arange(len(halves))
    ax.bar(x - 0.2, halves.overlap, width=0.4, label="split-half (same layer, two halves)")
    if len(matrix) > 1:
        ax.bar(x + 0.2, others, width=0.4, label="mean overlap with other layers")
    ax.axhline(overlap_result.chance, color="black", ls=":", lw=1, label=f"chance d/n = {overlap_result.chance:.3f}")
    ax.set_xticks(x, [f"L{layer}" for layer in halves.layer])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"overlap of top-{overlap_result.dim} eigenspaces")
    ax.set_title(f"Split-half check ({name}): is a cross-layer difference real?", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    return ax


def draw(overlap_result) -> Iterator[tuple[str, plt.Figure]]:
    """``overlap_<matrix>`` for every layer and head matrix (the first: layers of model 0), and
    ``split_half_<i>`` per model."""
    for key in sorted(overlap_result.arrays, key=lambda key: (not key.startswith("layers"), key)):
        if key.endswith("_overlap") and not key.startswith("model_"):
            name = key.removesuffix("_overlap")
            yield f"overlap_{name}", plot_overlap(overlap_result, name).figure
    for index in range(len(overlap_result.meta["models"])):
        yield f"split_half_{index}", plot_split_half(overlap_result, model=index).figure
