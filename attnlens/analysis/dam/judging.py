"""Judging masks and fixed patterns on held-out data, on corpus blocks and on task batches alike.

A learned mask is judged by its hard mask ``α > 0``
(:class:`~attnlens.analysis.changes.MaskChange`): the objective with it inside attention,
the sparsity it achieves on the valid positions, the rows it would have emptied (rescued:
they keep their keys of largest logit), and the keep-probability ``σ(α/s)`` per layer,
head and position class. Fixed patterns (:class:`~attnlens.analysis.changes.PatternChange`)
are judged on the same batches; with ``train_weights`` the patterns nearest a mask's
sparsity get the same weight training (:func:`adapt_to_pattern`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import Change, MaskChange, PatternChange
from attnlens.analysis.dam.layouts import MaskLayout, hard_removals
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.evaluation import evaluate_change, layer_groups
from attnlens.analysis.experiment import Split
from attnlens.analysis.objectives import Evaluates, Objective
from attnlens.analysis.patterns import PATTERNS, offered
from attnlens.analysis.task import TaskJudge, seed_values, seeds_difference, task_columns
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel


@dataclass
class MaskSplit:
    """A split as masks are trained and judged on it: its batches, each batch's layout context,
    its masks of the position classes reported (``classes``), its valid positions (``valids``:
    (batch, layer, w, w) for padded task examples, ``None`` for unpadded blocks) and the valid
    positions each logit decides in it (``counts``, the weights of a mask's density)."""

    split: Split
    contexts: list[torch.Tensor]
    masks: list[dict[str, torch.Tensor]]
    valids: list[torch.Tensor | None]
    counts: list[torch.Tensor]

    @classmethod
    def of(cls, split: Split, layout: MaskLayout, classes: tuple[str, ...]) -> MaskSplit:
        device = layout.valid.device
        contexts = [layout.context(view) for view in split.views]
        masks = [{name: mask.to(device) for name, mask in view.classes(classes).items()} for view in split.views]
        valids = [_own_positions(layout, batch) for batch in split.inputs]
        counts = [layout.counts(context, valid) for context, valid in zip(contexts, valids)]
        return cls(split, contexts, masks, valids, counts)


def _own_positions(layout: MaskLayout, batch: object) -> torch.Tensor | None:
    """(batch, layer, w, w): the valid positions of a batch of task examples (the model's own,
    among the examples' tokens); ``None`` for unpadded blocks of n (the layout's own)."""
    attention_mask = getattr(batch, "attention_mask", None)
    if attention_mask is None or (attention_mask.shape[1] == layout.n and bool(attention_mask.all())):
        return None
    own, width = attention_mask.bool().to(layout.valid.device), attention_mask.shape[1]
    return layout.valid[None, :, :width, :width] & own[:, None, :, None] & own[:, None, None, :]


def evaluate_mask(
    layout: MaskLayout, logits: torch.Tensor, objective: Evaluates, data: MaskSplit, noise: float = 1.0
) -> dict[str, np.ndarray]:
    """Losses on ``data`` under the hard mask (:class:`MaskChange`), sparsity, and keep statistics
    per (layer, head, class): the keep-probability of a sample at noise scale ``noise``,
    σ(α / noise), and the fraction the hard mask keeps."""
    logits = logits.detach()
    losses = evaluate_change(objective, data.split.inputs, data.split.views, MaskChange(layout, logits, ""))["loss"]
    statistics = _mask_statistics(layout, logits, data, noise)
    return {"losses": losses, **statistics}


def _mask_statistics(layout: MaskLayout, logits: torch.Tensor, data: MaskSplit, noise: float) -> dict[str, np.ndarray]:
    """What the hard mask removes and keeps on ``data``, per (layer, head, class) and in all."""
    probability = torch.sigmoid(logits / max(noise, 1e-6))
    num_classes = len(data.masks[0])
    keep_sum = np.zeros((layout.num_layers, layout.num_heads, num_classes))
    kept_sum = np.zeros_like(keep_sum)
    positions = np.zeros((layout.num_layers, num_classes))
    removed = total = rescued = rows = expected = counted = 0.0
    for context, batch_masks, valid, counts in zip(data.contexts, data.masks, data.valids, data.counts):
        removals, batch_rescued, batch_rows = hard_removals(layout, logits, context, valid)
        rescued, rows = rescued + batch_rescued, rows + batch_rows
        expected += float((probability * counts).sum())
        counted += float(counts.sum())
        stacked = torch.stack(list(batch_masks.values())).to(torch.float32)  # (class, batch, w, w)
        size, width = context.shape[0], stacked.shape[-1]
        existing = layout.positions(valid).expand(size, -1, -1, -1).to(torch.float32)  # (batch, layer, w, w)
        for layer in range(layout.num_layers):
            in_class = stacked * existing[:, layer]
            p = layout.expand(probability, layer, context)[..., :width, :width].expand(size, -1, -1, -1)
            kept = 1.0 - removals[layer].to(torch.float32).expand(size, layout.num_heads, -1, -1)
            keep_sum[layer] += torch.einsum("bhqk,cbqk->hc", p, in_class).double().cpu().numpy()
            kept_sum[layer] += torch.einsum("bhqk,cbqk->hc", kept, in_class).double().cpu().numpy()
            positions[layer] += in_class.sum((1, 2, 3)).double().cpu().numpy()
            removed += float(removals[layer].expand(size, layout.num_heads, -1, -1).sum())
            total += float(existing[:, layer].sum()) * layout.num_heads
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "sparsity": np.array(removed / total),
            "expected_sparsity": np.array(1 - expected / counted),
            "rows_rescued": np.array(rescued / rows),
            "keep_probability": keep_sum / positions[:, None, :],
            "kept": kept_sum / positions[:, None, :],
            "positions": positions,
        }


