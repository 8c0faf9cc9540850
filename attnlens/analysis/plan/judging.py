"""What a plan costs the model, on the data it was chosen on and on data it never saw.

A :class:`Costs` gives, for any change, one number per unit of data in each **part**:
``"select"`` (the data the plan is chosen on) and ``"check"`` (held out, disjoint):

- :class:`ProxyCosts`: per corpus block, the proxy loss with the change minus the
  unmodified loss (1 − cosine of final hidden states for encoders, next-token loss for
  decoders), on the selection blocks and the held-out blocks, and on a third part,
  ``"curve"``, the blocks the heads' curves are measured on;
- :class:`TaskCosts`: per task example, 1 if the unmodified model classified it right and
  the changed one does not, −1 for the reverse, else 0 (so the mean is the drop in
  accuracy), on two disjoint halves of the task's held-out examples; and on a third part,
  ``"curve"``, how far the change moves the classifier's predictions on some of its training
  examples (the KL divergence from the unmodified prediction), which the heads' curves are
  measured on (smooth where a flip of a few examples is not, and never negative).

A :class:`Budget` turns those into a verdict: a change **meets** it on the check when the
upper end of the 95% paired bootstrap interval of its mean cost is within the allowance.
For a drop in accuracy the allowance is the budget; for a loss budget (the proxy loss may
be at most ``y``) it is ``y`` minus the unmodified loss on the selection data, on both parts
(held-out text of another difficulty would otherwise decide the verdict, not the plan). On the selection data
the verdict is a forecast of the check's (:func:`forecast_high`): the check's mean predicted from
the selection's, at a one-sided 97.5% quantile of both samples' noise, plus the half-width the check's
interval will have, must be within the allowance. One plan so judged would miss on the check 2.5% of
the time; the plan chosen is the cheapest of several that passed, so it misses more often, and the rule
promises that it meets at least 90% of the time (``bench/bench_plan_coverage.py`` measures the rate).
Without a forecast, the plan chosen is the last one whose selection interval just fits, and its check
misses as often as it meets.

A task's selection verdict looks early: a change is run on the first 192, 384, then 768 examples of the
choosing half, and stops as **missing** where its cost's lower end at z = 3 (Haybittle-Peto) is already
above the allowance. Most candidates a plan search tries (narrow windows, small k, steps far along the
path) lose points by the dozen and stop at the first look; only those near the budget pay for the whole
half. The stop can only turn a "meets" into a "misses" (never the reverse), and only for a change whose
true cost is at the allowance, at most 3 × 0.135% = 0.4% of the time; a change that meets is seen whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Change
from attnlens.analysis.evaluation import bootstrap_interval, evaluate_change
from attnlens.analysis.experiment import Experiment, Split
from attnlens.analysis.plan.assemble import EXACT_KEY
from attnlens.analysis.task import TaskJudge, TaskLoss, TaskSettings
from attnlens.data.corpus import Blocks
from attnlens.errors import BadInput

Z_CHECK = 1.959964  # the check's interval is a two-sided 95% interval
# The forecast's one-sided quantile for one plan. The search keeps the cheapest of several plans that pass,
# and so the ones whose selection noise was favourable: at 5%, its plans met on the check 94-96% of the time
# over 600 draws of blocks; at 2.5%, 96-98% (docs/plan.md, "How often plans hold").
MISS_RATE = 0.025
# A task's selection verdict looks early at these counts of the choosing half, and stops a change whose lower
# end at Z_FUTILITY is already above the allowance (module docstring).
EARLY_LOOKS = (192, 384, 768)
Z_FUTILITY = 3.0


def forecast_high(values: np.ndarray, check_units: int, miss_rate: float = MISS_RATE) -> float:
    """The upper end the check's interval will reach, forecast from the selection's per-unit costs
    ``values``: the check's mean, predicted from the selection's (the two differ by both samples'
    noise, sd·√(1/n_s + 1/n_c), at the one-sided t quantile of ``miss_rate`` with n_s − 1 degrees of
    freedom, since sd itself is estimated on n_s units), plus the half-width the check's interval
    will have (1.96·sd/√n_c). One plan, fixed before the selection data were seen, whose forecast is
    within the allowance meets it on the check with probability about 1 − ``miss_rate``, under the
    normal approximation.

    >>> values = np.random.default_rng(0).normal(0.01, 0.005, size=32)
    >>> bool(forecast_high(values, 32) > values.mean() + 1.96 * values.std(ddof=1) / np.sqrt(32))
    True
    """
    from scipy import stats

    count = len(values)
    spread = float(np.std(values, ddof=1)) if count > 1 else 0.0
    predicted = float(stats.t.ppf(1 - miss_rate, max(count - 1, 1))) * spread * np.sqrt(1 / count + 1 / check_units)
    return float(np.mean(values)) + predicted + Z_CHECK * spread / np.sqrt(check_units)


def clearly_misses(values: np.ndarray, allowance: float) -> bool:
    """Whether per-unit costs ``values`` (a prefix of the selection data) already put the change above
    ``allowance``: the lower end of their mean at z = :data:`Z_FUTILITY` lies above it.

    >>> losses = np.r_[np.ones(40), np.zeros(152)]  # 40 of 192 examples lost: 21 points
    >>> clearly_misses(losses, 0.01), clearly_misses(losses[::-1][:100], 0.01)
    (True, False)
    """
    return bool(values.mean() - Z_FUTILITY * values.std(ddof=1) / np.sqrt(len(values)) > allowance)


def one_loss_forecast(select: int, check: int) -> float:
    """The check's forecast upper end (:func:`forecast_high`) of a change that loses one of ``select``
    selection examples and changes nothing else: the least a change that costs anything can forecast.
    Where it exceeds an accuracy budget, only changes that lose nothing can meet it at these sizes.

    >>> round(one_loss_forecast(256, 256), 4)  # --task-eval 512: above a 2-point budget
    0.0224
    """
    values = np.zeros(select)
    values[0] = 1.0
    return float(forecast_high(values, check))


def task_eval_needed(allowance: float) -> int:
    """The fewest held-out examples (``task_eval``, half choosing and half checking) at which one lost
    example forecasts within ``allowance``: the size an accuracy budget needs before it can be planned.

    >>> task_eval_needed(0.01), task_eval_needed(0.02)
    (1148, 575)
    """

    def fits(count: int) -> bool:
        return one_loss_forecast(count // 2, count - count // 2) <= allowance

    high = 4
    while not fits(high):
        high *= 2
    low = high // 2  # does not fit (or is below the smallest size tried): the answer lies in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class Budget:
    """``kind`` ``"accuracy"`` (``value``: the most accuracy may drop, in points) or ``"loss"``
    (``value``: the most the proxy loss may be)."""

    kind: str
    value: float

    def __str__(self) -> str:
        return f"Δ accuracy ≥ −{self.value:g} points" if self.kind == "accuracy" else f"loss ≤ {self.value:g}"

    def allowance(self, costs: Costs) -> float:
        """How much mean cost the budget allows: the drop in accuracy, or the increase of the proxy loss
        that takes the unmodified model's loss on the selection data to the budget. The check holds a plan
        to the same increase: an absolute loss on other text is met or missed by that text's difficulty."""
        return self.value / 100 if self.kind == "accuracy" else self.value - costs.unmodified_loss("select")


