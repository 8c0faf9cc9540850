"""The report's verdicts: the rules that decide a claim, written here once, and the typed records a
claim is made of (its :class:`Verdict`, the numbers behind it as :class:`Difference`, the
:class:`Claim` row). docs/science.md states the rules and which question each decides. Every rule that
asks whether a change costs nothing is a non-inferiority test against a stated margin
(:mod:`attnlens.analysis.margin`), never a test against zero:

- a claim that a change **suffices**, **costs nothing** or **keeps the model** holds at task level when
  its paired Δ interval lies above −δ (the report's margin, 2 points by default), does not hold when it
  lies below −δ, and is otherwise not decided, with what deciding takes (:func:`on_task`);
- by the proxy, the same claim holds when the outputs move by at most the proxy's margin
  (:data:`~attnlens.analysis.margin.PROXY_MARGIN`: 1 − cosine of the final hidden states, or nats of the
  model's loss) (:func:`by_proxy`). That a removal costs no more than removing as many random positions is
  another claim, shown beside it, not a verdict of "no loss";
- where both judge a claim and disagree, the verdict says which holds ("holds at task level, not by
  the proxy"); where the task did not judge it at this size, the proxy's verdict says so and what
  judging it takes ("holds by the proxy (task: needs about 1,900 more examples, about 14 minutes
  here)") (:func:`combine`, :mod:`attnlens.report.deciding`);
- one choice **beats** another where its paired interval lies above zero; it does not where the interval
  lies below zero or within ±δ (on par: equivalence) (:func:`beats`); a difference between two changes
  (which costs less) by the same rule, in the proxy's unit (:func:`costs_less`);
- a learned object (a DAM mask) is a result only when its runs converged and another seed reproduces
  it; with one seed or fewer examples than the claim needs, the verdict is "not decided at this size",
  with what deciding it takes, and no number is printed beside it.

>>> on_task(-0.013, 0.003, margin=0.02), on_task(-0.05, -0.025, margin=0.02), on_task(-0.05, 0.03, margin=0.02)
(<Phrase.HOLDS: 'holds'>, <Phrase.DOES_NOT_HOLD: 'does not hold'>, None)
>>> combine(proxy=False, task=Phrase.HOLDS).value
'holds at task level, not by the proxy'
>>> Verdict(combine(proxy=True, task=None, judged=False), "cosine 0.998", missing="task: no task judged it").text
'holds by the proxy (task: no task judged it): cosine 0.998'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from attnlens.analysis.margin import DEFAULT_MARGIN, PROXY_MARGIN, Margin, compared, non_inferior
from attnlens.analysis.sequential import Z
from attnlens.analysis.task import seed_values
from attnlens.report.words import TOO_FEW, number, points

if TYPE_CHECKING:
    from attnlens.report.deciding import Deciding, Needs


class Phrase(Enum):
    """A verdict's phrase: what the page, ``claims.csv`` (by name) and the README print (by value)."""

    HOLDS = "holds"
    DOES_NOT_HOLD = "does not hold"
    NOT_DECIDED = "not decided"
    AT_THIS_SIZE = "not decided at this size"
    TASK_NOT_PROXY = "holds at task level, not by the proxy"
    PROXY_NOT_TASK = "holds by the proxy, not at task level"
    PROXY_HOLDS = "holds by the proxy"  # the task did not judge it: :attr:`Verdict.missing` says why
    PROXY_DOES_NOT_HOLD = "does not hold by the proxy"
    CHANGES_NOTHING = "changes nothing on this task"
    TIES = "ties with one uniform plan"

    @property
    def decided(self) -> bool:
        return self not in (Phrase.NOT_DECIDED, Phrase.AT_THIS_SIZE)


