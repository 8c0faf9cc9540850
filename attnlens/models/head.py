"""A language model's output head, applied only where a loss is read and a few positions at a time.

A next-token loss reads the logits of every position, but never needs them all at once: a batch of
16 blocks of 128 tokens holds 2.1 GB of float32 logits for gemma3-270m's 262,144-word vocabulary, and
its head is most of a token's forward FLOPs. :class:`LanguageHead` takes the backbone's final hidden
states (:func:`attnlens.models.loading.backbone`), picks the positions a loss reads (every position
but the last for a causal model; the masked ones, about 15%, for a masked-LM head), and runs the head
on :data:`CHUNK_BYTES` of logits at a time, each chunk's cross-entropy kept and its logits dropped. Under
autograd a chunk's gradient with respect to its hidden states is taken as it is computed (the head is
frozen) and kept, a row of hidden size per position rather than of vocabulary size; a head that is
itself trained is recomputed chunk by chunk in the backward pass instead (``torch.utils.checkpoint``).

The head is the model's own modules after its backbone, in order, followed by the transform some
families apply to the logits in their ``forward`` (:data:`TRANSFORMS`: Gemma's soft-capping, Cohere's
and Granite's scaling), read from the config as data. :func:`language_head` checks it once per model
against the model's own logits on a short input; a model whose head it does not reproduce (a family
that transforms its logits in a way not listed) gets ``None``, and its losses are taken from the whole
forward as before.

>>> import torch
>>> from attnlens import load_model
>>> model = load_model("minilm-l6")          # a bare encoder: no language-model head
>>> language_head(model) is None
True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from attnlens.models.capture import no_capture
from attnlens.models.loading import LoadedModel

# The float32 logits one chunk may hold. On gemma3-270m that is 256 rows: DAM's step 0.87 of the whole logits' time,
# where 64 MB chunks (64 rows, skinnier products) took 1.11; peak 6.9 GB against 11.1 (bench/bench_head.py).
CHUNK_BYTES = 256 * 2**20
CHECK_TOKENS = 8  # the short input the head is checked on, against the model's own logits
CHECK_TOLERANCE = 1e-4  # relative to the logits' scale: float32 rounding of the same products, summed otherwise
# The transforms families apply to their logits in their forward, after the head's modules, by config field.
TRANSFORMS: dict[str, Callable[[torch.Tensor, float], torch.Tensor]] = {
    "final_logit_softcapping": lambda logits, cap: torch.tanh(logits / cap) * cap,  # Gemma 2, Gemma 3
    "logit_scale": lambda logits, scale: logits * scale,  # Cohere
    "logits_scaling": lambda logits, scale: logits / scale,  # Granite
}


Transform = tuple[Callable[[torch.Tensor, float], torch.Tensor], float]


class LanguageHead:
    """``modules`` applied in order to final hidden states, then the config's ``transforms``, into logits over
    ``vocabulary`` words; see the module."""

    def __init__(self, modules: list[nn.Module], transforms: list[Transform], vocabulary: int) -> None:
        self.modules, self.transforms, self.vocabulary = modules, transforms, vocabulary

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's logits of ``hidden`` (..., hidden size)."""
        for module in self.modules:
            hidden = module(hidden)
        for transform, value in self.transforms:
            hidden = transform(hidden, value)
        return hidden

    @property
    def trained(self) -> bool:
        """Whether any of the head's parameters is being trained (its gradients are wanted)."""
        return any(parameter.requires_grad for module in self.modules for parameter in module.parameters())

    def losses(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per block, the mean cross-entropy of the positions ``labels`` scores (the others -100), ``hidden``
        (blocks, positions, hidden size) the final hidden states of those positions' inputs."""
        scored = labels != -100
        rows, targets = hidden[scored], labels[scored]
        chunk = max(1, CHUNK_BYTES // (4 * self.vocabulary))
        if hidden.requires_grad and self.trained:  # the head's own gradients are wanted: recompute each chunk
            each = [checkpoint(self._chunk, rows[at : at + chunk], targets[at : at + chunk], use_reentrant=False)
                    for at in range(0, len(rows), chunk)]  # fmt: skip
            per_row = torch.cat(each) if each else rows.new_zeros(0)
        else:
            per_row = _ChunkedLoss.apply(rows, targets, self, chunk)
        total = torch.zeros(hidden.shape[0], dtype=per_row.dtype, device=per_row.device)
        total = total.index_add(0, scored.nonzero()[:, 0], per_row)
        return total / scored.sum(1).clamp(min=1)

    def _chunk(self, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.logits(rows).float(), targets, reduction="none")


class _ChunkedLoss(torch.autograd.Function):
    """Per-row cross-entropy of a frozen head, a chunk of rows at a time; the gradient with respect to each
    row's hidden state is taken in the forward pass, chunk by chunk, and scaled in the backward pass."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, targets: torch.Tensor, head: LanguageHead, chunk: int) -> torch.Tensor:
        wanted = ctx.needs_input_grad[0]
        losses, gradients = [], []
        for at in range(0, len(rows), chunk):
            part = rows[at : at + chunk].detach().requires_grad_(wanted)
            with torch.enable_grad() if wanted else torch.no_grad():
                loss = head._chunk(part, targets[at : at + chunk])
                if wanted:
                    gradients.append(torch.autograd.grad(loss.sum(), part)[0])
            losses.append(loss.detach())
        if wanted:
            ctx.save_for_backward(torch.cat(gradients) if gradients else rows.new_zeros(rows.shape))
        return torch.cat(losses) if losses else rows.new_zeros(0)

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        (gradient,) = ctx.saved_tensors
        return gradient * upstream[:, None].to(gradient.dtype), None, None, None


def language_head(model: LoadedModel) -> LanguageHead | None:
    """The head of ``model``'s language-model output (its modules after the backbone, and its family's
    transform), once checked to reproduce the model's own logits; ``None`` for a model without one, or
    whose head this does not reproduce. Checked once per model."""
    if model.model not in _CHECKED:
        head = _candidate(model)
        _CHECKED[model.model] = head if head is not None and _reproduces(model, head) else None
    return _CHECKED[model.model]


_CHECKED: weakref.WeakKeyDictionary[nn.Module, LanguageHead | None] = weakref.WeakKeyDictionary()


def _candidate(model: LoadedModel) -> LanguageHead | None:
    module = model.model
    output = getattr(module, "get_output_embeddings", lambda: None)()
    if not isinstance(output, nn.Module) or model.objective not in ("clm", "mlm"):
        return None
    backbone = model.backbone
    modules = [child for child in module.children() if child is not backbone]
    config = module.config
    transforms = [(TRANSFORMS[name], float(value)) for name in TRANSFORMS if (value := getattr(config, name, None)) is not None]
    weight = getattr(output, "weight", None)
    return None if not isinstance(weight, torch.Tensor) else LanguageHead(modules, transforms, int(weight.shape[0]))


def _reproduces(model: LoadedModel, head: LanguageHead) -> bool:
    """Whether ``head`` on the backbone's final hidden states gives the model's own logits, on a short input."""
    ids = ((torch.arange(CHECK_TOKENS) * 7919 + 11) % head.vocabulary)[None]  # any ids: the head is checked, not text
    try:
        with torch.no_grad(), no_capture():
            own = model.forward(ids).logits.float()
            ours = head.logits(model.final_hidden(ids)).float()
    except (RuntimeError, TypeError, ValueError, AttributeError):  # a module that is no step of the head
        return False
    return ours.shape == own.shape and bool(
        torch.allclose(ours, own, rtol=CHECK_TOLERANCE, atol=CHECK_TOLERANCE * own.abs().max())
    )
