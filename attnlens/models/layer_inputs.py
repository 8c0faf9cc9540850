"""Layer inputs: forwards that start where a change to attention starts.

A change confined to layers ≥ ``l`` (one head's choice, a per-layer ablation, a per-layer
map) leaves layers below ``l`` computing exactly what the unmodified model computes, so a
forward through them is wasted. :meth:`LayerInputs.record` runs the unmodified model once
on a fixed batch and keeps what every layer returned; :meth:`LayerInputs.forward_from`
then runs the model again with the layers below ``start`` doing no work, each returning
what it returned then, and the layers from ``start`` on running for real, so an active
:class:`~attnlens.Capture` changes only those.

How: the model's own forward runs (embeddings, the per-layer-type masks, rotary tables,
the final norm and the output head are recomputed as the model computes them, which costs
little beside a layer), and each skipped layer's ``forward`` is replaced for the time of
the call by one that replays that layer's recorded output, whole: whatever the model's loop
does between layers with it runs as it ran (DeBERTa-v2's convolution after layer 0, T5's
position bias that layer 0 computes and hands on), so layer ``start`` receives exactly what
it received in the full forward. The layers are found, not listed: the module list whose
``i``-th entry holds attention module ``i`` (:func:`layer_modules`).

Which families are known to replay exactly is data (:data:`CHECKED_FAMILIES`: the suite
checks each against full forwards from every layer). Any other family is checked the first
time it is recorded, on one block, from every layer (about half a forward of that block per
layer, once per model); where the check fails, every :meth:`~LayerInputs.forward_from` is a
full forward, with the same results, and an :class:`~attnlens.AttnlensWarning` says so once.

Rules, enforced: recording runs the unmodified model (an active :class:`~attnlens.Capture`
is set aside, a partial plan refused); :meth:`~LayerInputs.forward_from` refuses a capture
or plan that reaches a layer below ``start`` (it would be silently skipped).

Memory: ``(num_layers - 1) × batch × tokens × hidden × bytes`` (the outputs of layers
0 … L−2; the last layer is never skipped), see :func:`cache_bytes`. Above ``budget_bytes``
(default :data:`DEFAULT_BUDGET`, 2 GiB) nothing is kept and every
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
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from attnlens.errors import AttnlensWarning, BadInput, UnsupportedModel
from attnlens.models.capture import Capture, Intervention, active_capture, no_capture
from attnlens.models.partial import attention_modules, plan_of

GiB = 2**30
DEFAULT_BUDGET = 2 * GiB

# Families (config ``model_type``, of the text config for multimodal models) whose layers replay exactly:
# tests/test_layer_inputs.py runs a tiny model of each from every layer against its full forward. A family
# missing here is checked at run time, once per model (:func:`replay_holds`).
CHECKED_FAMILIES = frozenset(
    {
        # encoders
        "albert", "bert", "deberta", "deberta-v2", "distilbert", "electra", "esm", "mobilebert", "modernbert",
        "roberta", "xlm-roberta", "t5", "umt5", "bart", "mbart", "pegasus",
        # decoders
        "biogpt", "cohere", "cohere2", "deepseek_v3", "falcon", "gemma", "gemma2", "gemma3_text", "gpt2",
        "gpt_bigcode", "gpt_neox", "gptj", "granite", "llama", "llama4_text", "mistral", "olmo", "olmo2", "opt",
        "phi", "phi3", "qwen2", "qwen3", "smollm3", "starcoder2",
    }
)  # fmt: skip

# Per model: whether replaying its layers reproduces its full forward (checked or known), so that the check
# runs once per model however many batches are recorded.
_REPLAY: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def family(model: Any) -> str:
    """The family of a :class:`~attnlens.LoadedModel`: its (text) config's ``model_type``.

    >>> from attnlens import load_model
    >>> family(load_model("minilm-l6"))
    'bert'
    """
    return model.model.config.get_text_config().model_type


def layer_modules(model: Any) -> list[nn.Module]:
    """The layer modules of a :class:`~attnlens.LoadedModel`, in order: the module list whose entry ``i``
    holds the attention module :func:`attnlens.load_model` numbered ``i`` (the outermost such list).

    >>> from attnlens import load_model
    >>> type(layer_modules(load_model("minilm-l6"))[0]).__name__
    'BertLayer'
    """
    attention = attention_modules(model.model)
    for module in model.backbone.modules():
        if isinstance(module, nn.ModuleList) and len(module) == model.num_layers:
            if all(any(part is attention[index] for part in layer.modules()) for index, layer in enumerate(module)):
                return list(module)
    raise UnsupportedModel(
        f"model '{model.name}' ({family(model)}) keeps its {model.num_layers} attention layers in no list of "
        "layers, so its forwards cannot start at a layer"
    )


def cache_bytes(model: Any, batch: int, tokens: int) -> int:
    """Bytes :class:`LayerInputs` keeps for ``batch`` blocks of ``tokens``: (layers − 1) × batch × tokens × hidden × bytes.

    >>> from attnlens import load_model
    >>> cache_bytes(load_model("minilm-l6"), batch=32, tokens=128)    # 5 × 32 × 128 × 384 × 4
    31457280
    """
    hidden = model.model.config.get_text_config().hidden_size
    itemsize = next(model.model.parameters()).dtype.itemsize
    return (model.num_layers - 1) * batch * tokens * hidden * itemsize


def replay_holds(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> bool:
    """Whether forwards of ``model`` may start at a layer: known for :data:`CHECKED_FAMILIES`; for any other
    family checked once per model on the first block of ``input_ids``, from every layer, against the full
    forward. Where the check fails, an :class:`~attnlens.AttnlensWarning` says so once, and what it costs.

    >>> from attnlens import load_model
    >>> replay_holds(load_model("minilm-l6"), torch.tensor([[101, 1999, 1996, 2927, 102]]))
    True
    """
    key = model.model
    if key not in _REPLAY:
        _REPLAY[key] = family(model) in CHECKED_FAMILIES or _check_replay(model, input_ids[:1], _first(attention_mask))
    return _REPLAY[key]


def _first(mask: torch.Tensor | None) -> torch.Tensor | None:
    return None if mask is None else mask[:1]


def _check_replay(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Run one block from every layer and compare with its full forward (see :func:`replay_holds`)."""
    began = time.perf_counter()
    try:
        cache, full = LayerInputs._recorded(model, input_ids.to(model.device), _to(attention_mask, model.device))
    except UnsupportedModel as error:  # no list of layers, or layers that return no hidden state first
        return _full_forwards(model, error.args[0], began)
    worst, at = 0.0, 0
    with torch.no_grad(), no_capture():
        for start in range(1, model.num_layers):
            with cache.started_at(start):
                started = model.backbone(**_inputs(cache.input_ids, cache.attention_mask)).last_hidden_state
            gap = float((started - full).abs().max() / full.abs().max().clamp_min(1e-30))
            worst, at = max((worst, at), (gap, start))
    # The same arithmetic on the same values is bit-identical; 1e-5 of the output leaves room for a kernel
    # that sums in another order, and is far below what a layer fed the wrong input moves (of order 1).
    if worst <= 1e-5:
        return True
    reason = f"model '{model.name}' ({family(model)}): a forward started at layer {at} differs from the full forward by {worst:.2g} of its output"
    return _full_forwards(model, reason, began)


