"""Task accuracy: judge a change to attention by what a classifier on the model gets right.

The papers judge attention by a downstream task (MNLI, GLUE); so can attnlens, on a
labelled task (:mod:`attnlens.data.tasks`), under one of four protocols (``auto``, the
default: ``head`` for a model with a sequence-classification head, ``probe`` otherwise):

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
- ``head``: the model's own classification head (a local ``…ForSequenceClassification``
  directory, such as a model fine-tuned on the task), its classes matched to the task's
  by name through its ``id2label``; no probe.

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
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Batch, Change, Removal
from attnlens.analysis.evaluation import bootstrap_interval, layer_groups, valid_masks
from attnlens.data.tasks import Examples, Task, check_task, load_task
from attnlens.errors import BadInput
from attnlens.models.cache import cache_dir, cached_array
from attnlens.models.capture import Capture, Intervention
from attnlens.models.loading import LoadedModel, module_sha256
from attnlens.progress import Progress, Stage, progress_bar
from attnlens.settings import Settings, at_least, one_of, positive

PROTOCOLS = ("auto", "probe", "refit", "finetune", "head")
POOLING: dict[bool, str] = {False: "mean", True: "last"}  # by LoadedModel.causal: what each family pools
MIN_HELD_OUT = 20  # fewer held-out examples give percentile intervals that mean little
AUTO = "auto"  # task_eval: as many held-out examples as the headline changes need (TaskJudge.calibrate)
AUTO_PILOT = 500  # auto's first count; it grows from there
AUTO_POOL = 4000  # auto's cap, beside the number of examples the task has left
Z_INTERVAL = 1.959964  # two-sided 95%
Z_POWER = 0.841621  # 80% power
FEATURES_VERSION = 1  # part of the features cache key: bump when pooling or batching changes
CONSTANT_SPREAD = 1e-6  # a feature spread below this fraction of the median spread is rounding, not signal
PROBE_CS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # the grid :func:`choose_c` searches
FINETUNE_VERSION = 4  # part of the cache key: bump when the training recipe changes


@dataclass(frozen=True)
class TaskSettings(Settings):
    """Which task judges a change, and how: ``task`` (``None``: no task; a built-in name or
    a file), its ``text_column``/``label_column``, ``task_train`` and ``task_eval`` examples
    (disjoint, seeded; ``task_eval="auto"``: as many as the headline changes need for a paired
    Δ half-width of ``task_target``, :meth:`TaskJudge.calibrate`), the ``protocol``, the
    probe's inverse L2 strength ``probe_c`` (``None``: chosen by cross-validation on the
    training examples, :func:`choose_c`), and
    the fine-tune recipe (``finetune_steps``, ``finetune_lr`` for the encoder; the head
    takes 100× that; ``seeds`` runs per change, seeds ``seed``, ``seed + 1``, …, whose
    spread gives an interval across seeds). ``bootstrap`` resamples give the intervals.

    >>> TaskSettings(protocol="finetune")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: protocol finetune needs task; name a task (imdb, rotten-tomatoes or a file)
    """

    task: str | None = None
    protocol: str = "auto"
    text_column: str = "text"
    label_column: str = "label"
    task_train: int = 1024
    task_eval: int | str = 512
    task_target: float = 0.015
    probe_c: float | None = None
    finetune_steps: int = 200
    finetune_lr: float = 2e-5
    seeds: int = 1
    bootstrap: int = 1000

    def validate(self) -> None:
        super().validate()
        one_of("protocol", self.protocol, PROTOCOLS)
        if self.task is None and self.protocol not in ("auto", "probe"):
            raise BadInput(f"`protocol` {self.protocol} needs `task`; name a task (imdb, rotten-tomatoes or a file)")
        if self.task is not None:  # its file is read now: a missing column or a broken line fails before any model loads
            check_task(self.task, text_column=self.text_column, label_column=self.label_column)
        if self.task_eval != AUTO:
            if not isinstance(self.task_eval, int) or isinstance(self.task_eval, bool):
                raise BadInput(f"`task_eval` {self.task_eval!r} must be a number of held-out examples or 'auto'")
            at_least("task_eval", self.task_eval, MIN_HELD_OUT, " held-out examples for a bootstrap interval")
        positive("task_target", self.task_target)
        at_least("task_train", self.task_train, 2)
        if self.probe_c is not None:
            positive("probe_c", self.probe_c)
        at_least("finetune_steps", self.finetune_steps, 1)
        at_least("seeds", self.seeds, 1, " fine-tune runs per change")
        if self.seeds > 1 and self.protocol != "finetune":
            raise BadInput(f"`seeds` {self.seeds} needs `protocol` finetune: only fine-tuning varies from seed to seed")
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
    """One batch of examples on the model's device; ``start`` is its first example's index.

    ``rows`` are the batch's examples' numbers in their :class:`Examples` (length-bucketed
    batches hold examples out of order), and seed each example's random draws, drawn at
    ``draw_width`` and cut to the batch's width, so that an example is changed the same way
    whichever batch, and whatever padding, it is judged in. Without ``rows`` the batch's draws
    are seeded by ``start``.
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    start: int
    rows: np.ndarray | None = None
    draw_width: int | None = None

    def view(self, model: LoadedModel) -> Batch:
        """The batch as a change reads it: its tokens and what seeds its draws."""
        sequences = None if self.rows is None else self.rows.tolist()
        return Batch(self.ids, model, self.start, keys_by_class=True, sequences=sequences, draw_width=self.draw_width)