class Costs:
    """Per-unit costs of a change on each part; computed once per change key and part."""

    bootstrap: int = 1000
    seed: int = 0

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], np.ndarray] = {}
        self.evaluations = 0  # changes run on the model (each part counts once)

    def per_unit(self, change: Change, part: str) -> np.ndarray:
        key = (change.key, part)
        if key not in self._known:
            self._known[key] = self._compute(change, part)
            self.evaluations += 1
        return self._known[key]

    def _compute(self, change: Change, part: str) -> np.ndarray:
        raise NotImplementedError

    def unmodified_loss(self, part: str) -> float:
        raise NotImplementedError

    def interval(self, values: np.ndarray) -> tuple[float, float, float]:
        mean, low, high = bootstrap_interval(values[None], self.bootstrap, self.seed)
        return float(mean[0]), float(low[0]), float(high[0])

    def judged(self, change: Change, part: str, budget: Budget) -> dict[str, float | bool]:
        """Mean cost with its interval, the allowance and whether the budget is met. On the check: the
        upper end within the allowance. On the selection data: the forecast of the check's upper end
        within it (:func:`forecast_high`; ``margin``: how far the forecast lies above the selection's
        own upper end)."""
        allowance = budget.allowance(self)
        if part == "select" and (missed := self.early_miss(change, allowance)) is not None:
            return {**self._verdict(missed, allowance), "margin": np.nan, "forecast_high": np.nan, "meets": False}
        values = self.per_unit(change, part)
        verdict = self._verdict(values, allowance)
        if part != "select":
            return {**verdict, "margin": 0.0, "meets": bool(verdict["cost_high"] <= allowance)}
        forecast = forecast_high(values, self.units("check"))
        margin = forecast - verdict["cost_high"]
        return {**verdict, "margin": margin, "forecast_high": forecast, "meets": bool(forecast <= allowance)}

    def _verdict(self, values: np.ndarray, allowance: float) -> dict[str, float]:
        mean, low, high = self.interval(values)
        return {"cost": mean, "cost_low": low, "cost_high": high, "allowance": allowance, "examples": len(values)}

    def early_miss(self, change: Change, allowance: float) -> np.ndarray | None:
        """The costs on a prefix of the selection data at which ``change`` already clearly misses
        (module docstring), or ``None`` where it must be seen whole (by default: always)."""
        return None

    def units(self, part: str) -> int:
        raise NotImplementedError


