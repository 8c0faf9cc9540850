"""The report's claims: each question of the two papers with its verdict here, in one phrase and the
one number that decides it (:mod:`attnlens.report.verdicts`), and the numbers behind it, by the proxy
and by the task (:func:`claims`: the page's first table and the README's claims section).

Paper 1's claims are here; paper 2's learned masks and patterns in :mod:`attnlens.report.dam`, and
the planner's in :mod:`attnlens.report.plan`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.task import seed_differences, t_interval
from attnlens.report.dam import dam_claims
from attnlens.report.plan import plan_claims
from attnlens.report.verdicts import (
    DECIDING,
    DOES_NOT_HOLD,
    HOLDS,
    NOT_DECIDED,
    PROXY_TOLERANCE,
    Claim,
    Evidence,
    Verdict,
    combine,
    reaches,
    seeds_points,
    task_verdict,
)
from attnlens.report.words import LOSS_UNITS, delta_points, interval, layer_summary, number, points, task_meta

# The claims table, as the page prints it and claims.csv holds it. The task column is one unit only.
CLAIM_COLUMNS = ["claim", "papers report", "verdict", "proxy", "task: Δ accuracy, points (changed − unmodified)", "made by"]
SEEDS_COLUMN = "fine-tuned with the change: Δ points across seeds"  # with fine-tune seeds
LOW_DIMENSIONAL = 0.25  # "a few of n directions": 90% of a row's variance in at most a quarter of them
STRONG_OVERLAP = 0.8  # "strong overlap": ‖UᵀV‖²/d at the d both subspaces determine
MIN_REMOVED = 0.001  # classes removing fewer of the valid positions are not ranked as "cheapest"


def evidence_of(results: dict, preset: str) -> Evidence:
    """What every claim of these results reads besides its own result."""
    task = task_meta(results)
    missing = "the task did not judge it" if preset in DECIDING else "task: run --full"
    return Evidence(
        preset,
        target=task["settings"]["task_target"] if task else 0.02,
        missing=missing if task else "no task judged it",
        seeded=bool(task) and task["protocol"] == "finetune" and task["settings"]["seeds"] > 1,
    )


def claims(results: dict, preset: str = "default") -> pd.DataFrame:
    """Every claim the report's results speak to, one row each (see the module docstring)."""
    evidence = evidence_of(results, preset)
    rows = [*_eigen_claims(results), *_reconstruct_claims(results["reconstruct"], evidence)]
    rows += _importance_claims(results["importance"], evidence)
    rows += dam_claims(results["dam"], evidence)
    rows += plan_claims(results["plan"], evidence) if "plan" in results else []
    columns = CLAIM_COLUMNS + ([SEEDS_COLUMN] if evidence.seeded else [])
    return pd.DataFrame([claim.row(preset)[: len(columns)] for claim in rows], columns=columns)


# ---------------------------------------------------------------------- eigen and overlap


def _eigen_claims(results: dict) -> list[Claim]:
    eigen_result, overlap_result = results["eigen"], results["overlap"]
    layers, n = layer_summary(eigen_result), eigen_result.n
    table = eigen_result.table
    heads = table[(table["level"] == "head") & (table["query"] == table["query"].max())]
    median, baseline = float(heads["k90"].median()), float(heads["baseline_k90"].median())
    rows = [
        Claim(
            "Score rows are low-dimensional (paper 1)",
            "most variance in a few of n directions",
            Verdict(
                reaches(LOW_DIMENSIONAL * n, median),
                f"the median head needs {number(median, 0)} of {n} directions for 90% of its variance (Gaussian rows: "
                f"{number(baseline, 0)})",
            ),
            f"per layer, the median head: {number(layers.head_k90_median.min(), 0)}–{number(layers.head_k90_median.max(), 0)} "
            f"of {n}; heads pooled per layer: " + ", ".join(number(value, 0) for value in layers.pooled_k90),
        ),
        _across_layers(eigen_result, overlap_result),
    ]
    pairs = overlap_result.pairs
    if len(pairs[pairs["comparison"] == "model_0_1"]):
        model = pairs[pairs["comparison"] == "model_0_1"].iloc[0]
        models = " × ".join(overlap_result.meta["models"])
        rows.append(
            Claim(
                "…and across models (paper 1)",
                "overlap between different models",
                Verdict(NOT_DECIDED, "the data determine no d for both models")
                if not model.d
                else Verdict(reaches(model.overlap, STRONG_OVERLAP), f"{models}: {_at_d(model)}"),
                _closest_layers(pairs),
            )
        )
    return rows


