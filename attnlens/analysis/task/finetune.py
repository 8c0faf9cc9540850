"""The ``finetune`` protocol: the encoder and a head started from the probe, trained with the change
inside attention, each run's weights cached under a key of everything that decides them. At the
judge's ``precision`` bfloat16 the forwards run under bfloat16 autocast; the weights, the head and
AdamW's state stay float32 (:mod:`attnlens.models.precision`)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Change
from attnlens.analysis.task.batching import batches, changed_capture, per_example, pooled_features
from attnlens.analysis.task.outcomes import scored
from attnlens.analysis.task.probe import Probe, ProbeHead
from attnlens.analysis.task.settings import TaskSettings
from attnlens.data.tasks import Examples, Task
from attnlens.models.cache import cache_dir
from attnlens.models.loading import LoadedModel, module_sha256
from attnlens.models.precision import DEFAULT_PRECISION
from attnlens.progress import Progress, Stage, progress_bar

FINETUNE_VERSION = 4  # part of the cache key: bump when the training recipe changes


def content_key(name: str, *tensors: torch.Tensor) -> str:
    """A change's key from its name and the tensors that define it (learned logits, fitted maps),
    so that a cached fine-tune run is reused only for the very same change."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"{name}/{digest.hexdigest()[:16]}"


@runtime_checkable
class TrainedChange(Protocol):
    """A change with tensors of its own that a fine-tune trains (its ``trainable()`` gave parameter
    groups, as :class:`~attnlens.analysis.reconstruct.joint.JointMaps` does): they are cached with the
    run's weights (``state``) and set from the cache (``load``)."""

    def state(self) -> list[torch.Tensor]: ...

    def load(self, state: list[torch.Tensor]) -> None: ...


def _trained(change: Change | None, groups: list[dict]) -> TrainedChange | None:
    """``change`` where it trains tensors of its own (``groups``), which the cache then keeps; else ``None``."""
    if not groups:
        return None
    # an invariant of the change kinds, not user input: a kind that trains tensors can save and load them
    assert isinstance(change, TrainedChange), f"{type(change).__name__} trains tensors but has no state() and load()"
    return change