class ProxyCosts(Costs):
    """Proxy loss increases per block, on the curve blocks, the selection blocks and the held-out blocks (check).
    Each part is prepared, and its unmodified losses computed, the first time it is asked for: a task
    budget's plan never asks."""

    def __init__(self, experiment: Experiment, curve: Blocks, select: Blocks, batch_size: int, bootstrap: int, seed: int) -> None:
        super().__init__()
        self.experiment, self.batch_size, self.bootstrap, self.seed = experiment, batch_size, bootstrap, seed
        self.blocks = {"curve": curve, "select": select, "check": experiment.held_out}
        self._splits: dict[str, Split] = {}
        self._baselines: dict[str, np.ndarray] = {}

    def split(self, part: str) -> Split:
        if part not in self._splits:
            self._splits[part] = self.experiment.split(self.blocks[part], self.batch_size)
        return self._splits[part]

    def baseline(self, part: str) -> np.ndarray:
        """The unmodified model's proxy loss per block of ``part``."""
        if part not in self._baselines:
            self._baselines[part] = self._losses(part, None)
        return self._baselines[part]

    def _losses(self, part: str, change: Change | None) -> np.ndarray:
        split = self.split(part)
        return evaluate_change(self.experiment.objective, split.inputs, split.views, change, split.starts)["loss"]

    def _compute(self, change: Change, part: str) -> np.ndarray:
        return self._losses(part, change) - self.baseline(part)

    def unmodified_loss(self, part: str) -> float:
        return float(self.baseline(part).mean())

    def units(self, part: str) -> int:
        return len(self.blocks[part])


