"""The probe: one forward pass over a few tokens that finds and numbers a model's attention layers.

:func:`attnlens.load_model` runs it once per model: it stands a spy in for ``"attnlens"`` in
transformers' attention table for that one forward, which sees each attention module as it is
called, then puts ``"attnlens"`` back. The modules are numbered in call order (the
``attnlens_layer`` that :func:`attnlens.models.capture.layer_index` reads), and a model whose
calls are not one module per layer, or whose layers differ in geometry, is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attnlens.errors import UnsupportedModel
from attnlens.models import attention, capture, registry

if TYPE_CHECKING:  # transformers is imported when a model loads, not with attnlens
    from transformers import PretrainedConfig

SUPPORTED_HINT = "use a model without them (BERT, Llama, Gemma, Qwen, Mistral, ...)"

# Families (config ``model_type``, or that of the text config) whose attention adds a
# term outside q·kᵀ that capture does not reproduce, checked before any weights load (and before a GGUF file
# is converted: :mod:`attnlens.models.gguf`).
# In transformers each of these passes a learned per-head sink logit (``s_aux``) to the
# attention function in every layer. A family with sinks in only some layers or configs
# (e.g. mimo_v2_flash), or one missing here, is still refused, by capture itself, in the
# probe forward pass.
UNSUPPORTED_ATTENTION: dict[str, str] = {
    family: "attention sinks (s_aux)"
    for family in (
        "gpt_oss",
        "openai_privacy_filter",
        "flint",
        "granite_swa",
        "granitemoe_swa",
        "deepseek_v4",
        "hy_v4",
        "hy_v4_vl_text",
    )
}


@dataclass(frozen=True)
class Probe:
    """What one forward pass over a few tokens shows of a model's attention: its modules in the
    order they are called, the number of calls, each module's geometry (query heads, key heads,
    size of q·k) and layer 0's valid mask, which tells causal models apart."""

    modules: list[nn.Module]
    calls: int
    shapes: list[tuple[int, int, int]]
    valid: torch.Tensor


def _number_layers(model: nn.Module, probe: torch.Tensor) -> Probe:
    """Find the attention modules in the order a forward pass calls them, and count the calls.

    Numbering by call order works for every architecture without a per-family table. A module
    called more than once per forward (ALBERT shares one layer among all) makes the calls
    outnumber the modules. The geometry is read off the tensors each module passes, not off the
    config (whose fields some families keep per layer).
    """
    order: list[nn.Module] = []
    shapes: list[tuple[int, int, int]] = []
    valid: list[torch.Tensor] = []
    calls = 0
    original = registry.FUNCTIONS[attention.ATTENTION_IMPLEMENTATION]

    def spy(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        nonlocal calls
        calls += 1
        if not any(module is seen for seen in order):
            order.append(module)
            shapes.append((query.shape[1], key.shape[1], query.shape[-1]))
            valid.append(
                attention.valid_and_bias(attention_mask, torch.empty(query.shape[0], 1, query.shape[2], key.shape[2]))[0]
            )
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    from transformers import AttentionInterface

    AttentionInterface.register(attention.ATTENTION_IMPLEMENTATION, spy)
    try:
        with torch.no_grad():
            model(input_ids=probe)
    finally:
        AttentionInterface.register(attention.ATTENTION_IMPLEMENTATION, original)
    for index, module in enumerate(order):
        setattr(module, capture.LAYER_ATTRIBUTE, index)  # nn.Module types its attributes as tensors and modules
    return Probe(order, calls, shapes, valid[0] if valid else torch.ones(1, 1, 1, dtype=torch.bool))


def read_attention(name: str, config: PretrainedConfig, model: nn.Module, probe_ids: list[int]) -> tuple[Probe, int]:
    """Number the model's attention layers and check that attnlens can read every one alike;
    returns the probe and the number of layers, or refuses in one line."""
    family = config.model_type
    try:
        probe = _number_layers(model, torch.tensor([probe_ids], device=next(model.parameters()).device))
    except UnsupportedModel as error:  # capture refused a term of a family not in the table
        raise UnsupportedModel(f"model '{name}' ({family}) cannot be captured: {error}; {SUPPORTED_HINT}") from None
    except Exception as error:  # e.g. X-MOD without a default language: the model needs more than token ids
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UnsupportedModel(f"model '{name}' ({family}) cannot run a forward pass on token ids alone: {reason}") from None
    num_layers = config.get_text_config().num_hidden_layers
    _check_layer_count(name, family, len(probe.modules), probe.calls, num_layers)
    if len(set(probe.shapes)) > 1:
        raise UnsupportedModel(
            f"model '{name}' ({family}) has layers of different attention geometry (query heads, key heads, head size: "
            f"{', '.join(map(str, sorted(set(probe.shapes))))}); attnlens analyses need every layer alike"
        )
    return probe, num_layers


def _check_layer_count(name: str, family: str, modules: int, calls: int, num_layers: int) -> None:
    """Refuse a model whose attention calls are not one module per layer, saying which way it differs."""
    if modules == num_layers and calls == num_layers:
        return
    if modules == 0:
        found = "does not call transformers' attention interface (it computes attention in its own modules)"
    elif calls > modules == num_layers:
        found = f"calls transformers' attention interface {calls // modules} times in each of its layers"
    elif calls > modules:
        found = (
            f"shares {modules} attention module{'s' if modules > 1 else ''} among its {num_layers} layers "
            f"({calls} calls per forward pass), which attnlens cannot number by layer"
        )
    else:
        found = (
            f"calls transformers' attention interface in {modules} of its {num_layers} layers (the others are not attention, "
            "or compute it in their own modules)"
        )
    raise UnsupportedModel(
        f"model '{name}' ({family}) {found}; use a model with one attention module per layer (BERT, Llama, Gemma, Qwen, T5, ...)"
    )
