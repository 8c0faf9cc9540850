"""The report's claims: each question of the two papers with its verdict here, in one phrase and the
one number that decides it (:mod:`attnlens.report.verdicts`), and the numbers behind it, by the proxy
and by the task (:func:`findings`, made once per report: the page's first table and the README's claims section).

Paper 1's claims are here; paper 2's learned masks and patterns in :mod:`attnlens.report.dam`, a decoder's
sink and heavy hitters in :mod:`attnlens.report.decoder`, and the planner's in :mod:`attnlens.report.plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.margin import DEFAULT_MARGIN, Margin
from attnlens.analysis.task import seed_differences, seed_values, t_interval
from attnlens.report.dam import Unsettled, dam_claims, standing
from attnlens.report.deciding import Deciding
from attnlens.report.decoder import decoder_claims, shared_direction
from attnlens.report.facts import layer_summary, task_meta
from attnlens.report.plan import plan_claims
from attnlens.report.presets import DECIDING
from attnlens.report.verdicts import (
    RECORD_FIELDS,
    Claim,
    Context,
    Difference,
    Phrase,
    Stated,
    Verdict,
    beats,
    by_proxy,
    combine,
    costs_less,
    reaches,
    seeds_points,
    task_verdict,
)
from attnlens.report.words import LOSS_UNITS, delta_points, interval, number, points

# The claims table, as the page prints it and claims.csv holds it (with the typed fields of
# :meth:`Claim.record` after these). The task column is one unit only.
CLAIM_COLUMNS = ["claim", "papers report", "verdict", "proxy", "task: Δ accuracy, points (changed − unmodified)", "made by"]
SEEDS_COLUMN = "fine-tuned with the change: Δ points across seeds"  # with fine-tune seeds
LOW_DIMENSIONAL = 0.25  # "a few of n directions": 90% of a row's variance in at most a quarter of them
STRONG_OVERLAP = 0.8  # "strong overlap": ‖UᵀV‖²/d at the d both subspaces determine
MIN_REMOVED = 0.001  # classes removing fewer of the valid positions are not ranked as "cheapest"
K_CLAIMS = (16, 32)  # paper 1's k


def context_of(results: dict, preset: str, deciding: Deciding | None = None, made_by: str = "") -> Context:
    """What every claim of these results reads besides its own result (``deciding``: what deciding takes
    here; ``made_by``: the words for what made the report, the preset's name where not given)."""
    task = task_meta(results)
    missing = "the task did not judge it" if preset in DECIDING else "task: run --full"
    return Context(
        preset,
        margin=Margin.parse(task["settings"].get("margin", DEFAULT_MARGIN)) if task else Margin(DEFAULT_MARGIN),
        missing=missing if task else "no task judged it",
        seeded=task is not None and task["protocol"] == "finetune" and task["settings"]["seeds"] > 1,
        deciding=deciding if task else None,
        made_by=made_by or preset,
    )


@dataclass(frozen=True)
class Findings:
    """Every verdict of a report, made once (:func:`findings`): the claims, and what the sections
    read of the same judgements (each judged k's phrase by the task; whether the DAM masks may decide)."""

    context: Context
    claims: list[Claim]
    k_phrases: dict[int, Phrase | None]
    masks: Unsettled | None

    def claim(self, name: str) -> Claim | None:
        return next((claim for claim in self.claims if claim.claim == name), None)

    def table(self) -> pd.DataFrame:
        """The claims table as the page prints it (:data:`CLAIM_COLUMNS`), the typed fields after."""
        columns = CLAIM_COLUMNS + ([SEEDS_COLUMN] if self.context.seeded else [])
        rows = [claim.row(self.context.made_by)[: len(columns)] for claim in self.claims]
        typed = pd.DataFrame([claim.record() for claim in self.claims], columns=list(RECORD_FIELDS))
        return pd.concat([pd.DataFrame(rows, columns=columns), typed], axis=1)


def findings(results: dict, preset: str = "default", deciding: Deciding | None = None, made_by: str = "") -> Findings:
    """Every claim the report's results speak to, one each (see the module docstring); ``deciding`` and
    ``made_by`` as :func:`context_of` reads them."""
    context = context_of(results, preset, deciding, made_by)
    recon = results["reconstruct"]
    rows = [*_eigen_claims(results), *_reconstruct_claims(recon, context)]
    rows += _importance_claims(results["importance"], context)
    rows += decoder_claims(results, context)
    masks = standing(results["dam"], context)
    rows += dam_claims(results["dam"], context, masks)
    rows += plan_claims(results["plan"], context) if "plan" in results else []
    return Findings(context, rows, _k_phrases(recon, context), masks)


def _k_phrases(recon, context: Context) -> dict[int, Phrase | None]:
    """Each k the task judged (greedy keys, a map per head): its phrase by the task's rule."""
    plug = recon.plug_in
    if plug is None or "accuracy" not in plug:
        return {}
    judged = plug[(plug.strategy == "greedy") & (plug.scope == "head")].dropna(subset=["accuracy"]).set_index("k")
    return {int(k): task_verdict(row, context).phrase for k, row in judged.iterrows()}


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
                Verdict(Phrase.NOT_DECIDED, "the data determine no d for both models")
                if not model.d
                else Verdict(reaches(model.overlap, STRONG_OVERLAP), f"{models}: {_at_d(model)}"),
                _closest_layers(pairs),
            )
        )
    return rows