def _predicted(judge: TaskJudge, split: Split) -> tuple[Split, np.ndarray]:
    """``split`` with each example's label replaced by the unmodified classifier's predicted
    distribution p₀, and each example's H(p₀, p₀), from the same forward: the cross-entropy H(p₀, p)
    of a changed prediction p, less that, is KL(p₀ ‖ p) ≥ 0.

    Why not the cross-entropy against the true labels: a change moves some examples' loss up and
    others' down, and on the few examples a curve affords the noise of that difference exceeds most
    single heads' effect. Half the (head, choice) pairs then measured a negative cost, counted as
    free, and the path's first steps were the most drastic choices of heads taken in index order
    (minilm-l6 ``--full``: its first step, window(1) on one head, cost 1.3 points). The divergence is
    never negative, is 0 only for a change that moves no prediction, and grows with what the
    accuracy check's interval grows with: the examples whose prediction a change flips.
    """
    soft, entropies = [], []
    with torch.no_grad():
        for batch in split.inputs:
            logits = judge.logits(batch)
            soft.append(replace(batch, labels=torch.softmax(logits, dim=1)))
            entropies.append(nn.functional.cross_entropy(logits, soft[-1].labels, reduction="none").double().cpu().numpy())
    return replace(split, inputs=soft), np.concatenate(entropies)


class TaskCosts(Costs):
    """Accuracy drops per example, on two disjoint halves of the task's held-out examples; on
    ``curve`` of its training examples (the curves' part: not the half that chooses, whose own noise
    a path built on it would fit), how far the change moves the classifier's prediction: the KL
    divergence from the unmodified prediction, per example (:func:`_predicted`)."""

    def __init__(
        self, experiment: Experiment, settings: TaskSettings, select: int, curve: int, batch_size: int, seed: int
    ) -> None:
        super().__init__()
        model, n = experiment.model, experiment.held_out.ids.shape[1]
        self.task = TaskJudge(model, settings, seq_len=n, batch_size=batch_size, seed=seed, pad_to=n, prepared=experiment.task)
        if len(self.task.held_out) <= select + 1:
            raise BadInput(
                f"the task gives {len(self.task.held_out)} held-out examples, too few to choose on {select} and check on the rest; "
                "raise `task_eval` (half of it chooses the plan, half checks it)"
            )
        if len(self.task.train) < curve:
            raise BadInput(
                f"the task gives {len(self.task.train)} training examples, fewer than the {curve} the curves are measured on; "
                "lower `curve_seqs` or raise `task_train`"
            )
        self.bootstrap, self.seed = settings.bootstrap, seed
        self.parts = {"select": slice(0, select), "check": slice(select, None)}
        # the unmodified model's per-example outcomes on every held-out example (judge(None)'s "correct")
        self.baseline = self.task.correct(None, len(self.task.held_out))
        curve_split = Split.of_examples(self.task.train.take(slice(0, curve)), model, batch_size, settings.precision)
        self.curve, self.curve_baseline = _predicted(self.task, curve_split)  # a curve cost is then a KL divergence
        self.loss = TaskLoss(self.task)

    def _losses(self, change: Change | None) -> np.ndarray:
        return evaluate_change(self.loss, self.curve.inputs, self.curve.views, change, self.curve.starts)["loss"]

    def _compute(self, change: Change, part: str) -> np.ndarray:
        if part == "curve":
            return self._losses(change) - self.curve_baseline
        return self._drops(change, self.parts[part].stop or len(self.baseline))[self.parts[part]]

    def _drops(self, change: Change, count: int) -> np.ndarray:
        """Per example of the first ``count`` held-out: unmodified correct minus changed correct. A plan
        with every head exact changes nothing: no forward pass."""
        if change.key == EXACT_KEY:
            return np.zeros(count)
        return self.baseline[:count] - self.task.correct(change, count)

    def early_miss(self, change: Change, allowance: float) -> np.ndarray | None:
        for look in (look for look in EARLY_LOOKS if look < self.units("select")):
            values = self._drops(change, look)
            if clearly_misses(values, allowance):
                return values
        return None

    def unmodified_loss(self, part: str) -> float:  # an accuracy budget needs none
        return 0.0

    def units(self, part: str) -> int:
        return len(self.curve_baseline) if part == "curve" else len(self.baseline[self.parts[part]])
