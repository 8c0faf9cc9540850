"""The report's claims: the papers' claims beside what this model shows, one row per claim, as
text (the page's summary table and the README's claims section, :func:`claims`).

Self-contained: the rows and every helper they need are here. The page's sections borrow a
few of them (:func:`number`, the task of the report, the per-layer spectra and how a DAM
run ended) so that the page and its claims say the same numbers the same way.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.analysis.dam.result import polished
from attnlens.report.plan import plan_claims

CLAIM_COLUMNS = ["claim", "papers report", "measured here (proxy)", "task accuracy here"]
SEEDS_COLUMN = "trained with the change"  # with fine-tune seeds: the mean over seeds, the interval across them


def claims(results: dict) -> pd.DataFrame:
    """The papers' claims beside what this model shows: one row per claim, as text (the
    report's summary table, and the README's claims section)."""
    rows = [*_eigen_claims(results), *_reconstruct_claims(results["reconstruct"])]
    rows += _importance_claims(results["importance"], results["dam"])
    rows += plan_claims(results["plan"]) if "plan" in results else []
    columns = CLAIM_COLUMNS + ([SEEDS_COLUMN] if _seeded(results) else [])
    return pd.DataFrame([(*row, "", "")[: len(columns)] for row in rows], columns=columns)


def _seeded(results: dict) -> bool:
    """Whether the task fine-tuned each change with several seeds (then claims say so across seeds)."""
    task = _task_meta(results)
    return bool(task) and task["protocol"] == "finetune" and task["settings"]["seeds"] > 1


# ---------------------------------------------------------------------- shared with the sections


def number(value: float, digits: int = 2, *, sign: bool = False, percent: bool = False, significant: bool = False) -> str:
    """Every number the report's claims print, rounded one way: ``digits`` decimals (of the
    percentage with ``percent``), or ``digits`` significant digits; ``sign`` prints + too.

    >>> number(0.23849), number(0.0116, 3, sign=True, significant=True), number(0.9123, 1, percent=True)
    ('0.24', '+0.0116', '91.2%')
    """
    value = float(value)
    if percent:
        return f"{100 * value:{'+' if sign else ''}.{digits}f}%"
    spec = f"{'+' if sign else ''}{'#' if significant else ''}.{digits}{'g' if significant else 'f'}"  # '#': keep trailing zeros
    return f"{value:{spec}}"


def _task_meta(results: dict) -> dict | None:
    """The task that judged the report's changes (the same one in every stage), if any."""
    return next((result.meta.get("task") for result in results.values() if result.meta.get("task")), None)


def _layer_summary(eigen_result) -> pd.DataFrame:
    table = eigen_result.table
    heads = table[(table["level"] == "head") & (table["query"] == table["query"].max())]
    per_layer = heads.groupby("layer").agg(
        head_k90_median=("k90", "median"),
        head_k90_min=("k90", "min"),
        head_k90_max=("k90", "max"),
        baseline_k90=("baseline_k90", "median"),
        head_effective_rank=("effective_rank", "median"),
        ones_fraction=("ones_fraction", "median"),
    )
    pooled = table[(table["level"] == "layer") & (table["query"] == table["query"].max())]
    layers = pooled.set_index("layer")[["k90", "k95", "k99"]].add_prefix("pooled_")
    return per_layer.join(layers).reset_index()


def _steps(row: pd.Series) -> str:
    """How a run ended: "schedule annealed in 212 steps, converged" (the check found nothing better)
    or "schedule capped at 300 steps, not converged" (its loss still fell); a polished run adds the
    swap search's end: "..., then 6 swaps to a local optimum"."""
    ended = "annealed in" if row.get("schedule_end") == "annealed" else "capped at"
    said = f"schedule {ended} {int(row['steps'])} steps"
    if polished(row):
        relaxed = "converged" if bool(row["relaxed_converged"]) else "not converged"
        ending = "a local optimum" if bool(row["converged"]) else "its round cap, not converged"
        return f"{said} ({relaxed}), then {int(row['polish_swaps'])} swaps to {ending}"
    return f"{said}, {'converged' if bool(row['converged']) else 'not converged'}"


# ---------------------------------------------------------------------- eigen and overlap


