"""Figures of a sinks result: each head's first-token weight on the layers × heads grid, the share of sink heads
by layer, and the heavy hitters' mass against the share of keys kept. Their size does not grow with the model:
one map, one bar per layer, one curve.

>>> from attnlens.analysis.sinks import sinks
>>> from attnlens.figures.sinks import plot_first_weight
>>> result = sinks("minilm-l3", num_seqs=4, seq_len=32, progress=False)
>>> ax = plot_first_weight(result)
>>> ax.get_xlabel()
'head'
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np

from .style import figure_of, heatmap, new_axes


def _describe(result) -> str:
    s = result.settings
    return f"{result.model_name}, n = {s['seq_len']}, {s['num_seqs']} blocks"


def _head_map(ax: plt.Axes, heads, column: str, cmap: str, label: str, marked, said: str, vmax: float | None = None) -> None:
    """``column`` of every head on the layers × heads grid, the ``marked`` heads dotted (``said`` in the legend)."""
    heatmap(ax, heads.pivot(index="layer", columns="head", values=column), cmap, label, vmin=0, vmax=vmax)
    ax.scatter(marked["head"] + 0.5, marked["layer"] + 0.5, s=6, color="white", edgecolors="black", linewidths=0.4, label=said)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if len(marked):
        ax.legend(fontsize=7, loc="upper right", framealpha=0.8)


def plot_first_weight(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Each head's mean weight on the first token (Gu et al.'s α), layers down, heads across; the heads above
    ε (sink heads) are dotted."""
    ax = new_axes(ax)
    heads = result.tables["heads"]
    sink, said = heads[heads["sink"].astype(bool)], f"sink head (α > {result.settings['epsilon']:g})"
    _head_map(ax, heads, "first_weight", "rocket_r", "mean weight on the first token (α)", sink, said, vmax=1)
    ax.set_title(f"First-token weight per head\n({_describe(result)})", fontsize=10)
    return ax


def plot_sink_share(result, ax: plt.Axes | None = None) -> plt.Axes:
    """The share of sink heads in each layer, with its 95% interval over blocks."""
    ax = new_axes(ax)
    layers = result.tables["layers"]
    share = layers["sink_share"].to_numpy()
    below = np.clip(share - layers["sink_share_low"].to_numpy(), 0, None)
    above = np.clip(layers["sink_share_high"].to_numpy() - share, 0, None)
    ax.bar(layers["layer"], share, color="#8c2d04", alpha=0.8, yerr=[below, above], capsize=2, ecolor="black")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"share of heads with α > {result.settings['epsilon']:g}")
    ax.set_title(f"Sink heads by layer (Gu et al.'s definition)\n({_describe(result)})", fontsize=10)
    return ax


def plot_heavy_hitters(result, ax: plt.Axes | None = None) -> plt.Axes:
    """The weight mass a row's top keys hold against the share of keys kept: the heads' median with their
    quartiles, and the mean over heads; beside them, what uniform attention over the same rows would give."""
    ax = new_axes(ax)
    curve = result.tables["curve"]
    x = 100 * curve["fraction"]
    ax.fill_between(x, curve["q1"], curve["q3"], color="#4c72b0", alpha=0.25, label="heads' quartiles")
    ax.plot(x, curve["median"], "o-", color="#4c72b0", label="median head")
    ax.plot(x, curve["mass"], "s--", color="#55a868", ms=4, label="mean over heads")
    if "uniform" in curve:  # results saved before it was kept have none
        ax.plot(x, curve["uniform"], ":", color="grey", label="uniform attention")
    ax.set_xscale("log")
    ax.set_xticks(list(x), [f"{value:g}" for value in x])
    ax.minorticks_off()
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("share of a row's keys kept, largest weights first (%)")
    ax.set_ylabel("weight mass they hold")
    rows = f"rows of at least {result.settings['min_keys']} keys"
    ax.set_title(f"Heavy hitters: mass of the top keys\n({_describe(result)}; {rows})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def plot_far_heads(result, ax: plt.Axes | None = None) -> plt.Axes:
    """What restricting each head alone to the first 4 keys and a recent window costs the next-token loss, layers
    down, heads across; the heads whose interval lies above the margin (they look far) are dotted."""
    ax = new_axes(ax)
    heads, s = result.tables["heads"], result.settings
    far, said = heads[heads["looks"] == "far"], f"looks far (> {s['far_margin']:g} nats)"
    _head_map(ax, heads, "far_cost", "mako_r", "Δ next-token loss, nats", far, said)
    most = s.get("far_max_seqs", s["far_seqs"])
    blocks = f"{s['far_seqs']} blocks" if most == s["far_seqs"] else f"{s['far_seqs']}–{most} blocks"
    measured = f"{result.model_name}, n = {s['seq_len']}, {blocks}"
    ax.set_title(f"Each head alone kept to the first 4 and {s['window']} recent keys\n({measured})", fontsize=10)
    return ax


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """The figures of a sinks result: ``first_weight`` (main), ``sink_share``, ``heavy_hitters`` and, where the heads
    were restricted one by one, ``far_heads``."""
    yield "first_weight", figure_of(plot_first_weight(result))
    yield "sink_share", figure_of(plot_sink_share(result))
    yield "heavy_hitters", figure_of(plot_heavy_hitters(result))
    if "far_cost" in result.tables["heads"]:
        yield "far_heads", figure_of(plot_far_heads(result))
