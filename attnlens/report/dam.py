"""Paper 2's learned masks in the report: the claims (a DAM mask at its target sparsity, and the fixed
patterns against it at matched sparsity, :func:`dam_claims`) and the section (:func:`dam_section`).

A learned mask is a result only when every run converged and another seed reproduces it (the seeds'
masks agree on the same held-out blocks, or fine-tune seeds give an interval across seeds); short of
that the verdict is "not decided" (at a smaller size: what the full size takes here), with no number beside it.
"""

from __future__ import annotations

from enum import Enum

import pandas as pd

from attnlens.analysis.dam.result import SEED_TABLES
from attnlens.analysis.dam.settings import DamSettings
from attnlens.report.html import Figures, folded, section, table
from attnlens.report.presets import DECIDING
from attnlens.report.verdicts import (
    Claim,
    Context,
    Phrase,
    Stated,
    Verdict,
    by_proxy,
    combine,
    seeds_points,
    task_verdict,
)
from attnlens.report.words import LOSS_UNITS, delta_points, interval, number, points, steps

LEARNED = ("A learned mask keeps the model at 90% sparsity (paper 2)", "DAM_s 91.2% sparse at GLUE 80.9, fine-tuned")
PATTERNS = ("Fixed sparse patterns are worse than DAM (paper 2)", "at similar sparsity, e.g. BigBird 93.2% / 79.4")


class Unsettled(Enum):
    """Why no verdict may stand on a report's masks (its value: the words the page prints)."""

    NOT_CONVERGED = "a run did not converge"
    ONE_SEED = "one seed: no run reproduces it"
    DISAGREE = "seeds disagree on the same blocks"

    def verdict(self, context: Context) -> Verdict:
        """Below the presets that decide, what the full size takes; there, not decided for this reason."""
        return context.at_this_size("dam") if context.preset not in DECIDING else Verdict(Phrase.NOT_DECIDED, self.value)


def dam_claims(result, context: Context, unsettled: Unsettled | None) -> list[Claim]:
    """The learned-mask claim and, where patterns were compared, the patterns' claim (``unsettled``: the
    masks' :func:`standing`)."""
    unit = LOSS_UNITS.get(result.meta["settings"]["objective"], result.meta["settings"]["objective"])
    rows = [_learned(result, context, unit, unsettled)]
    if len(result.patterns):
        rows.append(_patterns(result, context, unit, unsettled))
    return rows


def standing(result, context: Context) -> Unsettled | None:
    """Why no verdict may stand on these masks (``None``: they may decide), see the module docstring."""
    table = result.table
    if not table["converged"].astype(bool).all():
        return Unsettled.NOT_CONVERGED
    if "mask_seed" not in table and not context.seeded:
        return Unsettled.ONE_SEED
    across = result.across_seeds()
    agree = across["delta"]["agree"].astype(bool).all() if across else True
    return None if agree else Unsettled.DISAGREE


def _learned(result, context: Context, unit: str, unsettled: Unsettled | None) -> Claim:
    """Each mask's change by the proxy and, where judged, by the task."""
    table = result.table
    proxy_said = "; ".join(
        f"{number(row['sparsity'], 1, percent=True)} sparse: {interval(row)} ({unit}), {steps(row)}"
        for _, row in table.iterrows()
    )
    masks = _task_rows(result, "dam")
    task_said = "; ".join(points(row) for row in masks)
    seeds_said = "; ".join(seeds_points(row) for row in masks)
    judgements = [task_verdict(row, context, stage="dam") for row in masks]
    phrases = {judged.phrase for judged in judgements}
    judged = bool(masks) and all(judged.judged for judged in judgements)
    task = next(iter(phrases)) if len(phrases) == 1 else None
    kept = lambda delta: by_proxy(delta, context.proxy_margin)  # noqa: E731
    proxy = all(kept(delta) for delta in table["delta"]) if unit == LOSS_UNITS["hidden"] else None
    phrase = combine(proxy=proxy, task=task, judged=judged)
    margin = context.stated(masks[0]) if judged else Stated(context.proxy_margin, unit)
    decided = _range(masks) if judged else f"{number(table['delta'].median(), 3)} ({unit}, median of {len(table)} masks)"
    decided += f" ({margin.text})"
    # Seeds whose masks differ may still each decide the claim alike (every mask, by the task and the proxy,
    # keeps the model, or every one does not): the verdict holds for every seed, so it stands.
    proxies = {kept(delta) for delta in table["delta"]} if proxy is not None else set()
    alike = unsettled is Unsettled.DISAGREE and len(proxies) <= 1 and len(phrases) <= 1 and phrase.decided
    difference = judgements[0].difference if len(judgements) == 1 else None
    if unsettled is not None and not alike:
        return Claim(*LEARNED, unsettled.verdict(context), proxy_said, task_said, seeds_said)
    verdict = context.verdict(phrase, f"{decided}, every seed" if alike else decided)
    return Claim(*LEARNED, verdict, proxy_said, task_said, seeds_said, difference=difference, margin=margin)


