"""Per-example outcomes of a judgement (correct, cross-entropy, per seed) and the statistics read
off them: paired differences, t intervals across seeds, and a judgement's table columns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnlens.analysis.changes import Change
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.io.outcomes import UNMODIFIED  # the unmodified model's name among the judged changes (its key is None)


def outcome_arrays(
    judged: dict[str | None, Outcomes], reported: dict[str | None, int], rows: np.ndarray
) -> dict[str, np.ndarray]:
    """Every judged change's per-example outcomes as arrays a result keeps: ``task_rows`` (the
    held-out examples' rows in the task, in the order judged: each change used a prefix),
    ``task_changes`` (the changes' keys, :data:`UNMODIFIED` first), ``task_correct`` and ``task_loss``
    (change, example): 1/0 correct (the share of seeds under fine-tuning) and the classifier's
    cross-entropy, NaN past the examples a change was run on, and ``task_judged`` (change,): how many
    examples its judgement used (its table row's ``held_out``; a change only compared: those run).

    >>> arrays = outcome_arrays({None: Outcomes(np.ones(3), np.zeros(3), np.ones((1, 3)), np.zeros(2))}, {None: 3}, np.arange(5))
    >>> arrays["task_rows"].tolist(), arrays["task_changes"].tolist(), arrays["task_judged"].tolist()
    ([0, 1, 2], ['unmodified'], [3])
    """
    keys = [None, *(key for key in judged if key is not None)]
    width = max(len(judged[key].correct) for key in keys)
    correct, losses = np.full((len(keys), width), np.nan), np.full((len(keys), width), np.nan)
    for index, key in enumerate(keys):
        count = len(judged[key].correct)
        correct[index, :count], losses[index, :count] = judged[key].correct, judged[key].losses
    return {
        "task_rows": np.asarray(rows[:width], dtype=np.int64),
        "task_changes": np.array([UNMODIFIED if key is None else key for key in keys], dtype=str),
        "task_correct": correct,
        "task_loss": losses,
        "task_judged": np.array([reported.get(key, len(judged[key].correct)) for key in keys], dtype=np.int64),
    }


def task_columns(judged: dict[str, object]) -> dict[str, object]:
    """A judgement's columns for a table (everything but the per-example array)."""
    return {name: value for name, value in judged.items() if name != "correct"}


def paired_difference(first: np.ndarray, second: np.ndarray, bootstrap: int, seed: int) -> tuple[float, float, float]:
    """Mean of ``first - second`` (per-example 0/1 arrays) and its bootstrap interval, paired over examples."""
    mean, low, high = bootstrap_interval((np.asarray(first) - np.asarray(second))[None], bootstrap, seed)
    return float(mean[0]), float(low[0]), float(high[0])


def judged_key(change: Change | None) -> str | None:
    """What a judgement is remembered by: the change's key (``None``: the unmodified model)."""
    return None if change is None else change.key


@dataclass(frozen=True)
class Outcomes:
    """A change's outcomes on the first examples of the held-out pool: per example correct (0/1,
    or the fraction of fine-tune seeds) and cross-entropy, (seed, example) correct, and the
    (removed, valid) positions counted over them."""

    correct: np.ndarray
    losses: np.ndarray
    seeds: np.ndarray
    removed: np.ndarray

    @classmethod
    def none(cls) -> Outcomes:
        return cls(np.zeros(0), np.zeros(0), np.zeros((0, 0)), np.zeros(2))

    def extended(self, correct: np.ndarray, losses: np.ndarray, seeds: np.ndarray, removed: np.ndarray) -> Outcomes:
        """These outcomes followed by those of the next examples."""
        return Outcomes(
            np.concatenate([self.correct, correct]),
            np.concatenate([self.losses, losses]),
            np.concatenate([self.seeds, seeds], axis=1) if len(self.correct) else seeds,
            self.removed + removed,
        )


def with_seed_row(correct: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A judgement without seeds: its correct array doubles as the one seed's row."""
    return correct, losses, correct[None]


def t_halfwidth(values: np.ndarray, level: float = 0.95) -> float:
    """Half the width of the t interval of the mean of ``values`` (a few seeds' results).

    >>> round(t_halfwidth(np.array([0.70, 0.72, 0.74])), 4)   # t(0.975, 2) = 4.303, sd 0.02, sqrt(3)
    0.0497
    """
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values)))


SEED_COLUMN = "seed_accuracy_{}"  # fine-tuned with several seeds: each seed's accuracy, a column per seed


def seed_columns(values: np.ndarray, prefix: str = "") -> dict[str, float]:
    """Each seed's accuracy as a column of its own, seed by seed (read back by :func:`seed_values`).

    >>> seed_columns(np.array([0.8, 0.82]))
    {'seed_accuracy_0': 0.8, 'seed_accuracy_1': 0.82}
    """
    return {prefix + SEED_COLUMN.format(seed): float(value) for seed, value in enumerate(values)}


def seed_values(row: Mapping[str, Any], prefix: str = "") -> np.ndarray | None:
    """The per-seed accuracies :func:`seed_columns` wrote into a row (``None``: the row has none).

    >>> seed_values({"seed_accuracy_0": 0.8, "seed_accuracy_1": 0.82}).tolist(), seed_values({"accuracy": 0.8})
    ([0.8, 0.82], None)
    """
    values: list[float] = []
    while (value := row.get(prefix + SEED_COLUMN.format(len(values)))) is not None and value == value:  # NaN: none
        values.append(float(value))
    return np.array(values) if values else None


def seed_differences(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``first`` − ``second`` seed by seed (each a change's per-seed accuracies, :func:`seed_values`).

    >>> seed_differences(np.array([0.80, 0.82]), np.array([0.79, 0.80])).round(4).tolist()
    [0.01, 0.02]
    """
    return np.asarray(first, float) - np.asarray(second, float)


def seeds_difference(first: np.ndarray, second: np.ndarray) -> tuple[float, float, float]:
    """Mean and t interval of ``first`` − ``second``, paired by fine-tune seed (:func:`seed_differences`).

    >>> [round(value, 4) for value in seeds_difference(np.array([0.80, 0.82, 0.84]), np.array([0.79, 0.80, 0.81]))]
    [0.02, -0.0048, 0.0448]
    """
    return t_interval(seed_differences(first, second))


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its t interval (:func:`t_halfwidth`)."""
    mean, half = float(values.mean()), t_halfwidth(values, level)
    return mean, mean - half, mean + half


def scored(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per example: whether the classifier's top class is the label (0/1) and its cross-entropy (log-sum-exp, stable)."""
    shifted = logits - logits.max(1, keepdims=True)
    log_probability = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return (logits.argmax(1) == labels).astype(np.float64), -log_probability[np.arange(len(labels)), labels]
