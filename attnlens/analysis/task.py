"""Task accuracy: judge a change to attention by what a classifier on the model gets right.

The papers judge attention by a downstream task (MNLI, GLUE); so can attnlens, on a
labelled task (:mod:`attnlens.data.tasks`), under one of three protocols:

- ``probe``: the frozen model's pooled features (:data:`POOLING`: the mean of the valid
  tokens' final hidden states for encoders, the last valid token's for decoders), a
  scikit-learn logistic regression (features standardised by :func:`standardiser`, L2
  penalty ``probe_c``, chosen by cross-validation unless given) fitted on the
  **unmodified** model's training features. A change is judged by the held-out
  accuracy of that same probe on the changed model's features: the readout does not adapt.
- ``refit``: the probe is fitted again on the changed model's training features (a
  readout that adapts to the change, the encoder still frozen).
- ``finetune``: the encoder and a linear head on the pooled features trained together,
  with the change inside attention during training (the papers' protocol). The head
  (:class:`ProbeHead`) starts from the unmodified probe; ``finetune_steps`` AdamW steps on
  the training examples, dropout on (the fixed budget is the stopping rule; the curve is
  recorded). Each run's weights are cached under the attnlens cache, keyed by model, task,
  split, probe, settings, change and seed, so a rerun loads them instead of training.

Every judgement carries the accuracy with a percentile-bootstrap interval over held-out
examples, the change in accuracy paired over examples, the probe's cross-entropy, the
unmodified model's accuracy and the majority-class baseline.

>>> from attnlens import load_model
>>> judge = TaskJudge(load_model("minilm-l6"), TaskSettings(task="rotten-tomatoes", task_train=64, task_eval=32),
...                   seq_len=64, batch_size=32)
>>> unmodified = judge.judge(None)
>>> unmodified["accuracy"] == judge.unmodified_accuracy, unmodified["delta_accuracy"]
(True, 0.0)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Batch, Change
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.data.tasks import BUILTIN_TASKS, Examples, Task, load_task
from attnlens.errors import BadInput
from attnlens.models.cache import cache_dir
from attnlens.models.capture import Capture, Intervention
from attnlens.models.loading import LoadedModel
from attnlens.settings import Settings, at_least, one_of, positive

PROTOCOLS = ("probe", "refit", "finetune")
POOLING: dict[bool, str] = {False: "mean", True: "last"}  # by LoadedModel.causal: what each family pools
MIN_HELD_OUT = 20  # fewer held-out examples give percentile intervals that mean little
CONSTANT_SPREAD = 1e-6  # a feature spread below this fraction of the median spread is rounding, not signal
PROBE_CS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # the grid :func:`choose_c` searches
FINETUNE_VERSION = 2  # part of the cache key: bump when the training recipe changes


@dataclass(frozen=True)
class TaskSettings(Settings):
    """Which task judges a change, and how: ``task`` (``None``: no task; a built-in name or
    a file), its ``text_column``/``label_column``, ``task_train`` and ``task_eval`` examples
    (disjoint, seeded), the ``protocol``, the probe's inverse L2 strength ``probe_c`` (``None``:
    chosen by cross-validation on the training examples, :func:`choose_c`), and
    the fine-tune recipe (``finetune_steps``, ``finetune_lr`` for the encoder; the head
    takes 100× that). ``bootstrap`` resamples give the intervals.

    >>> TaskSettings(protocol="finetune")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: protocol finetune needs task; name a task (imdb, rotten-tomatoes or a file)
    """

    task: str | None = None
    protocol: str = "probe"
    text_column: str = "text"
    label_column: str = "label"
    task_train: int = 1024
    task_eval: int = 512
    probe_c: float | None = None
    finetune_steps: int = 200
    finetune_lr: float = 2e-5
    bootstrap: int = 1000

    def validate(self) -> None:
        super().validate()
        one_of("protocol", self.protocol, PROTOCOLS)
        if self.task is None and self.protocol != "probe":
            raise BadInput(f"`protocol` {self.protocol} needs `task`; name a task (imdb, rotten-tomatoes or a file)")
        if self.task is not None and self.task not in BUILTIN_TASKS and not Path(self.task).expanduser().exists():
            raise BadInput(
                f"`task` {self.task} is neither a built-in ({', '.join(BUILTIN_TASKS)}) nor an existing file or folder"
            )
        at_least("task_eval", self.task_eval, MIN_HELD_OUT, " held-out examples for a bootstrap interval")
        at_least("task_train", self.task_train, 2)
        if self.probe_c is not None:
            positive("probe_c", self.probe_c)
        at_least("finetune_steps", self.finetune_steps, 1)
        positive("finetune_lr", self.finetune_lr)
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")

    @classmethod
    def of(cls, settings: Settings) -> TaskSettings:
        """The task fields of an analysis's settings (which mix this class in)."""
        return cls(**{field.name: getattr(settings, field.name) for field in dataclasses.fields(cls)})


