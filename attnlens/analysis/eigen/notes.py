"""What an eigen result says in words beside its table: windowed layers, the tokens fixed in every block,
and what a layer's isolated last eigenvalue is."""

from __future__ import annotations

import numpy as np
import pandas as pd


def windowed_layers(table: pd.DataFrame, n: int) -> dict[str, int]:
    """``{layer: keys}`` of the layers whose pooled rows see fewer than n keys: windowed layers
    (a sliding or local window shorter than n), whose rows are the windows, end-aligned."""
    pooled = table[(table["level"] == "layer") & (table["query"] == -1) & (table["num_keys"] < n)]
    return {str(int(row.layer)): int(row.num_keys) for row in pooled.itertuples()}


def window_notes(windows: dict[str, int], n: int, causal: bool) -> dict[str, str]:
    """What a windowed layer's rows are, in words (one note for all of them)."""
    if not windows:
        return {}
    widths = sorted(set(windows.values()))
    frame = (
        "the offset of each key from its query, as in every layer of a causal model"
        if causal
        else "the offset of each key from the window's end, not its position in the block (full layers' rows are in "
        "block positions, so the model level pools two frames)"
    )
    return {
        "windowed layers": f"layers {', '.join(windows)} see windows of {'/'.join(map(str, widths))} of the {n} keys: their "
        f"rows are the keys each query sees, on the last key coordinates; a coordinate is {frame}"
    }


def fixed_tokens(rows) -> dict[str, str]:
    """Key positions that hold the same token in every analysed block (the special tokens a
    block is packed with, e.g. ``[CLS]`` at 0 and ``[SEP]`` last), keyed by position, where
    the source can name tokens (a model; a store keeps ids only)."""
    tokenizer = getattr(getattr(rows, "model", None), "tokenizer", None)
    if tokenizer is None or rows.num_seqs < 2:
        return {}
    ids = np.asarray(rows.tokens(np.arange(rows.num_seqs)))
    fixed = np.flatnonzero((ids == ids[:1]).all(0))
    return {str(position): str(token) for position, token in zip(fixed, tokenizer.convert_ids_to_tokens(ids[0, fixed].tolist()))}


def last_direction_notes(
    table: pd.DataFrame, positions: dict[str, str] | None = None, windows: dict[str, int] | None = None
) -> dict[str, str]:
    """What each layer's isolated last eigenvalue (``last_isolated``) is, in words, from the
    table's ``last_*`` columns: the keys its direction loads on, how many of the layer's heads
    share it, and how much of it lies along the all-ones direction. Keys are named by their
    token (``positions``) except in windowed layers (``windows``), whose coordinates are offsets."""
    if "last_isolated" not in table:
        return {}
    positions, windows = positions or {}, windows or {}
    notes = {}
    last_query = table["query"].max()  # per query position: the last one (the figure's default), whose row sees every key
    layers = table[(table["level"] == "layer") & (table["query"] == last_query) & (table["last_isolated"] == True)]  # noqa: E712
    heads = table[(table["level"] == "head") & (table["last_isolated"] == True)]  # noqa: E712
    for row in layers.itertuples():
        a, b = int(row.last_key_a), int(row.last_key_b)
        named = positions if str(row.layer) not in windows else {}
        name = lambda key: f"{key} ({named[str(key)]})" if str(key) in named else str(key)
        unit = (table["level"] == "head") & (table["layer"] == row.layer) & (table["query"] == row.query)
        alike = heads[unit[heads.index] & (heads["last_key_a"] == a) & (heads["last_key_b"] == b)]
        meaning = (
            "with opposite signs: the scores to these two keys differ by nearly the same amount in every row"
            if row.last_keys_sign < 0
            else "with equal signs: the scores to these two keys nearly cancel in every row"
        )
        where = f"layer {row.layer}" + (f", query {row.query}" if row.query >= 0 else "")
        notes[where] = (
            f"last eigenvalue {row.last_eigenvalue:.2g} ({row.last_gap:.1g} of the one before it); its direction is "
            f"{row.last_keys_share:.0%} on keys {name(a)} and {name(b)} {meaning} (so in {len(alike)} of "
            f"{int(unit.sum())} heads); {row.last_ones:.0%} of it lies along the all-ones direction"
        )
    return notes
