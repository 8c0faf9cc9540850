"""The settings of :func:`~attnlens.analysis.importance.importance`: position classes, objective, scope, blocks, task."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.analysis.objectives import OBJECTIVES
from attnlens.analysis.task import TaskSettings
from attnlens.data.positions import parse_classes
from attnlens.models.precision import DEFAULT_PRECISION, PRECISIONS
from attnlens.settings import CorpusSettings, at_least, group, one_of

SCOPES = ("model", "layer", "head")


@dataclass(frozen=True)
class ImportanceSettings(CorpusSettings):
    """Settings of :func:`~attnlens.analysis.importance.importance`: the position ``classes`` (``None``: every default
    class that occurs), the ``objective``, the ablation scope beside the whole model
    (``per``), ``num_seqs`` held-out blocks, ``bootstrap`` resamples for the intervals,
    and whether to compute ``gradient`` importance; corpus settings as :class:`CorpusSettings`;
    with ``task`` (:class:`~attnlens.analysis.task.TaskSettings`) every ablation is also
    judged by task accuracy under ``protocol`` (only those of ``task_classes`` and their random
    controls when it is given: each judgement is a forward of every held-out example). ``precision``
    (:mod:`attnlens.models.precision`) is the ablations' and the task's arithmetic; the mass and the
    gradients are measured in float32 whatever it is.

    >>> ImportanceSettings.build(per="row")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: per row is unknown; use one of model, layer, head
    """

    classes: str | tuple[str, ...] | None = None
    objective: str = "auto"
    per: str = "model"
    num_seqs: int = 64
    batch_size: int = 16
    bootstrap: int = 1000
    gradient: bool = True
    task_classes: str | tuple[str, ...] | None = None
    precision: str = DEFAULT_PRECISION  # the judging forwards' arithmetic, the task's too (passed down)
    task: TaskSettings = group(TaskSettings)

    def validate(self) -> None:
        super().validate()
        parse_classes(self.classes)
        if self.task_classes is not None:
            parse_classes(self.task_classes)
        one_of("per", self.per, SCOPES)
        one_of("objective", self.objective, OBJECTIVES)
        at_least("num_seqs", self.num_seqs, 1)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")
        one_of("precision", self.precision, PRECISIONS)
