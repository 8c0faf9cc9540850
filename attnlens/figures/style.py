"""The shared look of attnlens figures, and saving them as PNG and PDF."""

from __future__ import annotations

from pathlib import Path

# No backend is forced: without a display matplotlib falls back to Agg by itself, and in
# Jupyter the inline backend shows the figures.
import matplotlib.pyplot as plt
import seaborn as sns

FORMATS = ("png", "pdf")


def apply_style() -> None:
    sns.set_theme(context="notebook", style="whitegrid", palette="deep", font_scale=0.9)


def new_axes(ax: plt.Axes | None, size: tuple[float, float] = (6.4, 4.2)) -> plt.Axes:
    """The given Axes, or a fresh one on a new figure."""
    if ax is not None:
        return ax
    apply_style()
    return plt.subplots(figsize=size, layout="constrained")[1]


def save_figure(figure: plt.Figure, stem: str | Path) -> list[Path]:
    """Write ``stem.png`` and ``stem.pdf``; close the figure."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in FORMATS:
        path = stem.with_suffix(f".{suffix}")
        figure.savefig(path, dpi=150)
        paths.append(path)
    plt.close(figure)
    return paths


def layer_colours(count: int) -> list:
    return sns.color_palette("viridis", count)
