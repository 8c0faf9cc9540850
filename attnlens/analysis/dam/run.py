"""``dam()``: learn masks on training blocks and judge them, beside fixed patterns, on held-out blocks.

The run reads as its steps: the shared prologue (:class:`~attnlens.analysis.experiment.Experiment`),
the :class:`Setup` (layout, batches, warm start, batch order, task), the fixed patterns,
one training and judgement per run (:func:`train_and_judge`), the task's view of the
patterns, and the result's tables (:func:`assemble`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import PATTERN_STREAM, MaskChange, PatternChange, seeded
from attnlens.analysis.dam.judging import (
    MaskSplit,
    adapt_to_pattern,
    compare_on_task,
    evaluate_mask,
    judge_patterns,
    judge_patterns_on_task,
    pattern_points,
    removed_fraction,
)
from attnlens.analysis.dam.layouts import LAYOUTS, MaskLayout, equal_by_construction, pattern_logits
from attnlens.analysis.dam.reference import SearchOutcome, check_size, searchable, start_mask, swap_search
from attnlens.analysis.dam.result import (
    MATCH_WITHIN,
    DamResult,
    keep_rows,
    keep_summary_rows,
    loss_columns,
    summary_row,
    without_absolute_loss,
)
from attnlens.analysis.dam.settings import DamSettings, parse_init
from attnlens.analysis.dam.training import DamTrainer, batch_order
from attnlens.analysis.evaluation import bootstrap_interval, evaluate_change, resample_train
from attnlens.analysis.experiment import Experiment, Split
from attnlens.analysis.objectives import Objective
from attnlens.analysis.patterns import PATTERNS, build
from attnlens.analysis.task import TaskJudge, TaskLoss, TaskSettings, content_key, task_columns
from attnlens.errors import BadInput
from attnlens.models.loading import LoadedModel, module_sha256
from attnlens.progress import Progress, progress_bar

RESAMPLE_STREAM = 17  # a mask seed's draw of training blocks (resample)


def dam(
    source: str | LoadedModel = "minilm-l6",
    settings: DamSettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress = True,
    command: str | None = None,
    **changes: Any,
) -> DamResult:
    """Learn attention masks for each target sparsity (or λ) on training blocks and judge them on held-out blocks.

    ``source`` is a model (alias, path, Hub id or :class:`LoadedModel`); ``settings``
    (:class:`DamSettings`) with keyword ``changes`` applied. Every run starts from the same
    logits (``init_keep`` keep-probability, or the pattern ``init``) and sees the same batches
    and noise (``seed``). With ``train_weights`` the model is fine-tuned alongside (learning
    rate ``weights_lr``) and restored after each run.

    >>> from attnlens import dam
    >>> result = dam("minilm-l6", lambdas=[0.0, 1.0], steps=3, stop_window=2, seq_len=16, train_seqs=4, eval_seqs=4,
    ...              batch_size=2, patterns=False, bootstrap=50, progress=False)
    >>> result.table[["lambda", "steps"]].values.tolist()   # steps used: at most the cap
    [[0.0, 3.0], [1.0, 3.0]]
    >>> result.logits.shape                          # (run, head, offset) for the structured variant
    (2, 12, 16)
    """
    s = DamSettings.build(settings, **changes)
    experiment = Experiment.start(  # the task is prepared (and so checked) here, before the first forward pass
        source, s, num_eval=s.eval_seqs, num_train=s.train_seqs, device=device, task=TaskSettings.of(s),
        task_trains=s.train_on == "task",
    )  # fmt: skip
    setup = Setup.of(experiment, s, progress)
    with progress_bar(total=setup.total_steps(), desc="dam", unit="step", enabled=progress) as bar:
        # the patterns first (on the unmodified model): weight training under a pattern needs their sparsity
        points = pattern_points(s.seq_len) if s.patterns else []
        patterns, pattern_losses = judge_patterns(setup.judge, setup.held_out.split, setup.layout.valid, points, s.seed, bar)
        if setup.task is not None and points:  # each point's share of the task's own positions, to match on
            patterns = patterns.assign(
                task_sparsity=[setup.task.removal_share(setup.pattern(row)) for row in patterns.itertuples()]
            )
        runs = [train_and_judge(setup.for_seed(seed), lam, target, seed, patterns, bar) for lam, target, seed in s.runs()]
        _distinct_keys(runs)
        task_patterns = None if setup.task is None or not points else _task_patterns(setup, patterns, pattern_losses, runs, bar)
    return assemble(setup, patterns, pattern_losses, runs, task_patterns, command)


def _distinct_keys(runs: list[Run]) -> None:
    """Runs are told apart by the λ they end at. Two seeds of a target end at the same λ only when
    dual ascent never saw their hard masks differ (no logit crossed the threshold: a run too short);
    the later one's key is then moved up by the least step a float allows, so every table keeps
    one row per run."""
    seen: set[float] = set()
    for run in runs:
        while run.lam in seen:
            run.lam = float(np.nextafter(run.lam, np.inf))
        seen.add(run.lam)
        run.summary["lambda"] = run.lam
        run.curve = run.curve.assign(**{"lambda": run.lam})
        if run.task is not None:
            run.task["lambda"] = run.lam
        if run.reference is not None:
            run.reference["lambda"] = run.lam
        for row, _, _ in run.adapted:
            row["lambda"] = run.lam


def _task_patterns(
    setup: Setup, patterns: pd.DataFrame, pattern_losses: np.ndarray, runs: list[Run], bar
) -> tuple[pd.DataFrame, pd.DataFrame, list[np.ndarray]]:
    """The patterns the task judges and each mask is compared with (rows of lambda, scope, pattern,
    value), their task table and outcomes: with ``train_weights``, those trained beside each mask;
    else those ``task_patterns`` names, judged now."""
    s = setup.settings
    if s.train_weights:  # judged by the task with the weights they trained
        return adapted_on_task(runs)
    compared = matched_on_task(setup, _with_deltas(patterns, pattern_losses, setup.baseline, s), runs, s.task_patterns)
    chosen = patterns if s.task_patterns == "all" else patterns.merge(compared[["pattern", "value"]].drop_duplicates())
    return (compared, *judge_patterns_on_task(setup.task, chosen, s.seq_len, s.seed, bar))


def matched_on_task(setup: Setup, patterns: pd.DataFrame, runs: list[Run], which: str) -> pd.DataFrame:
    """Per mask of ``runs``, the patterns the task compares it with, matched on the task's own
    positions: among the pattern points whose share of the task's valid positions (``task_sparsity``)
    is within :data:`MATCH_WITHIN` of the mask's (each pattern at its nearest point), the best by the
    held-out proxy (``patterns``' ``delta``) of the mask's own family and the best overall, or with
    ``which`` "adapted" each of the settings' ``adapted_patterns`` (scope "same fine-tuning"). Rows: lambda,
    scope, pattern, value."""
    rows = []
    for mask in (run.task for run in runs):
        distance = (patterns["task_sparsity"] - mask["task_sparsity"]).abs()
        close = distance[distance <= MATCH_WITHIN]
        nearest = patterns.loc[close.groupby(patterns.loc[close.index, "pattern"]).idxmin()]
        expressible = [setup.layout.can_express(p, v) for p, v in zip(nearest["pattern"], nearest["value"])]
        nearest = nearest.assign(expressible=expressible)
        scopes = [("own family", nearest[nearest["expressible"]]), ("overall", nearest)]
        if which == "adapted":
            scopes = [("same fine-tuning", nearest[nearest["pattern"] == name]) for name in setup.settings.adapted_patterns]
        for scope, candidates in scopes:
            if len(candidates):
                best = candidates.loc[candidates["delta"].idxmin()]
                rows.append({"lambda": mask["lambda"], "scope": scope, "pattern": best["pattern"], "value": int(best["value"])})
    return pd.DataFrame(rows, columns=["lambda", "scope", "pattern", "value"])


@dataclass
class Setup:
    """What every run of one :func:`dam` call shares: the experiment, the layout, the held-out and
    training data (the task's examples when the masks learn from the task: ``train_on``), the objective each is
    judged and trained by, the warm start, the batch order and the task judge."""

    experiment: Experiment
    settings: DamSettings
    layout: MaskLayout
    layout_classes: tuple[str, ...]
    held_out: MaskSplit
    train: MaskSplit
    trained_on: str
    train_objective: Objective | TaskLoss
    task: TaskJudge | None
    init_logits: torch.Tensor | None
    start: dict[str, float]  # the warm start's pattern on the training blocks (NaN without one)
    baseline: np.ndarray
    same: dict[str, str]
    references: dict = field(default_factory=dict)  # the swap searches run so far, by target (band) or run (dam)
    train_blocks: dict = field(default_factory=dict)  # with resample: each mask seed's training blocks (corpus index)

    @property
    def judge(self) -> Objective:
        return self.experiment.objective

    @property
    def polishes(self) -> bool:
        """Whether a swap search finishes each mask at its target: with targets, rounds to spend, the
        pretrained weights (a search does not train them) and a layout of few enough logits."""
        s = self.settings
        return s.polish_rounds > 0 and s.lambdas is None and not s.train_weights and searchable(self.layout)

    def for_seed(self, seed: int) -> Setup:
        """What the mask of ``seed`` learns from: this setup, or with ``resample`` (seeds after the
        first) the same with its own draw of training blocks, and the warm start on them. The swap
        searches found so far and the draws are shared."""
        s, experiment = self.settings, self.experiment
        if not s.resample or seed == s.seed:
            return self
        if self.trained_on == "task":
            raise BadInput("`resample` draws other corpus training blocks; these masks learn from the task's examples")
        draw = seeded(seed, RESAMPLE_STREAM)
        blocks = resample_train(experiment.corpus, experiment.model, s.seq_len, s.eval_seqs, s.train_seqs, s.seed, draw)
        self.train_blocks[seed] = blocks.index.tolist()
        train = MaskSplit.of(experiment.split(blocks, s.batch_size, self.train_objective), self.layout, experiment.classes)
        init_logits = warm_start(self.layout, train, s)
        start = judged_start(self.layout, init_logits, self.train_objective, train)
        return replace(self, train=train, init_logits=init_logits, start=start)

    def order(self, seed: int) -> np.ndarray:
        """Which training batch each step of a run with ``seed`` takes."""
        return batch_order(seed, len(self.train.split.inputs), self.settings.steps)

    def pattern(self, row) -> PatternChange:
        """The change of one row of the patterns table."""
        return PatternChange(row.pattern, int(row.value), self.settings.seq_len, self.settings.seed)

    @classmethod
    def of(cls, experiment: Experiment, s: DamSettings, progress: Progress = False) -> Setup:
        model, classes = experiment.model, experiment.classes
        # The class layout needs a partition: "other" takes what the listed classes leave.
        layout_classes = classes if "other" in classes else (*classes, "other")
        valid = experiment.valid.to(model.device)
        layout = LAYOUTS[s.variant](model.num_layers, model.num_heads, s.seq_len, valid, layout_classes)
        if s.reference is not None:  # before any work: a layout too large for a swap search is bad input
            check_size(layout)
        # Batches are prepared before any training: the hidden objective's references come
        # from the unmodified model even when its weights are fine-tuned.
        held_out = MaskSplit.of(experiment.split(experiment.held_out, s.batch_size), layout, classes)
        trained_on, train_objective = experiment.objective.name, experiment.objective
        if s.train_objective is not None:  # a cheaper objective to learn from than the one that judges
            train_objective = Objective(model, s.train_objective, seed=s.seed)
            trained_on = train_objective.name
        train = MaskSplit.of(experiment.split(experiment.train, s.batch_size, train_objective), layout, classes)
        init_logits = warm_start(layout, train, s)
        task = None
        if s.task is not None:  # length-bucketed: masks and patterns decide positions by place, and take a batch's corner
            task = TaskJudge(
                model, TaskSettings.of(s), seq_len=s.seq_len, batch_size=s.batch_size, seed=s.seed, progress=progress,
                prepared=experiment.task,
            )  # fmt: skip
        full = task is not None and not (task.train.padded or task.held_out.padded) and task.train.ids.shape[1] == s.seq_len
        if s.train_on == "task" or (
            s.train_on == "auto" and full and s.train_objective is None
        ):  # the task's own loss, on its training examples
            trained_on, train_objective = "task", TaskLoss(task)
            train = MaskSplit.of(Split.of_examples(task.train, model, s.batch_size), layout, classes)
        start = judged_start(layout, init_logits, train_objective, train)
        baseline = evaluate_change(experiment.objective, held_out.split.inputs, held_out.split.views)["loss"]
        same = equal_by_construction(layout, held_out.contexts, held_out.masks)
        return cls(
            experiment, s, layout, layout_classes, held_out, train, trained_on, train_objective, task, init_logits, start,
            baseline, same,
        )  # fmt: skip

    def total_steps(self) -> int:
        """The progress bar's total: every run's steps (and its judgement), every pattern point
        (twice with a task), the adapted patterns' steps with ``train_weights`` and the swap
        searches' rounds with ``reference``."""
        s, runs = self.settings, len(self.settings.runs())
        judged = (
            0
            if self.task is None or s.train_weights
            else len(pattern_points(s.seq_len))
            if s.task_patterns == "all"
            else 3 * runs
        )
        points = len(pattern_points(s.seq_len)) + judged if s.patterns else 0
        adapted = runs * len(s.adapted_patterns) * s.steps if s.train_weights and s.patterns else 0
        reference = runs * s.reference_rounds if s.reference is not None else 0
        polish = runs * s.polish_rounds if self.polishes else 0
        return runs * (s.steps + 1) + points + adapted + reference + polish


def warm_start(layout: MaskLayout, train: MaskSplit, s: DamSettings) -> torch.Tensor | None:
    """The logits that start every run at pattern ``s.init`` (None without one): the pattern on the
    corpus's training blocks, averaged into each logit (:func:`pattern_logits`)."""
    if s.init is None:
        return None
    name, value = parse_init(s.init, s.seq_len)
    generator = torch.Generator().manual_seed(seeded(s.seed, PATTERN_STREAM))
    keeps = [
        (context, build(name, s.seq_len, value, view.roles().cls.to(context.device), generator))
        for context, view in zip(train.contexts, train.split.views)
    ]
    return pattern_logits(layout, keeps)


def judged_start(layout: MaskLayout, logits: torch.Tensor | None, objective: Objective | TaskLoss, train: MaskSplit) -> dict:
    """What training begins from, judged on its training data as the masks will be (NaN without a warm start)."""
    if logits is None:
        return {"init_train_loss": float("nan"), "init_train_sparsity": float("nan")}
    seen = evaluate_mask(layout, logits, objective, train)
    return {"init_train_loss": float(seen["losses"].mean()), "init_train_sparsity": float(seen["sparsity"])}


@dataclass
class Run:
    """One trained and judged mask: its λ, the held-out judgement, the training curve and what goes in the tables."""

    lam: float
    judged: dict
    curve: pd.DataFrame
    summary: dict
    logits: np.ndarray
    image: np.ndarray
    task: dict | None = None
    # row, per-block losses, and (the change as judged, the task's judgement) or None
    adapted: list[tuple[dict, np.ndarray, tuple[PatternChange, dict] | None]] = field(default_factory=list)
    task_change: MaskChange | None = None  # as the task judged it (its outcomes are the judge's, by its key)
    reference: dict | None = None  # the swap search's mask against this one (reference)
    reference_logits: np.ndarray | None = None


def train_and_judge(setup: Setup, lam: float | None, target: float | None, seed: int, patterns: pd.DataFrame, bar) -> Run:
    """Train one mask (its noise and batch order drawn from ``seed``), judge it on the held-out
    blocks (and the task), then give the patterns nearest its sparsity the same weight training
    when the weights train alongside."""
    s, model = setup.settings, setup.experiment.model
    original = copy.deepcopy(model.model.state_dict()) if s.train_weights else None
    began = time.perf_counter()
    density = None if target is None else 1.0 - target
    trainer = DamTrainer(setup.layout, s, lam=lam, target_density=density, init_logits=setup.init_logits, seed=seed)
    order = setup.order(seed)
    curve = trainer.fit(model, setup.train_objective, setup.train, order, bar)
    # a target's run ends at the λ dual ascent (or, held, the balance) found: its key in every table
    lam, logits, polished = trainer.lam, trainer.logits_.detach(), None
    if setup.polishes:
        polished = polish(setup, trainer, bar)
        logits = polished.logits
    trained = evaluate_mask(setup.layout, logits, setup.train_objective, setup.train)
    seconds = time.perf_counter() - began
    noise = trainer.noise(trainer.steps_used_ - 1)  # the sampler's at the end: keep-probabilities are σ(α / noise)
    judged = evaluate_mask(setup.layout, logits, setup.judge, setup.held_out, noise)
    task = change = None
    if setup.task is not None:  # before the weights are restored: a mask trained with them is judged with them
        change = MaskChange(setup.layout, logits, content_key(f"dam/{s.variant}/{lam}", logits))
        outcome = setup.task.judge(change)
        task = {"lambda": lam, "sparsity": float(judged["sparsity"]), **task_columns(outcome)}
    bar.update(1)
    if original is not None:
        model.model.load_state_dict(original)
    adapted = []
    if original is not None:
        matched = float(judged["sparsity"]) if task is None else task["task_sparsity"]
        adapted = adapt_patterns(setup, lam, matched, curve, order, patterns, original, bar)
    summary = {
        **summary_row(lam, s.variant, judged, setup.baseline, curve, trainer, s.bootstrap, s.seed),
        "mask_seed": seed,
        "seconds": seconds,
        "train_loss": float(trained["losses"].mean()),
        # on the task's own positions when it learned from them (on corpus blocks it is `sparsity` again)
        "train_sparsity": float(trained["sparsity"]) if setup.trained_on == "task" else float("nan"),
        **setup.start,
        **(polish_columns(polished, trainer) if polished is not None else {}),
    }
    image = _keep_image(setup, logits, noise)
    run = Run(lam, judged, curve.assign(**{"lambda": lam}), summary, logits.cpu().numpy(), image, task, adapted, change)
    if s.reference is not None:
        run.reference, run.reference_logits = judge_reference(setup, trainer, run, bar)
    return run


def polish(setup: Setup, trainer: DamTrainer, bar) -> SearchOutcome:
    """The recipe's last step where the layout allows it: the swap search
    (:mod:`~attnlens.analysis.dam.reference`) from the trained mask, calibrated to its target, on the
    training blocks. The relaxation ends near a good mask but not at one: its hard mask settles short of
    the target, the threshold shift removes positions it never tried without, and a few single swaps
    still lower the loss. The search ends where none of the swaps it judges does."""
    logits = trainer.logits_.detach()
    s, data = setup.settings, setup.train
    return swap_search(trainer, setup.train_objective, data, logits > 0, logits, trainer.target_density, s.polish_rounds, bar)


def polish_columns(polished: SearchOutcome, trainer: DamTrainer) -> dict:
    """A polished run's columns of ``summary``: the relaxation's own training loss and check, the
    search's rounds and swaps, and ``converged`` as the search ended (a local optimum, or its cap)."""
    return {
        "relaxed_train_loss": polished.start_loss,
        "relaxed_converged": trainer.converged_,
        "polish_rounds": polished.rounds,
        "polish_swaps": len(polished.swaps),
        "converged": polished.local_optimum,
    }


def judge_reference(setup: Setup, trainer: DamTrainer, run: Run, bar) -> tuple[dict, np.ndarray]:
    """The swap search (:mod:`~attnlens.analysis.dam.reference`) from ``reference``'s start at the
    run's sparsity, on its training blocks, judged on the held-out blocks: its change against the
    unmodified model and the mask's loss less the search's, paired over blocks. From the band it is
    one search per target, shared by the target's seeds. Returns the row of ``reference`` and the
    search's logits."""
    s, density = setup.settings, trainer.target_density
    # from the band one search per target serves every seed, unless each seed trains on its own blocks
    key = density if s.reference == "band" and not s.resample else (density, run.summary["mask_seed"])
    if key not in setup.references:
        logits = torch.as_tensor(run.logits, device=setup.layout.valid.device)
        kept, rank = start_mask(s.reference, setup.layout, setup.train, logits, density, s.seq_len, s.seed)
        found = swap_search(trainer, setup.train_objective, setup.train, kept, rank, density, s.reference_rounds, bar)
        setup.references[key] = (found, evaluate_mask(setup.layout, found.logits, setup.judge, setup.held_out))
    else:
        bar.update(s.reference_rounds)
    found, held = setup.references[key]
    paired = np.stack([held["losses"] - setup.baseline, run.judged["losses"] - held["losses"]])
    mean, low, high = bootstrap_interval(paired, s.bootstrap, s.seed)
    verdict = "DAM worse" if low[1] > 0 else "DAM better" if high[1] < 0 else "on par"
    row = {
        "lambda": run.lam,
        "mask_seed": run.summary["mask_seed"],
        "start": s.reference,
        "rounds": found.rounds,
        "swaps": len(found.swaps),
        "start_train_loss": found.start_loss,
        "train_loss": float(found.losses.mean()),
        "dam_train_loss": run.summary["train_loss"],
        "sparsity": float(held["sparsity"]),
        "dam_sparsity": run.summary["sparsity"],
        "delta": mean[0], "delta_low": low[0], "delta_high": high[0],
        "dam_delta": run.summary["delta"],
        "difference": mean[1], "difference_low": low[1], "difference_high": high[1],
        "verdict": verdict,
    }  # fmt: skip
    return row, found.logits.cpu().numpy()


def _keep_image(setup: Setup, logits: torch.Tensor, noise: float) -> np.ndarray:
    """(layer, head, n, n) keep-probabilities on the first held-out block."""
    probability = torch.sigmoid(logits / max(noise, 1e-6))
    context = setup.held_out.contexts[0][:1]
    layers = range(setup.layout.num_layers)
    return torch.stack([setup.layout.expand(probability, layer, context)[0] for layer in layers]).cpu().numpy().astype(np.float16)


def adapt_patterns(
    setup: Setup, lam: float, sparsity: float, curve: pd.DataFrame, order: np.ndarray, patterns: pd.DataFrame, original: dict, bar
) -> list[tuple[dict, np.ndarray]]:
    """The points of the settings' ``adapted_patterns`` nearest a mask's ``sparsity`` (within 3 points;
    with a task, its sparsity on the task's own positions), each given the mask's weight training (the
    steps of its ``curve``: the same batches of ``order`` at the same learning rates) and
    judged on the held-out blocks, and by the task with the weights it trained (as the mask is);
    the weights are restored after each. Returns (row of ``patterns_adapted``, per-block losses,
    (the change as the task judged it, its judgement) or None)."""
    s, model, adapted = setup.settings, setup.experiment.model, []
    if not s.patterns:
        return adapted
    matched_on = "sparsity" if setup.task is None else "task_sparsity"
    batches = [int(order[step % len(order)]) for step in curve["step"]]
    rates = (curve["lr"] / s.lr).tolist()
    for name in s.adapted_patterns:
        points = patterns[patterns["pattern"] == name]
        nearest = points.iloc[(points[matched_on] - sparsity).abs().argmin()]
        if abs(nearest[matched_on] - sparsity) > MATCH_WITHIN:
            bar.update(s.steps)
            continue
        change = setup.pattern(nearest)
        losses = adapt_to_pattern(model, setup.train_objective, setup.train.split, change, batches, rates, s, bar)
        bar.update(s.steps - len(batches))
        held_out = setup.held_out.split
        judged = evaluate_change(setup.judge, held_out.inputs, held_out.views, change)["loss"]
        removed = removed_fraction(change, held_out, setup.layout.valid)
        outcome = None
        if setup.task is not None:  # with the weights it trained: two masks may adapt one pattern, each its own way
            change = replace(change, weights=module_sha256(model.model)[:16])
            outcome = (change, setup.task.judge(change))
        model.model.load_state_dict(original)
        row = {
            "lambda": lam,
            "pattern": name,
            "family": PATTERNS[name].family,
            "value": int(nearest["value"]),
            "sparsity": removed,
        }
        row |= {"steps": len(batches), "train_objective": float(np.mean(losses[-max(1, len(losses) // 10) :]))}
        adapted.append((row, judged, outcome))
    return adapted


def adapted_on_task(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame, list[PatternChange]]:
    """The adapted patterns as the task judged them (each with the weights it trained, beside its
    mask): the rows each mask is compared with (scope "same fine-tuning"), their task table (with the
    mask's ``lambda``: two masks adapt a pattern each with its own training) and outcomes."""
    adapted = [(run.lam, row, outcome) for run in runs for row, _, outcome in run.adapted]
    compared = pd.DataFrame(
        [
            {"lambda": lam, "scope": "same fine-tuning", "pattern": row["pattern"], "value": row["value"]}
            for lam, row, _ in adapted
        ],
        columns=["lambda", "scope", "pattern", "value"],
    )
    rows = [
        {"lambda": lam, "pattern": row["pattern"], "value": row["value"], "sparsity": row["sparsity"], **task_columns(outcome[1])}
        for lam, row, outcome in adapted
    ]
    # no pattern near a mask's sparsity: an empty table that still has the columns the figures read
    table = (pd.DataFrame(rows) if rows else pd.DataFrame(columns=["lambda", "pattern", "value", "sparsity"])).assign(
        kind="pattern"
    )
    return compared, table, [outcome[0] for _, _, outcome in adapted]


def assemble(
    setup: Setup,
    patterns: pd.DataFrame,
    pattern_losses: np.ndarray,
    runs: list[Run],
    task_patterns: tuple[pd.DataFrame, pd.DataFrame, list[np.ndarray]] | None,
    command,
) -> DamResult:
    """The result: every run's rows, the patterns with their change against the unmodified model
    (intervals over the same blocks), the task's tables (with ``task_patterns``, the patterns the task
    judged and their outcomes: each mask against them, paired), the arrays and the metadata."""
    s, experiment, baseline, judge = setup.settings, setup.experiment, setup.baseline, setup.judge.name
    patterns = _with_deltas(patterns, pattern_losses, baseline, s)
    adapted_rows = [row for run in runs for row, _, _ in run.adapted]
    adapted_losses = (
        np.stack([losses for run in runs for _, losses, _ in run.adapted]) if adapted_rows else np.zeros((0, len(baseline)))
    )
    columns = ["lambda", "pattern", "family", "value", "sparsity", "steps", "train_objective"]
    adapted = _with_deltas(pd.DataFrame(adapted_rows, columns=columns), adapted_losses, baseline, s)
    tables = {
        "summary": _summary(runs, judge, s),
        "keep": pd.DataFrame([row for run in runs for row in keep_rows(run.lam, experiment.classes, run.judged)]),
        "keep_summary": pd.DataFrame(
            [row for run in runs for row in keep_summary_rows(run.lam, experiment.classes, run.judged, setup.same)]
        ),
        "patterns": without_absolute_loss(patterns, judge),
        "training": pd.concat([run.curve for run in runs], ignore_index=True),
    }
    if setup.task is not None:
        task_table = pd.DataFrame([run.task for run in runs]).assign(kind="dam", variant=s.variant)
        tables["task"] = task_table if task_patterns is None else pd.concat([task_table, task_patterns[1]], ignore_index=True)
    adapting = s.train_weights and s.patterns
    if adapting:
        tables["patterns_adapted"] = without_absolute_loss(adapted, judge)
    if s.reference is not None:
        tables["reference"] = pd.DataFrame([run.reference for run in runs])
    arrays = {
        "logits": np.stack([run.logits for run in runs]),
        "keep_images": np.stack([run.image for run in runs]),
        "eval_losses": np.stack([run.judged["losses"] for run in runs]),
        "baseline_losses": baseline,
        "pattern_losses": pattern_losses,
        **({"adapted_pattern_losses": adapted_losses} if adapting else {}),
        **({"reference_logits": np.stack([run.reference_logits for run in runs])} if s.reference is not None else {}),
    }
    result = DamResult(_metadata(setup, command), tables, arrays)
    if task_patterns is not None:
        # a mask judged with the weights it trained (and patterns adapted beside it) cannot be run again on more examples
        compared, judged, changes = task_patterns
        masks = [run.task_change for run in runs]
        extend = not s.train_weights
        result.tables["task_compared"] = compare_on_task(setup.task, compared, task_table, masks, judged, changes, extend=extend)
    if setup.task is not None:  # after the comparisons, which may judge changes on more examples
        result.arrays.update(setup.task.outcome_arrays())
    return result


def _summary(runs: list[Run], judge: str, s: DamSettings) -> pd.DataFrame:
    """One row per run; columns of settings not used (no target, no warm start, one seed, a check
    that could not judge) are left out rather than all NaN or all the same."""
    table = without_absolute_loss(pd.DataFrame([run.summary for run in runs]), judge).dropna(axis=1, how="all")
    return table if s.mask_seeds > 1 else table.drop(columns="mask_seed")


def _with_deltas(table: pd.DataFrame, losses: np.ndarray, baseline: np.ndarray, s: DamSettings) -> pd.DataFrame:
    """``table`` with each row's held-out loss and its change against the unmodified model (interval over blocks)."""
    if not len(table):
        return table.reindex(columns=[*table.columns, "loss", "delta", "delta_low", "delta_high"])
    table = table.assign(loss=losses.mean(1))
    table["delta"], table["delta_low"], table["delta_high"] = bootstrap_interval(losses - baseline, s.bootstrap, s.seed)
    return table


def _metadata(setup: Setup, command: str | None) -> dict:
    """The result's meta: the experiment's, what this run's settings came to, the layout, the baseline and the task."""
    s, experiment = setup.settings, setup.experiment
    mean, low, high = bootstrap_interval(setup.baseline[None], s.bootstrap, s.seed)
    runs = {
        "sparsity": None if s.lambdas is not None else list(dict.fromkeys(target for _, target, _ in s.runs())),
        "tau": list(s.temperature),
        "weights_lr": s.weights_lr if s.train_weights else None,
        "layout_classes": list(setup.layout_classes),
        "trained_on": setup.trained_on,
        "train_seqs": len(experiment.train),
        **({"train_block_index_by_seed": setup.train_blocks} if s.resample else {}),
        "eval_seqs": len(experiment.held_out),
        "logits_shape": list(setup.layout.shape),
        "optimiser": "Adam",
        "penalty": "lambda * mean of the hard mask over valid (layer, head, query, key) positions",
    }
    return experiment.metadata(
        s,
        command,
        settings=runs,
        layout=setup.layout.describe(),
        baseline={"loss": float(mean[0]), "loss_low": float(low[0]), "loss_high": float(high[0])},
        columns=loss_columns(setup.judge.name),
        equal_by_construction=setup.same,
        task=setup.task.describe() if setup.task is not None else None,
    )
