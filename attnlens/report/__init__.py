"""The one-command report: every analysis of attnlens on one model, as a self-contained HTML page.

:func:`report` streams moments and runs the eigen analysis (and on a second model of
the same geometry, when one is installed), the subspace overlaps at every d with their
split-half check, the reconstruction with plug-in, position importance, a short DAM
run and a per-head plan of the cheapest attention within budgets of accuracy, each change judged by a proxy and by task accuracy; it writes every result
directory, then ``report.html`` with every saved figure embedded, the tables, the
numbers that answer each research question of the two papers next to what the papers
report (also saved as the report's ``claims`` table), and the exact command and versions.

``quick`` runs every stage on small settings: a first look in a few minutes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TypeVar

import pandas as pd

from attnlens.errors import AttnlensError, BadInput
from attnlens.io.files import swap_into_place
from attnlens.io.provenance import provenance
from attnlens.io.results import Result, check_out, load_result
from attnlens.models.loading import ALIASES, LoadedModel, check_device, load_model, locate_model, missing_distributions
from attnlens.progress import Progress, Stage, progress_bar
from attnlens.report.page import write_page
from attnlens.settings import one_of

T = TypeVar("T")


@dataclass(frozen=True)
class ReportSettings:
    """Sizes of every stage; :data:`DEFAULT` and :data:`QUICK` are the two presets."""

    seq_len: int = 128
    eigen_seqs: int = 256
    dim: int | None = None  # the overlap matrices' d: None picks it from the split-half check
    reconstruct_seqs: int = 128
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = ("head", "layer", "all")
    plug_in_scopes: tuple[str, ...] = ("head", "all")
    batch_size: int = 16
    importance_seqs: int = 32  # held-out blocks of the importance and DAM judgements (the same blocks)
    # DAM learns at n = 64 (attention 4x cheaper than at 128) so that its runs converge within the
    # budget; its held-out blocks are then blocks of 64 tokens, not section 4's.
    # The target: each mask meets it, so patterns compare at the same sparsity. One target, three masks
    # (each its own noise and batch order): a verdict about a learned mask holds for every seed or for none.
    dam_sparsity: tuple[float, ...] = (0.9,)
    dam_mask_seeds: int = 3
    dam_reference: str | None = "band"  # the swap search beside the masks, from the band at the target
    dam_reference_rounds: int = 20
    dam_polish_rounds: int = 20  # the swap search that finishes each mask at its target
    dam_seq_len: int = 64
    dam_steps: int = 300  # the cap; the stopping rule ends the schedule when the mask has stopped changing
    dam_stop_window: int = 20
    dam_check_window: int = 40  # converged: no improvement over this many steps at a meaningful learning rate
    dam_train_seqs: int = 64
    # The task that judges the headline changes by accuracy (probe protocol). Each judgement is a
    # forward of every held-out example, so the task judges the claims' changes only (TASK_CHOICES),
    # on as many held-out examples as a paired half-width of task_target needs ("auto").
    task: str | None = "rotten-tomatoes"
    task_train: int = 5000  # the probe's training features are computed once and cached
    task_eval: int | str = "auto"
    task_target: float = 0.02
    task_ks: tuple[int, ...] = (16, 32)  # greedy keys in every layer
    task_scopes: tuple[str, ...] = ("head",)  # the maps' scopes the task judges
    task_classes: tuple[str, ...] = ("self", "cls", "sep")  # removed everywhere, each beside its random control
    # The papers' protocol (the FINETUNE preset): each judged change inside fine-tuning on the task,
    # several seeds; R also trained jointly with the weights; DAM's masks learned with the weights.
    protocol: str = "probe"
    seeds: int = 1
    finetune_steps: int = 200
    task_joint_r: bool = False
    dam_train_weights: bool = False
    # The plan: per head exact, partial or a window, at the fewest FLOPs within each budget of accuracy
    # (points), chosen on half of plan_task_eval examples and checked on the other half, always by the
    # probe (a fine-tune for every plan the search runs is out of reach). Skipped without a task.
    plan_budgets: tuple[float, ...] = (0.5, 1.0, 2.0)
    plan_task_eval: int = 3000
    plan_fit_seqs: int = 64
    plan_select_seqs: int = 32
    plan_ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    plan_widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


DEFAULT = ReportSettings()
QUICK = ReportSettings(
    seq_len=64,
    eigen_seqs=96,
    reconstruct_seqs=64,
    ks=(1, 4, 16, 64),
    strategies=("greedy", "random"),
    scopes=("head", "all"),
    plug_in_scopes=("head",),
    importance_seqs=8,
    dam_mask_seeds=1,  # 40 steps barely move a logit across the threshold: two seeds would end alike
    dam_reference_rounds=2,
    dam_polish_rounds=2,
    dam_steps=40,  # a short schedule: the quick report shows the machinery, not a converged mask
    dam_stop_window=10,
    dam_check_window=10,
    dam_train_seqs=16,
    task_train=256,
    task_eval=64,
    task_ks=(16,),
    plan_budgets=(1.0, 2.0),
    plan_task_eval=64,
    plan_fit_seqs=16,
    plan_select_seqs=4,
    plan_ks=(16,),
    plan_widths=(8,),
)

# The papers' protocol: the headline changes inside fine-tuning, 3 seeds each (cached per run), at n = 64.
# Each run is 200 steps of 16 examples (about 95 s on 2 cores, measured; up to 45 runs, so about 80 minutes
# there; minutes on a GPU), and a rerun loads every run from the cache. Paper A's questions
# (R fixed or learned jointly, shared by every layer or one per layer, k = 16 and 32) and SparseBERT's
# (a mask learned with the weights on the task against fixed patterns given the same training, at matched sparsity).
FINETUNE = replace(
    DEFAULT,
    seq_len=64,
    plug_in_scopes=("head", "layer", "all"),
    task_eval=1000,  # seed-to-seed spread, not examples, limits a fine-tuned verdict
    task_scopes=("layer", "all"),
    task_classes=("self",),
    dam_mask_seeds=1,  # the fine-tune seeds give the spread
    dam_reference=None,  # a swap search is for the pretrained weights; these masks learn with theirs
    protocol="finetune",
    seeds=3,
    task_joint_r=True,
    dam_train_weights=True,
)
QUICK_FINETUNE = replace(
    QUICK, plug_in_scopes=("head", "all"), task_scopes=("all",), task_classes=("self",), protocol="finetune", seeds=2,
    finetune_steps=10, task_joint_r=True, dam_train_weights=True, dam_mask_seeds=1, dam_reference=None,
)  # fmt: skip
REPORT_PROTOCOLS = ("probe", "finetune")
PRESETS = {("probe", False): DEFAULT, ("probe", True): QUICK, ("finetune", False): FINETUNE, ("finetune", True): QUICK_FINETUNE}

# A second model of the same geometry to compare subspaces with, when it is installed.
COMPANIONS = {"minilm-l6": "minilm-l3", "minilm-l3": "minilm-l6"}


def companion_for(model: LoadedModel) -> str | None:
    name = COMPANIONS.get(model.name)
    return name if name is not None and not missing_distributions(ALIASES[name]) else None


def stage_weights(quick: bool) -> dict[str, float]:
    """How long each stage takes, relative to the others, in the order they run: the seconds of a
    saved report (``stage_weights.json``, written by ``scripts/stage_weights.py``). They set how
    wide each stage's stretch of the one progress bar is, nothing else."""
    weights = json.loads(resources.files("attnlens.report").joinpath("stage_weights.json").read_text())
    return weights["quick" if quick else "default"]