def removed_fraction(change: PatternChange, split: Split, valid: torch.Tensor) -> float:
    """The fraction of valid (layer, query, key) positions of ``split`` that ``change`` removes."""
    groups, group_valid = layer_groups(valid)
    sizes = np.bincount(groups, minlength=len(group_valid))
    removed = total = 0.0
    for view in split.views:
        prepared = change.prepare(view)
        for layer_valid, size in zip(group_valid, sizes):
            removed += float(change.remove(prepared, 0, layer_valid[None]).sum()) * size
            total += float(layer_valid.sum()) * view.ids.shape[0] * size
    return removed / total


def pattern_points(n: int, causal: bool) -> list[tuple[str, int]]:
    """Every fixed pattern offered to a model (``causal`` or not, :func:`~attnlens.analysis.patterns.offered`) at every
    value of its parameter, for blocks of ``n`` tokens."""
    return [(pattern.name, value) for pattern in offered(causal) for value in pattern.values(n)]


def judge_patterns(
    objective: Objective, split: Split, valid: torch.Tensor, points: list[tuple[str, int]], seed: int, bar=None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Fixed patterns at the parameter values ``points`` (:func:`pattern_points`) on ``split``:
    per-block losses and the fraction of valid positions removed."""
    rows, losses, n = [], [], split.ids.shape[1]
    for name, value in points:
        change = PatternChange(name, value, n, seed)
        losses.append(evaluate_change(objective, split.inputs, split.views, change)["loss"])
        pattern = PATTERNS[name]
        fraction = removed_fraction(change, split, valid)
        rows.append(
            {"pattern": name, "family": pattern.family, "parameter": pattern.parameter, "value": value, "sparsity": fraction}
        )
        if bar is not None:
            bar.update(1)
    if not rows:
        return pd.DataFrame(columns=["pattern", "family", "parameter", "value", "sparsity"]), np.zeros((0, len(split.ids)))
    return pd.DataFrame(rows), np.stack(losses)


def adapt_to_pattern(
    model: LoadedModel,
    objective: Evaluates,
    split: Split,
    change: Change,
    batches: list[int],
    rates: list[float],
    s: DamSettings,
    bar=None,
) -> list[float]:
    """Fine-tune the weights under a fixed pattern as :class:`DamTrainer` did under a learned mask
    (``train_weights``): Adam at ``weights_lr``, one step on each of the mask's ``batches`` at the
    learning-rate factor the mask's step had (``rates``: its schedule, then its convergence check).
    Returns the training losses; the caller restores the weights."""
    parameters = [parameter for parameter in model.model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=s.training.weights_lr)
    losses = []
    with torch.enable_grad():
        for index, rate in zip(batches, rates):
            optimizer.param_groups[0]["lr"] = s.training.weights_lr * rate
            with Capture(record=False, intervene=change.intervention(split.views[index])):
                loss = objective.evaluate(split.inputs[index])["loss"].mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if bar is not None:
                bar.update(1)
    return losses


def judge_patterns_on_task(
    task: TaskJudge, points: pd.DataFrame, n: int, seed: int, bar=None
) -> tuple[pd.DataFrame, list[PatternChange]]:
    """Every pattern point of ``points`` judged by the task: its columns beside the point's, and
    each point's change (for paired comparisons with a mask, :meth:`TaskJudge.compare`)."""
    judged, changes = [], []
    for row in points.itertuples():
        change = PatternChange(row.pattern, int(row.value), n, seed)
        judged.append(task_columns(task.judge(change)))
        changes.append(change)
        if bar is not None:
            bar.update(1)
    table = points[["pattern", "value", "sparsity"]].reset_index(drop=True).join(pd.DataFrame(judged)).assign(kind="pattern")
    return table, changes


def compare_on_task(
    task: TaskJudge, compared: pd.DataFrame, masks: pd.DataFrame, mask_changes: list[Change], patterns: pd.DataFrame,
    pattern_changes: list[Change], *, extend: bool,
) -> pd.DataFrame:  # fmt: skip
    """Each mask against the patterns it is compared with (``compared``: rows of lambda, scope,
    pattern and value), by task accuracy: the mask's accuracy minus the pattern's, paired over
    held-out examples (:meth:`TaskJudge.compare`; ``extend``: either may be run on more examples,
    which a mask judged with the weights it trained cannot); ``verdict`` "better" or "worse" only
    where the interval excludes 0."""
    rows = []
    for _, row in compared.iterrows():
        mask = int(np.flatnonzero(masks["lambda"].to_numpy() == row["lambda"])[0])
        same = (patterns["pattern"] == row["pattern"]).to_numpy() & (patterns["value"] == row["value"]).to_numpy()
        if "lambda" in patterns:  # patterns adapted beside each mask: the one trained beside this mask
            same &= (patterns["lambda"] == row["lambda"]).to_numpy()
        point = int(np.flatnonzero(same)[0])
        rows.append(
            {
                "lambda": row["lambda"],
                "scope": row["scope"],
                "pattern": row["pattern"],
                "value": row["value"],
                "dam_task_sparsity": masks["task_sparsity"].iloc[mask],
                "task_sparsity": patterns["task_sparsity"].iloc[point],
                "dam_accuracy": masks["accuracy"].iloc[mask],
                "accuracy": patterns["accuracy"].iloc[point],
                **task.compare(mask_changes[mask], pattern_changes[point], extend=extend),
                **_across_seeds(masks.iloc[mask], patterns.iloc[point]),
            }
        )
    return pd.DataFrame(rows)


def _across_seeds(mask: pd.Series, pattern: pd.Series) -> dict[str, float]:
    """With fine-tune seeds: the mask's accuracy minus the pattern's, paired by seed, with its t interval."""
    mine, theirs = seed_values(mask), seed_values(pattern)
    if mine is None or theirs is None:
        return {}
    mean, low, high = seeds_difference(mine, theirs)
    return {"difference_seeds": mean, "difference_seeds_low": low, "difference_seeds_high": high}
