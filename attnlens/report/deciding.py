"""What deciding a claim the report left open takes, in examples or seeds and in minutes on this machine.

A task judgement whose interval still holds the margin −δ needs about ``n·(h/|m + δ|)²`` examples,
for its mean ``m`` and half-width ``h`` on ``n`` examples (1.96 standard errors: an early look's wider boundary
taken out, :func:`~attnlens.report.verdicts.task_verdict`): where its interval would lie on one side of
−δ if its mean held (the last look's boundary stays near 1.96, :mod:`attnlens.analysis.sequential`);
each more example costs one forward of the changed model and one of the unmodified model,
at the judgement's batch and width, priced by the units the forecast timed. Where the report was sized
to a budget, the least budget whose sizes give a pool that large comes with it
(:attr:`~attnlens.report.budget.Budget.pools`). A stage whose claims only its full size decides (DAM's
seeds and steps, the plan's examples) says what that stage takes at the full size here, priced the same
way; a comparison over held-out blocks that spans zero, how many blocks would exclude it if its mean held.

>>> Deciding({"importance": 0.05}, {"importance": 4000}).examples("importance", 400, -0.01, 0.02, 0.02).text
'needs about 1,200 more examples, about 1 minute here'
>>> Deciding({"importance": 0.05}, {"importance": 4000}).examples("importance", 400, -0.018, 0.05, 0.02).text
'needs about 250,000 examples, more than the task offers here (4,000)'
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from attnlens.analysis.sequential import FIRST_LOOK
from attnlens.report.budget import format_duration
from attnlens.report.presets import duration

if TYPE_CHECKING:
    from attnlens.data.tasks import Examples
    from attnlens.forecast import Forecast
    from attnlens.report.prepare import Prepared

TASK_KINDS = ("features", "judged", "train")  # the units of a task's work (the rest of a stage is its proxy's)
STAGE_SAID = {
    "dam": "--full's DAM decides it: {seeds} seeds of up to {steps} steps, {minutes} here",
    "plan": "--full's plan decides it: {examples:,} examples, {minutes} here",
}


@dataclass(frozen=True)
class Needs:
    """What deciding takes, in words (``text``) and as numbers: ``seconds`` of it here and ``examples`` more
    (``None``: not counted in examples, a stage at its full size)."""

    text: str
    seconds: float | None = None
    examples: int | None = None


@dataclass(frozen=True)
class Deciding:
    """Per judged stage, the seconds one more example of one change costs here and the pool its judgements
    could use; the least budget that gives each larger pool; the full-size seconds of the stages only their
    full size decides, with what that size is."""

    per_example: dict[str, float]
    pools: dict[str, int]
    budgets: dict[int, float] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_block: dict[str, float] = field(default_factory=dict)  # a stage's proxy work per held-out block

    def blocks(self, stage: str, blocks: int, mean: float, half_width: float) -> Needs | None:
        """A comparison over ``blocks`` held-out blocks whose interval (``mean`` ± ``half_width``) spans zero: the
        blocks at which it would exclude zero if the mean held, and their seconds here."""
        if stage not in self.per_block or not 0 < abs(mean) < half_width:
            return None
        needed = int(math.ceil(blocks * (half_width / abs(mean)) ** 2))
        seconds = needed * self.per_block[stage]
        return Needs(f"needs about {needed:,} held-out blocks (here {blocks:,}), {_minutes(seconds)} here", seconds)

    def examples(self, stage: str, examples: int, mean: float, half_width: float, margin: float) -> Needs | None:
        """A judgement on ``examples`` examples whose interval (``mean`` ± ``half_width``) holds −``margin``: the
        examples at which it would lie on one side of it if its mean held, and their seconds here."""
        if stage not in self.per_example or math.isnan(half_width) or half_width <= 0:
            return None
        distance = max(abs(mean + margin), 1e-9)  # a mean right at the margin: no size decides
        needed = _hundreds(min(examples * (half_width / distance) ** 2, 1e12))
        more = max(_hundreds(needed - examples), 100)
        if needed > self.pools.get(stage, 0) and not any(pool >= needed for pool in self.budgets):
            return Needs(f"needs about {needed:,} examples, more than the task offers here ({self.pools[stage]:,})")
        seconds = more * self.per_example[stage]
        budget = min((asked for pool, asked in self.budgets.items() if pool >= needed), default=None)
        given = "" if budget is None else f": --budget {format_duration(budget)}"
        return Needs(f"needs about {more:,} more examples, {_minutes(seconds)} here{given}", seconds, more)

    def unjudged(self, stage: str) -> Needs | None:
        """A change of a judged stage that the task did not judge at this size: what its first look takes here."""
        if stage not in self.per_example:
            return None
        first = min(FIRST_LOOK, self.pools[stage])
        seconds = first * self.per_example[stage]
        return Needs(f"judging it takes {first:,} examples or more, {_minutes(seconds)} here", seconds, first)

    def stage(self, stage: str) -> Needs | None:
        """What a stage only its full size decides takes: that size, and its seconds here."""
        if stage not in self.stages:
            return None
        held = self.stages[stage]
        return Needs(STAGE_SAID[stage].format(**held, minutes=_minutes(held["seconds"])), held["seconds"])

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "budgets": {str(pool): s for pool, s in self.budgets.items()}}


def deciding(prepared: Prepared, predicted: Forecast) -> Deciding:
    """What deciding takes on ``prepared``'s report, priced by ``predicted``'s units."""
    from attnlens.forecast.work import examples

    calibration, per_example, pools = predicted.calibration, {}, {}
    for stage, task in prepared.tasks.items():
        batch = getattr(prepared.settings, stage).batch_size
        judged = examples("", "judged", task.pool, batch).unit
        unmodified = dataclasses.replace(judged, kind="features")
        per_example[stage] = (calibration.seconds(judged) + calibration.seconds(unmodified)) / batch
        pools[stage] = len(task.pool)
    budgets = {} if prepared.budget is None else prepared.budget.pools
    per_block = {}
    if "importance" in predicted.stages:  # the comparison of two classes' costs over held-out blocks
        proxy = [(item, each) for item, each in predicted.stages["importance"].items if item.unit.kind not in TASK_KINDS]
        per_block["importance"] = sum(item.count * each for item, each in proxy) / prepared.settings.importance.num_seqs
    return Deciding(per_example, pools, budgets, _full_stages(prepared, predicted), per_block)


def _full_stages(prepared: Prepared, predicted: Forecast) -> dict[str, dict[str, Any]]:
    """DAM and the plan at the full preset's sizes, priced by the units timed for this report (a width not
    timed read off the line through those that were), where this report is not that preset."""
    from attnlens.forecast import StageForecast
    from attnlens.forecast.stages import Facts, dam_work, plan_work
    from attnlens.report.presets import DECIDING, preset

    finetuned = prepared.settings.dam.task.protocol == "finetune"
    _, full = preset("finetune" if finetuned else "probe", quick=False, full=True)
    if prepared.name in DECIDING or full.dam.seq_len > prepared.loaded.max_positions:
        return {}
    s = prepared.settings.eigen
    untasked = {} if prepared.tasks else {"task": None}  # a report judged by no task: its full size neither
    full = prepared.sized(full.for_run(corpus=s.corpus, seed=s.seed, precision=prepared.precision, **untasked))
    loaded, tasks = prepared.loaded, dict(prepared.tasks)
    plan = full.plan
    if plan is not None and "plan" in tasks and plan.seq_len <= loaded.max_positions:
        # the plan's examples are padded to its n: at the full size, as many rows of n tokens as it draws
        task = tasks["plan"]
        train, pool = plan.task.train_examples(task.protocol), int(plan.task.task_eval)
        tasks["plan"] = dataclasses.replace(task, train=_padded(train, plan.seq_len), pool=_padded(pool, plan.seq_len))
    facts = Facts(loaded.num_layers, loaded.num_heads, loaded.causal, prepared.per_query, loaded.objective, tasks)
    priced = {"dam": StageForecast.of("dam", dam_work(full.dam, facts), predicted.calibration).seconds}
    stages = {"dam": {"seconds": priced["dam"], "seeds": full.dam.mask.seeds, "steps": full.dam.training.steps}}
    if full.plan is not None and "plan" in tasks:
        seconds = StageForecast.of("plan", plan_work(full.plan, facts), predicted.calibration).seconds
        stages["plan"] = {"seconds": seconds, "examples": int(full.plan.task.task_eval)}
    return stages


def _padded(count: int, width: int) -> Examples:
    """``count`` examples padded to ``width`` tokens, as the forecast counts them (their tokens are not read)."""
    from attnlens.data.tasks import Examples

    ones = np.ones((count, width), dtype=np.int64)
    return Examples(ones, ones, np.zeros(count, dtype=np.int64), np.arange(count), fixed_width=True)


def _hundreds(examples: float) -> int:
    return int(math.ceil(examples / 100) * 100)


def _minutes(seconds: float) -> str:
    """``about 14 minutes``; under two minutes ``about 1 minute`` or ``about 40 seconds``."""
    if seconds < 60:
        return f"about {seconds:.0f} seconds"
    if seconds < 120:
        return "about 1 minute" if seconds < 90 else "about 2 minutes"
    return duration(seconds)