def _full_forwards(model: Any, reason: str, began: float) -> bool:
    """Say once that ``model``'s changes are judged by full forwards, why (``reason``, which names the model),
    and what that costs; ``False``."""
    warnings.warn(
        f"{reason} (checked in {time.perf_counter() - began:.1f} s), so every change is judged by a full forward: "
        f"about {_full_forward_cost(model.num_layers):.1f}x the layers of starting at the changed one, for a change in one layer",
        AttnlensWarning,
        stacklevel=4,
    )
    return False


def _full_forward_cost(layers: int) -> float:
    """How many times the layers a full forward runs, against starting at the changed layer, averaged
    over changes confined to one layer ``l`` (each start equally likely): L / mean(L − l).

    >>> _full_forward_cost(6)
    1.7142857142857142
    """
    return layers / (sum(layers - start for start in range(layers)) / layers)


class LayerInputs:
    """What every layer of one model returned for one fixed batch, to start its forwards at a layer.

    Build it with :meth:`record`; ``__init__`` only stores what :meth:`record` computed.
    ``outputs_[i]`` is what layer ``i`` returned, as it returned it (``None`` when the budget was
    exceeded or the model's forwards cannot start at a layer, :func:`replay_holds`).
    """

    def __init__(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        outputs_: list[object] | None,
        budget_bytes: int,
    ) -> None:
        self.model = model
        self.input_ids = input_ids
        self.attention_mask = attention_mask
        self.outputs_ = outputs_
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
        """Run the unmodified backbone of ``model`` once on (batch, n) ``input_ids`` and keep every layer's output.

        When :func:`cache_bytes` exceeds ``budget_bytes``, or where the model's forwards cannot start at
        a layer (:func:`replay_holds`), nothing runs and nothing is kept: the result's :meth:`forward_from`
        is a full forward (:attr:`skips` is ``False``).
        """
        if input_ids.ndim != 2:
            raise BadInput(f"`input_ids` has shape {tuple(input_ids.shape)}; give (batch, tokens) token ids")
        _refuse_plans(model, range(model.num_layers), "record layer inputs")
        input_ids, attention_mask = input_ids.to(model.device), _to(attention_mask, model.device)
        if cache_bytes(model, *input_ids.shape) > budget_bytes or not replay_holds(model, input_ids, attention_mask):
            return cls(model, input_ids, attention_mask, None, budget_bytes)
        cache, _ = cls._recorded(model, input_ids, attention_mask, budget_bytes)
        return cache

    @classmethod
    def _recorded(
        cls, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, budget_bytes: int = DEFAULT_BUDGET
    ) -> tuple[LayerInputs, torch.Tensor]:
        """The cache of one unmodified forward, and that forward's last hidden state."""
        cache = cls(model, input_ids, attention_mask, [], budget_bytes)
        kept: list[object] = []

        def keep(module: nn.Module, args: object, output: object) -> None:
            hidden = _hidden(output)
            if not isinstance(hidden, torch.Tensor) or hidden.shape[:2] != input_ids.shape:
                raise UnsupportedModel(
                    f"model '{model.name}': a {type(module).__name__} returned {type(output).__name__}, which holds no "
                    "hidden state first, so its forwards cannot start at a layer"
                )
            kept.append(_detached(output))

        # The last layer's output is the model's own business (final norm, head): never replayed.
        hooks = [layer.register_forward_hook(keep) for layer in cache._layers()[:-1]]
        try:
            with torch.no_grad(), no_capture():
                full = model.backbone(**_inputs(input_ids, attention_mask)).last_hidden_state
        finally:
            for hook in hooks:
                hook.remove()
        cache.outputs_ = kept
        return cache, full

    @property
    def skips(self) -> bool:
        """Whether :meth:`forward_from` skips layers (``False``: every forward is full)."""
        return self.outputs_ is not None

    @property
    def batch(self) -> int:
        return int(self.input_ids.shape[0])

    def hidden(self, layer: int) -> torch.Tensor:
        """The unmodified hidden state layer ``layer − 1`` returned (1 … L−1), (batch, tokens, hidden): the
        input of ``layer`` where the model's loop hands it on as it is (every family but DeBERTa-v2 with a
        convolution)."""
        if self.outputs_ is None:
            raise BadInput(f"nothing was cached: {self.nbytes} bytes exceed `budget_bytes` {self.budget_bytes}")
        if not 1 <= layer < self.model.num_layers:
            raise BadInput(f"`layer` {layer} is out of range; layers 1 to {self.model.num_layers - 1} have a recorded input")
        hidden = _hidden(self.outputs_[layer - 1])
        if not isinstance(hidden, torch.Tensor):  # recording checks this; a cache made by hand may hold anything
            raise BadInput(f"layer {layer - 1} recorded a {type(hidden).__name__}, not a hidden state")
        return hidden

    @property
    def nbytes(self) -> int:
        """What the cache costs (or would have cost, above the budget), in bytes."""
        return cache_bytes(self.model, *self.input_ids.shape)

    def forward_from(self, start: int, *, copies: int = 1, head: bool = True) -> Any:
        """The model's output with layers below ``start`` skipped: equal to a full forward's when nothing changes them.

        ``copies`` stacks that many copies of the batch (copy-major) for :func:`by_copy`; the
        forward then holds ``copies`` times a batch's activations, and a stacked copy of each
        replayed output while its layer's turn lasts. ``head=False`` runs the backbone only (``last_hidden_state``;
        no logits, which for a language model are most of the cost). An active capture or
        partial plan that reaches a layer below ``start`` is refused (it would be skipped), also
        where the forward is full. Not thread-safe: it swaps the skipped layers' ``forward``.
        """
        if copies < 1:
            raise BadInput(f"`copies` {copies} must be at least 1")
        inputs = _inputs(
            self.input_ids.repeat(copies, 1), None if self.attention_mask is None else self.attention_mask.repeat(copies, 1)
        )
        run = self.model.model if head else self.model.backbone
        with self.started_at(start, copies=copies):
            return run(**inputs)

    @contextlib.contextmanager
    def started_at(self, start: int, *, copies: int = 1) -> Iterator[None]:
        """Inside, every forward of the model on the recorded batch (or ``copies`` of it) runs from layer
        ``start``: each layer below it replays what it returned. A forward on other inputs inside is
        refused (the replayed outputs would not be its own), as is an active capture or partial plan
        reaching below ``start``, on entry."""
        if not 0 <= start < self.model.num_layers:
            raise BadInput(
                f"`start` {start} is out of range; model '{self.model.name}' has layers 0 to {self.model.num_layers - 1}"
            )
        _refuse_below(self.model, start)
        if start == 0 or self.outputs_ is None:
            yield
            return
        shape = (copies * self.batch, *self.input_ids.shape[1:])
        with _skipping(self._layers()[:start], self.outputs_[:start], copies, shape):
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
        with Capture(layers=range(start, self.model.num_layers), intervene=by_copy(changes, self.batch), record=False):
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


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def _hidden(output: object) -> object:
    """The hidden state in what a layer returns: the tensor itself, or the first entry of a tuple."""
    return output[0] if isinstance(output, tuple | list) else output


