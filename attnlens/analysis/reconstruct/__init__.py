"""Partial computation: compute k of a row's n scores exactly, rebuild the rest linearly.

The first paper's scheme: for each query, compute the scores of ``k`` chosen keys and
estimate the others by an affine least-squares map fitted on the rows' moments,

    ŝ = μ + C[:, S] (C[S, S] + ridge)⁻¹ (s_S − μ_S),      with ŝ_S = s_S exactly,

where μ and C are the mean and covariance of the rows (:mod:`attnlens.rows.moments`) and S
the chosen keys (:mod:`attnlens.analysis.reconstruct.selection`). attnlens fits the map on one part of the
corpus and measures, on held-out blocks and for every k:

- the relative error against the mean row ``‖s − ŝ‖² / ‖s − μ‖²`` (the honest one: 1
  means no better than predicting the training mean row), and against zero
  ``‖s − ŝ‖² / ‖s‖²`` (looks far better, as the mean row carries much of the energy);
- the error after softmax: total-variation distance and KL(w ‖ ŵ) per row;
- for each of these four, a 95% percentile-bootstrap interval over the held-out blocks
  (``rel_error_low``/``rel_error_high``, ...): each resample's error is the ratio of its
  resampled sums, as the error itself is a ratio of sums over all held-out rows;
- attention FLOPs against full attention (:func:`attention_flops`);
- with ``plug_in``, what the model's own outputs lose with the reconstruction inside
  attention (:mod:`attnlens.analysis.objectives`), and with ``learn_r`` the gain of fine-tuning
  the maps on that objective over the closed form.

Scopes: one map per ``head``, one per ``layer`` (shared by its heads), or one for
``all`` layers and heads. Rows: pooled over queries (encoders), or one map per query
position (``per-query``; always so for causal models, whose rows have different valid
keys: a map of query i uses only keys 0…i, and rows with at most k valid keys are
computed exactly).

>>> import attnlens
>>> result = attnlens.reconstruct("minilm-l6", seq_len=16, num_seqs=40, ks=[4, 16], layers=[0],
...                               strategies=["greedy", "random"], scopes=["head"], progress=False)
>>> overall = result.table.query("layer == -1").set_index(["strategy", "k"])
>>> bool(overall.loc[("greedy", 16), "rel_error"] < 1e-9)        # k = n: exact
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import FixedChange
from attnlens.analysis.evaluation import (
    CONFIDENCE,
    bootstrap_interval,
    bootstrap_weights,
    evaluate_change,
    frozen,
    prepare_batches,
)
from attnlens.analysis.objectives import OBJECTIVES, Objective, PreparedBatch
from attnlens.analysis.reconstruct.selection import (
    QUERY_DEPENDENT,
    check_ks,
    check_strategies,
    greedy_path,
    leverage_positions,
    local_global_positions,
    random_order,
    stride_positions,
)
from attnlens.analysis.task import TaskJudge, TaskSettings, content_key, task_columns
from attnlens.errors import BadInput
from attnlens.io.provenance import result_meta
from attnlens.io.results import Result, format_table
from attnlens.io.store import Store
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel, load_model
from attnlens.models.partial import rebuild_from
from attnlens.progress import Progress, progress_bar, split
from attnlens.rows.moments import Moments, compute_moments
from attnlens.rows.sources import ModelRows, StoreRows, open_rows
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero, one_of, positive, probability

SCOPES = ("head", "layer", "all")
ROW_MODES = ("auto", "pooled", "per-query")
_LEVEL_OF_SCOPE = {"head": "head", "layer": "layer", "all": "model"}


# ---------------------------------------------------------------------- cost


def attention_flops(n: int, head_dim: int, k: int | None = None) -> dict[str, float]:
    """Multiply-adds ×2 of one head's attention over n queries: full, and with k exact keys.

    Full: QKᵀ (2n²d) + softmax (≈3n²) + weights·V (2n²d). Partial: k scores per query
    (2nkd) + the affine map for the other n − k (2nk(n − k) + n(n − k)) + softmax + V.

    >>> round(attention_flops(128, 64, 32)["ratio"], 3)
    0.818
    """
    full = 4 * n * n * head_dim + 3 * n * n
    if k is None:
        return {"full": float(full), "partial": float(full), "ratio": 1.0}
    partial = 2 * n * k * head_dim + 2 * n * k * (n - k) + n * (n - k) + 3 * n * n + 2 * n * n * head_dim
    return {"full": float(full), "partial": float(partial), "ratio": partial / full}


def pairs_attention_flops(n: int, head_dim: int, pairs: int, rank: int) -> dict[str, float]:
    """As :func:`attention_flops`, for pairs mode: ``pairs`` exact scores (2·pairs·d) and a
    rank-``rank`` rebuild of the whole matrix (2·pairs·r + 2n²r), then softmax and V."""
    full = attention_flops(n, head_dim)["full"]
    partial = 2 * pairs * head_dim + 2 * pairs * rank + 2 * n * n * rank + 3 * n * n + 2 * n * n * head_dim
    return {"full": full, "partial": float(partial), "ratio": partial / full}


def default_ks(n: int) -> list[int]:
    """1, 2, 4, … up to n, and n itself.

    >>> default_ks(20)
    [1, 2, 4, 8, 16, 20]
    """
    ks = [2**p for p in range(n.bit_length()) if 2**p <= n]
    return ks if ks[-1] == n else [*ks, n]


# ---------------------------------------------------------------------- maps


@dataclass
class LayerMaps:
    """The reconstruction of one layer: ``ŝ = offset + Σ_j weights[..., j] · s[..., positions[j]]``.

    ``positions`` (H, Q, k), ``weights`` (H, Q, n, k), ``offset`` (H, Q, n); Q is 1 when
    one map serves every query, else one map per query position.
    """

    positions: torch.Tensor
    weights: torch.Tensor
    offset: torch.Tensor

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """Reconstructed scores (batch, head, q, n) from the exact ones at ``positions``."""
        # the maps are fitted on the CPU in float64: onto the scores' device and dtype
        return rebuild_from(scores, self.positions, self.weights, self.offset)

    def parameters(self) -> int:
        return int(self.weights.numel() + self.offset.numel())


class MapFitter:
    """Selections and least-squares maps for every strategy, scope and k, from fit moments."""

    def __init__(self, moments: Moments, *, ridge: float, seed: int, global_positions: tuple[int, ...]) -> None:
        self.moments = moments
        self.ridge = ridge
        self.seed = seed
        self.global_positions = global_positions
        self.levels = {scope: moments.level(level) for scope, level in _LEVEL_OF_SCOPE.items()}
        self.covariance = {scope: level.second_moment(centred=True) for scope, level in self.levels.items()}
        self.mean = {scope: level.mean() for scope, level in self.levels.items()}
        self.complete = {scope: level.complete_keys() for scope, level in self.levels.items()}
        self._orders: dict[tuple[str, str], np.ndarray] = {}

    @property
    def n(self) -> int:
        return self.moments.n

    def _query(self, q: int) -> int:
        return self.moments.queries[q] if self.moments.per_query else -1

    def order(self, strategy: str, scope: str) -> np.ndarray:
        """Nested selection orders (units…, n) for greedy and random, computed once."""
        key = (strategy, scope)
        if key not in self._orders:
            covariance, complete = self.covariance[scope], self.complete[scope]
            shape = covariance.shape[:3]
            flat_cov, flat_ok = covariance.reshape(-1, self.n, self.n), complete.reshape(-1, self.n)
            if strategy == "greedy":
                order = np.concatenate(
                    [greedy_path(flat_cov[i : i + 256], flat_ok[i : i + 256])[0] for i in range(0, len(flat_cov), 256)]
                )
            else:  # random: a seeded permutation of each unit's valid keys, then the rest
                rng = np.random.default_rng([self.seed, SCOPES.index(scope)])
                permutations = random_order(self.n, len(flat_ok), rng)
                order = np.stack([np.r_[p[flat_ok[u][p]], p[~flat_ok[u][p]]] for u, p in enumerate(permutations)])
            self._orders[key] = order.reshape(*shape, self.n)
        return self._orders[key]

    def selection(self, strategy: str, scope: str, k: int, unit: tuple[int, int, int]) -> np.ndarray:
        """The keys a unit computes exactly: k of its valid keys (all of them if it has at most k)."""
        keys = np.flatnonzero(self.complete[scope][unit])
        m = min(k, len(keys))
        if strategy in ("greedy", "random"):
            return np.sort(self.order(strategy, scope)[unit][:m])
        if strategy == "stride":
            return keys[stride_positions(len(keys), m)]
        if strategy == "eigen":
            return leverage_positions(self.covariance[scope][unit], m, self.complete[scope][unit])
        query = self._query(unit[2])
        return local_global_positions(self.n, m, query, self.global_positions, limit=int(keys.max()) + 1)

    def layer_maps(self, strategy: str, scope: str, k: int, layer: int) -> tuple[LayerMaps, np.ndarray]:
        """Maps for every head of ``layer``, and their selections (H, Q, k) padded with -1."""
        position = self.moments.layers.index(layer)
        heads, queries = self.moments.num_heads, self.moments.count.shape[2]
        unit_layer = 0 if scope == "all" else position
        unit_heads = range(heads) if scope == "head" else [0]
        positions = np.zeros((len(unit_heads), queries, k), dtype=np.int64)
        weights = np.zeros((len(unit_heads), queries, self.n, k))
        offset = np.zeros((len(unit_heads), queries, self.n))
        selections = np.full((len(unit_heads), queries, k), -1, dtype=np.int64)
        units = [(unit_layer, h, q) for h in unit_heads for q in range(queries)]
        chosen = {unit: self.selection(strategy, scope, k, unit) for unit in units}
        for m in sorted({len(s) for s in chosen.values()}):
            group = [unit for unit in units if len(chosen[unit]) == m]
            selected = np.stack([chosen[unit] for unit in group])
            w, a = self._fit(scope, group, selected)
            for (_, h, q), s, unit_w, unit_a in zip(group, selected, w, a):
                slot = unit_heads.index(h) if scope == "head" else 0
                positions[slot, q, :m], positions[slot, q, m:] = s, s[0]  # padding: zero weight
                weights[slot, q, :, :m], offset[slot, q] = unit_w, unit_a
                selections[slot, q, :m] = s
        repeat = heads if scope != "head" else 1
        maps = LayerMaps(
            torch.from_numpy(np.repeat(positions, repeat, 0)),
            torch.from_numpy(np.repeat(weights, repeat, 0)),
            torch.from_numpy(np.repeat(offset, repeat, 0)),
        )
        return maps, np.repeat(selections, repeat, 0)

    def _fit(self, scope: str, units: list[tuple[int, int, int]], selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Affine least squares for a group of units that all select m keys: weights (U, n, m), offsets (U, n)."""
        index = tuple(np.array(units).T)
        covariance, mean, complete = self.covariance[scope][index], self.mean[scope][index], self.complete[scope][index]
        count, m = len(units), selected.shape[1]
        rows = np.arange(count)[:, None, None]
        c_ss = covariance[rows, selected[:, :, None], selected[:, None, :]]
        c_ns = covariance[rows, np.arange(self.n)[None, :, None], selected[:, None, :]]
        scale = np.einsum("uii->u", c_ss) / m
        regularised = c_ss + (self.ridge * np.maximum(scale, 1e-12))[:, None, None] * np.eye(m)
        # C_SS is symmetric positive (semi)definite: a batched Cholesky solve, falling back to LU if it is singular.
        system, right = torch.from_numpy(regularised), torch.from_numpy(c_ns.transpose(0, 2, 1).copy())
        factor, info = torch.linalg.cholesky_ex(system)
        solved = torch.cholesky_solve(right, factor) if not bool(info.any()) else torch.linalg.solve(system, right)
        weights = solved.numpy().transpose(0, 2, 1).copy()
        weights[rows[:, :, 0], selected, :] = np.eye(m)  # chosen keys are exact
        weights[~complete] = 0.0  # keys the unit never sees stay out
        mean_selected = np.take_along_axis(mean, selected, axis=1)
        offset = np.where(complete, mean - np.einsum("unm,um->un", weights, mean_selected), 0.0)
        return weights, offset


