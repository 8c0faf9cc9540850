"""Figures of reconstruction results: error and fidelity against k and against FLOPs saved.

>>> import attnlens
>>> from attnlens.figures.reconstruct import plot_error_vs_k
>>> result = attnlens.reconstruct("minilm-l6", seq_len=16, num_seqs=40, ks=[2, 8], layers=[0],
...                               scopes=["head"], progress=False)
>>> plot_error_vs_k(result).get_xscale()
'log'
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt

from .style import figure_of, new_axes, task_describe, task_references

SCOPE_STYLES = {"head": "-", "layer": "--", "all": ":"}
METRIC_LABELS = {
    "rel_error": "relative error ‖s − ŝ‖² / ‖s − mean‖²",
    "rel_error_zero": "relative error ‖s − ŝ‖² / ‖s‖²",
    "tv": "total variation between weights (per row)",
    "kl": "KL(w ‖ ŵ) per row (nats)",
}


def _strategy_colours(strategies) -> dict[str, tuple]:
    import seaborn as sns

    palette = sns.color_palette("deep", len(strategies))
    return dict(zip(strategies, palette))


def _strategy_line(ax, x, y, colour, strategy: str, scope: str) -> None:
    """One line per (strategy, scope): colour by strategy, line style by scope."""
    ax.plot(x, y, marker="o", ms=3, color=colour, ls=SCOPE_STYLES.get(scope, "-"), label=f"{strategy}, {scope}")


def _band(ax, x, group, metric: str, colour) -> bool:
    """The 95% interval of ``metric`` (columns ``metric_low``, ``metric_high``) as a light band
    behind its line; returns whether the table has intervals (results made before them have none)."""
    if f"{metric}_low" not in group:
        return False
    ax.fill_between(x, group[f"{metric}_low"], group[f"{metric}_high"], color=colour, alpha=0.15, lw=0)
    return True


def _k_label(overall) -> str:
    """The k axis' label; pairs mode's meaning of k only where pairs mode was run."""
    if (overall.strategy == "greedy-pairs").any():
        return "k (exact scores per row; greedy-pairs: k·n pairs per matrix)"
    return "k (exact scores per row)"


def _k_axis(ax: plt.Axes, ks) -> None:
    """Log-2 k axis labelled with the k values themselves (1, 2, 4, ...), not powers; ``ks``
    are the k values plotted, so that every tick has points above it."""
    ax.set_xscale("log", base=2)
    ks = sorted(set(int(k) for k in ks))
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()


def layers_said(layers: str | int) -> str:
    """The plug-in table's ``layers`` ("0 1 2 3 7") as the title says them: each, up to eight; more, with runs of
    three or more as ranges, so that a title of 80 layers stays one line.

    >>> layers_said("0 1 2 3 7"), layers_said(4), layers_said(" ".join(map(str, range(80)))), layers_said("0 1 2 4 5 6 7 8 9")
    ('0, 1, 2, 3, 7', '4', '0–79', '0–2, 4–9')
    """
    numbers = [int(part) for part in str(layers).split()]
    if len(numbers) <= 8:
        return ", ".join(map(str, numbers))
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    said = [f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return ", ".join(said)


def _title(result, what: str) -> str:
    meta = result.meta
    return f"{what}\n({meta['model']['name']}, n = {meta['n']}, {meta['settings']['rows']} rows, held-out blocks)"


def plot_error_vs_k(result, ax: plt.Axes | None = None, *, metric: str = "rel_error") -> plt.Axes:
    """Held-out error (all evaluated heads together) against k, per strategy (colour) and
    scope (line style), with its 95% interval over held-out blocks as a band. Exact
    reconstructions (error 0, e.g. k = n) have no place on a log scale and are left out;
    the title says so."""
    ax = new_axes(ax)
    overall = result.table[result.table.layer == -1]
    colours = _strategy_colours(list(dict.fromkeys(overall.strategy)))
    floor = 1e-9 * max(float(overall[metric].max()), 1e-300)
    drawn, banded = [], False
    for (strategy, scope), group in overall.groupby(["strategy", "scope"], sort=False):
        # k = n is exact: its TV is float rounding (~1e-7), which would squash the log scale.
        group = group[(group[metric] > floor) & (group.k < result.meta["n"])].sort_values("k")
        _strategy_line(ax, group.k, group[metric], colours[strategy], strategy, scope)
        banded |= _band(ax, group.k, group, metric, colours[strategy])
        drawn.extend(group.k)
    _k_axis(ax, drawn)  # ticks at the k values drawn: a left-out k = n would be an empty tick
    ax.set_yscale("log")
    ax.set_xlabel(_k_label(overall))
    ax.set_ylabel(METRIC_LABELS[metric])
    what = (
        "Total variation after softmax" if metric == "tv" else ("KL after softmax" if metric == "kl" else "Reconstruction error")
    )
    bands = ", 95% bootstrap intervals over blocks" if banded else ""
    ax.set_title(_title(result, f"{what} against k{bands}") + "\nexact points (error 0, e.g. k = n) not drawn", fontsize=10)
    ax.legend(fontsize=7, ncol=2, handlelength=3.5)  # long enough to show the dashes
    return ax


def plot_error_vs_flops(result, ax: plt.Axes | None = None, *, metric: str = "rel_error") -> plt.Axes:
    """Held-out error against the attention FLOPs saved (1 − partial / full), per strategy and scope, with 95% bands."""
    ax = new_axes(ax)
    overall = result.table[result.table.layer == -1]
    colours = _strategy_colours(list(dict.fromkeys(overall.strategy)))
    banded = False
    for (strategy, scope), group in overall.groupby(["strategy", "scope"], sort=False):
        group = group.sort_values("k")
        group = group[group[metric] > 1e-9 * max(float(overall[metric].max()), 1e-300)]
        saved = 100 * (1 - group.flops_ratio)
        _strategy_line(ax, saved, group[metric], colours[strategy], strategy, scope)
        banded |= _band(ax, saved, group, metric, colours[strategy])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("attention FLOPs saved (%; negative = more than full attention)")
    ax.set_ylabel(METRIC_LABELS[metric])
    bands = ", 95% bootstrap intervals over blocks" if banded else ""
    ax.set_title(_title(result, f"Error against compute saved{bands}"), fontsize=10)
    ax.legend(fontsize=7, ncol=2, handlelength=3.5)  # long enough to show the dashes
    return ax


def plot_fidelity_vs_k(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Plug-in: what the model's outputs keep with the reconstruction inside attention, with 95% intervals."""
    ax = new_axes(ax)
    table = result.plug_in
    objective = table.objective.iloc[0]
    metric, label = (
        ("token_cosine", "cosine to unmodified hidden states")
        if objective == "hidden"
        else ("loss_increase", f"{objective} loss increase (nats)")
    )
    colours = _strategy_colours(list(dict.fromkeys(table.strategy)))
    for (strategy, scope), group in table.groupby(["strategy", "scope"], sort=False):
        group = group.sort_values("k")
        _strategy_line(ax, group.k, group[metric], colours[strategy], strategy, scope)
        ax.fill_between(group.k, group[f"{metric}_low"], group[f"{metric}_high"], color=colours[strategy], alpha=0.12)
    _k_axis(ax, table.k)
    ax.set_xlabel("k (exact scores per row)")
    ax.set_ylabel(label)
    layers = layers_said(table.layers.iloc[0])
    ax.set_title(_title(result, f"Model outputs with reconstruction in layers {layers} (95% intervals)"), fontsize=10)
    ax.legend(fontsize=7, ncol=2, handlelength=3.5)  # long enough to show the dashes
    return ax


