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

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.costs import attention_flops, pairs_attention_flops
from attnlens.analysis.evaluation import bootstrap_weights
from attnlens.analysis.objectives import Objective, PreparedBatch
from attnlens.analysis.reconstruct.cost import default_ks, partial_ratio
from attnlens.analysis.reconstruct.errors import (
    BOOTSTRAP_RESAMPLES,
    PAIRS_STRATEGY,
    HeldOutBatch,
    error_records,
    evaluate_pairs,
    layer_errors,
)
from attnlens.analysis.reconstruct.judging import PlugIn, judge_plug_in, model_for_plug_in, prepared_task
from attnlens.analysis.reconstruct.maps import (
    LayerMaps,
    MapFitter,
    evaluate_objective,
    exact_mask,
    learn_maps,
    reconstruction,
)
from attnlens.analysis.reconstruct.result import ReconstructResult
from attnlens.analysis.reconstruct.selection import QUERY_DEPENDENT, check_ks
from attnlens.analysis.reconstruct.settings import ROW_MODES, SCOPES, ReconstructSettings
from attnlens.errors import BadInput
from attnlens.io.provenance import result_meta
from attnlens.io.store import Store
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, progress_bar, split
from attnlens.rows.accumulate import compute_moments
from attnlens.rows.sources import ModelRows, StoreRows, layer_pairs, open_rows, partial_row_layers

