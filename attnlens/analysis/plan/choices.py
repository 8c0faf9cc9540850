"""What a head may be given, and what each choice costs in attention FLOPs.

A head is computed **exact** (every score), **partial** with k exact scores per query and
the rest rebuilt by a least-squares map (:mod:`attnlens.analysis.reconstruct`), or under a
**window** mask that keeps the keys within ``w`` positions of each query (before it, for
a causal model). A window is the simplest sparse mask and the one a sparse kernel runs
fastest (a band of blocks); it stands for the masks of :mod:`attnlens.analysis.dam` here.

Costs count multiply-adds ×2 of one head over n queries, on the same terms as
:func:`attnlens.analysis.reconstruct.attention_flops`: a partial head pays for its k
scores and its map; a window pays for the (query, key) pairs it keeps, as a kernel that
skips the rest would. A choice that costs as much as exact attention is never offered.

>>> [str(choice) for choice in options(n=128, head_dim=32, ks=(8, 16, 32), widths=(4,), causal=False)]
['partial(8)', 'partial(16)', 'window(4)']
>>> round(flops(Choice("window", 4), 128, 32, causal=False) / flops(EXACT, 128, 32, causal=False), 3)
0.069
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlens.analysis.reconstruct import attention_flops

KINDS = ("exact", "partial", "window")


@dataclass(frozen=True, order=True)
class Choice:
    """One head's computation: ``kind`` and its ``size`` (k for partial, w for window, 0 for exact)."""

    kind: str
    size: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "exact" else f"{self.kind}({self.size})"


EXACT = Choice("exact")

Assignment = dict[tuple[int, int], Choice]
"""A choice per ``(layer, head)``; heads it leaves out are exact."""


def window_keep(n: int, width: int, causal: bool) -> torch.Tensor:
    """(n, n) boolean: the keys within ``width`` of each query (at or before it when ``causal``).

    >>> window_keep(4, 1, causal=True).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    return (offset >= 0) & (offset <= width) if causal else offset.abs() <= width


def flops(choice: Choice, n: int, head_dim: int, *, causal: bool) -> float:
    """Attention FLOPs of one head under ``choice`` at width ``n`` (dense: the full n × n). A
    partial head with every key exact (k ≥ n) costs what exact attention does."""
    full = attention_flops(n, head_dim)["full"]
    if choice.kind == "partial" and choice.size < n:
        return attention_flops(n, head_dim, choice.size)["partial"]
    if choice.kind == "window":
        return full * float(window_keep(n, choice.size, causal).sum()) / (n * n)
    return full


def flops_on(choice: Choice, lengths: np.ndarray, head_dim: int, *, causal: bool) -> float:
    """Attention FLOPs of one head under ``choice`` over examples of these ``lengths`` (their own
    tokens, no padding: the valid pairs a system that does not pad computes), summed.

    >>> short = np.array([20, 30])          # two sentences: a window of 32 keeps every pair of both
    >>> flops_on(Choice("window", 32), short, 32, causal=False) == flops_on(EXACT, short, 32, causal=False)
    True
    """
    sizes, counts = np.unique(np.asarray(lengths, dtype=int), return_counts=True)
    return float(sum(count * flops(choice, int(size), head_dim, causal=causal) for size, count in zip(sizes, counts)))


def changes_pairs(choice: Choice, lengths: np.ndarray) -> bool:
    """Whether ``choice`` can change a valid pair of any example of these ``lengths``: a window only
    where a text is longer than it (keys more than ``w`` from a query), a partial head wherever a
    row is rebuilt at all (its exact keys are positions fitted at n, which a short text may leave
    to padding), exact never.

    >>> changes_pairs(Choice("window", 64), np.array([27, 43])), changes_pairs(Choice("window", 8), np.array([27]))
    (False, True)
    """
    if choice.kind == "window":
        return bool(np.max(lengths) - 1 > choice.size)
    return choice.kind == "partial"


def options(n: int, head_dim: int, ks: tuple[int, ...], widths: tuple[int, ...], *, causal: bool) -> list[Choice]:
    """The choices cheaper than exact attention at width ``n``, partial ones first."""
    full = flops(EXACT, n, head_dim, causal=causal)
    offered = [Choice("partial", k) for k in sorted(ks) if k < n] + [Choice("window", w) for w in sorted(widths) if w < n - 1]
    return [choice for choice in offered if flops(choice, n, head_dim, causal=causal) < full]


def parse(text: str) -> Choice:
    """A choice from its name, as :class:`Choice` prints it.

    >>> parse("partial(16)"), parse("exact")
    (Choice(kind='partial', size=16), Choice(kind='exact', size=0))
    """
    kind, _, size = text.rstrip(")").partition("(")
    return Choice(kind, int(size) if size else 0)
