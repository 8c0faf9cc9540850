"""Layer inputs: forwards that start where a change to attention starts.

A change confined to layers ≥ ``l`` (one head's choice, a per-layer ablation, a per-layer
map) leaves layers below ``l`` computing exactly what the unmodified model computes, so a
forward through them is wasted. :meth:`LayerInputs.record` runs the unmodified model once
on a fixed batch and keeps the hidden state entering every layer; :meth:`LayerInputs.forward_from`
then runs the model again with the layers below ``start`` doing no work, each returning
the cached input of layer ``start``, and the layers from ``start`` on running for real, so
an active :class:`~attnlens.Capture` changes only those.

How: the model's own forward runs (embeddings, the per-layer-type masks, rotary tables,
the final norm and the output head are recomputed as the model computes them, which costs
little beside a layer), and each skipped layer's ``forward`` is replaced for the time of
the call by one that returns the cached hidden state in the structure the model's loop
expects. Nothing the layers take besides the hidden state is cached: the model rebuilds
it. Where each family keeps its layers, and what a layer returns, are data
(:data:`LAYER_STACKS`); a family missing there is refused.

Rules, enforced: recording runs the unmodified model (an active :class:`~attnlens.Capture`
is set aside, a partial plan refused); :meth:`~LayerInputs.forward_from` refuses a capture
or plan that reaches a layer below ``start`` (it would be silently skipped).

Memory: ``(num_layers - 1) × batch × tokens × hidden × bytes`` (the inputs of layers
1 … L−1; layer 0's is the embedding, recomputed), see :func:`cache_bytes`. Above
``budget_bytes`` (default :data:`DEFAULT_BUDGET`, 2 GiB) nothing is kept and every
:meth:`~LayerInputs.forward_from` is a full forward, with the same results and the same
rules; :attr:`LayerInputs.skips` says which.

Several changes in one forward: ``forward_from(start, copies=c)`` stacks ``c`` copies of
the batch along the batch axis (copy-major: copy ``i`` is rows ``i·batch … (i+1)·batch−1``)
and :func:`by_copy` applies change ``i`` to copy ``i`` only; :func:`split_copies` splits
an output back, and :meth:`LayerInputs.forward_each` does all three. It pays where one batch
leaves the device idle (a GPU, a small batch); on a CPU a batch of 32 blocks already fills the
matrix products, and the stacked tensors, above glibc's 32 MiB mmap threshold, are mapped
and page-faulted afresh by every operation (``bench/bench_layer_inputs.py``: 1.3× slower
than one forward per change, about 1.0× with ``MALLOC_MMAP_THRESHOLD_`` set above them).

>>> import torch
>>> from attnlens import Capture, load_model
>>> model = load_model("minilm-l6")
>>> ids = torch.tensor([[101, 1999, 1996, 2927, 2643, 2580, 1996, 6014, 102]])
>>> cache = LayerInputs.record(model, ids)                      # one unmodified forward
>>> no_self = lambda layer, s, valid: s.masked_fill(torch.eye(s.shape[-1], dtype=torch.bool), float("-inf"))
>>> with Capture(layers=[3, 4, 5], intervene=no_self, record=False):
...     started = cache.forward_from(3).last_hidden_state         # layers 3, 4, 5 only
...     full = model.forward(ids).last_hidden_state               # every layer
>>> torch.equal(started, full)
True
>>> with Capture(layers=[2], intervene=no_self):
...     cache.forward_from(3)
Traceback (most recent call last):
    ...
attnlens.errors.BadInput: the active Capture reaches layer 2, below start 3, where forward_from runs nothing; give Capture(layers=...) only layers from 3 on, or use start 2
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlens.errors import BadInput, UnsupportedModel
from attnlens.models import capture
from attnlens.models.capture import Intervention, no_capture
from attnlens.models.partial import attention_modules

GiB = 2**30
DEFAULT_BUDGET = 2 * GiB


@dataclass(frozen=True)
class LayerStack:
    """Where a family keeps its layers and what one layer returns.

    ``path``: the ``nn.ModuleList`` of layers, a dotted path under the model's ``base_model``.
    ``returns``: a key of :data:`_HANDOFF`; ``"tensor"``, the hidden state itself, is what
    every family's layer returns in transformers ≥ 5 (older code returned tuples: such a
    family needs its own key there, which says where the hidden state is and how to hand it on).
    """

    path: str
    returns: str


# By config ``model_type`` (of the text config for multimodal models). Each row was checked
# against transformers 5's modeling code: a loop that hands each layer's output to the next
# and nothing else (DeBERTa-v2 is absent: its loop convolves layer 0's output with the embedding).
LAYER_STACKS: dict[str, LayerStack] = {
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "electra"), LayerStack("encoder.layer", "tensor")),
    "distilbert": LayerStack("transformer.layer", "tensor"),
    "gpt2": LayerStack("h", "tensor"),
    **dict.fromkeys(
        ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"), LayerStack("layers", "tensor")
    ),
}

# By ``returns``: what a skipped layer returns for a hidden state, and where the hidden state is in what a real one returns.
_HANDOFF: dict[str, Callable[[torch.Tensor], object]] = {"tensor": lambda hidden: hidden}
_HIDDEN: dict[str, Callable[[object], object]] = {"tensor": lambda output: output}


def layer_stack(model: Any) -> LayerStack:
    """The :class:`LayerStack` row of a :class:`~attnlens.LoadedModel`'s family, or :class:`UnsupportedModel`.

    >>> from attnlens import load_model
    >>> layer_stack(load_model("minilm-l6"))
    LayerStack(path='encoder.layer', returns='tensor')
    """
    family = model.model.config.get_text_config().model_type
    if family not in LAYER_STACKS:
        raise UnsupportedModel(
            f"model '{model.name}' ({family}) has no row in attnlens.models.layer_inputs.LAYER_STACKS, so its layers "
            f"cannot be skipped; use a full forward, or add the row (families: {', '.join(sorted(LAYER_STACKS))})"
        )
    return LAYER_STACKS[family]


def layer_modules(model: Any) -> list[nn.Module]:
    """The layer modules of a :class:`~attnlens.LoadedModel`, in order, checked against attnlens' numbering.

    Layer ``i`` must hold the attention module :func:`attnlens.load_model` numbered ``i``; a
    table row that names the wrong list fails here rather than skipping the wrong layers.
    """
    stack = layer_stack(model)
    layers = model.model.base_model.get_submodule(stack.path)
    attention = attention_modules(model.model)
    if len(layers) != model.num_layers or any(
        not any(module is attention[index] for module in layer.modules()) for index, layer in enumerate(layers)
    ):
        raise UnsupportedModel(
            f"model '{model.name}': the modules at '{stack.path}' are not its {model.num_layers} attention layers in "
            "order; its row in attnlens.models.layer_inputs.LAYER_STACKS is wrong for this transformers version"
        )
    return list(layers)


def cache_bytes(model: Any, batch: int, tokens: int) -> int:
    """Bytes :class:`LayerInputs` keeps for ``batch`` blocks of ``tokens``: (layers − 1) × batch × tokens × hidden × bytes.

    >>> from attnlens import load_model
    >>> cache_bytes(load_model("minilm-l6"), batch=32, tokens=128)    # 5 × 32 × 128 × 384 × 4
    31457280
    """
    hidden = model.model.config.get_text_config().hidden_size
    itemsize = next(model.model.parameters()).dtype.itemsize
    return (model.num_layers - 1) * batch * tokens * hidden * itemsize


class LayerInputs:
    """The hidden states entering every layer of one model for one fixed batch.

    Build it with :meth:`record`; ``__init__`` only stores what :meth:`record` computed.
    ``hidden_[i]`` is the input of layer ``i + 1`` (``None`` when the budget was exceeded).
    """

    def __init__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        hidden_: list[torch.Tensor] | None,
        budget_bytes: int,
    ) -> None:
        self.model = model
        self.input_ids = input_ids
        self.attention_mask = attention_mask
        self.hidden_ = hidden_
        self.budget_bytes = budget_bytes
        self._layer_modules: list[nn.Module] | None = None  # found on first use: the search walks every module

    @classmethod
    def record(
        cls,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        budget_bytes: int = DEFAULT_BUDGET,
    ) -> LayerInputs:
        """Run the unmodified backbone of ``model`` once on (batch, n) ``input_ids`` and keep every layer's input.

        When :func:`cache_bytes` exceeds ``budget_bytes`` nothing runs and nothing is kept:
        the result's :meth:`forward_from` is a full forward (:attr:`skips` is ``False``).
        """
        if input_ids.ndim != 2:
            raise BadInput(f"`input_ids` has shape {tuple(input_ids.shape)}; give (batch, tokens) token ids")
        _refuse_plans(model, range(model.num_layers), "record layer inputs")
        input_ids = input_ids.to(model.device)
        attention_mask = None if attention_mask is None else attention_mask.to(model.device)
        if cache_bytes(model, *input_ids.shape) > budget_bytes:
            return cls(model, input_ids, attention_mask, None, budget_bytes)
        layers, returns = layer_modules(model), layer_stack(model).returns
        kept: list[torch.Tensor] = []

        def keep(module: nn.Module, args: object, output: object) -> None:
            hidden = _HIDDEN[returns](output)
            if not isinstance(hidden, torch.Tensor) or hidden.shape[:2] != input_ids.shape:
                raise UnsupportedModel(
                    f"model '{model.name}': a {type(module).__name__} returned {type(output).__name__}, not what its row "
                    f"in attnlens.models.layer_inputs.LAYER_STACKS says ({returns!r} holding the hidden state)"
                )
            kept.append(hidden.detach())

        # The last layer's output is the model's own business (final norm, head): not needed to start anywhere.
        hooks = [layer.register_forward_hook(keep) for layer in layers[:-1]]
        try:
            with torch.no_grad(), no_capture():
                model.model.base_model(**_inputs(input_ids, attention_mask))
        finally:
            for hook in hooks:
                hook.remove()
        return cls(model, input_ids, attention_mask, kept, budget_bytes)

    @property
    def skips(self) -> bool:
        """Whether :meth:`forward_from` skips layers (``False``: the budget was exceeded, every forward is full)."""
        return self.hidden_ is not None

    @property
    def batch(self) -> int:
        return int(self.input_ids.shape[0])

    def hidden(self, layer: int) -> torch.Tensor:
        """The unmodified hidden state entering ``layer`` (1 … L−1), (batch, tokens, hidden)."""
        if self.hidden_ is None:
            raise BadInput(f"nothing was cached: {self.nbytes} bytes exceed `budget_bytes` {self.budget_bytes}")
        if not 1 <= layer < self.model.num_layers:
            raise BadInput(f"`layer` {layer} is out of range; cached inputs are of layers 1 to {self.model.num_layers - 1}")
        return self.hidden_[layer - 1]

    @property
    def nbytes(self) -> int:
        """What the cache costs (or would have cost, above the budget), in bytes."""
        return cache_bytes(self.model, *self.input_ids.shape)

    def forward_from(self, start: int, *, copies: int = 1, head: bool = True) -> Any:
        """The model's output with layers below ``start`` skipped: equal to a full forward's when nothing changes them.

        ``copies`` stacks that many copies of the batch (copy-major) for :func:`by_copy`; the
        forward then holds ``copies`` times a batch's activations, and one stacked copy of the
        cached input of ``start``. ``head=False`` runs the backbone only (``last_hidden_state``;
        no logits, which for a language model are most of the cost). An active capture or
        partial plan that reaches a layer below ``start`` is refused (it would be skipped), also
        where the forward is full. Not thread-safe: it swaps the skipped layers' ``forward``.
        """
        if copies < 1:
            raise BadInput(f"`copies` {copies} must be at least 1")
        inputs = _inputs(
            self.input_ids.repeat(copies, 1), None if self.attention_mask is None else self.attention_mask.repeat(copies, 1)
        )
        run = self.model.model if head else self.model.model.base_model
        with self.started_at(start, copies=copies):
            return run(**inputs)

    @contextlib.contextmanager
    def started_at(self, start: int, *, copies: int = 1) -> Iterator[None]:
        """Inside, every forward of the model on the recorded batch (or ``copies`` of it) runs from layer
        ``start``: the layers below it return the cached input of ``start``. A forward on other inputs
        inside is refused (its hidden states would not be the ones cached), as is an active capture or
        partial plan reaching below ``start``, on entry."""
        if not 0 <= start < self.model.num_layers:
            raise BadInput(
                f"`start` {start} is out of range; model '{self.model.name}' has layers 0 to {self.model.num_layers - 1}"
            )
        _refuse_below(self.model, start)
        if start == 0 or self.hidden_ is None:
            yield
            return
        handoff = self.hidden_[start - 1]
        handoff = handoff.repeat(copies, 1, 1) if copies > 1 else handoff
        with _skipping(self._layers()[:start], _HANDOFF[layer_stack(self.model).returns](handoff), tuple(handoff.shape)):
            yield

    def _layers(self) -> list[nn.Module]:
        if self._layer_modules is None:
            self._layer_modules = layer_modules(self.model)
        return self._layer_modules

    def forward_each(
        self, start: int, changes: Sequence[Intervention | None], *, head: bool = True
    ) -> list[dict[str, torch.Tensor]]:
        """Judge several changes to layers ≥ ``start`` in one forward: change ``i`` alone on copy ``i``.

        Returns, for each change, the output's tensors that have a batch axis (``logits``,
        ``last_hidden_state``, ...), each (batch, ...). ``None`` leaves its copy unmodified.
        """
        with capture.Capture(layers=range(start, self.model.num_layers), intervene=by_copy(changes, self.batch), record=False):
            output = self.forward_from(start, copies=len(changes), head=head)
        stacked = {
            name: split_copies(value, len(changes))
            for name, value in output.items()
            if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == len(changes) * self.batch
        }
        return [{name: value[index] for name, value in stacked.items()} for index in range(len(changes))]


def split_copies(stacked: torch.Tensor, copies: int) -> torch.Tensor:
    """A copy-major stacked output (copies · batch, ...) as (copies, batch, ...).

    >>> split_copies(torch.arange(6).reshape(6, 1), 3)[:, :, 0].tolist()
    [[0, 1], [2, 3], [4, 5]]
    """
    if stacked.shape[0] % copies:
        raise BadInput(f"`copies` {copies} does not divide the batch axis of length {stacked.shape[0]}")
    return stacked.unflatten(0, (copies, stacked.shape[0] // copies))


def by_copy(changes: Sequence[Intervention | None], batch: int) -> Intervention:
    """One :data:`~attnlens.models.capture.Intervention` that applies ``changes[i]`` to copy ``i`` of a stacked batch only.

    Copy ``i`` is rows ``i·batch … (i+1)·batch−1`` (as :meth:`LayerInputs.forward_from` stacks
    them); each change sees its copy's scores and valid mask, as it would alone.

    >>> double = lambda layer, s, valid: 2 * s
    >>> scores = torch.ones(4, 1, 2, 2)                     # two copies of a batch of 2
    >>> by_copy([None, double], batch=2)(0, scores, torch.ones(4, 2, 2, dtype=torch.bool))[:, 0, 0, 0].tolist()
    [1.0, 1.0, 2.0, 2.0]
    """

    def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
        if scores.shape[0] != len(changes) * batch:
            raise BadInput(
                f"scores have batch {scores.shape[0]}, not {len(changes)} copies of {batch}; run forward_from(copies=...)"
            )
        pieces, changed = [], False
        for index, change in enumerate(changes):
            rows = slice(index * batch, (index + 1) * batch)
            new = None if change is None else change(layer, scores[rows], valid[rows])
            changed |= new is not None
            pieces.append(scores[rows] if new is None else new)
        return torch.cat(pieces) if changed else None

    return intervene


def _inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
    return {"input_ids": input_ids} if attention_mask is None else {"input_ids": input_ids, "attention_mask": attention_mask}


def _refuse_below(model: Any, start: int) -> None:
    """Refuse an active capture, or a partial plan, in a layer that ``forward_from(start)`` skips."""
    active = capture._ACTIVE.get()  # the same context variable attnlens_attention reads
    if active is not None and start > 0:
        reached = [layer for layer in range(start) if active.wants(layer)]
        if reached:
            raise BadInput(
                f"the active Capture reaches layer {reached[0]}, below `start` {start}, where forward_from runs nothing; "
                f"give Capture(layers=...) only layers from {start} on, or use `start` {reached[0]}"
            )
    _refuse_plans(model, range(start), f"start at layer {start}")


def _refuse_plans(model: Any, layers: range, action: str) -> None:
    attention = attention_modules(model.model)
    planned = [layer for layer in layers if getattr(attention[layer], "attnlens_plan", None) is not None]
    if planned:
        raise BadInput(
            f"layer {planned[0]} runs under a partial plan, so attnlens cannot {action}; leave the `planned` block first"
        )


@contextlib.contextmanager
def _skipping(layers: list[nn.Module], handoff: object, shape: tuple[int, ...]) -> Iterator[None]:
    """Replace each layer's ``forward`` by one that returns ``handoff``, for the time of the ``with``.

    An instance attribute shadows the class's ``forward`` (``nn.Module.__call__`` calls
    ``self.forward``), so hooks still run; a ``forward`` already set on the instance (accelerate's
    device hooks) is put back as it was. Not reentrant: one forward at a time per model. A layer
    handed hidden states of another ``shape`` (a forward on other inputs) is refused.
    """
    saved = [layer.__dict__.get("forward") for layer in layers]

    def skip(hidden_states: torch.Tensor, *args: object, **kwargs: object) -> object:
        if tuple(hidden_states.shape) != shape:
            raise BadInput(
                f"a forward on inputs of shape {tuple(hidden_states.shape[:2])} inside started_at, whose cache holds "
                f"{shape[:2]}; run only the recorded batch there"
            )
        return handoff

    for layer in layers:
        layer.forward = skip
    try:
        yield
    finally:
        for layer, forward in zip(layers, saved):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
