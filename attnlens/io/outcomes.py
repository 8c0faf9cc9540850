"""A result's per-example task outcomes, read back: one judged change beside the unmodified model.

A result judged by a task keeps, beside its tables, every judged change's per-example outcomes
(the arrays ``task_rows``, ``task_changes``, ``task_correct``, ``task_loss`` and ``task_judged``:
:func:`attnlens.analysis.task.outcome_arrays`). :func:`task_outcomes` (:meth:`Result.outcomes
<attnlens.io.results.Result.outcomes>`) reads those of one change on the examples its judgement
used, with the unmodified model's on the same examples, so that any two changes can be paired
again without the model: the difference of two ``correct`` columns, example by example, is
what the task table's Δ and its interval were computed from.

>>> import numpy as np
>>> arrays = {"task_rows": np.array([7, 3, 5]), "task_changes": np.array(["unmodified", "ablation/self"]),
...           "task_correct": np.array([[1.0, 1.0, 0.0], [1.0, 0.0, np.nan]]),
...           "task_loss": np.array([[0.1, 0.2, 0.9], [0.3, 0.8, np.nan]]), "task_judged": np.array([3, 2])}
>>> task_outcomes(arrays, "ablation/self").to_dict("list")
{'row': [7, 3], 'correct': [1.0, 0.0], 'loss': [0.3, 0.8], 'unmodified_correct': [1.0, 1.0], 'unmodified_loss': [0.1, 0.2]}
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from attnlens.errors import BadInput

OUTCOME_ARRAYS = ("task_rows", "task_changes", "task_correct", "task_loss", "task_judged")
UNMODIFIED = "unmodified"  # the unmodified model's name among the changes (attnlens.analysis.task.UNMODIFIED)


def task_outcomes(
    arrays: Mapping[str, np.ndarray], change: object, table: pd.DataFrame | None = None, *, every: bool = False
) -> pd.DataFrame:
    """The per-example outcomes of ``change`` on the examples its judgement used (``every``: on every
    example it was run on; a comparison with another change may have run it on more): ``row`` (the
    example's row in the task), ``correct`` (1/0; under fine-tuning with seeds, the share of seeds
    right), ``loss`` (the classifier's cross-entropy), and ``unmodified_correct``/``unmodified_loss``
    (the unmodified model on the same examples).

    ``change`` is a change's key (the ``change`` column of the task table; ``"unmodified"`` for
    the unmodified model), a row of the task table (a :class:`pandas.Series` or mapping with a
    ``change`` entry), or the row's number in ``table`` (the result's table of task judgements).
    """
    missing = [name for name in OUTCOME_ARRAYS if name not in arrays]
    if missing:
        raise BadInput(
            "this result keeps no per-example task outcomes: it was made without `task`, or by an attnlens that did "
            "not keep them; run it again with `task`"
        )
    key = _key_of(change, table)
    changes = [str(name) for name in np.asarray(arrays["task_changes"])]
    if key not in changes:
        shown = ", ".join(changes[:6]) + (", ..." if len(changes) > 6 else "")
        raise BadInput(f"no judged change is named '{key}'; the judged changes are: {shown}")
    correct, losses = np.asarray(arrays["task_correct"]), np.asarray(arrays["task_loss"])
    index = changes.index(key)
    count = int(np.isfinite(correct[index]).sum()) if every else int(arrays["task_judged"][index])
    return pd.DataFrame(
        {
            "row": np.asarray(arrays["task_rows"][:count], dtype=np.int64),
            "correct": correct[index, :count],
            "loss": losses[index, :count],
            "unmodified_correct": correct[changes.index(UNMODIFIED), :count],
            "unmodified_loss": losses[changes.index(UNMODIFIED), :count],
        }
    )


def _key_of(change: object, table: pd.DataFrame | None) -> str:
    """The key ``change`` names: itself, a row's ``change`` entry, or that of row number ``change`` of ``table``."""
    if isinstance(change, str):
        return change
    if isinstance(change, (int, np.integer)) and not isinstance(change, bool):
        if table is None or "change" not in table:
            raise BadInput("this result has no table of task judgements to number rows in; name the change by its key")
        if not 0 <= int(change) < len(table):
            raise BadInput(f"row {int(change)} is not in the task table, which has rows 0 to {len(table) - 1}")
        change = table.iloc[int(change)]
    if isinstance(change, (pd.Series, Mapping)) and "change" in change:
        key = change["change"]
        if not isinstance(key, str):  # a row the task did not judge (its task columns are empty)
            raise BadInput("that row was not judged by the task (its `change` is empty); pick a row with a change")
        return key
    raise BadInput(
        f"name a change by its key (a str), a row of the task table, or that row's number; got {type(change).__name__}"
    )
