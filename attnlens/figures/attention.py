"""Figures of single attention matrices: one head's scores or weights over the tokens of a block.

>>> import numpy as np
>>> from attnlens.figures.attention import plot_attention
>>> ax = plot_attention(np.eye(3), tokens=["[CLS]", "hi", "[SEP]"], kind="weights")
>>> ax.get_xlabel()
'key'
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import new_axes

LABELS = {"scores": ("pre-softmax score", "RdBu_r"), "weights": ("attention weight", "viridis")}


def plot_attention(
    matrix: np.ndarray,
    ax: plt.Axes | None = None,
    *,
    tokens: list[str] | None = None,
    valid: np.ndarray | None = None,
    kind: str = "scores",
    title: str | None = None,
) -> plt.Axes:
    """Heatmap of one (query × key) matrix; invalid entries are left blank.

    Scores get a diverging colour scale centred on 0, weights a sequential one from 0.
    """
    ax = new_axes(ax, size=(6.2, 5.4))
    label, colours = LABELS[kind]
    shown = np.ma.masked_array(np.asarray(matrix, dtype=float), mask=False if valid is None else ~np.asarray(valid, bool))
    if kind == "scores":
        limit = float(np.abs(shown).max()) or 1.0
        image = ax.imshow(shown, cmap=colours, vmin=-limit, vmax=limit, interpolation="nearest")
    else:
        image = ax.imshow(shown, cmap=colours, vmin=0, interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, shrink=0.8, label=label)
    if tokens is not None and len(tokens) <= 40:
        ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
    ax.grid(False)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title or f"Attention {label}s", fontsize=10)
    return ax