def _patterns(result, context: Context, unit: str, unsettled: Unsettled | None) -> Claim:
    """DAM against the best pattern of its own family and overall, at matched sparsity."""
    compared = result.compared()
    proxy_parts = [
        f"DAM − {row['scope']} {row['pattern']}({int(row['value'])}) ({row['sparsity']:.0%} sparse) {interval(row, 'difference')}"
        for _, row in compared.iterrows()
    ]
    task_table = result.tables.get("task_compared")
    task_parts = _compared_points(task_table)
    task_said, seeds_said = "; ".join(task_parts), _compared_seeds(task_table, result.meta["settings"].get("seeds", 1))
    proxy_said = "; ".join(proxy_parts)
    if unsettled is not None:
        return Claim(*PATTERNS, unsettled.verdict(context), proxy_said, task_said, seeds_said)
    across = result.across_seeds()
    proxy = _worse(across["compared"] if across else compared)
    worse = None if task_table is None or not len(task_table) else _worse(across.get("task_compared", task_table))
    task = None if worse is None else Phrase.HOLDS if worse else Phrase.DOES_NOT_HOLD
    phrase = combine(proxy=proxy, task=task, judged=task_table is not None)
    judged = task_table is not None and len(task_table)
    margin = context.stated(task_table.iloc[0]) if judged else Stated(context.proxy_margin, unit)
    decided = f"{(task_parts or proxy_parts or [''])[0]} (on par only within ±{margin.value:.3g}{' points' if judged else ''})"
    return Claim(*PATTERNS, context.verdict(phrase, decided), proxy_said, task_said, seeds_said, margin=margin)


def _worse(compared: pd.DataFrame) -> bool | None:
    """Whether every pattern compared is worse than DAM (its ``verdict`` "better" for DAM everywhere):
    True; False where some pattern is on par (within the margin) or better; ``None`` where some comparison
    is undecided."""
    verdicts = set(compared["verdict"])
    if verdicts <= {"better"}:
        return True
    if verdicts & {"worse", "on par"}:
        return False
    return None


def _task_rows(result, kind: str) -> list[pd.Series]:
    table = result.tables.get("task")
    return [] if table is None else [row for _, row in table[table["kind"] == kind].iterrows()]


def _range(rows: list[pd.Series]) -> str:
    """The masks' Δ accuracy in points: one mask's with its interval, or several masks' span."""
    if len(rows) == 1:
        return delta_points(rows[0])
    values = sorted(100 * row["delta_accuracy"] for row in rows)
    return f"Δ {values[0]:+.1f} to {values[-1]:+.1f} points across {len(rows)} masks".replace("-", "−")


def _compared_points(table: pd.DataFrame | None) -> list[str]:
    """Each mask against each pattern it is compared with, by task accuracy in points (DAM − pattern)."""
    if table is None or not len(table):
        return []
    said = []
    # a pattern matched at the task's positions (shorter than the blocks) may be narrower than the proxy's:
    # its sparsity there says why the two columns name different widths
    for _, row in table.drop_duplicates(["lambda", "pattern", "value"]).iterrows():
        named = pd.concat([_difference(row, ""), pd.Series({"held_out": row.get("compared_on", 10**9)})])
        sparse = f"{row['task_sparsity']:.0%} of the task's positions" if "task_sparsity" in row else "matched"
        said.append(f"DAM − {row['scope']} {row['pattern']}({int(row['value'])}) ({sparse}) {points(named)}")
    return said