class _Stages:
    """One progress bar for the whole report, in %: each stage a stretch of it as wide as its
    expected cost, which the stage's own bars move through (:class:`attnlens.progress.Stage`)."""

    def __init__(self, weights: dict[str, float], enabled: bool) -> None:
        self.bar = progress_bar(total=100, desc="report", unit="%", enabled=enabled)
        self.enabled = enabled
        total, names = sum(weights.values()), list(weights)
        # Whole-percent bounds from the running sum: the stretches meet, and the last ends at exactly 100.
        bounds = [round(100 * sum(weights[name] for name in names[:i]) / total) for i in range(len(names) + 1)]
        self.spans = {name: (low, high) for name, low, high in zip(names, bounds, bounds[1:])}
        self.timings: dict[str, float] = {}

    def run(self, name: str, work: Callable[[Progress], T]) -> T:
        """``work(progress)``, the stage ``name``: ``progress`` is its stretch of the bar (``False`` with the bar off)."""
        stage = Stage(self.bar, f"report: {name}", *self.spans[name])
        stage.move_to(stage.start)  # name the stage before its first bar opens
        start = time.perf_counter()
        result = work(stage if self.enabled else False)
        self.timings[name] = time.perf_counter() - start
        stage.finish()
        return result

    def close(self, complete: bool = True) -> None:
        """The bar's one final line: at 100% when the report is written, where it stopped when it failed."""
        if complete:
            self.bar.set_description_str("report", refresh=False)
            self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


