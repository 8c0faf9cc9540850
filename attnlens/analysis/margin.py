"""The margin of loss a verdict accepts, and the three questions a paired interval answers against it.

The papers call a change that costs a little "enough" or "without loss": paper 1 calls k = 32 enough at
79.7% against 81.6% on MNLI (1.9 points, "97% of the baseline accuracy"). A claim that a change
**suffices**, **costs nothing** or **keeps the model** is therefore a non-inferiority question, decided
against a stated margin δ, never against zero (an interval that holds zero is not evidence of no loss):

- :func:`non_inferior`: holds when the whole interval of Δ (changed − unmodified) lies above −δ, does not
  hold when it lies below −δ, and is not decided while it holds −δ;
- :func:`compared`: one choice against another (first − second, higher better): "better" or "worse" where
  the interval excludes zero, "on par" only where it lies within ±δ (equivalence), else "not decided".

A :class:`Margin` is given in points of accuracy (``2``) or as a share of the unmodified accuracy
(``"3%"``, paper 1's yardstick), and resolved to a fraction of accuracy once the unmodified accuracy is
known (:meth:`Margin.fraction`). The proxy's margin is in the proxy's own unit (:data:`PROXY_MARGIN`).

>>> margin = Margin.parse("3%")
>>> str(margin), round(margin.fraction(0.80), 4)
('3% of the unmodified accuracy', 0.024)
>>> non_inferior(-0.015, 0.004, 0.02), non_inferior(-0.06, -0.025, 0.02), non_inferior(-0.03, 0.0, 0.02)
('holds', 'does not hold', 'not decided')
>>> compared(0.001, 0.03, 0.02), compared(-0.015, 0.012, 0.02), compared(-0.03, 0.01, 0.02)
('better', 'on par', 'not decided')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlens.errors import BadInput

DEFAULT_MARGIN = 2.0  # points of accuracy: about the 1.9 points paper 1 accepted at k = 32 (docs/science.md)
# The proxy's margin, in its own unit (1 − cosine of the final hidden states, or nats of the model's loss):
# outputs that move by at most this keep the model.
PROXY_MARGIN = 0.01
HOLDS, DOES_NOT_HOLD, NOT_DECIDED = "holds", "does not hold", "not decided"
BETTER, WORSE, ON_PAR = "better", "worse", "on par"


@dataclass(frozen=True)
class Margin:
    """A margin of accuracy: ``value`` points, or with ``relative`` ``value`` percent of the unmodified accuracy."""

    value: float
    relative: bool = False

    @classmethod
    def parse(cls, given: float | int | str, name: str = "margin") -> Margin:
        """``2`` or ``"2"``: 2 points; ``"3%"``: 3% of the unmodified accuracy. Anything else, a margin of 0 or
        less, more than 100 points or more than 100%, is bad input naming ``name``.

        >>> Margin.parse("2"), Margin.parse(" 3 % ")
        (Margin(value=2.0, relative=False), Margin(value=3.0, relative=True))
        >>> Margin.parse("150%")
        Traceback (most recent call last):
            ...
        attnlens.errors.BadInput: margin 150% is more than the whole accuracy; give at most 100%, e.g. margin 3%
        """
        text = str(given).strip()
        relative = text.endswith("%")
        number = text.removesuffix("%").strip() if relative else text
        try:
            value = float(number)
        except ValueError:
            raise BadInput(
                f"`{name}` {given!r} is not a margin: give points of accuracy (`{name}` 2) or a share of the unmodified "
                f"accuracy (`{name}` 3%)"
            ) from None
        said = f"{value:g}{'%' if relative else ''}"
        if not (value > 0 and math.isfinite(value)):
            raise BadInput(f"`{name}` {said} must be greater than 0: the loss a change may cost, e.g. `{name}` 2 (points)")
        if value > 100:
            raise BadInput(
                f"`{name}` {said} is more than the whole accuracy; give at most {'100%' if relative else '100 points'}, "
                f"e.g. `{name}` {'3%' if relative else '2'}"
            )
        return cls(value, relative)

    def fraction(self, unmodified: float) -> float:
        """The margin as a fraction of accuracy (2 points: 0.02), ``unmodified`` the unmodified model's accuracy."""
        return self.value / 100 * (unmodified if self.relative else 1.0)

    @property
    def setting(self) -> float | str:
        """As a setting holds it: points as a number, a share as its text (``"3%"``)."""
        return f"{self.value:g}%" if self.relative else self.value

    def __str__(self) -> str:
        return f"{self.value:g}% of the unmodified accuracy" if self.relative else f"{self.value:g} points"


def non_inferior(low: float, high: float, margin: float) -> str:
    """A "costs nothing" claim by the interval [``low``, ``high``] of Δ (changed − unmodified) against −``margin``:
    "holds" above it, "does not hold" below it, else "not decided" (see the module)."""
    if low > -margin:
        return HOLDS
    return DOES_NOT_HOLD if high < -margin else NOT_DECIDED


def compared(low: float, high: float, margin: float) -> str:
    """Two choices by the interval of their difference (first − second, higher better): "better" or "worse"
    where it excludes zero, "on par" where it lies within ±``margin``, else "not decided"."""
    if low > 0:
        return BETTER
    if high < 0:
        return WORSE
    return ON_PAR if -margin < low and high < margin else NOT_DECIDED


def decides(question: str, low: float, high: float, margin: float) -> bool:
    """Whether the interval answers ``question`` (``"non-inferiority"`` or ``"comparison"``) against ``margin``.

    >>> decides("non-inferiority", -0.01, 0.01, 0.02), decides("comparison", -0.03, 0.01, 0.02)
    (True, False)
    """
    rule = non_inferior if question == NON_INFERIORITY else compared
    return rule(low, high, margin) != NOT_DECIDED


NON_INFERIORITY, COMPARISON = "non-inferiority", "comparison"
QUESTIONS = (NON_INFERIORITY, COMPARISON)