def _eigen_claims(results: dict) -> list[tuple[str, ...]]:
    eigen_result, overlap_result = results["eigen"], results["overlap"]
    layers = _layer_summary(eigen_result)
    n = eigen_result.n
    level = number(overlap_result.meta["level"])
    split = overlap_result.split_half
    own = split[(split["result"] == 0) & (split["level"] == "layer")]
    determined = ", ".join(f"L{row.layer} {row.stable_dim}" for row in own.itertuples())
    pairs = overlap_result.pairs
    within = pairs[pairs["comparison"] == "layers_0"]
    adjacent = within[within["layer_b"] == within["layer_a"].map(_next_layer(eigen_result.meta["layers"]))]
    neighbours = ", ".join(f"L{row.layer_a}–L{row.layer_b} {_at_d(row)}" for row in adjacent.itertuples())
    rows = [
        (
            "Score rows are low-dimensional (paper 1)",
            "most variance in a few of n directions",
            f"median over heads of components for 90% energy: {number(layers.head_k90_median.min(), 0)}–"
            f"{number(layers.head_k90_median.max(), 0)} of n = {n} per layer (Gaussian baseline: "
            f"{number(layers.baseline_k90.median(), 0)}); heads pooled per layer: "
            + ", ".join(number(value, 0) for value in layers.pooled_k90),
        ),
        (
            "Eigenspaces overlap across layers (paper 1)",
            "strong overlap of top eigenspaces",
            f"each layer's subspace is determined by the data (split-half overlap ≥ {level}) up to d = {determined}; "
            f"adjacent layers compared at the smaller of their d: {neighbours or 'one layer only'}",
        ),
    ]
    cross = pairs[pairs["comparison"] == "layers_0_1"]
    if len(cross):
        model = pairs[pairs["comparison"] == "model_0_1"].iloc[0]
        best = cross[cross["d"] > 1].sort_values("overlap", ascending=False).head(3)
        models = overlap_result.meta["models"]
        rows.append(
            (
                "…and across models (paper 1)",
                "overlap between different models",
                f"{models[0]} × {models[1]}, model-level subspaces: {_at_d(model)}; closest layer pairs determined "
                "beyond d = 1: "
                + (", ".join(f"L{row.layer_a} × L{row.layer_b} {_at_d(row)}" for row in best.itertuples()) or "none"),
            )
        )
    return rows


def _next_layer(layers: list[int]) -> dict[int, int]:
    return dict(zip(layers[:-1], layers[1:]))


def _at_d(row) -> str:
    """``0.89 at d = 11 (split-half 0.99 / 0.91, chance 0.09)``: one pair at its determined d."""
    if not row.d:
        return "no d the data determine for both"
    return (
        f"{number(row.overlap)} at d = {row.d} (split-half {number(row.split_half_a)} / {number(row.split_half_b)}, "
        f"chance {number(row.chance)})"
    )


# ---------------------------------------------------------------------- reconstruction


def _reconstruct_claims(recon) -> list[tuple[str, ...]]:
    rows = []
    overall = recon.table[(recon.table.layer == -1)]
    heads = recon.table[recon.table.layer >= 0]
    for k in (16, 32):
        pick = overall[(overall.strategy == "greedy") & (overall.scope == "head") & (overall.k == k)]
        if len(pick):
            row = pick.iloc[0]
            per_head = heads[(heads.strategy == "greedy") & (heads.scope == "head") & (heads.k == k)].rel_error
            q1, median, q3 = np.percentile(per_head, [25, 50, 75])
            rows.append(
                (
                    f"k = {k} exact scores suffice (paper 1)",
                    "k = 16–32 enough; up to 45% fewer attention FLOPs",
                    f"greedy, per-head map: held-out relative error (vs mean row) {number(row.rel_error, 3)} over all heads "
                    f"(weighted by their variance); the typical head: median {number(median)} [quartiles {number(q1)}, "
                    f"{number(q3)}] of {len(per_head)} heads; vs zero {number(row.rel_error_zero, 3)}, TV {number(row.tv, 3)}; "
                    f"attention FLOPs ×{number(row.flops_ratio)}",
                )
            )
    plug = recon.plug_in
    if plug is None:
        return rows
    for k in (16, 32):
        pick = plug[(plug.strategy == "greedy") & (plug.scope == "head") & (plug.k == k)]
        if len(pick):
            row = pick.iloc[0]
            measured = (
                f"cosine of final hidden states {number(row.token_cosine, 4)}"
                if row.objective == "hidden"
                else f"{row.objective} loss {number(row.loss_increase, 3, sign=True)} nats"
            )
            rows.append(
                (
                    f"Model outputs with k = {k} in every layer (paper 1)",
                    "MNLI 79.7% at k = 32 vs 81.6% full",
                    measured,
                    *_reconstruct_task(plug, k),
                )
            )
    return rows


