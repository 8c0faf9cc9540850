"""ALBERT (``albert``): one attention module object per layer, over the shared weights.

ALBERT's ``AlbertTransformer`` runs ``num_hidden_layers`` layers with ``num_hidden_groups``
``AlbertLayerGroup`` modules: layer ``i`` calls group ``int(i / (layers / groups))``, so one
attention module answers for several layers, and attnlens (which numbers attention modules
by the order they are called) could not tell the layers apart. :func:`adapt` gives every
layer its own copy of its group, made with ``deepcopy`` but with each parameter, buffer and
config mapped to itself: the copies are new module objects over the very same tensors, so
weights, outputs and training (one gradient per shared weight, summed over the layers) stay
what they were. The transformer's loop then calls copy ``i`` for layer ``i``.

The copies are registered (``encoder.attnlens_layers``), so that ``eval()``, ``to()`` and
``modules()`` reach them, after the original groups, so that ``named_parameters()`` (which
lists a shared tensor once, under its first name) and hence the model's parameter hash are
unchanged; their keys are left out of ``state_dict()`` and not asked for by
``load_state_dict()``, so checkpoints read and write as before.

Refused: ``inner_group_num`` > 1 (each layer would call several attention modules).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel
from attnlens.models.adapters import set_forward

if TYPE_CHECKING:  # transformers is imported when a model is adapted, not with attnlens
    from transformers.models.albert.modeling_albert import AlbertTransformer

COPIES = "attnlens_layers"  # the name of the registered per-layer copies under AlbertTransformer


def adapt(model: nn.Module) -> None:
    """Give every layer of ``model``'s ALBERT transformer its own attention module over the shared weights."""
    from transformers.models.albert.modeling_albert import AlbertTransformer

    for transformer in [module for module in model.modules() if isinstance(module, AlbertTransformer)]:
        config = transformer.config  # the model's own (an ALBERT model has one transformer)
        if config.inner_group_num != 1:
            raise UnsupportedModel(
                f"ALBERT with inner_group_num {config.inner_group_num} runs several attention modules per layer, "
                "which attnlens cannot number by layer; use a model with inner_group_num 1 (every released ALBERT)"
            )
        groups = transformer.albert_layer_groups
        layers, per_group = config.num_hidden_layers, config.num_hidden_layers / config.num_hidden_groups
        # the group index of AlbertTransformer.forward, computed the same way
        transformer.add_module(COPIES, nn.ModuleList(_share(groups[int(i / per_group)]) for i in range(layers)))
        set_forward(transformer, _forward)
        transformer.register_state_dict_post_hook(_drop_copies)
        transformer.register_load_state_dict_post_hook(_forgive_copies)


def _share(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose submodules are new objects and whose tensors and configs are the originals."""
    memo: dict[int, Any] = {id(tensor): tensor for tensor in [*module.parameters(), *module.buffers()]}
    for part in module.modules():
        if hasattr(part, "config"):  # shared, so that set_attn_implementation reaches the copies
            memo[id(part.config)] = part.config
    return copy.deepcopy(module, memo)


def _forward(
    self: AlbertTransformer, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> Any:
    """``AlbertTransformer.forward`` of transformers 5, with layer ``i`` run by its own copy of its group."""
    from transformers.modeling_outputs import BaseModelOutput

    hidden_states = self.embedding_hidden_mapping_in(hidden_states)
    for layer in getattr(self, COPIES):
        hidden_states = layer(hidden_states, attention_mask, **kwargs)
    return BaseModelOutput(last_hidden_state=hidden_states)


def _drop_copies(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """Leave the copies out of ``state_dict()``: their tensors are saved under the original groups' names."""
    for key in [key for key in state_dict if key.startswith(f"{prefix}{COPIES}.")]:
        del state_dict[key]


def _forgive_copies(module: nn.Module, incompatible_keys) -> None:
    """Do not ask ``load_state_dict()`` for the copies' keys: loading the original groups fills their tensors."""
    missing = incompatible_keys.missing_keys
    missing[:] = [key for key in missing if f".{COPIES}." not in f".{key}"]
