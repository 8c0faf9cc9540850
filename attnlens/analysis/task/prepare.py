"""The task as a judge uses it, made and checked before any model pass (:func:`prepare_task`).

Everything about a task that can be wrong is found here, at the cost of reading the task and
tokenising its examples, never of a forward pass: its columns and classes (read when the settings
are made), the protocol (``auto`` resolved; ``head`` on a model without a classification head),
the head's ``id2label`` against the task's classes, the examples a classifier saw taken out
(``task_exclude``), and whether the split has the examples asked for. Each analysis prepares its
task in its prologue, before its first forward, and hands the :class:`PreparedTask` to its
:class:`~attnlens.analysis.task.TaskJudge`, so nothing is read or tokenised twice.

>>> from attnlens import load_model
>>> prepared = prepare_task(load_model("minilm-l6"), TaskSettings(name="rotten-tomatoes", task_train=16, task_eval=32), seq_len=64)
>>> prepared.protocol, len(prepared.train), len(prepared.pool), prepared.majority_from
('probe', 16, 32, 'training examples')
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from attnlens.analysis.task.head import head_columns
from attnlens.analysis.task.settings import AUTO, TaskSettings
from attnlens.data.exclusion import excluding, read_exclusion
from attnlens.data.tasks import Examples, Task, load_task
from attnlens.errors import AttnlensWarning, BadInput
from attnlens.models.loading import LoadedModel


@dataclass(frozen=True)
class PreparedTask:
    """A task ready to judge with: the ``task`` (without the excluded examples), the resolved
    ``protocol`` and, under ``head``, the head's column of each task class; the ``train`` examples
    and the held-out ``pool`` (at most ``seq_len`` tokens, padded to ``pad_to`` when given, drawn by
    ``seed``); the majority class and the examples it was counted on (``majority_from``)."""

    task: Task
    protocol: str
    head_columns: list[int] | None
    train: Examples
    pool: Examples
    majority_label: int
    majority_from: str
    seq_len: int
    pad_to: int | None
    seed: int

    def describe(self) -> dict[str, object]:
        """What a result records of the examples: the task, its exclusion, and how many were held out."""
        return {
            **self.task.describe(),
            "train_examples": len(self.train),
            "held_out_available": len(self.pool),
            "majority_from": self.majority_from,
        }


def resolve_protocol(model: LoadedModel, protocol: str) -> str:
    """``auto`` is ``head`` for a model with a sequence-classification head, ``probe`` otherwise."""
    return protocol if protocol != "auto" else "head" if model.class_names else "probe"


def prepare_task(
    model: LoadedModel,
    settings: TaskSettings,
    *,
    seq_len: int,
    seed: int = 0,
    pad_to: int | None = None,
    train_needed: bool = False,
) -> PreparedTask:
    """Load, exclude, check and split the task of ``settings`` for ``model`` (no forward pass), the
    cheapest checks first; ``train_needed``: the caller trains on the task's examples (a DAM mask
    learning from the task), so some must be set aside even under ``head``.

    Under ``head`` with nothing excluded from a built-in task whose rows are an official training
    split, warns (:class:`~attnlens.errors.AttnlensWarning`): the model may have been trained on them.
    """
    if settings.name is None:
        raise BadInput("judging by a task needs `task`; name a task (imdb, rotten-tomatoes or a file)")
    protocol = resolve_protocol(model, settings.protocol)
    task = load_task(settings.name, text_column=settings.text_column, label_column=settings.label_column)
    columns = head_columns(model, task.label_names) if protocol == "head" else None
    num_train = settings.train_examples(protocol)
    if train_needed and num_train < 2:
        raise BadInput(
            "the masks learn from the task's training examples, and `protocol` head sets none aside unless asked: "
            "give `task_train` (examples the head's loss trains the masks on), or learn from the objective"
        )
    if settings.task_exclude is not None:
        task = excluding(task, read_exclusion(settings.task_exclude, text_column=settings.text_column))
    model.check_seq_len(seq_len)
    auto = settings.task_eval == AUTO
    # auto: every example the task has left, up to task_pool; each judgement uses as many as it needs
    train, pool = task.split(
        model, seq_len, num_train, settings.task_pool if auto else int(settings.task_eval), seed=seed, pad_to=pad_to, at_most=auto
    )
    if protocol == "head":  # nothing is fitted: the baseline is the held-out examples' own majority class
        majority, counted_on = task.majority(pool.labels)[0], "held-out examples"
    else:
        majority, counted_on = task.majority(train.labels)[0], "training examples"
    if protocol == "head" and settings.task_exclude is None and task.official_split is not None:
        warnings.warn(leak_warning(task), AttnlensWarning, stacklevel=2)
    return PreparedTask(task, protocol, columns, train, pool, majority, counted_on, seq_len, pad_to, seed)


def leak_warning(task: Task) -> str:
    """What the ``head`` protocol says of a built-in task whose rows are an official training split."""
    return (
        f"`protocol` head judges the model's own classifier on task '{task.name}': {task.official_split}; "
        "a classifier fine-tuned on them would be judged on its own training data: give `task_exclude` FILE "
        "(the texts it was trained on, one per line) to judge it on examples it never saw"
    )


def majority_share(labels: np.ndarray, label: int) -> float:
    """The share of ``labels`` that are ``label`` (the majority-class baseline's accuracy)."""
    return float((np.asarray(labels) == label).mean())
