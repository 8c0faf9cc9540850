"""What each stage of the report will run, counted from its settings before it runs.

A stage's work is a list of :class:`Item`: so many batches of one :class:`~attnlens.forecast.units.Unit`
(blocks or examples through the model, with or without a change, a training step, moments), or seconds
timed directly (the reconstruction's fits). Counts come from the settings the stage will be given (sized
for the model) and from the task's own examples (their lengths set each batch's width). Where a stage
decides as it goes how much to run, an item carries a range, ``low`` to ``high``, and counts its middle
(DAM's training aside):

- a sequential judgement (``task_eval="auto"``) uses between its design's first look (192 examples)
  and the whole pool; a comparison between two changes may extend either to the pool;
- DAM's training stops when the mask has stopped changing: between its stopping window and its cap of
  steps, and the forecast is the cap (its schedule ends there, and the mask stops flipping only near
  its end: the full report's runs stopped at 277-289 of 300, the default's and the quick's at their caps;
  only a budget's few training blocks, one batch seen at every step, stopped gemma3-270m's at 11-12 of
  20); a swap search ends at a local optimum: between one round and its cap;
- the plan's search judges plans on between the first early look and the whole choosing half.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attnlens.forecast.units import Unit

if TYPE_CHECKING:
    from attnlens.data.tasks import Examples


@dataclass(frozen=True)
class Item:
    """``count`` batches of ``unit``, ``low`` to ``high`` of them where the stage decides as it goes; ``what`` says which."""

    what: str
    unit: Unit
    count: float
    low: float | None = None
    high: float | None = None

    @classmethod
    def ranged(cls, what: str, unit: Unit, low: float, high: float) -> Item:
        """An item whose count lies between ``low`` and ``high``: its middle is the forecast. A sequential design's
        judgements may stop at any look from the first to the pool's end; judged against a margin they use 0.21–0.77
        of the pool on average, 0.70 at the median case (``bench/bench_sequential.py``): the arithmetic middle is
        near, where the geometric middle of the looks (0.22 of a pool of 4,000) under-forecast the default report's
        judgements by half."""
        return cls(what, unit, (low + high) / 2, low, high)

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.count if self.low is None else self.low, self.count if self.high is None else self.high)


def batches(what: str, kind: str, sequences: int, batch: int, width: int, per_query: bool = False, passes: float = 1) -> Item:
    """``passes`` passes over ``sequences`` blocks of ``width`` tokens, ``batch`` at a time: counted as batches of
    ``batch`` (of all of them where there are fewer), a last, smaller batch as its share of one (a batch's
    seconds grow with its blocks)."""
    size = max(1, min(sequences, batch))
    return Item(what, Unit(kind, size, width, per_query), passes * sequences / size)


def examples(what: str, kind: str, examples: Examples, batch: int, low: float | None = None, high: float | None = None) -> Item:
    """``examples`` (or, with ``low`` and ``high``, between that many of them as a sequential design's looks:
    :meth:`Item.ranged`) in the
    batches :func:`~attnlens.analysis.task.batches` cuts (sorted by length, each at its longest example's width,
    or at the fixed width where the examples keep one), as whole batches of ``batch`` at their mean width: a
    batch's seconds are a fixed part and a part per token (:meth:`Calibration.seconds`), so the mean width
    prices them all."""
    lengths = examples.lengths
    if examples.fixed_width or len(lengths) == 0:
        width = float(examples.ids.shape[1])
    else:
        order = np.sort(lengths)
        widths = [(len(order[s : s + batch]), order[s : s + batch].max()) for s in range(0, len(order), batch)]
        width = sum(size * w for size, w in widths) / len(order)
    unit = Unit(kind, batch, int(round(width)))
    share = 1 / batch  # batches per example
    if low is None or high is None:
        return Item(what, unit, len(lengths) * share)
    return Item.ranged(what, unit, low * share, high * share)
