"""Where attention concentrates: the first-token sink and heavy hitters, measured as the papers that found them measured.

Per layer and head, from the weights the model computes on ``num_seqs`` corpus blocks of ``seq_len`` tokens
(64 by default, Gu et al.'s inputs), every number per block so that intervals resample blocks and a reader
can re-derive each one from the saved arrays with numpy:

- **first-token weight** ``α`` (Gu et al., ICLR 2025, "When attention sink emerges in language models"): the
  weight the queries put on the block's first token, averaged over the n queries at or after it,
  ``α = (1/n) Σ_i A[i, 0]``. A head is a **sink head** when ``α > ε`` (theirs: 0.3); the share of sink heads is
  given by layer and over the model. A query that cannot see the first token (a sliding window) puts 0 on it,
  as the model does.
- **heavy hitters** (H2O, Zhang et al., NeurIPS 2023): the share of a head's valid weights below 1% of their
  row's largest (``below``: every valid pair counted), and the weight mass the top ``q`` of a row's keys hold
  (its ``⌈q·keys⌉`` largest weights), averaged over the rows of at least ``min_keys`` keys.
- **heads that look far** (with ``far``, a language model's): what restricting each head alone to the first 4 keys
  and a recent window costs its next-token loss, a forward pass per head (:mod:`~attnlens.analysis.sinks.far`).

Which pairs count is the model's own: its causal triangle, its windows (:func:`attnlens.models.capture.Capture`'s
``valid``). The weights are exactly those the model's softmax gives (float32).

>>> from attnlens.analysis.sinks import sinks
>>> result = sinks("minilm-l3", num_seqs=4, seq_len=32, progress=False)
>>> heads = result.tables["heads"]
>>> len(heads), bool(heads["first_weight"].between(0, 1).all()), bool(heads["below"].between(0, 1).all())
(36, True, True)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.evaluation import bootstrap_interval, bootstrap_weights
from attnlens.analysis.objectives import Objective, resolve_objective
from attnlens.analysis.sinks import far
from attnlens.analysis.sinks.result import SinkResult
from attnlens.analysis.sinks.settings import GU_EPSILON, H2O_FRACTION, HEAVY_TOP, SinkSettings
from attnlens.data.corpus import load_corpus
from attnlens.io.provenance import result_meta
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel, load_model
from attnlens.progress import Progress, progress_bar

__all__ = ["GU_EPSILON", "H2O_FRACTION", "HEAVY_TOP", "SinkResult", "SinkSettings", "sinks"]


def sinks(
    source: str | LoadedModel = "minilm-l6",
    settings: SinkSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> SinkResult:
    """The first-token weight and the heavy hitters of every head of ``source`` (an alias, path, Hub id or
    :class:`LoadedModel`), on corpus blocks (:class:`SinkSettings`, with keyword ``changes`` applied); with ``far``,
    what keeping each head alone to the sink and a recent window costs a language model's next-token loss."""
    s = SinkSettings.build(settings, **changes)
    corpus = load_corpus(s.corpus) if isinstance(s.corpus, str) else s.corpus
    model = source if isinstance(source, LoadedModel) else load_model(source, device=device)
    model.check_seq_len(s.seq_len)
    blocks = corpus.blocks(model, s.seq_len, s.num_seqs, s.seed)
    ids = torch.from_numpy(blocks.ids)
    looks = s.far and resolve_objective(model, "auto") == "clm"  # heads that look far: a language model's loss
    batches = len(range(0, len(ids), s.batch_size))
    total = batches + (model.num_layers * model.num_heads if looks else 0)
    with progress_bar(total=total, desc="sinks", unit="pass", enabled=progress) as bar:
        counts = _measure(model, ids, s, bar)
        if looks:
            judge = lambda change: far.looks(change, s.far_margin, s.bootstrap, s.seed)  # noqa: E731
            losses, unmodified = far.head_costs(
                Objective(model, "clm", seed=s.seed), ids[: s.far_max_seqs], s.window, s.batch_size, bar,
                first=s.far_seqs, judge=judge,
            )  # fmt: skip
            counts |= {"far_loss": losses, "far_unmodified": unmodified}
    tables = _tables(counts, s)
    meta = result_meta(
        model=model.describe(),
        corpus={**corpus.describe(), "blocks_available": blocks.available, "block_index": blocks.index.tolist()},
        settings={**s.to_dict(), "fractions": list(s.fractions)},
        command=command,
        n=s.seq_len,
    )
    return SinkResult(meta, tables, counts)


