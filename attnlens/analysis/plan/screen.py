"""Every head screened at once: what each (head, choice) costs the task's predictions, estimated from one
forward and a backward pass per class of the task, per batch, instead of a forward per pair.

The curves (:func:`~attnlens.analysis.plan.allocate.head_curves`) judge every head alone under every choice:
heads × choices forwards (minilm-l6 at the full preset: 72 heads × 13 choices; a 30-layer decoder with 9
heads a layer: 270 heads). What a curve measures on the task is the KL divergence of the changed
classifier's prediction from the unmodified one, KL(p₀ ‖ p), on some of the task's training examples
(:func:`~attnlens.analysis.plan.judging._predicted`). At the unmodified model the divergence is 0 and at
its minimum, so a small change costs it to second order: KL ≈ ½ Δzᵀ F Δz, with Δz the change of the
classifier's logits and F = diag(p₀) − p₀p₀ᵀ the Fisher of its softmax (Amari 1998; the same
approximation as natural-gradient methods and Fisher pruning, Theis et al. 2018).

**Gates.** In the screening forward every layer's attention weights w become w + Σ_c ξ[b, h, c]·(w_c − w),
with w_c the weights the layer gives under choice c (every head at once: a choice acts on each head alone)
and ξ = 0: the outputs do not change, and ∂(zᵀ logits)/∂ξ[b, h, c] is the first-order change of zᵀΔz in
example b when head h takes choice c. With z_y = √p₀,y (e_y − p₀) for each class y, Σ_y (zᵀ_y Δz)² =
Δzᵀ F Δz exactly, so a backward pass per class (two for a binary task) gives every (head, choice)'s
estimate in every example: cost[h, c] = ½ mean_b Σ_y (∂ z_yᵀ logits / ∂ξ[b, h, c])². The changes are
linearised in the attention weights of one head, so what the estimate misses is the curvature of
softmax and of the layers above along that one head's change, and the heads' interactions (which the
curves miss too: the plan's path treats costs as additive, and its steps are verified by forwards on
the model either way).

``bench/bench_plan_screen.py`` measures the screen against the curves: each pair's estimate against
its measured divergence, the plan each picks at the same budget (FLOPs and held-out accuracy, paired),
and the time against the number of heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.plan.allocate import Price, curve_table, saving_pairs
from attnlens.analysis.plan.choices import Choice
from attnlens.analysis.task import TaskJudge
from attnlens.models.attention import remaining_or_unmodified, softmax
from attnlens.models.capture import Capture, Intervention
from attnlens.progress import Progress, progress_bar

# A uniform choice's intervention on one batch (every head under that choice), from its batch's view.
Alternatives = Callable[[object], list[Intervention | None]]


class Gates:
    """The hooks of a screening forward: each layer's scores kept (:meth:`keep`), then its weights gated
    towards every choice's (:meth:`gate`); ``gates[layer]`` (examples, heads, choices) are the zeros whose
    gradients are the first-order changes. The forward is the unmodified model's; each choice's weights are
    computed in the backward pass, one choice at a time (:class:`_Gated`), so a screen holds what a training
    step holds, whatever the number of choices."""

    def __init__(self, alternatives: list[Intervention | None]) -> None:
        self.alternatives = alternatives
        self.scores: dict[int, torch.Tensor] = {}
        self.gates: dict[int, torch.Tensor] = {}

    def keep(self, layer: int, scores: torch.Tensor, valid: torch.Tensor) -> None:
        self.scores[layer] = scores.detach()
        return None  # the scores stay as they are: the forward is the unmodified model's

    def gate(self, layer: int, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        scores = self.scores.pop(layer)
        gate = torch.zeros((*weights.shape[:2], len(self.alternatives)), dtype=weights.dtype, device=weights.device,
                           requires_grad=True)  # fmt: skip
        self.gates[layer] = gate

        def differences(unmodified: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
            """Each choice's weights less the unmodified ones, for the choices that change this layer."""
            needs_mask = not bool(valid.all())
            for index, intervene in enumerate(self.alternatives):
                changed = None if intervene is None else intervene(layer, scores, valid)
                if changed is not None:  # None: the choice leaves this layer alone (a window wider than its keys)
                    other = softmax(remaining_or_unmodified(changed, scores, valid, needs_mask), unmodified.dtype)
                    yield index, other - unmodified

        return _Gated.apply(weights, gate, differences)