# ---------------------------------------------------------------------- evaluation


@dataclass
class HeldOutBatch:
    """One batch of held-out rows and what every map's evaluation on them shares."""

    scores: torch.Tensor  # (B, H, q, n)
    mask: torch.Tensor | None  # (B, H, q, n) valid entries; None when all are valid
    weights: torch.Tensor  # softmax of the true scores over valid keys
    has_keys: torch.Tensor  # (B, H, q) rows with at least one valid key
    entropy_term: torch.Tensor  # (B, H, q): Σ w log w, the half of KL(w ‖ ŵ) that no map changes
    sums: dict[str, np.ndarray]  # per head: squared deviation from the mean row, squared norm, rows
    block_sums: dict[str, np.ndarray]  # the same per block (sequence) and head, (B, H): what the bootstrap resamples

    @classmethod
    def of(cls, scores: torch.Tensor, valid: torch.Tensor, mean: torch.Tensor) -> HeldOutBatch:
        mask = None if bool(valid.all()) else valid[:, None].expand_as(scores)
        has_keys = valid.any(-1)[:, None].expand(scores.shape[:-1])
        weights = torch.softmax(_masked(scores, mask, float("-inf")), -1)
        shared = {
            "squared_deviation": _sums(_masked(scores - mean, mask, 0.0) ** 2),
            "squared_norm": _sums(_masked(scores, mask, 0.0) ** 2),
            "rows": _sums(has_keys),
        }
        entropy_term = torch.special.xlogy(weights, weights).sum(-1)
        sums = {name: per_head for name, (per_head, _) in shared.items()}
        block_sums = {name: per_block for name, (_, per_block) in shared.items()}
        return cls(scores, mask, weights, has_keys, entropy_term, sums, block_sums)

    def errors(self, reconstructed: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-head sums: squared error, total variation and KL(w ‖ ŵ) after softmax, with the shared sums."""
        return self.measure(reconstructed)[0]

    def measure(self, reconstructed: torch.Tensor) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The sums of :meth:`errors` per head, and the same per block and head (B, H)."""
        log_estimate = _masked(torch.log_softmax(_masked(reconstructed, self.mask, float("-inf")), -1), self.mask, 0.0)
        tv = 0.5 * (self.weights - _masked(log_estimate.exp(), self.mask, 0.0)).abs().sum(-1)
        kl = self.entropy_term - (self.weights * log_estimate).sum(-1)
        own = {
            "squared_error": _sums(_masked(self.scores - reconstructed, self.mask, 0.0) ** 2),
            "tv": _sums((tv * self.has_keys).nan_to_num()),
            "kl": _sums((kl * self.has_keys).nan_to_num()),
        }
        per_head = {**self.sums, **{name: head for name, (head, _) in own.items()}}
        per_block = {**self.block_sums, **{name: block for name, (_, block) in own.items()}}
        return per_head, per_block


def _masked(tensor: torch.Tensor, mask: torch.Tensor | None, value: float) -> torch.Tensor:
    """``tensor`` with invalid entries set to ``value``; no pass at all when every entry is valid."""
    return tensor if mask is None else tensor.masked_fill(~mask, value)


def _per_head(tensor: torch.Tensor) -> np.ndarray:
    return tensor.sum(dim=tuple(d for d in range(tensor.ndim) if d != 1), dtype=torch.float64).numpy()


def _sums(tensor: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Sums per head (H,), as :func:`_per_head`, and per block and head (B, H)."""
    per_block = tensor.sum(dim=tuple(range(2, tensor.ndim)), dtype=torch.float64) if tensor.ndim > 2 else tensor.double()
    return _per_head(tensor), per_block.numpy()


def layer_errors(
    scores: torch.Tensor, valid: torch.Tensor, reconstructed: torch.Tensor, mean: torch.Tensor
) -> dict[str, np.ndarray]:
    """Per-head sums over the rows of one batch: squared error, deviation from the mean
    row, squared norm, total variation and KL(w ‖ ŵ) after softmax, and the number of rows.

    Invalid entries are no data: they count nowhere, and softmax runs over valid keys.
    """
    return HeldOutBatch.of(scores, valid, mean).errors(reconstructed)


def _summarise(sums: dict[str, np.ndarray]) -> dict[str, float]:
    safe = lambda numerator, denominator: float(numerator / denominator) if denominator > 0 else float("nan")
    return {
        "rel_error": safe(sums["squared_error"], sums["squared_deviation"]),
        "rel_error_zero": safe(sums["squared_error"], sums["squared_norm"]),
        "tv": safe(sums["tv"], sums["rows"]),
        "kl": safe(sums["kl"], sums["rows"]),
        "num_rows": int(sums["rows"]),
    }


# ---------------------------------------------------------------------- result


class ReconstructResult(Result):
    """``table``: one row per (strategy, scope, k, layer, head), with ``layer = head = -1``
    for the totals over all evaluated heads; ``plug_in`` and ``learned`` tables when asked
    for (``plug_in`` carries ``loss`` only for ``clm``/``mlm``: the ``hidden`` loss of the
    unmodified model is 0, so it would repeat ``loss_increase``, which is 1 − ``token_cosine``);
    ``selections``: the chosen keys of every map, keyed ``strategy/scope/k``."""

    kind = "reconstruct"
    figures_module = "attnlens.figures.reconstruct"
    shown = {
        "table": (
            "strategy", "scope", "k", "layer", "head", "rel_error", "rel_error_low", "rel_error_high", "rel_error_zero", "tv",
            "kl", "flops_ratio",
        ),
        "plug_in": (
            "strategy", "scope", "k", "loss", "loss_increase", "token_cosine", "pooled_cosine", "accuracy", "accuracy_low",
            "accuracy_high", "delta_accuracy",
        ),
    }  # fmt: skip
    column_notes = {
        "rel_error": "held-out ‖s − ŝ‖² / ‖s − μ‖², μ the training mean row (1: no better than the mean row)",
        "rel_error_zero": "held-out ‖s − ŝ‖² / ‖s‖²",
        "tv": "total variation between the weights and the rebuilt rows' weights, mean over rows",
        "flops_ratio": "attention FLOPs with k exact scores per row, against full attention",
    }

    def __init__(
        self,
        meta: dict,
        tables: dict[str, pd.DataFrame],
        arrays: dict[str, np.ndarray] | None = None,
        path: Path | None = None,
        selections: dict[str, np.ndarray] | None = None,
    ) -> None:
        super().__init__(meta, tables, arrays, path)
        self.selections = selections or {}

    plug_in = property(lambda self: self.tables.get("plug_in"))
    learned = property(lambda self: self.tables.get("learned"))

    def _save_extra(self, directory: Path) -> None:
        np.savez_compressed(
            directory / "selections.npz", **{key.replace("/", "|"): value for key, value in self.selections.items()}
        )

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> ReconstructResult:
        with np.load(path / "selections.npz") as data:
            selections = {key.replace("|", "/"): data[key] for key in data.files}
        return cls(meta, tables, arrays, path, selections)

    def summary(self) -> str:
        settings = self.settings
        return f"ks {settings.get('ks')}, strategies {settings.get('strategies')}, scopes {settings.get('scopes')}"

    def text(self) -> str:
        """Held-out errors over all heads per strategy, scope and k; the plug-in runs and learned maps when there are any."""
        overall = self.table[self.table["layer"] == -1].drop(columns=["layer", "head"])
        lines = [format_table(self.view(frame=overall)), *self.notes_for(overall)]
        if self.plug_in is not None:
            lines += ["the model with the reconstruction inside attention (held-out blocks):", format_table(self.view("plug_in"))]
        if self.learned is not None:
            lines += ["maps learned on the objective against the closed form:", format_table(self.learned)]
        return "\n".join(lines)


# ---------------------------------------------------------------------- plug-in and learned R


def reconstruction(maps: dict[int, LayerMaps], key: str = "reconstruct") -> FixedChange:
    """The maps inside attention in their layers, as a change (it reads no tokens): the same
    object judges corpus blocks by the objective and task examples by accuracy."""
    return FixedChange(key, lambda layer, scores, valid: maps[layer].apply(scores), list(maps))


def evaluate_objective(
    objective: Objective, batches: list[PreparedBatch], maps: dict[int, LayerMaps] | None
) -> dict[str, np.ndarray]:
    """Per-block objective metrics with the reconstruction in ``maps``' layers (None: unmodified)."""
    return evaluate_change(objective, batches, [None] * len(batches), None if maps is None else reconstruction(maps))


def learn_maps(
    objective: Objective,
    maps: dict[int, LayerMaps],
    train_ids: np.ndarray,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    progress: Progress,
) -> tuple[dict[int, LayerMaps], float, float]:
    """Fine-tune map weights and offsets on the objective, model frozen, from the closed form.

    Chosen keys stay exact. The best maps seen on the training blocks (the start
    included) are returned, so learning never ends worse than the closed form on them.
    Returns (maps, training loss at the start, best training loss).
    """
    parameters = {
        layer: (m.weights.float().clone().requires_grad_(True), m.offset.float().clone().requires_grad_(True))
        for layer, m in maps.items()
    }
    exact = {layer: exact_mask(m) for layer, m in maps.items()}
    current = lambda: {
        layer: LayerMaps(maps[layer].positions, w * ~exact[layer][0] + exact[layer][1], a * ~exact[layer][2])
        for layer, (w, a) in parameters.items()
    }
    with frozen(objective.model.model):
        return _descend(
            objective,
            maps,
            parameters,
            exact,
            current,
            train_ids,
            steps=steps,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
        )


def _descend(objective, maps, parameters, exact, current, train_ids, *, steps, lr, batch_size, seed, progress):
    optimiser = torch.optim.Adam([p for pair in parameters.values() for p in pair], lr=lr)
    generator = np.random.default_rng(seed)

    # The training loss is measured on a fixed subset of the training blocks, prepared once.
    checked = prepare_batches(objective, train_ids[: 4 * batch_size], batch_size)

    def training_loss() -> float:
        return float(evaluate_objective(objective, checked, current())["loss"].mean())

    best_loss = start_loss = training_loss()
    best = {layer: (w.detach().clone(), a.detach().clone()) for layer, (w, a) in parameters.items()}
    check_every = max(1, steps // 5)
    with progress_bar(total=steps, desc="learn R", unit="step", enabled=progress) as bar:
        for step in range(1, steps + 1):
            chosen = generator.choice(len(train_ids), size=min(batch_size, len(train_ids)), replace=False)
            batch = objective.prepare(torch.from_numpy(train_ids[np.sort(chosen)]))
            layer_maps = current()
            with Capture(list(maps), intervene=lambda layer, scores, valid: layer_maps[layer].apply(scores), record=False):
                loss = objective.evaluate(batch)["loss"].mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            if step % check_every == 0 or step == steps:
                candidate = training_loss()
                if candidate < best_loss:
                    best_loss = candidate
                    best = {layer: (w.detach().clone(), a.detach().clone()) for layer, (w, a) in parameters.items()}
            bar.update(1)
    learned = {
        layer: LayerMaps(maps[layer].positions, w * ~exact[layer][0] + exact[layer][1], a * ~exact[layer][2])
        for layer, (w, a) in best.items()
    }
    return learned, start_loss, best_loss


def exact_mask(maps: LayerMaps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which weights are pinned (rows of chosen keys), their pinned values, and pinned offsets."""
    one_hot = torch.nn.functional.one_hot(maps.positions, maps.weights.shape[-2]).transpose(-1, -2).float()  # (H,Q,n,k)
    pinned_rows = one_hot.sum(-1, keepdim=True) > 0
    pinned = pinned_rows.expand_as(maps.weights)
    values = torch.where(pinned, maps.weights.float(), torch.zeros(()))
    return pinned, values, pinned_rows[..., 0]


# ---------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class ReconstructSettings(CorpusSettings, TaskSettings):
    """Settings of :func:`reconstruct`: ``num_seqs`` blocks of which ``eval_fraction`` are
    held out; the ``ks`` (default 1, 2, 4, … n), key-selection ``strategies``, map
    ``scopes``, ``rows`` (pooled or per query; ``auto`` picks per query for causal
    models) and relative ``ridge`` of the maps; ``layers`` analysed; ``pairs`` mode and
    its ridge; ``plug_in`` (the model run with the reconstruction inside attention, in
    ``plug_in_layers`` and ``plug_in_scopes``) judged by ``objective``; ``learn_r``
    (maps fine-tuned on the objective for ``learn_steps`` at ``learn_lr``). With ``task``
    (:class:`~attnlens.analysis.task.TaskSettings`), the plug-in runs are also judged by
    task accuracy under ``protocol`` (for the strategies in ``task_strategies``, the ``task_ks`` and
    the ``task_scopes``; each ``None``: all of them; each judgement costs a forward of the
    held-out examples at the maps' width, so a report judges only its headline configs).
    ``task_joint_r`` (``finetune`` protocol) also judges each of them with its maps trained
    jointly with the weights from the closed form (:mod:`~attnlens.analysis.reconstruct.joint`):
    the ``joint_`` columns.

    >>> ReconstructSettings(scopes=["head", "row"])
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: scopes row is unknown; use some of head, layer, all
    """

    num_seqs: int = 256
    eval_fraction: float = 0.25
    ks: tuple[int, ...] | None = None
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = SCOPES
    rows: str = "auto"
    ridge: float = 1e-6
    layers: tuple[int, ...] | None = None
    pairs: bool = False
    pairs_ridge: float = 0.1
    plug_in: bool = False
    plug_in_layers: tuple[int, ...] | None = None
    plug_in_scopes: tuple[str, ...] | None = None
    task_strategies: tuple[str, ...] | None = None
    task_ks: tuple[int, ...] | None = None
    task_scopes: tuple[str, ...] | None = None
    task_joint_r: bool = False
    objective: str = "auto"
    learn_r: bool = False
    learn_steps: int = 60
    learn_lr: float = 1e-3
    batch_size: int = 16

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 2, " (some to fit the maps, some to judge them)")
        probability("eval_fraction", self.eval_fraction)
        if self.ks is not None:  # k <= n is checked once n is known (a store's n need not be seq_len)
            check_ks(self.ks, n=max(self.ks, default=0))
        check_strategies(self.strategies)
        for name, scopes in (
            ("scopes", self.scopes),
            ("plug_in_scopes", self.scopes if self.plug_in_scopes is None else self.plug_in_scopes),
            ("task_scopes", SCOPES if self.task_scopes is None else self.task_scopes),
        ):
            bad = [scope for scope in scopes if scope not in SCOPES]
            if bad or not scopes:
                raise BadInput(f"`{name}` {bad[0] if bad else '(none)'} is unknown; use some of {', '.join(SCOPES)}")
        one_of("rows", self.rows, ROW_MODES)
        numbered_from_zero("layers", self.layers)
        numbered_from_zero("plug_in_layers", self.plug_in_layers)
        at_least("ridge", self.ridge, 0)
        at_least("pairs_ridge", self.pairs_ridge, 0)
        one_of("objective", self.objective, OBJECTIVES)
        if self.task_strategies is not None:
            check_strategies(self.task_strategies)
        if self.task_ks is not None:
            check_ks(self.task_ks, n=max(self.task_ks, default=0))
        if self.task_joint_r and self.protocol != "finetune":
            raise BadInput("`task_joint_r` trains the maps with the weights: it needs `protocol` finetune")
        if self.task is not None and not self.plug_in:
            raise BadInput("`task` judges the plug-in runs (the model with the reconstruction inside); add `plug_in`")
        if self.learn_r:
            at_least("learn_steps", self.learn_steps, 1)
            positive("learn_lr", self.learn_lr)


def reconstruct(
    source: str | Path | Store | LoadedModel = "minilm-l6",
    settings: ReconstructSettings | None = None,
    *,
    model: str | LoadedModel | None = None,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> ReconstructResult:
    """Fit reconstruction maps on part of the blocks and measure them on the rest.

    ``source``: a store (then ``model`` is needed for ``plug_in``, and must be the model
    the store was made with) or a model, whose rows are computed over the corpus blocks
    of ``settings`` (:class:`ReconstructSettings`, with keyword ``changes`` applied).
    ``plug_in`` runs the model with the reconstruction inside attention in
    ``plug_in_layers`` (default: all analysed layers) for every strategy and k, and
    every scope in ``plug_in_scopes`` (default: all of ``scopes``).
    ``pairs`` adds pairs mode (:mod:`attnlens.analysis.reconstruct.pairs`, from a store): k·n (query, key)
    pairs of each head's matrix, strategy ``greedy-pairs``. Its fit has about as many
    unknowns as training matrices, so it takes a larger ridge (``pairs_ridge``): near
    the interpolation threshold (k·n ≈ the number of fit sequences) an unregularised fit
    overshoots on held-out matrices.
    """
    s = ReconstructSettings.build(settings, **changes)
    source_rows = open_rows(
        source, corpus=s.corpus, seq_len=s.seq_len, num_seqs=s.num_seqs, seed=s.seed, device=device, moments=False
    )
    plan = _Plan.of(source_rows, s)  # every check that needs the source, before any work
    judged_by_model = s.plug_in or s.learn_r
    objective = Objective(_model_for_plug_in(source_rows, model, device), s.objective, seed=s.seed) if judged_by_model else None
    fitted, evaluated = held_out_split(source_rows.num_seqs, s.eval_fraction, s.seed)
    # Shares of the bars, one after another: the moments' pass is quick beside the maps' evaluation.
    moments_progress, maps_progress, pairs_progress, learn_progress = split(
        progress, 1, 4, 2 if s.pairs else 0, 2 if s.learn_r else 0
    )
    moments = compute_moments(
        source_rows,
        sequences=fitted,
        queries=list(range(plan.n)) if plan.per_query else None,
        layers=plan.layers,
        batch_size=s.batch_size,
        seed=s.seed,
        progress=moments_progress,
    ).total
    fitter = MapFitter(moments, ridge=s.ridge, seed=s.seed, global_positions=(0,))

    plug = _plug_in(objective, source_rows, plan, evaluated, s, maps_progress) if judged_by_model else None
    configs = [(strategy, scope, k) for strategy in plan.strategies for scope in plan.scopes for k in plan.ks]
    table, selections = _evaluate(
        source_rows, fitter, configs, evaluated, plan.layers, s.batch_size, plug, maps_progress, seed=s.seed
    )
    if s.pairs:
        pairs = _evaluate_pairs(
            source_rows, fitter, plan.ks, fitted, evaluated, s.pairs_ridge, plan.head_dim, pairs_progress, seed=s.seed
        )
        table = pd.concat([table, pairs], ignore_index=True)
    tables = {"table": plan.with_flops(table)}
    if s.plug_in:
        tables["plug_in"] = plan.with_flops(pd.DataFrame(plug.records))
    if s.learn_r:
        tables["learned"] = _learned_table(
            objective,
            fitter,
            plan.strategies[0],
            plan.scopes[0],
            plan.ks,
            plug.layers,
            plug.batches,
            source_rows.tokens(fitted),
            s.learn_steps,
            s.learn_lr,
            s.batch_size,
            s.seed,
            learn_progress,
        )
    meta = _metadata(source_rows, plan, s, fitted, evaluated, objective, plug, command)
    return ReconstructResult(meta, tables, selections=selections)


def _plug_in(
    objective: Objective,
    rows: StoreRows | ModelRows,
    plan: _Plan,
    evaluated: np.ndarray,
    s: ReconstructSettings,
    progress: Progress = False,
) -> _PlugIn:
    """The model run with each config's maps inside attention on the held-out blocks (and, with a
    task, its examples padded to the maps' width n; its fine-tunes name their steps on ``progress``);
    with ``learn_r`` alone, the layers and batches it needs."""
    layers = plan.layers if s.plug_in_layers is None else rows.check_layers(s.plug_in_layers)
    scopes = set(plan.scopes if s.plug_in_scopes is None else s.plug_in_scopes) if s.plug_in else set()
    task = None
    if s.task is not None and s.plug_in:
        task = TaskJudge(
            objective.model,
            TaskSettings.of(s),
            seq_len=plan.n,
            batch_size=s.batch_size,
            seed=s.seed,
            pad_to=plan.n,
            progress=progress,
        )
    used = [layer for layer in layers if layer in plan.layers]
    return _PlugIn(
        objective, used, rows.tokens(evaluated), s.batch_size, s.seed, scopes, task, _judged_by_task(s), s.task_joint_r
    )


def _judged_by_task(s: ReconstructSettings) -> Callable[[tuple[str, str, int]], bool]:
    """Whether a (strategy, scope, k) config is judged by the task: its strategy, scope and k each
    among the task's (``None``: any)."""
    wanted = (s.task_strategies, s.task_scopes, s.task_ks)
    return lambda config: all(chosen is None or value in chosen for value, chosen in zip(config, wanted))


def _metadata(rows, plan: _Plan, s: ReconstructSettings, fitted, evaluated, objective, plug, command) -> dict:
    """The result's meta: the source's model and corpus, the settings as run, the task, and the split."""
    settings = {
        **s.to_dict(),
        "ks": plan.ks,
        "strategies": plan.strategies,
        "rows": "per-query" if plan.per_query else "pooled",
        "layers": plan.layers,
        "fit_sequences": len(fitted),
        "eval_sequences": len(evaluated),
        "objective": objective.name if objective is not None else None,
    }
    # Rows of the source (store rows, or blocks of the corpus) the maps were fitted and judged on.
    splits = {
        "fit": fitted.tolist(),
        "eval": evaluated.tolist(),
        "fit_block_index": rows.block_index[fitted].tolist(),
        "eval_block_index": rows.block_index[evaluated].tolist(),
    }
    return result_meta(
        model=rows.model_info,
        corpus=rows.corpus_info,
        settings=settings,
        command=command,
        n=plan.n,
        layers=plan.layers,
        num_heads=rows.num_heads,
        task=plug.task.describe() if plug is not None and plug.task is not None else None,
        splits=splits,
    )


def held_out_split(num_seqs: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fitted, evaluated): a seeded split of ``num_seqs`` rows, ``eval_fraction`` of them (at least one) held out.

    >>> fitted, evaluated = held_out_split(8, 0.25, seed=0)
    >>> len(fitted), len(evaluated), sorted([*fitted, *evaluated]) == list(range(8))
    (6, 2, True)
    """
    order = np.random.default_rng([seed, 1]).permutation(num_seqs)
    evaluated = np.sort(order[: max(1, round(eval_fraction * len(order)))])
    return np.sort(order[len(evaluated) :]), evaluated


@dataclass(frozen=True)
class _Plan:
    """What the settings mean for this source: its n, the ks, layers, strategies and scopes, and the row mode."""

    n: int
    head_dim: int
    ks: list[int]
    layers: list[int]
    strategies: list[str]
    scopes: list[str]
    per_query: bool

    @classmethod
    def of(cls, rows: StoreRows | ModelRows, s: ReconstructSettings) -> _Plan:
        n = rows.n
        causal = bool(rows.model_info["causal"])
        per_query = s.rows == "per-query" or (s.rows == "auto" and causal)
        strategies = list(s.strategies)  # checked by the settings
        if causal and not per_query:
            raise BadInput(
                "the model is causal: rows of different queries have different valid keys; use `rows` per-query (or auto)"
            )
        if not per_query and any(strategy in QUERY_DEPENDENT for strategy in strategies):
            raise BadInput(
                "`strategies` local+global picks keys around each query, so it needs one map per query: add `rows` per-query"
            )
        if s.pairs and not isinstance(rows, StoreRows):
            raise BadInput("pairs mode reads whole score matrices of each sequence from a store; run 'attnlens extract' first")
        return cls(
            n=n,
            head_dim=int(rows.model_info["head_dim"]),
            ks=check_ks(default_ks(n) if s.ks is None else s.ks, n),
            layers=rows.check_layers(s.layers),
            strategies=strategies,
            scopes=list(s.scopes),
            per_query=per_query,
        )

    def with_flops(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` with the attention FLOPs ratio of each row's k beside it."""
        return table.assign(flops_ratio=[attention_flops(self.n, self.head_dim, k)["ratio"] for k in table.k])


def _model_for_plug_in(rows: StoreRows | ModelRows, model: str | LoadedModel | None, device: str) -> LoadedModel:
    if isinstance(rows, ModelRows):
        return rows.model
    if model is None:
        raise BadInput("plug-in evaluation runs the model: give `model` (the model the store was made with)")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    if loaded.weights_sha256() != rows.model_info["weights_sha256"]:
        raise BadInput(
            f"the store was made with model '{rows.model_info['name']}' (weights {rows.model_info['weights_sha256'][:12]}), "
            f"not '{loaded.name}' (weights {loaded.weights_sha256()[:12]}); give the same `model`"
        )
    return loaded


def _held_out(
    rows: StoreRows | ModelRows, evaluated: np.ndarray, layers: list[int], fitter: MapFitter, batch_size: int
) -> dict[int, list[HeldOutBatch]]:
    """The held-out rows of every layer, with what every map's evaluation on them shares."""
    collected: dict[int, tuple[list, list]] = {layer: ([], []) for layer in layers}

    def keep(layer: int, scores: torch.Tensor, valid: torch.Tensor, batch: np.ndarray) -> None:
        collected[layer][0].append(scores.to(torch.float32))
        collected[layer][1].append(valid)

    rows.for_each_batch(evaluated, layers, keep, batch_size=batch_size, progress=False)
    held = {}
    for position, layer in enumerate(fitter.moments.layers):
        scores, valid = torch.cat(collected[layer][0]), torch.cat(collected[layer][1])
        mean = torch.from_numpy(fitter.mean["head"][position][None]).float()  # (1, H, Q, n): training mean row
        held[layer] = [
            HeldOutBatch.of(scores[start : start + batch_size], valid[start : start + batch_size], mean)
            for start in range(0, len(scores), batch_size)
        ]
        collected[layer] = ([], [])
    return held


class _PlugIn:
    """Runs the model with each config's maps inside attention, on the held-out blocks."""

    def __init__(
        self,
        objective: Objective,
        layers: list[int],
        eval_ids: np.ndarray,
        batch_size: int,
        seed: int,
        scopes: set[str],
        task: TaskJudge | None = None,
        judged_by_task: Callable[[tuple[str, str, int]], bool] = lambda config: True,
        joint: bool = False,
    ) -> None:
        self.objective, self.layers, self.scopes, self.task = objective, layers, scopes, task
        self.judged_by_task, self.joint = judged_by_task, joint
        self.seed = seed
        self.batches = prepare_batches(objective, eval_ids, batch_size)
        self.baseline = evaluate_objective(objective, self.batches, None)["loss"] if scopes else None
        self.records: list[dict] = []

    def wants(self, scope: str) -> bool:
        return scope in self.scopes

    def run(self, config: tuple[str, str, int], maps: dict[int, LayerMaps]) -> None:
        strategy, scope, k = config
        used = {layer: maps[layer] for layer in self.layers}
        judged_by_task = self.task is not None and self.judged_by_task(config)
        key = "reconstruct/" + "/".join(map(str, config))
        if judged_by_task:  # a cached fine-tune run is reused only for the very same maps
            key = content_key(key, *[t for m in used.values() for t in (m.positions, m.weights, m.offset)])
        change = reconstruction(used, key)
        metrics = evaluate_change(self.objective, self.batches, [None] * len(self.batches), change)
        record = {
            "strategy": strategy,
            "scope": scope,
            "k": k,
            "layers": " ".join(map(str, self.layers)),
            "objective": self.objective.name,
        }
        metrics = {**metrics, "loss_increase": metrics["loss"] - self.baseline}
        if self.objective.name == "hidden":  # the unmodified loss is 0: loss would repeat loss_increase
            del metrics["loss"]
        for name, values in metrics.items():
            mean, low, high = bootstrap_interval(values[None], seed=self.seed)
            record.update({name: float(mean[0]), f"{name}_low": float(low[0]), f"{name}_high": float(high[0])})
        record["baseline_loss"] = float(self.baseline.mean())
        if judged_by_task:
            record.update(task_columns(self.task.judge(change)))
        if judged_by_task and self.joint:  # the same maps, trained with the weights from the closed form
            from attnlens.analysis.reconstruct.joint import JointMaps  # it builds on this module

            joint = JointMaps(used, scope, f"{key}/joint")
            record.update({f"joint_{name}": value for name, value in task_columns(self.task.judge(joint)).items()})
        self.records.append(record)


def _evaluate(
    rows: StoreRows | ModelRows,
    fitter: MapFitter,
    configs: list[tuple[str, str, int]],
    evaluated: np.ndarray,
    layers: list[int],
    batch_size: int,
    plug: _PlugIn | None,
    progress: Progress,
    seed: int = 0,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Held-out errors of every config (and its plug-in run), one config at a time: each
    config's maps are fitted once and serve both. Beside each error, its 95% interval from
    a bootstrap over the held-out blocks (the same resamples, drawn with ``seed``, for every config)."""
    held = _held_out(rows, evaluated, layers, fitter, batch_size)
    weights = bootstrap_weights(len(evaluated), BOOTSTRAP_RESAMPLES, seed)
    records, selections = [], {}
    with progress_bar(total=len(configs), desc="reconstruct", unit="config", enabled=progress) as bar:
        for config in configs:
            fitted = {layer: fitter.layer_maps(*config, layer) for layer in layers}
            selections["/".join(map(str, config))] = np.stack([chosen for _, chosen in fitted.values()])
            totals, blocks = {}, {}
            for layer, (maps, _) in fitted.items():
                totals[layer], parts = {}, []
                for batch in held[layer]:
                    per_head, per_block = batch.measure(maps.apply(batch.scores))
                    for name, value in per_head.items():
                        totals[layer][name] = totals[layer].get(name, 0) + value
                    parts.append(per_block)
                blocks[layer] = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}  # (E, H)
            records += _error_records(config, totals, blocks, weights)
            if plug is not None and plug.wants(config[1]):
                plug.run(config, {layer: maps for layer, (maps, _) in fitted.items()})
            bar.update(1)
    return pd.DataFrame(records), selections


def _error_records(
    config: tuple[str, str, int],
    totals: dict[int, dict[str, np.ndarray]],
    blocks: dict[int, dict[str, np.ndarray]] | None = None,
    weights: np.ndarray | None = None,
) -> list[dict]:
    """One row per (layer, head), and one (layer = head = -1) for all of them together; with
    the per-block sums ``blocks`` ((E, H) per layer and name) and bootstrap ``weights``
    (:func:`~attnlens.analysis.evaluation.bootstrap_weights`), each error's 95% interval beside it."""
    base = dict(zip(("strategy", "scope", "k"), config))
    records = [
        {**base, "layer": layer, "head": head, **_summarise({name: value[head] for name, value in total.items()})}
        for layer, total in totals.items()
        for head in range(len(total["rows"]))
    ]
    overall = {name: sum(total[name].sum() for total in totals.values()) for name in next(iter(totals.values()))}
    records.append({**base, "layer": -1, "head": -1, **_summarise(overall)})
    if blocks is not None:
        # Units as columns: every (layer, head) in the order of the records, then all of them together.
        per_unit = {name: np.concatenate([blocks[layer][name] for layer in totals], axis=1) for name in overall}
        per_unit = {name: np.column_stack([value, value.sum(1)]) for name, value in per_unit.items()}
        for name, (low, high) in _intervals(per_unit, weights).items():
            for record, low_value, high_value in zip(records, low, high):
                record[f"{name}_low"], record[f"{name}_high"] = float(low_value), float(high_value)
    return records


# What each error is a ratio of: sums over rows, so that a resample's error is the ratio of its resampled sums.
_RATIOS = {
    "rel_error": ("squared_error", "squared_deviation"),
    "rel_error_zero": ("squared_error", "squared_norm"),
    "tv": ("tv", "rows"),
    "kl": ("kl", "rows"),
}
BOOTSTRAP_RESAMPLES = 1000


def _intervals(sums: dict[str, np.ndarray], weights: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Percentile-bootstrap intervals of the errors of :func:`_summarise` over blocks: ``sums``
    per block and unit (E, U), ``weights`` (E, R) how often each block is drawn in each
    resample (divided by E, which the ratios cancel). Returns (low, high), each (U,), per error."""
    tail = (1 - CONFIDENCE) / 2 * 100
    intervals = {}
    for name, (numerator, denominator) in _RATIOS.items():
        top, bottom = sums[numerator].T @ weights, sums[denominator].T @ weights  # (U, R) resampled sums
        # A resample without rows (or deviation) in a unit has no error: the unit gets no interval (NaN).
        ratio = np.divide(top, bottom, out=np.full_like(top, np.nan), where=bottom > 0)
        intervals[name] = tuple(np.percentile(ratio, [tail, 100 - tail], axis=-1))
    return intervals


def _evaluate_pairs(
    rows: StoreRows,
    fitter: MapFitter,
    ks: list[int],
    fitted: np.ndarray,
    evaluated: np.ndarray,
    ridge: float,
    head_dim: int,
    progress: Progress,
    seed: int = 0,
) -> pd.DataFrame:
    """Pairs mode, per head: greedy pairs in the low-rank factor of the fit matrices, error on held-out ones.

    ``rel_error`` uses the same mean-row baseline as rows mode, so the two are comparable;
    its intervals are from the same bootstrap over held-out blocks.
    """
    from attnlens.analysis.eigen import matrix_spectrum
    from attnlens.analysis.reconstruct.pairs import fit_pairs, greedy_pairs

    store, n, layers = rows.store, rows.n, list(fitter.moments.layers)
    records, totals, block_totals = [], {k: {} for k in ks}, {k: {} for k in ks}
    weights = bootstrap_weights(len(evaluated), BOOTSTRAP_RESAMPLES, seed)
    with progress_bar(total=len(layers) * rows.num_heads, desc="pairs", unit="head", enabled=progress) as bar:
        for position, layer in enumerate(layers):
            scores = store.read("scores", layer, 0, store.num_seqs).astype(np.float64)
            valid = store.read("valid", layer, 0, store.num_seqs)
            entries = valid.all(0).ravel()  # entries valid in every sequence
            eval_valid = torch.from_numpy(valid[evaluated])
            for head in range(rows.num_heads):
                flat = scores[:, head].reshape(len(scores), -1)[:, entries]
                values, factor = matrix_spectrum(flat[fitted])
                kept = values > values[0] * 1e-10
                factor = factor[:, kept] * np.sqrt(values[kept])  # covariance = factor factorᵀ
                mean = flat[fitted].mean(0)
                order = greedy_pairs(factor, min(max(ks) * n, len(mean)))
                truth = _as_matrices(flat[evaluated], entries, n)
                baseline = torch.from_numpy(fitter.mean["head"][position, head])[None, None]  # (1, 1, Q, n)
                for k in ks:
                    selected = np.sort(order[: min(k * n, len(mean))])
                    rebuilt = _as_matrices(fit_pairs(factor, mean, selected, ridge).apply(flat[evaluated]), entries, n)
                    part, part_blocks = HeldOutBatch.of(truth, eval_valid, baseline).measure(rebuilt)  # as layer_errors
                    totals[k] = {name: totals[k].get(name, 0) + value for name, value in part.items()}
                    block_totals[k] = {name: block_totals[k].get(name, 0) + value for name, value in part_blocks.items()}
                    flops = pairs_attention_flops(n, head_dim, len(selected), int(kept.sum()))["ratio"]
                    records.append(
                        {
                            "strategy": "greedy-pairs",
                            "scope": "head",
                            "k": k,
                            "layer": layer,
                            "head": head,
                            **_summarise({name: value[0] for name, value in part.items()}),
                            "flops_ratio": flops,
                            **_interval_columns(part_blocks, weights),
                        }
                    )
                bar.update(1)
    frame = pd.DataFrame(records)
    for k in ks:
        flops = float(frame.loc[frame.k == k, "flops_ratio"].mean())
        records.append(
            {
                "strategy": "greedy-pairs",
                "scope": "head",
                "k": k,
                "layer": -1,
                "head": -1,
                **_summarise({name: value.sum() for name, value in totals[k].items()}),
                "flops_ratio": flops,
                **_interval_columns(block_totals[k], weights),
            }
        )
    return pd.DataFrame(records)


def _interval_columns(sums: dict[str, np.ndarray], weights: np.ndarray) -> dict[str, float]:
    """``{error}_low`` and ``{error}_high`` of one unit, from its per-block sums ((E,) or (E, 1) per name)."""
    intervals = _intervals({name: value.reshape(len(value), 1) for name, value in sums.items()}, weights)
    return {f"{name}_{end}": float(bound[0]) for name, bounds in intervals.items() for end, bound in zip(("low", "high"), bounds)}


def _as_matrices(flat: np.ndarray, entries: np.ndarray, n: int) -> torch.Tensor:
    """(E, P) valid entries back to (E, 1, n, n) matrices (zeros elsewhere) for :func:`layer_errors`."""
    full = np.zeros((len(flat), n * n))
    full[:, entries] = flat
    return torch.from_numpy(full.reshape(len(flat), 1, n, n))


def _learned_table(
    objective: Objective,
    fitter: MapFitter,
    strategy: str,
    scope: str,
    ks: list[int],
    layers: list[int],
    batches: list[PreparedBatch],
    train_ids: np.ndarray,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    progress: Progress,
) -> pd.DataFrame:
    records = []
    for k, k_progress in zip(ks, split(progress, *[1] * len(ks))):  # one bar of steps per k
        maps = {layer: fitter.layer_maps(strategy, scope, k, layer)[0] for layer in layers}
        learned, start, best = learn_maps(
            objective, maps, train_ids, steps=steps, lr=lr, batch_size=batch_size, seed=seed, progress=k_progress
        )
        closed = evaluate_objective(objective, batches, maps)["loss"]
        tuned = evaluate_objective(objective, batches, learned)["loss"]
        records.append(
            {
                "strategy": strategy,
                "scope": scope,
                "k": k,
                "objective": objective.name,
                "steps": steps,
                "train_loss_closed_form": start,
                "train_loss_learned": best,
                "eval_loss_closed_form": float(closed.mean()),
                "eval_loss_learned": float(tuned.mean()),
                "eval_gain": float(closed.mean() - tuned.mean()),
            }
        )
    return pd.DataFrame(records)
