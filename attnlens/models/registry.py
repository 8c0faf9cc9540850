"""attnlens' attention implementations, registered with transformers once per process.

transformers looks an implementation up by name in class-wide tables (``AttentionInterface``
for the attention function, ``AttentionMaskInterface`` for the mask it is handed), so one
registration serves every model of the process. :func:`attnlens.load_model` calls
:func:`register_implementations` before it loads a model; later calls do nothing. The probe
that numbers a model's layers (:mod:`attnlens.models.probe`) stands in for ``"attnlens"`` for
one forward pass and puts :data:`FUNCTIONS`' entry back.

>>> sorted(FUNCTIONS)
['attnlens', 'attnlens-kernels', 'attnlens-partial']
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from attnlens.models.attention import (
    ATTENTION_IMPLEMENTATION,
    KERNEL_IMPLEMENTATION,
    PARTIAL_IMPLEMENTATION,
    attnlens_mask,
)
from attnlens.models.capture import attnlens_attention
from attnlens.models.kernels import kernel_attention
from attnlens.models.partial import partial_attention

# Each name with its attention function; all three take the boolean mask of attnlens_mask.
# (They return the output and, but for the fused kernels, the weights.)
FUNCTIONS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    ATTENTION_IMPLEMENTATION: attnlens_attention,
    PARTIAL_IMPLEMENTATION: partial_attention,
    KERNEL_IMPLEMENTATION: kernel_attention,
}


@functools.cache  # once per process: the tables are class-wide, and registering again would change nothing
def register_implementations() -> None:
    """Register every implementation of :data:`FUNCTIONS` with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, function in FUNCTIONS.items():
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, attnlens_mask)