def batches(examples: Examples, batch_size: int, device: torch.device) -> Iterator[TaskBatch]:
    """``examples`` in batches of ``batch_size``, bucketed by length: sorted by length (stably),
    each batch cut to its own longest example, so short texts do not pay for the longest one.
    Examples padded to a fixed width (``Examples.fixed_width``: a change whose shape is fixed,
    such as a reconstruction map of width n) keep it and their order. A batch's ``rows`` say
    where its examples belong (:func:`in_order` puts per-example results back)."""
    order = np.arange(len(examples)) if examples.fixed_width else np.argsort(examples.lengths, kind="stable")
    for start in range(0, len(examples), batch_size):
        rows = order[start : start + batch_size]
        width = examples.ids.shape[1] if examples.fixed_width else int(examples.lengths[rows].max())
        yield TaskBatch(
            torch.from_numpy(examples.ids[rows, :width]).to(device),
            torch.from_numpy(examples.attention_mask[rows, :width]).to(device),
            torch.from_numpy(examples.labels[rows]).to(device),
            start,
            rows,
            examples.ids.shape[1],
        )


def in_order(parts: list[np.ndarray], batched: list[TaskBatch]) -> np.ndarray:
    """Per-example results of ``batched`` (one array per batch) in the examples' own order."""
    values = np.concatenate(parts)
    ordered = np.empty_like(values)
    ordered[np.concatenate([batch.rows for batch in batched])] = values
    return ordered


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
        progress: Progress = False,
    ) -> None:
        if settings.task is None:
            raise BadInput("judging by a task needs `task`; name a task (imdb, rotten-tomatoes or a file)")
        self.model, self.settings, self.progress = model, settings, progress
        self.batch_size, self.seed = batch_size, seed
        self.task: Task = load_task(settings.task, text_column=settings.text_column, label_column=settings.label_column)
        model.check_seq_len(seq_len)
        auto = settings.task_eval == AUTO
        # auto: every example the task has left, up to AUTO_POOL; calibrate() chooses how many of them judge
        self.train, self.pool = self.task.split(
            model, seq_len, settings.task_train, AUTO_POOL if auto else settings.task_eval, seed=seed, pad_to=pad_to, at_most=auto
        )
        self.protocol = settings.protocol if settings.protocol != "auto" else "head" if model.class_names else "probe"
        self.pooling = POOLING[model.causal]
        self.majority_label, _ = self.task.majority(self.train.labels)
        if self.protocol == "head":  # the model's own classifier: no probe to fit
            self.head_columns, self.c, self.probe = head_columns(model, self.task.label_names), None, None
        else:
            features = self.unmodified_features(self.train)
            self.c = settings.probe_c if settings.probe_c is not None else self._chosen_c(features)
            self.probe = fit_probe(features, self.train.labels, self.c)
        self.finetune_runs: list[dict] = []  # every fine-tune run: change, cache file, training curve
        self.calibration: dict[str, object] | None = None
        self._structure: tuple[list[int], torch.Tensor] | None = None  # removal_share's valid masks, by layer group
        self._judged: dict[str | None, _Outcomes] = {}  # by change key: outcomes on the first examples of the pool
        self._hold_out(min(len(self.pool), AUTO_PILOT) if auto else len(self.pool))

    def _hold_out(self, count: int) -> None:
        """Judge on the first ``count`` examples of the pool (all of them unless ``task_eval`` is auto)."""
        self.held_out = self.pool.take(slice(0, count))
        self.majority_accuracy = float((self.held_out.labels == self.majority_label).mean())
        self._unmodified = self._correct(None)
        self.unmodified_accuracy = float(self._unmodified[0].mean())

    # -- the one-off costs, cached

    def unmodified_features(self, examples: Examples, *, as_judged: bool = False) -> np.ndarray:
        """The unmodified model's features of ``examples``, computed once per model, examples' tokens,
        pooling and batch size, and kept in the attnlens cache (a probe's training features are a
        one-off cost). Padding is not part of the key: padding at the end changes no valid
        token's state beyond float rounding, so analyses that pad to a fixed width share the
        training features, and so the probe, of those that do not. Held-out features
        (``as_judged``) are the baseline every change is paired with, so they are computed in
        the changes' own arithmetic: their width is part of the key where it is fixed."""
        tokens = hashlib.sha256(examples.lengths.astype(np.int64).tobytes())
        tokens.update(examples.ids[examples.attention_mask.astype(bool)].astype(np.int64).tobytes())
        parts = {
            "version": FEATURES_VERSION,
            "model": self.model.weights_sha256(),
            "tokens": tokens.hexdigest(),
            "pooling": self.pooling,
            "width": int(examples.ids.shape[1]) if as_judged and examples.fixed_width else None,
            "batch_size": self.batch_size,
            "device": str(self.model.device),
            "torch": torch.__version__,
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
        return cached_array("task-features", key, lambda: self.features(examples, None))

    def _chosen_c(self, features: np.ndarray) -> float:
        key = hashlib.sha256(features.tobytes() + self.train.labels.tobytes() + str(self.seed).encode()).hexdigest()[:32]
        return float(cached_array("task-probe-c", key, lambda: np.array(choose_c(features, self.train.labels, self.seed)))[()])

    # -- how many held-out examples

    def calibrate(self, changes: list[Change]) -> dict[str, object] | None:
        """With ``task_eval="auto"``: the smallest number of held-out examples (from a pilot of
        :data:`AUTO_PILOT`, growing) at which every change of ``changes`` (the headline ones)
        has a paired Δ half-width of at most ``task_target``, capped by the examples the task
        has; later judgements use that many. Once per judge; ``None`` when ``task_eval`` is a number.

        The half-width needed is read off the paired differences' spread, as the normal
        approximation of the bootstrap interval gives it (1.96 sd / sqrt(N)); the result
        records the half-width reached, which may miss the target when the data run out.
        """
        if self.settings.task_eval != AUTO or self.calibration is not None:
            return self.calibration
        count, target = len(self.held_out), self.settings.task_target
        while True:
            spread = max([self._paired_spread(change) for change in changes] + [0.0])
            needed = math.ceil((Z_INTERVAL * spread / target) ** 2)
            if needed <= count or count == len(self.pool):
                break
            count = min(len(self.pool), math.ceil(1.1 * needed))
            self._hold_out(count)
        reached = Z_INTERVAL * spread / math.sqrt(count)
        self.calibration = {
            "target_halfwidth": target,
            "held_out": count,
            "halfwidth_reached": reached,
            "examples_available": len(self.pool),
            "reached_target": bool(reached <= target),
            "headline_changes": [change.key for change in changes],
        }
        return self.calibration

    def _paired_spread(self, change: Change) -> float:
        correct = self._correct(change)[0]
        return float(np.std(correct - self._unmodified[0], ddof=1))

    def removal_share(self, change: Removal) -> float:
        """The share of the held-out examples' valid positions (their own tokens, every layer and
        head) that ``change`` removes, read off its removal masks without running the model: the
        ``task_sparsity`` a judgement reports, at the cost of building masks only (to match a
        pattern to a mask on the task's own positions before judging either)."""
        if self._structure is None:  # causal, windows: no padding; one forward, once per judge
            self._structure = layer_groups(valid_masks(self.model, self.held_out.ids[:1]))
        group, structures = self._structure
        # a change that depends on a layer only through its valid mask is counted once per distinct mask
        layers = list(range(len(group))) if not change.shared_by_layers else [group.index(g) for g in range(len(structures))]
        heads, removed, total = self.model.num_heads, 0.0, 0.0
        for batch in batches(self.held_out, self.batch_size, self.model.device):
            view, own, width = batch.view(self.model), batch.attention_mask.bool(), batch.ids.shape[1]
            for layer in layers:
                times = 1 if not change.shared_by_layers else group.count(group[layer])
                structure = structures[group[layer], :width, :width].to(own.device)
                valid = structure[None] & own[:, None, :] & own[:, :, None]
                hit = change.removed(view, layer, valid) & valid[:, None]
                removed += times * float(hit.sum()) * (heads // hit.shape[1])
                total += times * float(valid.sum()) * heads
        return removed / total if total else 0.0

    # -- features under a change

    def features(self, examples: Examples, change: Change | None, counts: np.ndarray | None = None) -> np.ndarray:
        """(examples, hidden) float64 pooled features of the model, with ``change`` inside attention
        (adding to ``counts`` the positions it removes and the valid ones, when given)."""
        return self._per_example(examples, change, lambda batch: pooled_features(self.model.model, self.pooling, batch), counts)

    def _per_example(
        self, examples: Examples, change: Change | None, compute: Callable[[TaskBatch], torch.Tensor], counts=None
    ) -> np.ndarray:
        """``compute(batch)`` (one row per example) over length-bucketed batches with ``change``
        inside attention, as float64 in the examples' own order."""
        parts, batched = [], list(batches(examples, self.batch_size, self.model.device))
        with torch.no_grad():
            for batch in batched:
                with _changed(change, batch, self.model, counts):
                    parts.append(compute(batch).double().cpu().numpy())
        return in_order(parts, batched)

    def loss(self, batch: TaskBatch) -> torch.Tensor:
        """Per-example cross-entropy of the unmodified probe (or the model's own head), differentiable
        (runs inside any active capture)."""
        if self.protocol == "head":
            logits = self.head_logits(batch)
        else:
            logits = self.probe.torch_logits(pooled_features(self.model.model, self.pooling, batch))
        return nn.functional.cross_entropy(logits, batch.labels, reduction="none")

    def head_logits(self, batch: TaskBatch) -> torch.Tensor:
        """The classification head's logits, one column per task class (in the task's order)."""
        logits = self.model.model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        return logits[:, self.head_columns].float()

    # -- judging

    def judge(self, change: Change | None) -> dict[str, object]:
        """Accuracy of the protocol's classifier under ``change`` (``None``: unmodified), with intervals;
        ``"correct"`` holds the per-example 0/1 array (for paired comparisons between changes)."""
        if self.settings.task_eval == AUTO and self.calibration is None and change is not None:
            self.calibrate([change])  # nothing named the headline changes: the first one judged sets the count
        correct, losses = self._correct(change)
        mean, low, high = bootstrap_interval(correct[None], self.settings.bootstrap, self.seed)
        paired = correct - self._unmodified[0]
        delta = bootstrap_interval(paired[None], self.settings.bootstrap, self.seed)
        return {
            "protocol": self.protocol,
            "accuracy": float(mean[0]),
            "accuracy_low": float(low[0]),
            "accuracy_high": float(high[0]),
            "delta_accuracy": float(delta[0][0]),
            "delta_accuracy_low": float(delta[1][0]),
            "delta_accuracy_high": float(delta[2][0]),
            "delta_halfwidth": float(delta[2][0] - delta[1][0]) / 2,
            # the smallest true Δ this many examples would detect 80% of the time at the 5% level
            "detectable_delta": float((Z_INTERVAL + Z_POWER) * paired.std(ddof=1) / math.sqrt(len(paired))),
            "held_out": len(paired),
            "task_loss": float(losses.mean()),
            # what a removal takes from these examples (padding aside): short texts lose less than full blocks
            "task_sparsity": float(self._removed[0] / self._removed[1]) if change is not None and self._removed[1] else 0.0,
            "unmodified_accuracy": self.unmodified_accuracy,
            "majority_accuracy": self.majority_accuracy,
            **self._across_seeds(change),
            "correct": correct,
        }

    def _across_seeds(self, change: Change | None) -> dict[str, object]:
        """With two or more fine-tune seeds: each seed's accuracy, and t intervals across seeds of
        the accuracy and of Δ (paired by seed), so a verdict counts seed-to-seed variance."""
        if self.protocol != "finetune" or self.settings.seeds < 2:
            return {}
        count = len(self.held_out)
        own = self._judged[_key(change)].seeds[:, :count].mean(1)
        delta = own - self._judged[None].seeds[:, :count].mean(1)
        columns = {"seed_accuracies": " ".join(f"{value:.4f}" for value in own)}
        for name, values in (("accuracy_seeds", own), ("delta_seeds", delta)):
            mean, half = float(values.mean()), float(t_halfwidth(values))
            columns.update({name: mean, f"{name}_low": mean - half, f"{name}_high": mean + half})
        return columns

    def _correct(self, change: Change | None) -> tuple[np.ndarray, np.ndarray]:
        """Per held-out example: 1.0 if classified right, and the classifier's cross-entropy.
        Each change is judged once per example: when calibration adds held-out examples (the
        pool's next ones), only those are computed."""
        count, key = len(self.held_out), _key(change)
        known = self._judged.get(key, _Outcomes.none())
        if len(known.correct) < count:
            self._removed = np.zeros(2)  # (removed, valid) positions on the examples judged now
            added = self.held_out.take(slice(len(known.correct), count))
            known = known.extended(*self._classified(change, added), self._removed)
            self._judged[key] = known
        self._removed = known.removed
        return known.correct[:count], known.losses[:count]

    def _classified(self, change: Change | None, examples: Examples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example of ``examples``: correct, cross-entropy, and (seed, example) correct (one row
        but for fine-tuning, one per seed)."""
        if self.protocol == "finetune":
            return self._finetuned(change, examples)
        if self.protocol == "head":
            logits = self._per_example(examples, change, self.head_logits, self._removed)
            return _with_seed_row(*_scored(logits, examples.labels))
        probe = self.probe
        if self.protocol == "refit" and change is not None:
            probe = fit_probe(self.features(self.train, change), self.train.labels, self.c)
        if change is None:
            features = self.unmodified_features(examples, as_judged=True)
        else:
            features = self.features(examples, change, self._removed)
        return _with_seed_row(*_scored(probe.logits(features), examples.labels))

    # -- fine-tuning

    def _finetuned(self, change: Change | None, examples: Examples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example, over the fine-tune seeds: the fraction of seeds that classify it right, the
        mean cross-entropy, and each seed's outcomes (for :meth:`_across_seeds`)."""
        outcomes = [self._finetuned_once(change, self.seed + number, examples) for number in range(self.settings.seeds)]
        correct, losses = (np.stack(arrays) for arrays in zip(*outcomes))
        return correct.mean(0), losses.mean(0), correct

    def _finetuned_once(self, change: Change | None, seed: int, examples: Examples) -> tuple[np.ndarray, np.ndarray]:
        module, head, change = self._finetune(change, seed)
        module.eval()
        compute = lambda batch: head(pooled_features(module, self.pooling, batch))
        return _scored(self._per_example(examples, change, compute, self._removed), examples.labels)

    def finetune_key(self, change: Change | None, seed: int | None = None) -> str:
        """The cache key of a fine-tune run: everything that decides its weights."""
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
            "probe": content_key(
                "probe", *(torch.as_tensor(a) for a in (self.probe.mean, self.probe.scale, self.probe.coef, self.probe.intercept))
            ),
            "batch_size": self.batch_size,
            "seed": self.seed if seed is None else seed,
            "change": None if change is None else change.key,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def _finetune(self, change: Change | None, seed: int) -> tuple[nn.Module, ProbeHead, Change | None]:
        """The encoder and head trained with ``change`` in the loop (dropout and batch order drawn
        with ``seed``), and the change as trained with them (a change with tensors of its own, such
        as jointly learned maps, trains them alongside), from the cache when it holds them."""
        module = copy.deepcopy(self.model.model)
        head = ProbeHead(self.probe).to(self.model.device)
        change, groups = change.trainable() if change is not None else (None, [])
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
            if groups:
                change.load(state["change"])
            self.last_finetune["curve"] = state["curve"].tolist()
        else:
            curve = self._train(module, head, change, seed, groups)
            self.last_finetune["curve"] = curve
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")  # written whole, then renamed: a killed run leaves no half file
            state = {"encoder": module.state_dict(), "head": head.state_dict(), "curve": torch.tensor(curve)}
            torch.save({**state, **({"change": change.state()} if groups else {})}, temporary)
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
        with torch.enable_grad(), _changed(change, batch, self.model):
            loss = nn.functional.cross_entropy(head(pooled_features(module, self.pooling, batch)), batch.labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return float(loss.detach())

    # -- provenance

    def describe(self) -> dict[str, object]:
        """What a result records about the task, the split and the probe."""
        return {
            **self.task.describe(),
            "protocol": self.protocol,
            "pooling": self.pooling if self.protocol != "head" else "the model's own classification head",
            "settings": self.settings.to_dict(),
            "train_rows": self.train.rows.tolist(),
            "held_out_rows": self.held_out.rows.tolist(),
            "width": int(self.held_out.ids.shape[1]),
            "batches": "bucketed by length, each padded to its own longest example"
            if not self.held_out.fixed_width
            else "padded to a fixed width",
            "held_out": len(self.held_out),
            "calibration": self.calibration,
            "padded": self.held_out.padded or self.train.padded,
            "head": None if self.protocol != "head" else {"classes": list(self.model.class_names), "columns": self.head_columns},
            "probe": None
            if self.probe is None
            else {
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
            if self.protocol != "finetune"
            else {
                "recipe": f"AdamW, {self.settings.finetune_steps} steps of {self.batch_size} examples, encoder lr "
                f"{self.settings.finetune_lr:g}, head lr {100 * self.settings.finetune_lr:g}, head started from the probe; "
                "the fixed number of steps is the stopping rule",
                "runs": self.finetune_runs,
            },
        }


def head_columns(model: LoadedModel, label_names: tuple[str, ...]) -> list[int]:
    """For each of the task's classes, in order, the column of the model's classification head
    that predicts it, matched by name (case and spaces aside) through the head's ``id2label``.

    Raises :class:`BadInput` for a model without a head, or names that do not match one to one.
    """
    names = model.class_names
    if names is None:
        raise BadInput(
            f"`protocol` head needs a model with a sequence-classification head; '{model.name}' is a "
            f"{model.architecture}; use `protocol` probe, or a model saved with AutoModelForSequenceClassification"
        )
    key = lambda name: str(name).strip().lower()
    columns = {key(name): index for index, name in enumerate(names)}
    if len(columns) != len(names) or sorted(columns) != sorted(map(key, label_names)):
        raise BadInput(
            f"the task's classes ({', '.join(label_names)}) do not match the head's id2label ({', '.join(names)}); "
            "name the task's labels as the head does, or set the model's config id2label"
        )
    return [columns[key(name)] for name in label_names]


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


def _key(change: Change | None) -> str | None:
    """What a judgement is remembered by: the change's key (``None``: the unmodified model)."""
    return None if change is None else change.key


@dataclass(frozen=True)
class _Outcomes:
    """A change's outcomes on the first examples of the held-out pool: per example correct (0/1,
    or the fraction of fine-tune seeds) and cross-entropy, (seed, example) correct, and the
    (removed, valid) positions counted over them."""

    correct: np.ndarray
    losses: np.ndarray
    seeds: np.ndarray
    removed: np.ndarray

    @classmethod
    def none(cls) -> _Outcomes:
        return cls(np.zeros(0), np.zeros(0), np.zeros((0, 0)), np.zeros(2))

    def extended(self, correct: np.ndarray, losses: np.ndarray, seeds: np.ndarray, removed: np.ndarray) -> _Outcomes:
        """These outcomes followed by those of the next examples."""
        return _Outcomes(
            np.concatenate([self.correct, correct]),
            np.concatenate([self.losses, losses]),
            np.concatenate([self.seeds, seeds], axis=1) if len(self.correct) else seeds,
            self.removed + removed,
        )


def _with_seed_row(correct: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A judgement without seeds: its correct array doubles as the one seed's row."""
    return correct, losses, correct[None]


def t_halfwidth(values: np.ndarray, level: float = 0.95) -> float:
    """Half the width of the t interval of the mean of ``values`` (a few seeds' results).

    >>> round(t_halfwidth(np.array([0.70, 0.72, 0.74])), 4)   # t(0.975, 2) = 4.303, sd 0.02, sqrt(3)
    0.0497
    """
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values)))


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
