"""Heads that look far: what restricting one head alone to the sink and a recent window costs a decoder's
next-token loss (StreamingLLM's cache, kept per head: DuoAttention's streaming heads; the heads that cannot be
restricted are Wu et al.'s retrieval heads).

A head restricted to ``sink-window(w)`` keeps, of each row's valid keys, the block's first 4
(DAM's fixed pattern :func:`~attnlens.analysis.patterns.sink_window`) and the ``w`` before the query (and the query itself): the
rest (:func:`far_pairs`) are removed before softmax. Each head is restricted alone, in one
forward pass per batch that starts at its layer (the layers below are the unmodified model's, recorded once), and
its cost is the paired change of the blocks' mean next-token loss, with a bootstrap interval over blocks. A head
**looks far** where that interval lies wholly above ``margin`` nats, can be restricted where it lies wholly below,
and is otherwise not decided. An undecided head is measured again on twice the blocks, up to ``far_max_seqs``
(:func:`head_costs`): the question is sized until it is decided, or the blocks run out. Three looks at the
data (16, 32, 64 blocks) let a head's 95% interval miss more often than one would; each look's interval is
the bootstrap's own.

Measured, not estimated: a first-order estimate from one backward pass (``Σ ∂L/∂A · (A' − A)``, the plan's screen)
read gemma3-270m's costs 10 to 15 times too small (its four largest: 0.0002–0.0010 nats against 0.002–0.014
measured), and gave some heads a negative cost that measured positive; near a trained model's optimum the first
order term is small. So the cost is a forward per head: ``layers × heads`` passes over ``far_seqs`` blocks.

>>> from attnlens.analysis.sinks.far import far_pairs
>>> far_pairs(torch.ones(1, 8, 8, dtype=torch.bool), window=1)[0, 7].int().tolist()
[0, 0, 0, 0, 1, 1, 0, 0]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from attnlens.analysis.evaluation import Starts, bootstrap_interval, evaluate_batch, removal
from attnlens.analysis.objectives import Objective
from attnlens.analysis.patterns import sink_window


def far_pairs(valid: torch.Tensor, window: int) -> torch.Tensor:
    """The (block, query, key) valid pairs a head kept to the first 4 keys and the ``window`` before each query
    loses (the query itself is always kept)."""
    n = valid.shape[-1]
    return valid & ~sink_window(n, window, torch.zeros(1, n, dtype=torch.bool, device=valid.device))  # DAM's pattern


def head_costs(
    objective: Objective, ids: torch.Tensor, window: int, batch_size: int, bar, *, first: int, judge: Judge
) -> tuple[np.ndarray, np.ndarray]:
    """(layer, head, block) next-token losses with each head alone restricted, and (block,) the unmodified ones.

    Every head is measured on the first ``first`` blocks of ``ids``; a head ``judge`` leaves undecided on the blocks
    so far (:func:`looks`), on twice as many, and so on up to all of ``ids``: the blocks a head was not measured on
    hold NaN. ``bar`` counts a head's pass over one round's blocks."""
    model = objective.model
    starts, unmodified = Starts(model), np.full(len(ids), np.nan)
    losses = np.full((model.num_layers, model.num_heads, len(ids)), np.nan)
    heads = [(layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
    done, upto = 0, min(first, len(ids))
    while heads:
        batches = [
            (start, objective.prepare(ids[start : min(start + batch_size, upto)])) for start in range(done, upto, batch_size)
        ]
        unmodified[done:upto] = np.concatenate([evaluate_batch(objective, batch)["loss"] for _, batch in batches])
        for layer, head in heads:
            change = removal(_one_head(head, model.num_heads, window))
            per_batch = [evaluate_batch(objective, batch, change, [layer], (starts, at)) for at, batch in batches]
            losses[layer, head, done:upto] = np.concatenate([metrics["loss"] for metrics in per_batch])
            bar.update(1)
        costs = np.stack([losses[layer, head, :upto] for layer, head in heads]) - unmodified[:upto]
        heads = [unit for unit, verdict in zip(heads, judge(costs)[3]) if verdict == UNDECIDED]
        if upto == len(ids):
            break
        done, upto = upto, min(2 * upto, len(ids))
        bar.total += len(heads)
    return losses, unmodified


UNDECIDED = "not decided"
Judge = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def looks(change: np.ndarray, margin: float, bootstrap: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per head (a row of ``change``: its restriction's per-block cost, NaN past the blocks it was measured on): the mean
    cost, its bootstrap interval and whether the head looks ``far`` (the interval wholly above ``margin``), ``near``
    (wholly below) or is not decided. A head's interval is its own (its resamples do not depend on the other rows).

    >>> mean, low, high, verdict = looks(np.array([[0.5, 0.6, 0.55, 0.45], [0.0, 0.001, np.nan, np.nan]]), 0.01, 200, 0)
    >>> verdict.tolist()
    ['far', 'near']
    """
    measured = np.isfinite(change).sum(1)
    mean, low, high = (np.full(len(change), np.nan) for _ in range(3))
    for count in np.unique(measured):  # the blocks measured are a prefix of every row
        rows = measured == count
        mean[rows], low[rows], high[rows] = bootstrap_interval(change[rows, :count], bootstrap, seed)
    verdict = np.where(low > margin, "far", np.where(high < margin, "near", UNDECIDED))
    return mean, low, high, verdict


def _one_head(head: int, heads: int, window: int):
    """The removal of :func:`~attnlens.analysis.evaluation.removal` that restricts ``head`` alone."""

    def remove(layer: int, valid: torch.Tensor) -> torch.Tensor:
        removed = far_pairs(valid, window)
        mask = torch.zeros(removed.shape[0], heads, *removed.shape[1:], dtype=torch.bool, device=valid.device)
        mask[:, head] = removed
        return mask

    return remove
