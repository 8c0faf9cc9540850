"""Plug-in runs: the model with each config's maps inside attention, judged on the held-out
blocks by the objective and, with a task, on its examples by accuracy (with ``task_joint_r``,
also with the maps trained jointly with the weights: :mod:`attnlens.analysis.reconstruct.joint`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from attnlens.analysis.evaluation import bootstrap_interval, evaluate_change, prepare_batches
from attnlens.analysis.objectives import Objective
from attnlens.analysis.reconstruct.cost import partial_ratio
from attnlens.analysis.reconstruct.joint import JointMaps
from attnlens.analysis.reconstruct.maps import LayerMaps, evaluate_objective, reconstruction
from attnlens.analysis.reconstruct.settings import ReconstructSettings
from attnlens.analysis.task import PreparedTask, TaskJudge, content_key, prepare_task, task_columns
from attnlens.errors import BadInput
from attnlens.models.loading import LoadedModel, load_model
from attnlens.progress import Progress
from attnlens.rows.sources import ModelRows, StoreRows, model_pairs

if TYPE_CHECKING:  # the package's orchestration imports this module
    from attnlens.analysis.reconstruct import ReconstructPlan


def judge_plug_in(
    objective: Objective,
    rows: StoreRows | ModelRows,
    plan: ReconstructPlan,
    evaluated: np.ndarray,
    s: ReconstructSettings,
    progress: Progress = False,
    prepared: PreparedTask | None = None,
) -> PlugIn:
    """The model run with each config's maps inside attention on the held-out blocks (and, with a
    task, ``prepared`` by :func:`prepared_task`, its examples padded to the maps' width n; its
    fine-tunes name their steps on ``progress``); with ``learn_r`` alone, the layers and batches it needs."""
    layers = plan.layers if s.plug_in.layers is None else rows.check_layers(s.plug_in.layers)
    scopes = set(plan.scopes if s.plug_in.scopes is None else s.plug_in.scopes) if s.plug_in.enabled else set()
    task = None
    if s.task.name is not None and s.plug_in.enabled:
        task = TaskJudge(
            objective.model,
            s.task,
            seq_len=plan.n,
            batch_size=s.batch_size,
            seed=s.seed,
            pad_to=plan.n,
            progress=progress,
            prepared=prepared,
        )
    used = [layer for layer in layers if layer in plan.layers]
    return PlugIn(
        objective, used, rows.tokens(evaluated), s.batch_size, s.seed, scopes, task, _judged_by_task(s), _judged_jointly(s)
    )


def prepared_task(model: LoadedModel, n: int, s: ReconstructSettings) -> PreparedTask:
    """The task of the plug-in runs, loaded, checked and split at the maps' width ``n`` before any forward pass."""
    return prepare_task(model, s.task, seq_len=n, seed=s.seed, pad_to=n)


def _judged_jointly(s: ReconstructSettings) -> Callable[[int], bool]:
    """Whether a task-judged config at k is also judged with its maps trained with the weights."""
    return lambda k: s.on_task.joint_r and (s.on_task.joint_ks is None or k in s.on_task.joint_ks)


def _judged_by_task(s: ReconstructSettings) -> Callable[[tuple[str, str, int]], bool]:
    """Whether a (strategy, scope, k) config is judged by the task: its strategy, scope and k each
    among the task's (``None``: any)."""
    wanted = (s.on_task.strategies, s.on_task.scopes, s.on_task.ks)
    return lambda config: all(chosen is None or value in chosen for value, chosen in zip(config, wanted))


def model_for_plug_in(rows: StoreRows | ModelRows, model: str | LoadedModel | None, device: str) -> LoadedModel:
    """The model the maps are plugged into: the rows' own, or for a store the ``model`` it was made with (checked by its weights)."""
    if isinstance(rows, ModelRows):
        return rows.model
    if model is None:
        raise BadInput("plug-in evaluation runs the model: give `model` (the model the store was made with)")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    if loaded.weights_sha256() != rows.model_info["weights_sha256"]:
        raise BadInput(
            f"the store was made with model '{rows.model_info['name']}' (weights {rows.model_info['weights_sha256'][:12]}), "
            f"not '{loaded.name}' (weights {loaded.weights_sha256()[:12]}); give the same `model`"
        )
    return loaded