def _across_layers(eigen_result, overlap_result) -> Claim:
    """Adjacent layers compared at the d both determine (split-half overlap at or above the level)."""
    pairs = overlap_result.pairs
    within = pairs[pairs["comparison"] == "layers_0"]
    layers = eigen_result.meta["layers"]
    adjacent = within[within["layer_b"] == within["layer_a"].map(dict(zip(layers[:-1], layers[1:])))]
    determined = adjacent[adjacent["d"] > 0]
    claim, papers = "Eigenspaces overlap across layers (paper 1)", "strong overlap of top eigenspaces"
    if not len(determined):
        return Claim(claim, papers, Verdict(NOT_DECIDED, "no two adjacent layers determine a common d"))
    median = float(determined["overlap"].median())
    return Claim(
        claim,
        papers,
        Verdict(
            reaches(median, STRONG_OVERLAP),
            f"adjacent layers overlap {number(median)} (median) at the d both determine (chance "
            f"{number(determined['chance'].median())})",
        ),
        ", ".join(f"L{row.layer_a}–L{row.layer_b} {_at_d(row)}" for row in adjacent.itertuples()),
    )


def _closest_layers(pairs: pd.DataFrame) -> str:
    cross = pairs[(pairs["comparison"] == "layers_0_1") & (pairs["d"] > 1)]
    best = cross.sort_values("overlap", ascending=False).head(3)
    return "closest layer pairs: " + (
        ", ".join(f"L{row.layer_a} × L{row.layer_b} {_at_d(row)}" for row in best.itertuples()) or "none"
    )


def _at_d(row) -> str:
    """``0.89 at d = 11 (split-half 0.99 / 0.91, chance 0.09)``: one pair at its determined d."""
    if not row.d:
        return "no d the data determine for both"
    return (
        f"{number(row.overlap)} at d = {row.d} (split-half {number(row.split_half_a)} / {number(row.split_half_b)}, "
        f"chance {number(row.chance)})"
    )


# ---------------------------------------------------------------------- reconstruction


def _reconstruct_claims(recon, evidence: Evidence) -> list[Claim]:
    """Per k (16, 32): greedy keys with the claim's maps in every layer, the outputs by the proxy and the
    task's accuracy; fine-tuned with seeds, Paper 1's choices of R too (:func:`_choices_of_r`)."""
    rows, plug = [], recon.plug_in
    heads = recon.table[recon.table.layer >= 0]
    for k in (16, 32):
        errors = heads[(heads.strategy == "greedy") & (heads.scope == "head") & (heads.k == k)].rel_error
        row = None if plug is None else _claim_row(plug[(plug.strategy == "greedy") & (plug.k == k)])
        if len(errors) and row is not None:
            rows.append(_k_claim(recon, k, row, errors, evidence))
    return rows + (_choices_of_r(plug, evidence) if plug is not None and evidence.seeded else [])


def _claim_row(runs: pd.DataFrame) -> pd.Series | None:
    """The run a k claim rests on: the maps per head, or, where the task judged only other maps (the
    papers' protocol fine-tunes a map per layer and a shared one), the first of those it judged."""
    judged = runs[runs["accuracy"].notna()] if "accuracy" in runs else runs.iloc[:0]
    for scope in ("head", "layer", "all"):
        if len(judged[judged.scope == scope]):
            return judged[judged.scope == scope].iloc[0]
    heads = runs[runs.scope == "head"]
    return heads.iloc[0] if len(heads) else None


