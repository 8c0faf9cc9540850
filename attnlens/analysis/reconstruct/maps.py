"""The reconstruction maps: fitted in closed form from the rows' moments (:class:`MapFitter`),
put inside attention as a change (:func:`reconstruction`), and fine-tuned on an objective
(:func:`learn_maps`).

For a unit (a head, a layer or all of them; one query position or all) that computes the
keys S exactly, the map is the affine least-squares estimate of the other scores,
``ŝ = μ + C[:, S] (C[S, S] + ridge)⁻¹ (s_S − μ_S)``, with ``ŝ_S = s_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnlens.analysis.changes import FixedChange
from attnlens.analysis.evaluation import evaluate_change, frozen, prepare_batches
from attnlens.analysis.objectives import Objective, PreparedBatch
from attnlens.analysis.reconstruct.selection import (
    greedy_path,
    leverage_positions,
    local_global_positions,
    random_order,
    stride_positions,
)
from attnlens.analysis.reconstruct.settings import SCOPES
from attnlens.models.capture import Capture
from attnlens.models.partial import rebuild_from
from attnlens.progress import Progress, progress_bar
from attnlens.rows.moments import Moments

_LEVEL_OF_SCOPE = {"head": "head", "layer": "layer", "all": "model"}


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

    def __init__(
        self, moments: Moments, *, ridge: float, seed: int, global_positions: tuple[int, ...], most_keys: int | None = None
    ) -> None:
        self.moments = moments
        self.most_keys = most_keys  # the largest k a selection is asked for (None: any): the greedy path stops there
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
        queries = self.moments.queries  # None when the moments pool every query
        return queries[q] if queries is not None else -1

    def order(self, strategy: str, scope: str) -> np.ndarray:
        """Nested selection orders (units…, n) for greedy and random, computed once."""
        key = (strategy, scope)
        if key not in self._orders:
            covariance, complete = self.covariance[scope], self.complete[scope]
            shape = covariance.shape[:3]
            flat_cov, flat_ok = covariance.reshape(-1, self.n, self.n), complete.reshape(-1, self.n)
            if strategy == "greedy":  # in batches of units with about as many candidates (a batch stops at its most)
                by_candidates = np.argsort(flat_ok.sum(1), kind="stable")
                order = np.zeros((len(flat_cov), self.n), dtype=np.int64)
                for i in range(0, len(flat_cov), 256):
                    batch = by_candidates[i : i + 256]
                    order[batch] = greedy_path(flat_cov[batch], flat_ok[batch], self.most_keys)[0]
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
        assert self.most_keys is None or m <= self.most_keys, "the fitter was told the largest k it serves"
        if strategy in ("greedy", "random"):
            return np.sort(self.order(strategy, scope)[unit][:m])
        if strategy == "stride":
            return keys[stride_positions(len(keys), m)]
        if strategy == "eigen":
            return leverage_positions(self.covariance[scope][unit], m, self.complete[scope][unit])
        query = self._query(unit[2])
        return local_global_positions(self.n, m, query, self.global_positions, keys=keys)

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
