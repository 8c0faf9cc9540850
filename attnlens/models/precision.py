"""The arithmetic of the forwards that judge a change: ``float32`` (the default) or ``bfloat16``.

A judgement compares the model with a change against the model without it, on the same examples;
the forwards it runs (the proxy objective's, the task's features and logits, DAM's and the finetune
protocol's training, a plan's costs) may run in bfloat16 for speed. Nothing a user analyses does:
captured scores, their moments and the maps fitted from them come from forwards that never enter
:func:`judging`, so they are float32 whatever the precision.

How: :func:`judging` is ``torch.autocast`` to bfloat16 on the model's device, a no-op for
``float32`` (so float32 is bit for bit what it was before the setting existed). Under autocast the
matrix products (linear layers, q·kᵀ, weights·v) run in bfloat16 on float32 parameters, which stay
float32, as does an optimiser's state: training under it updates float32 weights, mask logits and
maps with gradients computed through bfloat16 products. A bfloat16 copy of the weights is faster
still on a CPU with AMX (``bench/bench_precision.py``), but every path a change takes (interventions,
maps fitted in float64, masks, partial attention, a fine-tune's optimiser) would then meet bfloat16
tensors it was not written for, and a copy of the model costs its memory again; autocast leaves the
model as it is and only changes how its products are computed.

Why a paired Δ stays fair, and what bfloat16 changes: docs/science.md, "Judging in bfloat16".

>>> import torch
>>> with judging("bfloat16"):
...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
torch.bfloat16
>>> with judging("float32"):
...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
torch.float32
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("float32", "bfloat16")
DEFAULT_PRECISION = "float32"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def judging(precision: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """Inside, the forwards on ``device`` run at ``precision``: as they are for ``float32``, under
    bfloat16 autocast for ``bfloat16``. Enter it around a forward, not a backward (PyTorch's rule for
    autocast: a backward replays the forward's dtypes by itself)."""
    # the settings refuse any other name as bad input, before a model loads: here it is a bug
    assert precision in PRECISIONS, f"precision {precision!r} is not one of {PRECISIONS}"
    if precision == DEFAULT_PRECISION:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[precision])
