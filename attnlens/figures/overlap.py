"""Figures of overlap results: overlap heatmaps of layers, heads and models, the split-half check
and the overlap of pairs of layers against d (every pair of a small model; of a deep one, the
adjacent pairs through its depth and the closest and farthest: the pairs table holds them all).

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

from .style import LEGEND_LAYERS, apply_style, figure_of, layer_colourbar, layer_colours, new_axes


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


# A heat map has at most this many cells a side: a larger matrix (the heads of a deep model: 80 layers × 64
# heads are 5,120 a side) is drawn as the means of square blocks of units, since a 5-inch map at 150 dpi has
# under 800 pixels a side and a PNG of one colour per pixel passes 1 MB. Up to :data:`ANNOTATED` a side
# every cell has its value written in it.
MOST_CELLS = 256
ANNOTATED = 16


def pooled(matrix: np.ndarray, most: int = MOST_CELLS) -> tuple[np.ndarray, int]:
    """``matrix`` as the means of ``block`` × ``block`` squares of it (the last block of a side may be
    shorter), ``block`` the smallest that leaves at most ``most`` cells a side; ``block`` 1 is the matrix.

    >>> values, block = pooled(np.arange(36.0).reshape(6, 6), most=3)
    >>> block, values.tolist()
    (2, [[3.5, 5.5, 7.5], [15.5, 17.5, 19.5], [27.5, 29.5, 31.5]])
    """
    block = -(-max(matrix.shape) // most)
    if block == 1:
        return matrix, 1
    starts = [np.arange(0, side, block) for side in matrix.shape]
    sums = np.add.reduceat(np.add.reduceat(np.nan_to_num(matrix), starts[0], axis=0), starts[1], axis=1)
    counts = np.add.reduceat(np.add.reduceat(np.isfinite(matrix).astype(float), starts[0], axis=0), starts[1], axis=1)
    with np.errstate(invalid="ignore"):
        return sums / counts, block


def plot_overlap(overlap_result, name: str = "layers_0", ax: plt.Axes | None = None) -> plt.Axes:
    """Heatmap of one overlap matrix (0 = orthogonal, 1 = same subspace) with the chance level d/n marked:
    every value written up to :data:`ANNOTATED` units a side, about a dozen ticks a side above, and blocks of units
    averaged above :data:`MOST_CELLS`, so that its pixels and its cost stay bounded for any model."""
    rows, columns, model_a, model_b = _matrix_labels(overlap_result, name)
    matrix, block = pooled(np.asarray(overlap_result.matrix(name), dtype=float))
    ax = new_axes(ax, size=overlap_figure_size(*matrix.shape))
    if max(matrix.shape) <= ANNOTATED:
        sns.heatmap(matrix, vmin=0, vmax=1, cmap="viridis", square=True, ax=ax, annot=True, fmt=".2f",
                    annot_kws={"fontsize": 7}, xticklabels=columns, yticklabels=rows,
                    cbar_kws={"label": _OVERLAP_LABEL, "shrink": 0.8})  # fmt: skip
        colorbar = ax.collections[0].colorbar
        assert colorbar is not None, "sns.heatmap draws its colour bar (cbar is left on)"
    else:
        # an image, not seaborn's mesh of one path per cell with a label per unit (512 heads a side took 17 s to draw
        # and 70 s to write as PDF), its cells where seaborn's are (cell i spans [i, i + 1]); each tick names the first
        # unit of its block
        image = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                          extent=(0, matrix.shape[1], matrix.shape[0], 0))  # fmt: skip
        colorbar = figure_of(ax).colorbar(image, ax=ax, label=_OVERLAP_LABEL, shrink=0.8)
        step = -(-max(1, len(rows) // 12) // block) * block  # about a dozen ticks, each at the start of a block
        for axis, labels in ((ax.xaxis, columns), (ax.yaxis, rows)):
            units = np.arange(0, len(labels), step)
            axis.set_ticks(units / block + 0.5, [labels[unit] for unit in units], fontsize=7)
        ax.tick_params(axis="x", labelrotation=90)
        ax.grid(False)
    _mark_chance(colorbar, overlap_result.chance)
    ax.set_xlabel(model_b)
    ax.set_ylabel(model_a)
    kind = {"layer": "layers", "head": "heads", "model": "models"}[overlap_result.comparison(name).level]
    averaged = f"; each cell the mean of {block} × {block} {kind}" if block > 1 else ""
    ax.set_title(
        f"Overlap of top-{overlap_result.dim} eigenspaces, {kind} (n = {overlap_result.meta['n']})\n"
        f"chance level d/n = {overlap_result.chance:.3f}{averaged}",
        fontsize=10,
    )
    return ax


_OVERLAP_LABEL = "normalised overlap ‖UᵀV‖²/d"


def _mark_chance(colorbar, chance: float) -> None:
    colorbar.ax.axhline(chance, color="white", lw=2)
    colorbar.ax.text(-0.1, chance, f"chance {chance:.3f} ", color="black", ha="right", va="center", fontsize=8,
                     transform=colorbar.ax.get_yaxis_transform())  # fmt: skip


def plot_split_half(overlap_result, ax: plt.Axes | None = None, *, model: int = 0) -> plt.Axes:
    """Per layer: the overlap of its subspace estimated on two halves of the data, against d,
    with the level a determined d keeps, the d each layer keeps it up to, and chance d/n; each layer
    named in the legend up to :data:`~attnlens.figures.style.LEGEND_LAYERS`, by a colour bar above."""
    ax = new_axes(ax)
    name = overlap_result.meta["models"][model]
    curves = overlap_result.arrays[f"split_half_{model}_layer_curve"]
    layers = overlap_result.meta["layers"][model]
    table = overlap_result.split_half
    stable = table[(table["result"] == model) & (table["level"] == "layer")].stable_dim.to_numpy()
    dims = np.arange(1, curves.shape[-1] + 1)
    named = len(layers) <= LEGEND_LAYERS  # more layers: a colour bar names them, the table their d
    for curve, layer, colour, d in zip(curves, layers, layer_colours(len(layers)), stable):
        ax.plot(dims, curve, color=colour, lw=1.5, label=f"L{layer} (determined up to d = {d})" if named else None)
        if d:
            ax.plot(d, curve[d - 1], "o", color=colour, ms=5)
    if not named:
        layer_colourbar(ax, layers)
        ax.plot([], [], "o", color="grey", ms=5, label="where each layer's d ends (split_half table)")
    ax.plot(dims, dims / overlap_result.meta["n"], color="black", ls=":", lw=1, label="chance d/n")
    level = overlap_result.meta["level"]
    ax.axhline(level, color="grey", ls="--", lw=1, label=f"level {level:g}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("d (top eigenvectors compared)")
    ax.set_ylabel("split-half overlap ‖UᵀV‖²/d")
    ax.set_title(f"Split-half check ({name}): how many dimensions the data determine", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    return ax


# Up to this many pairs of layers the curves figure draws every one (minilm-l6: 15, minilm-l6 × minilm-l3: 18).
# More (a 30-layer model has 435: a figure 24,930 pixels tall, 876 s to draw in a user's report) are chosen, a row of each:
# the adjacent pairs (across two models, layers at the same depth) evenly through the depth, then the closest and
# the farthest of the rest at the d each is compared at. The pairs table holds every pair.
ALL_PAIRS = 20
CHOSEN = 5  # pairs a row


def curve_pairs(overlap_result, name: str = "layers_0") -> list[tuple[str, list[tuple[int, int]]]]:
    """The pairs of layers (their positions in each model's layers) the curves figure of matrix ``name`` draws,
    a row of panels each: every pair in rows of :data:`CHOSEN` (a group named ""), up to :data:`ALL_PAIRS`
    of them; else a row of adjacent (or same-depth) pairs, a row of the closest and one of the farthest.

    >>> import attnlens
    >>> spectra = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1, 2], progress=False)
    >>> curve_pairs(attnlens.overlap(spectra, max_dim=4))
    [('', [(0, 1), (0, 2), (1, 2)])]
    """
    first, last = overlap_result.results_of(name)
    count_a, count_b = (len(overlap_result.meta["layers"][index]) for index in (first, last))
    every = [(x, y) for x in range(count_a) for y in range(count_b) if first != last or x < y]
    if len(every) <= ALL_PAIRS:
        return [("", every[start : start + CHOSEN]) for start in range(0, len(every), CHOSEN)]
    if first == last:
        spread = [(x, x + 1) for x in _evenly(count_a - 1)]
    else:  # the same relative depth in both models
        spread = [(x, round(x * (count_b - 1) / max(count_a - 1, 1))) for x in _evenly(count_a)]
    ranked = [pair for pair in _by_overlap(overlap_result, name) if pair not in spread]
    closest = ranked[:CHOSEN]
    farthest = [pair for pair in ranked[::-1] if pair not in closest][:CHOSEN]
    groups = [("adjacent" if first == last else "same depth", spread), ("closest", closest), ("farthest", farthest)]
    return [(label, pairs) for label, pairs in groups if pairs]


def curve_panels(layers_a: int, layers_b: int | None = None) -> int:
    """At most how many panels the curves figure has for a model of ``layers_a`` layers (within it) or between
    it and one of ``layers_b`` layers: every pair up to :data:`ALL_PAIRS`, else three rows of :data:`CHOSEN`.

    >>> curve_panels(6), curve_panels(30), curve_panels(6, 3)
    (15, 15, 18)
    """
    pairs = layers_a * (layers_a - 1) // 2 if layers_b is None else layers_a * layers_b
    return pairs if pairs <= ALL_PAIRS else 3 * CHOSEN


def _evenly(count: int) -> list[int]:
    """Up to :data:`CHOSEN` positions of ``count`` evenly spread from the first to the last."""
    return sorted({int(at) for at in np.linspace(0, count - 1, min(count, CHOSEN)).round()})


def _by_overlap(overlap_result, name: str) -> list[tuple[int, int]]:
    """The pairs of matrix ``name`` with a determined d, by their overlap at it, largest first."""
    first, last = overlap_result.results_of(name)
    table = overlap_result.pairs
    table = table[(table["comparison"] == name) & (table["d"] > 0)].dropna(subset=["overlap"])
    table = table.sort_values("overlap", ascending=False, kind="stable")
    where_a, where_b = ({layer: at for at, layer in enumerate(overlap_result.meta["layers"][index])} for index in (first, last))
    return [(where_a[a], where_b[b]) for a, b in zip(table["layer_a"], table["layer_b"])]


def plot_overlap_curves(overlap_result, name: str = "layers_0") -> plt.Figure:
    """A panel per pair of layers of matrix ``name`` that :func:`curve_pairs` chooses (every pair of a small
    model): their overlap against d beside the two split-half floors (each layer against itself, from two
    halves of the data) and chance d/n, with the d the pair is compared at (both floors at or above the level)
    marked. At most :data:`ALL_PAIRS` panels, whatever the model."""
    first, last = overlap_result.results_of(name)
    meta = overlap_result.meta
    groups = curve_pairs(overlap_result, name)
    shown = [pair for _, pairs in groups for pair in pairs]
    columns = max(len(pairs) for _, pairs in groups)
    apply_style()
    figure, grid = plt.subplots(len(groups), columns, figsize=(2.3 * columns, 1.9 * len(groups) + 0.9), sharex=True,
                                sharey=True, layout="constrained", squeeze=False)  # fmt: skip
    drawn = []
    for row, (label, pairs) in zip(grid, groups):
        for ax, pair in zip(row, pairs):
            _curve_panel(ax, overlap_result, name, pair)
            drawn.append(ax)
        for ax in row[len(pairs) :]:
            ax.set_visible(False)
        if label:
            row[0].set_ylabel(label, fontsize=9)
    lowest = {column: row for row in range(len(groups)) for column in range(len(groups[row][1]))}
    for column, row in lowest.items():  # the lowest panel of each column
        grid[row, column].set_xlabel("d (top eigenvectors)", fontsize=8)
    figure.supylabel("overlap ‖UᵀV‖²/d", fontsize=9)
    handles, labels = drawn[0].get_legend_handles_labels()
    for ax in drawn[1:]:  # the marker appears only in panels with a determined d
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=7, frameon=False)
    names = meta["models"][first] if first == last else f"{meta['models'][first]} × {meta['models'][last]}"
    total = len(overlap_result.pairs.query("comparison == @name"))
    chosen = "" if len(shown) == total else f"\n{len(shown)} of {total} pairs, each row named; every pair is in the pairs table"
    figure.suptitle(
        f"Overlap of layer subspaces against d, {names} (n = {meta['n']}, level {meta['level']:g}){chosen}", fontsize=10
    )
    return figure


def _curve_panel(ax: plt.Axes, overlap_result, name: str, pair: tuple[int, int]) -> None:
    """One pair's panel of :func:`plot_overlap_curves`."""
    first, last = overlap_result.results_of(name)
    meta, (x, y) = overlap_result.meta, pair
    curves = overlap_result.curve(name)
    layer_a, layer_b = meta["layers"][first][x], meta["layers"][last][y]
    dims = np.arange(1, curves.shape[-1] + 1)
    ax.plot(dims, curves[x, y], color="C0", lw=1.6, label="overlap of the two layers")
    ax.plot(dims, overlap_result.arrays[f"split_half_{first}_layer_curve"][x], color="C1", ls="--", lw=1,
            label="split-half of the first")  # fmt: skip
    ax.plot(dims, overlap_result.arrays[f"split_half_{last}_layer_curve"][y], color="C2", ls="-.", lw=1,
            label="split-half of the second")  # fmt: skip
    ax.plot(dims, dims / meta["n"], color="black", ls=":", lw=1, label="chance d/n")
    table = overlap_result.pairs
    d = int(table[(table["comparison"] == name) & (table["layer_a"] == layer_a) & (table["layer_b"] == layer_b)]["d"].iloc[0])
    if d:
        ax.axvline(d, color="grey", lw=0.8)
        ax.plot(d, curves[x, y, d - 1], "o", color="C0", ms=4, label="compared at d (both split-halves ≥ level)")
    short = (
        (f"L{layer_a}", f"L{layer_b}")
        if first == last
        else (f"{meta['models'][first]} L{layer_a}", f"{meta['models'][last]} L{layer_b}")
    )
    ax.set_title(f"{short[0]} × {short[1]}" + (f", d = {d}" if d else ", no determined d"), fontsize=8)
    ax.set_ylim(0, 1.05)


def draw(overlap_result) -> Iterator[tuple[str, plt.Figure]]:
    """``overlap_<matrix>`` for every layer and head matrix (the first: layers of model 0),
    ``split_half_<i>`` per model, and ``curves_layers_<i>`` / ``curves_layers_<i>_<j>`` for
    every layer comparison with at least one pair (at most :data:`ALL_PAIRS` of its pairs drawn)."""
    for name in overlap_result.matrices("layer") + overlap_result.matrices("head"):
        yield f"overlap_{name}", figure_of(plot_overlap(overlap_result, name))
    for index in range(len(overlap_result.meta["models"])):
        yield f"split_half_{index}", figure_of(plot_split_half(overlap_result, model=index))
    for name in overlap_result.matrices("layer"):
        # a model of one layer has no pair within it
        if not overlap_result.comparison(name).within or len(overlap_result.curve(name)) > 1:
            yield f"curves_{name}", plot_overlap_curves(overlap_result, name)
