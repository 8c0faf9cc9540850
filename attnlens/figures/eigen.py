"""Figures of eigen results: spectra against the Gaussian baseline, cumulative energy; a line per layer,
named in the legend up to :data:`~attnlens.figures.style.LEGEND_LAYERS` layers and by a colour bar above.

>>> import attnlens
>>> from attnlens.figures.eigen import plot_spectra
>>> result = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=16, layers=[0, 1], progress=False)
>>> ax = plot_spectra(result)
>>> ax.get_yscale()
'log'
"""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib.pyplot as plt
import numpy as np

from .style import LEGEND_LAYERS, figure_of, layer_colourbar, layer_colours, new_axes

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
    named = _name_layers(ax, result.meta["layers"])
    for colour, layer, spectrum, base in zip(layer_colours(len(values)), result.meta["layers"], values, baseline):
        positive = spectrum > 0
        ax.plot(components[positive], spectrum[positive], color=colour, lw=1.6, label=f"layer {layer}" if named else None)
        ax.plot(components[base > 0], base[base > 0], color=colour, lw=1, ls="--", alpha=0.7)
    ax.plot([], [], color="grey", ls="--", label="baseline (Gaussian,\nmatched variances)")
    _note_isolated_last(ax, result, q)
    ax.set_yscale("log")
    ax.set_xlabel("component (descending eigenvalue)")
    ax.set_ylabel("eigenvalue (variance, score²)" if result.meta["settings"]["quantity"] == "scores" else "eigenvalue (variance)")
    ax.set_title(f"Spectra of {QUANTITY_LABELS[result.meta['settings']['quantity']]}\n({_describe(result)})", fontsize=10)
    ax.legend(fontsize=8, ncol=2 if named and len(values) > 6 else 1)
    return ax


def _name_layers(ax: plt.Axes, layers: list[int]) -> bool:
    """Whether each layer's line has its legend entry (up to :data:`LEGEND_LAYERS` layers); above, a colour
    bar names the layers instead, so the figure's size and its legend do not grow with the model's depth."""
    if len(layers) <= LEGEND_LAYERS:
        return True
    layer_colourbar(ax, layers)
    return False


# The note on isolated last eigenvalues lists at most this many layers (their rows in the table list them all).
NOTED_LAYERS = 4


def _note_isolated_last(ax: plt.Axes, result, q: int) -> None:
    """Say what a layer's last eigenvalue is when it falls far below the one before it (the
    table's ``last_*`` columns): the keys its direction loads on, with opposite signs (−, the
    scores to the two keys differ by a near-constant in every row) or equal (+), and its
    share along the all-ones direction; an arrow points at each such eigenvalue."""
    table = result.table
    if "last_isolated" not in table:
        return
    queries = result.meta["settings"]["queries"]
    query = -1 if queries is None else queries[q]
    rows = table[(table["level"] == "layer") & (table["query"] == query) & (table["last_isolated"] == True)]  # noqa: E712
    if rows.empty:
        return
    more = len(rows) - NOTED_LAYERS
    rows = rows.iloc[:NOTED_LAYERS]
    names = result.meta.get("fixed_tokens", {})
    key = lambda position: f"{position} {names[str(position)]}" if str(position) in names else str(position)
    lines = [
        f"L{row.layer}: last eigenvalue {row.last_eigenvalue:.1e}, {row.last_gap:.0e} × the one before:\n"
        f"   {row.last_keys_share:.0%} on keys {key(row.last_key_a)} {'−' if row.last_keys_sign < 0 else '+'} "
        f"{key(row.last_key_b)}, {row.last_ones:.0%} on all-ones"
        for row in rows.itertuples()
    ]
    if more > 0:
        lines.append(f"and {more} more layers (the table's last_* columns)")
    if (rows["last_keys_sign"] < 0).any():
        lines.append("a − b: the scores to keys a and b differ\nby a near-constant in every row")
    box = ax.annotate("\n".join(lines), (0.97, 0.2), xycoords="axes fraction", ha="right", va="bottom", ma="left", fontsize=6.5,
                      bbox={"boxstyle": "round", "fc": "white", "ec": "0.7", "alpha": 0.9})  # fmt: skip
    values = result.arrays["layer_eigenvalues"][:, 0, q]
    for row in rows.itertuples():
        if row.last_eigenvalue <= 0:  # not on the log axis
            continue
        spectrum = values[result.meta["layers"].index(row.layer)]
        component = int(np.abs(spectrum - row.last_eigenvalue).argmin())  # where the table's eigenvalue is drawn
        ax.annotate("", (component + 1, spectrum[component]), xytext=(0.97, 0.0), textcoords=box,
                    arrowprops={"arrowstyle": "->", "lw": 0.7, "color": "0.3"})  # fmt: skip


def plot_energy(result, ax: plt.Axes | None = None, *, query: int | None = None) -> plt.Axes:
    """Cumulative explained energy against number of components, per layer, baseline dashed."""
    ax = new_axes(ax)
    q = _query_position(result, query)
    values = np.clip(result.arrays["layer_eigenvalues"][:, 0, q], 0, None)
    baseline = np.clip(result.arrays["layer_baseline"][:, 0, q], 0, None)
    components = np.arange(0, values.shape[-1] + 1)
    named = _name_layers(ax, result.meta["layers"])
    for colour, layer, spectrum, base in zip(layer_colours(len(values)), result.meta["layers"], values, baseline):
        ax.plot(components, np.r_[0, np.cumsum(spectrum)] / max(spectrum.sum(), 1e-300), color=colour, lw=1.6,
                label=f"layer {layer}" if named else None)  # fmt: skip
        ax.plot(components, np.r_[0, np.cumsum(base)] / max(base.sum(), 1e-300), color=colour, lw=1, ls="--", alpha=0.7)
    ax.plot([], [], color="grey", ls="--", label="baseline")
    ax.axhline(0.9, color="black", lw=0.8, ls=":")
    ax.text(values.shape[-1], 0.9, "90% ", ha="right", va="bottom", fontsize=8)
    ax.set_xlim(0, values.shape[-1])
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("number of components")
    ax.set_ylabel("fraction of variance explained")
    ax.set_title(
        f"Cumulative energy of {QUANTITY_LABELS[result.meta['settings']['quantity']]}\n({_describe(result)})", fontsize=10
    )
    ax.legend(fontsize=8, loc="lower right", ncol=2 if named and len(values) > 6 else 1)
    return ax


def draw(result) -> Iterator[tuple[str, plt.Figure]]:
    """The figures of an eigen result: ``spectra`` (main) and ``energy``."""
    yield "spectra", figure_of(plot_spectra(result))
    yield "energy", figure_of(plot_energy(result))
