"""A decoder's attention in the report: the first-token sink, heavy hitters, a sink with a recent window and the heads
that look far, each claim beside the number of the paper that found it (:func:`decoder_claims`); what a decoder's
adjacent layers share where the overlap claim reads them at d ≤ 2 (:func:`shared_direction`); and the section that
shows them (:func:`sinks_section`).

These claims are a decoder's: an encoder's report runs no sinks stage (:meth:`ReportSettings.sized_for
<attnlens.report.presets.ReportSettings.sized_for>`), and its page shows none of them.

- **The first token is a sink** (Gu et al., ICLR 2025; StreamingLLM, Xiao et al., ICLR 2024): the share of heads
  whose mean weight on the first token exceeds ε = 0.3 at n = 64 (Gu et al.'s definition), and the verdict: removing
  the first token (class ``sink``) costs more than removing as many random positions, by the proxy (nats, paired
  over blocks) and by the task (accuracy, paired over examples). A sink the model can lose at no cost is not one.
- **Attention is heavy-hitter sparse** (H2O, Zhang et al., NeurIPS 2023): the share of valid weights below 1% of
  their row's largest, against the 95% H2O reports (holds where its interval over blocks lies above 95%, does not
  where it lies below), and the weight mass the top 5% of a row's keys hold.
- **A sink plus a recent window keeps the model** (StreamingLLM): the narrowest window whose DAM fixed pattern
  ``sink-window(w)`` (the first 4 keys and the w before each query) changes the loss by no more than the proxy's
  margin, its whole interval within it.
- **Few heads look far** (Wu et al. 2024's retrieval heads; DuoAttention): the share of heads that, kept alone to the
  sink and a recent window, cost more than the margin, against Wu et al.'s 5% (measured under ``--full``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from attnlens.analysis.overlap import subspace_overlap
from attnlens.report.html import Figures, folded, section, table
from attnlens.report.verdicts import Claim, Context, Difference, Phrase, Stated, Verdict, beats, combine, task_verdict
from attnlens.report.words import LOSS_UNITS, interval, number, points, too_few

if TYPE_CHECKING:
    from attnlens.report.deciding import Needs

SINK = (
    "The first token is an attention sink (Gu et al.; StreamingLLM)",
    "sink heads (α > 0.3, n = 64) measured in 30 LMs from 14M parameters; Llama-2-13B's perplexity 5.40 → 5,158 "
    "without its first 4 tokens",
)
HEAVY = ("Attention is heavy-hitter sparse (H2O)", "over 95% of weights below 1% of their row's largest (OPT)")
WINDOW = ("A sink plus a recent window keeps the model (StreamingLLM)", "4 initial + 1,020 recent tokens: perplexity 5.40")
FAR = ("Few heads look far (retrieval heads)", "under 5% of heads retrieve (Wu et al. 2024); DuoAttention streams the rest")
H2O_SHARE = 0.95  # H2O's "over 95%"
FEW_HEADS = 0.05  # Wu et al.'s "fewer than 5%"


def decoder_claims(results: dict, context: Context) -> list[Claim]:
    """The sink and heavy-hitter claims, where the report measured sinks (a decoder's report)."""
    if "sinks" not in results:
        return []
    sinks = results["sinks"]
    window = _window_claim(results["dam"], context)
    claims = [_sink_claim(sinks, results["importance"], context), _heavy_claim(sinks), *([window] if window else [])]
    return [*claims, _far_claim(sinks)]


def _sink_claim(sinks, importance, context: Context) -> Claim:
    """The share of sink heads (with its interval over blocks) and, where importance removed ``sink``, the verdict
    that removing it costs more than as many random positions, by the proxy and the task."""
    row = sinks.table.set_index("measure").loc["sink_share"]
    s = sinks.settings
    share = (
        f"{number(row['value'], 0, percent=True)} of heads sink [{number(row['low'], 0, percent=True)}, "
        f"{number(row['high'], 0, percent=True)}] (α > {s['epsilon']:g}, n = {s['seq_len']}; median head α "
        f"{number(row['head_median'])})"
    )
    layers = sinks.tables["layers"]
    by_layer = "sink heads by layer: " + ", ".join(
        f"L{r.layer} {number(r.sink_share, 0, percent=True)}" for r in layers.itertuples()
    )
    ablation = importance.tables["ablation"]
    removed = ablation[(ablation["scope"] == "model") & (ablation["class"] == "sink") & (ablation["control"] == "class")]
    if not len(removed):
        said = f"{share}; removing it was not measured (importance did not remove the class sink)"
        return Claim(*SINK, Verdict(Phrase.NOT_DECIDED, said), by_layer)
    unit = LOSS_UNITS[importance.meta["settings"]["objective"]]
    excess, own = removed.iloc[0], importance.table.set_index("class").loc["sink"]
    proxy = Difference(float(excess["excess"]), float(excess["excess_low"]), float(excess["excess_high"]), unit)
    proxy_phrase = beats(proxy, context.proxy_margin)  # above zero: removing the sink costs more
    proxy_said = f"removing it {interval(own)} {unit}, as many random positions {interval(own, 'random')}"
    task_row, task_phrase, task_said, task_difference, needs = _sink_task(importance, context)
    if task_row is None:
        phrase = {Phrase.HOLDS: Phrase.PROXY_HOLDS, Phrase.DOES_NOT_HOLD: Phrase.PROXY_DOES_NOT_HOLD}.get(
            proxy_phrase, Phrase.NOT_DECIDED
        )
        verdict = context.verdict(phrase, f"{share}; {proxy_said}", needs)
    else:
        proxy_holds = None if not proxy_phrase.decided else proxy_phrase is Phrase.HOLDS
        phrase = combine(proxy=proxy_holds, task=task_phrase if task_phrase.decided else None)
        verdict = Verdict(phrase, f"{share}; removing it, against as many random positions: {task_said}")
    margin = Stated(context.proxy_margin, unit) if task_row is None else context.stated(task_row)
    difference = proxy if task_difference is None else task_difference
    return Claim(*SINK, verdict, f"{proxy_said}; {by_layer}", task_said, difference=difference, margin=margin)


def _sink_task(importance, context: Context) -> tuple[pd.Series | None, Phrase, str, Difference | None, Needs | None]:
    """The task's judgement of removing the first token beside as many random positions: the row, whether removing
    it costs more accuracy than the control (their paired difference below zero), in words, that difference (the
    sink's accuracy less the control's), and where the task judged it on too few examples, what deciding takes."""
    judged = importance.tables.get("task")
    if judged is None:
        return None, Phrase.NOT_DECIDED, "", None, None
    rows = judged[(judged["scope"] == "model") & (judged["class"] == "sink")].set_index("control")
    own = rows.loc["class"] if "class" in rows.index else None
    if own is None or not np.isfinite(float(own.get("excess_accuracy", np.nan))):  # the task did not judge it
        return None, Phrase.NOT_DECIDED, "", None, None
    if too_few(own) is not None:  # as the diagonal's: a judgement on fewer examples than an interval needs is not one
        return None, Phrase.NOT_DECIDED, points(own), None, task_verdict(own, context, stage="importance").needs
    excess = Difference(
        -float(own["excess_accuracy"]), -float(own["excess_accuracy_high"]), -float(own["excess_accuracy_low"]), "points"
    )
    phrase = beats(excess, context.task_margin(own))  # the control's accuracy above the class's: the sink costs more
    random = rows.loc["random"] if "random" in rows.index else None
    said = (
        f"sink removed {points(own)}"
        + ("" if random is None else f", random positions {points(random)}")
        + f"; sink − random {points(own, 'excess_accuracy', examples=None)} points"
    )
    difference = Difference.of(own, "excess_accuracy")  # in the unit every task difference is kept in
    return own, phrase, said, difference, None


def _heavy_claim(sinks) -> Claim:
    """The share of negligible weights (below 1% of their row's largest) against H2O's 95%, with its interval over
    blocks, and the mass of the top 5% of a row's keys, each beside the typical head."""
    s, measures = sinks.settings, sinks.table.set_index("measure")
    below, top = measures.loc["below"], measures.loc["top_mass"]
    share = float(below["value"]), float(below["low"]), float(below["high"])
    phrase = Phrase.HOLDS if share[1] >= H2O_SHARE else Phrase.DOES_NOT_HOLD if share[2] < H2O_SHARE else Phrase.NOT_DECIDED
    said = (
        f"{number(share[0], 1, percent=True)} of weights below {s['fraction']:.0%} of their row's largest "
        f"[{number(share[1], 1, percent=True)}, {number(share[2], 1, percent=True)}] at n = {s['seq_len']}"
    )
    heads = (
        f"the median head's {number(below['head_median'], 0, percent=True)} (quartiles {number(below['head_q1'], 0, percent=True)}"
        f"–{number(below['head_q3'], 0, percent=True)}); the top {s['top']:.0%} of a row's keys hold "
        f"{number(top['value'], 0, percent=True)} of its weight (median head {number(top['head_median'], 0, percent=True)}, "
        f"quartiles {number(top['head_q1'], 0, percent=True)}–{number(top['head_q3'], 0, percent=True)}; rows of at least "
        f"{s['min_keys']} keys)"
    )
    difference = Difference(share[0], share[1], share[2], "share", examples=int(s["num_seqs"]))
    return Claim(*HEAVY, Verdict(phrase, said), heads, difference=difference)


def _far_claim(sinks) -> Claim:
    """The share of heads whose restriction alone to the first 4 keys and a recent window costs more than the margin,
    against Wu et al.'s 5%: holds where even counting every undecided head as far it stays below, does not where the
    heads decided far already pass it. Where the heads were not measured (a forward pass each), what that takes."""
    s, measures = sinks.settings, sinks.table.set_index("measure")
    heads = int(sinks.meta["model"]["num_layers"]) * int(sinks.meta["model"]["num_heads"])
    if "far_share" not in measures.index:
        missing = (
            f"measuring every head takes {heads:,} forward passes of {s['far_seqs']} blocks, and more for a head they "
            "do not decide; --full measures them"
        )
        return Claim(*FAR, Verdict(Phrase.AT_THIS_SIZE, missing=missing))
    row = measures.loc["far_share"]
    phrase = Phrase.HOLDS if row["high"] < FEW_HEADS else Phrase.DOES_NOT_HOLD if row["low"] >= FEW_HEADS else Phrase.NOT_DECIDED
    said = (
        f"{number(row['low'], 0, percent=True)} of {heads} heads look far ({number(row['high'] - row['low'], 0, percent=True)} "
        f"not decided): kept alone to the first 4 and {s['window']} recent keys, each costs over {s['far_margin']:g} nats"
    )
    typical = (
        f"n = {s['seq_len']}, {_far_blocks(s)}; the median head's cost {number(row['head_median'], 3, sign=True, significant=True)} nats (quartiles "
        f"{number(row['head_q1'], 3, sign=True, significant=True)} to {number(row['head_q3'], 3, sign=True, significant=True)})"
    )
    return Claim(*FAR, Verdict(phrase, said), typical, margin=Stated(float(s["far_margin"]), "nats"))


def _far_blocks(s: dict) -> str:
    """The blocks each head was measured on: ``far_seqs``, and up to ``far_max_seqs`` for a head not decided on fewer."""
    first, most = int(s["far_seqs"]), int(s.get("far_max_seqs", s["far_seqs"]))  # 0.3.0's results measured every head alike
    return f"{first} blocks" if most == first else f"{first} blocks a head, up to {most} where fewer did not decide"


def _window_claim(dam, context: Context) -> Claim | None:
    """The narrowest window that, with the first 4 tokens, keeps the model by the proxy: the ``sink-window``
    pattern's change of the held-out loss (DAM's fixed patterns, paired over blocks) with its whole interval within
    the proxy's margin; beside it, the window alone (``band``) at the same width."""
    patterns = dam.patterns
    swept = patterns[patterns["pattern"] == "sink-window"].sort_values("value")
    if not len(swept):
        return None
    unit = LOSS_UNITS.get(dam.meta["settings"]["objective"], dam.meta["settings"]["objective"])
    margin, n = context.proxy_margin, int(dam.meta["settings"]["seq_len"])
    kept, lost = swept[swept["delta_high"] <= margin], swept[swept["delta_low"] > margin]
    widest = swept.iloc[-1]
    if len(kept):
        row, phrase = kept.iloc[0], Phrase.HOLDS
        said = f"from w = {int(row['value'])} of n = {n} ({number(row['sparsity'], 0, percent=True)} sparse): {interval(row)}"
    else:
        row = widest
        phrase = Phrase.DOES_NOT_HOLD if int(widest["value"]) in set(lost["value"]) else Phrase.NOT_DECIDED
        said = f"no w up to {int(row['value'])} of n = {n}: {interval(row)} at w = {int(row['value'])}"
    band = patterns[(patterns["pattern"] == "band") & (patterns["value"] == row["value"])]
    alone = f"; the window alone (band) at w = {int(row['value'])}: {interval(band.iloc[0])}" if len(band) else ""
    every = ", ".join(f"w = {int(r.value)} {number(r.delta, 3, sign=True, significant=True)}" for r in swept.itertuples())
    return Claim(
        *WINDOW,
        Verdict(phrase, f"{said} {unit} (margin {margin:g})"),
        f"the first 4 tokens and the w before each query, by the proxy ({unit}): {every}{alone}",
        difference=Difference(float(row["delta"]), float(row["delta_low"]), float(row["delta_high"]), unit),
        margin=Stated(margin, unit),
    )


class Shared(NamedTuple):
    """What adjacent layers share at d ≤ 2 (:func:`shared_direction`): ``named``, a phrase for the verdict where one
    of the two directions is most of the subspace (else ""), and ``said``, every number."""

    named: str
    said: str


def shared_direction(eigen_result, adjacent: pd.DataFrame) -> Shared:
    """What adjacent layers share where the data determine only d = 1 or 2 directions (a decoder's): how much of the
    first key's direction ``e₀`` (the sink's) and of the all-ones direction ``1/√n`` (a shift of the whole row, which
    softmax ignores) lies in their subspaces (``‖Uᵀv‖²``; a random direction's share is d/n), and their overlap with
    each projected out of both, beside the split-half overlap of the projected subspaces. Nothing where no adjacent
    pair is compared at d ≤ 2, or the model is not causal (an encoder's first key is its [CLS], not a sink)."""
    low = adjacent[(adjacent["d"] >= 1) & (adjacent["d"] <= 2)]
    if not len(low) or not eigen_result.meta["model"].get("causal"):
        return Shared("", "")
    query = len(eigen_result.meta["settings"]["queries"] or [0]) - 1  # the last query's rows: keys in block positions
    bases = {half: eigen_result.eigenvectors("layer", half)[:, 0, query].astype(np.float64) for half in ("", "a", "b")}
    n = int(eigen_result.n)
    first, ones = np.eye(n)[0], np.full(n, n**-0.5)
    units = [(int(row.layer_a), int(row.layer_b), int(row.d)) for row in low.itertuples()]
    at = {layer: index for index, layer in enumerate(eigen_result.meta["layers"])}
    said, named = [f"{len(low)} of {len(adjacent)} adjacent pairs share only d ≤ 2 directions"], ""
    for name, direction, what in (
        ("the first key's", first, "the sink's"),
        ("the all-ones", ones, "a shift of the whole row, which softmax ignores"),
    ):
        inside = float(np.median([np.sum((direction @ bases[""][at[u], :, :d]) ** 2) for a, b, d in units for u in (a, b)]))
        kept = float(np.median([_overlap_without(bases[""], at[a], at[b], d, direction) for a, b, d in units]))
        halves = [_overlap_without(bases, at[u], at[u], d, direction, ("a", "b")) for a, b, d in units for u in (a, b)]
        said.append(
            f"{name} direction lies {number(inside)} inside them (median ‖Uᵀv‖²; a random one's "
            f"{number(low['d'].median() / n, 3)}), and with it projected out they overlap {number(kept)} "
            f"(split-half {number(np.median(halves))})"
        )
        if inside > 0.5:  # most of what they share
            named = f"; at d ≤ 2 what they share is {name} direction ({what}): without it {number(kept)}"
    return Shared(named, "; ".join(said))


def _overlap_without(bases, a: int, b: int, d: int, direction: np.ndarray, halves: tuple[str, str] | None = None) -> float:
    """The overlap of units ``a`` and ``b`` at ``d`` with ``direction`` projected out of both (with ``halves``: unit
    ``a``'s two halves, from ``bases`` by half)."""
    first, second = (bases[halves[0]][a], bases[halves[1]][b]) if halves else (bases[a], bases[b])
    return subspace_overlap(_without(first, d, direction), _without(second, d, direction))


def _without(basis: np.ndarray, d: int, direction: np.ndarray) -> np.ndarray:
    """The d directions that carry most of ``basis``'s (n, keep) top d + 1 once the unit vector ``direction`` is
    projected out: an orthonormal (n, d) basis orthogonal to it."""
    top = basis[:, : d + 1]
    projected = top - np.outer(direction, direction @ top)
    left, _, _ = np.linalg.svd(projected, full_matrices=False)
    return left[:, :d]


def sinks_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    """The decoder's section: where its attention goes (a report with a sinks stage only)."""
    if "sinks" not in results:
        return ""
    sinks = results["sinks"]
    shown = figures.directory / names["sinks"] / "figures"
    measures, s = sinks.table.set_index("measure"), sinks.settings
    layers = sinks.tables["layers"]
    every = int((layers["sink_share"] == 1).sum())
    answer = (
        f"{number(measures.loc['sink_share', 'value'], 0, percent=True)} of heads put more than {s['epsilon']:g} of their "
        f"weight on the first token (Gu et al.'s sink heads; every head in {every} of {len(layers)} layers); "
        f"{number(measures.loc['below', 'value'], 0, percent=True)} of weights lie below {s['fraction']:g} of their row's "
        f"largest, and the top {s['top']:.0%} of a row's keys hold {number(measures.loc['top_mass', 'value'], 0, percent=True)} "
        f"of its weight."
    )
    return section(
        "4b. Where does a decoder's attention go?",
        answer,
        [
            figures.embed(shown / "first_weight.png", "Mean weight on the first token, per layer and head"),
            figures.embed(shown / "sink_share.png", "Share of sink heads by layer, with its 95% interval over blocks"),
            table(sinks.view(), notes=sinks.column_notes),
            folded(
                "Heavy hitters, and the heads that look far",
                [
                    figures.embed(shown / "heavy_hitters.png", "Weight mass of a row's top keys against the share kept"),
                    figures.embed_if_saved(shown / "far_heads.png", "Each head alone kept to the sink and a recent window"),
                ],
            ),
        ],
        f"On {s['num_seqs']} corpus blocks of n = {s['seq_len']} tokens, from the weights the model's own softmax gives. "
        f"First-token weight: (1/n) Σ_i A[i, 0] per block, averaged over blocks (Gu et al.); a sink head exceeds "
        f"{s['epsilon']:g}. Negligible: a valid weight below {s['fraction']:g} × its row's largest (H2O), every valid pair "
        f"counted. Heavy hitters: the ⌈q·keys⌉ largest weights of each row of at least {s['min_keys']} keys. Intervals: "
        f"{s['bootstrap']} bootstrap resamples of the blocks. Removing the first token is judged in section 4 (class sink).",
    )
