"""The report page's sections on paper 1 (spectra, overlaps, reconstruction), on the positions of
the attention matrix, on the task, and every figure no section shows; each opens with one sentence
that answers its question with its number (the DAM and plan sections are in :mod:`attnlens.report.dam`
and :mod:`attnlens.report.plan`)."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from attnlens.data.positions import parse_classes
from attnlens.report.facts import layer_summary, task_metas
from attnlens.report.html import Figures, folded, section, table
from attnlens.report.verdicts import RECORD_FIELDS, Context, Phrase
from attnlens.report.words import LOSS_UNITS, number, points


def summary_section(results: dict, claims: pd.DataFrame, context: Context) -> str:
    """The first screen: the margins the verdicts are held to, then every paper's question with its verdict here and
    the one number that decides it."""
    tasks = task_metas(results)
    said = "".join(
        f" The task{'' if len(tasks) == 1 else ' of ' + ', '.join(task['stages'])}: {task['task']} under the "
        f"{task['protocol']} protocol (unmodified accuracy {number(task['unmodified_accuracy'], 3)}, majority class "
        f"{number(task['majority_accuracy'], 3)})."
        for task in tasks.values()
    )
    behind = claims.drop(columns=["papers report", "verdict", "made by", *RECORD_FIELDS], errors="ignore")
    return (
        "<section id='claims'><h2>The papers' claims, measured here</h2>"
        + f"<p class='margin'>{html.escape(margins_said(context, bool(tasks)))}</p>"
        + table(claims[["claim", "papers report", "verdict"]], text=True, kind="claims")
        + f"<p class='notes'>Verdicts: how each is reached is in the docs (science.md).{said}</p>"
        + folded("The numbers behind each verdict", [table(behind, text=True)])
        + "</section>"
    )


def margins_said(context: Context, tasked: bool = True) -> str:
    """The margins every "suffices", "without loss" and "keeps the model" verdict is held to, in words.

    >>> margins_said(Context("default"))[:97]
    'Margins: a change keeps the model when its paired Δ accuracy interval lies wholly above −2 points'
    """
    proxy = (
        f"by the proxy, when the outputs move by at most {context.proxy_margin:g} (1 − cosine of the final hidden states, "
        "or nats of the model's loss)"
    )
    if not tasked:
        return f"Margin: a change keeps the model {proxy}."
    return (
        f"Margins: a change keeps the model when its paired Δ accuracy interval lies wholly above −{context.margin} "
        f"(paper 1 called k = 32 enough at 1.9 points below the full model), and does not when it lies wholly below; "
        f"an interval that holds the margin is not decided. Two choices are on par only when their difference lies "
        f"within ± the margin. {proxy[0].upper()}{proxy[1:]}."
    )


def eigen_sections(results: dict, names: dict[str, str], figures: Figures) -> list[str]:
    """Section 1 (spectra) and section 2 (overlaps across layers and models)."""
    eigen_result, overlap_result = results["eigen"], results["overlap"]
    return [_spectra_section(eigen_result, names, figures), _overlap_section(eigen_result, overlap_result, names, figures)]


def _spectra_section(eigen_result, names: dict[str, str], figures: Figures) -> str:
    spectra = figures.directory / names["eigen"] / "figures"
    layers, n = layer_summary(eigen_result), eigen_result.n
    table_ = eigen_result.table
    heads = table_[(table_["level"] == "head") & (table_["query"] == table_["query"].max())]
    answer = (
        f"The median head needs {number(heads['k90'].median(), 0)} of {n} directions for 90% of its variance, against "
        f"{number(heads['baseline_k90'].median(), 0)} for Gaussian rows of the same per-key variances; pooled, layer "
        f"{int(layers.loc[layers.pooled_k90.idxmin(), 'layer'])} needs only {number(layers.pooled_k90.min(), 0)}."
    )
    columns = ["layer", "head_k90_median", "head_k90_min", "head_k90_max", "baseline_k90", "pooled_k90", "ones_fraction"]
    notes = {
        "head_k90_median": "components for 90% of a single head's variance, median over the layer's heads",
        "pooled_k90": "the same for the layer's heads pooled",
        "ones_fraction": "the variance fraction along the all-ones direction, which softmax ignores",
    }
    return section(
        "1. Are attention score rows low-dimensional?",
        answer,
        [
            figures.embed(spectra / "energy.png", "Cumulative explained energy per layer"),
            table(layers[columns], notes=notes),
            folded(
                "The spectra",
                [figures.embed(spectra / "spectra.png", "Eigenvalue spectra per layer (solid) and baseline (dashed)")],
            ),
        ],
        "Eigenvalues of the covariance of pre-softmax score rows (pooled over queries), per head and per layer with "
        "heads pooled, against Gaussian rows with the same per-key variances and number of rows.",
    )


def _overlap_section(eigen_result, overlap_result, names: dict[str, str], figures: Figures) -> str:
    shown = figures.directory / names["overlap"] / "figures"
    pairs = overlap_result.pairs
    within = pairs[(pairs["comparison"] == "layers_0") & (pairs["d"] > 0)]
    layers = eigen_result.meta["layers"]
    adjacent = within[within["layer_b"] == within["layer_a"].map(dict(zip(layers[:-1], layers[1:])))]
    model = pairs[pairs["comparison"] == "model_0_1"]
    answer = (
        f"Adjacent layers overlap {number(adjacent['overlap'].median())} (median) at the d both determine, against "
        f"{number(adjacent['chance'].median())} by chance"
        if len(adjacent)
        else "No two adjacent layers determine a common d"
    )
    if len(model) and model.iloc[0]["d"]:
        row = model.iloc[0]
        answer += f"; the two models' subspaces overlap {number(row['overlap'])} at d = {int(row['d'])}"
    level = number(overlap_result.meta["level"])
    return section(
        "2. Do eigenspaces overlap across layers and models?",
        answer + ".",
        [
            figures.embed(
                shown / "curves_layers_0.png",
                "Pairs of layers against d (every pair up to 20; else adjacent, closest, farthest), beside both split-half floors",
            ),
            figures.embed_if_saved(shown / "curves_layers_0_1.png", "Layers of the two models against d"),
            table(
                pairs[["comparison", "layer_a", "layer_b", "d", "overlap", "chance", "split_half_a", "split_half_b"]],
                notes={"d": f"the largest d at which both split-half overlaps stay at or above {level}"},
            ),
            folded(
                "Split-half checks and overlap matrices",
                [
                    figures.embed(shown / "split_half_0.png", "Split-half check: each layer against itself, from two halves"),
                    figures.embed(shown / "overlap_layers_0.png", f"Layer × layer overlap at d = {overlap_result.dim}"),
                    figures.embed_if_saved(
                        shown / "overlap_layers_0_1.png", f"Model × model overlap at d = {overlap_result.dim}"
                    ),
                    figures.embed(shown / "overlap_heads_0.png", f"Head × head overlap at d = {overlap_result.dim}"),
                ],
            ),
        ],
        f"Normalised overlap ‖UᵀV‖²/d of top-d eigenspaces for every d up to {overlap_result.max_dim}; chance d/n. "
        "Past a layer's spectral gap its eigenvectors are not determined by the data, and the split-half check (one "
        "layer's subspace from two halves of the blocks) falls away; two layers are compared at the largest d at which "
        f"both split-half overlaps stay at or above {level}. The matrices use one d for all, d = {overlap_result.dim} "
        f"({overlap_result.meta['dim_rule']}).",
    )


def reconstruct_section(results: dict, names: dict[str, str], figures: Figures, k_phrases: dict[int, Phrase | None]) -> str:
    """Section 3: held-out errors against k, and the model's outputs with the maps inside (``k_phrases``:
    each judged k's verdict by the task, as the claims made it)."""
    recon = results["reconstruct"]
    shown = figures.directory / names["reconstruct"] / "figures"
    heads = recon.table[(recon.table.layer >= 0) & (recon.table.strategy == "greedy") & (recon.table.scope == "head")]
    answer = _fewest_keys(heads.groupby("k")["rel_error"].median(), recon.meta["n"])
    plug = recon.plug_in
    picked = None if plug is None else plug[(plug.strategy == "greedy") & (plug.scope == "head")].set_index("k")
    judged = picked.dropna(subset=["accuracy"]) if picked is not None and "accuracy" in picked else []
    if len(judged):  # the task decides; the cosines stay in the figure and the table
        answer += _fewest_keys_on_task(judged, recon.meta["task"]["task"], k_phrases)
    elif picked is not None and "token_cosine" in picked:
        answer += "; the outputs keep a cosine of " + ", ".join(
            f"{number(picked.token_cosine[k], 3)} at k = {k}" for k in picked.index if k in (16, 32, 64)
        )
    overall = recon.table[recon.table.layer == -1]
    chosen = overall[overall.k.isin([8, 16, 32, 64])][
        ["strategy", "scope", "k", "rel_error", "rel_error_zero", "tv", "flops_ratio"]
    ]
    return section(
        "3. How many exact scores does a row need?",
        answer + ".",
        [
            figures.embed(shown / "error_vs_k.png", "Held-out reconstruction error against k"),
            figures.embed_if_saved(shown / "fidelity_vs_k.png", "Model outputs with the reconstruction in every layer"),
            table(chosen.sort_values(["k", "strategy", "scope"]), notes=recon.column_notes),
            folded(
                "More figures",
                [
                    figures.embed(shown / "tv_vs_k.png", "Total variation after softmax against k"),
                    figures.embed(shown / "error_vs_flops.png", "Error against attention FLOPs saved"),
                ],
            ),
        ],
        "k exact scores per row, the rest rebuilt by least squares fitted on other blocks; errors on held-out blocks per "
        "strategy (greedy, random, stride) and scope of the map (per head, per layer, shared by all). The relative error "
        "is against the mean row: 1 is no better than predicting the training mean.",
    )


