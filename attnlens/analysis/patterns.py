"""Fixed sparse attention patterns, for comparison with learned (DAM) masks at matched sparsity.

Each pattern is a boolean **keep** mask over (query, key), built from positions and, for
the ones with global tokens, from which keys are in the ``cls`` role
(:func:`attnlens.data.positions.token_roles`: ``[CLS]``, or ``<bos>``/the first token):

==============  ================================================================  ==========
strided         ``|i - j| < s`` or ``(i - j) mod s = 0`` (Child et al. 2019)       stride s
fixed           same block ``⌊i/b⌋ = ⌊j/b⌋``, or ``j`` is the last of its block     block b
                (Child et al. 2019, one summary column per block)
band            ``|i - j| <= w`` and nothing else (no global tokens)                window w
local           ``|i - j| <= w``, plus global ``cls`` rows and columns              window w
                (Longformer-like; with w = 1 it is Star-Transformer's pattern)
bigbird         local window ``w`` + global ``cls`` + ``w`` random keys per row     window w
                (seeded; BigBird-like)
sink-window     ``|i - j| <= w``, plus the block's first 4 keys whatever their      window w
                tokens (StreamingLLM's attention sinks; decoders only)
no-diagonal     every position but ``i = j`` (SparseBERT's diagonal removal)        --
==============  ================================================================  ==========

Each pattern names its **family** (:attr:`Pattern.family`): ``band`` and ``no-diagonal``
depend on the offset ``|i - j|`` alone (what DAM_s, one logit per head and offset, can
express), ``local``, ``bigbird`` and ``sink-window`` carry global tokens, ``strided`` and ``fixed`` are
periodic. ``sink-window`` is offered to causal models only (:func:`offered`): StreamingLLM's question is a
decoder's, and on an encoder its first keys are ``local``'s ``[CLS]`` and three words. A learned mask is compared with the best pattern inside its own family and with
the best overall.

:func:`removed_mask` turns a pattern into the positions it removes from a model's valid
ones, after the row guard (:func:`attnlens.analysis.evaluation.guard_rows`), and :func:`sparsity`
is honest: the fraction of valid positions that are actually removed.

>>> import torch
>>> keep = build("local", 6, 1, cls=torch.tensor([[True, False, False, False, False, False]]))
>>> keep[0].int().tolist()[3]                      # query 3: global key 0, keys 2..4
[1, 0, 1, 1, 1, 0]
>>> valid = torch.ones(1, 6, 6, dtype=torch.bool)
>>> round(sparsity(removed_mask(keep, valid), valid), 4)   # 36 - (16 band + 4 + 4 global) = 12 removed
0.3333
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlens.analysis.evaluation import guard_rows
from attnlens.errors import BadInput


def _positions(n: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.arange(n, device=device)
    return index[:, None], index[None, :]


def _global(keep: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    """Global tokens attend everywhere and are attended to from everywhere."""
    return keep | cls[:, :, None] | cls[:, None, :]


def strided(n: int, stride: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    keep = ((i - j).abs() < stride) | ((i - j) % stride == 0)
    return keep.expand(cls.shape[0], n, n)


def fixed(n: int, block: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    keep = (i // block == j // block) | (j % block == block - 1)
    return keep.expand(cls.shape[0], n, n)


def local(n: int, window: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    return _global(((i - j).abs() <= window).expand(cls.shape[0], n, n), cls)


def bigbird(
    n: int, window: int, cls: torch.Tensor, generator: torch.Generator | None = None, keys: torch.Tensor | None = None
) -> torch.Tensor:
    keep = local(n, window, cls)
    keys = (torch.rand((cls.shape[0], n, n), generator=generator) if keys is None else keys).to(cls.device)
    # ``window`` random keys per row, drawn among the keys the window and globals leave out
    rank = torch.where(keep, torch.full_like(keys, 2.0), keys).argsort(-1).argsort(-1)
    return keep | (rank < window)


def band(n: int, window: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    return ((i - j).abs() <= window).expand(cls.shape[0], n, n)


STREAMING_SINKS = 4  # StreamingLLM's initial tokens: 4 kept beside the window


def sink_window(n: int, window: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    return (((i - j).abs() <= window) | (j < STREAMING_SINKS)).expand(cls.shape[0], n, n)


def no_diagonal(n: int, parameter: int, cls: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    i, j = _positions(n, cls.device)
    return (i != j).expand(cls.shape[0], n, n)


@dataclass(frozen=True)
class Pattern:
    """A fixed pattern: its builder, the name of its parameter, the values to sweep, and its
    family (``offset``: a function of |i - j| alone; ``global``: with global tokens; ``periodic``)."""

    name: str
    build: Callable[..., torch.Tensor]
    parameter: str
    values: Callable[[int], list[int]]
    family: str
    random: bool = False  # draws from its generator (BigBird's random keys)
    causal_only: bool = False  # asked of decoders only (StreamingLLM's sink and window)


def _powers(low: int, high_fraction: float) -> Callable[[int], list[int]]:
    return lambda n: [
        value
        for value in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
        if low <= value <= max(low, int(n * high_fraction))
    ]


PATTERNS: dict[str, Pattern] = {
    pattern.name: pattern
    for pattern in (
        # Beyond a stride or block of about sqrt(2n) these patterns keep more again, not less.
        Pattern("strided", strided, "stride", lambda n: [v for v in _powers(2, 1.0)(n) if v * v <= 2 * n], "periodic"),
        Pattern("fixed", fixed, "block", lambda n: [v for v in _powers(2, 1.0)(n) if v * v <= 2 * n], "periodic"),
        Pattern("band", band, "window", _powers(1, 0.25), "offset"),
        Pattern("local", local, "window", _powers(1, 0.25), "global"),
        Pattern("bigbird", bigbird, "window", _powers(1, 0.25), "global", random=True),
        # StreamingLLM keeps most of a row (1,020 recent of 1,024 keys): windows up to three quarters of n
        Pattern("sink-window", sink_window, "window", _powers(1, 0.75), "global", causal_only=True),
        Pattern("no-diagonal", no_diagonal, "none", lambda n: [0], "offset"),
    )
}


def offered(causal: bool) -> list[Pattern]:
    """The patterns a model is compared with: every one, but those asked of decoders only where it is not causal.

    >>> [pattern.name for pattern in offered(causal=False)][-2:], "sink-window" in [p.name for p in offered(causal=True)]
    (['bigbird', 'no-diagonal'], True)
    """
    return [pattern for pattern in PATTERNS.values() if causal or not pattern.causal_only]


def build(
    name: str,
    n: int,
    parameter: int,
    cls: torch.Tensor,
    generator: torch.Generator | None = None,
    keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """The (batch, n, n) keep mask of pattern ``name``; ``cls`` (batch, n) marks the global keys. A
    random pattern draws from ``generator``, or takes its (batch, n, n) uniform ``keys`` as drawn."""
    if name not in PATTERNS:
        raise BadInput(f"unknown pattern '{name}'; use one of {', '.join(PATTERNS)}")
    return PATTERNS[name].build(n, parameter, cls, generator, **({"keys": keys} if PATTERNS[name].random else {}))


def removed_mask(keep: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The valid positions a pattern removes, after the row guard."""
    return guard_rows(~keep, valid)


def sparsity(removed: torch.Tensor, valid: torch.Tensor) -> float:
    """Fraction of valid positions removed (``valid`` broadcasts against ``removed``)."""
    return float(removed.sum()) / float(valid.expand_as(removed).sum())
