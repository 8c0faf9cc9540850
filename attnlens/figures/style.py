"""The shared look of attnlens figures (saving them is :meth:`attnlens.io.results.Result.save_figures`)."""

from __future__ import annotations

# No backend is forced: without a display matplotlib falls back to Agg by itself, and in
# Jupyter the inline backend shows the figures.
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.artist import Artist
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox


def apply_style() -> None:
    sns.set_theme(context="notebook", style="whitegrid", palette="deep", font_scale=0.9)


def new_axes(ax: plt.Axes | None, size: tuple[float, float] = (6.4, 4.2)) -> plt.Axes:
    """The given Axes, or a fresh one on a new figure."""
    if ax is not None:
        return ax
    apply_style()
    return plt.subplots(figsize=size, layout="constrained")[1]


def figure_of(ax: plt.Axes) -> Figure:
    """The figure ``ax`` is drawn on: attnlens draws no subfigures, so its root figure.

    >>> figure, ax = plt.subplots()
    >>> figure_of(ax) is figure
    True
    """
    figure = ax.get_figure(root=True)
    assert figure is not None, "attnlens draws no Axes outside a figure"
    return figure


def heatmap(ax: plt.Axes, matrix, cmap: str, label: str, *, vmin: float | None = None, vmax: float | None = None):
    """A layer × head (or any row × column) map of a data frame with a labelled colour bar, the first
    row on top and every row and column ticked (up to :data:`MOST_TICKS`; more, every few, :func:`thinned`). Drawn directly: seaborn's heatmap draws the whole figure
    once per map to decide its tick labels, which makes a grid of maps seconds slower.

    >>> import pandas as pd
    >>> figure, ax = plt.subplots()
    >>> mesh = heatmap(ax, pd.DataFrame([[0.1, 0.2], [0.3, float("nan")]]), "viridis", "mass")
    >>> [tick.get_text() for tick in ax.get_yticklabels()], ax.get_ylim()
    (['0', '1'], (np.float64(2.0), np.float64(0.0)))
    """
    values = np.ma.masked_invalid(np.asarray(matrix, dtype=float))
    mesh = ax.pcolormesh(values, cmap=sns.color_palette(cmap, as_cmap=True), vmin=vmin, vmax=vmax)
    ax.figure.colorbar(mesh, ax=ax, label=label)
    rows, columns = values.shape
    shown_columns, shown_rows = thinned(columns), thinned(rows)
    ax.set_xticks(shown_columns + 0.5, [str(matrix.columns[at]) for at in shown_columns])
    ax.set_yticks(shown_rows + 0.5, [str(matrix.index[at]) for at in shown_rows])
    ax.set_xlim(0, columns)
    ax.set_ylim(rows, 0)
    ax.grid(False)
    return mesh


# Up to this many ticks on an axis of a map every row or column is ticked; more are ticked every few (a map of
# 80 layers × 64 heads, as wide as a page, has no room for 64 labels).
MOST_TICKS = 16