ERROR_THRESHOLD = 0.1  # section 3's question: the fewest exact scores that rebuild the typical head's rows within 10%


def _fewest_keys(typical: pd.Series, n: int) -> str:
    """What the errors decide: the smallest k below n whose typical head's held-out error is within
    :data:`ERROR_THRESHOLD`, or that none below n is (at k = n every map is exact).

    >>> _fewest_keys(pd.Series([0.5, 0.2, 0.0], index=[16, 64, 128]), 128)
    "No k below n = 128 rebuilds the typical head's held-out rows within 10% (greedy keys, a map per head; at k = 64: 0.20)"
    """
    below = typical[typical.index < n]
    enough = below[below <= ERROR_THRESHOLD]
    if len(enough):
        return (f"k = {int(enough.index.min())} of n = {n} is the fewest that rebuilds the typical head's held-out rows "
                f"within {ERROR_THRESHOLD:.0%} (greedy keys, a map per head)")  # fmt: skip
    largest = f"; at k = {int(below.index.max())}: {number(below[below.index.max()])}" if len(below) else ""
    return (f"No k below n = {n} rebuilds the typical head's held-out rows within {ERROR_THRESHOLD:.0%} (greedy keys, a map "
            f"per head{largest})")  # fmt: skip


def _fewest_keys_on_task(judged: pd.DataFrame, task: str, k_phrases: dict[int, Phrase | None]) -> str:
    """What the task decides, by the claims' own verdicts: the smallest judged k whose accuracy holds, that
    none of the judged k does, or that the judgements did not decide."""
    if not len(judged):
        return ""
    said = ", ".join(f"{points(row)} at k = {k}" for k, row in judged.iterrows())
    verdicts = {k: k_phrases.get(int(k)) for k in judged.index}
    holds = [k for k, verdict in verdicts.items() if verdict is Phrase.HOLDS]
    ks = ", ".join(map(str, judged.index))
    decided = (f"k = {min(holds)} is the fewest judged that keeps the accuracy" if holds
               else f"none of k = {ks} keeps the accuracy" if set(verdicts.values()) == {Phrase.DOES_NOT_HOLD}
               else f"k = {ks} not decided at this size")  # fmt: skip
    return f"; on {task}, {decided} (Δ points {said})"


