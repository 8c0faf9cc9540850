"""``attnlens importance``: which position classes of the attention matrix a model needs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from attnlens.analysis.importance import ImportanceSettings

from .app import (
    ANALYSIS,
    SOURCE,
    TASK,
    BatchSizeOption,
    BootstrapOption,
    ClassesOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    ModelArgument,
    ModelOption,
    ObjectiveOption,
    OutOption,
    OverwriteOption,
    PrecisionOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    app,
    model_named,
    run_and_save,
    settings_from,
)
from .task_options import task_options

S = ImportanceSettings.defaults()  # the defaults live there


@app.command()
@task_options(S)
def importance(
    model: ModelArgument = None,
    corpus: CorpusOption = S.corpus,
    seq_len: SeqLenOption = S.seq_len,
    num_seqs: Annotated[
        int, typer.Option("--num-seqs", help="Held-out blocks to evaluate on.", rich_help_panel=SOURCE)
    ] = S.num_seqs,
    batch_size: BatchSizeOption = S.batch_size,
    seed: SeedOption = S.seed,
    classes: ClassesOption = None,
    objective: ObjectiveOption = S.objective,
    per: Annotated[
        str, typer.Option("--per", help="Ablation scope beside the whole model: model, layer or head.", rich_help_panel=ANALYSIS)
    ] = S.per,
    gradient: Annotated[
        bool, typer.Option("--gradient/--no-gradient", help="Also compute gradient importance.", rich_help_panel=ANALYSIS)
    ] = S.gradient,
    bootstrap: BootstrapOption = S.bootstrap,
    precision: PrecisionOption = S.precision,
    task_classes: Annotated[
        str | None,
        typer.Option(
            "--task-classes",
            help="Classes the task judges, each beside its random control (each a forward of every held-out example); "
            "default all.",
            rich_help_panel=TASK,
        ),
    ] = None,
    *,
    task_options: dict[str, Any],
    out: OutOption,
    model_option: ModelOption = None,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Attention mass, ablation importance (with a random control) and gradient importance of position classes."""
    from attnlens.analysis.importance import importance as run

    named = model_named(model, model_option)
    settings = settings_from(ImportanceSettings, {**locals(), **task_options})  # checked before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(named, settings, device=device, progress=progress))
