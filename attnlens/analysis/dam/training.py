"""Training one mask: the trainer, its schedules, dual ascent on λ, the stopping rule and the convergence check.

:class:`DamTrainer` is built from a layout and the run's :class:`DamSettings` alone (it has
no defaults of its own, so what a benchmark measures is what :func:`dam` runs). Each step
draws a Gumbel-sigmoid sample ``M_soft = σ((α + s·(g₁ - g₂))/τ)``, uses the hard mask
``M = [α + s·(g₁ - g₂) > 0]`` in the forward pass with the straight-through gradient of
``M_soft``, and minimises ``objective + λ·mean(M)`` (the mean over valid positions, so
``mean(M)`` is the density). With a target sparsity, λ moves by dual ascent, or the hard mask
is held at a density brought down to the target (:meth:`DamTrainer.aim`), and the logits are
shifted so the hard mask meets the target (:meth:`DamTrainer.calibrate`);
:class:`StoppingRule` ends the schedule once the hard mask stops changing, and
:meth:`DamTrainer.check` then asks whether the mask is an optimum, at a learning rate that
still moves it, or only where the annealed schedule froze it.

>>> cosine(0, 11, 0.1), round(cosine(5, 11, 0.1), 3), cosine(10, 11, 0.1)
(1.0, 0.55, 0.1)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import MaskChange, rescue_rows, seeded
from attnlens.analysis.dam.layouts import MaskLayout, hard_sparsity
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.evaluation import bootstrap_interval, evaluate_change, frozen
from attnlens.analysis.objectives import Objective, PreparedBatch
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel

if TYPE_CHECKING:  # judging imports this module
    from attnlens.analysis.dam.judging import MaskSplit

NOISE_STREAM, ORDER_STREAM, PROBE_STREAM = 11, 12, 14  # seeded streams of a run's draws (13: the patterns')
CHECK_BATCHES = 8  # training batches the convergence check scores the judged mask on
TARGET_WITHIN = 0.01  # converged with a target: the shift to it changes training's hard mask by at most a point
FLOAT_FLOOR = 1e-6  # a change of a loss smaller than float32 arithmetic resolves there is no improvement
DUAL_PROBES = 4  # batches whose gradients set the λ a warm start's run starts from (DamTrainer.balancing_lambda)
LAMBDA_FLOOR = 1e-3  # the least λ a run starts from (dual ascent moves λ in log space)
HOLD_RAMP = 1 / 3  # a held mask's density comes down to the target over this share of the step cap (DamTrainer.aim)
_BIG = 1e4  # the straight-through gradient scale of both additive removals: ∂scores/∂M


def cosine(step: int, steps: int, end: float) -> float:
    """A cosine schedule's factor: 1 at step 0, ``end`` at step ``steps - 1``."""
    progress = step / max(steps - 1, 1)
    return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_order(seed: int, num_batches: int, steps: int) -> np.ndarray:
    """Which training batch each step takes: seeded epochs of permutations, cut at ``steps``.

    >>> sorted(batch_order(0, 4, 8)[:4].tolist())
    [0, 1, 2, 3]
    """
    rng = np.random.default_rng(seeded(seed, ORDER_STREAM))
    epochs = math.ceil(steps / num_batches)
    return np.concatenate([rng.permutation(num_batches) for _ in range(epochs)])[:steps]


def balancing_lambda(ratio: torch.Tensor, weights: torch.Tensor, keep: float) -> float:
    """The λ that leaves the share ``keep`` of ``weights`` on logits whose ``ratio`` exceeds it:
    the weighted (1 - keep) quantile of ``ratio``. With ``ratio`` the loss's pull on each logit
    over the density's (:meth:`DamTrainer.balancing_lambda`), those are the logits that rise.

    >>> balancing_lambda(torch.tensor([4.0, 1.0, 3.0, 2.0]), torch.tensor([1.0, 1.0, 2.0, 1.0]), 0.6)
    3.0
    """
    ratio, weights = ratio.flatten(), weights.flatten()
    order = torch.argsort(ratio, descending=True)
    kept = torch.cumsum(weights[order], 0) / weights.sum()  # the share kept when the cut passes each logit
    index = min(int(torch.searchsorted(kept, torch.tensor(keep, dtype=kept.dtype))), len(order) - 1)
    return float(ratio[order[index]])


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
    def of(cls, settings: DamSettings) -> StoppingRule:
        return cls(settings.stop_window, settings.stop_flips, settings.stop_plateau, settings.stop_margin)

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


