"""The report's stages: each analysis of attnlens run on the report's settings, one function a stage,
in the order :func:`analyses` runs them under the report's one progress bar."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from attnlens.io.results import Result
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress
from attnlens.report.presets import ReportSettings

T = TypeVar("T")
Runner = Callable[[str, Callable[[Progress], T]], T]  # run(stage name, work(progress)) -> what work returns


def analyses(
    loaded: LoadedModel, second: str | None, settings: ReportSettings, *, corpus: str, seed: int, device: str, run: Runner
) -> dict[str, Result]:
    """Every analysis of the report, one stage each (``run`` times it and gives it its stretch of the bar)."""
    from attnlens.analysis.eigen import eigen
    from attnlens.analysis.overlap import overlap

    common = dict(corpus=corpus, seq_len=settings.seq_len, seed=seed)
    results: dict[str, Result] = {}
    results["eigen"] = run("eigen", lambda stage: eigen(loaded, num_seqs=settings.eigen_seqs, progress=stage, **common))
    eigens = [results["eigen"]]
    if second:
        results["eigen_second"] = run(
            "eigen (second model)",
            lambda stage: eigen(second, num_seqs=settings.eigen_seqs, device=device, progress=stage, **common),
        )
        eigens.append(results["eigen_second"])
    results["overlap"] = run("overlap", lambda stage: overlap(eigens, dim=settings.dim, progress=stage))
    results["reconstruct"] = run("reconstruct", lambda stage: _reconstruct(loaded, settings, stage, **common))
    results["importance"] = run("importance", lambda stage: _importance(loaded, settings, stage, **common))
    results["dam"] = run("dam", lambda stage: _dam(loaded, settings, stage, **common))
    if settings.task:
        results["plan"] = run("plan", lambda stage: _plan(loaded, settings, stage, **common))
    return results


def task_settings(settings: ReportSettings, *, savings: bool = False) -> dict[str, object]:
    """The task fields every stage shares (none without a task); ``savings``: for the stages whose
    claims are about computing fewer scores, judged on the savings task (texts that fill the attention)."""
    if not settings.task:
        return {}
    names = ("task", "task_train", "task_eval", "task_target", "protocol", "seeds", "finetune_steps")
    fields = {name: getattr(settings, name) for name in names}
    return {**fields, "task": settings.savings_task or settings.task} if savings else fields


def _reconstruct(loaded: LoadedModel, settings: ReportSettings, progress: Progress, **common: object) -> Result:
    """Errors of every strategy, scope and k; the model with the maps inside (plug-in); the task's
    judgement of the configs it names, where the preset judges this stage by the task."""
    from attnlens.analysis.reconstruct import reconstruct

    task = task_settings(settings, savings=True) if settings.reconstruct_task else {}
    judged = dict(
        task_strategies=settings.task_strategies,
        task_scopes=settings.task_scopes,
        task_ks=tuple(k for k in settings.task_ks if k <= settings.seq_len),
        task_joint_r=settings.task_joint_r,
    )
    return reconstruct(
        loaded,
        num_seqs=settings.reconstruct_seqs,
        ks=settings.ks,
        strategies=settings.strategies,
        scopes=settings.scopes,
        plug_in=True,
        plug_in_scopes=settings.plug_in_scopes,
        batch_size=settings.batch_size,
        progress=progress,
        **task,
        **(judged if task else {}),
        **common,
    )


def _importance(loaded: LoadedModel, settings: ReportSettings, progress: Progress, **common: object) -> Result:
    """Mass, ablations and gradients of the position classes; the task's judgement of the classes it names."""
    from attnlens.analysis.importance import importance

    task = task_settings(settings)
    return importance(
        loaded,
        num_seqs=settings.importance_seqs,
        batch_size=settings.batch_size,
        progress=progress,
        **task,
        **({"task_classes": settings.task_classes} if task else {}),
        **common,
    )


def _dam(loaded: LoadedModel, settings: ReportSettings, progress: Progress, **common: object) -> Result:
    """Masks learned at DAM's own n beside the fixed patterns; the task's judgement where the preset asks."""
    from attnlens.analysis.dam import dam

    task = task_settings(settings) if settings.dam_task else {}
    return dam(
        loaded,
        sparsity=settings.dam_sparsity,
        mask_seeds=settings.dam_mask_seeds,
        reference=settings.dam_reference,
        reference_rounds=settings.dam_reference_rounds,
        polish_rounds=settings.dam_polish_rounds,
        steps=settings.dam_steps,
        stop_window=settings.dam_stop_window,
        check_window=settings.dam_check_window,
        train_seqs=settings.dam_train_seqs,
        eval_seqs=settings.importance_seqs,
        train_weights=settings.dam_train_weights,
        batch_size=settings.batch_size,
        progress=progress,
        **task,
        **(_dam_task(settings) if task else {}),
        **{**common, "seq_len": settings.dam_seq_len},
    )


def _dam_task(settings: ReportSettings) -> dict[str, str]:
    """What DAM's task judges, and what its masks learn from: the papers' protocol learns each mask
    on the task with the weights (SparseBERT) and fine-tunes band, local and bigbird alike."""
    if settings.protocol == "finetune":
        return {"task_patterns": "adapted", "train_on": "task"}
    return {"task_patterns": "compared"}


def _plan(loaded: LoadedModel, settings: ReportSettings, progress: Progress, **common: object) -> Result:
    """The plan stage: budgets of task accuracy under the probe, on the report's blocks and task."""
    from attnlens.analysis.plan import plan

    # the default and quick sizes cannot forecast a budget of a few points: the plan runs anyway to show the
    # machinery, and its claim says "not decided at this size (run --full)"
    chosen = {
        **task_settings(settings, savings=True), "protocol": "probe", "seeds": 1, "task_eval": settings.plan_task_eval, "forecastable_only": False,
    }  # fmt: skip
    return plan(
        loaded,
        max_drop=settings.plan_budgets,
        fit_seqs=settings.plan_fit_seqs,
        curve_seqs=settings.plan_curve_seqs,
        eval_seqs=settings.importance_seqs,
        ks=tuple(k for k in settings.plan_ks if k <= settings.seq_len),
        widths=settings.plan_widths,
        batch_size=settings.batch_size,
        progress=progress,
        **chosen,
        **common,
    )
