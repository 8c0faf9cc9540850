"""The one-command report: every analysis of attnlens on one model, as a self-contained HTML page.

:func:`report` streams moments and runs the eigen analysis (and on a second model of
the same geometry, when one is installed), the subspace overlaps at every d with their
split-half check, the reconstruction with plug-in, position importance, DAM masks and a
per-head plan of the cheapest attention within budgets of accuracy, each change judged by a
proxy and the claims' changes by task accuracy (:mod:`attnlens.report.stages`); it writes every
result directory, then ``report.html`` with every saved figure embedded, each paper's question
with its verdict first, the tables, and the exact command and versions.

Three sizes (:mod:`attnlens.report.presets`): ``quick``, a first look; the default, what decides
within 10 minutes on 2 cores; ``full``, every claim at the size 30 minutes allow.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TypeVar

import pandas as pd

from attnlens.errors import BadInput
from attnlens.io.files import swap_into_place
from attnlens.io.provenance import provenance
from attnlens.io.results import Result, check_out, load_result
from attnlens.models.loading import LoadedModel
from attnlens.progress import Progress, Stage, StageBar, progress_bar
from attnlens.report.budget import parse_duration
from attnlens.report.deciding import deciding
from attnlens.report.page import write_page
from attnlens.report.prepare import Prepared, forecast_report, prepare
from attnlens.report.presets import (
    DEFAULT,
    FINETUNE,
    FULL,
    PRESETS,
    QUICK,
    QUICK_FINETUNE,
    REPORT_PRESETS,
    REPORT_PROTOCOLS,
    ReportSettings,
)
from attnlens.report.stages import analyses
from attnlens.report.verdicts import RECORD_FIELDS

__all__ = [
    "DEFAULT",
    "FINETUNE",
    "FULL",
    "PRESETS",
    "QUICK",
    "QUICK_FINETUNE",
    "REPORT_PRESETS",
    "REPORT_PROTOCOLS",
    "Report",
    "ReportSettings",
    "report",
]

T = TypeVar("T")


class _Stages:
    """One progress bar for the whole report, in %: each stage a stretch of it as wide as its
    expected cost, which the stage's own bars move through (:class:`attnlens.progress.Stage`)."""

    def __init__(self, weights: dict[str, float], enabled: bool) -> None:
        bar = progress_bar(total=100, desc="report", unit="%", enabled=enabled)
        assert not isinstance(bar, StageBar)  # `enabled` is a bool: the report's bar is the top one, never a stage's
        self.bar = bar
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
    full: bool = False,
    protocol: str = "probe",
    task: str | None = "default",
    seed: int = 0,
    device: str = "cpu",
    precision: str = "float32",
    margin: float | str | None = None,
    budget: float | str | None = None,
    sizes_from: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Run every analysis on ``model`` and write results and ``report.html`` into ``out``.

    ``quick``: a first look at every stage on small settings; ``full``: every claim at the size 30 minutes allow, the
    slow stages at full size (:mod:`attnlens.report.presets`). ``compare``: a second model for
    cross-model overlap (``auto``: the companion alias, if installed; ``None``: none). ``task``
    judges the claims' changes by accuracy on a labelled task (``"default"``: the preset's,
    imdb for the claims about computing fewer scores and rotten-tomatoes for the rest; a name: that
    task for all; ``None``: proxies only) under ``protocol``: ``probe`` (a probe on the frozen
    model) or ``finetune`` (the papers' protocol, :data:`~attnlens.report.presets.FINETUNE`: each
    judged change inside fine-tuning, 3 seeds, every run cached). ``precision``: the arithmetic of the
    forwards and the training that judge a change (``bfloat16``: faster; captured scores stay float32).
    ``margin``: the loss of accuracy a change may cost and still keep the model, in points (``2``, the default)
    or as a share of the unmodified accuracy (``"3%"``), :mod:`attnlens.analysis.margin`.
    ``budget`` (seconds, or ``"10m"``, ``"2h"``): the report sizes itself to that time here
    (:mod:`attnlens.report.budget`); ``sizes_from``: a saved report's directory, whose settings it makes again.
    Before the first stage the report forecasts each stage's time here (:func:`forecast_report`; printed
    with ``progress``), its progress bar runs on that forecast, and ``result.json`` keeps it beside the
    actual seconds. Everything is written into a staging directory and moved into place at the end, so an
    interrupted report leaves nothing half-written.
    """
    out = check_out(out, overwrite)
    prepared = prepare(
        model, corpus=corpus, compare=compare, quick=quick, full=full, protocol=protocol, task=task, seed=seed, device=device,
        precision=precision, margin=margin, budget=parse_duration(budget) if isinstance(budget, str) else budget,
        sizes_from=sizes_from,
    )  # fmt: skip
    return write_report(out, prepared, device=device, progress=progress, command=command)


def write_report(
    out: Path, prepared: Prepared, *, device: str = "cpu", progress: bool = True, command: str | None = None
) -> Path:
    """:func:`report`'s stages and page for a report :func:`prepare` checked and sized (``out``: checked by
    :func:`~attnlens.io.results.check_out`): its forecast first (printed with ``progress``), then every stage."""
    predicted = forecast_report(prepared, device=device)
    open_claims = deciding(prepared, predicted)  # what deciding a claim the report leaves open takes here
    if progress:
        sized = "" if prepared.budget is None else f"{prepared.budget.table()}\n"
        print(f"{sized}forecast for this machine (the report starts now):\n{predicted.table()}", file=sys.stderr, flush=True)
    # each stage's stretch of the bar as wide as its forecast (a sliver at least: a stage the forecast prices at 0 s still shows)
    stages = _Stages({name: max(stage.seconds, 0.01) for name, stage in predicted.stages.items()}, progress)
    out.parent.mkdir(parents=True, exist_ok=True)  # the staging directory sits beside `out`, so the last move is a rename
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        results = analyses(prepared.loaded, prepared.second, prepared.settings, device=device, run=stages.run)
        names = _directory_names(results)
        page, claims = stages.run(
            "figures",
            lambda stage: write_page(
                staging, results, names, command, prepared.name, progress=stage, deciding=open_claims, budget=prepared.budget
            ),
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        stages.close(complete=False)
        raise
    stages.close()
    meta = {
        "kind": "report",
        "format_version": 1,
        "model": prepared.loaded.describe(),
        "corpus": prepared.settings.eigen.corpus,
        "preset": prepared.name,
        "settings": prepared.settings.to_dict(),
        "results": names,
        "timings_s": stages.timings,
        "forecast": {**predicted.to_dict(), "deciding": open_claims.to_dict()},
        **({"budget": prepared.budget.to_dict()} if prepared.budget is not None else {}),
        "tables": ["claims"],
        **provenance(command),
    }
    claims.to_csv(staging / "claims.csv", index=False)
    (staging / "result.json").write_text(json.dumps(meta, indent=2))
    swap_into_place(staging, out)
    return out / page.name


def _directory_names(results: dict) -> dict[str, str]:
    """Each result's directory (:func:`_directory_name`); a second model of the same name (two directories
    both called ``model``) gets ``-compared`` after it rather than the first one's directory."""
    names = {key: _directory_name(key, result) for key, result in results.items()}
    if "eigen_second" in names and names["eigen_second"] == names.get("eigen"):
        names["eigen_second"] += "-compared"
    return names


def _directory_name(key: str, result: Result) -> str:
    """The directory a result is written to: its key, and for a spectrum the model's name, a path or Hub id by
    its last part (``eigen-model`` for ``/data/model``, ``eigen-gemma-3-270m`` for ``google/gemma-3-270m``).

    >>> class Spectrum:
    ...     meta = {"model": {"name": "/data/runs/my-bert/"}}
    >>> _directory_name("eigen", Spectrum()), _directory_name("overlap", Spectrum())
    ('eigen-my-bert', 'overlap')
    """
    model = result.meta.get("model", {}).get("name", "") if isinstance(result.meta.get("model"), dict) else ""
    model = PurePosixPath(str(model).replace("\\", "/").rstrip("/")).name
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
        words = [column for column in self.claims.columns[1:] if column not in RECORD_FIELDS]  # the typed fields: data
        for _, row in self.claims.iterrows():
            lines += [f"{row['claim']}", *[f"  {column}: {row[column]}" for column in words if row[column]]]
        return "\n".join([*lines, f"results: {', '.join(self.meta['results'].values())}"])
