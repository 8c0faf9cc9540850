"""The report page's sections, one per analysis (and the summary, the task and every other
figure), and the blocks they are made of: embedded figures, tables, a titled section."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from attnlens.analysis.dam.result import SEED_TABLES
from attnlens.data.positions import parse_classes
from attnlens.report.plan import plan_section
from attnlens.report.words import layer_summary, number, steps, task_meta


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


def _summary_section(results: dict, table: pd.DataFrame) -> str:
    """The first screen: every paper's question with its verdict here and the one number that decides it."""
    task = task_meta(results)
    said = (
        f" Task: {task['task']} under the {task['protocol']} protocol; unmodified accuracy "
        f"{number(task['unmodified_accuracy'], 3)}, majority class {number(task['majority_accuracy'], 3)}."
        if task
        else ""
    )
    shown = table[["claim", "papers report", "verdict"]]
    behind = table.drop(columns=["papers report", "verdict"])
    return _section(
        "The papers' claims, measured here",
        "Each claim's verdict on this model, with the number that decides it; the papers used BERT-base on GLUE, "
        "fine-tuned, so these are findings about this model, not re-runs of their tables." + said,
        [
            _table(shown, text=True),
            "<details><summary>The numbers behind each verdict</summary>",
            _table(behind, text=True),
            "</details>",
        ],
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
            _table(layer_summary(eigen_result)),
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
    ended = ", ".join(steps(row) for _, row in result.table.iterrows())
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
        f"{_polish_said(result)}. Runs: {ended}.",
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


def _learned_on(settings: dict) -> str:
    """What DAM's masks learned from, in words."""
    return "the task's training examples" if settings.get("trained_on") == "task" else f"{settings['train_seqs']} corpus blocks"


def _task_section(results: dict, names: dict[str, str], figures: Figures) -> str:
    """Accuracy against k, per class and against sparsity: the task beside the proxies."""
    task = task_meta(results)
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
        sequential = task.get("sequential")
        power = (
            f"each judged sequentially on up to {sequential['examples_available']} examples, until its paired Δ interval "
            f"excluded zero or narrowed to ±{number(sequential['target_halfwidth'], 3)} (at most {task['held_out']} used)"
            if sequential
            else f"{task['held_out']} held-out examples each"
        )
        items.append(f"<li>{stage}: {chosen[stage]}; {power}</li>")
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
        "The remaining figures the stages saved (each as PNG in its result's figures/ directory; `attnlens figures` redraws them as PNG and PDF).",
        body,
    )
