"""The judge: a task loaded and split once, the unmodified model's features and probe, then one
change at a time judged by held-out accuracy (:class:`TaskJudge`), and the task's loss for training
a change (:class:`TaskLoss`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Change, Removal
from attnlens.analysis.evaluation import bootstrap_interval, layer_groups, valid_masks
from attnlens.analysis.margin import COMPARISON, Margin, compared
from attnlens.analysis.sequential import FIRST_LOOK, Z_POWER, Design, cuts
from attnlens.analysis.sequential import Z as Z_INTERVAL
from attnlens.analysis.task.batching import TaskBatch, batches, per_example, pooled_features
from attnlens.analysis.task.finetune import FineTuning
from attnlens.analysis.task.outcomes import (
    UNMODIFIED,
    Outcomes,
    judged_key,
    outcome_arrays,
    scored,
    seed_columns,
    t_halfwidth,
    with_seed_row,
)
from attnlens.analysis.task.prepare import PreparedTask, majority_share, prepare_task
from attnlens.analysis.task.probe import PROBE_CS, choose_c, fit_probe
from attnlens.analysis.task.settings import AUTO, FEATURES_VERSION, POOLING, TaskSettings
from attnlens.data.tasks import Examples, Task
from attnlens.models.cache import cached_array
from attnlens.models.loading import LoadedModel
from attnlens.models.precision import DEFAULT_PRECISION, judging
from attnlens.progress import Moving, Progress


class TaskJudge(FineTuning):
    """Judges changes to ``model``'s attention by held-out accuracy on a task; see :mod:`attnlens.analysis.task`.

    Takes the task ``prepared`` in the caller's prologue (:func:`~attnlens.analysis.task.prepare.prepare_task`:
    loaded, the examples a classifier saw taken out, checked and split, ``seq_len`` tokens at most,
    ``seed``; prepared here when not given), computes the unmodified model's features and fits the
    probe once; :meth:`judge` then takes one :class:`Change` at a time. ``pad_to`` pads every
    example to that width (changes whose shape is fixed, like a reconstruction map of width n, need it).
    :meth:`outcome_arrays` gives every judged change's per-example outcomes, for a result to keep.

    The ``finetune`` protocol's training runs and their cache are
    :class:`~attnlens.analysis.task.finetune.FineTuning`'s, which this class mixes in.
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
        prepared: PreparedTask | None = None,
    ) -> None:
        self.model, self.settings, self.progress = model, settings, progress
        self.batch_size, self.seed = batch_size, seed
        if prepared is None:
            prepared = prepare_task(model, settings, seq_len=seq_len, seed=seed, pad_to=pad_to)
        elif (prepared.seq_len, prepared.pad_to, prepared.seed) != (seq_len, pad_to, seed):  # only a bug in attnlens
            raise AssertionError(
                f"the task was prepared for {prepared.seq_len, prepared.pad_to, prepared.seed}, not {seq_len, pad_to, seed}"
            )
        self.prepared = prepared
        self.task: Task = prepared.task
        self.train, self.pool = prepared.train, prepared.pool
        self.protocol, self.majority_label = prepared.protocol, prepared.majority_label
        self.pooling = POOLING[model.causal]
        auto = settings.task_eval == AUTO
        if self.protocol == "head":  # the model's own classifier: no probe to fit
            self.head_columns, self.c, self.probe = prepared.head_columns, None, None
        else:
            # bucketed by length even where the judged examples keep a fixed width: padding at the end changes
            # no valid token's state beyond float rounding, and a probe on short texts then costs their length only
            features = self.unmodified_features(dataclasses.replace(self.train, fixed_width=False))
            self.c = settings.probe_c if settings.probe_c is not None else self._chosen_c(features)
            self.probe = fit_probe(features, self.train.labels, self.c)
        self.finetune_runs: list[dict] = []  # every fine-tune run: change, cache file, training curve
        self._bar: Moving | None = None  # while a caller's bar is moved by the examples judged (:meth:`moving`)
        self._structure: tuple[list[int], torch.Tensor] | None = None  # removal_share's valid masks, by layer group
        self._judged: dict[str | None, Outcomes] = {}  # by change key: outcomes on the first examples of the pool
        self._reported: dict[str | None, int] = {}  # by change key: the examples its judgement used
        self.held_out = self.pool.take(slice(0, 0))
        self._outcomes(None, min(FIRST_LOOK, len(self.pool)) if auto else len(self.pool))
        # the margin as a fraction of accuracy: a share of the unmodified accuracy is read on these first examples,
        # once, so that every change of this judge is held to the same margin
        self.margin = Margin.parse(settings.margin).fraction(self.unmodified_accuracy)
        # auto: judged sequentially (attnlens.analysis.sequential), each change on as many examples as it needs
        self.design = Design.for_pool(len(self.pool), self.margin) if auto else None

    @property
    def unmodified_accuracy(self) -> float:
        """The unmodified model's accuracy on every held-out example judged so far."""
        return float(self._judged[None].correct[: len(self.held_out)].mean())

    @property
    def majority_accuracy(self) -> float:
        """The majority class's share of every held-out example judged so far."""
        return self._majority(len(self.held_out))

    def _majority(self, count: int) -> float:
        return majority_share(self.pool.labels[:count], self.majority_label)

    # -- the one-off costs, cached

    def unmodified_features(self, examples: Examples, *, as_judged: bool = False) -> np.ndarray:
        """The unmodified model's features of ``examples``, computed once per model, examples' tokens,
        pooling and batch size, and kept in the attnlens cache (a probe's training features are a
        one-off cost). Padding is not part of the key: padding at the end changes no valid
        token's state beyond float rounding, so analyses that pad to a fixed width share the
        training features, and so the probe, of those that do not. Held-out features
        (``as_judged``) are the baseline every change is paired with, so they are computed in
        the changes' own arithmetic: their width is part of the key where it is fixed, and so is the
        judge's precision where it is not float32 (float32 keys are those written before the setting
        existed, so those features are reused)."""
        key = features_key(self.model, examples, self.batch_size, self.settings.precision, as_judged=as_judged)
        return cached_array("task-features", key, lambda: self.features(examples, None))

    def _chosen_c(self, features: np.ndarray) -> float:
        key = hashlib.sha256(features.tobytes() + self.train.labels.tobytes() + str(self.seed).encode()).hexdigest()[:32]
        return float(cached_array("task-probe-c", key, lambda: np.array(choose_c(features, self.train.labels, self.seed)))[()])

    def removal_share(self, change: Removal) -> float:
        """The share of the held-out pool's valid positions (their own tokens, every layer and
        head) that ``change`` removes, read off its removal masks without running the model: the
        ``task_sparsity`` a judgement reports, at the cost of building masks only (to match a
        pattern to a mask on the task's own positions before judging either)."""
        if self._structure is None:  # causal, windows: no padding; one forward, once per judge
            self._structure = layer_groups(valid_masks(self.model, self.pool.ids[:1]))
        group, structures = self._structure
        # a change that depends on a layer only through its valid mask is counted once per distinct mask
        layers = list(range(len(group))) if not change.shared_by_layers else [group.index(g) for g in range(len(structures))]
        heads, removed, total = self.model.num_heads, 0.0, 0.0
        for batch in batches(self.pool, self.batch_size, self.model.device):
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
        features = lambda batch: pooled_features(self.model.model, self.pooling, batch, self.settings.precision)  # noqa: E731
        return per_example(self.model, self.batch_size, examples, change, features, counts)

    def loss(self, batch: TaskBatch) -> torch.Tensor:
        """Per-example cross-entropy of the unmodified probe (or the model's own head), differentiable
        (runs inside any active capture). ``batch.labels`` are classes, or per class probabilities (then
        the cross-entropy against that distribution)."""
        return nn.functional.cross_entropy(self.logits(batch), batch.labels, reduction="none")

    def logits(self, batch: TaskBatch) -> torch.Tensor:
        """The classifier's logits (the unmodified probe's, or the model's own head's), one column per
        task class, under any active capture."""
        if self.protocol == "head":
            return self.head_logits(batch)
        features = pooled_features(self.model.model, self.pooling, batch, self.settings.precision)
        return self._fitted_probe().torch_logits(features)

    def head_logits(self, batch: TaskBatch) -> torch.Tensor:
        """The classification head's logits, one column per task class (in the task's order)."""
        with judging(self.settings.precision, self.model.device):
            logits = self.model.model(input_ids=batch.ids, attention_mask=batch.attention_mask).logits
        return logits[:, self.head_columns].float()

    # -- judging

    def judge(self, change: Change | None) -> dict[str, object]:
        """Accuracy of the protocol's classifier under ``change`` (``None``: unmodified), with intervals;
        ``"correct"`` holds the per-example 0/1 array (for paired comparisons between changes).

        With ``task_eval="auto"`` the change is judged sequentially (:class:`~attnlens.analysis.sequential.Design`):
        on as many of the pool's examples as it takes for its paired Δ interval to lie on one side of
        −``margin``, or the whole pool; ``held_out`` says how many, ``stopped`` why.
        Otherwise on every held-out example, with a percentile-bootstrap interval. ``margin``: the margin
        the judgement is held to, as a fraction of accuracy."""
        if change is None:
            count, interval, bound, stopped = len(self.held_out), (0.0, 0.0, 0.0), Z_INTERVAL, "unmodified"
        elif self.design is None:
            count, bound, stopped = len(self.pool), Z_INTERVAL, "every example"
            interval = self._bootstrap(self._paired(change, None, count))
        else:
            decision = self.design.run(lambda count: self._paired(change, None, count))
            count, bound, stopped = decision.examples, decision.bound, decision.reason
            interval = (decision.mean, decision.low, decision.high)
        correct, outcomes = self.correct(change, count), self._outcomes(change, count)
        paired = self._paired(change, None, count)
        mean, low, high = self._bootstrap(correct)
        return {
            "change": UNMODIFIED if change is None else change.key,  # names its outcomes (outcome_arrays, Result.outcomes)
            "protocol": self.protocol,
            "accuracy": mean,
            "accuracy_low": low,
            "accuracy_high": high,
            "delta_accuracy": interval[0],
            "delta_accuracy_low": interval[1],
            "delta_accuracy_high": interval[2],
            "delta_halfwidth": (interval[2] - interval[1]) / 2,
            "delta_bound": bound,  # the look's boundary: the half-width in standard errors
            "margin": self.margin,
            # the smallest true Δ this many examples would detect 80% of the time at this look's level
            "detectable_delta": float((bound + Z_POWER) * paired.std(ddof=1) / math.sqrt(count)),
            "held_out": count,
            "stopped": stopped,
            "task_loss": float(outcomes.losses[:count].mean()),
            # what a removal takes from the examples it ran on (padding aside): short texts lose less than full blocks
            "task_sparsity": float(outcomes.removed[0] / outcomes.removed[1])
            if change is not None and outcomes.removed[1]
            else 0.0,
            "unmodified_accuracy": float(self._outcomes(None, count).correct[:count].mean()),
            "majority_accuracy": self._majority(count),
            **self._across_seeds(change, count),
            "correct": correct,
        }

    def correct(self, change: Change | None, count: int) -> np.ndarray:
        """Per example of the pool's first ``count``: 1 where the classifier under ``change`` is right, else 0
        (each example run once per change, so a judge that looks at a prefix first pays only for the rest later)."""
        self._reported[judged_key(change)] = max(count, self._reported.get(judged_key(change), 0))
        return self._outcomes(change, count).correct[:count]

    def compare(self, first: Change, second: Change | None, *, extend: bool = True) -> dict[str, object]:
        """``first``'s accuracy minus ``second``'s, paired over examples, with its interval: judged
        sequentially like :meth:`judge` (``extend``: run either change on more examples where the
        difference needs them; without it, on the examples both were already judged on, at that look's
        boundary: repeated intervals hold at every look, so this one holds too), or with a bootstrap
        over every held-out example when ``task_eval`` is a number. ``verdict``: "better" or "worse"
        only where the interval excludes 0, "on par" where it lies within ±``margin``
        (:func:`~attnlens.analysis.margin.compared`)."""
        if self.design is None:
            count = len(self.pool)
            mean, low, high = self._bootstrap(self._paired(first, second, count))
            examples, stopped = count, "every example"
        else:
            known = min(len(self._judged.get(judged_key(change), Outcomes.none()).correct) for change in (first, second))
            paired = lambda count: self._paired(first, second, count)  # noqa: E731
            decision = self.design.run(paired, available=None if extend else known, question=COMPARISON)
            mean, low, high, examples, stopped = decision.mean, decision.low, decision.high, decision.examples, decision.reason
        return {"difference": mean, "difference_low": low, "difference_high": high, "compared_on": examples,
                "compared_stopped": stopped, "margin": self.margin, "verdict": compared(low, high, self.margin)}  # fmt: skip

    def _paired(self, first: Change | None, second: Change | None, count: int) -> np.ndarray:
        """Per example of the pool's first ``count``: ``first``'s outcome minus ``second``'s."""
        return self._outcomes(first, count).correct[:count] - self._outcomes(second, count).correct[:count]

    def _bootstrap(self, values: np.ndarray) -> tuple[float, float, float]:
        mean, low, high = bootstrap_interval(values[None], self.settings.bootstrap, self.seed)
        return float(mean[0]), float(low[0]), float(high[0])

    def _across_seeds(self, change: Change | None, count: int) -> dict[str, object]:
        """With two or more fine-tune seeds: each seed's accuracy, and t intervals across seeds of
        the accuracy and of Δ (paired by seed), so a verdict counts seed-to-seed variance."""
        if self.protocol != "finetune" or self.settings.seeds < 2:
            return {}
        own = self._judged[judged_key(change)].seeds[:, :count].mean(1)
        delta = own - self._judged[None].seeds[:, :count].mean(1)
        columns: dict[str, object] = {**seed_columns(own)}
        for name, values in (("accuracy_seeds", own), ("delta_seeds", delta)):
            mean, half = float(values.mean()), float(t_halfwidth(values))
            columns.update({name: mean, f"{name}_low": mean - half, f"{name}_high": mean + half})
        return columns

    def _outcomes(self, change: Change | None, count: int) -> Outcomes:
        """``change``'s outcomes on (at least) the pool's first ``count`` examples. Each change is run
        once per example, in the design's slices (whole chunks of the pool: the same slices, so the
        same length buckets, for every change): a judgement that needs more examples computes only those.
        The held-out examples, and the unmodified model's outcomes on them, grow with the largest count."""
        key = judged_key(change)
        known = self._judged.get(key, Outcomes.none())
        if len(known.correct) < count:
            cuts = sorted({len(known.correct), count, *(look for look in self._looks() if len(known.correct) < look < count)})
            for start, stop in zip(cuts, cuts[1:]):
                self._removed = np.zeros(2)  # (removed, valid) positions on the examples judged now
                known = known.extended(*self._classified(change, self.pool.take(slice(start, stop))), self._removed)
                if self._bar is not None:
                    self._bar.part(stop / len(self.pool), f"{stop:,} of at most {len(self.pool):,} examples")
            self._judged[key] = known
        if count > len(self.held_out):
            self.held_out = self.pool.take(slice(0, count))
            if change is not None:
                self._outcomes(None, count)
        return known

    @contextlib.contextmanager
    def moving(self, bar: Moving) -> Iterator[None]:
        """While open, each slice of examples a judgement runs moves ``bar`` through the unit under way (a config,
        a condition), by the share of the pool judged so far: a judgement that runs to the pool's end moves it
        steadily, one that decides early jumps to the next unit when the caller counts it."""
        self._bar = bar
        try:
            yield
        finally:
            self._bar = None

    def _looks(self) -> tuple[int, ...]:
        return cuts(len(self.pool)) if self.settings.task_eval == AUTO else ()

    def _classified(self, change: Change | None, examples: Examples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example of ``examples``: correct, cross-entropy, and (seed, example) correct (one row
        but for fine-tuning, one per seed)."""
        if self.protocol == "finetune":
            return self._finetuned(change, examples)
        if self.protocol == "head":
            logits = per_example(self.model, self.batch_size, examples, change, self.head_logits, self._removed)
            return with_seed_row(*scored(logits, examples.labels))
        probe = self._fitted_probe()
        if self.protocol == "refit" and change is not None:
            assert self.c is not None, "C is chosen (or given) with the probe"
            probe = fit_probe(self.features(self.train, change), self.train.labels, self.c)
        if change is None:
            features = self.unmodified_features(examples, as_judged=True)
        else:
            features = self.features(examples, change, self._removed)
        return with_seed_row(*scored(probe.logits(features), examples.labels))

    def _head_description(self) -> dict[str, object] | None:
        """The head protocol's classifier: the model's classes and the columns of them the task reads."""
        if self.protocol != "head":
            return None
        classes = self.model.class_names
        assert classes is not None, "prepare_task (head_columns) refuses the head protocol on a model without class names"
        return {"classes": list(classes), "columns": self.head_columns}

    def outcome_arrays(self) -> dict[str, np.ndarray]:
        """Every judged change's per-example outcomes, for a result to keep beside its tables
        (:func:`~attnlens.analysis.task.outcomes.outcome_arrays`; read back by
        :meth:`attnlens.io.results.Result.outcomes`)."""
        return outcome_arrays(self._judged, self._reported, self.pool.rows)

    # -- provenance

    def describe(self) -> dict[str, object]:
        """What a result records about the task, the split and the probe."""
        return {
            **self.prepared.describe(),
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
            "margin": {"given": str(Margin.parse(self.settings.margin)), "fraction": self.margin},
            "sequential": None
            if self.design is None
            else {
                "rule": "repeated 95% intervals (Jennison & Turnbull 1989), Agresti-Min standard error; looks on the "
                "grid spend alpha*t^2 of the pool (Kim & DeMets 1987), the pool's end the rest; a judgement stops where "
                "its interval answers its question against the margin (a change: wholly above or below -margin; two "
                "choices: zero excluded, or within +-margin), where the rest of the pool would decide it less than one "
                "time in ten (predictive power under a flat prior), or at the pool's end",
                "grid": list(self.design.grid),
                "chunk": self.design.chunk,
                "margin": self.design.margin,
                "futility": self.design.futility,
                "examples_available": len(self.pool),
            },
            "padded": self.held_out.padded or self.train.padded,
            "head": self._head_description(),
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
            "majority": f"the most frequent class of the {self.prepared.majority_from}, its share of the held-out examples",
            "outcomes": "arrays task_rows, task_changes, task_correct, task_loss, task_judged: every judged change's "
            "per-example outcomes (Result.outcomes)",
            "finetune": None
            if self.protocol != "finetune"
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

    @property
    def precision(self) -> str:
        """The judge's: the loss a mask trains on is computed as the judge computes its features."""
        return self.judge.settings.precision

    def evaluate(self, batch: TaskBatch) -> dict[str, torch.Tensor]:
        return {"loss": self.judge.loss(batch)}


def features_key(model: LoadedModel, examples: Examples, batch_size: int, precision: str, *, as_judged: bool = False) -> str:
    """The cache key of the unmodified model's pooled features of ``examples`` (:meth:`TaskJudge.unmodified_features`)."""
    tokens = hashlib.sha256(examples.lengths.astype(np.int64).tobytes())
    tokens.update(examples.ids[examples.attention_mask.astype(bool)].astype(np.int64).tobytes())
    parts = {
        "version": FEATURES_VERSION,
        "model": model.weights_sha256(),
        "tokens": tokens.hexdigest(),
        "pooling": POOLING[model.causal],
        "width": int(examples.ids.shape[1]) if as_judged and examples.fixed_width else None,
        "batch_size": batch_size,
        "device": str(model.device),
        "torch": torch.__version__,
        # bfloat16 features must never stand in for float32 ones, nor the reverse
        **({"precision": precision} if precision != DEFAULT_PRECISION else {}),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def train_features_key(model: LoadedModel, prepared: PreparedTask, batch_size: int, precision: str) -> str | None:
    """The cache key of the probe's training features of ``prepared`` (None under ``head``: nothing is fitted);
    two stages with one key share them: the later reads what the earlier computed."""
    if prepared.protocol == "head":
        return None
    return features_key(model, dataclasses.replace(prepared.train, fixed_width=False), batch_size, precision)
