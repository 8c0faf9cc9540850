"""DeBERTa-v2 and v3 (``deberta-v2``): disentangled attention routed through ``AttentionInterface``.

transformers' ``DisentangledSelfAttention`` computes its scores and softmax in its own code:

    scores = q·(k / s)ᵀ + c2p + p2c,   s = sqrt(head_dim · (1 + number of c2p/p2c terms))

where c2p (content to position) and p2c (position to content) are the relative-position
terms its ``disentangled_attention_bias`` gathers. :func:`adapt` gives each such module a
forward that computes q, k, v and those terms with the module's own layers and methods, and
hands the rest to the registered attention function: the key divided by ``s`` as DeBERTa
divides it (with ``scaling=1``, so the product is DeBERTa's to the bit), the relative terms
as ``position_bias`` and the mask as booleans. The scores attnlens records are then exactly
what DeBERTa's softmax sees, and the outputs are unchanged.

:func:`attend` is shared with DeBERTa (v1), whose module differs only in how it projects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel
from attnlens.models.adapters import set_forward
from attnlens.models.attention import ATTENTION_IMPLEMENTATION

if TYPE_CHECKING:  # transformers is imported when a model is adapted, not with attnlens
    from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention as DebertaAttention
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention


def adapt(model: nn.Module) -> None:
    """Route every DeBERTa-v2 attention module of ``model`` through ``AttentionInterface``."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    route(model, DisentangledSelfAttention, _forward)


def route(model: nn.Module, attention: type[nn.Module], forward: Callable[..., Any]) -> None:
    """Give every ``attention`` module of ``model`` the ``forward`` that routes it (under attnlens'
    implementations; its class's own forward under any other, see :func:`routed`), and let the model
    switch implementations."""
    from transformers import PreTrainedModel

    def dispatch(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return forward(self, *args, **kwargs) if routed(self) else type(self).forward(self, *args, **kwargs)

    for module in model.modules():
        if isinstance(module, attention):
            # The module keeps no config; the model's is the one set_attn_implementation changes.
            module.config = model.config
            set_forward(module, dispatch)
        elif isinstance(module, PreTrainedModel):
            # transformers reads DeBERTa's source, finds no AttentionInterface call and would ignore
            # set_attn_implementation (attnlens' partial plans use it); the adapted modules do call it.
            # An instance attribute over the classmethod, as nn.Module.__setattr__ would set it.
            module.__dict__["_can_set_attn_implementation"] = lambda: True


def routed(module: nn.Module) -> bool:
    """Whether ``module`` runs under one of attnlens' attention implementations.

    Only those take the relative terms: transformers' own kernels (sdpa, flash) would drop
    ``position_bias`` without a word, so under any other implementation the module runs its
    own code, as transformers would.
    """
    return implementation(module).startswith(ATTENTION_IMPLEMENTATION)


def implementation(module: nn.Module) -> str:
    """The attention implementation ``module`` runs under: its model's, read off the config :func:`route` gave it."""
    name = getattr(module.config, "_attn_implementation", None)
    if not isinstance(name, str):
        raise UnsupportedModel(f"{type(module).__name__} has no attention implementation in its config; load it with load_model")
    return name


def attend(
    module: DisentangledSelfAttention | DebertaAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    output_attentions: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention through the model's current implementation: ``query``, ``key`` and ``value`` are
    (batch, heads, seq, head_dim), already scaled; ``bias`` (batch, heads, q, k) is added to the scores.

    Returns DeBERTa's ``(context (batch, q, hidden), weights or None)``.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if attention_mask is not None:
        attention_mask = attention_mask.bool()  # DeBERTa's mask is 1/0 (batch, 1, q, k); a float one would read as additive
    output, weights = ALL_ATTENTION_FUNCTIONS[implementation(module)](
        module,
        query,
        key,
        value,
        attention_mask,
        scaling=1.0,  # the caller scaled q or k as the model does, so that the product matches it bit for bit
        dropout=module.dropout.p if module.training else 0.0,
        position_bias=bias,
    )
    return output.reshape(*output.shape[:2], -1), weights if output_attentions else None


def _forward(
    self: DisentangledSelfAttention,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    output_attentions: bool = False,
    query_states: torch.Tensor | None = None,
    relative_pos: torch.Tensor | None = None,
    rel_embeddings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``DisentangledSelfAttention.forward`` of transformers 5, up to the scores; the rest through :func:`attend`."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import scaled_size_sqrt

    if query_states is None:
        query_states = hidden_states
    heads = self.num_attention_heads
    # (batch·heads, seq, head_dim), the layout the module's relative-position method expects
    query_layer = self.transpose_for_scores(self.query_proj(query_states), heads)
    key_layer = self.transpose_for_scores(self.key_proj(hidden_states), heads)
    value_layer = self.transpose_for_scores(self.value_proj(hidden_states), heads)

    scale_factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
    scale = scaled_size_sqrt(query_layer, scale_factor).to(dtype=query_layer.dtype)
    bias = None
    if self.relative_attention:
        rel_embeddings = self.pos_dropout(rel_embeddings)
        bias = self.disentangled_attention_bias(query_layer, key_layer, relative_pos, rel_embeddings, scale_factor)

    def split(layer: torch.Tensor) -> torch.Tensor:  # (batch·heads, ...) -> (batch, heads, ...)
        return layer.view(-1, heads, *layer.shape[1:])

    bias = split(bias) if isinstance(bias, torch.Tensor) else None  # 0 when pos_att_type names no term
    # DeBERTa divides the key, not the product
    return attend(self, split(query_layer), split(key_layer / scale), split(value_layer), attention_mask, bias, output_attentions)