def _compared_seeds(table: pd.DataFrame | None, seeds: int) -> str:
    """Under the finetune protocol, each mask against each pattern trained alike, the accuracies paired
    by seed (a t interval over the seeds, in points)."""
    if table is None or "difference_seeds" not in table:
        return ""
    said = []
    for _, row in table.drop_duplicates(["lambda", "pattern", "value"]).iterrows():
        said.append(f"DAM − {row['pattern']}({int(row['value'])}) {points(_difference(row, '_seeds'))} over {seeds} seeds")
    return "; ".join(said)


def _difference(row: pd.Series, suffix: str) -> pd.Series:
    """A comparison's ``difference{suffix}`` and its interval, named as :func:`points` reads a Δ."""
    return pd.Series({f"delta_accuracy{end}": row[f"difference{suffix}{end}"] for end in ("", "_low", "_high")})


def dam_section(results: dict, names: dict[str, str], figures: Figures, unsettled: Unsettled | None, context: Context) -> str:
    """Section 5: the masks DAM learned beside the fixed patterns; first, whether they may decide."""
    result = results["dam"]
    shown = figures.directory / names["dam"] / "figures"
    settings = result.meta["settings"]
    unit = LOSS_UNITS.get(settings["objective"], settings["objective"])
    best = result.table.sort_values("delta").iloc[0]
    measured = (
        f"at {number(best['sparsity'], 1, percent=True)} sparsity the mask changes the outputs by {interval(best)} ({unit})"
    )
    if unsettled is None:
        answer = measured[0].upper() + measured[1:] + f", {len(result.table)} masks, every one converged."
    elif context.preset not in DECIDING:
        answer = f"Not decided at this size ({unsettled.value}): {unsettled.verdict(context).aside}; here {measured}."
    else:  # at full size: no one mask is the result (each seed's claim verdict may still agree: the claims table)
        answer = f"No one mask is the result ({unsettled.value}); {measured}."
    body = [
        figures.embed(shown / "loss_vs_sparsity.png", "Objective against sparsity: DAM and fixed patterns"),
        table(result.view(frame=result.table.dropna(axis=1, how="all")), notes=result.column_notes),
    ]
    extra = [figures.embed(shown / name, caption) for name, caption in (
        ("masks.png", "Learned masks"), ("keep_per_class.png", "Keep-probability of each class per target"),
        ("training.png", "Training curves: objective, density, undecided logits"))]  # fmt: skip
    if len(result.patterns):
        extra.append(table(result.view("compared", result.compared()), notes=result.column_notes))
    for name, across in result.across_seeds().items():
        extra.append(f"<p>Across the {result.settings['mask_seeds']} seeds, {SEED_TABLES[name]}:</p>" + table(across))
    if "reference" in result.tables:
        extra.append("<p>The swap search at each mask's sparsity (difference: the mask's loss minus the search's):</p>")
        extra.append(
            table(result.tables["reference"][["start", "rounds", "swaps", "sparsity", "delta", "difference", "verdict"]])
        )
    body.append(folded("Masks, training and the patterns compared", extra))
    return section("5. Can attention be made sparse, and where?", answer, body, _method(result))


def _method(result) -> str:
    settings = result.meta["settings"]
    learned = (
        "the task's training examples" if settings.get("trained_on") == "task" else f"{settings['train_seqs']} corpus blocks"
    )
    polish = (
        f" A swap search from each trained mask finishes it at the target (at most {settings['polish_rounds']} rounds); "
        "the mask converged where that search stopped at a local optimum."
        if "polish_rounds" in result.table
        else ""
    )
    dual = settings.get("dual", "ascent")  # a result from before `dual` found every λ by dual ascent
    held = DamSettings.build(dual=dual, train_weights=settings["train_weights"]).holds
    return (
        f"DAM ({settings['variant']} masks, model {'trained alongside' if settings['train_weights'] else 'frozen'}, n = "
        f"{settings['n']}, learned on {learned}) aimed at target sparsities, "
        f"{'the mask held on a line down to the target' if held else 'λ by dual ascent'}, the threshold set to meet "
        f"the target; judged on {settings['eval_seqs']} held-out blocks with the deterministic mask, beside fixed sparse "
        f"patterns swept over their parameter. Adam at {settings['lr']:g}, cosine schedule over at most {settings['steps']} "
        f"steps. Runs: {', '.join(steps(row) for _, row in result.table.iterrows())}.{polish}"
    )