def content_key(name: str, *tensors: torch.Tensor) -> str:
    """A change's key from its name and the tensors that define it (learned logits, fitted maps),
    so that a cached fine-tune run is reused only for the very same change."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"{name}/{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class TaskBatch:
    """One batch of examples on the model's device; ``start`` is its first example's index."""

    ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    start: int

    def view(self, model: LoadedModel) -> Batch:
        """The batch as a change reads it: its tokens, seeded by its first example's number."""
        return Batch(self.ids, model, self.start, keys_by_class=True)


def batches(examples: Examples, batch_size: int, device: torch.device) -> Iterator[TaskBatch]:
    for start in range(0, len(examples), batch_size):
        part = slice(start, start + batch_size)
        yield TaskBatch(
            torch.from_numpy(examples.ids[part]).to(device),
            torch.from_numpy(examples.attention_mask[part]).to(device),
            torch.from_numpy(examples.labels[part]).to(device),
            start,
        )


def pooled_features(module: nn.Module, pooling: str, batch: TaskBatch) -> torch.Tensor:
    """(batch, hidden) float32 features: the final hidden states pooled as ``pooling`` says."""
    hidden = module.base_model(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state.float()
    mask = batch.attention_mask.to(hidden.dtype)
    if pooling == "mean":
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    last = batch.attention_mask.sum(1) - 1  # examples are padded at the end
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


# ----------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class Probe:
    """A fitted logistic regression on standardised features: ``logits = ((x - mean) / scale) @ coef.T + intercept``.

    Binary probes carry one row of ``coef``; their logits are ``[0, z]``.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    iterations: int
    converged: bool

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """(classes, features) weights and (classes,) biases on standardised features, the
        binary case's zero row for class 0 included."""
        if self.coef.shape[0] > 1:
            return self.coef, self.intercept
        return np.concatenate([np.zeros_like(self.coef), self.coef]), np.concatenate([[0.0], self.intercept])

    def logits(self, features: np.ndarray) -> np.ndarray:
        weights, bias = self.weights()
        return ((features - self.mean) / self.scale) @ weights.T + bias

    def torch_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The same logits, differentiable in ``features`` (for training a change against the task)."""
        as_tensor = lambda array: torch.as_tensor(array, dtype=torch.float64, device=features.device)
        weights, bias = self.weights()
        return ((features.double() - as_tensor(self.mean)) / as_tensor(self.scale)) @ as_tensor(weights).T + as_tensor(bias)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.logits(features).argmax(1)


def standardiser(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation per feature (as scikit-learn's ``StandardScaler``), with
    features whose spread is below :data:`CONSTANT_SPREAD` of the median spread treated as
    constant (scale 1). Pooled hidden states have such dimensions: their spread is float
    rounding (1e-32), and dividing by it would turn the smallest change to attention, or
    dropout while fine-tuning, into an enormous feature.

    >>> mean, scale = standardiser(np.array([[0.0, 1.0], [2.0, 1.0 + 1e-20]]))
    >>> scale.tolist()
    [1.0, 1.0]
    """
    mean, scale = features.mean(0), features.std(0)
    return mean, np.where(scale < CONSTANT_SPREAD * np.median(scale), 1.0, scale)


def choose_c(features: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """The probe's ``C`` from :data:`PROBE_CS` by 5-fold stratified cross-validation on the
    training features (accuracy; ties go to the stronger penalty), standardised once by
    :func:`standardiser`. Held-out examples are never used.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(100, 3)); y = (x[:, 0] > 0).astype(int)
    >>> choose_c(x, y) in PROBE_CS
    True
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    mean, scale = standardiser(features)
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    scores = [
        cross_val_score(LogisticRegression(C=c, max_iter=5000), (features - mean) / scale, labels, cv=folds).mean()
        for c in PROBE_CS
    ]
    return float(PROBE_CS[int(np.argmax(scores))])


def fit_probe(features: np.ndarray, labels: np.ndarray, c: float = 1.0, max_iter: int = 5000) -> Probe:
    """:func:`standardiser`, then scikit-learn's ``LogisticRegression(C=c)`` (lbfgs), as a :class:`Probe`.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(200, 3)); y = (x[:, 0] > 0).astype(int)
    >>> probe = fit_probe(x, y)
    >>> probe.converged, float((probe.predict(x) == y).mean()) > 0.95
    (True, True)
    """
    from sklearn.linear_model import LogisticRegression

    mean, scale = standardiser(features)
    regression = LogisticRegression(C=c, max_iter=max_iter).fit((features - mean) / scale, labels)
    iterations = int(np.max(regression.n_iter_))
    return Probe(mean, scale, regression.coef_, regression.intercept_, iterations, iterations < max_iter)


class ProbeHead(nn.Module):
    """The probe as a trainable head: ``logits = linear((x - mean) / scale)``, starting at the
    probe's weights. The standardisation stays fixed: on raw features the small per-feature
    scales would make the head's weights large and fine-tuning unstable."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        coef, intercept = probe.weights()
        self.register_buffer("mean", torch.as_tensor(probe.mean, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(probe.scale, dtype=torch.float32))
        self.linear = nn.Linear(coef.shape[1], coef.shape[0])
        with torch.no_grad():
            self.linear.weight.copy_(torch.as_tensor(coef))
            self.linear.bias.copy_(torch.as_tensor(intercept))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear((features - self.mean) / self.scale)


# ----------------------------------------------------------------------------- the judge


class TaskJudge:
    """Judges changes to ``model``'s attention by held-out accuracy on a task; see the module docstring.

    Loads the task, splits it (``seq_len`` tokens at most, ``seed``), computes the
    unmodified model's features and fits the probe once; :meth:`judge` then takes one
    :class:`Change` at a time. ``pad_to`` pads every example to that width (changes whose
    shape is fixed, like a reconstruction map of width n, need it).
    """

    def __init__(
        self,
        model: LoadedModel,
        settings: TaskSettings,
        *,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        pad_to: int | None = None,
    ) -> None:
        if settings.task is None:
            raise BadInput("judging by a task needs `task`; name a task (imdb, rotten-tomatoes or a file)")
        self.model, self.settings = model, settings
        self.batch_size, self.seed = batch_size, seed
        self.task: Task = load_task(settings.task, text_column=settings.text_column, label_column=settings.label_column)
        model.check_seq_len(seq_len)
        self.train, self.held_out = self.task.split(
            model, seq_len, settings.task_train, settings.task_eval, seed=seed, pad_to=pad_to
        )
        self.pooling = POOLING[model.causal]
        majority, _ = self.task.majority(self.train.labels)
        self.majority_accuracy = float((self.held_out.labels == majority).mean())
        features = self.features(self.train, None)
        self.c = settings.probe_c if settings.probe_c is not None else choose_c(features, self.train.labels, seed)
        self.probe = fit_probe(features, self.train.labels, self.c)
        self.finetune_runs: list[dict] = []  # every fine-tune run: change, cache file, training curve
        self._unmodified = None
        self._unmodified = self._correct(None)
        self.unmodified_accuracy = float(self._unmodified[0].mean())

    # -- features under a change

    def features(self, examples: Examples, change: Change | None, counts: np.ndarray | None = None) -> np.ndarray:
        """(examples, hidden) float64 pooled features of the model, with ``change`` inside attention
        (adding to ``counts`` the positions it removes and the valid ones, when given)."""
        parts = []
        with torch.no_grad():
            for batch in batches(examples, self.batch_size, self.model.device):
                with _changed(change, batch, self.model, counts):
                    parts.append(pooled_features(self.model.model, self.pooling, batch).double().cpu().numpy())
        return np.concatenate(parts)

    def loss(self, batch: TaskBatch) -> torch.Tensor:
        """Per-example cross-entropy of the unmodified probe, differentiable (runs inside any active capture)."""
        logits = self.probe.torch_logits(pooled_features(self.model.model, self.pooling, batch))
        return nn.functional.cross_entropy(logits, batch.labels, reduction="none")

    # -- judging

    def judge(self, change: Change | None) -> dict[str, object]:
        """Accuracy of the protocol's classifier under ``change`` (``None``: unmodified), with intervals;
        ``"correct"`` holds the per-example 0/1 array (for paired comparisons between changes)."""
        correct, losses = self._correct(change)
        mean, low, high = bootstrap_interval(correct[None], self.settings.bootstrap, self.seed)
        delta = bootstrap_interval((correct - self._unmodified[0])[None], self.settings.bootstrap, self.seed)
        return {
            "protocol": self.settings.protocol,
            "accuracy": float(mean[0]),
            "accuracy_low": float(low[0]),
            "accuracy_high": float(high[0]),
            "delta_accuracy": float(delta[0][0]),
            "delta_accuracy_low": float(delta[1][0]),
            "delta_accuracy_high": float(delta[2][0]),
            "task_loss": float(losses.mean()),
            # what a removal takes from these examples (padding aside): short texts lose less than full blocks
            "task_sparsity": float(self._removed[0] / self._removed[1]) if change is not None and self._removed[1] else 0.0,
            "unmodified_accuracy": self.unmodified_accuracy,
            "majority_accuracy": self.majority_accuracy,
            "correct": correct,
        }

    def _correct(self, change: Change | None) -> tuple[np.ndarray, np.ndarray]:
        """Per held-out example: 1.0 if classified right, and the classifier's cross-entropy."""
        if change is None and self._unmodified is not None:
            return self._unmodified
        self._removed = np.zeros(2)  # (removed, valid) positions on the held-out examples
        if self.settings.protocol == "finetune":
            return self._finetuned(change)
        probe = self.probe
        if self.settings.protocol == "refit" and change is not None:
            probe = fit_probe(self.features(self.train, change), self.train.labels, self.c)
        return _scored(probe.logits(self.features(self.held_out, change, self._removed)), self.held_out.labels)

    # -- fine-tuning

    def _finetuned(self, change: Change | None) -> tuple[np.ndarray, np.ndarray]:
        module, head = self._finetune(change)
        logits = []
        module.eval()
        with torch.no_grad():
            for batch in batches(self.held_out, self.batch_size, self.model.device):
                with _changed(change, batch, self.model, self._removed):
                    logits.append(head(pooled_features(module, self.pooling, batch)).double().cpu().numpy())
        return _scored(np.concatenate(logits), self.held_out.labels)

    def finetune_key(self, change: Change | None) -> str:
        """The cache key of a fine-tune run: everything that decides its weights."""
        parts = {
            "version": FINETUNE_VERSION,
            "model": self.model.weights_sha256(),
            "task": self.task.sha256,
            "train_rows": hashlib.sha256(self.train.rows.tobytes()).hexdigest(),
            "width": int(self.train.ids.shape[1]),
            "settings": {"steps": self.settings.finetune_steps, "lr": self.settings.finetune_lr},
            # the head starts from the probe: anything that changes the probe changes the run
            "probe": content_key(
                "probe", *(torch.as_tensor(a) for a in (self.probe.mean, self.probe.scale, self.probe.coef, self.probe.intercept))
            ),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "change": None if change is None else change.key,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def _finetune(self, change: Change | None) -> tuple[nn.Module, ProbeHead]:
        """The encoder and head trained with ``change`` in the loop, from the cache when it holds them."""
        module = copy.deepcopy(self.model.model)
        head = ProbeHead(self.probe).to(self.model.device)
        path = cache_dir() / "finetune" / f"{self.finetune_key(change)}.pt"
        self.last_finetune = {"change": None if change is None else change.key, "cache": str(path), "from_cache": path.is_file()}
        if path.is_file():
            state = torch.load(path, map_location=self.model.device, weights_only=True)
            module.load_state_dict(state["encoder"])
            head.load_state_dict(state["head"])
            self.last_finetune["curve"] = state["curve"].tolist()
        else:
            curve = self._train(module, head, change)
            self.last_finetune["curve"] = curve
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")  # written whole, then renamed: a killed run leaves no half file
            torch.save({"encoder": module.state_dict(), "head": head.state_dict(), "curve": torch.tensor(curve)}, temporary)
            temporary.replace(path)
        self.finetune_runs.append(self.last_finetune)
        return module, head

    def _train(self, module: nn.Module, head: ProbeHead, change: Change | None) -> list[float]:
        s = self.settings
        torch.manual_seed(self.seed)  # dropout
        optimiser = torch.optim.AdamW(
            [{"params": module.parameters(), "lr": s.finetune_lr}, {"params": head.parameters(), "lr": 100 * s.finetune_lr}]
        )
        rng = np.random.default_rng(self.seed)
        order: list[int] = []
        curve = []
        module.train()
        for _ in range(s.finetune_steps):
            if len(order) < self.batch_size:
                order.extend(rng.permutation(len(self.train)).tolist())
            chosen, order = np.sort(order[: self.batch_size]), order[self.batch_size :]
            batch = next(batches(self.train.take(chosen), self.batch_size, self.model.device))
            with torch.enable_grad(), _changed(change, batch, self.model):
                loss = nn.functional.cross_entropy(head(pooled_features(module, self.pooling, batch)), batch.labels)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            curve.append(float(loss.detach()))
        module.eval()
        return curve

    # -- provenance

    def describe(self) -> dict[str, object]:
        """What a result records about the task, the split and the probe."""
        return {
            **self.task.describe(),
            "protocol": self.settings.protocol,
            "pooling": self.pooling,
            "settings": self.settings.to_dict(),
            "train_rows": self.train.rows.tolist(),
            "held_out_rows": self.held_out.rows.tolist(),
            "width": int(self.held_out.ids.shape[1]),
            "padded": self.held_out.padded or self.train.padded,
            "probe": {
                "iterations": self.probe.iterations,
                "converged": self.probe.converged,
                "C": self.c,
                "C_chosen_by": "given"
                if self.settings.probe_c is not None
                else f"5-fold cross-validation on the training examples over {list(PROBE_CS)}",
            },
            "unmodified_accuracy": self.unmodified_accuracy,
            "majority_accuracy": self.majority_accuracy,
            "finetune": None
            if self.settings.protocol != "finetune"
            else {
                "recipe": f"AdamW, {self.settings.finetune_steps} steps of {self.batch_size} examples, encoder lr "
                f"{self.settings.finetune_lr:g}, head lr {100 * self.settings.finetune_lr:g}, head started from the probe; "
                "the fixed number of steps is the stopping rule",
                "runs": self.finetune_runs,
            },
        }


class TaskLoss:
    """The task's probe loss in the shape of an :class:`~attnlens.analysis.objectives.Objective`
    (``name``, ``model``, ``evaluate``), for training a change (a DAM mask) against the task."""

    name = "task"

    def __init__(self, judge: TaskJudge) -> None:
        self.judge, self.model = judge, judge.model

    def evaluate(self, batch: TaskBatch) -> dict[str, torch.Tensor]:
        return {"loss": self.judge.loss(batch)}


def task_columns(judged: dict[str, object]) -> dict[str, object]:
    """A judgement's columns for a table (everything but the per-example array)."""
    return {name: value for name, value in judged.items() if name != "correct"}


def paired_difference(first: np.ndarray, second: np.ndarray, bootstrap: int, seed: int) -> tuple[float, float, float]:
    """Mean of ``first - second`` (per-example 0/1 arrays) and its bootstrap interval, paired over examples."""
    mean, low, high = bootstrap_interval((np.asarray(first) - np.asarray(second))[None], bootstrap, seed)
    return float(mean[0]), float(low[0]), float(high[0])


def _scored(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    shifted = logits - logits.max(1, keepdims=True)
    log_probability = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return (logits.argmax(1) == labels).astype(np.float64), -log_probability[np.arange(len(labels)), labels]


def _changed(
    change: Change | None, batch: TaskBatch, model: LoadedModel, counts: np.ndarray | None = None
) -> Capture | contextlib.nullcontext:
    """The capture that applies ``change`` to one batch (nothing for no change), counting the
    valid (query, key) positions it removes (sets to -inf) among the examples' own tokens."""
    intervene = None if change is None else change.intervention(batch.view(model))
    if intervene is None:
        return contextlib.nullcontext()
    if counts is not None:
        intervene = _counting(intervene, batch.attention_mask.bool(), counts)
    return Capture(layers=change.layers, intervene=intervene, record=False)


def _counting(intervene: Intervention, queries: torch.Tensor, counts: np.ndarray) -> Intervention:
    """``intervene``, adding to ``counts`` (removed, valid) the positions of real queries
    (padding rows aside) it sets to -inf, over every layer and head it changes."""

    def counted(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
        replaced = intervene(layer, scores, valid)
        if replaced is not None:
            own = (valid & queries[:, :, None])[:, None]
            counts[0] += float((torch.isneginf(replaced) & own).sum())
            counts[1] += float(own.sum()) * replaced.shape[1]
        return replaced

    return counted
