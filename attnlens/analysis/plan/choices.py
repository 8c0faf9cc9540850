"""What a head may be given, and what each choice costs in attention FLOPs.

A head is computed **exact** (every score), **partial** with k exact scores per query and
the rest rebuilt by a least-squares map (:mod:`attnlens.analysis.reconstruct`), or under a
**window** mask that keeps the keys within ``w`` positions of each query (before it, for
a causal model). A window is the simplest sparse mask and the one a sparse kernel runs
fastest (a band of blocks); it stands for the masks of :mod:`attnlens.analysis.dam` here. A causal
model is also offered each window with the block's first 4 keys kept (``window(w)+sink(4)``:
StreamingLLM's attention sinks beside its recent window), which a plain window takes from every query.

Costs are those of :mod:`attnlens.analysis.costs`, counted on the (query, key) pairs the head's
layer computes (``pairs``: every pair, its causal triangle, its window): a partial head pays for
its k scores and its map on the rows that see more than k keys; a window pays for the pairs it
keeps of those, as a kernel that skips the rest would. A choice that costs a layer as much as
exact attention there (a window wider than every row it sees) is no saving, and is never offered.

>>> every = np.ones((1, 128, 128), dtype=bool)                            # one bidirectional layer at n = 128
>>> [str(choice) for choice in options(every, head_dim=32, ks=(8, 16, 32), widths=(4,), causal=False)]
['partial(8)', 'partial(16)', 'window(4)']
>>> round(flops(Choice("window", 4), every[0], 32, causal=False) / flops(EXACT, every[0], 32, causal=False), 3)
0.069
>>> causal = np.tril(every)                                   # a causal layer: window(127) keeps every pair it computes
>>> [str(choice) for choice in options(causal, head_dim=256, ks=(16,), widths=(64, 127), causal=True)]
['partial(16)', 'window(64)', 'window(64)+sink(4)']
>>> parse("window(64)+sink(4)") == Choice("window", 64, 4)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlens.analysis.costs import band, cost_on_lengths, exact_cost, kept_cost, partial_cost
from attnlens.analysis.patterns import STREAMING_SINKS

KINDS = ("exact", "partial", "window")


@dataclass(frozen=True, order=True)
class Choice:
    """One head's computation: ``kind`` and its ``size`` (k for partial, w for window, 0 for exact); a window's
    ``sinks``: the block's first keys it keeps too (0: none)."""

    kind: str
    size: int = 0
    sinks: int = 0

    def __str__(self) -> str:
        name = self.kind if self.kind == "exact" else f"{self.kind}({self.size})"
        return name + (f"+sink({self.sinks})" if self.sinks else "")

    def keep(self, n: int, causal: bool) -> torch.Tensor:
        """A window's (n, n) keep mask (:func:`window_keep`)."""
        return window_keep(n, self.size, causal, self.sinks)


EXACT = Choice("exact")

Assignment = dict[tuple[int, int], Choice]
"""A choice per ``(layer, head)``; heads it leaves out are exact."""


def window_keep(n: int, width: int, causal: bool, sinks: int = 0) -> torch.Tensor:
    """(n, n) boolean: the keys within ``width`` of each query (at or before it when ``causal``), and the first
    ``sinks`` keys.

    >>> window_keep(4, 1, causal=True).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    >>> window_keep(4, 1, causal=True, sinks=1).int().tolist()[3]
    [1, 0, 1, 1]
    """
    return torch.from_numpy(_kept(n, width, causal, sinks))


def _kept(n: int, width: int, causal: bool, sinks: int) -> np.ndarray:
    keep = band(n, width, causal=causal)
    first = np.arange(n)[None, :] < sinks
    return keep | (first & np.tril(np.ones((n, n), dtype=bool)) if causal else keep | first)


def flops(choice: Choice, pairs: np.ndarray, head_dim: int, *, causal: bool, length: int | None = None) -> float:
    """Attention FLOPs of one head under ``choice`` on the pairs its layer computes (``pairs``, (n, n)), for a
    text of ``length`` tokens (default n: a block, or a padded batch's width)."""
    if choice.kind == "partial":
        return partial_cost(pairs, head_dim, choice.size, length)
    if choice.kind == "window":
        return kept_cost(pairs, _kept(pairs.shape[-1], choice.size, causal, choice.sinks), head_dim, length)
    return exact_cost(pairs, head_dim, length)


def flops_on(choice: Choice, pairs: np.ndarray, lengths: np.ndarray, head_dim: int, *, causal: bool) -> float:
    """Attention FLOPs of one head under ``choice`` over examples of these ``lengths`` (their own
    tokens, no padding: the valid pairs a system that does not pad computes), summed.

    >>> every, short = np.ones((64, 64), dtype=bool), np.array([20, 30])   # a window of 32 keeps every pair of both
    >>> flops_on(Choice("window", 32), every, short, 32, causal=False) == flops_on(EXACT, every, short, 32, causal=False)
    True
    """
    return cost_on_lengths(lambda p, size: flops(choice, p, head_dim, causal=causal, length=size), pairs, lengths)


def changes_pairs(choice: Choice, pairs: np.ndarray, lengths: np.ndarray, *, causal: bool) -> bool:
    """Whether ``choice`` can change a pair the layer computes (``pairs``) on any example of these
    ``lengths``: a window only where it drops one of them (a key further than ``w`` from its query), a
    partial head wherever a row is rebuilt at all (its exact keys are positions fitted at n, which a
    short text may leave to padding), exact never.

    >>> every = np.ones((64, 64), dtype=bool)
    >>> changes_pairs(Choice("window", 32), every, np.array([27, 33]), causal=False)
    False
    >>> changes_pairs(Choice("window", 8), every, np.array([27]), causal=False)
    True
    """
    if choice.kind == "window":
        dropped = np.asarray(pairs, dtype=bool) & ~_kept(pairs.shape[-1], choice.size, causal, choice.sinks)
        return any(bool(dropped[:size, :size].any()) for size in np.unique(np.asarray(lengths, dtype=int)))
    return choice.kind == "partial"


def windows(widths: tuple[int, ...], *, causal: bool) -> list[Choice]:
    """The windows of these ``widths`` a model is offered: each plain, and for a causal model each with its sinks.

    >>> [str(choice) for choice in windows((8,), causal=True)]
    ['window(8)', 'window(8)+sink(4)']
    """
    plain = [Choice("window", w) for w in sorted(widths)]
    return plain + ([Choice("window", w, STREAMING_SINKS) for w in sorted(widths)] if causal else [])


def options(
    layer_pairs: np.ndarray, head_dim: int, ks: tuple[int, ...], widths: tuple[int, ...], *, causal: bool
) -> list[Choice]:
    """The choices cheaper than exact attention in at least one layer (``layer_pairs``, (layer, n, n): what
    each computes at width n), partial ones first; a causal model's windows each also with its sinks."""
    offered = [Choice("partial", k) for k in sorted(ks)] + windows(widths, causal=causal)
    return [
        choice
        for choice in offered
        if any(
            flops(choice, pairs, head_dim, causal=causal) < flops(EXACT, pairs, head_dim, causal=causal) for pairs in layer_pairs
        )
    ]


def parse(text: str) -> Choice:
    """A choice from its name, as :class:`Choice` prints it.

    >>> parse("partial(16)"), parse("exact")
    (Choice(kind='partial', size=16, sinks=0), Choice(kind='exact', size=0, sinks=0))
    """
    text, _, sinks = text.partition("+sink(")
    kind, _, size = text.rstrip(")").partition("(")
    return Choice(kind, int(size) if size else 0, int(sinks.rstrip(")")) if sinks else 0)