def importance_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    """Section 4: what removing each position class costs, beside as many random positions."""
    result = results["importance"]
    shown = figures.directory / names["importance"] / "figures"
    unit = LOSS_UNITS[result.meta["settings"]["objective"]]
    table_ = result.table[result.table["occurs"]].sort_values("delta")
    own = table_[table_["class"] == "self"]
    answer = (
        f"Removing {table_.iloc[-1]['class']} costs most ({number(table_.iloc[-1]['delta'], 3, significant=True)}, {unit}) "
        f"and {table_.iloc[0]['class']} least ({number(table_.iloc[0]['delta'], 3, significant=True)})"
    )
    if len(own):
        answer += (
            f"; the diagonal costs {number(own.iloc[0]['delta'], 3, significant=True)}, against "
            f"{number(own.iloc[0]['random'], 3, significant=True)} for as many random positions"
        )
    return section(
        "4. Which positions of the attention matrix matter?",
        answer + ".",
        [
            figures.embed(shown / "ablation.png", "Removing one class everywhere, with the random control"),
            table(result.view(), notes=result.column_notes),
            folded(
                "Attention mass and gradient importance",
                [
                    figures.embed(shown / "mass.png", "Attention mass per query on each class, per layer and head"),
                    figures.embed_if_saved(
                        shown / "gradient.png", "Gradient importance of each class (gate on attention weights)"
                    ),
                ],
            ),
        ],
        f"Ablation: the class's scores set to −∞ in every layer and head; change of the {result.meta['settings']['objective']} "
        "objective on held-out blocks with a 95% bootstrap interval, beside removing as many random positions per row. "
        "Mass: average attention weight per query on each class. Roles: "
        + ", ".join(f"{key} = {value}" for key, value in result.meta["roles"].items())
        + ".",
    )


