"""The settings of :func:`attnlens.analysis.reconstruct.reconstruct`, and the map scopes and row modes it knows."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.analysis.objectives import OBJECTIVES
from attnlens.analysis.reconstruct.selection import check_ks, check_strategies
from attnlens.analysis.task import TaskSettings
from attnlens.errors import BadInput
from attnlens.models.precision import DEFAULT_PRECISION, PRECISIONS
from attnlens.settings import (
    CorpusSettings,
    Settings,
    at_least,
    group,
    numbered_from_zero,
    one_of,
    positive,
    probability,
    setting,
)

SCOPES = ("head", "layer", "all")
ROW_MODES = ("auto", "pooled", "per-query")


@dataclass(frozen=True)
class MapSettings(Settings):
    """The maps: fitted at each of ``ks`` exact keys (default 1, 2, 4, … n), chosen by each of the key-selection
    ``strategies``, one per ``scopes`` (head, layer, all), for ``rows`` pooled or per query (``auto``: per
    query for causal models) with relative ``ridge``, in ``layers`` (``None``: all); ``pairs`` mode and its
    ``pairs_ridge``."""

    ks: tuple[int, ...] | None = None
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = SCOPES
    rows: str = "auto"
    ridge: float = 1e-6
    layers: tuple[int, ...] | None = None
    pairs: bool = False
    pairs_ridge: float = 0.1

    def validate(self) -> None:
        if self.ks is not None:  # k <= n is checked once n is known (a store's n need not be seq_len)
            check_ks(self.ks, n=max(self.ks, default=0))
        check_strategies(self.strategies)
        _check_scopes("scopes", self.scopes)
        one_of("rows", self.rows, ROW_MODES)
        numbered_from_zero("layers", self.layers)
        at_least("ridge", self.ridge, 0)
        at_least("pairs_ridge", self.pairs_ridge, 0)


@dataclass(frozen=True)
class PlugInSettings(Settings):
    """The model run with the reconstruction inside attention (``enabled``, flag ``plug_in``), in ``layers``
    and ``scopes`` (flags ``plug_in_layers``, ``plug_in_scopes``; ``None``: all layers, the maps' scopes),
    judged by ``objective``; ``learn_r``: the maps fine-tuned on the objective for ``learn_steps`` at ``learn_lr``."""

    enabled: bool = setting(False, flag="plug_in")
    layers: tuple[int, ...] | None = setting(None, flag="plug_in_layers")
    scopes: tuple[str, ...] | None = setting(None, flag="plug_in_scopes")
    objective: str = "auto"
    learn_r: bool = False
    learn_steps: int = 60
    learn_lr: float = 1e-3

    def validate(self) -> None:
        numbered_from_zero("plug_in_layers", self.layers)
        if self.scopes is not None:
            _check_scopes("plug_in_scopes", self.scopes)
        one_of("objective", self.objective, OBJECTIVES)
        if self.learn_r:
            at_least("learn_steps", self.learn_steps, 1)
            positive("learn_lr", self.learn_lr)


@dataclass(frozen=True)
class TaskJudgedSettings(Settings):
    """Which plug-in runs the task judges (each judgement costs a forward of the held-out examples at the
    maps' width, so a report judges only its headline configs): the ``strategies``, ``ks`` and ``scopes``
    (flags ``task_strategies``, ``task_ks``, ``task_scopes``; each ``None``: all of them). ``joint_r`` (flag
    ``task_joint_r``, ``finetune`` protocol) also judges each with its maps trained jointly with the weights
    from the closed form (:mod:`~attnlens.analysis.reconstruct.joint`): the ``joint_`` columns; ``joint_ks``
    (flag ``task_joint_ks``) limits that to some of the ``ks`` (``None``: all)."""

    strategies: tuple[str, ...] | None = setting(None, flag="task_strategies")
    ks: tuple[int, ...] | None = setting(None, flag="task_ks")
    scopes: tuple[str, ...] | None = setting(None, flag="task_scopes")
    joint_r: bool = setting(False, flag="task_joint_r")
    joint_ks: tuple[int, ...] | None = setting(None, flag="task_joint_ks")

    def validate(self) -> None:
        _check_scopes("task_scopes", SCOPES if self.scopes is None else self.scopes)
        if self.strategies is not None:
            check_strategies(self.strategies)
        if self.ks is not None:
            check_ks(self.ks, n=max(self.ks, default=0))
        outside = [k for k in self.joint_ks or () if self.ks is not None and k not in self.ks]
        if outside:
            raise BadInput(f"`task_joint_ks` {outside[0]} is not among the `task_ks` the task judges; add it to `task_ks`")


@dataclass(frozen=True)
class ReconstructSettings(CorpusSettings):
    """Settings of :func:`~attnlens.analysis.reconstruct.reconstruct`: ``num_seqs`` blocks of which
    ``eval_fraction`` are held out, ``bootstrap`` resamples for the intervals, and groups: the ``maps``
    (:class:`MapSettings`), the ``plug_in`` runs (:class:`PlugInSettings`) and, with a ``task``
    (:class:`~attnlens.analysis.task.TaskSettings`), which plug-in runs it also judges by task accuracy
    under its ``protocol`` (``on_task``: :class:`TaskJudgedSettings`). ``precision`` is the plug-in runs'
    arithmetic (and learned R's, and the task's: :mod:`attnlens.models.precision`); the maps are fitted
    from scores captured in float32 whatever it is. Every setting also has one flat name
    (``ReconstructSettings.build(task_ks=(16,))``, ``--task-ks 16``).

    >>> ReconstructSettings.build(scopes=["head", "row"])
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: scopes row is unknown; use some of head, layer, all
    """

    num_seqs: int = 256
    eval_fraction: float = 0.25
    batch_size: int = 16
    bootstrap: int = 1000
    precision: str = DEFAULT_PRECISION  # the plug-in runs' arithmetic (never the maps' fit), the task's too (passed down)
    maps: MapSettings = group(MapSettings)
    plug_in: PlugInSettings = group(PlugInSettings)
    on_task: TaskJudgedSettings = group(TaskJudgedSettings)
    task: TaskSettings = group(TaskSettings)

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 2, " (some to fit the maps, some to judge them)")
        probability("eval_fraction", self.eval_fraction)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")
        one_of("precision", self.precision, PRECISIONS)
        if self.on_task.joint_r and self.task.protocol != "finetune":
            raise BadInput("`task_joint_r` trains the maps with the weights: it needs `protocol` finetune")
        if self.task.name is not None and not self.plug_in.enabled:
            raise BadInput("`task` judges the plug-in runs (the model with the reconstruction inside); add `plug_in`")


def _check_scopes(name: str, scopes: tuple[str, ...]) -> None:
    bad = [scope for scope in scopes if scope not in SCOPES]
    if bad or not scopes:
        raise BadInput(f"`{name}` {bad[0] if bad else '(none)'} is unknown; use some of {', '.join(SCOPES)}")
