"""Eigen analysis of moments computed beforehand (``attnlens moments``, ``attnlens merge``): the rows were
chosen then; ``layers`` and ``queries`` may pick among theirs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlens.analysis.eigen.notes import last_direction_notes
from attnlens.analysis.eigen.result import EigenResult
from attnlens.analysis.eigen.settings import EigenSettings
from attnlens.analysis.eigen.units import analyse_moments
from attnlens.errors import BadInput
from attnlens.io.provenance import provenance
from attnlens.progress import Progress
from attnlens.rows.moments import HalfMoments, Moments


def eigen_of_moments(source: str | Path, settings: EigenSettings, *, progress: Progress, command: str | None) -> EigenResult:
    """:func:`eigen` of merged moments (see there)."""
    from attnlens.rows.partials import load_moments

    if settings.full_matrices:
        raise BadInput(f"`full_matrices` analysis reads the matrices of each sequence from a store; {source} holds moments only")
    merged = load_moments(source)
    made = merged.settings
    if settings.quantity is not None and settings.quantity != made["quantity"]:
        raise BadInput(
            f"the moments in {source} are of {made['quantity']}, not {settings.quantity}; the `quantity` is chosen when the "
            f"moments are computed: attnlens moments --quantity {settings.quantity}"
        )
    if (settings.per_query or settings.queries is not None) and made["queries"] is None:
        raise BadInput(
            f"the moments in {source} pool rows over queries; compute per-query moments (moments with `per_query` or `queries`)"
        )
    halves = _select(merged.halves, settings.layers, settings.queries, source)
    n = made["n"]
    table, arrays = analyse_moments(
        halves,
        centred=settings.centred,
        project_ones=settings.project_ones,
        keep=settings.keep,
        seed=settings.seed,
        progress=progress,
    )
    meta = {
        "model": merged.meta["model"],
        "corpus": merged.meta["corpus"],
        "n": n,
        "layers": list(halves.a.layers),
        "num_heads": halves.a.num_heads,
        "settings": {
            **settings.to_dict(),
            "quantity": made["quantity"],
            "corpus": merged.meta["corpus"].get("source"),
            "seq_len": n,
            "num_seqs": made["num_seqs"],
            "seed": settings.seed,
            "queries": None if halves.a.queries is None else list(halves.a.queries),
            "keep": min(settings.keep, n),
        },
        "moments": {
            "path": str(merged.path),
            "num_seqs": made["num_seqs"],
            "seed": made["seed"],
            "accumulate": made["accumulate"],
            "run": merged.meta.get("run"),
        },
        **provenance(command),
    }
    notes = last_direction_notes(table)
    if notes:
        meta["notes"] = notes
    return EigenResult(meta, {"table": table}, arrays)


def _select(halves: HalfMoments, layers: tuple[int, ...] | None, queries: tuple[int, ...] | None, source: object) -> HalfMoments:
    """The chosen layers and query positions of (memory-mapped) moments: without a choice the
    moments stay mapped; a choice reads the chosen units into memory. (Query positions are chosen
    only among per-query moments: :func:`eigen_of_moments` refuses them for pooled ones.)"""
    moments = halves.a
    held = None if moments.queries is None else list(moments.queries)  # None: rows pooled over queries
    if layers is None and (queries is None or list(queries) == held):
        return halves
    kept = list(moments.layers) if layers is None else sorted(set(layers))
    missing = [layer for layer in kept if layer not in moments.layers]
    if missing:
        raise BadInput(f"layer {missing[0]} is not in the moments in {source}; they hold layers {list(moments.layers)}")
    chosen = held if queries is None or held is None else sorted(set(queries))
    if held is not None and chosen is not None:
        absent = [q for q in chosen if q not in held]
        if absent:
            raise BadInput(f"query {absent[0]} is not in the moments in {source}; they hold query positions {held}")
    layer_at = [moments.layers.index(layer) for layer in kept]
    query_at = [0] if held is None or chosen is None else [held.index(q) for q in chosen]

    def pick(part: Moments) -> Moments:
        take = lambda array: np.take(np.take(array, layer_at, axis=0), query_at, axis=2)
        return Moments(
            part.quantity,
            part.n,
            tuple(kept),
            part.num_heads,
            None if part.queries is None or chosen is None else tuple(chosen),
            count=take(part.count),
            key_count=take(part.key_count),
            sum=take(part.sum),
            sum_outer=take(part.sum_outer),
        )

    return HalfMoments(pick(halves.a), pick(halves.b))
