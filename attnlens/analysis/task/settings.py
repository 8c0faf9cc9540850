"""What judges a change by a task, and how (:class:`TaskSettings`), and the constants the judge runs by."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.analysis.margin import DEFAULT_MARGIN, Margin
from attnlens.data.exclusion import read_exclusion
from attnlens.data.tasks import check_task
from attnlens.errors import BadInput
from attnlens.models.precision import DEFAULT_PRECISION, PRECISIONS
from attnlens.settings import Settings, at_least, one_of, positive, setting

PROTOCOLS = ("auto", "probe", "refit", "finetune", "head")
POOLING: dict[bool, str] = {False: "mean", True: "last"}  # by LoadedModel.causal: what each family pools
MIN_HELD_OUT = 20  # fewer held-out examples give percentile intervals that mean little
AUTO = "auto"  # task_eval: each change judged sequentially, on as many held-out examples as it needs
AUTO_POOL = 4000  # auto's cap, beside the number of examples the task has left
FEATURES_VERSION = 1  # part of the features cache key: bump when pooling or batching changes
DEFAULT_TRAIN = 1024  # task_train when not given, for a protocol that fits or trains (head sets none aside)


@dataclass(frozen=True)
class TaskSettings(Settings):
    """Which task judges a change, and how: ``task`` (the field ``name``; ``None``: no task; a built-in
    name or a file), its ``text_column``/``label_column``, ``task_exclude`` (a file of texts a classifier
    was trained on, taken out of the task before any split: :mod:`attnlens.data.exclusion`),
    ``task_train`` (``None``: :data:`DEFAULT_TRAIN` for the protocols that fit or train; none under
    ``head``, whose held-out examples are then every example not excluded) and ``task_eval`` examples
    (disjoint, seeded; ``task_eval="auto"``: each change judged sequentially, on as many as it
    needs for its paired Δ interval to answer its question against the ``margin``,
    :mod:`attnlens.analysis.sequential`; ``task_pool``: the most examples it may use, fewer where the task has
    fewer left). ``margin``: the loss of accuracy a change may cost and still keep the model, in points
    (``2``) or as a share of the unmodified accuracy (``"3%"``), :mod:`attnlens.analysis.margin`. Then the ``protocol``, the
    probe's inverse L2 strength ``probe_c`` (``None``: chosen by cross-validation on the
    training examples, :func:`choose_c`), and
    the fine-tune recipe (``finetune_steps``, ``finetune_lr`` for the encoder; the head
    takes 100× that; ``seeds`` runs per change, seeds ``seed``, ``seed + 1``, …, whose
    spread gives an interval across seeds). ``bootstrap`` resamples give the intervals. ``precision``
    (``float32`` or ``bfloat16``, :mod:`attnlens.models.precision`) is the arithmetic of the judge's
    forwards and fine-tunes: the features the probe is fitted on, every judged change's, the logits
    DAM and the plan train and measure against.

    >>> TaskSettings(protocol="finetune")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: protocol finetune needs task; name a task (imdb, rotten-tomatoes or a file)
    """

    name: str | None = setting(None, flag="task")
    protocol: str = "auto"
    text_column: str = "text"
    label_column: str = "label"
    task_exclude: str | None = None
    task_train: int | None = None
    task_eval: int | str = 512
    task_pool: int = AUTO_POOL
    margin: float | str = DEFAULT_MARGIN
    probe_c: float | None = None
    finetune_steps: int = 200
    finetune_lr: float = 2e-5
    seeds: int = 1
    bootstrap: int = 1000
    precision: str = DEFAULT_PRECISION

    def validate(self) -> None:
        super().validate()
        one_of("protocol", self.protocol, PROTOCOLS)
        if self.name is None and self.protocol not in ("auto", "probe"):
            raise BadInput(f"`protocol` {self.protocol} needs `task`; name a task (imdb, rotten-tomatoes or a file)")
        if self.name is not None:  # its file is read now: a missing column or a broken line fails before any model loads
            check_task(self.name, text_column=self.text_column, label_column=self.label_column)
        if self.task_exclude is not None:
            if self.name is None:
                raise BadInput("`task_exclude` takes examples out of a task; name the task with `task`")
            read_exclusion(self.task_exclude, text_column=self.text_column)
        if self.task_eval != AUTO:
            if not isinstance(self.task_eval, int) or isinstance(self.task_eval, bool):
                raise BadInput(f"`task_eval` {self.task_eval!r} must be a number of held-out examples or 'auto'")
            at_least("task_eval", self.task_eval, MIN_HELD_OUT, " held-out examples for a bootstrap interval")
        at_least("task_pool", self.task_pool, MIN_HELD_OUT, " held-out examples for a bootstrap interval")
        object.__setattr__(self, "margin", Margin.parse(self.margin).setting)  # "2" and 2 are one margin: 2.0
        if self.task_train is not None:
            at_least("task_train", self.task_train, 0 if self.protocol == "head" else 2)
        if self.probe_c is not None:
            positive("probe_c", self.probe_c)
        at_least("finetune_steps", self.finetune_steps, 1)
        at_least("seeds", self.seeds, 1, " (fine-tune runs per change)")
        if self.seeds > 1 and self.protocol != "finetune":
            raise BadInput(f"`seeds` {self.seeds} needs `protocol` finetune: only fine-tuning varies from seed to seed")
        positive("finetune_lr", self.finetune_lr)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")
        one_of("precision", self.precision, PRECISIONS)

    def train_examples(self, protocol: str) -> int:
        """How many training examples ``protocol`` (resolved: not ``auto``) sets aside: ``task_train``,
        or when not given :data:`DEFAULT_TRAIN`, and none under ``head`` (nothing is fitted).

        >>> TaskSettings(name="rotten-tomatoes").train_examples("head"), TaskSettings(name="rotten-tomatoes").train_examples("probe")
        (0, 1024)
        """
        if self.task_train is not None:
            return self.task_train
        return 0 if protocol == "head" else DEFAULT_TRAIN


def task_of(settings: Settings) -> TaskSettings | None:
    """The task that judges an analysis (its ``task`` group, where one is named), else None."""
    group = getattr(settings, "task", None)
    return group if isinstance(group, TaskSettings) and group.name is not None else None
