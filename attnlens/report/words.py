"""How the report says a number: one rounding for every number it prints, accuracy changes in
points with the sign of the change (changed − unmodified), intervals, and how a DAM run ended."""

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


def too_few(row: pd.Series, examples: str | None = "held_out") -> int | None:
    """The examples a judgement rests on where they are fewer than an interval needs (else ``None``)."""
    held = TOO_FEW if examples is None else row.get(examples, TOO_FEW)
    return int(held) if held == held and held < TOO_FEW else None  # held == held: not NaN


def points(row: pd.Series, prefix: str = "delta_accuracy", examples: str | None = "held_out") -> str:
    """A change of accuracy in points with its interval, ``−0.9 [−2.9, +1.0]`` (changed − unmodified:
    below zero the change loses accuracy), or "too few examples (n = 64)" where the judgement rests
    on fewer examples (the row's ``examples`` column; ``None``: not counted in examples) than an
    interval needs.

    >>> points(pd.Series({"delta_accuracy": -0.009, "delta_accuracy_low": -0.029, "delta_accuracy_high": 0.01, "held_out": 900}))
    '−0.9 [−2.9, +1.0]'
    >>> points(pd.Series({"delta_accuracy": 0.0, "delta_accuracy_low": 0.0, "delta_accuracy_high": 0.0, "held_out": 64}))
    'too few examples (n = 64)'
    """
    held = too_few(row, examples)
    if held is not None:
        return f"too few examples (n = {held})"
    values = [100 * row[f"{prefix}{end}"] + 0.0 for end in ("", "_low", "_high")]  # + 0.0: no "−0.0"
    return "{:+.1f} [{:+.1f}, {:+.1f}]".format(*values).replace("-", "−")


def delta_points(row: pd.Series, prefix: str = "delta_accuracy", examples: str | None = "held_out") -> str:
    """``Δ −0.9 points [−2.9, +1.0]``: :func:`points` as a verdict states it.

    >>> delta_points(pd.Series({"delta_accuracy": -0.009, "delta_accuracy_low": -0.029, "delta_accuracy_high": 0.01}))
    'Δ −0.9 points [−2.9, +1.0]'
    """
    said = points(row, prefix, examples)
    return said if too_few(row, examples) is not None else "Δ " + said.replace(" [", " points [", 1)


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