class PlugIn:
    """Runs the model with each config's maps inside attention, on the held-out blocks."""

    def __init__(
        self,
        objective: Objective,
        layers: list[int],
        eval_ids: np.ndarray,
        batch_size: int,
        seed: int,
        scopes: set[str],
        task: TaskJudge | None = None,
        judged_by_task: Callable[[tuple[str, str, int]], bool] = lambda config: True,
        joint: Callable[[int], bool] = lambda k: False,
    ) -> None:
        self.objective, self.layers, self.scopes, self.task = objective, layers, scopes, task
        self.judged_by_task, self.joint = judged_by_task, joint
        self.seed = seed
        self.batches = prepare_batches(objective, eval_ids, batch_size)
        self.baseline = evaluate_objective(objective, self.batches, None)["loss"] if scopes else None
        self.records: list[dict] = []
        self._pairs: np.ndarray | None = None  # the changed layers' (query, key) pairs at the task's width

    def wants(self, scope: str) -> bool:
        return scope in self.scopes

    def run(self, config: tuple[str, str, int], maps: dict[int, LayerMaps]) -> None:
        strategy, scope, k = config
        used = {layer: maps[layer] for layer in self.layers}
        task = self.task if self.task is not None and self.judged_by_task(config) else None  # judged by the task
        key = "reconstruct/" + "/".join(map(str, config))
        if task is not None:  # a cached fine-tune run is reused only for the very same maps
            key = content_key(key, *[t for m in used.values() for t in (m.positions, m.weights, m.offset)])
        change = reconstruction(used, key)
        metrics = evaluate_change(self.objective, self.batches, [None] * len(self.batches), change)
        record = {
            "strategy": strategy,
            "scope": scope,
            "k": k,
            "layers": " ".join(map(str, self.layers)),
            "objective": self.objective.name,
        }
        baseline = self.baseline
        assert baseline is not None, "a run is for a wanted scope, and with any scope the baseline is measured"
        metrics = {**metrics, "loss_increase": metrics["loss"] - baseline}
        if self.objective.name == "hidden":  # the unmodified loss is 0: loss would repeat loss_increase
            del metrics["loss"]
        for name, values in metrics.items():
            mean, low, high = bootstrap_interval(values[None], seed=self.seed)
            record.update({name: float(mean[0]), f"{name}_low": float(low[0]), f"{name}_high": float(high[0])})
        record["baseline_loss"] = float(baseline.mean())
        if task is not None:
            judged = task_columns(task.judge(change))
            examples = judged["held_out"]
            assert isinstance(examples, int), "a judgement counts the held-out examples it used"
            record.update({**judged, "task_flops_ratio": self._flops_on_task(task, k, examples)})
        if task is not None and self.joint(k):  # the same maps, trained with the weights from the closed form
            joint = JointMaps(used, scope, f"{key}/joint")
            record.update({f"joint_{name}": value for name, value in task_columns(task.judge(joint)).items()})
        self.records.append(record)

    def _flops_on_task(self, task: TaskJudge, k: int, examples: int) -> float:
        """The FLOPs ratio at k on the valid pairs of the task examples a judgement used: each example's own
        tokens, over the pairs the changed layers compute (their causal triangles, windows)."""
        if self._pairs is None:  # one forward of one block, once
            pairs = model_pairs(task.model, task.pool.ids.shape[1], self.layers)
            self._pairs = np.stack([pairs[layer] for layer in self.layers])
        return partial_ratio(self._pairs, task.model.head_dim, k, task.pool.lengths[:examples])
