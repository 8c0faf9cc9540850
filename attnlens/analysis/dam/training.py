"""Training one mask: the trainer, its schedules, and dual ascent on λ (or a mask held on its way to the target).

:class:`DamTrainer` is built from a layout and the run's :class:`DamSettings` alone (it has
no defaults of its own, so what a benchmark measures is what :func:`dam` runs). Each step
draws a Gumbel-sigmoid sample ``M_soft = σ((α + s·(g₁ - g₂))/τ)``, uses the hard mask
``M = [α + s·(g₁ - g₂) > 0]`` in the forward pass with the straight-through gradient of
``M_soft`` (:mod:`~attnlens.analysis.dam.masked_forward`), and minimises ``objective + λ·mean(M)``
(the mean over valid positions, so ``mean(M)`` is the density). With a target sparsity, λ moves
by dual ascent, or the hard mask is held at a density brought down to the target
(:meth:`DamTrainer.aim`), and the logits are shifted so the hard mask meets the target
(:meth:`DamTrainer.calibrate`); :class:`~attnlens.analysis.dam.stopping.StoppingRule` ends the
schedule once the hard mask stops changing, and :meth:`DamTrainer.check` then asks whether the
mask is an optimum, at a learning rate that still moves it, or only where the annealed schedule
froze it (:mod:`~attnlens.analysis.dam.stopping`).

>>> cosine(0, 11, 0.1), round(cosine(5, 11, 0.1), 3), cosine(10, 11, 0.1)
(1.0, 0.55, 0.1)
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import MaskChange, seeded
from attnlens.analysis.dam.layouts import MaskLayout, hard_sparsity, total
from attnlens.analysis.dam.masked_forward import MaskedForward
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.dam.stopping import CHECK_BATCHES, Judged, StoppingRule, convergence
from attnlens.analysis.evaluation import evaluate_change, frozen
from attnlens.analysis.objectives import Evaluates
from attnlens.models.loading import LoadedModel

if TYPE_CHECKING:  # annotations only
    from attnlens.analysis.dam.judging import MaskSplit
    from attnlens.analysis.objectives import PreparedBatch
    from attnlens.analysis.task import TaskBatch

NOISE_STREAM, ORDER_STREAM, PROBE_STREAM = 11, 12, 14  # seeded streams of a run's draws (13: the patterns')
DUAL_PROBES = 4  # batches whose gradients set the λ a warm start's run starts from (DamTrainer.balancing_lambda)
LAMBDA_FLOOR = 1e-3  # the least λ a run starts from (dual ascent moves λ in log space)
HOLD_RAMP = 1 / 3  # a held mask's density comes down to the target over this share of the step cap (DamTrainer.aim)


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


class DamTrainer(MaskedForward):
    """Learns the mask logits of one layout for one λ (or one target density).

    ``__init__`` stores what it is given only; :meth:`start` creates ``logits_`` (and the
    optimiser and noise generator), :meth:`step` takes one training step, :meth:`fit` runs
    the schedule until the stopping rule holds or the cap, then :meth:`check` tests the mask
    for an optimum. ``lam`` is the starting λ (``None`` with a target: where the gradients
    balance), ``init_logits`` a warm start, ``seed`` the run's draws (noise and batch order;
    default the settings' seed). Sampling a mask and running the model with it are
    :class:`~attnlens.analysis.dam.masked_forward.MaskedForward`'s.

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
        self.steps = settings.training.steps
        self.tau = settings.training.temperature
        self.stopping = StoppingRule.of(settings.stopping)

    def start(self, model: LoadedModel) -> DamTrainer:
        s = self.settings
        self.model_ = model
        if self.init_logits is not None:  # a warm start (e.g. at a fixed pattern: pattern_logits)
            self.logits_ = self.init_logits.detach().clone().to(model.device).requires_grad_(True)
        else:
            init = math.log(s.mask.init_keep / (1 - s.mask.init_keep))
            self.logits_ = torch.full(self.layout.shape, init, device=model.device, requires_grad=True)
        groups = [{"params": [self.logits_], "lr": s.training.lr}]
        if s.training.train_weights:
            groups.append({"params": [p for p in model.model.parameters() if p.requires_grad], "lr": s.training.weights_lr})
        self.optimizer_ = torch.optim.Adam(groups)
        self.generator_ = torch.Generator().manual_seed(seeded(self.seed, NOISE_STREAM))
        self.step_ = 0
        self.holding_ = self.target_density is not None and s.holds
        self.moments_: tuple[torch.Tensor, torch.Tensor] | None = None  # a held run's averaged pull and push (balance)
        return self

    def _lambda(self) -> float:
        """λ now: given, or set where the gradients balance before a target's first step (:meth:`fit`)."""
        assert self.lam is not None, "fit sets λ before the first step of a run aimed at a target"
        return self.lam

    def _target(self) -> float:
        """The target density, which only a run aimed at a target reads (dual ascent, a held mask, the cut)."""
        assert self.target_density is not None, "read only by runs aimed at a target sparsity"
        return self.target_density

    # -- schedules

    def temperature(self, step: int) -> float:
        start, end = self.tau
        return start * (end / start) ** (step / max(self.steps - 1, 1))

    def rate(self, step: int) -> float:
        """The learning rates' factor at ``step``: a cosine from 1 down to ``lr_end`` at the step cap.
        It scales the logits' and the weights' rates."""
        return cosine(step, self.steps, self.settings.training.lr_end)

    def noise(self, step: int) -> float:
        """The scale of the logistic noise at ``step``: a cosine from 1 down to ``noise_end``, so that
        late samples approach the hard mask that is judged."""
        return cosine(step, self.steps, self.settings.training.noise_end)

    def schedule(self) -> tuple[float, float, float]:
        """(temperature, learning-rate factor, noise scale) of the next step."""
        return self.temperature(self.step_), self.rate(self.step_), self.noise(self.step_)

    # -- one step

    def balancing_lambda(self, objective: Evaluates, data: MaskSplit, probes: list[int]) -> float:
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
        return max(balancing_lambda(ratio, weights[decided], self._target()), LAMBDA_FLOOR)

    def step(
        self,
        objective: Evaluates,
        batch: PreparedBatch | TaskBatch,
        context: torch.Tensor,
        counts: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One step on one batch: sample, forward with the mask, loss + λ·density, backward, update.
        ``counts``: the valid positions each logit decides in the batch (default: unpadded blocks)."""
        counts = self.layout.counts(context) if counts is None else counts
        tau, rate, noise = self.schedule()
        for group, base in zip(self.optimizer_.param_groups, (self.settings.training.lr, self.settings.training.weights_lr)):
            group["lr"] = base * rate
        task, density = self.sampled_loss(objective, batch, context, counts, tau, noise)
        self.optimizer_.zero_grad(set_to_none=True)
        self.backward(task, density)
        loss = task.detach() + self._lambda() * density.detach()
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
            self.lam = self._lambda() * math.exp(self.settings.target.dual_lr * rate * (hard_density - self.target_density))
        return {
            "loss": loss.item(),
            "objective": task.item(),
            "density": density.item(),
            "hard_density": hard_density,
            "undecided": undecided,
            "tau": tau,
            "lr": self.settings.training.lr * rate,
            **({"lambda_now": self._lambda()} if self.target_density is not None else {}),  # the λ dual ascent is at
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
        return self.start_density_ + (self._target() - self.start_density_) * done

    def backward(self, task: torch.Tensor, density: torch.Tensor) -> None:
        """The gradients of ``task + λ·density``; a held run first sets λ where the gradients balance
        (:meth:`balance`), from the objective's and the density's gradients apart."""
        if not self.holding_:
            (task + self._lambda() * density).backward()
            return
        push = torch.autograd.grad(density, self.logits_, retain_graph=True)[0]
        task.backward()
        gradient = self.logits_.grad
        assert gradient is not None, "the task's backward pass reaches the logits"
        self.lam = self.balance(-gradient, push)
        gradient += self.lam * push  # in place: the logits' gradient

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
        beta, before = self.optimizer_.defaults["betas"][0], self.moments_
        if before is not None:
            pull, push = beta * before[0] + (1 - beta) * pull, beta * before[1] + (1 - beta) * push
        self.moments_ = pull, push
        decided = (self.weights_ > 0) & (push > 0)
        ratio = pull[decided] / push[decided]
        return max(balancing_lambda(ratio, self.weights_[decided], self._target()), LAMBDA_FLOOR)

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
        target = self._target()
        density: dict[int, float] = {}

        def kept(index: int) -> float:
            if index not in density:
                density[index] = 1.0 - hard_sparsity(self.layout, logits - cuts[index], contexts, valids)
            return density[index]

        low, high = 0, len(cuts) - 1  # the density falls as the cut rises
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if kept(middle) > target else (low, middle)
        best = min((low, high), key=lambda index: abs(kept(index) - target))
        return float(cuts[best])

    def flipped(self, before: torch.Tensor, now: torch.Tensor, counts: torch.Tensor) -> float:
        """The fraction of positions (each logit weighted by the ``counts`` of positions it decides)
        whose hard decision ``now`` differs from ``before``."""
        return float((counts * (before != now)).sum() / counts.sum())

    def fit(self, model: LoadedModel, objective: Evaluates, data: MaskSplit, order: np.ndarray, bar=None) -> pd.DataFrame:
        """The schedule on the batches of ``data`` taken in ``order``, until the stopping rule holds
        (``annealed_``) or the cap; with a target, the cut that meets it on ``data`` (``shift_``); then
        :meth:`check`. Returns the training curve, with the fraction of the hard mask that flipped
        over the last window (``flipped``) and, every ``check_window`` / 2 steps, the judged mask's
        loss on the check's training batches (``judged_loss``)."""
        self.start(model)
        weights = contextlib.nullcontext() if self.settings.training.train_weights else frozen(model.model)
        with weights, torch.enable_grad():
            if self.lam is None:  # a target's run from a warm start, or held: λ starts where the gradients balance
                self.lam = self.balancing_lambda(objective, data, [int(index) for index in order[:DUAL_PROBES]])
            self.lambda_start_ = self.lam
            self.weights_ = total(data.counts)  # the positions each logit decides over the training batches
            self.start_density_ = float((self.weights_ * (self.logits_.detach() > 0)).sum() / self.weights_.sum())
            history = self._steps(objective, data, order, bar)
            self.steps_used_ = len(history)
            if bar is not None:
                bar.update(self.steps - self.steps_used_)  # the steps an annealed run did not need
            self.shift_ = self.calibrate(data) if self.target_density is not None else float("nan")  # no target, no shift
        self.check()
        return pd.DataFrame(history)

    def _steps(self, objective: Evaluates, data: MaskSplit, order: np.ndarray, bar) -> list[dict]:
        """The schedule's steps, until the stopping rule holds (``annealed_``) or the cap."""
        rule, history = self.stopping, []
        hard = [self.logits_.detach() > 0]  # the decisions of the last `window` + 1 steps
        self.annealed_ = False
        self.judged_: Judged = {-1: (1.0, *self.judged_losses(objective, data))}  # -1: the start
        every = max(self.settings.stopping.check_window // 2, 1)
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
        only where the annealed schedule froze it (:func:`~attnlens.analysis.dam.stopping.convergence`,
        from the judged mask's scores during the run); ``check_``: the window's end step, the change of
        the score with its interval, and the share the shift removed there."""
        self.check_, self.converged_ = convergence(self.judged_, self.settings, self.seed, self.target_density)

    def judged_losses(self, objective: Evaluates, data: MaskSplit) -> tuple[np.ndarray, float]:
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

    def train_losses(self, objective: Evaluates, data: MaskSplit, logits: torch.Tensor | None = None) -> np.ndarray:
        """The loss of each training block (or example) under the hard mask of ``logits`` (default
        the run's) as it is judged."""
        change = MaskChange(self.layout, self.logits_.detach() if logits is None else logits, "")
        return evaluate_change(objective, data.split.inputs, data.split.views, change)["loss"]
