"""``attnlens report``: the whole pipeline on one model, as one HTML page."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.report.presets import took

from .app import (
    CorpusOption,
    DeviceOption,
    ModelArgument,
    ModelOption,
    OutOption,
    OverwriteOption,
    ProgressOption,
    SeedOption,
    app,
    model_named,
)


@app.command()
def report(
    model: ModelArgument = None,
    *,
    out: OutOption,
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
            help=f"Every claim at the size 30 minutes allow ({took('full')}): DAM with 3 seeds and the reference search, the "
            f"plan on 1,200 reviews, the reconstruction at k = 8 to 64 judged by the task. The default decides what fits "
            f"in 10 minutes ({took('default')}).",
        ),
    ] = False,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="How the task judges each change: probe (a probe on the frozen model) or finetune (the papers' protocol: "
            f"each change inside fine-tuning, 3 seeds, 33 runs, every run cached, {took('finetune')}; see docs/tasks.md).",
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
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    progress: ProgressOption = True,
) -> None:
    """Run every analysis and write a self-contained HTML report with all result files."""
    from attnlens.report import report as run

    page = run(
        out,
        model=model_named(model, model_option),
        corpus=corpus,
        compare=None if compare == "none" else compare,
        quick=quick,
        full=full,
        protocol=protocol,
        task=None if task == "none" else task,
        seed=seed,
        device=device,
        overwrite=overwrite,
        progress=progress,
    )
    typer.echo(f"wrote the report to {page}")
