"""Task examples in batches on the model's device (bucketed by length), their pooled features, and
a change applied to one batch (:func:`changed_capture`, counting the positions it removes)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attnlens.analysis.changes import Batch, Change
from attnlens.data.tasks import Examples
from attnlens.models.capture import Capture, Intervention
from attnlens.models.loading import LoadedModel, backbone
from attnlens.models.precision import DEFAULT_PRECISION, judging


@dataclass(frozen=True)
class TaskBatch:
    """One batch of examples on the model's device; ``start`` is its first example's index.

    ``rows`` are the batch's examples' numbers in their :class:`Examples` (length-bucketed
    batches hold examples out of order). ``seeds`` (the examples' rows in the task, or ``rows``
    when not given) seed each example's random draws, drawn at ``draw_width`` and cut to the
    batch's width, so that an example is changed the same way whichever batch, whatever padding
    and whichever part of the held-out examples it is judged in. Without either, the batch's
    draws are seeded by ``start``.
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    start: int
    rows: np.ndarray | None = None
    draw_width: int | None = None
    seeds: np.ndarray | None = None

    def view(self, model: LoadedModel) -> Batch:
        """The batch as a change reads it: its tokens and what seeds its draws."""
        seeds = self.rows if self.seeds is None else self.seeds
        sequences = None if seeds is None else seeds.tolist()
        return Batch(self.ids, model, self.start, keys_by_class=True, sequences=sequences, draw_width=self.draw_width)


def batches(examples: Examples, batch_size: int, device: torch.device) -> Iterator[TaskBatch]:
    """``examples`` in batches of ``batch_size``, bucketed by length: sorted by length (stably),
    each batch cut to its own longest example, so short texts do not pay for the longest one.
    Examples padded to a fixed width (``Examples.fixed_width``: a change whose shape is fixed,
    such as a reconstruction map of width n) keep it and their order. A batch's ``rows`` say
    where its examples belong (:func:`in_order` puts per-example results back); its ``seeds``
    are the examples' rows in the task."""
    order = np.arange(len(examples)) if examples.fixed_width else np.argsort(examples.lengths, kind="stable")
    for start in range(0, len(examples), batch_size):
        rows = order[start : start + batch_size]
        width = examples.ids.shape[1] if examples.fixed_width else int(examples.lengths[rows].max())
        yield TaskBatch(
            torch.from_numpy(examples.ids[rows, :width]).to(device),
            torch.from_numpy(examples.attention_mask[rows, :width]).to(device),
            torch.from_numpy(examples.labels[rows]).to(device),
            start,
            rows,
            examples.ids.shape[1],
            examples.rows[rows],
        )


def in_order(parts: list[np.ndarray], batched: list[TaskBatch]) -> np.ndarray:
    """Per-example results of ``batched`` (one array per batch) in the examples' own order."""
    values = np.concatenate(parts)
    ordered = np.empty_like(values)
    ordered[np.concatenate([batch.rows for batch in batched])] = values
    return ordered


def pooled_features(module: nn.Module, pooling: str, batch: TaskBatch, precision: str = DEFAULT_PRECISION) -> torch.Tensor:
    """(batch, hidden) float32 features: the final hidden states, computed at ``precision``, pooled as ``pooling`` says."""
    with judging(precision, batch.ids.device):
        hidden = backbone(module)(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state
    hidden = hidden.float()  # pooled in float32 whatever the forward's precision
    mask = batch.attention_mask.to(hidden.dtype)
    if pooling == "mean":
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    last = batch.attention_mask.sum(1) - 1  # examples are padded at the end
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def changed_capture(
    change: Change | None, batch: TaskBatch, model: LoadedModel, counts: np.ndarray | None = None
) -> Capture | contextlib.nullcontext:
    """The capture that applies ``change`` to one batch (nothing for no change), counting the
    valid (query, key) positions it removes (sets to -inf) among the examples' own tokens."""
    if change is None:
        return contextlib.nullcontext()
    intervene = change.intervention(batch.view(model))
    if intervene is None:  # the change leaves this batch alone
        return contextlib.nullcontext()
    if counts is not None:
        intervene = _counting(intervene, batch.attention_mask.bool(), counts)
    return Capture(layers=change.layers, intervene=intervene, record=False)


def per_example(
    model: LoadedModel,
    batch_size: int,
    examples: Examples,
    change: Change | None,
    compute: Callable[[TaskBatch], torch.Tensor],
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """``compute(batch)`` (one row per example) over length-bucketed batches with ``change``
    inside attention (adding to ``counts`` the positions it removes and the valid ones, when given),
    as float64 in the examples' own order."""
    parts, batched = [], list(batches(examples, batch_size, model.device))
    with torch.no_grad():
        for batch in batched:
            with changed_capture(change, batch, model, counts):
                parts.append(compute(batch).double().cpu().numpy())
    return in_order(parts, batched)


def _counting(intervene: Intervention, queries: torch.Tensor, counts: np.ndarray) -> Intervention:
    """``intervene``, adding to ``counts`` (removed, valid) the positions of real queries
    (padding rows aside) it sets to -inf, over every layer and head it changes."""

    def counted(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
        replaced = intervene(layer, scores, valid)
        if replaced is not None:
            own = (valid & queries[:, :, None])[:, None]
            counts[0] += float((torch.isneginf(replaced) & own).sum())
            counts[1] += float(own.sum()) * replaced.shape[1]
        return replaced

    return counted
