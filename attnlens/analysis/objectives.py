"""Objectives: what a model's outputs lose when its attention is changed.

Every intervention (ablation, learned mask, reconstruction) is judged by one of three
objectives, chosen by ``--objective auto|clm|mlm|hidden``:

- ``clm``: next-token cross-entropy (causal language models);
- ``mlm``: cross-entropy on masked tokens (models with a masked-LM head); a seeded
  15% of the non-special tokens of each block are replaced by ``[MASK]``;
- ``hidden``: for encoders without a head, how far the final hidden states move from
  the unmodified model's: ``loss = 1 - mean token cosine``; the cosine of mean-pooled
  sentence embeddings is reported beside it.

``auto`` takes what the model supports (``LoadedModel.objective``). Losses are per
block and differentiable, so the same objective trains DAM masks and learned R. Every forward
an objective runs (its references included) runs at its ``precision``
(:func:`attnlens.models.precision.judging`): both arms of a judgement go through the same
objective, so they are computed alike.

>>> import torch
>>> from attnlens import Capture, load_model
>>> from attnlens.analysis.objectives import Objective
>>> model = load_model("minilm-l6")
>>> objective = Objective(model)                     # auto -> hidden for a bare encoder
>>> batch = objective.prepare(torch.tensor([[101, 1999, 1996, 2927, 102]]))
>>> round(objective.evaluate(batch)["loss"].detach()[0].item(), 6)   # unmodified: no loss
0.0
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import torch
from torch import nn

from attnlens.errors import BadInput
from attnlens.models.capture import no_capture
from attnlens.models.head import language_head
from attnlens.models.loading import LoadedModel
from attnlens.models.precision import DEFAULT_PRECISION, judging

OBJECTIVES = ("auto", "clm", "mlm", "hidden")
MASK_RATE = 0.15


def resolve_objective(model: LoadedModel, objective: str = "auto") -> str:
    """The objective to use for ``model``; an error if it cannot support the one asked for."""
    if objective not in OBJECTIVES:
        raise BadInput(f"`objective` {objective} is unknown; use one of {', '.join(OBJECTIVES)}")
    if objective == "auto":
        return model.objective
    if objective in ("clm", "mlm") and model.objective != objective:
        head = {"clm": "a causal language-model head", "mlm": "a masked language-model head"}[objective]
        raise BadInput(
            f"`objective` {objective} needs {head}, which model '{model.name}' ({model.architecture}) does not have; "
            f"use `objective` {model.objective} or auto"
        )
    return objective


class _HeadSkip(TypedDict, total=False):
    """Keyword arguments that let a language model skip its head for all but the last position."""

    logits_to_keep: int


@dataclass
class PreparedBatch:
    """Inputs of one batch, with what the objective compares the outputs to."""

    input_ids: torch.Tensor
    labels: torch.Tensor | None = None  # clm / mlm: target ids, -100 where not scored
    reference: torch.Tensor | None = None  # hidden: the unmodified model's final hidden states


class Evaluates(Protocol):
    """What judging a change needs of an objective: per-sequence metrics of one of its batches, ``"loss"``
    among them, computed at its ``precision``. An :class:`Objective` on corpus blocks is one; so is a
    task's loss on its examples (:class:`~attnlens.analysis.task.TaskLoss`), which DAM and the plan judge
    and train against."""

    @property
    def precision(self) -> str: ...

    def evaluate(self, batch: Any) -> dict[str, torch.Tensor]: ...


class Objective:
    """One objective for one model, its forwards at ``precision``; see the module docstring."""

    def __init__(self, model: LoadedModel, objective: str = "auto", *, seed: int = 0, precision: str = DEFAULT_PRECISION) -> None:
        self.model = model
        self.name = resolve_objective(model, objective)
        self.seed = seed
        self.precision = precision
        # hidden states need no logits: a language model that can skip its head for all but the last
        # position (gemma's is a 262k-word vocabulary, most of a step's cost) is asked to
        self._no_head: _HeadSkip = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.model.forward).parameters else {}
        )

    def at(self, precision: str) -> Objective:
        """The same objective (its name, seed and masks), its forwards at ``precision``."""
        return self if precision == self.precision else Objective(self.model, self.name, seed=self.seed, precision=precision)

    def prepare(self, input_ids: torch.Tensor, *, offset: int = 0) -> PreparedBatch:
        """Masks (mlm) or reference outputs (hidden) for a batch of blocks.

        ``offset`` is the index of the batch's first block in the corpus sample, so that
        each block's masked positions depend on the seed and the block, not the batching.
        """
        input_ids = input_ids.to(self.model.device)
        if self.name == "clm":
            labels = input_ids.clone()
            labels[:, 0] = -100  # nothing predicts the first token
            return PreparedBatch(input_ids, labels=labels)
        if self.name == "mlm":
            return self._mask(input_ids, offset)
        with torch.no_grad(), no_capture():
            reference = self._hidden(input_ids)
        return PreparedBatch(input_ids, reference=reference)

    def evaluate(self, batch: PreparedBatch) -> dict[str, torch.Tensor]:
        """Run the model (inside whatever :class:`Capture` is active); per-block metrics.

        ``"loss"`` is the one to minimise; ``hidden`` adds ``token_cosine`` and ``pooled_cosine``.
        """
        if self.name == "hidden":
            reference = batch.reference
            assert reference is not None, "prepare gives a batch of the hidden objective its reference"
            hidden = self._hidden(batch.input_ids)
            token_cosine = nn.functional.cosine_similarity(hidden, reference, dim=-1).mean(-1)
            pooled_cosine = nn.functional.cosine_similarity(hidden.mean(1), reference.mean(1), dim=-1)
            return {"loss": 1 - token_cosine, "token_cosine": token_cosine, "pooled_cosine": pooled_cosine}
        labels = batch.labels
        assert labels is not None, "prepare gives a batch of the clm and mlm objectives its labels"
        head = language_head(self.model)
        if head is None:  # a head this does not reproduce: the whole forward's logits
            return {"loss": _mean_loss(self._forward(batch.input_ids).logits, labels, self.name)}
        with judging(self.precision, self.model.device):
            hidden = self.model.final_hidden(batch.input_ids)
            if self.name == "clm":  # position t predicts token t + 1
                hidden, labels = hidden[:, :-1], labels[:, 1:]
            return {"loss": head.losses(hidden, labels)}  # the head only where a loss is read, a chunk at a time

    def _hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._forward(input_ids, output_hidden_states=True, **self._no_head).hidden_states[-1].float()

    def _forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """The model's forward at the objective's precision; what it returns is read (and its loss taken,
        and any backward run) outside, in float32."""
        with judging(self.precision, self.model.device):
            return self.model.forward(input_ids, **kwargs)

    def _mask(self, input_ids: torch.Tensor, offset: int) -> PreparedBatch:
        mask_id = self.model.special.mask
        if mask_id is None:
            raise BadInput(
                f"model '{self.model.name}' has a masked language-model head but its tokenizer has no mask token; "
                "use `objective` hidden"
            )
        special = torch.tensor(sorted(self.model.special.all_special), device=input_ids.device)
        maskable = ~torch.isin(input_ids, special)
        chosen = torch.zeros_like(maskable)
        for row in range(input_ids.shape[0]):
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + offset + row)
            draws = torch.rand(input_ids.shape[1], generator=generator).to(input_ids.device)
            chosen[row] = maskable[row] & (draws < MASK_RATE)
            if not chosen[row].any() and maskable[row].any():  # every block scores at least one token
                chosen[row, maskable[row].nonzero()[0, 0]] = True
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
        masked = torch.where(chosen, torch.full_like(input_ids, mask_id), input_ids)
        return PreparedBatch(masked, labels=labels)


def _mean_loss(logits: torch.Tensor, labels: torch.Tensor, name: str) -> torch.Tensor:
    """Per block, the mean cross-entropy of the scored positions of the whole logits (clm: position t predicts t + 1)."""
    if name == "clm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    losses = nn.functional.cross_entropy(logits.transpose(1, 2).float(), labels, reduction="none", ignore_index=-100)
    return losses.sum(1) / (labels != -100).sum(1).clamp(min=1)
