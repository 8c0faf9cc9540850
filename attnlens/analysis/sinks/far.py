"""Heads that look far: what restricting one head alone to the sink and a recent window costs a decoder's
next-token loss (StreamingLLM's cache, kept per head: DuoAttention's streaming heads; the heads that cannot be
restricted are Wu et al.'s retrieval heads).

A head restricted to ``sink-window(w)`` keeps, of each row's valid keys, the block's first 4
(DAM's fixed pattern :func:`~attnlens.analysis.patterns.sink_window`) and the ``w`` before the query (and the query itself): the
rest (:func:`far_pairs`) are removed before softmax. Each head is restricted alone, in one
forward pass per batch that starts at its layer (the layers below are the unmodified model's, recorded once), and
its cost is the paired change of the blocks' mean next-token loss, with a bootstrap interval over blocks. A head
**looks far** where that interval lies wholly above ``margin`` nats, can be restricted where it lies wholly below,
and is otherwise not decided.

Measured, not estimated: a first-order estimate from one backward pass (``Σ ∂L/∂A · (A' − A)``, the plan's screen)
read gemma3-270m's costs 10 to 15 times too small (its four largest: 0.0002–0.0010 nats against 0.002–0.014
measured), and gave some heads a negative cost that measured positive; near a trained model's optimum the first
order term is small. So the cost is a forward per head: ``layers × heads`` passes over ``far_seqs`` blocks.

>>> from attnlens.analysis.sinks.far import far_pairs
>>> far_pairs(torch.ones(1, 8, 8, dtype=torch.bool), window=1)[0, 7].int().tolist()
[0, 0, 0, 0, 1, 1, 0, 0]
"""

from __future__ import annotations

import numpy as np
import torch

from attnlens.analysis.evaluation import Starts, evaluate_batch, removal
from attnlens.analysis.objectives import Objective
from attnlens.analysis.patterns import sink_window


def far_pairs(valid: torch.Tensor, window: int) -> torch.Tensor:
    """The (block, query, key) valid pairs a head kept to the first 4 keys and the ``window`` before each query
    loses (the query itself is always kept)."""
    n = valid.shape[-1]
    return valid & ~sink_window(n, window, torch.zeros(1, n, dtype=torch.bool, device=valid.device))  # DAM's pattern


def head_costs(objective: Objective, ids: torch.Tensor, window: int, batch_size: int, bar) -> tuple[np.ndarray, np.ndarray]:
    """(layer, head, block) next-token losses with each head alone restricted, and (block,) the unmodified ones."""
    model = objective.model
    batches = [objective.prepare(ids[start : start + batch_size]) for start in range(0, len(ids), batch_size)]
    starts = Starts(model)
    unmodified = np.concatenate([evaluate_batch(objective, batch)["loss"] for batch in batches])
    losses = np.zeros((model.num_layers, model.num_heads, len(ids)))
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            change = removal(_one_head(head, model.num_heads, window))
            per_batch = [evaluate_batch(objective, batch, change, [layer], (starts, at)) for at, batch in enumerate(batches)]
            losses[layer, head] = np.concatenate([metrics["loss"] for metrics in per_batch])
            bar.update(1)
    return losses, unmodified


def _one_head(head: int, heads: int, window: int):
    """The removal of :func:`~attnlens.analysis.evaluation.removal` that restricts ``head`` alone."""

    def remove(layer: int, valid: torch.Tensor) -> torch.Tensor:
        removed = far_pairs(valid, window)
        mask = torch.zeros(removed.shape[0], heads, *removed.shape[1:], dtype=torch.bool, device=valid.device)
        mask[:, head] = removed
        return mask

    return remove