class _Counts:
    """Per block, layer and head: the first-token weight, the negligible pairs, the heavy hitters' mass;
    per block and layer: the valid pairs and the rows the heavy hitters are read on (a capture sink)."""

    def __init__(self, blocks: int, layers: int, heads: int, s: SinkSettings) -> None:
        self.s, self.start = s, 0
        self.first = np.zeros((blocks, layers, heads))
        self.below = np.zeros((blocks, layers, heads))
        self.pairs = np.zeros((blocks, layers))
        self.mass = np.full((blocks, layers, heads, len(s.fractions)), np.nan)
        self.uniform = np.full((blocks, layers, len(s.fractions)), np.nan)
        self.rows = np.zeros((blocks, layers))

    def sink(self, layer: int, scores: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor | None) -> None:
        assert weights is not None, "the pass records weights (Capture(weights=True))"
        weights = weights.double()  # sums of up to n² terms: float64, so a re-derivation agrees to rounding
        size, _, n, _ = weights.shape
        valid = valid.expand(size, n, n)
        here = slice(self.start, self.start + size)
        self.first[here, layer] = weights[..., 0].mean(-1).cpu().numpy()
        largest = weights.amax(-1, keepdim=True)
        negligible = (weights < self.s.fraction * largest) & valid[:, None]
        self.below[here, layer] = negligible.sum((-1, -2)).cpu().numpy()
        self.pairs[here, layer] = valid.sum((-1, -2)).cpu().numpy()
        keys = valid.sum(-1)  # (block, query)
        read = keys >= self.s.min_keys
        self.rows[here, layer] = read.sum(-1).cpu().numpy()
        if bool(read.any()):
            self.mass[here, layer] = _top_mass(weights, keys, read, self.s.fractions).cpu().numpy()
            even = valid[:, None].double() / keys[:, None, :, None].double()  # uniform attention over the same keys
            self.uniform[here, layer] = _top_mass(even, keys, read, self.s.fractions)[:, 0].cpu().numpy()


def _top_mass(weights: torch.Tensor, keys: torch.Tensor, read: torch.Tensor, fractions: tuple[float, ...]) -> torch.Tensor:
    """(block, head, fraction): the mass of each row's ``⌈q·keys⌉`` largest weights, averaged over the rows ``read``.

    Invalid keys have weight exactly 0, so they sort last and never count among a row's largest.
    """
    held = weights.sort(-1, descending=True).values.cumsum(-1)  # (block, head, query, key)
    q = torch.tensor(fractions, dtype=torch.float64, device=weights.device)
    taken = torch.ceil(q[None, None, :] * keys[..., None] - 1e-9).long().clamp(min=1) - 1  # (block, query, fraction)
    index = taken[:, None].expand(-1, held.shape[1], -1, -1)
    mass = held.gather(-1, index)  # (block, head, query, fraction)
    chosen = read[:, None, :, None].to(mass.dtype)
    return (mass * chosen).sum(2) / chosen.sum(2).clamp(min=1)


def _measure(model: LoadedModel, ids: torch.Tensor, s: SinkSettings, bar) -> dict[str, np.ndarray]:
    """One forward pass per batch of blocks, the weights read layer by layer as they are computed."""
    counts = _Counts(len(ids), model.num_layers, model.num_heads, s)
    for start in range(0, len(ids), s.batch_size):
        counts.start = start
        with torch.no_grad(), Capture(weights=True, sink=counts.sink):
            model.run_attention(ids[start : start + s.batch_size])  # no logits: the weights are all it reads
        bar.update(1)
    return {"first_weight": counts.first, "below": counts.below, "pairs": counts.pairs, "top_mass": counts.mass,
            "uniform_mass": counts.uniform, "mass_rows": counts.rows}  # fmt: skip


# ---------------------------------------------------------------------- tables


def _tables(counts: dict[str, np.ndarray], s: SinkSettings) -> dict[str, pd.DataFrame]:
    """``heads`` (each head's numbers), ``layers`` (the share of sink heads by layer, with its interval),
    ``summary`` (the model's, each beside the median and quartiles over heads) and ``curve`` (the heavy
    hitters' mass against the share of keys kept)."""
    first = counts["first_weight"]
    blocks, layers, heads = first.shape
    resampled = _resampled_first(first, s)  # (resample, layer, head)
    sink_heads = resampled > s.epsilon
    alpha = first.mean(0)
    below = counts["below"].sum(0) / counts["pairs"].sum(0)[:, None]
    top = _head_mass(counts)  # (layer, head, fraction)
    at = s.fractions.index(s.top)
    read = top[np.isfinite(top[..., 0])]  # (head, fraction): the heads with a row read (a narrow window has none)
    layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    low, high = np.percentile(resampled, [2.5, 97.5], axis=0)
    head_table = pd.DataFrame({
        "layer": layer.ravel(), "head": head.ravel(), "first_weight": alpha.ravel(), "first_weight_low": low.ravel(),
        "first_weight_high": high.ravel(), "sink": (alpha > s.epsilon).ravel(), "below": below.ravel(),
        "top_mass": top[..., at].ravel(),
    })  # fmt: skip
    share_low, share_high = np.percentile(sink_heads.mean(2), [2.5, 97.5], axis=0)
    layer_table = pd.DataFrame({
        "layer": np.arange(layers), "sink_share": (alpha > s.epsilon).mean(1), "sink_share_low": share_low,
        "sink_share_high": share_high, "first_weight_median": np.median(alpha, 1), "below_median": np.median(below, 1),
    })  # fmt: skip
    # every block has the same valid pairs: the pooled share is the mean of the blocks' shares
    per_block = counts["below"].sum((1, 2)) / (counts["pairs"].sum(1) * heads)
    pooled_below, below_low, below_high = (float(v[0]) for v in bootstrap_interval(per_block[None], s.bootstrap, s.seed))
    model_low, model_high = np.percentile(sink_heads.mean((1, 2)), [2.5, 97.5])
    summary = pd.DataFrame(
        [
            _measure_row("sink_share", float((alpha > s.epsilon).mean()), model_low, model_high, alpha, "first_weight"),
            _measure_row("below", pooled_below, below_low, below_high, below, "below"),
            _measure_row(
                "top_mass", float(read[:, at].mean()) if len(read) else np.nan, np.nan, np.nan, top[..., at], "top_mass"
            ),
        ]
    )
    tables = {"summary": summary, "layers": layer_table, "heads": head_table, "curve": _curve(read, counts, s)}
    return _far_tables(tables, counts, s) if "far_loss" in counts else tables