def thinned(count: int, most: int = MOST_TICKS) -> np.ndarray:
    """The positions to tick on an axis of ``count`` rows or columns: all of them up to ``most``,
    else every 2nd, 5th, 10th, 20th, ... (the smallest such step that leaves at most ``most``).

    >>> thinned(6).tolist(), thinned(64).tolist()[:4], len(thinned(80)), len(thinned(5120))
    ([0, 1, 2, 3, 4, 5], [0, 5, 10, 15], 16, 11)
    """
    step = next(base * 10**power for power in range(12) for base in (1, 2, 5) if -(-count // (base * 10**power)) <= most)
    return np.arange(0, count, step)


def layer_colours(count: int) -> list:
    return sns.color_palette("viridis", count)


# Up to this many layers each line of a per-layer figure has its legend entry; more share a colour bar
# (a legend of 80 entries would be taller than the figure).
LEGEND_LAYERS = 12


def layer_colourbar(ax: plt.Axes, layers: list[int]) -> None:
    """A colour bar that names the layer of each line drawn in :func:`layer_colours`: one colour per layer,
    its ticks thinned (:func:`thinned`). Stands in for the legend where there are more than
    :data:`LEGEND_LAYERS` layers.

    >>> figure, ax = plt.subplots()
    >>> layer_colourbar(ax, list(range(30)))
    >>> [tick.get_text() for tick in figure.axes[-1].get_yticklabels()][:3]
    ['0', '2', '4']
    """
    count = len(layers)
    mappable = ScalarMappable(BoundaryNorm(np.arange(count + 1) - 0.5, count), ListedColormap(layer_colours(count)))
    bar = figure_of(ax).colorbar(mappable, ax=ax, label="layer", pad=0.02)
    shown = thinned(count)
    bar.set_ticks([float(at) for at in shown], labels=[str(layers[at]) for at in shown])
    bar.ax.tick_params(labelsize=7)


def task_references(ax: plt.Axes, task: dict) -> None:
    """The unmodified model's accuracy and the majority-class baseline as horizontal lines."""
    lines = (task["unmodified_accuracy"], task["majority_accuracy"])
    ax.axhline(lines[0], color="grey", ls="--", lw=1, label="unmodified model")
    ax.axhline(lines[1], color="grey", ls=":", lw=1, label="majority class")
    # a horizontal line does not widen the axes' limits by itself: its legend entry would name a line outside them
    ax.update_datalim([(0.0, value) for value in lines], updatex=False)
    ax.autoscale_view()


def task_describe(meta: dict) -> str:
    """``minilm-l6 on rotten-tomatoes (probe), 512 held-out examples``: the second line of a task figure's title."""
    task = meta["task"]
    count = len(task["held_out_rows"])
    said = (
        f"up to {count} held-out examples (each change as many as it needed)"
        if task.get("sequential")
        else f"{count} held-out examples"
    )
    return f"{meta['model']['name']} on {task['task']} ({task['protocol']}), {said}"


# ----------------------------------------------------------------------------- point labels

# Offsets (points) tried for a label, nearest first: right above the point, then round it.
_LABEL_RADII = (8, 14, 22, 34, 48, 64)
_LABEL_ANGLES = (45, 135, 315, 225, 90, 270, 0, 180, 20, 70, 110, 160, 200, 250, 290, 340)


def label_points(ax: plt.Axes, xs, ys, texts, *, fontsize: float = 7) -> list[Annotation]:
    """Label points with texts that sit clear of every line, marker and error bar of ``ax``
    and of each other, joined to their point by a thin leader line.

    Where a label goes is decided when the figure is drawn (the layout, and with it where
    the lines fall, is only known then), by :class:`_LabelPlacer`.
    """
    labels = [
        ax.annotate(
            text,
            (x, y),
            xytext=(0, 0),
            textcoords="offset points",
            fontsize=fontsize,
            arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.3", "shrinkA": 1, "shrinkB": 3},
            zorder=6,
        )
        for x, y, text in zip(xs, ys, texts)
    ]
    ax.add_artist(_LabelPlacer(labels))
    return labels


class _LabelPlacer(Artist):
    """Drawn before the labels it owns (lower zorder): moves each to the nearest offset whose
    text keeps a clearance from the Axes' lines and the labels already placed."""

    zorder = 0

    def __init__(self, labels: list[Annotation]) -> None:
        super().__init__()
        self.labels = labels
        self.set_in_layout(False)

    def get_window_extent(self, renderer=None) -> Bbox:
        return Bbox.null()

    def draw(self, renderer) -> None:
        axes = self.axes
        assert isinstance(axes, plt.Axes), "a _LabelPlacer is drawn only on the Axes label_points added it to"
        obstacles = _line_points(axes, renderer)
        inside = axes.get_window_extent(renderer)
        margin = renderer.points_to_pixels(3)
        placed: list[Bbox] = []
        for label in self.labels:
            best = max(_offsets(), key=lambda offset: _clearance(label, offset, renderer, obstacles, placed, inside, margin))
            _move(label, best)  # the first offset with enough room, else the roomiest
            placed.append(_text_box(label, renderer))
        self.stale = False  # moving the labels must not ask for another draw


def _offsets() -> list[tuple[float, float]]:
    return [
        (radius * np.cos(np.radians(angle)), radius * np.sin(np.radians(angle)))
        for radius in _LABEL_RADII
        for angle in _LABEL_ANGLES
    ]


def _move(label: Annotation, offset: tuple[float, float]) -> None:
    """Offset the label, aligned so that its text grows away from its point."""
    dx, dy = offset
    label.xyann = offset
    label.set_horizontalalignment("left" if dx > 1 else "right" if dx < -1 else "center")
    label.set_verticalalignment("bottom" if dy > 1 else "top" if dy < -1 else "center")


def _text_box(label: Annotation, renderer) -> Bbox:
    label.update_positions(renderer)
    return Text.get_window_extent(label, renderer)  # the text alone, without its leader line


def _clearance(label, offset, renderer, obstacles: np.ndarray, placed: list[Bbox], inside: Bbox, margin: float) -> float:
    """How far (pixels) the label's text at ``offset`` stays from everything it must not
    cover, capped at ``margin`` so that among roomy offsets the nearest wins; far below
    any overlap when it leaves the Axes."""
    _move(label, offset)
    box = _text_box(label, renderer)
    if not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1):
        return -1e6
    gaps = [margin]
    if len(obstacles):
        dx = np.maximum.reduce([box.x0 - obstacles[:, 0], np.zeros(len(obstacles)), obstacles[:, 0] - box.x1])
        dy = np.maximum.reduce([box.y0 - obstacles[:, 1], np.zeros(len(obstacles)), obstacles[:, 1] - box.y1])
        gaps.append(float((np.hypot(dx, dy) - obstacles[:, 2]).min()))
    for other in placed:
        dx = max(other.x0 - box.x1, box.x0 - other.x1, 0.0)
        dy = max(other.y0 - box.y1, box.y0 - other.y1, 0.0)
        gaps.append(float(np.hypot(dx, dy)))
    return min(gaps) - 1e-3 * np.hypot(*offset)  # ties go to the nearest offset


def _line_points(ax: plt.Axes, renderer) -> np.ndarray:
    """(x, y, radius) in pixels along every line, marker and error bar of ``ax``, one point
    per pixel of a line's length, so that a distance to them is a distance to the lines."""
    pieces = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(1)]
        width = renderer.points_to_pixels(line.get_linewidth()) / 2
        if line.get_marker() not in (None, "", "None", " "):
            pieces.append(_with_radius(xy, max(width, renderer.points_to_pixels(line.get_markersize()) / 2)))
        if line.get_linestyle() not in ("None", "", " "):
            pieces.append(_with_radius(_along(xy), width))
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            transform = collection.get_transform()
            for segment in collection.get_segments():
                pieces.append(_with_radius(_along(transform.transform(np.asarray(segment, dtype=float))), 1.0))
    return np.concatenate(pieces) if pieces else np.zeros((0, 3))


def _along(xy: np.ndarray) -> np.ndarray:
    """Points every pixel along the polyline ``xy``."""
    if len(xy) < 2:
        return xy
    points = [xy[:1]]
    for start, end in zip(xy[:-1], xy[1:]):
        steps = max(int(np.ceil(np.hypot(*(end - start)))), 1)
        points.append(start + (end - start) * np.linspace(0, 1, steps + 1)[1:, None])
    return np.concatenate(points)


def _with_radius(xy: np.ndarray, radius: float) -> np.ndarray:
    return np.column_stack([xy, np.full(len(xy), radius)])
