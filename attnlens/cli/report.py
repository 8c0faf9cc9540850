"""``attnlens report``: the whole pipeline on one model, as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnlens.errors import BadInput
from attnlens.report.presets import took

from .app import (
    OUTPUT,
    CorpusOption,
    DeviceOption,
    ModelArgument,
    ModelOption,
    OverwriteOption,
    PrecisionOption,
    ProgressOption,
    SeedOption,
    app,
    model_named,
)
from .task_options import TASK_OPTIONS


@app.command()
def report(
    model: ModelArgument = None,
    *,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Directory to write the report to.", rich_help_panel=OUTPUT)
    ] = None,
    model_option: ModelOption = None,
    corpus: CorpusOption = "kjv",
    compare: Annotated[
        str, typer.Option("--compare", help="Second model for cross-model overlap: auto, none, or a model.")
    ] = "auto",
    quick: Annotated[
        bool, typer.Option("--quick", help=f"Small settings: a first look at every stage ({took('quick')}).")
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Every claim at the sizes meant for 30 minutes (minilm-l6 took longer when last measured; --dry-run says "
            "how long here): DAM with 3 seeds and the reference search, the "
            f"plan on 1,200 reviews, the reconstruction at k = 8 to 64 judged by the task. The default decides what fits "
            f"in 10 minutes ({took('default')}).",
        ),
    ] = False,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="How the task judges each change: probe (a probe on the frozen model) or finetune (the papers' protocol: "
            "each change inside fine-tuning, 3 seeds, 33 runs, every run cached; --dry-run says what it takes here; see "
            "docs/tasks.md).",
        ),
    ] = "probe",
    task: Annotated[
        str,
        typer.Option(
            "--task",
            help="Labelled task that judges every change by accuracy: default (imdb for k and the plan, rotten-tomatoes "
            "for the rest), none, or one task for all.",
        ),
    ] = "default",
    seed: SeedOption = 0,
    precision: PrecisionOption = "float32",
    margin: Annotated[str | None, TASK_OPTIONS["margin"].__metadata__[0]] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            help="The time the report may take here (10m, 2h): it forecasts the presets on this model and machine and sizes "
            "the largest that fits, cutting the task's examples, then blocks, DAM's seeds and steps (see docs/cli.md).",
        ),
    ] = None,
    sizes_from: Annotated[
        Path | None,
        typer.Option("--sizes-from", help="A saved report whose settings (sizes, task, corpus, seed) to make again."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check everything, forecast each stage's time on this model and machine (seconds of timed work), print it "
            "and stop: no stage runs, nothing is written.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    progress: ProgressOption = True,
) -> None:
    """Run every analysis and write a self-contained HTML report with all result files."""
    from attnlens.io.results import check_out
    from attnlens.report import write_report
    from attnlens.report.budget import parse_duration
    from attnlens.report.prepare import forecast_report, prepare

    if out is None and not dry_run:
        raise BadInput("give the directory to write the report to (--out DIR), or --dry-run to forecast its time only")
    seconds = None if budget is None else parse_duration(budget)
    checked = None if out is None or dry_run else check_out(out, overwrite)  # before the model loads
    prepared = prepare(
        model_named(model, model_option),
        corpus=corpus,
        compare=None if compare == "none" else compare,
        quick=quick,
        full=full,
        protocol=protocol,
        task=None if task == "none" else task,
        seed=seed,
        device=device,
        precision=precision,
        margin=margin,
        budget=seconds,
        sizes_from=sizes_from,
    )
    if checked is None:
        if prepared.budget is not None:
            typer.echo(prepared.budget.table())
        typer.echo(forecast_report(prepared, device=device).table())
        return
    page = write_report(checked, prepared, device=device, progress=progress)
    typer.echo(f"wrote the report to {page}")
