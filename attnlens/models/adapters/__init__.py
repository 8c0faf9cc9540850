"""Adapters: families that compute attention in their own modules, routed through capture.

Most families call transformers' ``AttentionInterface``, which is where attnlens reads and
changes attention. A family that computes its scores in its own code (DeBERTa's
disentangled scores) or calls one module for several layers (ALBERT) gets one small file
here, as TransformerLens keeps one conversion file per family. Each file has one function,
``adapt(model)``, that changes the loaded model in place so that every layer's attention
goes through ``AttentionInterface`` once, with its exact pre-softmax scores, and the
model's outputs stay what they were. :data:`ADAPTERS` maps a config's ``model_type`` to it.

>>> sorted(ADAPTERS) == sorted(set(ADAPTERS))
True
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any

from torch import nn

# model_type -> the module under attnlens.models.adapters whose ``adapt(model)`` routes it
ADAPTERS: dict[str, str] = {
    "albert": "albert",  # one attention module shared by every layer
    "deberta": "deberta",  # disentangled attention, computed in its own module
    "deberta-v2": "deberta_v2",  # the same, for v2 and v3
}


def adapt(model: nn.Module, model_type: str) -> None:
    """Route ``model``'s attention through ``AttentionInterface`` if its family needs an adapter."""
    name = ADAPTERS.get(model_type)
    if name is not None:
        importlib.import_module(f"attnlens.models.adapters.{name}").adapt(model)


def set_forward(module: nn.Module, forward: Callable[..., Any]) -> None:
    """Give ``module`` its own ``forward``, ``forward`` bound to it.

    An instance attribute shadows the class's ``forward`` (``nn.Module.__call__`` calls
    ``self.forward``), so hooks still run. Written to the instance's ``__dict__``, which is what
    ``nn.Module.__setattr__`` does with a plain callable: an assignment to a method, which type
    checkers rightly question elsewhere, is here the adapter's purpose.
    """
    module.__dict__["forward"] = types.MethodType(forward, module)