class DamTrainer:
    """Learns the mask logits of one layout for one λ (or one target density).

    ``__init__`` stores what it is given only; :meth:`start` creates ``logits_`` (and the
    optimiser and noise generator), :meth:`step` takes one training step, :meth:`fit` runs
    the schedule until the stopping rule holds or the cap, then :meth:`check` tests the mask
    for an optimum. ``lam`` is the starting λ (``None`` with a target: where the gradients
    balance), ``init_logits`` a warm start, ``seed`` the run's draws (noise and batch order;
    default the settings' seed).

    With an additive removal (``"1e4"``, ``"inf"``) the straight-through gradient treats the
    mask as ``s' = s + gradient_scale·(M - 1)`` near the hard value: with ``gradient_scale =
    1`` ``∂L/∂M`` is the first-order change of the loss when a position's ``exp(s)`` is gated,
    so λ trades loss against density in the loss's own units. Differentiating
    ``s + (1 - M)·(-10⁴)`` literally, as SparseBERT does, is ``gradient_scale = 10⁴``; with
    Adam, which ignores the gradient's overall scale, that equals 1 with λ divided by 10⁴.
    """

    gradient_scale = 1.0

    def __init__(
        self,
        layout: MaskLayout,
        settings: DamSettings,
        *,
        lam: float | None,
        target_density: float | None = None,
        init_logits: torch.Tensor | None = None,
        seed: int | None = None,
    ) -> None:
        self.layout, self.settings = layout, settings
        self.lam, self.target_density, self.init_logits = lam, target_density, init_logits
        self.seed = settings.seed if seed is None else seed
        self.steps = settings.steps
        self.tau = settings.temperature
        self.stopping = StoppingRule.of(settings)

    def start(self, model: LoadedModel) -> DamTrainer:
        s = self.settings
        self.model_ = model
        if self.init_logits is not None:  # a warm start (e.g. at a fixed pattern: pattern_logits)
            self.logits_ = self.init_logits.detach().clone().to(model.device).requires_grad_(True)
        else:
            init = math.log(s.init_keep / (1 - s.init_keep))
            self.logits_ = torch.full(self.layout.shape, init, device=model.device, requires_grad=True)
        groups = [{"params": [self.logits_], "lr": s.lr}]
        if s.train_weights:
            groups.append({"params": [p for p in model.model.parameters() if p.requires_grad], "lr": s.weights_lr})
        self.optimizer_ = torch.optim.Adam(groups)
        self.generator_ = torch.Generator().manual_seed(seeded(self.seed, NOISE_STREAM))
        self.step_ = 0
        self.holding_ = self.target_density is not None and s.holds
        self.moments_ = None  # a held run's running averages of the pull and the push (balance)
        return self

    # -- schedules

    def temperature(self, step: int) -> float:
        start, end = self.tau
        return start * (end / start) ** (step / max(self.steps - 1, 1))

    def rate(self, step: int) -> float:
        """The learning rates' factor at ``step``: a cosine from 1 down to ``lr_end`` at the step cap.
        It scales the logits' and the weights' rates."""
        return cosine(step, self.steps, self.settings.lr_end)

    def noise(self, step: int) -> float:
        """The scale of the logistic noise at ``step``: a cosine from 1 down to ``noise_end``, so that
        late samples approach the hard mask that is judged."""
        return cosine(step, self.steps, self.settings.noise_end)

    def schedule(self) -> tuple[float, float, float]:
        """(temperature, learning-rate factor, noise scale) of the next step."""
        return self.temperature(self.step_), self.rate(self.step_), self.noise(self.step_)

    # -- one step

    def sample(self, tau: float, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A hard 0/1 mask with straight-through gradients of its Gumbel-sigmoid relaxation.

        Returns the mask for the penalty (gradient of ``M_soft``), the mask for the scores,
        whose gradient is scaled by ``gradient_scale / 10⁴`` so that the scores see
        ``∂s'/∂M = gradient_scale`` (see :class:`DamTrainer`), both equal to the hard mask,
        and the noisy logits ``α + g₁ - g₂`` the hard mask thresholds.
        """
        uniform = torch.rand(self.layout.shape, generator=self.generator_).clamp_(1e-6, 1 - 1e-6).to(self.logits_.device)
        noisy = self.logits_ + noise * (torch.log(uniform) - torch.log1p(-uniform))  # α + g₁ - g₂ (logistic noise)
        soft = torch.sigmoid(noisy / tau)
        hard = (noisy.detach() > 0).to(soft.dtype)
        relaxation = soft - soft.detach()  # zero, with the gradient of soft
        return hard + relaxation, hard + relaxation * (self.gradient_scale / _BIG), noisy.detach()

    def intervention(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor):
        """The score intervention that applies ``mask`` (logits' shape) in every layer.

        ``removal="1e4"`` adds ``(M - 1)·10⁴`` (a row with every key removed is then
        shifted as a whole, i.e. unmasked, as in SparseBERT); ``"inf"`` sets removed scores
        to ``-inf`` and lets a row with nothing left keep its keys of largest noisy logit.
        """
        layout, infinite = self.layout, self.settings.removal == "inf"
        cache: dict[int, torch.Tensor] = {}  # a layout shared by layers is expanded once per step

        def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            key, width = 0 if layout.shared_by_layers else layer, scores.shape[-1]  # a task batch: its (w, w) corner
            if key not in cache:
                expanded = layout.expand(mask, layer, context)[..., :width, :width]
                cache[key] = expanded if infinite else (expanded - 1) * _BIG
            if not infinite:
                return scores + cache[key]
            expanded = cache[key]
            keep = rescue_rows(layout.expand(noisy, layer, context)[..., :width, :width], valid[:, None])
            return scores.masked_fill(~keep, float("-inf")) + (expanded - expanded.detach()) * _BIG

        return intervene

    def gate(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor):
        """The weights intervention of ``removal="renormalise"``: the hard mask (rows it would
        empty keep their keys of largest noisy logit) multiplies the weights, which are then
        renormalised over what is kept. The forward pass equals removing the scores by -inf; the
        backward pass treats the mask as a gate on each weight, so a removed position still gets
        the gradient of bringing it back (weight w_ij / Σ kept, times its effect), which an
        additive -10⁴ on the scores zeroes (softmax's Jacobian carries the factor w_ij = 0)."""
        layout = self.layout

        def intervene(layer: int, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            width = weights.shape[-1]  # a task batch: its (w, w) corner
            soft = layout.expand(mask, layer, context)[..., :width, :width]
            keep = rescue_rows(layout.expand(noisy, layer, context)[..., :width, :width], valid[:, None]).to(weights.dtype)
            gated = weights * (keep + (soft - soft.detach()))
            return gated / gated.sum(-1, keepdim=True).clamp_min(1e-30)

        return intervene

    def sampled_loss(
        self, objective: Objective, batch: PreparedBatch, context: torch.Tensor, counts: torch.Tensor, tau: float, noise: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective on ``batch`` under one sampled hard mask, and the mask's density over the
        batch's valid positions, which each logit decides ``counts`` of (its straight-through
        relaxation carries the gradients to the logits)."""
        mask, score_mask, noisy = self.sample(tau, noise)
        density = (mask * counts).sum() / counts.sum()
        return self.masked_loss(objective, batch, context, mask, score_mask, noisy), density

    def masked_loss(
        self, objective: Objective, batch: PreparedBatch, context: torch.Tensor, mask, score_mask, noisy
    ) -> torch.Tensor:
        """The objective on ``batch`` with ``mask`` (or ``score_mask``, by the removal) inside attention."""
        if self.settings.removal == "renormalise":
            capture = Capture(record=False, intervene_weights=self.gate(mask, context, noisy))
        else:
            capture = Capture(record=False, intervene=self.intervention(score_mask, context, noisy))
        with capture:
            return objective.evaluate(batch)["loss"].mean()

    def balancing_lambda(self, objective: Objective, data: MaskSplit, probes: list[int]) -> float:
        """The λ a run aimed at ``target_density`` starts from: at the starting logits, the λ at
        which the objective's gradient outweighs λ times the density's on exactly the target's share
        of positions, so the first steps move the mask towards the target instead of away from it
        (from a warm start at a pattern as sparse as the target, a λ too small would first undo the
        pattern). Averaged over the ``probes`` batches and their sampled masks, drawn from a noise
        stream of their own; at least :data:`LAMBDA_FLOOR`."""
        saved, self.generator_ = self.generator_, torch.Generator().manual_seed(seeded(self.seed, PROBE_STREAM))
        tau, _, noise = self.schedule()
        pull, push, weights = (torch.zeros_like(self.logits_) for _ in range(3))
        for index in probes:
            batch, context, counts = data.split.inputs[index], data.contexts[index], data.counts[index]
            task, density = self.sampled_loss(objective, batch, context, counts, tau, noise)
            pull -= torch.autograd.grad(task, self.logits_, retain_graph=True)[0]  # > 0 where keeping more lowers the objective
            push += torch.autograd.grad(density, self.logits_)[0]
            weights += (counts / counts.sum()).detach()
        self.generator_ = saved
        decided = weights > 0
        ratio = pull[decided] / push[decided].clamp_min(1e-30)
        return max(balancing_lambda(ratio, weights[decided], self.target_density), LAMBDA_FLOOR)

    def mask_gradient(
        self, objective: Objective, data: MaskSplit, kept: torch.Tensor, batches: list[int] | None = None
    ) -> torch.Tensor:
        """``∂L/∂M`` at the hard mask ``kept`` (layout shape), the mean loss of each of ``batches``
        (default all) of ``data`` averaged: the first-order change of the loss as each logit's
        positions come back (removed) or go (kept), applied as training applies a mask."""
        batches = range(len(data.split.inputs)) if batches is None else batches
        mask = kept.to(torch.float32).requires_grad_(True)
        score_mask = mask.detach() + (mask - mask.detach()) * (self.gradient_scale / _BIG)
        gradient = torch.zeros_like(mask)
        weights = contextlib.nullcontext() if self.settings.train_weights else frozen(self.model_.model)
        with weights, torch.enable_grad():
            for index in batches:
                batch, context = data.split.inputs[index], data.contexts[index]
                task = self.masked_loss(objective, batch, context, mask, score_mask, torch.where(kept, 1.0, -1.0))
                gradient += torch.autograd.grad(task, mask)[0]
        return gradient / len(batches)

    def step(
        self, objective: Objective, batch: PreparedBatch, context: torch.Tensor, counts: torch.Tensor | None = None
    ) -> dict[str, float]:
        """One step on one batch: sample, forward with the mask, loss + λ·density, backward, update.
        ``counts``: the valid positions each logit decides in the batch (default: unpadded blocks)."""
        counts = self.layout.counts(context) if counts is None else counts
        tau, rate, noise = self.schedule()
        for group, base in zip(self.optimizer_.param_groups, (self.settings.lr, self.settings.weights_lr)):
            group["lr"] = base * rate
        task, density = self.sampled_loss(objective, batch, context, counts, tau, noise)
        self.optimizer_.zero_grad(set_to_none=True)
        self.backward(task, density)
        loss = task.detach() + self.lam * density.detach()
        self.optimizer_.step()
        self.step_ += 1
        if self.holding_:
            self.project(self.aim(self.step_ - 1))
        with torch.no_grad():
            weights = counts / counts.sum()
            keep = torch.sigmoid(self.logits_.detach() / max(noise, 1e-6))
            hard_density = float((weights * (self.logits_ > 0)).sum())
            undecided = float((weights * ((keep > 0.1) & (keep < 0.9))).sum())
        if self.target_density is not None and not self.holding_:  # dual ascent: λ rises while the hard mask keeps more
            # than the target, in log space (λ's scale depends on the removal and the objective), on the logits' schedule
            self.lam = self.lam * math.exp(self.settings.dual_lr * rate * (hard_density - self.target_density))
        return {
            "loss": loss.item(),
            "objective": task.item(),
            "density": density.item(),
            "hard_density": hard_density,
            "undecided": undecided,
            "tau": tau,
            "lr": self.settings.lr * rate,
            **({"lambda_now": self.lam} if self.target_density is not None else {}),  # the λ dual ascent is at
        }

    # -- a held mask (dual "hold")

    def aim(self, step: int) -> float:
        """The density a held mask keeps after ``step``: its density at the start, brought down in a
        straight line to the target over the first :data:`HOLD_RAMP` of the step cap, then the target.

        >>> trainer = DamTrainer.__new__(DamTrainer)
        >>> trainer.start_density_, trainer.target_density, trainer.steps = 1.0, 0.1, 30
        >>> [round(trainer.aim(step), 2) for step in (0, 4, 9, 20)]
        [0.91, 0.55, 0.1, 0.1]
        """
        done = min((step + 1) / max(HOLD_RAMP * self.steps, 1), 1.0)
        return self.start_density_ + (self.target_density - self.start_density_) * done

    def backward(self, task: torch.Tensor, density: torch.Tensor) -> None:
        """The gradients of ``task + λ·density``; a held run first sets λ where the gradients balance
        (:meth:`balance`), from the objective's and the density's gradients apart."""
        if not self.holding_:
            (task + self.lam * density).backward()
            return
        push = torch.autograd.grad(density, self.logits_, retain_graph=True)[0]
        task.backward()
        self.lam = self.balance(-self.logits_.grad, push)
        self.logits_.grad += self.lam * push

    def balance(self, pull: torch.Tensor, push: torch.Tensor) -> float:
        """A held run's λ: where the objective's pull on each logit outweighs λ times the density's push
        on exactly the target's share of the training positions (:func:`balancing_lambda`), on the
        running averages of both that Adam's direction follows (its first moment's decay).

        Dual ascent on the hard mask's gap integrates it, and the logits move at most ``lr`` a step
        whatever λ is: from a dense start λ kept rising while they travelled to the threshold, wound
        up far past the balance and drove the mask past its target, where weights that train alongside
        adapt to the sparser mask and keep it (measured: 95% sparse against a 90% target). Held, the
        mask cannot leave its line, and λ only has to rank positions: the target's share, by the
        worth of a position against its cost, rises, and the rest falls.
        """
        beta, now = self.optimizer_.defaults["betas"][0], (pull, push)
        moments = now if self.moments_ is None else [beta * old + (1 - beta) * new for old, new in zip(self.moments_, now)]
        self.moments_ = pull, push = moments
        decided = (self.weights_ > 0) & (push > 0)
        ratio = pull[decided] / push[decided]
        return max(balancing_lambda(ratio, self.weights_[decided], self.target_density), LAMBDA_FLOOR)

    def project(self, density: float) -> None:
        """Shift every logit by one constant so that the hard mask keeps ``density`` of the training
        positions (each logit weighted by the positions it decides), as near as ties allow."""
        with torch.no_grad():
            logits, weights = self.logits_.flatten(), self.weights_.flatten()
            order = torch.argsort(logits, descending=True)
            kept = torch.cumsum(weights[order], 0) / weights.sum()  # the share kept when the cut passes each logit
            index = int(torch.searchsorted(kept, torch.tensor(density, dtype=kept.dtype)))
            if index < len(order) - 1 and logits[order[index]] > logits[order[index + 1]]:  # a cut between two
                self.logits_ -= (logits[order[index]] + logits[order[index + 1]]) / 2

    # -- the end of a run

    def calibrate(self, data: MaskSplit) -> float:
        """Shift every logit by one constant so that the hard mask α > 0, rows left empty rescued as
        when it is judged, keeps ``target_density`` of the valid positions of ``data``, as near
        as the logits' granularity allows: dual ascent leaves the density a few points off, and a
        comparison at matched sparsity needs it within one. The ranking of positions is unchanged.
        Returns the shift (subtracted)."""
        shift = self.cut(data.contexts, data.valids)
        with torch.no_grad():
            self.logits_ -= shift
        return shift

    def cut(self, contexts: list[torch.Tensor], valids: list[torch.Tensor | None]) -> float:
        """The constant :meth:`calibrate` subtracts: the cut between two logits whose hard mask keeps
        nearest ``target_density`` of the positions of ``contexts`` (and their ``valids``)."""
        logits = self.logits_.detach()
        values = torch.unique(logits)  # ascending; a cut between two keeps the logits above it
        cuts = torch.cat([values[:1] - 1, (values[1:] + values[:-1]) / 2, values[-1:] + 1])
        density = {}

        def kept(index: int) -> float:
            if index not in density:
                density[index] = 1.0 - hard_sparsity(self.layout, logits - cuts[index], contexts, valids)
            return density[index]

        low, high = 0, len(cuts) - 1  # the density falls as the cut rises
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if kept(middle) > self.target_density else (low, middle)
        best = min((low, high), key=lambda index: abs(kept(index) - self.target_density))
        return float(cuts[best])

    def flipped(self, before: torch.Tensor, now: torch.Tensor, counts: torch.Tensor) -> float:
        """The fraction of positions (each logit weighted by the ``counts`` of positions it decides)
        whose hard decision ``now`` differs from ``before``."""
        return float((counts * (before != now)).sum() / counts.sum())

    def fit(self, model: LoadedModel, objective: Objective, data: MaskSplit, order: np.ndarray, bar=None) -> pd.DataFrame:
        """The schedule on the batches of ``data`` taken in ``order``, until the stopping rule holds
        (``annealed_``) or the cap; with a target, the cut that meets it on ``data`` (``shift_``); then
        :meth:`check`. Returns the training curve, with the fraction of the hard mask that flipped
        over the last window (``flipped``) and, every ``check_window`` / 2 steps, the judged mask's
        loss on the check's training batches (``judged_loss``)."""
        self.start(model)
        weights = contextlib.nullcontext() if self.settings.train_weights else frozen(model.model)
        with weights, torch.enable_grad():
            if self.lam is None:  # a target's run from a warm start, or held: λ starts where the gradients balance
                self.lam = self.balancing_lambda(objective, data, [int(index) for index in order[:DUAL_PROBES]])
            self.lambda_start_ = self.lam
            self.weights_ = sum(data.counts)  # the positions each logit decides over the training batches
            self.start_density_ = float((self.weights_ * (self.logits_.detach() > 0)).sum() / self.weights_.sum())
            history = self._steps(objective, data, order, bar)
            self.steps_used_ = len(history)
            if bar is not None:
                bar.update(self.steps - self.steps_used_)  # the steps an annealed run did not need
            self.shift_ = self.calibrate(data) if self.target_density is not None else float("nan")  # no target, no shift
        self.check()
        return pd.DataFrame(history)

    def _steps(self, objective: Objective, data: MaskSplit, order: np.ndarray, bar) -> list[dict]:
        """The schedule's steps, until the stopping rule holds (``annealed_``) or the cap."""
        rule, history = self.stopping, []
        hard = [self.logits_.detach() > 0]  # the decisions of the last `window` + 1 steps
        self.annealed_, self.judged_ = False, {-1: (1.0, *self.judged_losses(objective, data))}  # -1: the start
        every = max(self.settings.check_window // 2, 1)
        for step in range(self.steps):
            index = int(order[step])
            counts = data.counts[index]
            row = {"step": step, **self.step(objective, data.split.inputs[index], data.contexts[index], counts)}
            if (step + 1) % every == 0:  # the judged mask after this step, for the convergence check
                self.judged_[step] = (self.rate(step), *self.judged_losses(objective, data))
                row["judged_loss"] = float(self.judged_[step][1].mean())
            hard.append(rule.decisions(self.logits_.detach(), hard[-1]))
            if len(hard) > rule.window + 1:
                hard.pop(0)
            if len(hard) == rule.window + 1:  # hard[0]: the decisions `window` steps ago
                row["flipped"] = self.flipped(hard[0], hard[-1], counts)
            history.append(row)
            if bar is not None:
                bar.update(1)
            aimed = not self.holding_ or step + 1 >= HOLD_RAMP * self.steps  # a held mask's aim has reached the target
            if aimed and "flipped" in row and row["flipped"] < rule.flips and rule.plateaued([e["loss"] for e in history]):
                self.annealed_ = True
                break
        last = len(history) - 1
        if last not in self.judged_:  # the mask as the schedule left it, scored too
            self.judged_[last] = (self.rate(last), *self.judged_losses(objective, data))
            history[-1]["judged_loss"] = float(self.judged_[last][1].mean())
        return history

    def check(self) -> None:
        """Whether the mask converged while the learning rate still moved it (``converged_``), not
        only where the annealed schedule froze it.

        The judged mask (calibrated to the target) is scored on a fixed few training batches every
        ``check_window`` / 2 steps (:meth:`judged_losses`). The check compares the last score taken
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
        training's mask to the target, or the run was too short to judge. ``check_``: the window's end
        step, the change of the score with its interval, and the share the shift removed there.
        """
        s = self.settings
        meaningful = [step for step, (rate, *_) in self.judged_.items() if rate >= s.check_lr]
        end = meaningful[-1] if meaningful else None
        # the score check_window steps earlier (or the earliest within it, when the stopping rule ended a run sooner)
        earlier = [step for step in self.judged_ if end is not None and end - s.check_window <= step < end]
        start = earlier[0] if earlier else None
        self.check_ = {
            "check_step": float("nan"),
            "check_delta": float("nan"),
            "check_low": float("nan"),
            "check_high": float("nan"),
            "check_shifted": float("nan"),
        }
        self.converged_ = False
        if start not in self.judged_:  # too few steps at a meaningful rate to judge
            return
        change = self.judged_[end][1] - self.judged_[start][1]
        mean, low, high = bootstrap_interval(change[None], s.bootstrap, self.seed)
        shifted = self.judged_[end][2]
        self.check_ = {
            "check_step": end, "check_delta": mean[0], "check_low": low[0], "check_high": high[0], "check_shifted": shifted,
        }  # fmt: skip
        settled = bool(low[0] <= 0 <= high[0] or abs(mean[0]) <= FLOAT_FLOOR)  # no change beyond its noise
        self.converged_ = settled and (self.target_density is None or abs(shifted) <= TARGET_WITHIN)

    def judged_losses(self, objective: Objective, data: MaskSplit) -> tuple[np.ndarray, float]:
        """The loss of each block of the check's training batches (the first :data:`CHECK_BATCHES`)
        under the mask as it would be judged now (α > 0, calibrated to the target on those batches),
        and the share of positions the calibration's shift removed there (negative: brought back)
        from training's own hard mask."""
        count = min(CHECK_BATCHES, len(data.split.inputs))
        contexts, valids, logits = data.contexts[:count], data.valids[:count], self.logits_.detach()
        shifted = float("nan")  # no target: nothing is shifted
        if self.target_density is not None:
            before = hard_sparsity(self.layout, logits, contexts, valids)
            logits = logits - self.cut(contexts, valids)
            shifted = hard_sparsity(self.layout, logits, contexts, valids) - before
        change = MaskChange(self.layout, logits, "")
        return evaluate_change(objective, data.split.inputs[:count], data.split.views[:count], change)["loss"], shifted

    def train_losses(self, objective: Objective, data: MaskSplit, logits: torch.Tensor | None = None) -> np.ndarray:
        """The loss of each training block (or example) under the hard mask of ``logits`` (default
        the run's) as it is judged."""
        change = MaskChange(self.layout, self.logits_.detach() if logits is None else logits, "")
        return evaluate_change(objective, data.split.inputs, data.split.views, change)["loss"]
