"""The settings of :func:`attnlens.analysis.reconstruct.reconstruct`, and the map scopes and row modes it knows."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.analysis.objectives import OBJECTIVES
from attnlens.analysis.reconstruct.selection import check_ks, check_strategies
from attnlens.analysis.task import TaskSettings
from attnlens.errors import BadInput
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero, one_of, positive, probability

SCOPES = ("head", "layer", "all")
ROW_MODES = ("auto", "pooled", "per-query")


@dataclass(frozen=True)
class ReconstructSettings(CorpusSettings, TaskSettings):
    """Settings of :func:`~attnlens.analysis.reconstruct.reconstruct`: ``num_seqs`` blocks of which ``eval_fraction`` are
    held out; the ``ks`` (default 1, 2, 4, … n), key-selection ``strategies``, map
    ``scopes``, ``rows`` (pooled or per query; ``auto`` picks per query for causal
    models) and relative ``ridge`` of the maps; ``layers`` analysed; ``pairs`` mode and
    its ridge; ``plug_in`` (the model run with the reconstruction inside attention, in
    ``plug_in_layers`` and ``plug_in_scopes``) judged by ``objective``; ``learn_r``
    (maps fine-tuned on the objective for ``learn_steps`` at ``learn_lr``). With ``task``
    (:class:`~attnlens.analysis.task.TaskSettings`), the plug-in runs are also judged by
    task accuracy under ``protocol`` (for the strategies in ``task_strategies``, the ``task_ks`` and
    the ``task_scopes``; each ``None``: all of them; each judgement costs a forward of the
    held-out examples at the maps' width, so a report judges only its headline configs).
    ``task_joint_r`` (``finetune`` protocol) also judges each of them with its maps trained
    jointly with the weights from the closed form (:mod:`~attnlens.analysis.reconstruct.joint`):
    the ``joint_`` columns; ``task_joint_ks`` limits that to some of the ``task_ks`` (``None``: all).

    >>> ReconstructSettings(scopes=["head", "row"])
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: scopes row is unknown; use some of head, layer, all
    """

    num_seqs: int = 256
    eval_fraction: float = 0.25
    ks: tuple[int, ...] | None = None
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = SCOPES
    rows: str = "auto"
    ridge: float = 1e-6
    layers: tuple[int, ...] | None = None
    pairs: bool = False
    pairs_ridge: float = 0.1
    plug_in: bool = False
    plug_in_layers: tuple[int, ...] | None = None
    plug_in_scopes: tuple[str, ...] | None = None
    task_strategies: tuple[str, ...] | None = None
    task_ks: tuple[int, ...] | None = None
    task_scopes: tuple[str, ...] | None = None
    task_joint_r: bool = False
    task_joint_ks: tuple[int, ...] | None = None
    objective: str = "auto"
    learn_r: bool = False
    learn_steps: int = 60
    learn_lr: float = 1e-3
    batch_size: int = 16

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 2, " (some to fit the maps, some to judge them)")
        probability("eval_fraction", self.eval_fraction)
        if self.ks is not None:  # k <= n is checked once n is known (a store's n need not be seq_len)
            check_ks(self.ks, n=max(self.ks, default=0))
        check_strategies(self.strategies)
        for name, scopes in (
            ("scopes", self.scopes),
            ("plug_in_scopes", self.scopes if self.plug_in_scopes is None else self.plug_in_scopes),
            ("task_scopes", SCOPES if self.task_scopes is None else self.task_scopes),
        ):
            bad = [scope for scope in scopes if scope not in SCOPES]
            if bad or not scopes:
                raise BadInput(f"`{name}` {bad[0] if bad else '(none)'} is unknown; use some of {', '.join(SCOPES)}")
        one_of("rows", self.rows, ROW_MODES)
        numbered_from_zero("layers", self.layers)
        numbered_from_zero("plug_in_layers", self.plug_in_layers)
        at_least("ridge", self.ridge, 0)
        at_least("pairs_ridge", self.pairs_ridge, 0)
        one_of("objective", self.objective, OBJECTIVES)
        if self.task_strategies is not None:
            check_strategies(self.task_strategies)
        if self.task_ks is not None:
            check_ks(self.task_ks, n=max(self.task_ks, default=0))
        if self.task_joint_r and self.protocol != "finetune":
            raise BadInput("`task_joint_r` trains the maps with the weights: it needs `protocol` finetune")
        outside = [k for k in self.task_joint_ks or () if self.task_ks is not None and k not in self.task_ks]
        if outside:
            raise BadInput(f"`task_joint_ks` {outside[0]} is not among the `task_ks` the task judges; add it to `task_ks`")
        if self.task is not None and not self.plug_in:
            raise BadInput("`task` judges the plug-in runs (the model with the reconstruction inside); add `plug_in`")
        if self.learn_r:
            at_least("learn_steps", self.learn_steps, 1)
            positive("learn_lr", self.learn_lr)