def report(
    out: str | Path,
    *,
    model: str | LoadedModel = "minilm-l6",
    corpus: str = "kjv",
    compare: str | None = "auto",
    quick: bool = False,
    protocol: str = "probe",
    task: str | None = "default",
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Run every analysis on ``model`` and write results and ``report.html`` into ``out``.

    ``compare``: a second model for cross-model overlap (``auto``: the companion alias,
    if installed; ``None``: none). ``task`` judges every change by accuracy on a labelled task
    (``"default"``: the preset's, rotten-tomatoes; ``None``: proxies only) under ``protocol``:
    ``probe`` (a probe on the frozen model) or ``finetune`` (the papers' protocol, :data:`FINETUNE`:
    each judged change inside fine-tuning, 3 seeds, every run cached). Everything is written into a
    staging directory and moved into place at the end, so an interrupted report leaves nothing half-written.
    """
    one_of("protocol", protocol, REPORT_PROTOCOLS)
    out = check_out(out, overwrite)
    settings = PRESETS[protocol, quick]
    settings = replace(settings, ks=tuple(k for k in settings.ks if k <= settings.seq_len))
    if task != "default":
        settings = replace(settings, task=task)
    _check_inputs(settings, corpus, compare, device)
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    second = companion_for(loaded) if compare == "auto" else compare
    weights = {name: w for name, w in stage_weights(quick).items() if second or name != "eigen (second model)"}
    stages = _Stages(weights, progress)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
    try:
        results = _analyses(loaded, second, settings, corpus=corpus, seed=seed, device=device, stages=stages)
        names = {key: _directory_name(key, result) for key, result in results.items()}
        page, claims = stages.run("figures", lambda stage: write_page(staging, results, names, command, progress=stage))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        stages.close(complete=False)
        raise
    stages.close()
    meta = {
        "kind": "report",
        "format_version": 1,
        "model": loaded.describe(),
        "corpus": corpus,
        "quick": quick,
        "settings": asdict(settings),
        "results": names,
        "timings_s": stages.timings,
        "tables": ["claims"],
        **provenance(command),
    }
    claims.to_csv(staging / "claims.csv", index=False)
    (staging / "result.json").write_text(json.dumps(meta, indent=2))
    swap_into_place(staging, out)
    return out / page.name


def _analyses(
    loaded: LoadedModel, second: str | None, settings: ReportSettings, *, corpus: str, seed: int, device: str, stages: _Stages
) -> dict[str, Result]:
    """Every analysis of the report, one stage each, on the report's settings."""
    from attnlens.analysis.dam import dam
    from attnlens.analysis.eigen import eigen
    from attnlens.analysis.importance import importance
    from attnlens.analysis.overlap import overlap
    from attnlens.analysis.reconstruct import reconstruct

    common = dict(corpus=corpus, seq_len=settings.seq_len, seed=seed)
    task = _task_settings(settings)
    results: dict[str, object] = {}
    results["eigen"] = stages.run("eigen", lambda stage: eigen(loaded, num_seqs=settings.eigen_seqs, progress=stage, **common))
    eigens = [results["eigen"]]
    if second:
        results["eigen_second"] = stages.run(
            "eigen (second model)",
            lambda stage: eigen(second, num_seqs=settings.eigen_seqs, device=device, progress=stage, **common),
        )
        eigens.append(results["eigen_second"])
    results["overlap"] = stages.run("overlap", lambda stage: overlap(eigens, dim=settings.dim, progress=stage))
    results["reconstruct"] = stages.run(
        "reconstruct",
        lambda stage: reconstruct(
            loaded,
            num_seqs=settings.reconstruct_seqs,
            ks=settings.ks,
            strategies=settings.strategies,
            scopes=settings.scopes,
            plug_in=True,
            plug_in_scopes=settings.plug_in_scopes,
            batch_size=settings.batch_size,
            **task,
            **(
                dict(
                    task_strategies=("greedy",),
                    task_scopes=settings.task_scopes,
                    task_ks=settings.task_ks,
                    task_joint_r=settings.task_joint_r,
                )
                if task
                else {}
            ),
            progress=stage,
            **common,
        ),
    )
    judged = dict(batch_size=settings.batch_size, **task, **common)
    results["importance"] = stages.run(
        "importance",
        lambda stage: importance(
            loaded,
            num_seqs=settings.importance_seqs,
            **({"task_classes": settings.task_classes} if task else {}),
            progress=stage,
            **judged,
        ),
    )
    results["dam"] = stages.run(
        "dam",
        lambda stage: dam(
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
            **(_dam_task(settings) if task else {}),
            progress=stage,
            **{**judged, "seq_len": settings.dam_seq_len},
        ),
    )
    if task:
        results["plan"] = stages.run("plan", lambda stage: _plan(loaded, settings, stage, **judged))
    return results


def _plan(loaded: LoadedModel, settings: ReportSettings, progress: Progress, **judged: object) -> Result:
    """The plan stage: budgets of task accuracy under the probe, on the report's blocks and task."""
    from attnlens.analysis.plan import plan

    chosen = {**judged, "protocol": "probe", "seeds": 1, "task_eval": settings.plan_task_eval}
    return plan(
        loaded,
        max_drop=settings.plan_budgets,
        fit_seqs=settings.plan_fit_seqs,
        select_seqs=settings.plan_select_seqs,
        eval_seqs=settings.importance_seqs,
        ks=tuple(k for k in settings.plan_ks if k <= settings.seq_len),
        widths=settings.plan_widths,
        progress=progress,
        **chosen,
    )


def _dam_task(settings: ReportSettings) -> dict[str, str]:
    """What DAM's task judges, and what its masks learn from: the papers' protocol learns each mask
    on the task with the weights (SparseBERT) and fine-tunes band, local and bigbird alike."""
    if settings.protocol == "finetune":
        return {"task_patterns": "adapted", "train_on": "task"}
    return {"task_patterns": "compared"}


def _task_settings(settings: ReportSettings) -> dict[str, object]:
    """The task fields every stage shares (none without a task)."""
    if not settings.task:
        return {}
    names = ("task", "task_train", "task_eval", "task_target", "protocol", "seeds", "finetune_steps")
    return {name: getattr(settings, name) for name in names}


def _check_inputs(settings: ReportSettings, corpus: str, compare: str | None, device: str) -> None:
    """What the user chose, checked before the model loads: a bad name fails in seconds, not stages later."""
    from attnlens.analysis.task import TaskSettings
    from attnlens.data.corpus import load_corpus

    check_device(device)
    if settings.task is not None:
        TaskSettings(**_task_settings(settings))
    load_corpus(corpus)  # quick (kjv: a tenth of a second); the stages read it again by name
    if compare not in (None, "auto"):
        try:
            locate_model(compare)
        except AttnlensError as error:  # the model's own message and kind, said of the option that named it
            raise type(error)(f"`compare`: {error.args[0]}") from None


def _directory_name(key: str, result: object) -> str:
    model = result.meta.get("model", {}).get("name", "") if isinstance(result.meta.get("model"), dict) else ""
    return {"eigen": f"eigen-{model}", "eigen_second": f"eigen-{model}"}.get(key, key)


class Report(Result):
    """A written report: its settings and the result directories it holds."""

    kind = "report"
    main_table = "claims"

    def result(self, key: str) -> Result:
        """One of the report's results (``eigen``, ``overlap``, ``reconstruct``, ...), loaded."""
        if key not in self.meta["results"]:
            raise BadInput(f"the report has no '{key}' result; it has {', '.join(self.meta['results'])}")
        return load_result(self.path / self.meta["results"][key])

    @property
    def claims(self) -> pd.DataFrame:
        """The papers' claims beside what this model shows, as the page's summary table prints them."""
        return self.tables["claims"].fillna("")  # empty cells are read back from CSV as NaN

    def summary(self) -> str:
        return f"results {', '.join(self.meta['results'])}"

    def text(self) -> str:
        """The claims, one block per claim, and the results the report holds."""
        lines = []
        for _, row in self.claims.iterrows():
            lines += [f"{row['claim']}", *[f"  {column}: {row[column]}" for column in self.claims.columns[1:] if row[column]]]
        return "\n".join([*lines, f"results: {', '.join(self.meta['results'].values())}"])
