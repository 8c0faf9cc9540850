"""How a mask enters the forward pass while it trains: a sampled hard mask with a straight-through
gradient, applied inside attention, and the loss (and ``∂L/∂M``) under it.

:class:`MaskedForward` is the part of :class:`~attnlens.analysis.dam.training.DamTrainer` that
samples (:meth:`~MaskedForward.sample`: the hard mask ``M = [α + s·(g₁ - g₂) > 0]`` with the
gradient of ``M_soft = σ((α + s·(g₁ - g₂))/τ)``) and applies a mask the way the run's ``removal``
says: renormalising the kept weights (:meth:`~MaskedForward.gate`) or adding to the scores
(:meth:`~MaskedForward.intervention`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from attnlens.analysis.changes import rescue_rows
from attnlens.analysis.dam.layouts import MaskLayout
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.evaluation import frozen
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel

if TYPE_CHECKING:  # annotations only
    from attnlens.analysis.dam.judging import MaskSplit
    from attnlens.analysis.objectives import Evaluates, PreparedBatch
    from attnlens.analysis.task import TaskBatch

BIG = 1e4  # the straight-through gradient scale of both additive removals: ∂scores/∂M

Intervention = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
"""A change to one layer's scores (or weights): ``(layer, scores, valid) -> scores``."""


class MaskedForward:
    """Sampling a mask and running the model with it inside attention; mixed into
    :class:`~attnlens.analysis.dam.training.DamTrainer`, which sets what these methods read."""

    layout: MaskLayout
    settings: DamSettings
    gradient_scale: float  # see DamTrainer
    logits_: torch.Tensor
    generator_: torch.Generator
    model_: LoadedModel

    def sample(self, tau: float, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A hard 0/1 mask with straight-through gradients of its Gumbel-sigmoid relaxation.

        Returns the mask for the penalty (gradient of ``M_soft``), the mask for the scores,
        whose gradient is scaled by ``gradient_scale / 10⁴`` so that the scores see
        ``∂s'/∂M = gradient_scale`` (see :class:`~attnlens.analysis.dam.training.DamTrainer`), both equal to the hard mask,
        and the noisy logits ``α + g₁ - g₂`` the hard mask thresholds.
        """
        uniform = torch.rand(self.layout.shape, generator=self.generator_).clamp_(1e-6, 1 - 1e-6).to(self.logits_.device)
        noisy = self.logits_ + noise * (torch.log(uniform) - torch.log1p(-uniform))  # α + g₁ - g₂ (logistic noise)
        soft = torch.sigmoid(noisy / tau)
        hard = (noisy.detach() > 0).to(soft.dtype)
        relaxation = soft - soft.detach()  # zero, with the gradient of soft
        return hard + relaxation, hard + relaxation * (self.gradient_scale / BIG), noisy.detach()

    def intervention(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor) -> Intervention:
        """The score intervention that applies ``mask`` (logits' shape) in every layer.

        ``removal="1e4"`` adds ``(M - 1)·10⁴`` (a row with every key removed is then
        shifted as a whole, i.e. unmasked, as in SparseBERT); ``"inf"`` sets removed scores
        to ``-inf`` and lets a row with nothing left keep its keys of largest noisy logit.
        """
        layout, infinite = self.layout, self.settings.mask.removal == "inf"
        cache: dict[int, torch.Tensor] = {}  # a layout shared by layers is expanded once per step

        def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            key, width = 0 if layout.shared_by_layers else layer, scores.shape[-1]  # a task batch: its (w, w) corner
            if key not in cache:
                expanded = layout.expand(mask, layer, context)[..., :width, :width]
                cache[key] = expanded if infinite else (expanded - 1) * BIG
            if not infinite:
                return scores + cache[key]
            expanded = cache[key]
            keep = rescue_rows(layout.expand(noisy, layer, context)[..., :width, :width], valid[:, None])
            return scores.masked_fill(~keep, float("-inf")) + (expanded - expanded.detach()) * BIG

        return intervene

    def gate(self, mask: torch.Tensor, context: torch.Tensor, noisy: torch.Tensor) -> Intervention:
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
        self,
        objective: Evaluates,
        batch: PreparedBatch | TaskBatch,
        context: torch.Tensor,
        counts: torch.Tensor,
        tau: float,
        noise: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective on ``batch`` under one sampled hard mask, and the mask's density over the
        batch's valid positions, which each logit decides ``counts`` of (its straight-through
        relaxation carries the gradients to the logits)."""
        mask, score_mask, noisy = self.sample(tau, noise)
        density = (mask * counts).sum() / counts.sum()
        return self.masked_loss(objective, batch, context, mask, score_mask, noisy), density

    def masked_loss(
        self,
        objective: Evaluates,
        batch: PreparedBatch | TaskBatch,
        context: torch.Tensor,
        mask: torch.Tensor,
        score_mask: torch.Tensor,
        noisy: torch.Tensor,
    ) -> torch.Tensor:
        """The objective on ``batch`` with ``mask`` (or ``score_mask``, by the removal) inside attention."""
        if self.settings.mask.removal == "renormalise":
            capture = Capture(record=False, intervene_weights=self.gate(mask, context, noisy))
        else:
            capture = Capture(record=False, intervene=self.intervention(score_mask, context, noisy))
        with capture:
            return objective.evaluate(batch)["loss"].mean()

    def mask_gradient(
        self, objective: Evaluates, data: MaskSplit, kept: torch.Tensor, batches: list[int] | None = None
    ) -> torch.Tensor:
        """``∂L/∂M`` at the hard mask ``kept`` (layout shape), the mean loss of each of ``batches``
        (default all) of ``data`` averaged: the first-order change of the loss as each logit's
        positions come back (removed) or go (kept), applied as training applies a mask."""
        chosen = range(len(data.split.inputs)) if batches is None else batches
        mask = kept.to(torch.float32).requires_grad_(True)
        score_mask = mask.detach() + (mask - mask.detach()) * (self.gradient_scale / BIG)
        gradient = torch.zeros_like(mask)
        weights = contextlib.nullcontext() if self.settings.training.train_weights else frozen(self.model_.model)
        with weights, torch.enable_grad():
            for index in chosen:
                batch, context = data.split.inputs[index], data.contexts[index]
                task = self.masked_loss(objective, batch, context, mask, score_mask, torch.where(kept, 1.0, -1.0))
                gradient += torch.autograd.grad(task, mask)[0]
        return gradient / len(chosen)
