"""Results written by earlier versions of attnlens, read as this version writes them.

Earlier versions kept two facts as text that the report now reads as data; a saved result is
converted as it loads (:func:`upgraded`), so every result ever written still loads, and its claims
read the same numbers:

- fine-tuned with several seeds, each seed's accuracy was one space-separated column,
  ``seed_accuracies`` (``joint_seed_accuracies`` for maps trained with the weights); now a column
  per seed, ``seed_accuracy_0``, ``seed_accuracy_1``, …;
- a plan's methods said what they are only in their ``detail`` label ("step 12 of the path",
  "uniform partial(16)", "none meets: exact"); now in ``form`` (and ``choice``, for a uniform plan);
- a task's judgements stopped on a target half-width, ``task_target``; now on a margin of loss, ``margin``
  (:func:`upgraded_settings`: a saved report's settings made again take the default margin).

This module is the one place that reads those old labels; nothing else parses a result's text.

>>> old = pd.DataFrame({"seed_accuracies": ["0.7300 0.7370"], "method": ["plan"], "detail": ["uniform window(8)"]})
>>> new = upgraded("plan", {"summary": old})["summary"]
>>> new[["seed_accuracy_0", "seed_accuracy_1", "form", "choice"]].values.tolist()
[[0.73, 0.737, 'uniform', 'window(8)']]
"""

from __future__ import annotations

import pandas as pd

OLD_SEEDS = ("seed_accuracies", "joint_seed_accuracies")  # the old text columns; joint_: the maps' own prefix


def upgraded(kind: str, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``tables`` of a result of ``kind`` as this version writes them (unchanged where already so)."""
    tables = {name: _seed_columns(table) for name, table in tables.items()}
    if kind == "plan" and "summary" in tables and "form" not in tables["summary"] and "detail" in tables["summary"]:
        tables["summary"] = _plan_forms(tables["summary"])
    return tables


def upgraded_settings(saved: dict) -> dict:
    """A stage's saved settings (by flat name) as this version takes them: ``task_target`` is gone.

    >>> upgraded_settings({"task": "imdb", "task_target": 0.02})
    {'task': 'imdb'}
    """
    return {name: value for name, value in saved.items() if name != "task_target"}


def _seed_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The old ``seed_accuracies`` text, one column per seed (a row without seeds: NaN)."""
    for column in OLD_SEEDS:
        if column not in table:
            continue
        prefix = column.removesuffix("seed_accuracies")
        each = [str(value).split() if isinstance(value, str) else [] for value in table[column]]
        for seed in range(max(map(len, each), default=0)):
            table[f"{prefix}seed_accuracy_{seed}"] = [float(v[seed]) if seed < len(v) else float("nan") for v in each]
        table = table.drop(columns=column)
    return table


def _plan_forms(summary: pd.DataFrame) -> pd.DataFrame:
    """A plan summary's ``form`` and ``choice`` from the old ``detail`` labels."""
    forms, choices = [], []
    for method, detail in zip(summary["method"], summary["detail"].astype(str)):
        if method == "random":
            form, choice = "random", ""
        elif detail.startswith("step "):
            form, choice = "step", ""
        elif detail.startswith("none meets"):
            form, choice = "exact", ""
        else:  # the plan's "uniform partial(16)", or a uniform method's bare "partial(16)"
            form, choice = "uniform", detail.removeprefix("uniform ")
        forms.append(form)
        choices.append(choice)
    return summary.assign(form=forms, choice=choices)
