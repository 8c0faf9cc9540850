"""A reference the optimiser must meet: a discrete swap search for a mask of few logits.

DAM relaxes a discrete choice (keep or drop each logit's positions) into a noisy, annealed
optimisation; whether it found a good mask is a question a discrete search can answer
where there are few enough logits (``structured``: one per head and offset). The search
starts from a hard mask at the target sparsity (DAM's own, or the band nearest it), and
each round:

1. takes the gradient of the training loss with respect to the hard mask, ``∂L/∂M``: the
   first-order change of the loss when a logit's positions are dropped (``-∂L/∂M``) or
   brought back (``+∂L/∂M``);
2. proposes the swaps (drop one kept logit, bring back one removed logit) that estimate best
   and keep the sparsity within :data:`SPARSITY_TOLERANCE` of the target;
3. judges the :data:`SWAP_CANDIDATES` best by a forward pass over every training block, and
   keeps the best if it lowers the training loss; if none does, it judges the next
   :data:`SWAP_CANDIDATES`, up to :data:`SWAP_CHUNKS` times.

It stops when none of those ``SWAP_CANDIDATES * SWAP_CHUNKS`` swaps lowers the loss (a local
optimum under the single swaps the gradient ranks best: ``local_optimum``) or after its rounds.
It only ever keeps a mask that does better on the training blocks, so it never ends worse than it
started there.

>>> REFERENCE_LIMIT
4096
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnlens.analysis.changes import PATTERN_STREAM, seeded
from attnlens.analysis.dam.layouts import MaskLayout, hard_sparsity, pattern_logits, total
from attnlens.analysis.patterns import build
from attnlens.errors import BadInput

if TYPE_CHECKING:
    from attnlens.analysis.dam.judging import MaskSplit
    from attnlens.analysis.dam.training import DamTrainer
    from attnlens.analysis.objectives import Evaluates

REFERENCE_LIMIT = 4096  # logits: each round costs a forward over the training blocks per candidate swap
SWAP_CANDIDATES = 8  # swaps judged exactly at a time, the best by their first-order estimate
SWAP_CHUNKS = 4  # ... and the next best, this many times over, before a round declares a local optimum
SPARSITY_TOLERANCE = 0.003  # a swap may move the sparsity this far from the target (logits decide unequal shares)


def searchable(layout: MaskLayout) -> bool:
    """Whether a layout has few enough logits for a swap search."""
    return int(np.prod(layout.shape)) <= REFERENCE_LIMIT


def check_size(layout: MaskLayout) -> None:
    """A clear error where a layout has too many logits for a swap search."""
    size = int(np.prod(layout.shape))
    if not searchable(layout):
        raise BadInput(
            f"`reference` needs a layout of at most {REFERENCE_LIMIT:,} logits; {layout.name} has {size:,} here "
            "(use --variant structured, structured+global or class, or a shorter --seq-len)"
        )


@dataclass
class SearchOutcome:
    """Where a swap search ended: the mask as logits (+1 kept, -1 dropped), its training loss per
    block and at the start, the rounds taken, the swaps kept (round, dropped, added: flat logit
    indices) and whether it stopped at a local optimum (no judged swap helped) rather than its
    round cap."""

    logits: torch.Tensor
    losses: np.ndarray
    start_loss: float
    rounds: int
    swaps: list[tuple[int, int, int]] = field(default_factory=list)
    local_optimum: bool = False


def swap_search(
    trainer: DamTrainer,
    objective: Evaluates,
    data: MaskSplit,
    kept: torch.Tensor,
    rank: torch.Tensor,
    target_density: float,
    rounds: int,
    bar=None,
) -> SearchOutcome:
    """Swap single logits of the hard mask ``kept`` (layout shape) while the training loss on ``data``
    falls; see the module docstring. ``rank`` orders the logits within the kept and within the
    dropped (a row left empty keeps its keys of largest logit, as a judged mask's would).
    ``trainer`` (started on the model) applies masks as training does (its removal); ``bar``
    advances a step per round, and by the rounds not needed at the end."""
    share = total(data.counts) / total(counts.sum() for counts in data.counts)  # each logit's share of the positions
    current, order = kept.clone(), torch.sigmoid(rank)

    def as_logits(mask: torch.Tensor) -> torch.Tensor:  # kept in (1, 2), dropped in (-2, -1), each in rank's order
        return torch.where(mask, 1.0 + order, -2.0 + order)

    losses = trainer.train_losses(objective, data, as_logits(current))
    outcome = SearchOutcome(as_logits(current), losses, float(losses.mean()), 0)
    for number in range(1, rounds + 1):
        outcome.rounds = number
        gradient = trainer.mask_gradient(objective, data, current)
        proposals = _proposals(current, gradient, share, target_density)
        best = _best_swap(trainer, data, current, proposals, as_logits, float(losses.mean()), target_density, objective)
        if bar is not None:
            bar.update(1)
        if best is None or best[1].mean() >= losses.mean():  # no swap helps: a local optimum under single swaps
            outcome.local_optimum = True
            break
        current, losses = best[0], best[1]
        outcome.swaps.append((number, best[2], best[3]))
    if bar is not None:
        bar.update(rounds - outcome.rounds)
    outcome.logits, outcome.losses = as_logits(current), losses
    return outcome


def _best_swap(trainer: DamTrainer, data: MaskSplit, current, proposals, as_logits, reached, target, objective: Evaluates):
    """The best of ``proposals`` by training loss (mask, per-block losses, dropped, added), judged
    :data:`SWAP_CANDIDATES` at a time: the first group with a swap below ``reached`` (the current
    mask's loss) ends the round (None without proposals). A swap whose mask, rows left empty rescued,
    keeps a density further from ``target`` than the tolerance (or than the current mask) is passed
    over: the proposals count each logit's positions, not the rows a removal empties."""

    def missed(mask: torch.Tensor) -> float:
        return abs(1.0 - hard_sparsity(trainer.layout, as_logits(mask), data.contexts, data.valids) - target)

    allowed, best = max(SPARSITY_TOLERANCE, missed(current)), None
    for first in range(0, len(proposals), SWAP_CANDIDATES):
        for drop, add in proposals[first : first + SWAP_CANDIDATES]:
            trial = current.clone().flatten()
            trial[drop], trial[add] = False, True
            trial = trial.view_as(current)
            if missed(trial) > allowed:
                continue
            trial_losses = trainer.train_losses(objective, data, as_logits(trial))
            if best is None or trial_losses.mean() < best[1].mean():
                best = (trial, trial_losses, drop, add)
        if best is not None and best[1].mean() < reached:
            break
    return best


def _proposals(kept: torch.Tensor, gradient: torch.Tensor, share: torch.Tensor, target: float) -> list[tuple[int, int]]:
    """The ``SWAP_CANDIDATES * SWAP_CHUNKS`` swaps (drop, add) of best first-order estimate, ``∂L/∂M``
    of the added logit less that of the dropped, among those that keep the density within tolerance."""
    count = SWAP_CANDIDATES * SWAP_CHUNKS
    flat, gradient, share = kept.flatten(), gradient.flatten(), share.flatten()
    density = float(share[flat].sum())
    kept_index, removed_index = flat.nonzero().flatten(), (~flat & (share > 0)).nonzero().flatten()
    if not len(kept_index) or not len(removed_index):
        return []
    drops = kept_index[torch.argsort(-gradient[kept_index])[:count]]  # dropping raises L least (or lowers it)
    adds = removed_index[torch.argsort(gradient[removed_index])[:count]]  # bringing back lowers L most
    pairs = []
    for drop in drops.tolist():
        for add in adds.tolist():
            moved = density + float(share[add] - share[drop])
            if abs(moved - target) <= SPARSITY_TOLERANCE or abs(moved - target) <= abs(density - target):
                pairs.append((float(gradient[add] - gradient[drop]), drop, add))
    return [(drop, add) for _, drop, add in sorted(pairs)[:count]]


def top_share(values: torch.Tensor, weights: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep ``values`` from the largest down until their ``weights`` make up ``share`` of the total
    (the count whose share is nearest it): the kept positions and the cut, midway between the last
    value kept and the first left out.

    >>> kept, cut = top_share(torch.tensor([4.0, 1.0, 3.0, 2.0]), torch.tensor([1.0, 1.0, 2.0, 1.0]), 0.6)
    >>> kept.tolist(), float(cut)
    ([True, False, True, False], 2.5)
    """
    flat, weight = values.flatten(), weights.flatten().to(values.dtype)
    order = torch.argsort(flat, descending=True, stable=True)
    shares = torch.cat([flat.new_zeros(1), torch.cumsum(weight[order], 0) / weight.sum()])
    count = int(torch.argmin((shares - share).abs()))  # the first of equal distances: fewest positions of no weight
    kept = torch.zeros_like(flat, dtype=torch.bool)
    kept[order[:count]] = True
    ranked = flat[order]
    above = ranked[count - 1] if count > 0 else ranked[0] + 1
    below = ranked[count] if count < len(ranked) else ranked[-1] - 1
    return kept.view_as(values), (above + below) / 2


def start_mask(
    start: str, layout: MaskLayout, data: MaskSplit, logits: torch.Tensor, target_density: float, seq_len: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hard mask a search starts from, at the target, and the values that rank its logits: DAM's
    (``logits > 0``, as calibrated), or the narrowest band that keeps at least the target's share of
    the training positions, its widest offsets dropped down to the target (the pattern's logits,
    ties broken towards the layout's first, narrowest, logits)."""
    if start == "dam":
        return logits > 0, logits
    generator = torch.Generator().manual_seed(seeded(seed, PATTERN_STREAM))
    weights = total(data.counts)
    for width in range(1, seq_len):
        keeps = [
            (context, build("band", seq_len, width, view.roles().cls.to(context.device), generator))
            for context, view in zip(data.contexts, data.split.views)
        ]
        band = pattern_logits(layout, keeps)
        if 1.0 - hard_sparsity(layout, band, data.contexts, data.valids) >= target_density:
            break
    last = band.shape[-1]  # ties: the narrower offset (or earlier class) first, in every head alike
    rank = band - 1e-3 * torch.arange(last, device=band.device) / last
    kept, _ = top_share(rank, weights, target_density)
    return kept, rank