@dataclass(frozen=True)
class Verdict:
    """A claim's phrase and the one measurement that decides it, in words (``said``); ``missing``: why
    the task did not judge a claim the proxy alone decides; ``needs``: what deciding an undecided claim takes."""

    phrase: Phrase
    said: str = ""
    missing: str = ""
    needs: Needs | None = None

    @property
    def aside(self) -> str:
        """What the phrase's brackets say: why the task did not judge it, or what deciding at a larger size takes."""
        return self.missing or (self.needs.text if self.needs is not None and self.phrase is Phrase.AT_THIS_SIZE else "")

    @property
    def text(self) -> str:
        """``phrase (aside): said``, and what deciding takes after an undecided claim's measurement.

        >>> from attnlens.report.deciding import Needs
        >>> Verdict(Phrase.AT_THIS_SIZE, needs=Needs("needs about 300 more examples, about 2 minutes here", 90.0)).text
        'not decided at this size (needs about 300 more examples, about 2 minutes here)'
        """
        head = f"{self.phrase.value} ({self.aside})" if self.aside else self.phrase.value
        if self.needs is not None and self.phrase is Phrase.NOT_DECIDED:
            return f"{head}: {self.said}; {self.needs.text}" if self.said else f"{head}: {self.needs.text}"
        return f"{head}: {self.said}" if self.said else head


@dataclass(frozen=True)
class Difference:
    """The number a verdict rests on: a change's (or a comparison's) mean difference with its 95% interval,
    in ``unit``, over ``examples`` held-out examples or blocks (``None``: not counted there), and, fine-tuned
    with several seeds, each seed's accuracy of the changed model."""

    mean: float
    low: float
    high: float
    unit: str
    examples: int | None = None
    seeds: tuple[float, ...] = ()

    @classmethod
    def of(cls, row: pd.Series, prefix: str = "delta_accuracy", unit: str = "points", examples: str = "held_out") -> Difference:
        """The interval a result's row holds in ``prefix``, ``prefix_low``, ``prefix_high``."""
        held = row.get(examples)
        return cls(float(row[prefix]), float(row[f"{prefix}_low"]), float(row[f"{prefix}_high"]), unit,
                   None if held is None or held != held else int(held))  # fmt: skip


RECORD_FIELDS = (
    "phrase", "difference", "difference_low", "difference_high", "unit", "examples", "margin", "margin_unit", "flops_ratio",
    "needs_examples", "needs_seconds",
)  # fmt: skip


@dataclass(frozen=True)
class Stated:
    """The margin a verdict was decided against: ``value`` in ``unit`` (points of accuracy, or the proxy's unit).

    >>> Stated(2.0, "points").text, Stated(0.01, "1 − cosine").text
    ('margin 2 points', 'margin 0.01 in 1 − cosine')
    """

    value: float
    unit: str

    @property
    def text(self) -> str:
        return f"margin {self.value:.3g} points" if self.unit == "points" else f"margin {self.value:g} in {self.unit}"


@dataclass(frozen=True)
class Claim:
    """One row: the claim, what the papers report, the verdict here and the numbers behind it: typed
    (``difference``, ``flops``: the share of attention FLOPs the claim's change computes) and in words
    (by the proxy, by the task, across seeds)."""

    claim: str
    papers: str
    verdict: Verdict
    proxy: str = ""
    task: str = ""
    seeds: str = ""
    difference: Difference | None = None
    flops: float | None = None
    margin: Stated | None = None

    def row(self, preset: str) -> list[str]:
        return [self.claim, self.papers, self.verdict.text, self.proxy, self.task, preset, self.seeds]

    def record(self) -> dict[str, object]:
        """The typed fields ``claims.csv`` keeps beside the words: the phrase by name and the numbers."""
        d, needs, margin = self.difference, self.verdict.needs, self.margin
        return {
            "phrase": self.verdict.phrase.name,
            "difference": np.nan if d is None else d.mean,
            "difference_low": np.nan if d is None else d.low,
            "difference_high": np.nan if d is None else d.high,
            "unit": "" if d is None else d.unit,
            "examples": np.nan if d is None or d.examples is None else d.examples,
            "margin": np.nan if margin is None else margin.value,
            "margin_unit": "" if margin is None else margin.unit,
            "flops_ratio": np.nan if self.flops is None else self.flops,
            "needs_examples": np.nan if needs is None or needs.examples is None else needs.examples,
            "needs_seconds": np.nan if needs is None or needs.seconds is None else needs.seconds,
        }