def _across_layers(eigen_result, overlap_result) -> Claim:
    """Adjacent layers compared at the d both determine (split-half overlap at or above the level); a decoder's
    at d ≤ 2 with what they share named (:func:`~attnlens.report.decoder.shared_direction`)."""
    pairs = overlap_result.pairs
    within = pairs[pairs["comparison"] == "layers_0"]
    layers = eigen_result.meta["layers"]
    adjacent = within[within["layer_b"] == within["layer_a"].map(dict(zip(layers[:-1], layers[1:])))]
    determined = adjacent[adjacent["d"] > 0]
    claim, papers = "Eigenspaces overlap across layers (paper 1)", "strong overlap of top eigenspaces"
    if not len(determined):
        return Claim(claim, papers, Verdict(Phrase.NOT_DECIDED, "no two adjacent layers determine a common d"))
    median = float(determined["overlap"].median())
    shared = shared_direction(eigen_result, adjacent)
    each = ", ".join(f"L{row.layer_a}–L{row.layer_b} {_at_d(row)}" for row in adjacent.itertuples())
    return Claim(
        claim,
        papers,
        Verdict(
            reaches(median, STRONG_OVERLAP),
            f"adjacent layers overlap {number(median)} (median) at the d both determine (chance "
            f"{number(determined['chance'].median())}){shared.named}",
        ),
        "; ".join(part for part in (each, shared.said) if part),
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


def _reconstruct_claims(recon, context: Context) -> list[Claim]:
    """Per k (16, 32): greedy keys with the claim's maps in every layer, the outputs by the proxy and the
    task's accuracy; fine-tuned with seeds, Paper 1's choices of R too (:func:`_choices_of_r`)."""
    rows, plug = [], recon.plug_in
    heads = recon.table[recon.table.layer >= 0]
    for k in K_CLAIMS:
        errors = heads[(heads.strategy == "greedy") & (heads.scope == "head") & (heads.k == k)].rel_error
        row = None if plug is None else _claim_row(plug[(plug.strategy == "greedy") & (plug.k == k)])
        if len(errors) and row is not None:
            rows.append(_k_claim(recon, k, row, errors, context))
    return rows + (_choices_of_r(plug, context) if plug is not None and context.seeded else [])


def _claim_row(runs: pd.DataFrame) -> pd.Series | None:
    """The run a k claim rests on: the maps per head, or, where the task judged only other maps (the
    papers' protocol fine-tunes a map per layer and a shared one), the first of those it judged."""
    judged = runs[runs["accuracy"].notna()] if "accuracy" in runs else runs.iloc[:0]
    for scope in ("head", "layer", "all"):
        if len(judged[judged.scope == scope]):
            return judged[judged.scope == scope].iloc[0]
    heads = runs[runs.scope == "head"]
    return heads.iloc[0] if len(heads) else None


def _k_claim(recon, k: int, row: pd.Series, errors: pd.Series, context: Context) -> Claim:
    moved = 1 - row.token_cosine if row.objective == "hidden" else row.loss_increase
    proxy_said = (
        f"cosine of final hidden states {number(row.token_cosine, 4)}"
        if row.objective == "hidden"
        else f"{row.objective} loss {number(row.loss_increase, 3, sign=True)} nats"
    )
    q1, median, q3 = np.percentile(errors, [25, 50, 75])
    task = task_verdict(row, context, stage="reconstruct")
    phrase = combine(proxy=by_proxy(moved, context.proxy_margin), task=task.phrase, judged=task.judged)
    flops = row.task_flops_ratio if task.judged and "task_flops_ratio" in row else row.flops_ratio
    maps = "" if row.scope == "head" else f" ({MAPS[row.scope]})"
    across = context.seeded and "delta_seeds" in row
    margin = context.stated(row) if task.judged else Stated(context.proxy_margin, LOSS_UNITS[row.objective])
    decided = (
        f"{delta_points(row, 'delta_seeds' if across else 'delta_accuracy')}{' over seeds' if across else ''} "
        f"({margin.text}) on {recon.meta['task']['task']}{maps}, at {flops:.0%} of the attention FLOPs"
        if task.judged
        else f"{proxy_said} ({margin.text})"
    )
    return Claim(
        f"k = {k} exact scores suffice (paper 1)",
        "k = 16–32 enough (MNLI 79.7% at k = 32 vs 81.6% full)",
        context.verdict(phrase, decided, task.needs),
        f"{proxy_said}; the typical head's held-out relative error {number(median)} [quartiles {number(q1)}, "
        f"{number(q3)}]; attention FLOPs ×{number(row.flops_ratio)}"
        + (
            f" (×{number(row.task_flops_ratio)} on the task's real token pairs)"
            if task.judged and "task_flops_ratio" in row
            else ""
        ),
        points(row) if "accuracy" in row and row.accuracy == row.accuracy else "",
        seeds_points(row),
        difference=task.difference,
        flops=float(flops),
        margin=margin,
    )


MAPS = {"head": "a map per head", "layer": "R per layer", "all": "one R shared by every layer"}
SHORT = {"layer": "per layer", "all": "shared"}
# Paper 1's choices of R, judged fine-tuned with seeds: (claim, papers report, k, the scope said to beat the other)
R_SCOPES = (
    ("A shared R beats one per layer at k = 16 (paper 1)", "a shared R helped at k = 16 (fine-tuned)", 16, "all", "layer"),
    ("One R per layer beats a shared R at k = 32 (paper 1)", "per-layer R helped at k = 32 (fine-tuned)", 32, "layer", "all"),
)
JOINT_R = "R learned with the weights beats R fixed at k = {k} (paper 1)", "R fitted by least squares, or learned jointly"


def _choices_of_r(plug: pd.DataFrame, context: Context) -> list[Claim]:
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
            rows.append(_beats(claim, papers, f"{SHORT[better]} − {SHORT[worse]}", pairs, context))
    joint = sorted((k, scope) for (scope, k), row in runs.items() if _seeded(row, "joint_"))
    if joint:
        k = joint[0][0]
        pairs = [(MAPS[scope], runs[scope, k], runs[scope, k], "joint_", "") for at, scope in joint if at == k]
        rows.append(_beats(JOINT_R[0].format(k=k), JOINT_R[1], "learned − fixed", pairs, context))
    return rows


def _seeded(row: pd.Series, prefix: str) -> bool:
    return seed_values(row, prefix) is not None


def _beats(claim: str, papers: str, label: str, pairs: list[tuple], context: Context) -> Claim:
    """A claim that one choice beats another, from accuracies paired by seed, by :func:`beats` for every
    pair (not decided where pairs disagree). ``pairs``: (what, first row, second row, first's column
    prefix, second's)."""
    said, each, phrases, differences = [], [], set(), []
    for what, first, second, first_prefix, second_prefix in pairs:
        mine, theirs = seed_values(first, first_prefix), seed_values(second, second_prefix)
        assert mine is not None and theirs is not None  # the pairs are made of seeded rows only (_seeded)
        by_seed = seed_differences(mine, theirs)
        difference = Difference(*t_interval(by_seed), "points", seeds=tuple(by_seed))
        phrases.add(beats(difference, context.task_margin(first, first_prefix)))
        differences.append(difference)
        named = pd.Series({"d": difference.mean, "d_low": difference.low, "d_high": difference.high})
        said.append(f"{what}: {label} {points(named, 'd', examples=None)}")
        each.append(f"{what} " + " ".join(f"{100 * value + 0.0:+.1f}" for value in by_seed).replace("-", "−"))
    phrase = phrases.pop() if len(phrases) == 1 else Phrase.NOT_DECIDED
    margin = context.stated(pairs[0][1], pairs[0][3])
    decided = f"{said[0]} points over {len(differences[0].seeds)} seeds (on par only within ±{margin.value:.3g} points)"
    return Claim(claim, papers, Verdict(phrase, decided), "", "; ".join(said), "by seed, points: " + "; ".join(each),
                 difference=differences[0], margin=margin)  # fmt: skip


# ---------------------------------------------------------------------- importance


def _importance_claims(result, context: Context) -> list[Claim]:
    table = result.table[result.table["occurs"]]
    unit = LOSS_UNITS[result.meta["settings"]["objective"]]
    substantial = table[table["removed"] >= MIN_REMOVED]  # a class removing next to nothing costs nothing by construction
    rows = [_cheapest(result, substantial, unit, context)]
    if "self" in set(table["class"]):
        rows.append(_diagonal(result, table[table["class"] == "self"].iloc[0], unit, context))
    return rows


def _cheapest(result, substantial: pd.DataFrame, unit: str, context: Context) -> Claim:
    """Is the diagonal the cheapest class to remove? Self against every other class, paired over blocks."""
    ordered = substantial.sort_values("delta")
    cheapest = ordered.iloc[0]
    claim, papers = "The diagonal (self) matters least (paper 2)", "removing the diagonal costs least of all positions"
    if "self" not in set(ordered["class"]):
        return Claim(claim, papers, Verdict(Phrase.NOT_DECIDED, "self removes too few positions to rank"))
    other = ordered[ordered["class"] != "self"].iloc[0]
    difference = _paired_delta(result, "self", other["class"], unit)
    margin = Stated(context.proxy_margin, unit)
    said = f"self − {other['class']} {_interval_of(difference)} ({unit}; on par only within ±{margin.value:g})"
    rank = int((substantial["delta"] < substantial.loc[substantial["class"] == "self", "delta"].iloc[0]).sum()) + 1
    phrase = costs_less(difference, margin.value)
    needs = None
    if not phrase.decided and context.deciding is not None:
        half = (difference.high - difference.low) / 2
        needs = context.deciding.blocks("importance", difference.examples or 0, difference.mean, half)
    return Claim(
        claim,
        papers,
        Verdict(phrase, said, needs=needs),
        f"cheapest: {cheapest['class']} {interval(cheapest)}; self rank {rank} of {len(substantial)} classes ({unit})",
        difference=difference,
        margin=margin,
    )


def _interval_of(difference: Difference) -> str:
    """:func:`interval`'s words for a :class:`Difference`."""
    named = pd.Series({"d": difference.mean, "d_low": difference.low, "d_high": difference.high})
    return interval(named, "d")


def _paired_delta(result, first: str, second: str, unit: str) -> Difference:
    """The change of removing class ``first`` everywhere less that of ``second``, paired over held-out blocks."""
    table = result.tables["ablation"]
    model = table[(table["scope"] == "model") & (table["control"] == "class")]
    losses = result.arrays["ablation_blocks"]
    index = {name: int(position) for name, position in zip(model["class"], model.index)}
    settings = result.meta["settings"]
    mean, low, high = bootstrap_interval(
        (losses[index[first]] - losses[index[second]])[None], settings["bootstrap"], settings["seed"]
    )
    return Difference(float(mean[0]), float(low[0]), float(high[0]), unit, examples=int(losses.shape[1]))


def _diagonal(result, own: pd.Series, unit: str, context: Context) -> Claim:
    """Removing the diagonal without loss: by the task, and by the proxy against as many random positions."""
    judged_row = None
    task_table = result.tables.get("task")
    if task_table is not None:
        chosen = task_table[(task_table["scope"] == "model") & (task_table["class"] == "self")].set_index("control")
        judged_row = chosen.loc["class"] if "class" in chosen.index else None
    task = task_verdict(judged_row, context, stage="importance")
    # "without loss" is absolute: the outputs move by at most the tolerance. Costing no more than as many
    # random positions is another claim, stated beside it (proxy column), never read as "no loss".
    phrase = combine(proxy=by_proxy(own["delta"], context.proxy_margin), task=task.phrase, judged=task.judged)
    proxy_said = f"{interval(own)} against {interval(own, 'random')} for as many random positions ({unit})"
    margin = context.stated(judged_row) if task.judged else Stated(context.proxy_margin, unit)
    task_said = ""
    if judged_row is not None:
        random = chosen.loc["random"] if "random" in chosen.index else None
        task_said = points(judged_row) + ("" if random is None else f"; random positions {points(random)}")
    return Claim(
        "The diagonal can be removed without loss (paper 2)",
        "removing it costs nothing",
        context.verdict(phrase, f"{delta_points(judged_row) if task.judged else proxy_said} ({margin.text})", task.needs),
        proxy_said,
        task_said,
        "" if judged_row is None else seeds_points(judged_row),
        difference=task.difference,
        margin=margin,
    )