MAP_SCOPES = {"head": "per-head maps", "layer": "per-layer R", "all": "shared R"}


def _reconstruct_task(plug: pd.DataFrame, k: int) -> list[str]:
    """The task's judgements of greedy keys at ``k``, one per judged scope, R fixed and (where judged)
    R trained jointly: the task cell, and with fine-tune seeds the "trained with the change" cell."""
    if "accuracy" not in plug:
        return [""]
    judged = plug[(plug.strategy == "greedy") & (plug.k == k)].dropna(subset=["accuracy"])
    kinds = [("R fixed: ", ""), ("R joint: ", "joint_")] if "joint_accuracy" in plug else [("", "")]
    named = [(f"{MAP_SCOPES[row['scope']]}, {label}", row, prefix) for _, row in judged.iterrows() for label, prefix in kinds]
    if len(named) == 1:  # one judgement: nothing to tell apart
        named = [("", row, prefix) for _, row, prefix in named]
    cells = ["; ".join(name + _task_number(row, prefix) for name, row, prefix in named)]
    if "accuracy_seeds" in plug:
        cells.append("; ".join(name + _seeds_number(row, prefix) for name, row, prefix in named))
    return cells


# ---------------------------------------------------------------------- task judgements in words


def _task_number(row: pd.Series, prefix: str = "") -> str:
    """``0.742 [0.700, 0.780], Δ −0.010 [−0.030, +0.010] (unmodified 0.750)``: a task judgement in
    one phrase, its intervals over held-out examples (``prefix``: of the ``joint_`` columns)."""
    value = lambda name: row[f"{prefix}{name}"]
    return (
        f"{number(value('accuracy'), 3)} [{number(value('accuracy_low'), 3)}, {number(value('accuracy_high'), 3)}], "
        f"Δ {number(value('delta_accuracy'), 3, sign=True)} [{number(value('delta_accuracy_low'), 3, sign=True)}, "
        f"{number(value('delta_accuracy_high'), 3, sign=True)}] (unmodified {number(value('unmodified_accuracy'), 3)})"
    )


def _seeds_number(row: pd.Series, prefix: str = "") -> str:
    """``0.742, Δ −0.010 [−0.030, +0.010] over 3 seeds (0.74 0.75 0.73)``: fine-tuned with the change,
    the mean over seeds and t intervals across seeds (each seed's accuracy in brackets)."""
    value = lambda name: row[f"{prefix}{name}"]
    each = value("seed_accuracies").split()
    return (
        f"{number(value('accuracy_seeds'), 3)}, Δ {number(value('delta_seeds'), 3, sign=True)} "
        f"[{number(value('delta_seeds_low'), 3, sign=True)}, {number(value('delta_seeds_high'), 3, sign=True)}] over "
        f"{len(each)} seeds ({' '.join(number(float(v), 3) for v in each)})"
    )


def _interval(row: pd.Series, prefix: str = "delta") -> str:
    """``+0.012 [+0.010, +0.014]``: a mean and its 95% interval."""
    values = (number(row[name], 3, sign=True, significant=True) for name in (prefix, f"{prefix}_low", f"{prefix}_high"))
    return "{} [{}, {}]".format(*values)


# ---------------------------------------------------------------------- importance and DAM

MIN_REMOVED = 0.001  # classes removing fewer of the valid positions are not ranked as "cheapest"

# The unit of a change of each objective, for the summary's sentences.
LOSS_UNITS = {"hidden": "(1 − token cosine)", "clm": "nats of next-token loss", "mlm": "nats of masked-token loss"}


def _class_task(importance_result, name: str) -> list[str]:
    """The task judgement of removing class ``name`` everywhere, beside its random control (and with
    fine-tune seeds, the same across seeds)."""
    table = importance_result.tables.get("task")
    if table is None:
        return [""]
    rows = table[(table["scope"] == "model") & (table["class"] == name)].set_index("control")
    if "class" not in rows.index:
        return [""]
    own, random = rows.loc["class"], rows.loc["random"]
    cells = [
        f"{name}: {_task_number(own)}; random control Δ {number(random['delta_accuracy'], 3, sign=True)} "
        f"[{number(random['delta_accuracy_low'], 3, sign=True)}, {number(random['delta_accuracy_high'], 3, sign=True)}]"
    ]
    if "accuracy_seeds" in table:
        cells.append(f"{name}: {_seeds_number(own)}; random control: {_seeds_number(random)}")
    return cells


