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


def task_references(ax: plt.Axes, task: dict) -> None:
    """The unmodified model's accuracy and the majority-class baseline as horizontal lines."""
    ax.axhline(task["unmodified_accuracy"], color="grey", ls="--", lw=1, label="unmodified model")
    ax.axhline(task["majority_accuracy"], color="grey", ls=":", lw=1, label="majority class")


def task_describe(meta: dict) -> str:
    """``minilm-l6 on rotten-tomatoes (probe), 512 held-out examples``: the second line of a task figure's title."""
    task = meta["task"]
    return f"{meta['model']['name']} on {task['task']} ({task['protocol']}), {len(task['held_out_rows'])} held-out examples"
