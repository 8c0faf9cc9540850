"""How the report says a number: one rounding for every number it prints, accuracy changes in
points with the sign of the change (changed − unmodified), intervals, and the few facts of the
results that the claims and the sections both read."""

from __future__ import annotations

import pandas as pd

from attnlens.analysis.dam.result import polished
from attnlens.analysis.sequential import FIRST_LOOK

# A task interval over fewer held-out examples than the sequential design's first look is too rough
# to mean anything (a rare flip's normal approximation): the report says "too few examples" instead.
TOO_FEW = FIRST_LOOK

# The unit of a change of each objective.
LOSS_UNITS = {"hidden": "1 − cosine", "clm": "nats of next-token loss", "mlm": "nats of masked-token loss"}


def number(value: float, digits: int = 2, *, sign: bool = False, percent: bool = False, significant: bool = False) -> str:
    """Every number the report prints, rounded one way: ``digits`` decimals (of the percentage with
    ``percent``), or ``digits`` significant digits; ``sign`` prints + too.

    >>> number(0.23849), number(0.0116, 3, sign=True, significant=True), number(0.9123, 1, percent=True)
    ('0.24', '+0.0116', '91.2%')
    """
    value = float(value)
    if percent:
        return f"{100 * value:{'+' if sign else ''}.{digits}f}%"
    spec = f"{'+' if sign else ''}{'#' if significant else ''}.{digits}{'g' if significant else 'f'}"  # '#': keep trailing zeros
    return f"{value:{spec}}"


def counted(value: float, noun: str, plural: str | None = None) -> str:
    """``1 point``, ``2 points``, ``0.5 points``: a number with its noun agreeing.

    >>> counted(1, "point"), counted(0.5, "point"), counted(3, "mask")
    ('1 point', '0.5 points', '3 masks')
    """
    return f"{value:g} {noun if value == 1 else plural or noun + 's'}"


def interval(row: pd.Series, prefix: str = "delta") -> str:
    """``+0.012 [+0.010, +0.014]``: a mean and its 95% interval, three significant digits.

    >>> interval(pd.Series({"delta": 0.0123, "delta_low": 0.0101, "delta_high": 0.0144}))
    '+0.0123 [+0.0101, +0.0144]'
    """
    values = (number(row[name], 3, sign=True, significant=True) for name in (prefix, f"{prefix}_low", f"{prefix}_high"))
    return "{} [{}, {}]".format(*values)


def points(row: pd.Series, prefix: str = "delta_accuracy") -> str:
    """A change of accuracy in points with its interval, ``−0.9 [−2.9, +1.0]`` (changed − unmodified:
    below zero the change loses accuracy), or "too few examples (n = 64)" where the judgement rests
    on fewer examples than an interval needs.

    >>> points(pd.Series({"delta_accuracy": -0.009, "delta_accuracy_low": -0.029, "delta_accuracy_high": 0.01, "held_out": 900}))
    '−0.9 [−2.9, +1.0]'
    >>> points(pd.Series({"delta_accuracy": 0.0, "delta_accuracy_low": 0.0, "delta_accuracy_high": 0.0, "held_out": 64}))
    'too few examples (n = 64)'
    """
    held = row.get("held_out", TOO_FEW)
    if held == held and held < TOO_FEW:  # held == held: not NaN
        return f"too few examples (n = {int(held)})"
    values = [100 * row[f"{prefix}{end}"] + 0.0 for end in ("", "_low", "_high")]  # + 0.0: no "−0.0"
    return "{:+.1f} [{:+.1f}, {:+.1f}]".format(*values).replace("-", "−")


def delta_points(row: pd.Series, prefix: str = "delta_accuracy") -> str:
    """``Δ −0.9 points [−2.9, +1.0]``: :func:`points` as a verdict states it.

    >>> delta_points(pd.Series({"delta_accuracy": -0.009, "delta_accuracy_low": -0.029, "delta_accuracy_high": 0.01}))
    'Δ −0.9 points [−2.9, +1.0]'
    """
    said = points(row, prefix)
    return said if said.startswith("too few") else said.replace(" [", " points [", 1).join(["Δ ", ""])


def task_meta(results: dict) -> dict | None:
    """The report's main task, the one that judged the position classes (or the first any stage used), if any."""
    tasks = task_metas(results)
    main = results["importance"].meta.get("task") if "importance" in results else None
    return main or next(iter(tasks.values()), None)


def task_metas(results: dict) -> dict[str, dict]:
    """Every task that judged a stage's changes, by name, in the order the stages ran (the main task
    and the savings task, where they differ); ``"stages"`` adds the results each judged."""
    found: dict[str, dict] = {}
    for key, result in results.items():
        task = result.meta.get("task")
        if task:
            found.setdefault(task["task"], {**task, "stages": []})["stages"].append(key)
    return found


def layer_summary(eigen_result) -> pd.DataFrame:
    """Per layer: components for 90% energy of single heads (median, min, max over heads), the
    Gaussian baseline's, and of the heads pooled."""
    table = eigen_result.table
    heads = table[(table["level"] == "head") & (table["query"] == table["query"].max())]
    per_layer = heads.groupby("layer").agg(
        head_k90_median=("k90", "median"),
        head_k90_min=("k90", "min"),
        head_k90_max=("k90", "max"),
        baseline_k90=("baseline_k90", "median"),
        head_effective_rank=("effective_rank", "median"),
        ones_fraction=("ones_fraction", "median"),
    )
    pooled = table[(table["level"] == "layer") & (table["query"] == table["query"].max())]
    layers = pooled.set_index("layer")[["k90", "k95", "k99"]].add_prefix("pooled_")
    return per_layer.join(layers).reset_index()


def steps(row: pd.Series) -> str:
    """How a DAM run ended: "schedule annealed in 212 steps, converged" (the check found nothing better)
    or "schedule capped at 300 steps, not converged" (its loss still fell); a polished run adds the
    swap search's end: "..., then 6 swaps to a local optimum"."""
    ended = "annealed in" if row.get("schedule_end") == "annealed" else "capped at"
    said = f"schedule {ended} {int(row['steps'])} steps"
    if polished(row):
        relaxed = "settled" if bool(row["relaxed_converged"]) else "not settled"  # the verdict word is the search's
        ending = "a local optimum" if bool(row["converged"]) else "its round cap, not converged"
        return f"{said} ({relaxed}), then {int(row['polish_swaps'])} swaps to {ending}"
    return f"{said}, {'converged' if bool(row['converged']) else 'not converged'}"
