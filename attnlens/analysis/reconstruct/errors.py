"""Held-out errors of the maps: sums over held-out rows per head and per block, the errors
they make (against the mean row and against zero, and after softmax), and their bootstrap
intervals over blocks; pairs mode's errors (:mod:`attnlens.analysis.reconstruct.pairs`) alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.costs import pairs_attention_flops
from attnlens.analysis.evaluation import CONFIDENCE, bootstrap_weights
from attnlens.analysis.reconstruct.maps import MapFitter
from attnlens.analysis.reconstruct.pairs import fit_pairs, greedy_pairs
from attnlens.analysis.spectra import matrix_spectrum
from attnlens.progress import Progress, progress_bar
from attnlens.rows.sources import StoreRows

PAIRS_STRATEGY = "greedy-pairs"  # pairs mode's rows (k·n pairs of each matrix), counted by their own FLOPs


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


def error_records(
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
        assert weights is not None, "per-block sums come with the bootstrap weights that resample them"
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


def evaluate_pairs(
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
    store, n, layers = rows.store, rows.n, list(fitter.moments.layers)
    records: list[dict] = []
    totals: dict[int, dict[str, np.ndarray]] = {k: {} for k in ks}  # by k: each sum over the heads so far
    block_totals: dict[int, dict[str, np.ndarray]] = {k: {} for k in ks}  # by k: the same per held-out block
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
                    flops = pairs_attention_flops(n, head_dim, len(selected), int(kept.sum()), int(entries.sum()))["ratio"]
                    records.append(
                        {
                            "strategy": PAIRS_STRATEGY,
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
                "strategy": PAIRS_STRATEGY,
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