def _importance_claims(importance_result, dam_result) -> list[tuple[str, ...]]:
    table = importance_result.table[importance_result.table["occurs"]]
    unit = LOSS_UNITS[importance_result.meta["settings"]["objective"]]
    # A class that removes next to nothing (a causal model's last position is a key of one
    # query only) costs nothing by construction; the cheapest is sought among the others.
    substantial = table[table["removed"] >= MIN_REMOVED]
    cheapest = (substantial if len(substantial) else table).sort_values("delta").iloc[0]
    skipped = ", ".join(table.loc[table["removed"] < MIN_REMOVED, "class"])
    rows = [
        (
            "Removing a position class (paper 2)",
            "the diagonal (self) matters least; removing it costs nothing",
            f"cheapest class to remove: {cheapest['class']}, {_interval(cheapest)} {unit} for {number(cheapest['removed'], 1, percent=True)} of "
            f"positions; removing as many random positions: {_interval(cheapest, 'random')}"
            + (f" ({skipped}: under {number(MIN_REMOVED, 1, percent=True)} of positions, not ranked)" if skipped else ""),
            *_class_task(importance_result, cheapest["class"]),
        )
    ]
    if "self" in set(table["class"]):
        own = table[table["class"] == "self"].iloc[0]
        rank = int((substantial["delta"] < own["delta"]).sum()) + 1
        rows.append(
            (
                "…the diagonal in particular (paper 2)",
                "the diagonal can be removed without loss",
                f"self: {_interval(own)} {unit}, rank {rank} of {len(substantial)} classes from the cheapest; "
                f"as many random positions: {_interval(own, 'random')}",
                *_class_task(importance_result, "self"),
            )
        )
    return rows + _dam_claims(dam_result, unit)


def _dam_claims(dam_result, unit: str) -> list[tuple[str, ...]]:
    settings = dam_result.meta["settings"]
    frozen = "weights trained alongside" if settings["train_weights"] else "model frozen"
    runs = "; ".join(
        f"{number(row['sparsity'], 1, percent=True)} sparsity (sampled masks {number(row['expected_sparsity'], 0, percent=True)}, "
        f"rows rescued {number(row['rows_rescued'], 1, percent=True)}): {_interval(row)} {unit}, {_steps(row)}"
        for _, row in dam_result.table.iterrows()
    )
    sparse = dam_result.table.iloc[dam_result.nearest(0.9)]
    keep = dam_result.keep_summary
    keep = keep[(keep["lambda"] == sparse["lambda"]) & (keep["same_as"] == keep["class"])]
    same = dam_result.meta.get("equal_by_construction", {})
    names = {name: " = ".join([name, *[other for other, first in same.items() if first == name]]) for name in keep["class"]}
    kept = ", ".join(
        f"{names[row['class']]} {number(row['keep_probability'])}"
        for _, row in keep.sort_values("keep_probability", ascending=False).iterrows()
    )
    rows = [
        (
            "Learned masks (DAM, paper 2)",
            "fine-tuned: DAM_s 91.2% sparsity at GLUE 80.9; DAM_u 78.9% at 82.0",
            f"{settings['variant']}, {frozen}: {runs}.{_seed_spread(dam_result, unit)}{_reference(dam_result, unit)} "
            f"Keep-probability per class at {number(sparse['sparsity'], 0, percent=True)}"
            f"{' (first seed)' if 'mask_seed' in dam_result.table else ''}: {kept}"
            + (" (a = b: equal by construction)" if same else ""),
            *_dam_task(dam_result),
        )
    ]
    across = dam_result.across_seeds()
    if len(dam_result.patterns) and across:
        rows.append(
            (
                "Fixed sparse patterns (paper 2)",
                "worse than DAM at similar sparsity (e.g. BigBird 93.2% / 79.4)",
                _compared_across_seeds(across["compared"]),
                *_patterns_task(dam_result),
            )
        )
    elif len(dam_result.patterns):
        compared = dam_result.compared()
        said = []
        for _, group in compared.groupby("lambda", sort=False):
            parts = [
                f"{row['scope']} {row['pattern']}({int(row['value'])}) at {number(row['sparsity'], 1, percent=True)}: "
                f"{_interval(row)}, DAM − pattern {_interval(row, 'difference')} ({row['verdict']})"
                for _, row in group.iterrows()
            ]
            said.append(f"at {number(group['dam_sparsity'].iloc[0], 0, percent=True)}: " + "; ".join(parts))
        rows.append(
            (
                "Fixed sparse patterns (paper 2)",
                "worse than DAM at similar sparsity (e.g. BigBird 93.2% / 79.4)",
                " | ".join(said) if said else "no pattern within 3 points of a mask's sparsity",
                *_patterns_task(dam_result),
            )
        )
    return rows