class FineTuning:
    """The fine-tuning half of :class:`~attnlens.analysis.task.judge.TaskJudge`, a mixin of it: a
    change judged by ``finetune`` is judged by ``settings.seeds`` encoders and heads trained with it
    (:meth:`_finetune`, cached by :meth:`finetune_key`).

    It reads the judge's model, settings, split and probe, and records
    each run in ``finetune_runs`` and ``last_finetune``.
    """

    # set by TaskJudge.__init__ (last_finetune by each run): declared here for readers and type checkers
    model: LoadedModel
    settings: TaskSettings
    progress: Progress
    batch_size: int
    seed: int
    pooling: str
    task: Task
    train: Examples
    probe: Probe | None
    finetune_runs: list[dict]
    last_finetune: dict
    _removed: np.ndarray

    def _fitted_probe(self) -> Probe:
        """The probe the head starts from: every protocol but ``head`` (the model's own classifier, no
        probe) fits one before anything is judged."""
        assert self.probe is not None, "only the head protocol has no probe, and it neither fine-tunes nor refits"
        return self.probe

    def _finetuned(self, change: Change | None, examples: Examples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example, over the fine-tune seeds: the fraction of seeds that classify it right, the
        mean cross-entropy, and each seed's outcomes (for :meth:`_across_seeds`)."""
        outcomes = [self._finetuned_once(change, self.seed + number, examples) for number in range(self.settings.seeds)]
        correct, losses = (np.stack(arrays) for arrays in zip(*outcomes))
        return correct.mean(0), losses.mean(0), correct

    def _finetuned_once(self, change: Change | None, seed: int, examples: Examples) -> tuple[np.ndarray, np.ndarray]:
        module, head, change = self._finetune(change, seed)
        module.eval()
        compute = lambda batch: head(pooled_features(module, self.pooling, batch, self.settings.precision))
        return scored(per_example(self.model, self.batch_size, examples, change, compute, self._removed), examples.labels)

    def finetune_key(self, change: Change | None, seed: int | None = None) -> str:
        """The cache key of a fine-tune run: everything that decides its weights."""
        probe = self._fitted_probe()
        parts = {
            "version": FINETUNE_VERSION,
            # the weights the fine-tune starts from, hashed now: a change learned with the weights (a DAM
            # mask) is fine-tuned from the weights it was learned with
            "model": module_sha256(self.model.model),
            "task": self.task.sha256,
            "train_rows": hashlib.sha256(self.train.rows.tobytes()).hexdigest(),
            "width": int(self.train.ids.shape[1]),
            "settings": {"steps": self.settings.finetune_steps, "lr": self.settings.finetune_lr},
            # the head starts from the probe: anything that changes the probe changes the run
            "probe": content_key("probe", *(torch.as_tensor(a) for a in (probe.mean, probe.scale, probe.coef, probe.intercept))),
            "batch_size": self.batch_size,
            "seed": self.seed if seed is None else seed,
            "change": None if change is None else change.key,
            # a run trained in bfloat16 is another run; float32 keeps the keys written before the setting existed
            **({"precision": self.settings.precision} if self.settings.precision != DEFAULT_PRECISION else {}),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def _finetune(self, change: Change | None, seed: int) -> tuple[nn.Module, ProbeHead, Change | None]:
        """The encoder and head trained with ``change`` in the loop (dropout and batch order drawn
        with ``seed``), and the change as trained with them (a change with tensors of its own, such
        as jointly learned maps, trains them alongside), from the cache when it holds them."""
        module = copy.deepcopy(self.model.model)
        head = ProbeHead(self._fitted_probe()).to(self.model.device)
        change, groups = change.trainable() if change is not None else (None, [])
        trained = _trained(change, groups)
        path = cache_dir() / "finetune" / f"{self.finetune_key(change, seed)}.pt"
        self.last_finetune = {
            "change": None if change is None else change.key,
            "seed": seed,
            "cache": str(path),
            "from_cache": path.is_file(),
        }
        if path.is_file():
            state = torch.load(path, map_location=self.model.device, weights_only=True)
            module.load_state_dict(state["encoder"])
            head.load_state_dict(state["head"])
            if trained is not None:
                trained.load(state["change"])
            self.last_finetune["curve"] = state["curve"].tolist()
        else:
            curve = self._train(module, head, change, seed, groups)
            self.last_finetune["curve"] = curve
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")  # written whole, then renamed: a killed run leaves no half file
            state = {"encoder": module.state_dict(), "head": head.state_dict(), "curve": torch.tensor(curve)}
            torch.save({**state, **({"change": trained.state()} if trained is not None else {})}, temporary)
            temporary.replace(path)
        self.finetune_runs.append(self.last_finetune)
        return module, head, change

    def _train(self, module: nn.Module, head: ProbeHead, change: Change | None, seed: int, groups: list[dict]) -> list[float]:
        s = self.settings
        torch.manual_seed(seed)  # dropout
        optimiser = torch.optim.AdamW(
            [
                {"params": module.parameters(), "lr": s.finetune_lr},
                {"params": head.parameters(), "lr": 100 * s.finetune_lr},
                *groups,  # the change's own tensors, if it has any
            ]
        )
        rng = np.random.default_rng(seed)
        order: list[int] = []
        curve = []
        module.train()
        shown = self.progress.here() if isinstance(self.progress, Stage) else self.progress
        with progress_bar(total=s.finetune_steps, desc=f"fine-tune, seed {seed}", unit="step", enabled=shown) as bar:
            for _ in range(s.finetune_steps):
                curve.append(self._step(module, head, change, optimiser, rng, order))
                bar.update(1)
        module.eval()
        return curve

    def _step(
        self, module: nn.Module, head: ProbeHead, change: Change | None, optimiser, rng: np.random.Generator, order: list[int]
    ) -> float:
        """One fine-tune step on the next batch of ``order`` (taken from it; refilled from ``rng``'s
        permutations of the training examples); returns its loss."""
        if len(order) < self.batch_size:
            order.extend(rng.permutation(len(self.train)).tolist())
        chosen = np.sort(order[: self.batch_size])
        del order[: self.batch_size]
        batch = next(batches(self.train.take(chosen), self.batch_size, self.model.device))
        with torch.enable_grad(), changed_capture(change, batch, self.model):
            # the forward at the judge's precision (parameters, gradients and AdamW's state stay float32)
            features = pooled_features(module, self.pooling, batch, self.settings.precision)
            loss = nn.functional.cross_entropy(head(features), batch.labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return float(loss.detach())
