"""Every legend entry's series is visible: drawn from a saved result, each figure is rendered with and
without each series its legend names; a series whose removal changes no pixel visibly (by more than
antialiasing's rounding at the edges of what covers it) is hidden under the others, as the plan's
FLOPs figure once drew "plan" exactly under "random"."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import Container

import attnlens
from attnlens.io.result_figures import draw


def _artists(handle) -> list:
    """The artists a legend handle stands for, inside the axes (a legend-only proxy, such as a patch, has none)."""
    if isinstance(handle, Container):
        parts = []
        for child in handle.get_children():
            parts += _artists(child)
        return parts
    if getattr(handle, "axes", None) is None or not handle.get_visible():
        return []
    if hasattr(handle, "get_xdata") and not len(handle.get_xdata()):  # an empty line: a legend's proxy for unlabelled lines
        return []
    return [handle]


def _rendered(figure) -> np.ndarray:
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba()).copy()


SEEN = 32  # a pixel differs visibly when a channel moves by more than this (of 255): edges blend by a few units
MIN_PIXELS = 4  # and a series shows where at least this many do


def hidden_series(figure) -> list[str]:
    """The legend labels of ``figure`` whose series change no pixel visibly, in their own axes, when
    hidden. A label the axes of a grid share is hidden in all of them at once (one render per label)
    and judged in each axes' own box."""
    entries: dict[str, list] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if _artists(handle):
                entries.setdefault(label, []).append((ax, _artists(handle)))
    if not entries:
        return []
    figure.set_dpi(60)
    base, hidden = _rendered(figure), []
    figure.set_layout_engine("none")  # the layout the first render solved stays: each render after it only draws
    height = base.shape[0]
    for label, places in entries.items():
        for _, artists in places:
            for artist in artists:
                artist.set_visible(False)
        changed = np.abs(_rendered(figure).astype(int) - base.astype(int)).max(-1) > SEEN
        for ax, artists in places:
            box = ax.get_window_extent()  # pixels from the bottom left; the image's rows run from the top
            rows = slice(max(int(height - box.y1), 0), int(height - box.y0) + 1)
            if changed[rows, max(int(box.x0), 0) : int(box.x1) + 1].sum() < MIN_PIXELS:
                hidden.append(label)
            for artist in artists:
                artist.set_visible(True)
    return hidden


def test_a_series_drawn_under_another_is_found():
    """The check itself: two identical lines, one hidden under the other."""
    figure, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="below")
    ax.plot([0, 1], [0, 1], label="above", lw=4)
    ax.plot([0, 1], [1, 0], label="apart")
    ax.legend()
    assert hidden_series(figure) == ["below"]
    plt.close(figure)


@pytest.mark.slow
def test_every_legend_entry_of_every_report_figure_is_visible(quick_report):
    report = attnlens.load_result(quick_report)
    hidden = {}
    for key in report.meta["results"]:
        for name, figure in draw(report.result(key)):
            found = hidden_series(figure)
            if found:
                hidden[f"{key}/{name}"] = found
            plt.close(figure)
    assert hidden == {}, f"series hidden under others: {hidden}"
