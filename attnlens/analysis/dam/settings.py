"""The settings of a DAM run: one frozen object, checked before any model loads; its defaults are the recipe.

>>> DamSettings.build(lambdas=[0.1, -1])
Traceback (most recent call last):
    ...
attnlens.errors.BadInput: lambdas -1: λ must be 0 or more (a finite number), e.g. lambdas 0.01,0.1
>>> DamSettings.build(sparsity=[0.9], mask_seeds=2).runs()    # (the λ a run starts from, its target sparsity, its seed)
[(0.1, 0.9, 0), (0.1, 0.9, 1)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlens.analysis.dam.layouts import LAYOUTS
from attnlens.analysis.evaluation import MIN_HELD_OUT_BLOCKS
from attnlens.analysis.objectives import OBJECTIVES
from attnlens.analysis.patterns import PATTERNS
from attnlens.analysis.task import TaskSettings
from attnlens.data.positions import refuse_heavy
from attnlens.errors import BadInput
from attnlens.models.precision import DEFAULT_PRECISION, PRECISIONS
from attnlens.settings import CorpusSettings, Settings, at_least, group, one_of, positive, probability, setting

REMOVALS = ("1e4", "inf", "renormalise")
REFERENCE_STARTS = ("dam", "band")  # where the swap search starts (reference): each mask, or the band nearest its target
DEFAULT_SPARSITY = (0.8, 0.9, 0.95)  # the targets when neither `lambdas` nor `sparsity` is given
TASK_PATTERNS = ("all", "compared", "adapted")  # which fixed patterns the task judges (task_patterns)
TRAIN_ON = ("auto", "objective", "task")  # what the masks learn from (train_on)
# How a target's run meets its density (dual): `ascent` moves λ by dual ascent on the hard mask's gap;
# `hold` holds the hard mask at a density brought down to the target (DamTrainer.aim); `auto` holds it
# when the weights train alongside, which adapt to any sparsity the mask passes and keep it there.
DUALS = ("auto", "ascent", "hold")
# The λ a target's run from the dense cold start begins at (dual ascent moves it), where every logit
# must fall and the logits crossing 0 together set the path; from a warm start (`init`) it starts where
# the gradients balance instead (DamTrainer.balancing_lambda), so a pattern already near the target is
# held there rather than first undone by a λ too small; so does a run that holds its mask (`dual` hold).
DUAL_START = 0.1


@dataclass(frozen=True)
class MaskSettings(Settings):
    """What is learned: a mask of ``variant`` (a layout of :data:`~attnlens.analysis.dam.layouts.LAYOUTS`),
    every logit starting at keep-probability ``init_keep`` or at a fixed pattern ``init``; how removed
    positions are removed (``removal``); the position ``classes`` reported (and learned by the ``class``
    variant); ``seeds`` masks per target or λ (flag ``mask_seeds``), each with its own noise and batch order."""

    variant: str = "structured"
    classes: str | tuple[str, ...] | None = None
    init: str | None = None  # a fixed pattern to start the logits at, e.g. "local(6)"
    init_keep: float = 0.9
    removal: str = "renormalise"
    seeds: int = setting(1, flag="mask_seeds")  # masks per target (or λ), seeds `seed`, `seed` + 1, ...

    def validate(self) -> None:
        one_of("variant", self.variant, LAYOUTS)
        refuse_heavy(self.classes, "dam")
        probability("init_keep", self.init_keep, ", e.g. 0.9")
        if self.removal not in REMOVALS:
            raise BadInput(
                f"`removal` {self.removal} is unknown; use 1e4 (add -10^4 to removed scores), inf, or renormalise "
                "(zero the removed weights and renormalise the kept ones)"
            )
        at_least("mask_seeds", self.seeds, 1, " (masks per target, each its own noise and batch order)")


@dataclass(frozen=True)
class TargetSettings(Settings):
    """How sparse: target ``sparsity`` (met by ``dual``: λ found by dual ascent from ``dual_start`` at
    step ``dual_lr``, or the mask held at a density brought down to the target), or fixed sparsity
    weights ``lambdas``."""

    sparsity: tuple[float, ...] | None = None  # target sparsities (None and no lambdas: DEFAULT_SPARSITY)
    lambdas: tuple[float, ...] | None = None  # fixed sparsity weights, instead of target sparsities
    dual: str = "auto"  # how a target is met: ascent, hold, or auto (hold with train_weights); see DUALS
    dual_lr: float = 0.2
    dual_start: float | None = None  # the λ a target's run starts from; None: DUAL_START, or (init, hold) where gradients balance

    def validate(self) -> None:
        if self.lambdas is not None and self.sparsity is not None:
            raise BadInput("give `lambdas` or `sparsity`, not both: a target sparsity finds its own λ")
        for value in self.sparsity or ():
            probability("sparsity", value, ": a target sparsity is strictly between 0 and 1, e.g. `sparsity` 0.8,0.9")
        positive("dual_lr", self.dual_lr)
        one_of("dual", self.dual, DUALS)
        if self.dual_start is not None:
            positive("dual_start", self.dual_start, " (λ moves in log space), e.g. `dual_start` 1")
        if self.lambdas is not None and not self.lambdas:
            raise BadInput("`lambdas` is empty; give at least one λ, e.g. `lambdas` 0.01,0.1")
        for value in self.lambdas or ():
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
                raise BadInput(f"`lambdas` {shown}: λ must be 0 or more (a finite number), e.g. `lambdas` 0.01,0.1")

    @property
    def targets(self) -> tuple[float, ...]:
        """The target sparsities (:data:`DEFAULT_SPARSITY` when neither they nor ``lambdas`` are given)."""
        return self.sparsity or DEFAULT_SPARSITY


@dataclass(frozen=True)
class TrainingSettings(Settings):
    """How a mask learns: Adam at ``lr`` on a cosine schedule to ``lr_end`` (a fraction of ``lr``) at the
    step cap ``steps``; the Gumbel noise's scale on the same schedule down to ``noise_end``; temperature
    ``tau`` (fixed, or ``"start:end"``); ``train_weights`` fine-tunes the model alongside at ``weights_lr``.
    ``train_on`` says what the masks learn from: the corpus's objective (``objective``, flag
    ``train_objective``: a cheaper one than the one that judges), or the ``task``'s own loss (its
    classifier's cross-entropy on its training examples, padded ones included: SparseBERT's protocol with
    ``train_weights``), and ``auto`` the task where its examples are full blocks of ``seq_len`` tokens,
    else the objective."""

    steps: int = 300  # the cap: the stopping rule usually ends a run earlier
    lr: float = 0.1
    lr_end: float = 0.01  # the learning rate at the step cap, as a fraction of `lr` (cosine schedule)
    noise_end: float = 0.05  # the logistic noise's scale at the step cap (cosine schedule)
    tau: str | float | tuple[float, float] = 1.0
    train_weights: bool = False
    weights_lr: float = 1e-5
    objective: str | None = setting(None, flag="train_objective")  # what the masks learn from, if not the judging one
    train_on: str = "auto"

    def validate(self) -> None:
        positive("lr", self.lr, ", e.g. `lr` 0.05")
        if not 0 < self.lr_end <= 1:
            raise BadInput(
                f"`lr_end` {self.lr_end:g}: the final learning rate is a fraction of `lr` in (0, 1], e.g. `lr_end` 0.01"
            )
        if not 0 <= self.noise_end <= 1:
            raise BadInput(f"`noise_end` {self.noise_end:g}: the final noise scale is in [0, 1], e.g. `noise_end` 0.05")
        if self.train_weights:
            positive("weights_lr", self.weights_lr)
        parse_tau(self.tau)
        one_of("train_on", self.train_on, TRAIN_ON)
        if self.objective is not None:
            one_of("train_objective", self.objective, OBJECTIVES)
            if self.train_on == "task":
                raise BadInput("`train_objective` names a corpus objective; with `train_on` task the masks learn from the task")

    @property
    def temperature(self) -> tuple[float, float]:
        """``tau`` as (start, end)."""
        return parse_tau(self.tau)


@dataclass(frozen=True)
class StoppingSettings(Settings):
    """When a run ends: the schedule stops early by ``window``, ``flips``, ``plateau``, ``margin`` (flags
    ``stop_window``, ...: :class:`~attnlens.analysis.dam.stopping.StoppingRule`); the convergence check
    compares the judged mask's training loss ``check_window`` steps apart while the learning rate is at
    least ``check_lr`` of ``lr`` (:func:`~attnlens.analysis.dam.stopping.convergence`)."""

    window: int = setting(20, flag="stop_window")
    flips: float = setting(0.001, flag="stop_flips")
    plateau: float = setting(0.01, flag="stop_plateau")
    margin: float = setting(0.05, flag="stop_margin")  # a decision changes when its logit crosses the threshold by more
    check_window: int = 40  # the convergence check: steps over which the judged mask must not improve ...
    check_lr: float = 0.25  # ... while the learning rate is at least this fraction of `lr`

    def validate(self) -> None:
        at_least("stop_window", self.window, 2, " steps (the stopping rule compares two halves of it)")
        at_least("check_window", self.check_window, 2, " steps (the check scores the mask every check_window / 2 steps)")
        probability("stop_flips", self.flips, ", e.g. 0.001")
        positive("stop_plateau", self.plateau, ", e.g. 0.01")
        if not (self.margin >= 0 and math.isfinite(self.margin)):
            raise BadInput(f"`stop_margin` {self.margin:g}: a distance of logits, 0 or more, e.g. `stop_margin` 0.05")


@dataclass(frozen=True)
class JudgingSettings(Settings):
    """How the masks are judged: by the ``objective``, beside the fixed ``patterns``; with a task,
    ``task_patterns`` says which patterns the task judges: ``all`` of them, or ``compared``, the ones
    each mask is compared with (:meth:`DamResult.compared`: the best of the mask's own family and the best
    overall at matched sparsity), or ``adapted``: the ``adapted_patterns`` (band, local and bigbird unless
    set: the patterns ``train_weights`` gives the mask's weight training), each matched to the mask's
    sparsity on the task's own positions; each judgement is a forward of every held-out example. With
    ``train_weights`` the task compares each mask with the adapted patterns, each judged with the weights
    it trained beside the mask (whatever ``task_patterns`` says). A swap search beside each mask
    (``reference``: from the mask, ``dam``, or from the band nearest its target, ``band``) of at most
    ``reference_rounds``; ``polish_rounds`` of the swap search finish each mask at its target."""

    objective: str = "auto"
    patterns: bool = True
    task_patterns: str = "all"
    adapted_patterns: tuple[str, ...] = ("band", "local", "bigbird")  # given a mask's weight training (train_weights)
    reference: str | None = None  # a swap search beside each mask, from its mask ("dam") or the band ("band")
    reference_rounds: int = 20  # the swap search's most rounds
    polish_rounds: int = 20  # the swap search that finishes each mask at its target (layouts of few logits); 0: none

    def validate(self) -> None:
        one_of("objective", self.objective, OBJECTIVES)
        one_of("task_patterns", self.task_patterns, TASK_PATTERNS)
        unknown = [name for name in self.adapted_patterns if name not in PATTERNS]
        if unknown or not self.adapted_patterns:
            raise BadInput(
                f"`adapted_patterns` {unknown[0] if unknown else '(none)'} is unknown; use some of {', '.join(PATTERNS)}"
            )
        if self.reference is not None:
            one_of("reference", self.reference, REFERENCE_STARTS)
            at_least("reference_rounds", self.reference_rounds, 1, " rounds of the swap search")
        at_least("polish_rounds", self.polish_rounds, 0, " rounds of the swap search that finishes each mask (0: none)")


@dataclass(frozen=True)
class DamSettings(CorpusSettings):
    """Settings of :func:`~attnlens.analysis.dam.dam`, in groups: the ``mask`` (:class:`MaskSettings`),
    its ``target`` (:class:`TargetSettings`), its ``training`` (:class:`TrainingSettings`), when training
    ``stopping`` ends (:class:`StoppingSettings`), the ``judging`` (:class:`JudgingSettings`) and the
    ``task`` that also judges every mask and pattern (:class:`~attnlens.analysis.task.TaskSettings`).
    The data: ``train_seqs`` and ``eval_seqs`` disjoint blocks (``resample``: each mask seed but the first
    draws its own training blocks; the held-out ones stay), ``bootstrap`` resamples, ``precision`` (the
    arithmetic of the masks' training and judging, the task's too: :mod:`attnlens.models.precision`;
    logits and optimiser state stay float32); corpus settings as :class:`CorpusSettings`. Every setting also has one flat name (``DamSettings.build(mask_seeds=2)``,
    ``--mask-seeds 2``).

    >>> s = DamSettings.build(sparsity=[0.9], stop_window=10)
    >>> s.target.sparsity, s.stopping.window
    ((0.9,), 10)
    """

    batch_size: int = 16
    train_seqs: int = 256
    eval_seqs: int = 64
    resample: bool = False  # each mask seed but the first draws its own training blocks (the held-out ones stay)
    bootstrap: int = 1000
    precision: str = DEFAULT_PRECISION  # the judging forwards' and the training's arithmetic, the task's too (passed down)
    mask: MaskSettings = group(MaskSettings)
    target: TargetSettings = group(TargetSettings)
    training: TrainingSettings = group(TrainingSettings)
    stopping: StoppingSettings = group(StoppingSettings)
    judging: JudgingSettings = group(JudgingSettings)
    task: TaskSettings = group(TaskSettings)

    def validate(self) -> None:
        super().validate()
        at_least("train_seqs", self.train_seqs, 1)
        at_least("eval_seqs", self.eval_seqs, MIN_HELD_OUT_BLOCKS, " held-out blocks for a bootstrap interval")
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")
        one_of("precision", self.precision, PRECISIONS)
        parse_init(self.mask.init, self.seq_len)
        self._validate_across()

    def _validate_across(self) -> None:
        """What spans groups."""
        training, target = self.training, self.target
        if self.mask.seeds > 1 and target.lambdas is not None:
            raise BadInput("`mask_seeds` needs target sparsities (runs are told apart by the λ they end at); give `sparsity`")
        if self.judging.reference is not None:
            if target.sparsity is None and target.lambdas is not None:
                raise BadInput("`reference` searches at a target sparsity; give `sparsity` (e.g. 0.9) instead of `lambdas`")
            if training.train_weights:
                raise BadInput("`reference` searches masks for the pretrained weights; it cannot follow `train_weights`")
        if self.resample and training.train_on == "task":
            raise BadInput("`resample` draws other corpus training blocks; with `train_on` task the masks learn from the task's")
        if training.train_on == "task" and self.task.name is None:
            raise BadInput("`train_on` task needs a task to learn from; name one with `task`, e.g. `task` rotten-tomatoes")
        stopping = self.stopping
        at_least(
            "steps",
            training.steps,
            stopping.window,
            f": the stopping rule needs `stop_window` ({stopping.window}) steps to judge",
        )
        if not training.lr_end < stopping.check_lr <= 1:
            raise BadInput(
                f"`check_lr` {stopping.check_lr:g}: the least learning rate the check judges at, a fraction of `lr` above "
                f"`lr_end` ({training.lr_end:g}) and at most 1, e.g. 0.25"
            )

    def runs(self) -> list[tuple[float | None, float | None, int]]:
        """(the λ a run starts from, its target sparsity or None, its seed) for every run:
        ``mask_seeds`` per λ or target. A target's run from a warm start (``init``) starts at
        ``None``: where the gradients balance, and so does one whose mask is held (:attr:`holds`)."""
        seeds = [self.seed + number for number in range(self.mask.seeds)]
        if self.target.lambdas is not None:
            return [(float(value), None, seed) for value in self.target.lambdas for seed in seeds]
        start = self.target.dual_start or (None if self.mask.init is not None or self.holds else DUAL_START)
        return [(start, float(target), seed) for target in self.target.targets for seed in seeds]

    @property
    def holds(self) -> bool:
        """Whether a target's run holds its hard mask at a density brought down to the target
        (:meth:`~attnlens.analysis.dam.training.DamTrainer.aim`) instead of dual ascent on its gap.

        >>> DamSettings().holds, DamSettings.build(train_weights=True).holds, DamSettings.build(dual="hold").holds
        (False, True, True)
        """
        return self.target.dual == "hold" or (self.target.dual == "auto" and self.training.train_weights)


def parse_tau(tau: str | float | tuple[float, float]) -> tuple[float, float]:
    """``1.0`` (fixed) or ``"2:0.1"`` (annealed geometrically from 2 to 0.1) -> (start, end).

    >>> parse_tau("2:0.5"), parse_tau(1)
    ((2.0, 0.5), (1.0, 1.0))
    """
    if isinstance(tau, tuple):
        start, end = tau
    else:
        text = str(tau)
        try:
            parts = [float(part) for part in text.split(":")]
        except ValueError:
            raise BadInput(f"`tau` '{text}' is not a number or start:end pair, e.g. `tau` 1.0 or `tau` 2:0.2") from None
        if len(parts) not in (1, 2):
            raise BadInput(f"`tau` '{text}' is not a number or start:end pair, e.g. `tau` 1.0 or `tau` 2:0.2")
        start, end = parts[0], parts[-1]
    for value in (start, end):
        if not value > 0 or not math.isfinite(value):
            raise BadInput(f"`tau` {value:g}: the temperature τ must be greater than 0, e.g. `tau` 1.0")
    return float(start), float(end)


def parse_init(text: str | None, n: int) -> tuple[str, int] | None:
    """``"local(6)"`` -> ("local", 6); a pattern without a parameter by its name alone.

    >>> parse_init("band(4)", 32), parse_init("no-diagonal", 32), parse_init(None, 32)
    (('band', 4), ('no-diagonal', 0), None)
    """
    if text is None:
        return None
    name, _, rest = text.partition("(")
    if name not in PATTERNS:
        raise BadInput(f"`init` {text}: unknown pattern {name}; use one of {', '.join(PATTERNS)}, e.g. `init` local(6)")
    if PATTERNS[name].parameter == "none":
        if rest:
            raise BadInput(f"`init` {text}: {name} takes no parameter")
        return name, 0
    try:
        value = int(rest.removesuffix(")")) if rest.endswith(")") else None
    except ValueError:
        value = None
    if value is None or not 1 <= value < n:
        raise BadInput(
            f"`init` {text}: give {name}'s {PATTERNS[name].parameter} between 1 and n - 1 = {n - 1}, e.g. `init` {name}(4)"
        )
    return name, value
