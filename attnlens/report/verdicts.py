"""A claim's verdict in one phrase, and the one number that decides it.

Each claim of the papers is judged by the measure the papers used where the report has it (task
accuracy, paired over held-out examples, judged sequentially until its interval decides) and by
a proxy (how far the model's outputs move) beside it; the rules are written here once, and
docs/science.md states them:

- a claim that a change **costs nothing** holds at task level when its paired Δ interval contains
  zero and is as narrow as the report's target, or lies above zero; it does not hold when the
  interval lies below zero; otherwise it is not decided;
- by the proxy, the same claim holds when the outputs move by at most :data:`PROXY_TOLERANCE`
  (1 − cosine of the final hidden states, or nats of the model's own loss), or, for a removal,
  when it costs no more than removing as many random positions (its excess interval reaches 0);
- where both judge a claim and disagree, the verdict says which holds ("holds at task level, not by
  the proxy"); where the task did not judge it at this size, the proxy's verdict says so ("by the
  proxy; task: run --full");
- a learned object (a DAM mask) is a result only when its runs converged and another seed reproduces
  it; with one seed or fewer examples than the claim needs, the verdict is "not decided at this size
  (run --full)", and no number is printed beside it.

>>> on_task(-0.013, 0.003, target=0.02), on_task(-0.05, -0.01, target=0.02), on_task(-0.05, 0.03, target=0.02)
('holds', 'does not hold', None)
>>> combine(proxy=False, task="holds")
'holds at task level, not by the proxy'
>>> Verdict(combine(proxy=True, task=None, judged=False), "cosine 0.998").text
'holds by the proxy (task: run --full): cosine 0.998'
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnlens.report.words import TOO_FEW, number, points

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
NOT_DECIDED = "not decided"
RUN_FULL = "not decided at this size (run --full)"
DECIDING = ("full", "finetune")  # the presets whose undecided claims the data leave open, not the size
PROXY_TOLERANCE = 0.01  # the outputs "keep" when they move by at most this (1 − cosine, or nats)


@dataclass(frozen=True)
class Verdict:
    """One phrase (``holds``, ``does not hold``, …) and the one number that decides it."""

    phrase: str
    number: str = ""

    @property
    def text(self) -> str:
        return f"{self.phrase}: {self.number}" if self.number else self.phrase


def on_task(low: float, high: float, *, target: float) -> str | None:
    """A "costs nothing" claim by its paired Δ accuracy interval (changed − unmodified): see the module."""
    if low > 0 or (low <= 0 <= high and (high - low) / 2 <= target):
        return HOLDS
    if high < 0:
        return DOES_NOT_HOLD
    return None


def combine(*, proxy: bool | None, task: str | None, judged: bool = True, missing: str = "task: run --full") -> str:
    """The claim's phrase from the proxy's verdict (``None``: no proxy judges it) and the task's
    (:func:`on_task`; ``None`` with ``judged``: not decided; ``judged=False``: the task did not judge
    it, for the reason ``missing`` says)."""
    by_proxy = None if proxy is None else HOLDS if proxy else DOES_NOT_HOLD
    if not judged:
        return RUN_FULL if by_proxy is None else f"{by_proxy} by the proxy ({missing})"
    if task is None:
        return NOT_DECIDED
    if by_proxy is None or by_proxy == task:
        return task
    return "holds at task level, not by the proxy" if task == HOLDS else "holds by the proxy, not at task level"


def reaches(value: float, threshold: float) -> str:
    """A measured claim without an interval: it holds where the value reaches the threshold."""
    return HOLDS if value >= threshold else DOES_NOT_HOLD


@dataclass(frozen=True)
class Claim:
    """One row: the claim, what the papers report, the verdict here, and the numbers behind it."""

    claim: str
    papers: str
    verdict: Verdict
    proxy: str = ""
    task: str = ""
    seeds: str = ""

    def row(self, preset: str) -> list[str]:
        return [self.claim, self.papers, self.verdict.text, self.proxy, self.task, preset, self.seeds]


@dataclass
class Evidence:
    """What every claim reads besides its own result: the preset, the task's target half-width, and
    why a claim the task did not judge was not judged."""

    preset: str
    target: float = 0.02
    missing: str = "task: run --full"
    seeded: bool = False
    rows: list[Claim] = field(default_factory=list)


def task_verdict(row: pd.Series | None, evidence: Evidence, prefix: str = "") -> tuple[str | None, bool]:
    """(verdict, judged) of a "costs nothing" claim from a task judgement (``prefix``: its ``joint_``
    columns): fine-tuned with several seeds, across seeds; else over examples. A judgement on fewer
    examples than an interval needs counts as not judged at this size."""
    if row is None or row.get(f"{prefix}accuracy", np.nan) != row.get(f"{prefix}accuracy", np.nan):
        return None, False
    if evidence.seeded and f"{prefix}delta_seeds_low" in row:
        return on_task(row[f"{prefix}delta_seeds_low"], row[f"{prefix}delta_seeds_high"], target=evidence.target), True
    if row.get(f"{prefix}held_out", TOO_FEW) < TOO_FEW:
        return None, False
    low, high = row[f"{prefix}delta_accuracy_low"], row[f"{prefix}delta_accuracy_high"]
    return on_task(low, high, target=evidence.target), True


def seeds_points(row: pd.Series, prefix: str = "") -> str:
    """``−1.0 [−3.0, +1.0] over 3 seeds (0.74 0.75 0.73)``: fine-tuned with the change, Δ in points
    across seeds (t interval), each seed's accuracy in brackets."""
    if f"{prefix}delta_seeds" not in row or row[f"{prefix}delta_seeds"] != row[f"{prefix}delta_seeds"]:
        return ""
    each = str(row[f"{prefix}seed_accuracies"]).split()
    said = points(pd.Series({"delta_accuracy": row[f"{prefix}delta_seeds"], "delta_accuracy_low": row[f"{prefix}delta_seeds_low"],
                             "delta_accuracy_high": row[f"{prefix}delta_seeds_high"]}))  # fmt: skip
    return f"{said} over {len(each)} seeds ({' '.join(number(float(value), 3) for value in each)})"