class _Gated(torch.autograd.Function):
    """``weights + Σ_c gate[:, :, c] · (w_c − weights)`` at ``gate`` = 0: the weights themselves going
    forward; going back, the weights' gradient passes through and each gate's is Σ_qk grad · (w_c −
    weights), w_c recomputed one choice at a time (the product with a gate of zeros has no other term).

    >>> weights, gate = torch.full((1, 1, 2, 2), 0.5), torch.zeros(1, 1, 1, requires_grad=True)
    >>> out = _Gated.apply(weights, gate, lambda unmodified: iter([(0, torch.eye(2) - unmodified)]))
    >>> torch.equal(out, weights)
    True
    >>> (out * torch.eye(2)).sum().backward(); gate.grad.flatten().tolist()     # the diagonal's share: 2 · (1 − 0.5)
    [1.0]
    """

    @staticmethod
    def forward(ctx: Any, weights: torch.Tensor, gate: torch.Tensor, differences: Callable) -> torch.Tensor:
        ctx.save_for_backward(weights)
        ctx.differences, ctx.choices = differences, gate.shape[2]
        return weights.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (weights,) = ctx.saved_tensors
        gate = grad.new_zeros((*grad.shape[:2], ctx.choices))
        for index, difference in ctx.differences(weights.detach()):
            gate[:, :, index] = (grad * difference).sum((-2, -1))
        return grad, gate, None


def screened_costs(judge: TaskJudge, batches: list, alternatives: Alternatives, choices: int, progress: Progress) -> np.ndarray:
    """(layers, heads, choices): each head's estimated divergence under each choice, the mean over the examples of
    ``batches`` (task batches), each batch one gated forward and a backward per class."""
    model = judge.model
    total = np.zeros((model.num_layers, model.num_heads, choices))
    examples = 0
    with progress_bar(total=len(batches), desc="head screen", unit="batch", enabled=progress) as bar:
        for batch in batches:
            gates = Gates(alternatives(batch.view(model)))
            with torch.enable_grad(), Capture(intervene=gates.keep, intervene_weights=gates.gate, record=False):
                logits = judge.logits(batch).float()
            total += _squares(logits, gates, model.num_layers, model.num_heads, choices)
            examples += logits.shape[0]
            bar.update(1)
    return 0.5 * total / max(examples, 1)


def _squares(logits: torch.Tensor, gates: Gates, layers: int, heads: int, choices: int) -> np.ndarray:
    """Σ over the batch's examples and over the classes y of (∂ z_yᵀ logits / ∂ξ)², per layer, head and choice."""
    probabilities = torch.softmax(logits.detach(), dim=1)
    gated = sorted(gates.gates)
    squares = np.zeros((layers, heads, choices))
    for y in range(logits.shape[1]):
        direction = probabilities[:, y : y + 1].sqrt() * (
            torch.nn.functional.one_hot(torch.tensor(y), logits.shape[1]).to(logits) - probabilities
        )
        gradients = torch.autograd.grad((direction * logits).sum(), [gates.gates[layer] for layer in gated],
                                        retain_graph=y < logits.shape[1] - 1, allow_unused=True)  # fmt: skip
        for layer, gradient in zip(gated, gradients):
            if gradient is not None:
                squares[layer] += gradient.double().square().sum(0).cpu().numpy()
    return squares


def screen_curves(
    units: list[tuple[int, int]],
    choices: list[Choice],
    judge: TaskJudge,
    batches: list,
    alternatives: Alternatives,
    price_of: Price,
    progress: Progress = True,
) -> pd.DataFrame:
    """The curves' table (:func:`~attnlens.analysis.plan.allocate.head_curves`'s columns) with each pair's cost
    the screen's estimate (see the module): one row per (head, choice) that saves anything."""
    costs = screened_costs(judge, batches, alternatives, len(choices), progress)
    pairs = saving_pairs(units, choices, price_of)
    return curve_table(pairs, [float(costs[layer, head, choices.index(choice)]) for layer, head, choice in pairs], price_of)
