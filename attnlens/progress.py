"""Progress bars for long work: rate and ETA on stderr, off when not wanted.

A run made of stages (``attnlens report``) shows one bar for all of them. Each stage is a
:class:`Stage`, a stretch of that bar, given as the ``progress`` of the entry point that
does the stage's work; the bars that work opens (:func:`progress_bar` with
``enabled=stage``) draw nothing themselves but move the parent through the stage, so it
advances inside every stage and names the stage and the unit it counts.

>>> import io
>>> from tqdm import tqdm
>>> parent = tqdm(total=100, desc="report", file=io.StringIO())
>>> with progress_bar(total=4, desc="dam", unit="step", enabled=Stage(parent, "report: dam", 20, 60)) as bar:
...     bar.update(2)
>>> parent.n, parent.desc
(40, 'report: dam · 2/4 step')
"""

from __future__ import annotations

import math
import time
from typing import Protocol

from tqdm.auto import tqdm

REDRAW_S = 0.5  # most often a stage redraws a parent that has not moved (each draw is a line in a log)


class Stage:
    """The stretch ``[start, end]`` of a ``parent`` bar (in its units) that one stage fills; the
    parent shows ``label`` ("report: dam") while it does.

    Bars opened on a stage take what is left of it; work that opens several bars one after
    another gives each a part first (:func:`split`). The parent never moves back and never
    passes ``end``; :meth:`finish` moves it to ``end`` when the stage's work is done.
    """

    def __init__(self, parent: tqdm, label: str, start: float, end: float) -> None:
        self.parent, self.label = parent, label
        self.name = label.rsplit(": ", 1)[-1]  # "dam"
        self.start, self.end = start, end
        self.free = start  # where the part not yet handed to a bar (or a split) begins
        self.drawn = -math.inf  # when this stage last redrew the parent without moving it

    def split(self, *weights: float) -> list[Stage]:
        """What is left of this stage, cut into consecutive parts in proportion to ``weights``.

        >>> from tqdm import tqdm
        >>> [(part.start, part.end) for part in Stage(tqdm(disable=True), "x", 0, 10).split(1, 3, 0)]
        [(0.0, 2.5), (2.5, 10.0), (10.0, 10.0)]
        """
        total = sum(weights)
        bounds = [
            self.free + (self.end - self.free) * sum(weights[:i]) / total if total else self.end for i in range(len(weights) + 1)
        ]
        bounds[-1] = float(self.end)  # exactly: the parts together are the rest of the stage
        self.free = self.end
        return [Stage(self.parent, self.label, low, high) for low, high in zip(bounds, bounds[1:])]

    def here(self) -> Stage:
        """A stage of no width where the parent is now: its bars name what they count without moving
        the parent (work inside one step of another bar, such as a fine-tune inside one judgement)."""
        return Stage(self.parent, self.label, self.parent.n, self.parent.n)

    def claim(self) -> tuple[float, float]:
        """The rest of the stage, for one bar: (start, end) in the parent's units."""
        start, self.free = self.free, self.end
        return start, self.end

    def move_to(self, position: float, note: str = "") -> None:
        """Show the parent at ``position`` (at most ``end``; never back) with ``note`` after the stage's name."""
        # Rounded down (past float noise): the parent never shows more done than is.
        target = math.floor(min(position, self.end) + 1e-9)
        self.parent.set_description_str(f"{self.label} · {note}" if note else self.label, refresh=False)
        if target > self.parent.n:
            self.parent.update(target - self.parent.n)  # draws (tqdm: at most every 0.1 s)
        elif self.parent.n < self.parent.total and time.monotonic() - self.drawn >= REDRAW_S:
            # A count inside the stage moved, or the stage began, but not by a whole unit of the parent: show it.
            # (Not at the parent's end: its final line is close()'s.)
            self.parent.refresh()
            self.drawn = time.monotonic()

    def finish(self) -> None:
        """The stage is done: the parent moves to its end (what its bars did not count, e.g. work without a bar)."""
        self.move_to(self.end)


class StageBar:
    """A bar on a :class:`Stage`: it draws nothing itself, its count moves the stage's parent through its part."""

    def __init__(self, stage: Stage, *, total: int, desc: str, unit: str, initial: int = 0) -> None:
        self.stage, self.total, self.unit, self.n = stage, total, unit, initial
        self.start, self.end = stage.claim()
        # The parent names the stage already: the bar adds its own name only where it differs ("moments").
        self.name = desc.removeprefix(stage.name).lstrip(": ")
        self._show()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._show()

    def part(self, fraction: float, note: str = "") -> None:
        """Show the unit under way as ``fraction`` done, ``note`` saying how far (work inside one unit: a
        judgement's examples), without counting it: the parent moves on through the unit."""
        self._show(min(max(fraction, 0.0), 1.0), note)

    def set_postfix_str(self, text: str) -> None:
        """What a tqdm bar writes after its count; nothing here: the parent's note says what the stage is at."""

    def close(self) -> None:
        """Nothing to draw; a bar closed early leaves the parent where its count had it."""

    def __enter__(self) -> StageBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _show(self, part: float = 0.0, under_way: str = "") -> None:
        done = min((self.n + part) / self.total, 1.0) if self.total > 0 else 0.0
        note = " ".join(piece for piece in (self.name, f"{self.n}/{self.total} {self.unit}") if piece)
        self.stage.move_to(self.start + (self.end - self.start) * done, f"{note}, {under_way}" if under_way else note)


Progress = bool | Stage  # what every entry point takes as ``progress``: show a bar, or not, or move a parent's stage


class Moving(Protocol):
    """A bar that shows how far the unit under way is: :meth:`StageBar.part`, ``_Bar.part``."""

    def part(self, fraction: float, note: str = "") -> None: ...


def split(progress: Progress, *weights: float) -> list[Progress]:
    """``progress`` for pieces of work done one after another, each with its own bars: on a
    :class:`Stage`, consecutive parts of what is left of it in proportion to ``weights``;
    otherwise ``progress`` itself, for every piece.

    >>> split(True, 1, 3)
    [True, True]
    """
    return list(progress.split(*weights)) if isinstance(progress, Stage) else [progress] * len(weights)


class _Bar(tqdm):
    """tqdm that leaves one final line: the update that completes the bar draws nothing, since close() draws it."""

    def part(self, fraction: float, note: str = "") -> None:
        """How far the unit under way is (:meth:`StageBar.part`), written after the count."""
        self.set_postfix_str(note or f"{fraction:.0%} of the next {self.unit}")

    def update(self, n: float | None = 1) -> bool | None:
        # Without this, a log (stderr not a terminal) holds the 100% line twice.
        if not self.disable and self.total is not None and n is not None and self.n + n >= self.total:
            self.n += n
            return None
        return super().update(n)


def progress_bar(*, total: int, desc: str, unit: str = "it", initial: int = 0, enabled: Progress = True) -> _Bar | StageBar:
    """A tqdm bar (count, rate, ETA) that prints nothing when ``enabled`` is false, and moves
    the parent of ``enabled`` through its stage when it is a :class:`Stage`.

    >>> with progress_bar(total=3, desc="demo", enabled=False) as bar:
    ...     bar.update(3)
    """
    if isinstance(enabled, Stage):
        return StageBar(enabled, total=total, desc=desc, unit=unit, initial=initial)
    return _Bar(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, smoothing=0.1)
