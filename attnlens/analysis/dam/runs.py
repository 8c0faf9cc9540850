"""What the runs of one :func:`~attnlens.analysis.dam.run.dam` call share, and what each run ends with.

:class:`Setup` holds the experiment, the layout, the held-out and training data, the objectives
that judge and train, the warm start (:func:`warm_start`, judged on the training data by
:func:`judged_start`) and the task judge; :class:`Run` is one trained and judged mask with what
goes in the result's tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import PATTERN_STREAM, MaskChange, PatternChange, seeded
from attnlens.analysis.dam.judging import MaskSplit, evaluate_mask, pattern_points
from attnlens.analysis.dam.layouts import LAYOUTS, MaskLayout, equal_by_construction, pattern_logits
from attnlens.analysis.dam.reference import check_size, searchable
from attnlens.analysis.dam.settings import DamSettings, parse_init
from attnlens.analysis.dam.training import batch_order
from attnlens.analysis.evaluation import evaluate_change, resample_train
from attnlens.analysis.experiment import Experiment, Split
from attnlens.analysis.objectives import Objective
from attnlens.analysis.patterns import build
from attnlens.analysis.task import TaskJudge, TaskLoss
from attnlens.errors import BadInput
from attnlens.progress import Progress

RESAMPLE_STREAM = 17  # a mask seed's draw of training blocks (resample)

Adapted = tuple[dict, np.ndarray, tuple[PatternChange, dict] | None]
"""A pattern given a mask's weight training: its row of ``patterns_adapted``, its per-block held-out losses,
and (its change as the task judged it, the judgement) or None without a task."""


@dataclass
class Setup:
    """What every run of one :func:`dam` call shares: the experiment, the layout, the held-out and
    training data (the task's examples when the masks learn from the task: ``train_on``), the objective each is
    judged and trained by, the warm start, the batch order and the task judge."""

    experiment: Experiment
    settings: DamSettings
    layout: MaskLayout
    layout_classes: tuple[str, ...]
    held_out: MaskSplit
    train: MaskSplit
    trained_on: str
    train_objective: Objective | TaskLoss
    task: TaskJudge | None
    init_logits: torch.Tensor | None
    start: dict[str, float]  # the warm start's pattern on the training blocks (NaN without one)
    baseline: np.ndarray
    same: dict[str, str]
    references: dict = field(default_factory=dict)  # the swap searches run so far, by target (band) or run (dam)
    train_blocks: dict = field(default_factory=dict)  # with resample: each mask seed's training blocks (corpus index)

    @property
    def judging_objective(self) -> Objective:
        """The objective every mask and pattern is judged by on the held-out blocks (``train_objective``
        may differ: what the masks learn from)."""
        return self.experiment.objective

    @property
    def polishes(self) -> bool:
        """Whether a swap search finishes each mask at its target: with targets, rounds to spend, the
        pretrained weights (a search does not train them) and a layout of few enough logits."""
        s = self.settings
        return (
            s.judging.polish_rounds > 0 and s.target.lambdas is None and not s.training.train_weights and searchable(self.layout)
        )

    def for_seed(self, seed: int) -> Setup:
        """What the mask of ``seed`` learns from: this setup, or with ``resample`` (seeds after the
        first) the same with its own draw of training blocks, and the warm start on them. The swap
        searches found so far and the draws are shared."""
        s, experiment = self.settings, self.experiment
        if not s.resample or seed == s.seed:
            return self
        if isinstance(self.train_objective, TaskLoss):  # trained_on "task"
            raise BadInput("`resample` draws other corpus training blocks; these masks learn from the task's examples")
        draw = seeded(seed, RESAMPLE_STREAM)
        blocks = resample_train(experiment.corpus, experiment.model, s.seq_len, s.eval_seqs, s.train_seqs, s.seed, draw)
        self.train_blocks[seed] = blocks.index.tolist()
        train = MaskSplit.of(experiment.split(blocks, s.batch_size, self.train_objective), self.layout, experiment.classes)
        init_logits = warm_start(self.layout, train, s)
        start = judged_start(self.layout, init_logits, self.train_objective, train)
        return replace(self, train=train, init_logits=init_logits, start=start)

    def order(self, seed: int) -> np.ndarray:
        """Which training batch each step of a run with ``seed`` takes."""
        return batch_order(seed, len(self.train.split.inputs), self.settings.training.steps)

    def pattern(self, row) -> PatternChange:
        """The change of one row of the patterns table."""
        return PatternChange(row.pattern, int(row.value), self.settings.seq_len, self.settings.seed)

    @classmethod
    def of(cls, experiment: Experiment, s: DamSettings, progress: Progress = False) -> Setup:
        model, classes = experiment.model, experiment.classes
        # The class layout needs a partition: "other" takes what the listed classes leave.
        layout_classes = classes if "other" in classes else (*classes, "other")
        valid = experiment.valid.to(model.device)
        layout = LAYOUTS[s.mask.variant](model.num_layers, model.num_heads, s.seq_len, valid, layout_classes)
        if s.judging.reference is not None:  # before any work: a layout too large for a swap search is bad input
            check_size(layout)
        # Batches are prepared before any training: the hidden objective's references come
        # from the unmodified model even when its weights are fine-tuned.
        held_out = MaskSplit.of(experiment.split(experiment.held_out, s.batch_size), layout, classes)
        trained_on, corpus_objective = experiment.objective.name, experiment.objective
        if s.training.objective is not None:  # a cheaper objective to learn from than the one that judges
            corpus_objective = Objective(model, s.training.objective, seed=s.seed, precision=s.precision)
            trained_on = corpus_objective.name
        assert experiment.train is not None, "dam's experiment draws training blocks (train_seqs)"
        train = MaskSplit.of(experiment.split(experiment.train, s.batch_size, corpus_objective), layout, classes)
        train_objective: Objective | TaskLoss = corpus_objective
        init_logits = warm_start(layout, train, s)
        task = None
        if s.task.name is not None:  # length-bucketed: masks and patterns decide positions by place, and take a batch's corner
            task = TaskJudge(
                model, s.task, seq_len=s.seq_len, batch_size=s.batch_size, seed=s.seed, progress=progress,
                prepared=experiment.task,
            )  # fmt: skip
        full = task is not None and not (task.train.padded or task.held_out.padded) and task.train.ids.shape[1] == s.seq_len
        if s.training.train_on == "task" or (
            s.training.train_on == "auto" and full and s.training.objective is None
        ):  # the task's own loss, on its training examples
            assert task is not None, "the masks learn from a task only with one (DamSettings checks train_on task)"
            trained_on, train_objective = "task", TaskLoss(task)
            train = MaskSplit.of(Split.of_examples(task.train, model, s.batch_size, s.precision), layout, classes)
        start = judged_start(layout, init_logits, train_objective, train)
        baseline = evaluate_change(experiment.objective, held_out.split.inputs, held_out.split.views)["loss"]
        same = equal_by_construction(layout, held_out.contexts, held_out.masks)
        return cls(
            experiment, s, layout, layout_classes, held_out, train, trained_on, train_objective, task, init_logits, start,
            baseline, same,
        )  # fmt: skip

    def total_steps(self) -> int:
        """The progress bar's total: every run's steps (and its judgement), every pattern point
        (twice with a task), the adapted patterns' steps with ``train_weights`` and the swap
        searches' rounds with ``reference``."""
        s, runs = self.settings, len(self.settings.runs())
        judged = (
            0
            if self.task is None or s.training.train_weights
            else len(pattern_points(s.seq_len, self.experiment.model.causal))
            if s.judging.task_patterns == "all"
            else 3 * runs
        )
        points = len(pattern_points(s.seq_len, self.experiment.model.causal)) + judged if s.judging.patterns else 0
        adapted = (
            runs * len(s.judging.adapted_patterns) * s.training.steps if s.training.train_weights and s.judging.patterns else 0
        )
        reference = runs * s.judging.reference_rounds if s.judging.reference is not None else 0
        polish = runs * s.judging.polish_rounds if self.polishes else 0
        return runs * (s.training.steps + 1) + points + adapted + reference + polish


def warm_start(layout: MaskLayout, train: MaskSplit, s: DamSettings) -> torch.Tensor | None:
    """The logits that start every run at pattern ``s.mask.init`` (None without one): the pattern on the
    corpus's training blocks, averaged into each logit (:func:`pattern_logits`)."""
    init = parse_init(s.mask.init, s.seq_len)
    if init is None:
        return None
    name, value = init
    generator = torch.Generator().manual_seed(seeded(s.seed, PATTERN_STREAM))
    keeps = [
        (context, build(name, s.seq_len, value, view.roles().cls.to(context.device), generator))
        for context, view in zip(train.contexts, train.split.views)
    ]
    return pattern_logits(layout, keeps)


def judged_start(layout: MaskLayout, logits: torch.Tensor | None, objective: Objective | TaskLoss, train: MaskSplit) -> dict:
    """What training begins from, judged on its training data as the masks will be (NaN without a warm start)."""
    if logits is None:
        return {"init_train_loss": float("nan"), "init_train_sparsity": float("nan")}
    seen = evaluate_mask(layout, logits, objective, train)
    return {"init_train_loss": float(seen["losses"].mean()), "init_train_sparsity": float(seen["sparsity"])}


@dataclass
class Run:
    """One trained and judged mask: its λ, the held-out judgement, the training curve and what goes in the tables."""

    lam: float
    judged: dict
    curve: pd.DataFrame
    summary: dict
    logits: np.ndarray
    image: np.ndarray
    task: dict[str, Any] | None = None  # a row of the task table
    adapted: list[Adapted] = field(default_factory=list)
    task_change: MaskChange | None = None  # as the task judged it (its outcomes are the judge's, by its key)
    reference: dict | None = None  # the swap search's mask against this one (reference)
    reference_logits: np.ndarray | None = None
