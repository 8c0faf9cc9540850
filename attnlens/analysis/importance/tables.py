"""The tables of an importance result, from what its passes measured: mass and entropy, ablations, gradients,
the classes and the one-row-per-class summary."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.importance.passes import MassAccumulator, condition_row
from attnlens.data.positions import heavy_size


def tabulate_mass(acc: MassAccumulator, classes: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``mass`` table (layer, head, class: mass, share and their ratio) and the ``entropy`` table
    (layer, head), per query, from the unmodified pass's sums."""
    num_layers, num_heads, _ = acc.mass.shape
    mass = acc.mass / acc.rows[:, None, None]
    share = acc.share / acc.rows[:, None]
    layer, head, cls = np.meshgrid(np.arange(num_layers), np.arange(num_heads), np.arange(len(classes)), indexing="ij")
    mass_table = pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "class": np.asarray(classes)[cls.ravel()],
            "mass": mass.ravel(),
            "share": share[layer.ravel(), cls.ravel()],
        }
    )
    mass_table["lift"] = mass_table["mass"] / mass_table["share"]
    layer2, head2 = np.meshgrid(np.arange(num_layers), np.arange(num_heads), indexing="ij")
    entropy_table = pd.DataFrame(
        {
            "layer": layer2.ravel(),
            "head": head2.ravel(),
            "entropy": (acc.entropy / acc.rows[:, None]).ravel(),
            "uniform_entropy": (acc.uniform_entropy / acc.rows)[layer2.ravel()],
        }
    )
    return mass_table, entropy_table


def tabulate_ablations(conditions, losses, pooled, removed, spared, bootstrap, seed) -> pd.DataFrame:
    delta = losses - losses[0]
    mean, low, high = bootstrap_interval(delta, bootstrap, seed)
    table = pd.DataFrame([condition_row(condition) for condition in conditions])
    table["removed"] = np.where(removed[:, 1] > 0, removed[:, 0] / np.maximum(removed[:, 1], 1), 0.0)
    table["rows_spared"] = np.where(spared[:, 1] > 0, spared[:, 0] / np.maximum(spared[:, 1], 1), np.nan)
    if pooled is None:  # hidden (the one with pooled cosines): its unmodified loss is 0, so loss would repeat delta
        table["loss"] = losses.mean(1)
    table["delta"], table["delta_low"], table["delta_high"] = mean, low, high
    if pooled is not None:
        table["pooled_cosine"], table["pooled_cosine_low"], table["pooled_cosine_high"] = bootstrap_interval(
            pooled, bootstrap, seed
        )
    # class minus its random control, paired over blocks (random rows follow their class rows)
    excess = np.full((3, len(conditions)), np.nan)
    is_class = (table["control"] == "class").to_numpy()
    index = np.flatnonzero(is_class)
    if len(index):
        excess[:, index] = np.stack(bootstrap_interval(delta[index] - delta[index + 1], bootstrap, seed))
        # the control spares the same rows: it removes as many positions, and none where the class removes none
        table.loc[index + 1, "rows_spared"] = table.loc[index, "rows_spared"].to_numpy()
    table["excess"], table["excess_low"], table["excess_high"] = excess
    return table


GRADIENT_COLUMNS = ["level", "layer", "head", "class", "importance", "importance_low", "importance_high", "signed"]


def tabulate_gradients(gradients: np.ndarray, classes: tuple[str, ...], bootstrap: int, seed: int) -> pd.DataFrame:
    names = [*classes, "all"]
    frames = []
    num_blocks, num_layers, num_heads, _ = gradients.shape
    levels = {
        "model": (gradients.sum((1, 2))[:, None, None], [-1], [-1]),
        "layer": (gradients.sum(2)[:, :, None], range(num_layers), [-1]),
        "head": (gradients, range(num_layers), range(num_heads)),
    }
    for level, (values, layers, heads) in levels.items():
        values = np.moveaxis(values, 0, -1)  # (layer, head, class, block)
        mean, low, high = bootstrap_interval(np.abs(values), bootstrap, seed)
        layer, head, cls = np.meshgrid(list(layers), list(heads), np.arange(len(names)), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "level": level,
                    "layer": layer.ravel(),
                    "head": head.ravel(),
                    "class": np.asarray(names, dtype=object)[cls.ravel()],
                    "importance": mean.ravel(),
                    "importance_low": low.ravel(),
                    "importance_high": high.ravel(),
                    "signed": values.mean(-1).ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def tabulate_classes(classes, counts, mass_table, roles, notes) -> pd.DataFrame:
    share = mass_table.groupby("class")["share"].mean()
    definitions = {
        "self": "j = i",
        "prev": "j = i - 1",
        "next": "j = i + 1",
        "other": "none of the other classes measured",
        **{role: f"key is {text}" for role, text in roles.items()},
    }
    rows = []
    for name in classes:
        rows.append(
            {
                "class": name,
                "definition": definitions.get(name, _sized_definition(name)),
                "occurs": name not in notes,
                "positions": counts.get(name, 0),
                "share": share.get(name, np.nan),
                "note": notes.get(name, ""),
            }
        )
    return pd.DataFrame(rows)


def _sized_definition(name: str) -> str:
    """What a class with a size (``band(w)``, ``sink(s)``) holds."""
    if name.startswith("band"):
        return "0 < |i - j| <= w"
    if name.startswith("sink"):
        return "j = 0: the block's first key" if name == "sink" else "j < s: the block's first s keys"
    if name.startswith("heavy"):
        return f"each row's {heavy_size(name)} keys of largest score, per layer and head, among those no other class holds"
    return ""


def tabulate_summary(classes, dropped, notes, mass_table, ablation, gradient) -> pd.DataFrame:
    rows = []
    model_rows = ablation[ablation["scope"] == "model"]
    grad_rows = gradient[gradient["level"] == "model"].set_index("class") if len(gradient) else None
    for name in classes:
        mass = mass_table[mass_table["class"] == name]
        row = {
            "class": name,
            "occurs": True,
            "share": mass["share"].mean(),
            "mass": mass["mass"].mean(),
            "mass_max": mass["mass"].max(),
        }
        for control, prefix in (("class", "delta"), ("random", "random")):
            picked = model_rows[(model_rows["class"] == name) & (model_rows["control"] == control)].iloc[0]
            row[prefix], row[f"{prefix}_low"], row[f"{prefix}_high"] = picked["delta"], picked["delta_low"], picked["delta_high"]
            if "pooled_cosine" in picked:
                row["pooled_cosine" if control == "class" else "random_pooled_cosine"] = picked["pooled_cosine"]
            if control == "class":
                row["removed"] = picked["removed"]
                row["excess"], row["excess_low"], row["excess_high"] = (
                    picked["excess"],
                    picked["excess_low"],
                    picked["excess_high"],
                )
        if grad_rows is not None and name in grad_rows.index:
            picked = grad_rows.loc[name]
            row["gradient"], row["gradient_low"], row["gradient_high"] = (
                picked["importance"],
                picked["importance_low"],
                picked["importance_high"],
            )
        row["note"] = ""
        rows.append(row)
    for name in dropped:
        rows.append({"class": name, "occurs": False, "note": notes[name]})
    return pd.DataFrame(rows)