def _detached(output: object) -> object:
    if isinstance(output, torch.Tensor):
        return output.detach()
    return type(output)(_detached(part) for part in output) if isinstance(output, tuple | list) else output


def _stacked(output: object, batch: int, copies: int) -> object:
    """``output`` with every tensor that has a batch axis repeated ``copies`` times along it (copy-major): a
    copy even for one, so that nothing the model does to what a layer returned reaches the cache."""
    if isinstance(output, torch.Tensor):
        return output.repeat(copies, *[1] * (output.ndim - 1)) if output.ndim and output.shape[0] == batch else output
    return type(output)(_stacked(part, batch, copies) for part in output) if isinstance(output, tuple | list) else output


def _refuse_below(model: Any, start: int) -> None:
    """Refuse an active capture, or a partial plan, in a layer that ``forward_from(start)`` skips."""
    active = active_capture()  # the capture attnlens_attention serves
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
    planned = [layer for layer in layers if plan_of(attention[layer]) is not None]
    if planned:
        raise BadInput(
            f"layer {planned[0]} runs under a partial plan, so attnlens cannot {action}; leave the `planned` block first"
        )


@contextlib.contextmanager
def _skipping(layers: list[nn.Module], outputs: list[object], copies: int, shape: tuple[int, ...]) -> Iterator[None]:
    """Replace each layer's ``forward`` by one that returns its recorded output (``copies`` of it), for the
    time of the ``with``.

    An instance attribute shadows the class's ``forward`` (``nn.Module.__call__`` calls
    ``self.forward``), so hooks still run; a ``forward`` already set on the instance (accelerate's
    device hooks) is put back as it was. Not reentrant: one forward at a time per model. A layer
    handed hidden states of another ``(batch, tokens)`` (a forward on other inputs) is refused.
    """
    saved = [layer.__dict__.get("forward") for layer in layers]
    batch = shape[0] // copies

    def skipper(output: object):
        def skip(hidden_states: torch.Tensor, *args: object, **kwargs: object) -> object:
            if tuple(hidden_states.shape[:2]) != shape:
                raise BadInput(
                    f"a forward on inputs of shape {tuple(hidden_states.shape[:2])} inside started_at, whose cache holds "
                    f"{shape}; run only the recorded batch there"
                )
            return _stacked(output, batch, copies)

        return skip

    for layer, output in zip(layers, outputs):
        layer.forward = skipper(output)
    try:
        yield
    finally:
        for layer, forward in zip(layers, saved):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