@dataclass(frozen=True)
class Context:
    """What every claim reads besides its own result: the preset, the task's ``margin`` (where a judgement
    did not record the fraction it was held to, it is resolved from the row) and the proxy's, why a claim the
    task did not judge was not judged, whether fine-tune seeds decide across seeds, what deciding takes here
    (``None``: not known, a report read back from before it was kept) and the words for what made the report
    (the preset, or the budget)."""

    preset: str
    margin: Margin = Margin(DEFAULT_MARGIN)
    proxy_margin: float = PROXY_MARGIN
    missing: str = "task: run --full"
    seeded: bool = False
    deciding: Deciding | None = None
    made_by: str = ""

    def task_margin(self, row: pd.Series | None = None, prefix: str = "") -> float:
        """The margin a task judgement was held to, as a fraction of accuracy: the one it recorded, else the
        report's resolved against its unmodified accuracy (a result saved before judgements recorded it)."""
        if row is not None and (held := row.get("margin", np.nan)) == held:
            return float(held)
        unmodified = np.nan if row is None else row.get(f"{prefix}unmodified_accuracy", np.nan)
        return self.margin.fraction(float(unmodified) if unmodified == unmodified else 1.0)

    def stated(self, row: pd.Series | None = None, prefix: str = "") -> Stated:
        """The task's margin as the page states it, in points."""
        return Stated(100 * self.task_margin(row, prefix), "points")

    def verdict(self, phrase: Phrase, said: str = "", needs: Needs | None = None) -> Verdict:
        """``phrase`` with ``said``; a phrase of the proxy alone says why the task did not judge it, and what
        judging it takes where that is known (``needs``); an undecided one what deciding it takes."""
        proxy_only = phrase in (Phrase.PROXY_HOLDS, Phrase.PROXY_DOES_NOT_HOLD)
        missing = (f"task: {needs.text}" if needs is not None else self.missing) if proxy_only else ""
        return Verdict(phrase, said, missing, needs)  # the words carry it in the brackets; the record keeps it too

    def at_this_size(self, stage: str) -> Verdict:
        """A stage's claim that only its full size decides: what that size takes here, where known."""
        needs = None if self.deciding is None else self.deciding.stage(stage)
        return Verdict(Phrase.AT_THIS_SIZE, missing="" if needs is not None else "run --full", needs=needs)


def on_task(low: float, high: float, *, margin: float) -> Phrase | None:
    """A "costs nothing" claim by its paired Δ accuracy interval (changed − unmodified) against −``margin``
    (:func:`~attnlens.analysis.margin.non_inferior`; ``None``: not decided)."""
    return {"holds": Phrase.HOLDS, "does not hold": Phrase.DOES_NOT_HOLD}.get(non_inferior(low, high, margin))


def by_proxy(moved: float, margin: float = PROXY_MARGIN) -> bool:
    """A "costs nothing" claim by the proxy: the outputs moved by at most ``margin`` (the proxy's own unit)."""
    return bool(moved <= margin)


def combine(*, proxy: bool | None, task: Phrase | None, judged: bool = True) -> Phrase:
    """The claim's phrase from the proxy's verdict (``None``: no proxy judges it) and the task's
    (:func:`on_task`; ``None`` with ``judged``: not decided; ``judged=False``: the task did not judge it)."""
    if not judged:
        return Phrase.AT_THIS_SIZE if proxy is None else Phrase.PROXY_HOLDS if proxy else Phrase.PROXY_DOES_NOT_HOLD
    if task is None:
        return Phrase.NOT_DECIDED
    if proxy is None or proxy == (task is Phrase.HOLDS):
        return task
    return Phrase.TASK_NOT_PROXY if task is Phrase.HOLDS else Phrase.PROXY_NOT_TASK


def reaches(value: float, threshold: float) -> Phrase:
    """A measured claim without an interval: it holds where the value reaches the threshold."""
    return Phrase.HOLDS if value >= threshold else Phrase.DOES_NOT_HOLD


