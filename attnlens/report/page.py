"""The report's page: one HTML file with the figures embedded, a section per analysis, and the
papers' claims next to what the model shows."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from attnlens.analysis.dam.result import SEED_TABLES, polished
from attnlens.data.positions import parse_classes
from attnlens.io.provenance import provenance
from attnlens.progress import Progress, progress_bar
from attnlens.report.plan import plan_claims, plan_section


def write_page(
    directory: Path, results: dict, names: dict[str, str], command: str | None, *, progress: Progress = False
) -> tuple[Path, pd.DataFrame]:
    """Save every result (with its figures) into ``directory``, then ``report.html`` from them;
    returns the page and its claims table (the table the README's claims section is made from)."""
    with progress_bar(total=len(results), desc="figures", unit="result", enabled=progress) as bar:
        for key, result in results.items():
            result.save(directory / names[key])
            result.save_figures(directory / names[key] / "figures")  # drawing the figures is most of the stage
            bar.update(1)
    figures = Figures(directory)
    table = claims(results)
    sections = [
        _summary_section(results, table),
        *_eigen_sections(results, names, figures),
        _reconstruct_section(results, names, figures),
        _importance_section(results, names, figures),
        _dam_section(results, names, figures),
        _task_section(results, names, figures),
        _plan_section(results, names, figures),
        _other_figures_section(names, figures),
    ]
    page = directory / "report.html"
    page.write_text(_page(results["eigen"], sections, names, command))
    return page, table


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


class Figures:
    """The figures the page embeds, so that the page can show the ones no section showed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.shown: set[Path] = set()

    def embed(self, path: Path, caption: str) -> str:
        self.shown.add(path.resolve())
        data = base64.b64encode(path.read_bytes()).decode()
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )

    def embed_if_saved(self, path: Path, caption: str) -> str:
        return self.embed(path, caption) if path.is_file() else ""

    def rest(self, name: str) -> list[Path]:
        """The saved PNG figures of result directory ``name`` that no section embedded."""
        return [path for path in sorted((self.directory / name / "figures").glob("*.png")) if path.resolve() not in self.shown]


def _table(frame: pd.DataFrame, digits: int = 3, text: bool = False) -> str:
    """An HTML table in a scrolling box; ``text`` tables are left-aligned prose."""
    table = frame.to_html(
        index=False,
        float_format=lambda value: f"{value:.{digits}g}",
        border=0,
        na_rep="",
        classes="data text" if text else "data",
    )
    return f"<div class='table'>{table}</div>"


def _section(title: str, question: str, body: list[str]) -> str:
    return f"<section><h2>{html.escape(title)}</h2><p class='question'>{html.escape(question)}</p>{''.join(body)}</section>"


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


def _summary_section(results: dict, table: pd.DataFrame) -> str:
    task = _task_meta(results)
    said = (
        f" Task: {task['task']}, {task['protocol']} protocol, {len(task['held_out_rows'])} held-out examples; unmodified "
        f"accuracy {number(task['unmodified_accuracy'], 3)}, majority class {number(task['majority_accuracy'], 3)}."
        if task
        else ""
    )
    return _section(
        "Summary: the papers' claims against this model",
        "What the papers report, and what attnlens measures here, by a proxy (how far outputs move) and by task "
        "accuracy (what the papers measured). Findings, not verdicts: settings differ from the papers'." + said,
        [_table(table, text=True)],
    )


def _task_meta(results: dict) -> dict | None:
    """The task that judged the report's changes (the same one in every stage), if any."""
    return next((result.meta.get("task") for result in results.values() if result.meta.get("task")), None)


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


def _eigen_sections(results: dict, names: dict[str, str], figures: Figures) -> list[str]:
    eigen_result, overlap_result = results["eigen"], results["overlap"]
    spectra = figures.directory / names["eigen"] / "figures"
    low_dimensional = _section(
        "1. Are attention score rows low-dimensional?",
        "Eigenvalues of the covariance of pre-softmax score rows (pooled over queries), per layer with heads pooled, "
        "against Gaussian rows of the same per-key variances and number of rows.",
        [
            figures.embed(spectra / "spectra.png", "Eigenvalue spectra per layer (solid) and baseline (dashed)"),
            figures.embed(spectra / "energy.png", "Cumulative explained energy per layer"),
            "<p>Per layer: components for 90% energy of single heads (median, min, max over heads), of the heads "
            "pooled, and the variance fraction along the all-ones direction (which softmax ignores).</p>",
            _table(_layer_summary(eigen_result)),
        ],
    )
    shown = figures.directory / names["overlap"] / "figures"
    body = [
        figures.embed(shown / "split_half_0.png", "Split-half check: each layer against itself, from two halves of the data"),
        figures.embed(shown / "curves_layers_0.png", "Every pair of layers against d, beside both split-half floors"),
        figures.embed(shown / "overlap_layers_0.png", f"Layer × layer overlap at d = {overlap_result.dim}"),
        figures.embed_if_saved(shown / "curves_layers_0_1.png", "Layers of the two models against d"),
        figures.embed_if_saved(shown / "overlap_layers_0_1.png", f"Model × model overlap at d = {overlap_result.dim}"),
        figures.embed(shown / "overlap_heads_0.png", f"Head × head overlap at d = {overlap_result.dim}"),
        "<p>Every pair of layers at the largest d at which both layers' split-half overlap stays at or above "
        f"{number(overlap_result.meta['level'])}:</p>",
        _table(overlap_result.pairs.drop(columns=["level", "head_a", "head_b"])),
    ]
    shared = _section(
        "2. Do eigenspaces overlap across layers and models?",
        "Normalised overlap ‖UᵀV‖²/d of top-d eigenspaces, for every d up to "
        f"{overlap_result.max_dim}; chance level d/n. The answer depends on d: past a layer's spectral gap its "
        "eigenvectors are not determined by the data, and the split-half check (one layer's subspace estimated on two "
        "halves of the blocks) falls away. Two layers are therefore compared at the largest d at which both their "
        f"split-half overlaps stay at or above {number(overlap_result.meta['level'])}; the matrices use one d for all, "
        f"d = {overlap_result.dim} ({overlap_result.meta['dim_rule']}). A cross-layer overlap near the two "
        "split-half floors is as high as the data can show; one well below them is a real difference.",
        body,
    )
    return [low_dimensional, shared]


def _reconstruct_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    recon = results["reconstruct"]
    shown = figures.directory / names["reconstruct"] / "figures"
    overall = recon.table[recon.table.layer == -1]
    chosen = recon.view(frame=overall[overall.k.isin([8, 16, 32])].drop(columns=["layer", "head"]))
    body = [
        figures.embed(shown / "error_vs_k.png", "Held-out reconstruction error against k"),
        figures.embed(shown / "tv_vs_k.png", "Total variation after softmax against k"),
        figures.embed_if_saved(shown / "fidelity_vs_k.png", "Model outputs with the reconstruction in every layer"),
        figures.embed(shown / "error_vs_flops.png", "Error against attention FLOPs saved"),
        _table(chosen.sort_values(["k", "strategy", "scope"])),
    ]
    return _section(
        "3. How many exact scores does a row need?",
        "k exact scores per row, the rest rebuilt by least squares fitted on other blocks; errors on held-out "
        "blocks, per strategy (greedy, random, stride) and scope of the map (per head, per layer, shared by all).",
        body,
    )


MIN_REMOVED = 0.001  # classes removing fewer of the valid positions are not ranked as "cheapest"

# The unit of a change of each objective, for the summary's sentences.
LOSS_UNITS = {"hidden": "(1 − token cosine)", "clm": "nats of next-token loss", "mlm": "nats of masked-token loss"}


def _interval(row: pd.Series, prefix: str = "delta") -> str:
    """``+0.012 [+0.010, +0.014]``: a mean and its 95% interval."""
    values = (number(row[name], 3, sign=True, significant=True) for name in (prefix, f"{prefix}_low", f"{prefix}_high"))
    return "{} [{}, {}]".format(*values)


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


def _learned_on(settings: dict) -> str:
    """What DAM's masks learned from, in words."""
    return "the task's training examples" if settings.get("trained_on") == "task" else f"{settings['train_seqs']} corpus blocks"


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


def _importance_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    result = results["importance"]
    shown = figures.directory / names["importance"] / "figures"
    body = [
        figures.embed(shown / "mass.png", "Attention mass per query on each class, per layer and head"),
        figures.embed(shown / "ablation.png", "Removing one class everywhere, with the random control"),
        figures.embed_if_saved(shown / "gradient.png", "Gradient importance of each class (gate on attention weights)"),
        _table(result.view()),
    ]
    return _section(
        "4. Which positions of the attention matrix matter?",
        f"Mass: average attention weight per query on each position class, against its share of positions. "
        f"Ablation: the class's scores set to −∞ in every layer and head; change of the "
        f"{result.meta['settings']['objective']} objective on held-out blocks with a 95% bootstrap interval, "
        f"beside removing as many random positions per row. Roles: "
        f"{', '.join(f'{key} = {value}' for key, value in result.meta['roles'].items())}.",
        body,
    )


def _dam_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    result = results["dam"]
    shown = figures.directory / names["dam"] / "figures"
    body = [
        figures.embed(shown / "loss_vs_sparsity.png", "Objective against sparsity: DAM and fixed patterns"),
        figures.embed(shown / "training.png", "Training curves: objective, density, undecided logits"),
        figures.embed(shown / "keep_per_class.png", "Keep-probability of each class per target"),
        figures.embed(shown / "masks.png", "Learned masks"),
        _table(result.view(frame=result.table.dropna(axis=1, how="all"))),
    ]
    if len(result.patterns):
        compared = result.compared()
        body.append(
            "<p>Each mask against the best fixed pattern its layout can express (own family) and the best of all, at the "
            "pattern point nearest its sparsity (within 3 points): the difference of held-out losses, paired over blocks.</p>"
        )
        body.append(_table(result.view("compared", compared)))
    for name, table in result.across_seeds().items():
        body += [f"<p>Across the {result.settings['mask_seeds']} seeds of each target, {SEED_TABLES[name]}.</p>", _table(table)]
    if "reference" in result.tables:
        body += [
            "<p>The swap search at each mask's sparsity (difference: the mask's held-out loss minus the search's).</p>",
            _table(result.tables["reference"]),
        ]
    settings = result.meta["settings"]
    steps = ", ".join(_steps(row) for _, row in result.table.iterrows())
    return _section(
        "5. Can attention be made sparse, and where?",
        f"DAM ({settings['variant']} masks, model {'trained alongside' if settings['train_weights'] else 'frozen'}, "
        f"n = {settings['n']}, learned on {_learned_on(settings)}) aimed at target sparsities, λ found by dual ascent and "
        f"the threshold set to meet the target on what it learned from; judged on {settings['eval_seqs']} held-out blocks with the deterministic mask, next to fixed "
        f"sparse patterns swept over their parameter. Adam at {settings['lr']:g}, cosine schedule to "
        f"{settings['lr_end']:g}× at the cap of {settings['steps']} steps. Stopping rule: fewer than "
        f"{number(settings['stop_flips'], 1, percent=True)} of the hard mask's positions changed over the last "
        f"{settings['stop_window']} steps and the training loss within {number(settings['stop_plateau'], 0, percent=True)} "
        f"across them. Converged: over the last {settings['check_window']} steps at a learning rate of at least "
        f"{settings['check_lr']:g}× the start, the judged mask's training loss did not improve beyond its 95% interval"
        f"{_polish_said(result)}. Runs: {steps}.",
        body,
    )


def _polish_said(result) -> str:
    """How a swap search finished the masks, where one did (layouts of few logits), in words."""
    if "polish_rounds" not in result.table:
        return ""
    return (
        f"; a swap search from each trained mask then finished it at the target (at most "
        f"{result.settings['polish_rounds']} rounds), and the mask converged where that search stopped at a local optimum "
        "(the relaxation's own check beside it)"
    )


def _task_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    """Accuracy against k, per class and against sparsity: the task beside the proxies."""
    task = _task_meta(results)
    if task is None:
        return ""
    body = []
    recon, importance_result, dam_result = results["reconstruct"], results["importance"], results["dam"]
    plug = recon.plug_in
    if plug is not None and "accuracy" in plug:
        body.append(
            figures.embed(figures.directory / names["reconstruct"] / "figures" / "accuracy_vs_k.png", "Accuracy against k")
        )
        proxy = [c for c in ("token_cosine", "loss_increase") if c in plug][:1]
        columns = ["strategy", "scope", "k", "accuracy", *DELTA_COLUMNS, *proxy]
        body.append(_table(plug.dropna(subset=["accuracy"])[columns].sort_values(["k", "strategy", "scope"])))
    if "task" in importance_result.tables:
        body.append(
            figures.embed(
                figures.directory / names["importance"] / "figures" / "task_ablation.png", "Accuracy without each class"
            )
        )
        table = importance_result.tables["task"]
        columns = [
            "class",
            "control",
            "accuracy",
            *DELTA_COLUMNS,
            "excess_accuracy",
            "excess_accuracy_low",
            "excess_accuracy_high",
        ]
        body.append(_table(table[table["scope"] != "layer"][columns]))
    if "task" in dam_result.tables:
        body.append(
            figures.embed(figures.directory / names["dam"] / "figures" / "accuracy_vs_sparsity.png", "Accuracy against sparsity")
        )
        judged = dam_result.tables["task"]
        body.append(_table(judged[["kind", "pattern", "value", "sparsity", "task_sparsity", "accuracy", *DELTA_COLUMNS]]))
    probe = task["probe"]
    reader = (
        "the model's own classification head, its classes matched to the task's by name. "
        if probe is None
        else f"a logistic regression on the model's pooled final hidden states ({task['pooling']} pooling; C = {probe['C']:g}, "
        f"{probe['C_chosen_by']}) fitted on the unmodified model and applied unchanged to the changed one. "
    )
    return _section(
        "6. What does the task say?",
        f"Every change above judged by accuracy on {task['task']} ({task['examples']}; {len(task['train_rows'])} training and "
        f"{len(task['held_out_rows'])} held-out examples, seeded and disjoint), under the {task['protocol']} protocol: "
        f"{reader}"
        f"Unmodified accuracy {number(task['unmodified_accuracy'], 3)}, majority class {number(task['majority_accuracy'], 3)}; "
        "intervals are 95% bootstrap intervals over held-out examples, Δ paired over examples. `sparsity` is measured "
        "on the corpus blocks, `task_sparsity` on the task's examples (their own tokens, padding aside). "
        "`detectable_delta` is the smallest true Δ these examples detect 80% of the time at the 5% level.",
        [_task_choices(results), *body],
    )


DELTA_COLUMNS = ["delta_accuracy", "delta_accuracy_low", "delta_accuracy_high", "delta_halfwidth", "detectable_delta"]


def _task_choices(results: dict) -> str:
    """Which changes the task judged in each stage, on how many held-out examples, and the paired
    half-width reached against the target (each judgement is a forward of every held-out example, so
    the report judges the changes its claims rest on)."""
    recon, importance_result, dam_result = (results[key].meta for key in ("reconstruct", "importance", "dam"))
    ks, classes = recon["settings"].get("task_ks"), importance_result["settings"].get("task_classes")
    chosen = {
        "reconstruct": f"greedy keys, per-head maps in every layer, k = {', '.join(map(str, ks)) if ks else 'every k'}",
        "importance": f"{', '.join(parse_classes(classes) if classes else ['every class'])} removed in every "
        "layer, each beside its random control",
        "dam": "each mask, and "
        + (
            "the patterns it is compared with (best of its own family, best overall, at matched sparsity)"
            if dam_result["settings"].get("task_patterns") == "compared"
            else "every pattern"
        ),
    }
    items = []
    for stage, meta in (("reconstruct", recon), ("importance", importance_result), ("dam", dam_result)):
        task = meta.get("task")
        if not task:
            continue
        calibration = task.get("calibration")
        power = (
            f"paired Δ half-width {number(calibration['halfwidth_reached'], 3)} on its headline changes (target "
            f"{number(calibration['target_halfwidth'], 3)}"
            + (
                ""
                if calibration["reached_target"]
                else f"; not reached: the task has {calibration['examples_available']} examples"
            )
            + ")"
            if calibration
            else "a fixed number of examples"
        )
        items.append(f"<li>{stage}: {chosen[stage]}; {task['held_out']} held-out examples, {power}</li>")
    return "<p>What the task judged, stage by stage:</p><ul>" + "".join(items) + "</ul>"


def _plan_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    if "plan" not in results:
        return ""
    return plan_section(results["plan"], figures.directory / names["plan"] / "figures", figures, _section, _table)


def _other_figures_section(names: dict[str, str], figures: Figures) -> str:
    """Every figure the stages saved that no section above shows, so the page holds them all."""
    body = []
    for name in names.values():
        for path in figures.rest(name):
            body.append(figures.embed(path, f"{name}: {path.stem}"))
    if not body:
        return ""
    return _section(
        "8. Every other figure",
        "The remaining figures the stages saved (each also as PNG and PDF in its result's figures/ directory).",
        body,
    )


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
.question { color: #555; } figure { display: inline-block; margin: 0.5em; width: 48%; vertical-align: top; }
figure img { width: 100%; } figcaption { font-size: 0.85em; color: #555; text-align: center; }
table.data { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
table.data td, table.data th { padding: 0.25em 0.6em; border-bottom: 1px solid #e4e4e4; text-align: right; }
table.data td:first-child, table.data th:first-child { text-align: left; }
table.text td, table.text th { text-align: left; vertical-align: top; } div.table { overflow-x: auto; }
code, pre { background: #f5f5f5; padding: 0.1em 0.3em; } pre { padding: 0.6em; overflow-x: auto; }
"""


def _page(eigen_result, sections: list[str], names: dict[str, str], command: str | None) -> str:
    meta = provenance(command)
    model = eigen_result.meta["model"]
    files = "".join(f"<li><code>{html.escape(name)}/</code></li>" for name in names.values())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>attnlens report: {html.escape(model["name"])}</title>
<style>{STYLE}</style></head><body>
<h1>attnlens report: {html.escape(model["name"])} ({html.escape(model["architecture"])}, {model["num_layers"]} layers ×
{model["num_heads"]} heads) on {html.escape(str(eigen_result.meta["corpus"].get("source")))}</h1>
<p>Made {html.escape(meta["created"])} by <code>{html.escape(meta["command"])}</code></p>
{_table(pd.DataFrame(sorted(meta["versions"].items()), columns=["package", "version"]), text=True)}
{"".join(sections)}
<section><h2>Files</h2><p>Every result is a directory next to this page, readable with
<code>attnlens.load_result(path)</code>; <code>attnlens figures DIR... --out FIGS</code> redraws its figures.</p>
<ul>{files}</ul></section>
</body></html>
"""
