"""Figures of overlap results: overlap heatmaps of layers, heads and models, the split-half check
and the overlap of every pair of layers against d.

>>> import attnlens
>>> spectra = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1], progress=False)
>>> ax = plot_overlap(attnlens.overlap(spectra, dim=4), "layers_0")
>>> ax.get_xlabel()
'minilm-l6'
>>> len(plot_overlap_curves(attnlens.overlap(spectra, max_dim=4)).axes)  # one panel: L0 × L1
1
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .style import apply_style, figure_of, layer_colours, new_axes


def _matrix_labels(overlap_result, name: str) -> tuple[list[str], list[str], str, str]:
    """Tick labels of both axes of a matrix named ``layers_0``, ``heads_0_1``, ... and the two model names."""
    comparison = overlap_result.comparison(name)
    meta = overlap_result.meta

    def labels(index: int) -> list[str]:
        layers = meta["layers"][index]
        if comparison.level == "layer":
            return [f"L{layer}" for layer in layers]
        if comparison.level == "model":
            return ["all"]
        return [f"L{layer}H{head}" for layer in layers for head in range(meta["num_heads"][index])]

    return (
        labels(comparison.result_a),
        labels(comparison.result_b),
        meta["models"][comparison.result_a],
        meta["models"][comparison.result_b],
    )


def overlap_figure_size(rows: int, columns: int) -> tuple[float, float]:
    """A figure (inches) that fits a heat map of ``rows`` × ``columns`` square cells, its
    colour bar and labels, without blank margins: cells as large as a 5 × 6 inch area allows
    (at most 3/4 inch), plus room for the tick labels, title and colour bar (and the
    chance level written beside it).

    >>> overlap_figure_size(6, 3)
    (4.85, 5.8)
    """
    cell = min(5.0 / rows, 6.0 / columns, 0.75)
    return round(max(columns * cell + 2.6, 4.6), 2), round(max(rows * cell, 2.2) + 1.3, 2)  # room for the title


def plot_overlap(overlap_result, name: str = "layers_0", ax: plt.Axes | None = None) -> plt.Axes:
    """Heatmap of one overlap matrix (0 = orthogonal, 1 = same subspace) with the chance level d/n marked."""
    matrix = overlap_result.matrix(name)
    rows, columns, model_a, model_b = _matrix_labels(overlap_result, name)
    big = max(matrix.shape) > 16
    ax = new_axes(ax, size=overlap_figure_size(*matrix.shape))
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
    assert colorbar is not None, "sns.heatmap draws its colour bar (cbar is left on)"
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
    kind = {"layer": "layers", "head": "heads", "model": "models"}[overlap_result.comparison(name).level]
    ax.set_title(
        f"Overlap of top-{overlap_result.dim} eigenspaces, {kind} (n = {overlap_result.meta['n']})\n"
        f"chance level d/n = {chance:.3f}",
        fontsize=10,
    )
    return ax


def plot_split_half(overlap_result, ax: plt.Axes | None = None, *, model: int = 0) -> plt.Axes:
    """Per layer: the overlap of its subspace estimated on two halves of the data, against d,
    with the level a determined d keeps, the d each layer keeps it up to, and chance d/n."""
    ax = new_axes(ax)
    name = overlap_result.meta["models"][model]
    curves = overlap_result.arrays[f"split_half_{model}_layer_curve"]
    layers = overlap_result.meta["layers"][model]
    table = overlap_result.split_half
    stable = table[(table["result"] == model) & (table["level"] == "layer")].stable_dim.to_numpy()
    dims = np.arange(1, curves.shape[-1] + 1)
    for curve, layer, colour, d in zip(curves, layers, layer_colours(len(layers)), stable):
        ax.plot(dims, curve, color=colour, lw=1.5, label=f"L{layer} (determined up to d = {d})")
        if d:
            ax.plot(d, curve[d - 1], "o", color=colour, ms=5)
    ax.plot(dims, dims / overlap_result.meta["n"], color="black", ls=":", lw=1, label="chance d/n")
    level = overlap_result.meta["level"]
    ax.axhline(level, color="grey", ls="--", lw=1, label=f"level {level:g}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("d (top eigenvectors compared)")
    ax.set_ylabel("split-half overlap ‖UᵀV‖²/d")
    ax.set_title(f"Split-half check ({name}): how many dimensions the data determine", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    return ax


def plot_overlap_curves(overlap_result, name: str = "layers_0") -> plt.Figure:
    """One panel per pair of layers of matrix ``name``: their overlap against d beside the two
    split-half floors (each layer against itself, from two halves of the data) and chance
    d/n, with the d the pair is compared at (both floors at or above the level) marked."""
    first, last = overlap_result.results_of(name)
    meta = overlap_result.meta
    curves = overlap_result.curve(name)
    floors = [overlap_result.arrays[f"split_half_{index}_layer_curve"] for index in (first, last)]
    layers_a, layers_b = meta["layers"][first], meta["layers"][last]
    pairs = [(x, y) for x in range(len(layers_a)) for y in range(len(layers_b)) if first != last or x < y]
    columns = min(len(pairs), 5)
    rows = -(-len(pairs) // columns)
    apply_style()
    figure, axes = plt.subplots(
        rows, columns, figsize=(2.3 * columns, 1.9 * rows + 0.9), sharex=True, sharey=True, layout="constrained"
    )
    axes = np.atleast_1d(axes).ravel()
    dims = np.arange(1, curves.shape[-1] + 1)
    table = overlap_result.pairs
    table = table[table["comparison"] == name].set_index(["layer_a", "layer_b"])
    for ax, (x, y) in zip(axes, pairs):
        label_a, label_b = f"{meta['models'][first]} L{layers_a[x]}", f"{meta['models'][last]} L{layers_b[y]}"
        ax.plot(dims, curves[x, y], color="C0", lw=1.6, label="overlap of the two layers")
        ax.plot(dims, floors[0][x], color="C1", ls="--", lw=1, label="split-half of the first")
        ax.plot(dims, floors[1][y], color="C2", ls="-.", lw=1, label="split-half of the second")
        ax.plot(dims, dims / meta["n"], color="black", ls=":", lw=1, label="chance d/n")
        d = int(table.loc[(layers_a[x], layers_b[y]), "d"])
        if d:
            ax.axvline(d, color="grey", lw=0.8)
            ax.plot(d, curves[x, y, d - 1], "o", color="C0", ms=4, label="compared at d (both split-halves ≥ level)")
        short = (f"L{layers_a[x]}", f"L{layers_b[y]}") if first == last else (label_a, label_b)
        ax.set_title(f"{short[0]} × {short[1]}" + (f", d = {d}" if d else ", no determined d"), fontsize=8)
        ax.set_ylim(0, 1.05)
    for ax in axes[len(pairs) :]:
        ax.set_visible(False)
    for ax in axes[max(len(pairs) - columns, 0) : len(pairs)]:  # the lowest panel of each column
        ax.set_xlabel("d (top eigenvectors)", fontsize=8)
    figure.supylabel("overlap ‖UᵀV‖²/d", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1 : len(pairs)]:  # the marker appears only in panels with a determined d
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=7, frameon=False)
    names = meta["models"][first] if first == last else f"{meta['models'][first]} × {meta['models'][last]}"
    figure.suptitle(f"Overlap of layer subspaces against d, {names} (n = {meta['n']}, level {meta['level']:g})", fontsize=10)
    return figure


def draw(overlap_result) -> Iterator[tuple[str, plt.Figure]]:
    """``overlap_<matrix>`` for every layer and head matrix (the first: layers of model 0),
    ``split_half_<i>`` per model, and ``curves_layers_<i>`` / ``curves_layers_<i>_<j>`` for
    every layer comparison with at least one pair."""
    for name in overlap_result.matrices("layer") + overlap_result.matrices("head"):
        yield f"overlap_{name}", figure_of(plot_overlap(overlap_result, name))
    for index in range(len(overlap_result.meta["models"])):
        yield f"split_half_{index}", figure_of(plot_split_half(overlap_result, model=index))
    for name in overlap_result.matrices("layer"):
        # a model of one layer has no pair within it
        if not overlap_result.comparison(name).within or len(overlap_result.curve(name)) > 1:
            yield f"curves_{name}", plot_overlap_curves(overlap_result, name)