def _k_claim(recon, k: int, row: pd.Series, errors: pd.Series, evidence: Evidence) -> Claim:
    moved = 1 - row.token_cosine if row.objective == "hidden" else row.loss_increase
    proxy_said = (
        f"cosine of final hidden states {number(row.token_cosine, 4)}"
        if row.objective == "hidden"
        else f"{row.objective} loss {number(row.loss_increase, 3, sign=True)} nats"
    )
    q1, median, q3 = np.percentile(errors, [25, 50, 75])
    task, judged = task_verdict(row, evidence)
    phrase = combine(proxy=bool(moved <= PROXY_TOLERANCE), task=task, judged=judged, missing=evidence.missing)
    flops = row.task_flops_ratio if judged and "task_flops_ratio" in row else row.flops_ratio
    maps = "" if row.scope == "head" else f" ({MAPS[row.scope]})"
    across = evidence.seeded and "delta_seeds" in row
    decided = (
        f"{delta_points(row, 'delta_seeds' if across else 'delta_accuracy')}{' over seeds' if across else ''} on "
        f"{recon.meta['task']['task']}{maps}, at {flops:.0%} of the attention FLOPs"
        if judged
        else proxy_said
    )
    return Claim(
        f"k = {k} exact scores suffice (paper 1)",
        "k = 16–32 enough (MNLI 79.7% at k = 32 vs 81.6% full)",
        Verdict(phrase, decided),
        f"{proxy_said}; the typical head's held-out relative error {number(median)} [quartiles {number(q1)}, "
        f"{number(q3)}]; attention FLOPs ×{number(row.flops_ratio)}"
        + (f" (×{number(row.task_flops_ratio)} on the task's real token pairs)" if judged and "task_flops_ratio" in row else ""),
        points(row) if "accuracy" in row and row.accuracy == row.accuracy else "",
        seeds_points(row),
    )


MAPS = {"head": "a map per head", "layer": "R per layer", "all": "one R shared by every layer"}
SHORT = {"layer": "per layer", "all": "shared"}
# Paper 1's choices of R, judged fine-tuned with seeds: (claim, papers report, k, the scope said to beat the other)
R_SCOPES = (
    ("A shared R beats one per layer at k = 16 (paper 1)", "a shared R helped at k = 16 (fine-tuned)", 16, "all", "layer"),
    ("One R per layer beats a shared R at k = 32 (paper 1)", "per-layer R helped at k = 32 (fine-tuned)", 32, "layer", "all"),
)
JOINT_R = "R learned with the weights beats R fixed at k = {k} (paper 1)", "R fitted by least squares, or learned jointly"


def _choices_of_r(plug: pd.DataFrame, evidence: Evidence) -> list[Claim]:
    """Paper 1's choices of R, fine-tuned with seeds, each a difference of accuracy paired by seed: a shared
    R against one per layer (:data:`R_SCOPES`; with R fixed and, where judged, learned with the weights),
    and R learned with the weights against R fixed at the smallest k judged so (each scope)."""
    runs = {(row.scope, row.k): row for _, row in plug[plug.strategy == "greedy"].iterrows() if _seeded(row, "")}
    rows = []
    for claim, papers, k, better, worse in R_SCOPES:
        if (better, k) in runs and (worse, k) in runs:
            first, second = runs[better, k], runs[worse, k]
            pairs = [(f"R {trained}", first, second, prefix, prefix) for trained, prefix in (("fixed", ""), ("learned", "joint_"))
                     if _seeded(first, prefix) and _seeded(second, prefix)]  # fmt: skip
            rows.append(_beats(claim, papers, f"{SHORT[better]} − {SHORT[worse]}", pairs, evidence))
    joint = sorted((k, scope) for (scope, k), row in runs.items() if _seeded(row, "joint_"))
    if joint:
        k = joint[0][0]
        pairs = [(MAPS[scope], runs[scope, k], runs[scope, k], "joint_", "") for at, scope in joint if at == k]
        rows.append(_beats(JOINT_R[0].format(k=k), JOINT_R[1], "learned − fixed", pairs, evidence))
    return rows


def _seeded(row: pd.Series, prefix: str) -> bool:
    return isinstance(row.get(f"{prefix}seed_accuracies"), str)


def _beats(claim: str, papers: str, label: str, pairs: list[tuple], evidence: Evidence) -> Claim:
    """A claim that one choice beats another, from accuracies paired by seed: it holds where every pair's
    interval lies above zero, does not hold where every pair's lies below zero or is as narrow as the
    target around it (on par), and is not decided otherwise. ``pairs``: (what, first row, second row,
    first's column prefix, second's)."""
    said, each, phrases = [], [], set()
    for what, first, second, first_prefix, second_prefix in pairs:
        first_seeds, second_seeds = first[f"{first_prefix}seed_accuracies"], second[f"{second_prefix}seed_accuracies"]
        by_seed = seed_differences(first_seeds, second_seeds)
        mean, low, high = t_interval(by_seed)
        phrases.add(HOLDS if low > 0 else DOES_NOT_HOLD if high < 0 or (high - low) / 2 <= evidence.target else NOT_DECIDED)
        said.append(f"{what}: {label} {points(pd.Series({'d': mean, 'd_low': low, 'd_high': high}), 'd')}")
        each.append(f"{what} " + " ".join(f"{100 * value + 0.0:+.1f}" for value in by_seed).replace("-", "−"))
    phrase = phrases.pop() if len(phrases) == 1 else NOT_DECIDED
    decided = f"{said[0]} points over {len(by_seed)} seeds"
    return Claim(claim, papers, Verdict(phrase, decided), "", "; ".join(said), "by seed, points: " + "; ".join(each))