def plot_accuracy_vs_k(result, ax: plt.Axes | None = None) -> plt.Axes:
    """Plug-in judged by a task: held-out accuracy against k, with 95% intervals, the
    unmodified model and the majority class."""
    ax = new_axes(ax)
    table, task = result.plug_in.dropna(subset=["accuracy"]), result.meta["task"]  # strategies the task judged
    colours = _strategy_colours(list(dict.fromkeys(table.strategy)))
    for (strategy, scope), group in table.groupby(["strategy", "scope"], sort=False):
        group = group.sort_values("k")
        _strategy_line(ax, group.k, group["accuracy"], colours[strategy], strategy, scope)
        ax.fill_between(group.k, group["accuracy_low"], group["accuracy_high"], color=colours[strategy], alpha=0.12)
    task_references(ax, task)
    _k_axis(ax, table.k)
    ax.set_xlabel("k (exact scores per row)")
    ax.set_ylabel("held-out accuracy")
    layers = layers_said(table.layers.iloc[0])
    ax.set_title(
        f"Task accuracy with reconstruction in layers {layers} (95% intervals)\n{task_describe(result.meta)}", fontsize=10
    )
    ax.legend(fontsize=7, ncol=2, handlelength=3.5)
    return ax


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """``error_vs_k`` (main), ``tv_vs_k``, ``error_vs_flops``, ``fidelity_vs_k`` when there is a
    plug-in table, and ``accuracy_vs_k`` when a task judged it."""
    yield "error_vs_k", figure_of(plot_error_vs_k(result))
    yield "tv_vs_k", figure_of(plot_error_vs_k(result, metric="tv"))
    yield "error_vs_flops", figure_of(plot_error_vs_flops(result))
    if result.plug_in is not None and len(result.plug_in):
        yield "fidelity_vs_k", figure_of(plot_fidelity_vs_k(result))
        if "accuracy" in result.plug_in:
            yield "accuracy_vs_k", figure_of(plot_accuracy_vs_k(result))