def _seed_spread(dam_result, unit: str) -> str:
    """ " Across 3 seeds at 90%: median ..., from ... to ... (t interval ...)." or nothing with one seed."""
    across = dam_result.across_seeds()
    if not across:
        return ""
    parts = [
        f"at {number(row['target_sparsity'], 0, percent=True)}, {row['seeds']} seeds: Δ median {number(row['delta_median'])}, "
        f"from {number(row['delta_min'])} to {number(row['delta_max'])} {unit} (mean {number(row['delta'])}, t interval "
        f"[{number(row['delta_seeds_low'])}, {number(row['delta_seeds_high'])}]), {row['converged']} converged, "
        + _agreement(row)
        for _, row in across["delta"].iterrows()
    ]
    return " Across seeds " + "; ".join(parts) + "."


def _agreement(row: pd.Series) -> str:
    """ "seeds agree" or "seeds disagree (seed 2 − seed 0 +0.025 [+0.018, +0.032]): not one result"."""
    if bool(row["agree"]):
        return "seeds agree"
    first, second = row["apart_seeds"].split(" − ")
    return f"seeds disagree (seed {first} − seed {second} {_interval(row, 'apart')}): not one result"


def _reference(dam_result, unit: str) -> str:
    """ " Swap search from the band at 90%: Δ ...; DAM − search ... (on par)." or nothing without one."""
    table = dam_result.tables.get("reference")
    if table is None:
        return ""
    parts = []
    for _, group in table.groupby(["start", "delta"], sort=False):  # one search from the band serves every seed
        first = group.iloc[0]
        against = ", ".join(f"{_interval(row, 'difference')} ({row['verdict']})" for _, row in group.iterrows())
        parts.append(f"{first['start']} start, {int(first['swaps'])} swaps: Δ {_interval(first)} {unit}; DAM − search {against}")
    return " Swap search at the same sparsity (reference): " + "; ".join(parts) + "."


def _compared_across_seeds(table: pd.DataFrame) -> str:
    """Each scope's best pattern against every seed's mask: the differences and the combined verdict."""
    return " | ".join(
        f"at {number(row['target_sparsity'], 0, percent=True)}, {row['scope']} {row['patterns']}: DAM − pattern "
        f"{number(row['difference'])} (seeds {number(row['difference_min'])} to {number(row['difference_max'])}; "
        f"per seed {row['verdicts']}) → {row['verdict']}"
        for _, row in table.iterrows()
    )


def _dam_task(dam_result) -> list[str]:
    """Every mask judged by the task: its accuracy and paired Δ (and with fine-tune seeds, across seeds)."""
    table = dam_result.tables.get("task")
    if table is None:
        return [""]
    masks = table[table["kind"] == "dam"]
    trained = f" (trained on {dam_result.meta['settings']['trained_on']})"
    name = lambda row: (
        f"mask at {number(row['sparsity'], 1, percent=True)} ({number(row['task_sparsity'], 1, percent=True)} of the task's positions)"
    )
    cells = ["; ".join(f"{name(row)}: {_task_number(row)}" for _, row in masks.iterrows()) + trained]
    if "accuracy_seeds" in table:
        cells.append("; ".join(f"{name(row)}: {_seeds_number(row)}" for _, row in masks.iterrows()))
    return cells


def _patterns_task(dam_result) -> list[str]:
    """Each mask against the patterns it is compared with, by task accuracy, paired over examples (and
    with fine-tune seeds, paired by seed)."""
    table = dam_result.tables.get("task_compared")
    if table is None or not len(table):
        return [""]
    # a pattern that is the best of its family and of all is one comparison: said once, under both scopes
    scopes = table.groupby(["lambda", "pattern", "value"], sort=False)["scope"].transform(" = ".join)
    table = table.assign(scope=scopes).drop_duplicates(["lambda", "pattern", "value"])
    name = lambda row: (
        f"at {number(row['dam_task_sparsity'], 0, percent=True)}: DAM − {row['scope']} {row['pattern']}({int(row['value'])}) "
        f"({number(row['task_sparsity'], 0, percent=True)} of the task's positions)"
    )
    cells = ["; ".join(f"{name(row)} {_interval(row, 'difference')} ({row['verdict']})" for _, row in table.iterrows())]
    if "difference_seeds" in table:
        cells.append("; ".join(f"{name(row)} {_interval(row, 'difference_seeds')} across seeds" for _, row in table.iterrows()))
    return cells
