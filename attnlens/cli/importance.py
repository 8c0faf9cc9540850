"""``attnlens importance``: which position classes of the attention matrix a model needs."""

from __future__ import annotations

from typing import Annotated

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
    FinetuneLrOption,
    FinetuneStepsOption,
    LabelColumnOption,
    ModelArgument,
    ModelOption,
    ObjectiveOption,
    OutOption,
    OverwriteOption,
    PrecisionOption,
    ProbeCOption,
    ProgressOption,
    ProtocolOption,
    SeedOption,
    SeedsOption,
    SeqLenOption,
    TaskEvalOption,
    TaskExcludeOption,
    TaskOption,
    TaskPoolOption,
    TaskTargetOption,
    TaskTrainOption,
    TextColumnOption,
    app,
    model_named,
    run_and_save,
    settings_from,
)

S = ImportanceSettings.defaults()  # the defaults live there


@app.command()
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
    task: TaskOption = S.task,
    protocol: ProtocolOption = S.protocol,
    task_exclude: TaskExcludeOption = S.task_exclude,
    task_train: TaskTrainOption = S.task_train,
    task_eval: TaskEvalOption = str(S.task_eval),
    task_pool: TaskPoolOption = S.task_pool,
    task_target: TaskTargetOption = S.task_target,
    task_classes: Annotated[
        str | None,
        typer.Option(
            "--task-classes",
            help="Classes the task judges, each beside its random control (each a forward of every held-out example); "
            "default all.",
            rich_help_panel=TASK,
        ),
    ] = None,
    text_column: TextColumnOption = S.text_column,
    label_column: LabelColumnOption = S.label_column,
    probe_c: ProbeCOption = S.probe_c,
    finetune_steps: FinetuneStepsOption = S.finetune_steps,
    finetune_lr: FinetuneLrOption = S.finetune_lr,
    seeds: SeedsOption = S.seeds,
    *,
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
    settings = settings_from(ImportanceSettings, locals())  # checked before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(named, settings, device=device, progress=progress))
