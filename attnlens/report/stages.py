"""The report's stages: each analysis of attnlens run on its own settings from the report's preset
(:class:`~attnlens.report.presets.ReportSettings`), one function a stage, in the order :func:`analyses`
runs them under the report's one progress bar."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from attnlens.io.results import Result
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress
from attnlens.report.presets import ReportSettings

T = TypeVar("T")
Runner = Callable[[str, Callable[[Progress], T]], T]  # run(stage name, work(progress)) -> what work returns


def analyses(loaded: LoadedModel, second: str | None, settings: ReportSettings, *, device: str, run: Runner) -> dict[str, Result]:
    """Every analysis of the report, one stage each (``run`` times it and gives it its stretch of the bar)."""
    from attnlens.analysis.dam import dam
    from attnlens.analysis.eigen import eigen
    from attnlens.analysis.importance import importance
    from attnlens.analysis.overlap import overlap
    from attnlens.analysis.plan import plan
    from attnlens.analysis.reconstruct import reconstruct
    from attnlens.analysis.sinks import sinks

    results: dict[str, Result] = {}
    eigens = [run("eigen", lambda stage: eigen(loaded, settings.eigen, progress=stage))]
    if second:
        eigens.append(run("eigen (second model)", lambda stage: eigen(second, settings.eigen, device=device, progress=stage)))
    results["eigen"], *rest = eigens
    if rest:
        results["eigen_second"] = rest[0]
    results["overlap"] = run("overlap", lambda stage: overlap(eigens, dim=settings.dim, progress=stage))
    if settings.sinks is not None:  # a decoder's (ReportSettings.sized_for)
        results["sinks"] = run("sinks", lambda stage: sinks(loaded, settings.sinks, progress=stage))
    results["reconstruct"] = run("reconstruct", lambda stage: reconstruct(loaded, settings.reconstruct, progress=stage))
    results["importance"] = run("importance", lambda stage: importance(loaded, settings.importance, progress=stage))
    results["dam"] = run("dam", lambda stage: dam(loaded, settings.dam, progress=stage))
    if settings.plan is not None:  # the plan's budgets are points of accuracy: no task, no plan
        results["plan"] = run("plan", lambda stage: plan(loaded, settings.plan, progress=stage))
    return results
