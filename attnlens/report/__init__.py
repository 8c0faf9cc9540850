"""The one-command report: every analysis of attnlens on one model, as a self-contained HTML page.

:func:`report` streams moments and runs the eigen analysis (and on a second model of
the same geometry, when one is installed), the subspace overlaps with their split-half
check, the reconstruction with plug-in, position importance and a short DAM run; it
writes every result directory, then ``report.html`` with the figures embedded, the
tables, the numbers that answer each research question of the two papers next to what
the papers report, and the exact command and versions.

Default settings finish in about 5 minutes on 2 CPU cores; ``quick`` in under a minute.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from attnlens.errors import BadInput
from attnlens.io.files import swap_into_place
from attnlens.io.provenance import provenance
from attnlens.io.results import Result, check_out, load_result
from attnlens.models.loading import ALIASES, LoadedModel, load_model, missing_distributions
from attnlens.progress import progress_bar
from attnlens.report.page import write_page


@dataclass(frozen=True)
class ReportSettings:
    """Sizes of every stage; :data:`DEFAULT` and :data:`QUICK` are the two presets."""

    seq_len: int = 128
    eigen_seqs: int = 256
    dim: int = 16
    reconstruct_seqs: int = 128
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = ("head", "layer", "all")
    plug_in_scopes: tuple[str, ...] = ("head", "all")
    batch_size: int = 16
    importance_seqs: int = 32  # held-out blocks of the importance and DAM judgements (the same blocks)
    dam_lambdas: tuple[float, ...] = (0.03, 0.1)
    dam_steps: int = 100
    dam_lr: float = 0.05
    dam_train_seqs: int = 64
    # The task that judges reconstruction, ablations, masks and patterns by accuracy (probe protocol).
    task: str | None = "rotten-tomatoes"
    task_train: int = 512
    task_eval: int = 128  # every change is judged on these: the stage's cost grows with them
    task_strategies: tuple[str, ...] = ("greedy", "random")  # reconstructions judged by the task


DEFAULT = ReportSettings()
QUICK = ReportSettings(
    seq_len=64,
    eigen_seqs=96,
    dim=8,
    reconstruct_seqs=64,
    ks=(1, 4, 16, 64),
    strategies=("greedy", "random"),
    scopes=("head", "all"),
    plug_in_scopes=("head",),
    # 15 Adam steps of 0.3 move the mask logits about as far as 100 steps of 0.05
    importance_seqs=8,
    dam_lambdas=(0.1,),
    dam_steps=15,
    dam_lr=0.3,
    dam_train_seqs=16,
    task_train=128,
    task_eval=64,
)

# A second model of the same geometry to compare subspaces with, when it is installed.
COMPANIONS = {"minilm-l6": "minilm-l3", "minilm-l3": "minilm-l6"}


def companion_for(model: LoadedModel) -> str | None:
    name = COMPANIONS.get(model.name)
    return name if name is not None and not missing_distributions(ALIASES[name]) else None


class _Stages:
    """One progress display for the whole report: stages weighted by their expected cost."""

    def __init__(self, weights: dict[str, float], enabled: bool) -> None:
        self.weights = weights
        self.bar = progress_bar(total=round(sum(weights.values())), desc="report", unit="%", enabled=enabled)
        self.timings: dict[str, float] = {}

    def run(self, name: str, work: Callable[[], object]) -> object:
        self.bar.set_description(f"report: {name}")
        start = time.perf_counter()
        result = work()
        self.timings[name] = time.perf_counter() - start
        self.bar.update(round(self.weights[name]))
        return result

    def close(self) -> None:
        self.bar.set_description("report")
        self.bar.update(self.bar.total - self.bar.n)  # rounding of the stage weights: end at 100%
        self.bar.close()


def report(
    out: str | Path,
    *,
    model: str | LoadedModel = "minilm-l6",
    corpus: str = "kjv",
    compare: str | None = "auto",
    quick: bool = False,
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
    (``"default"``: the preset's, rotten-tomatoes; ``None``: proxies only). Everything is written into a staging directory and
    moved into place at the end, so an interrupted report leaves nothing half-written.
    """
    from attnlens.analysis.dam import dam
    from attnlens.analysis.eigen import eigen
    from attnlens.analysis.importance import importance
    from attnlens.analysis.overlap import overlap
    from attnlens.analysis.reconstruct import reconstruct

    out = check_out(out, overwrite)
    settings = QUICK if quick else DEFAULT
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    settings = replace(settings, ks=tuple(k for k in settings.ks if k <= settings.seq_len))
    if task != "default":
        settings = replace(settings, task=task)
    second = companion_for(loaded) if compare == "auto" else compare
    # Relative cost of each stage, as measured on 2 CPU cores with the default settings.
    weights = {"eigen": 4, "overlap": 0.5, "reconstruct": 40, "importance": 12, "dam": 75, "figures": 6.5}
    if second:
        weights["eigen (second model)"] = 2
    stages = _Stages({name: 100 * w / sum(weights.values()) for name, w in weights.items()}, progress)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
    try:
        common = dict(corpus=corpus, seq_len=settings.seq_len, seed=seed, progress=False)
        task = dict(task=settings.task, task_train=settings.task_train, task_eval=settings.task_eval) if settings.task else {}
        results: dict[str, object] = {}
        results["eigen"] = stages.run("eigen", lambda: eigen(loaded, num_seqs=settings.eigen_seqs, **common))
        eigens = [results["eigen"]]
        if second:
            results["eigen_second"] = stages.run(
                "eigen (second model)", lambda: eigen(second, num_seqs=settings.eigen_seqs, device=device, **common)
            )
            eigens.append(results["eigen_second"])
        results["overlap"] = stages.run("overlap", lambda: overlap(eigens, dim=settings.dim))
        results["reconstruct"] = stages.run(
            "reconstruct",
            lambda: reconstruct(
                loaded,
                num_seqs=settings.reconstruct_seqs,
                ks=settings.ks,
                strategies=settings.strategies,
                scopes=settings.scopes,
                plug_in=True,
                plug_in_scopes=settings.plug_in_scopes,
                batch_size=settings.batch_size,
                **task,
                **({"task_strategies": settings.task_strategies} if task else {}),
                **common,
            ),
        )
        judged = dict(batch_size=settings.batch_size, **task, **common)
        results["importance"] = stages.run("importance", lambda: importance(loaded, num_seqs=settings.importance_seqs, **judged))
        results["dam"] = stages.run(
            "dam",
            lambda: dam(
                loaded,
                lambdas=settings.dam_lambdas,
                steps=settings.dam_steps,
                lr=settings.dam_lr,
                train_seqs=settings.dam_train_seqs,
                eval_seqs=settings.importance_seqs,
                **judged,
            ),
        )
        names = {key: _directory_name(key, result) for key, result in results.items()}
        page = stages.run("figures", lambda: write_page(staging, results, names, settings, command))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        stages.close()
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
        **provenance(command),
    }
    (staging / "result.json").write_text(json.dumps(meta, indent=2))
    swap_into_place(staging, out)
    return out / page.name


def _directory_name(key: str, result: object) -> str:
    model = result.meta.get("model", {}).get("name", "") if isinstance(result.meta.get("model"), dict) else ""
    return {"eigen": f"eigen-{model}", "eigen_second": f"eigen-{model}"}.get(key, key)


class Report(Result):
    """A written report: its settings and the result directories it holds."""

    kind = "report"

    def result(self, key: str) -> Result:
        """One of the report's results (``eigen``, ``overlap``, ``reconstruct``, ...), loaded."""
        if key not in self.meta["results"]:
            raise BadInput(f"the report has no '{key}' result; it has {', '.join(self.meta['results'])}")
        return load_result(self.path / self.meta["results"][key])

    def summary(self) -> str:
        return f"results {', '.join(self.meta['results'])}"