# ---------------------------------------------------------------------- importance


def _importance_claims(result, evidence: Evidence) -> list[Claim]:
    table = result.table[result.table["occurs"]]
    unit = LOSS_UNITS[result.meta["settings"]["objective"]]
    substantial = table[table["removed"] >= MIN_REMOVED]  # a class removing next to nothing costs nothing by construction
    rows = [_cheapest(result, substantial, unit)]
    if "self" in set(table["class"]):
        rows.append(_diagonal(result, table[table["class"] == "self"].iloc[0], unit, evidence))
    return rows


def _cheapest(result, substantial: pd.DataFrame, unit: str) -> Claim:
    """Is the diagonal the cheapest class to remove? Self against every other class, paired over blocks."""
    ordered = substantial.sort_values("delta")
    cheapest = ordered.iloc[0]
    claim, papers = "The diagonal (self) matters least (paper 2)", "removing the diagonal costs least of all positions"
    if "self" not in set(ordered["class"]):
        return Claim(claim, papers, Verdict(NOT_DECIDED, "self removes too few positions to rank"))
    other = ordered[ordered["class"] != "self"].iloc[0]
    difference = _paired_delta(result, "self", other["class"])
    if difference[2] < 0:
        phrase = "holds"
    elif difference[1] > 0:
        phrase = "does not hold"
    else:
        phrase = NOT_DECIDED
    said = f"self − {other['class']} {number(difference[0], 3, sign=True, significant=True)} [{number(difference[1], 3, sign=True, significant=True)}, {number(difference[2], 3, sign=True, significant=True)}] ({unit})"
    rank = int((substantial["delta"] < substantial.loc[substantial["class"] == "self", "delta"].iloc[0]).sum()) + 1
    return Claim(
        claim,
        papers,
        Verdict(phrase, said),
        f"cheapest: {cheapest['class']} {interval(cheapest)}; self rank {rank} of {len(substantial)} classes ({unit})",
    )


def _paired_delta(result, first: str, second: str) -> tuple[float, float, float]:
    """The change of removing class ``first`` everywhere less that of ``second``, paired over held-out blocks."""
    table = result.tables["ablation"]
    model = table[(table["scope"] == "model") & (table["control"] == "class")]
    losses = result.arrays["ablation_blocks"]
    index = {name: int(position) for name, position in zip(model["class"], model.index)}
    settings = result.meta["settings"]
    mean, low, high = bootstrap_interval(
        (losses[index[first]] - losses[index[second]])[None], settings["bootstrap"], settings["seed"]
    )
    return float(mean[0]), float(low[0]), float(high[0])


def _diagonal(result, own: pd.Series, unit: str, evidence: Evidence) -> Claim:
    """Removing the diagonal without loss: by the task, and by the proxy against as many random positions."""
    judged_row = None
    task_table = result.tables.get("task")
    if task_table is not None:
        chosen = task_table[(task_table["scope"] == "model") & (task_table["class"] == "self")].set_index("control")
        judged_row = chosen.loc["class"] if "class" in chosen.index else None
    task, judged = task_verdict(judged_row, evidence)
    proxy = bool(own["excess_low"] <= 0)  # no costlier than removing as many random positions
    phrase = combine(proxy=proxy, task=task, judged=judged, missing=evidence.missing)
    proxy_said = f"{interval(own)} against {interval(own, 'random')} for as many random positions ({unit})"
    task_said = ""
    if judged_row is not None:
        random = chosen.loc["random"] if "random" in chosen.index else None
        task_said = points(judged_row) + ("" if random is None else f"; random positions {points(random)}")
    return Claim(
        "The diagonal can be removed without loss (paper 2)",
        "removing it costs nothing",
        Verdict(phrase, delta_points(judged_row) if judged else proxy_said),
        proxy_said,
        task_said,
        "" if judged_row is None else seeds_points(judged_row),
    )