# The names other modules, tests and notebooks read here; the modules of the package hold them.
__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "ROW_MODES",
    "SCOPES",
    "HeldOutBatch",
    "LayerMaps",
    "MapFitter",
    "ReconstructResult",
    "ReconstructSettings",
    "attention_flops",
    "default_ks",
    "evaluate_objective",
    "exact_mask",
    "held_out_split",
    "layer_errors",
    "learn_maps",
    "pairs_attention_flops",
    "reconstruct",
    "reconstruction",
]


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
    plan = ReconstructPlan.of(source_rows, s)  # every check that needs the source, before any work
    judged_by_model = s.plug_in.enabled or s.plug_in.learn_r
    objective = (
        Objective(model_for_plug_in(source_rows, model, device), s.plug_in.objective, seed=s.seed, precision=s.precision)
        if judged_by_model
        else None
    )
    # the task, checked and split now: a task that cannot be judged fails before the moments' pass, not after it
    task = (
        prepared_task(objective.model, plan.n, s)
        if objective is not None and s.task.name is not None and s.plug_in.enabled
        else None
    )
    plan = plan.with_structure(source_rows, s)
    fitted, evaluated = held_out_split(source_rows.num_seqs, s.eval_fraction, s.seed)
    # Shares of the bars, one after another: the moments' pass is quick beside the maps' evaluation.
    moments_progress, maps_progress, pairs_progress, learn_progress = split(
        progress, 1, 4, 2 if s.maps.pairs else 0, 2 if s.plug_in.learn_r else 0
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
    fitter = MapFitter(moments, ridge=s.maps.ridge, seed=s.seed, global_positions=(0,))

    plug = judge_plug_in(objective, source_rows, plan, evaluated, s, maps_progress, task) if objective is not None else None
    configs = [(strategy, scope, k) for strategy in plan.strategies for scope in plan.scopes for k in plan.ks]
    table, selections = _evaluate(
        source_rows, fitter, configs, evaluated, plan.layers, s.batch_size, plug, maps_progress, seed=s.seed
    )
    if s.maps.pairs:
        assert isinstance(source_rows, StoreRows), "ReconstructPlan.of refuses pairs mode without a store"
        pairs = evaluate_pairs(
            source_rows, fitter, plan.ks, fitted, evaluated, s.maps.pairs_ridge, plan.head_dim, pairs_progress, seed=s.seed
        )
        table = pd.concat([table, pairs], ignore_index=True)
    tables = {"table": plan.with_flops(table)}
    if s.plug_in.enabled:
        assert plug is not None, "plug_in runs the model"
        tables["plug_in"] = plan.with_flops(pd.DataFrame(plug.records), plug.layers)
    if s.plug_in.learn_r:
        assert objective is not None and plug is not None, "learn_r runs the model"
        tables["learned"] = _learned_table(
            objective,
            fitter,
            plan.strategies[0],
            plan.scopes[0],
            plan.ks,
            plug.layers,
            plug.batches,
            source_rows.tokens(fitted),
            s.plug_in.learn_steps,
            s.plug_in.learn_lr,
            s.batch_size,
            s.seed,
            learn_progress,
        )
    meta = _metadata(source_rows, plan, s, fitted, evaluated, objective, plug, command)
    arrays = plug.task.outcome_arrays() if plug is not None and plug.task is not None else None  # to re-pair any two
    return ReconstructResult(meta, tables, arrays, selections=selections)


def _metadata(rows, plan: ReconstructPlan, s: ReconstructSettings, fitted, evaluated, objective, plug, command) -> dict:
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
class ReconstructPlan:
    """What the settings mean for this source: its n, the ks, layers, strategies and scopes, and the row mode."""

    n: int
    head_dim: int
    ks: list[int]
    layers: list[int]
    strategies: list[str]
    scopes: list[str]
    per_query: bool
    pairs: dict[int, np.ndarray] | None = None  # each analysed layer's (query, key) pairs at n (with_structure)

    @classmethod
    def of(cls, rows: StoreRows | ModelRows, s: ReconstructSettings) -> ReconstructPlan:
        n = rows.n
        causal = bool(rows.model_info["causal"])
        per_query = s.maps.rows == "per-query" or (s.maps.rows == "auto" and causal)
        strategies = list(s.maps.strategies)  # checked by the settings
        if causal and not per_query:
            raise BadInput(
                "the model is causal: rows of different queries have different valid keys; use `rows` per-query (or auto)"
            )
        if not per_query and any(strategy in QUERY_DEPENDENT for strategy in strategies):
            raise BadInput(
                "`strategies` local+global picks keys around each query, so it needs one map per query: add `rows` per-query"
            )
        if s.maps.pairs and not isinstance(rows, StoreRows):
            raise BadInput("pairs mode reads whole score matrices of each sequence from a store; run 'attnlens extract' first")
        return cls(
            n=n,
            head_dim=_head_dim(rows),
            ks=check_ks(default_ks(n) if s.maps.ks is None else s.maps.ks, n),
            layers=rows.check_layers(s.maps.layers),
            strategies=strategies,
            scopes=list(s.maps.scopes),
            per_query=per_query,
        )

    def with_structure(self, rows: StoreRows | ModelRows, s: ReconstructSettings) -> ReconstructPlan:
        """The plan with the pairs each layer computes (found by one forward of one block, so after every
        check that needs none), and one map per query where an encoder's layers are windowed: pooled maps
        would be read at the wrong keys."""
        pairs = layer_pairs(rows, self.layers)
        plan = replace(self, pairs=pairs)
        if self.per_query or s.maps.rows == "per-query":
            return plan
        windowed = partial_row_layers(pairs)
        if windowed and s.maps.rows == "pooled":
            raise BadInput(
                f"layers {', '.join(map(str, windowed))} are windowed: rows of different queries have different valid keys; "
                "use `rows` per-query (or auto)"
            )
        return replace(plan, per_query=True) if windowed else plan

    def with_flops(self, table: pd.DataFrame, layers: list[int] | None = None) -> pd.DataFrame:
        """``table`` with the attention FLOPs ratio of each row's k beside it, counted on the pairs its layers
        compute: the row's ``layer`` (-1: every analysed layer), or without that column ``layers`` (the layers
        the maps ran in; default every analysed layer). Pairs mode's rows keep their own count."""
        ratios: dict[tuple[tuple[int, ...], int], float] = {}  # by (layers, k): rows of strategies and scopes share it
        pairs = self.pairs
        assert pairs is not None, "the FLOPs are counted on the plan with_structure gave"

        def ratio(row) -> float:
            if getattr(row, "strategy", None) == PAIRS_STRATEGY:
                return row.flops_ratio
            at = getattr(row, "layer", -1)
            key = (tuple(layers or self.layers) if at == -1 else (int(at),), int(row.k))
            if key not in ratios:
                ratios[key] = partial_ratio(np.stack([pairs[layer] for layer in key[0]]), self.head_dim, key[1])
            return ratios[key]

        return table.assign(flops_ratio=[ratio(row) for row in table.itertuples()])


def _head_dim(rows: StoreRows | ModelRows) -> int:
    """The head dimension of the source's model, as its description records it."""
    head_dim = rows.model_info["head_dim"]
    assert isinstance(head_dim, int), "a model's description records its head_dim as an integer"
    return head_dim


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


def _evaluate(
    rows: StoreRows | ModelRows,
    fitter: MapFitter,
    configs: list[tuple[str, str, int]],
    evaluated: np.ndarray,
    layers: list[int],
    batch_size: int,
    plug: PlugIn | None,
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
            totals: dict[int, dict[str, np.ndarray]] = {}  # by layer: each sum over the held-out rows, per head
            blocks: dict[int, dict[str, np.ndarray]] = {}  # by layer: the same per held-out block (E, H)
            for layer, (maps, _) in fitted.items():
                totals[layer], parts = {}, []
                for batch in held[layer]:
                    per_head, per_block = batch.measure(maps.apply(batch.scores))
                    for name, value in per_head.items():
                        totals[layer][name] = totals[layer].get(name, 0) + value
                    parts.append(per_block)
                blocks[layer] = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}  # (E, H)
            records += error_records(config, totals, blocks, weights)
            if plug is not None and plug.wants(config[1]):
                with plug.task.moving(bar) if plug.task is not None else contextlib.nullcontext():
                    plug.run(config, {layer: maps for layer, (maps, _) in fitted.items()})
            bar.update(1)
    return pd.DataFrame(records), selections


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