def task_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    """Section 6: every change the task judged, by accuracy in points, on which task and how many examples."""
    tasks = task_metas(results)
    if not tasks:
        return ""
    body, judged = [], []
    recon, importance_result = results["reconstruct"], results["importance"]
    plug = recon.plug_in
    if plug is not None and "accuracy" in plug:
        rows = plug.dropna(subset=["accuracy"])
        judged += [(f"{row.strategy} keys, {row.scope} maps, k = {row.k}", recon, row) for row in rows.itertuples()]
        body.append(
            figures.embed(figures.directory / names["reconstruct"] / "figures" / "accuracy_vs_k.png", "Accuracy against k")
        )
    if "task" in importance_result.tables:
        rows = importance_result.tables["task"]
        judged += [(f"{row['class']} removed" + (" (random positions)" if row["control"] == "random" else ""), importance_result, row)
                   for _, row in rows[rows["scope"] == "model"].iterrows()]  # fmt: skip
        body.append(
            figures.embed(
                figures.directory / names["importance"] / "figures" / "task_ablation.png", "Accuracy without each class"
            )
        )
    lines = pd.DataFrame(
        [
            {
                "change": name,
                "task": result.meta["task"]["task"],
                "Δ accuracy, points": points(pd.Series(dict(row._asdict() if hasattr(row, "_asdict") else row))),
                "examples": int(_get(row, "held_out")),
                "stopped": _get(row, "stopped", ""),
            }
            for name, result, row in judged
        ]  # fmt: skip
    )
    counts = lines["examples"] if len(lines) else pd.Series([0])
    answer = "; ".join(
        f"On {task['task']}, the unmodified model is right on {number(task['unmodified_accuracy'], 3)} of the held-out examples"
        for task in tasks.values()
    ) + (
        f"; each change below was judged on {int(counts.min())} to {int(counts.max())} of them, as many as its interval "
        "needed to decide"
    )
    return section(
        "6. What does the task say?",
        answer + ".",
        [
            table(lines, notes={"stopped": "why the judgement stopped", "examples": "held-out examples it used"}),
            *body,
            _task_choices(results),
        ],
        " ".join(_task_method(task) for task in tasks.values()),
    )


def _get(row, name: str, default: Any = np.nan) -> Any:
    return getattr(row, name, default) if not isinstance(row, pd.Series) else row.get(name, default)


def _task_method(task: dict) -> str:
    probe = task["probe"]
    reader = (
        "the model's own classification head, its classes matched to the task's by name"
        if probe is None
        else f"a logistic regression on the pooled final hidden states ({task['pooling']} pooling; C = {probe['C']:g}, "
        f"{probe['C_chosen_by']}), fitted on the unmodified model and applied unchanged to the changed one"
    )
    return (
        f"Accuracy on {task['task']} ({task['examples']}; {len(task['train_rows'])} training examples) under the "
        f"{task['protocol']} protocol: {reader}. Δ is the changed model's accuracy minus the unmodified one's, paired "
        "over held-out examples, in points; each change was judged sequentially (repeated 95% intervals) until its "
        f"interval lay on one side of −{task.get('margin', {}).get('given', 'the margin')} (two choices: excluded zero, "
        "or lay within ± the margin), the rest of the examples would decide it less than one time in ten, or they ran out."
    )


def _task_choices(results: dict) -> str:
    """Which changes the task judged in each stage (the claims' changes; the rest at --full)."""
    recon, importance_result, dam_result = (results[key].meta for key in ("reconstruct", "importance", "dam"))
    ks, classes = recon["settings"].get("task_ks"), importance_result["settings"].get("task_classes")
    chosen = {
        "reconstruct": f"k = {', '.join(map(str, ks)) if ks else 'every k'} in every layer",
        "importance": f"{', '.join(parse_classes(classes) if classes else ['every class'])} removed in every layer, each beside its random control",
        "dam": "each mask and the patterns it is compared with",
    }
    items = [
        f"{stage}: {chosen[stage]}"
        for stage, meta in (("reconstruct", recon), ("importance", importance_result), ("dam", dam_result))
        if meta.get("task")
    ]
    return f"<p class='notes'>Judged by the task: {'; '.join(items)}.</p>"


def other_figures_section(names: dict[str, str], figures: Figures) -> str:
    """Every figure the stages saved that no section above shows, so the page holds them all."""
    body = [figures.embed(path, f"{name}: {path.stem}") for name in names.values() for path in figures.rest(name)]
    if not body:
        return ""
    return section(
        "8. Every other figure",
        f"{len(body)} more figures the stages saved, each as PNG in its result's figures/ directory.",
        [folded(f"Show the {len(body)} figures", body)],
        "`attnlens figures DIR... --out FIGS` redraws any result's figures as PNG and PDF.",
    )
