"""When a run ends and whether it converged: the stopping rule and the convergence check.

:class:`StoppingRule` ends the schedule once the hard mask stops changing (``steps`` is then only a
cap); :func:`convergence` then asks whether the mask is an optimum, at a learning rate that still
moves it, or only where the annealed schedule froze it (:meth:`~attnlens.analysis.dam.training.DamTrainer.check`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlens.analysis.dam.settings import DamSettings, StoppingSettings
from attnlens.analysis.evaluation import bootstrap_interval

CHECK_BATCHES = 8  # training batches the convergence check scores the judged mask on
TARGET_WITHIN = 0.01  # converged with a target: the shift to it changes training's hard mask by at most a point
FLOAT_FLOOR = 1e-6  # a change of a loss smaller than float32 arithmetic resolves there is no improvement

Judged = dict[int, tuple[float, np.ndarray, float]]
"""The judged mask's scores during a run, by step (-1: the start): the learning-rate factor at the step,
the loss of each block of the check's training batches, and the share the calibration's shift removed."""


@dataclass(frozen=True)
class StoppingRule:
    """When DAM training has converged: over the last ``window`` steps, fewer than ``flips``
    of the hard mask's positions (each logit weighted by the positions it decides) changed,
    and the training loss (objective + λ·sampled density, so logits still drifting towards the
    threshold count as change) has a mean over the window's second half within ``plateau``
    (relative) of its first half. ``steps`` is then only a cap.

    A decision changes when its logit crosses the threshold by more than ``margin`` (a
    hysteresis: it stays as it was while |α| <= margin). A position whose worth balances λ
    sits at the threshold and, as a kept position's gradient pushes it out and a removed one's
    pulls it back, crosses it every few steps by less than the learning rate however small that
    gets; counted as change, a few such logits would hold every run to the cap.

    >>> rule = StoppingRule(window=4, flips=0.001, plateau=0.01, margin=0.05)
    >>> rule.plateaued([1.0, 1.0, 1.001, 0.999]), rule.plateaued([1.0, 1.0, 0.8, 0.8])
    (True, False)
    """

    window: int
    flips: float
    plateau: float
    margin: float

    @classmethod
    def of(cls, settings: StoppingSettings) -> StoppingRule:
        return cls(settings.window, settings.flips, settings.plateau, settings.margin)

    def decisions(self, logits: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
        """The hard decisions after a step: α > margin keeps, α < -margin removes, and in between
        each keeps its decision ``before``.

        >>> rule = StoppingRule(window=4, flips=0.001, plateau=0.01, margin=0.1)
        >>> rule.decisions(torch.tensor([0.5, 0.05, -0.05, -0.5]), torch.tensor([False, False, True, True])).tolist()
        [True, False, True, False]
        """
        return torch.where(logits.abs() > self.margin, logits > 0, before)

    def plateaued(self, objectives: list[float]) -> bool:
        """The last ``window`` losses: the second half's mean within ``plateau`` of the first's."""
        recent = np.asarray(objectives[-self.window :], dtype=np.float64)
        first, second = recent[: len(recent) // 2].mean(), recent[len(recent) // 2 :].mean()
        return bool(abs(second - first) <= self.plateau * max(abs(first), 1e-12))


def convergence(judged: Judged, settings: DamSettings, seed: int, target_density: float | None) -> tuple[dict[str, float], bool]:
    """Whether the mask converged while the learning rate still moved it, not only where the
    annealed schedule froze it, from its scores during the run (``judged``).

    The judged mask (calibrated to the target) is scored on a fixed few training batches every
    ``check_window`` / 2 steps
    (:meth:`~attnlens.analysis.dam.training.DamTrainer.judged_losses`). The check compares the last score taken
    while the learning rate was at least ``check_lr`` of its start with the score
    ``check_window`` steps earlier (or the earliest in between, when the stopping rule ended the
    run sooner), paired over blocks with a 95% bootstrap interval. Converged:
    over that window the mask's score did not change by more than its noise (nor by more than
    :data:`FLOAT_FLOOR`, below which a loss near 0 only jitters), at a rate that still moves
    its logits (a quarter of the start moves one by 1 in 40 steps), so the schedule's last, annealed
    stretch only froze a mask that had already settled; and, with a target, the shift that meets
    it there changed training's own hard mask by at most :data:`TARGET_WITHIN` of the positions,
    so the mask judged is the mask trained, not one the threshold shift made. Not converged: it
    was still changing when the rate fell (the annealing ended it), dual ascent had not brought
    training's mask to the target, or the run was too short to judge. Returns the check's columns (the
    window's end step, the change of the score with its interval, and the share the shift removed
    there) and whether the mask converged.
    """
    s = settings
    meaningful = [step for step, (rate, *_) in judged.items() if rate >= s.stopping.check_lr]
    end = meaningful[-1] if meaningful else None
    # the score check_window steps earlier (or the earliest within it, when the stopping rule ended a run sooner)
    earlier = [step for step in judged if end is not None and end - s.stopping.check_window <= step < end]
    start = earlier[0] if earlier else None
    check = {
        "check_step": float("nan"),
        "check_delta": float("nan"),
        "check_low": float("nan"),
        "check_high": float("nan"),
        "check_shifted": float("nan"),
    }
    if start is None or end is None:  # too few steps at a meaningful rate to judge
        return check, False
    change = judged[end][1] - judged[start][1]
    mean, low, high = bootstrap_interval(change[None], s.bootstrap, seed)
    shifted = judged[end][2]
    check = {
        "check_step": end, "check_delta": mean[0], "check_low": low[0], "check_high": high[0], "check_shifted": shifted,
    }  # fmt: skip
    settled = bool(low[0] <= 0 <= high[0] or abs(mean[0]) <= FLOAT_FLOOR)  # no change beyond its noise
    return check, settled and (target_density is None or abs(shifted) <= TARGET_WITHIN)