def _far_tables(tables: dict[str, pd.DataFrame], counts: dict[str, np.ndarray], s: SinkSettings) -> dict[str, pd.DataFrame]:
    """The heads that look far: each head's cost of its restriction with its interval over blocks and whether it lies
    above the margin (``heads``), and the share of heads that do (``summary``, beside the median head)."""
    change = counts["far_loss"] - counts["far_unmodified"]  # (layer, head, block): NaN past a head's blocks
    layers, heads, _ = change.shape
    mean, low, high, looks = far.looks(change.reshape(layers * heads, -1), s.far_margin, s.bootstrap, s.seed)
    blocks = np.isfinite(change).sum(-1).ravel()
    head_table = tables["heads"].assign(far_cost=mean, far_cost_low=low, far_cost_high=high, looks=looks, far_blocks=blocks)
    share = float((looks == "far").mean())
    undecided = float((looks == far.UNDECIDED).mean())  # the share's bounds: every undecided head either way
    row = _measure_row("far_share", share, share, share + undecided, mean, "far_cost")
    return {**tables, "summary": pd.concat([tables["summary"], pd.DataFrame([row])], ignore_index=True), "heads": head_table}


def _curve(read: np.ndarray, counts: dict[str, np.ndarray], s: SinkSettings) -> pd.DataFrame:
    """The heavy hitters' mass against the share of a row's keys kept: the mean over heads, the median and quartiles,
    and what uniform attention over the same rows would give (``⌈q·keys⌉ / keys``: at least one key of a short row)."""
    quartiles = np.percentile(read, [25, 50, 75], axis=0) if len(read) else np.full((3, len(s.fractions)), np.nan)
    rows = counts["mass_rows"][..., None]  # (block, layer, 1)
    uniform = (np.nan_to_num(counts["uniform_mass"]) * rows).sum((0, 1)) / max(float(rows.sum()), 1.0)
    return pd.DataFrame({
        "fraction": s.fractions, "mass": read.mean(0) if len(read) else np.nan, "median": quartiles[1],
        "q1": quartiles[0], "q3": quartiles[2], "uniform": uniform,
    })  # fmt: skip


def _resampled_first(first: np.ndarray, s: SinkSettings) -> np.ndarray:
    """(resample, layer, head): each head's first-token weight over blocks drawn with replacement."""
    blocks, layers, heads = first.shape
    weights = bootstrap_weights(blocks, s.bootstrap, s.seed)  # (block, resample)
    return (first.reshape(blocks, -1).T @ weights).T.reshape(s.bootstrap, layers, heads)


def _head_mass(counts: dict[str, np.ndarray]) -> np.ndarray:
    """(layer, head, fraction): the heavy hitters' mass of each head over the rows read in every block."""
    rows = counts["mass_rows"]  # (block, layer)
    mass = np.nan_to_num(counts["top_mass"]) * rows[..., None, None]
    total = rows.sum(0)[:, None, None]
    return np.where(total > 0, mass.sum(0) / np.maximum(total, 1), np.nan)


def _measure_row(name: str, value: float, low: float, high: float, per_head: np.ndarray, of: str) -> dict[str, object]:
    """One row of the summary: the model's number (with its interval where it has one) and the typical head."""
    values = per_head[np.isfinite(per_head)]
    q1, median, q3 = np.percentile(values, [25, 50, 75]) if len(values) else (math.nan,) * 3
    return {"measure": name, "value": value, "low": low, "high": high, "per_head": of, "head_median": median,
            "head_q1": q1, "head_q3": q3}  # fmt: skip
