"""Figures of eigen and overlap results: spectra, cumulative energy, overlap heatmaps, split-half.

>>> import attnlens
>>> from attnlens.figures.eigen import plot_spectra
>>> result = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1], progress=False)
>>> ax = plot_spectra(result)
>>> ax.get_yscale()
'log'
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from .style import layer_colours, new_axes, save_figure

QUANTITY_LABELS = {"scores": "pre-softmax score rows", "weights": "attention-weight rows", "log-weights": "log-weight rows"}


def _describe(result) -> str:
    settings = result.meta["settings"]
    centring = "centred" if settings["centred"] else "uncentred"
    ones = ", ones direction removed" if settings["project_ones"] else ""
    return f"{result.meta['model']['name']}, n = {result.n}, {centring}{ones}"


def _query_position(result, query: int | None) -> int:
    queries = result.meta["settings"]["queries"]
    if queries is None:
        return 0
    return queries.index(queries[-1] if query is None else query)


def plot_spectra(result, ax: plt.Axes | None = None, *, query: int | None = None) -> plt.Axes:
    """Eigenvalues per layer (heads pooled), log scale, with the Gaussian baseline dashed."""
    ax = new_axes(ax)
    q = _query_position(result, query)
    values = result.arrays["layer_eigenvalues"][:, 0, q]
    baseline = result.arrays["layer_baseline"][:, 0, q]
    components = np.arange(1, values.shape[-1] + 1)
    for colour, layer, spectrum, base in zip(layer_colours(len(values)), result.meta["layers"], values, baseline):
        positive = spectrum > 0
        ax.plot(components[positive], spectrum[positive], color=colour, lw=1.6, label=f"layer {layer}")
        ax.plot(components[base > 0], base[base > 0], color=colour, lw=1, ls="--", alpha=0.7)
    ax.plot([], [], color="grey", ls="--", label="baseline (Gaussian,\nmatched variances)")
    ax.set_yscale("log")
    ax.set_xlabel("component (descending eigenvalue)")
    ax.set_ylabel("eigenvalue (variance, score²)" if result.meta["settings"]["quantity"] == "scores" else "eigenvalue (variance)")
    ax.set_title(f"Spectra of {QUANTITY_LABELS[result.meta['settings']['quantity']]}\n({_describe(result)})", fontsize=10)
    ax.legend(fontsize=8, ncol=2 if len(values) > 6 else 1)
    return ax


def plot_energy(result, ax: plt.Axes | None = None, *, query: int | None = None) -> plt.Axes:
    """Cumulative explained energy against number of components, per layer, baseline dashed."""
    ax = new_axes(ax)
    q = _query_position(result, query)
    values = np.clip(result.arrays["layer_eigenvalues"][:, 0, q], 0, None)
    baseline = np.clip(result.arrays["layer_baseline"][:, 0, q], 0, None)
    components = np.arange(0, values.shape[-1] + 1)
    for colour, layer, spectrum, base in zip(layer_colours(len(values)), result.meta["layers"], values, baseline):
        ax.plot(components, np.r_[0, np.cumsum(spectrum)] / max(spectrum.sum(), 1e-300), color=colour, lw=1.6, label=f"layer {layer}")
        ax.plot(components, np.r_[0, np.cumsum(base)] / max(base.sum(), 1e-300), color=colour, lw=1, ls="--", alpha=0.7)
    ax.plot([], [], color="grey", ls="--", label="baseline")
    ax.axhline(0.9, color="black", lw=0.8, ls=":")
    ax.text(values.shape[-1], 0.9, "90% ", ha="right", va="bottom", fontsize=8)
    ax.set_xlim(0, values.shape[-1])
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("number of components")
    ax.set_ylabel("fraction of variance explained")
    ax.set_title(f"Cumulative energy of {QUANTITY_LABELS[result.meta['settings']['quantity']]}\n({_describe(result)})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", ncol=2 if len(values) > 6 else 1)
    return ax


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
    sns.heatmap(matrix, vmin=0, vmax=1, cmap="viridis", square=True, ax=ax, annot=not big, fmt=".2f",
                annot_kws={"fontsize": 7}, xticklabels=columns, yticklabels=rows,
                cbar_kws={"label": "normalised overlap ‖UᵀV‖²/d", "shrink": 0.8})
    colorbar = ax.collections[0].colorbar
    colorbar.ax.axhline(chance, color="white", lw=2)
    colorbar.ax.text(-0.1, chance, f"chance {chance:.3f} ", color="black", ha="right", va="center", fontsize=8,
                     transform=colorbar.ax.get_yaxis_transform())
    if big:
        step = max(1, len(rows) // 12)
        ax.set_xticks(np.arange(0, len(columns), step) + 0.5, columns[::step], rotation=90, fontsize=7)
        ax.set_yticks(np.arange(0, len(rows), step) + 0.5, rows[::step], rotation=0, fontsize=7)
    ax.set_xlabel(model_b)
    ax.set_ylabel(model_a)
    kind = "layers" if name.startswith("layers") else ("heads" if name.startswith("heads") else "models")
    ax.set_title(f"Overlap of top-{overlap_result.dim} eigenspaces, {kind} (n = {overlap_result.meta['n']})\n"
                 f"chance level d/n = {chance:.3f}", fontsize=10)
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


def save_eigen_figures(result, directory: Path) -> list[Path]:
    """spectra.{png,pdf} and energy.{png,pdf}."""
    paths = []
    for stem, plot in (("spectra", plot_spectra), ("energy", plot_energy)):
        ax = plot(result)
        paths += save_figure(ax.figure, directory / stem)
    return paths


def save_overlap_figures(overlap_result, directory: Path) -> list[Path]:
    """overlap_<matrix>.{png,pdf} for every matrix, and split_half_<i>.{png,pdf} per model."""
    paths = []
    for key in sorted(overlap_result.arrays):
        if key.endswith("_overlap") and not key.startswith("model_"):
            name = key.removesuffix("_overlap")
            paths += save_figure(plot_overlap(overlap_result, name).figure, directory / f"overlap_{name}")
    for index in range(len(overlap_result.meta["models"])):
        paths += save_figure(plot_split_half(overlap_result, model=index).figure, directory / f"split_half_{index}")
    return paths