def costs_less(difference: Difference, margin: float) -> Phrase:
    """A claim that one change costs less than another (their difference of costs below zero): holds where
    the paired interval lies below zero; does not hold where it lies above zero or within ±``margin`` (on par).

    >>> costs_less(Difference(-0.02, -0.03, -0.01, "nats"), 0.01), costs_less(Difference(0.0, -0.004, 0.005, "nats"), 0.01)
    (<Phrase.HOLDS: 'holds'>, <Phrase.DOES_NOT_HOLD: 'does not hold'>)
    """
    return beats(Difference(-difference.mean, -difference.high, -difference.low, difference.unit), margin)


def beats(difference: Difference, margin: float) -> Phrase:
    """A claim that one choice beats another (their difference of accuracy above zero), by the rule every
    comparison by the task follows (:func:`attnlens.analysis.margin.compared`): on par (within ±``margin``)
    counts against it."""
    said = compared(difference.low, difference.high, margin)
    return {"better": Phrase.HOLDS, "worse": Phrase.DOES_NOT_HOLD, "on par": Phrase.DOES_NOT_HOLD}.get(said, Phrase.NOT_DECIDED)


class TaskJudged(NamedTuple):
    """A "costs nothing" claim by the task: its phrase (``None``: not decided), whether the task judged
    it at this size, the difference it rests on, and what deciding takes where it did not decide."""

    phrase: Phrase | None
    judged: bool
    difference: Difference | None = None
    needs: Needs | None = None


def task_verdict(row: pd.Series | None, context: Context, prefix: str = "", stage: str = "") -> TaskJudged:
    """A "costs nothing" claim from a task judgement (``prefix``: its ``joint_`` columns) of ``stage``:
    fine-tuned with several seeds, across seeds; else over examples. A judgement on fewer examples than an
    interval needs counts as not judged at this size; one that did not decide says what deciding takes."""
    if row is None:
        return TaskJudged(None, False)
    if row.get(f"{prefix}accuracy", np.nan) != row.get(f"{prefix}accuracy", np.nan):  # a change the task did not judge
        return TaskJudged(None, False, needs=None if context.deciding is None else context.deciding.unjudged(stage))
    seeds, margin = seed_values(row, prefix), context.task_margin(row, prefix)
    if context.seeded and f"{prefix}delta_seeds_low" in row and seeds is not None:
        difference = Difference.of(row, f"{prefix}delta_seeds", examples=f"{prefix}held_out")
        difference = dataclasses.replace(difference, seeds=tuple(seeds))
        return TaskJudged(on_task(difference.low, difference.high, margin=margin), True, difference)
    difference = Difference.of(row, f"{prefix}delta_accuracy", examples=f"{prefix}held_out")
    judged = difference.examples is None or difference.examples >= TOO_FEW
    phrase = on_task(difference.low, difference.high, margin=margin) if judged else None
    needs = None
    if phrase is None and context.deciding is not None and difference.examples is not None:
        # the standard error at 1.96 of them: an early look's boundary is wider than the pool's end will be
        half = (difference.high - difference.low) / 2 * Z / row.get(f"{prefix}delta_bound", Z)
        needs = context.deciding.examples(stage, difference.examples, difference.mean, half, margin)
    return TaskJudged(phrase, judged, difference if judged else None, needs)


def seeds_points(row: pd.Series, prefix: str = "") -> str:
    """``−1.0 [−3.0, +1.0] over 3 seeds (0.74 0.75 0.73)``: fine-tuned with the change, Δ in points
    across seeds (t interval), each seed's accuracy in brackets."""
    each = seed_values(row, prefix)
    if each is None or f"{prefix}delta_seeds" not in row or row[f"{prefix}delta_seeds"] != row[f"{prefix}delta_seeds"]:
        return ""
    said = points(row, f"{prefix}delta_seeds", examples=None)
    return f"{said} over {len(each)} seeds ({' '.join(number(value, 3) for value in each)})"
