"""Tiny random models of other families, saved with the minilm tokenizer (fast shape and parity tests)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers


def save_with_minilm_tokenizer(path: Path, model: transformers.PreTrainedModel, minilm) -> Path:
    """A model directory that loads offline: the model's weights and minilm's tokenizer."""
    model.save_pretrained(path)
    minilm.tokenizer.save_pretrained(path)
    return Path(path)


def save_tiny(path: Path, minilm, kind: str) -> Path:
    """A 2-layer random model directory: ``causal`` (Llama, grouped-query attention),
    ``causal-bert`` (BertLMHeadModel as a decoder: float64 all through, unlike Llama's
    float32 RMSNorm, so finite differences in float64 are exact) or ``mlm`` (BertForMaskedLM)."""
    torch.manual_seed(0)
    if kind == "causal":
        config = transformers.LlamaConfig(
            vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=101, eos_token_id=102, pad_token_id=0,
        )
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        config = transformers.BertConfig(
            vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64,
        )
        model = transformers.BertForMaskedLM(config) if kind == "mlm" else transformers.BertLMHeadModel(
            transformers.BertConfig(**{**config.to_dict(), "is_decoder": True}))
    return save_with_minilm_tokenizer(path, model, minilm)
