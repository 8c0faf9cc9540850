"""DeBERTa v1 (``deberta``): disentangled attention routed through ``AttentionInterface``.

As for DeBERTa-v2 (:mod:`attnlens.models.adapters.deberta_v2`, whose :func:`attend` this
reuses), with v1's projections: one ``in_proj`` for q, k and v plus separate q and v biases,
and the *query* divided by sqrt(head_dim · (1 + number of relative terms)) before both its
products. The scaled query goes to the attention function with ``scaling=1``, so the
recorded scores are DeBERTa's to the bit.

Refused: ``talking_head`` (mixes the heads' scores before softmax and their weights after it,
which per-head capture cannot express), and the ``query_states`` path of DeBERTa's unused
``z_steps`` loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from attnlens.errors import UnsupportedModel
from attnlens.models.adapters.deberta_v2 import attend, route

if TYPE_CHECKING:  # transformers is imported when a model is adapted, not with attnlens
    from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention


def adapt(model: nn.Module) -> None:
    """Route every DeBERTa attention module of ``model`` through ``AttentionInterface``."""
    from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention

    if getattr(model.config, "talking_head", False):
        raise UnsupportedModel(
            "DeBERTa with talking_head mixes heads before and after softmax, which attnlens capture does not support"
        )
    route(model, DisentangledSelfAttention, _forward)


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
    from transformers.models.deberta.modeling_deberta import scaled_size_sqrt

    if query_states is not None:
        raise UnsupportedModel("DeBERTa's query_states path (z_steps) is not supported by attnlens capture; leave z_steps at 0")
    # (batch, heads, seq, 3·head_dim): each head's q, k and v lie side by side in in_proj's output
    query_layer, key_layer, value_layer = self.transpose_for_scores(self.in_proj(hidden_states)).chunk(3, dim=-1)
    query_layer = query_layer + self.transpose_for_scores(self.q_bias[None, None, :])
    value_layer = value_layer + self.transpose_for_scores(self.v_bias[None, None, :])

    scale_factor = 1 + len(self.pos_att_type)
    # DeBERTa divides the query, not the product, and its relative terms use the divided query
    query_layer = query_layer / scaled_size_sqrt(query_layer, scale_factor).to(dtype=query_layer.dtype)
    bias = None
    if self.relative_attention and rel_embeddings is not None and relative_pos is not None:
        rel_embeddings = self.pos_dropout(rel_embeddings)
        bias = self.disentangled_att_bias(query_layer, key_layer, relative_pos, rel_embeddings, scale_factor)
    bias = bias if isinstance(bias, torch.Tensor) else None  # 0 when pos_att_type names no term
    return attend(self, query_layer, key_layer, value_layer, attention_mask, bias, output_attentions)
