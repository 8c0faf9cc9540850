"""``attnlens importance``: which position classes of the attention matrix a model needs."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.analysis.importance import ImportanceSettings
from attnlens.errors import AttnlensError

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    FinetuneLrOption,
    FinetuneStepsOption,
    LabelColumnOption,
    ModelOption,
    OutOption,
    OverwriteOption,
    ProbeCOption,
    ProgressOption,
    ProtocolOption,
    SeedOption,
    SeqLenOption,
    TaskEvalOption,
    TaskOption,
    TaskTrainOption,
    TextColumnOption,
    app,
    echo_task,
    save_result,
    settings_from,
)

ClassesOption = Annotated[
    str | None,
    typer.Option(
        "--classes",
        help="Comma-separated position classes: self, prev, next, band(w), cls, sep, punct, other "
        "[default: all but band; classes that never occur are dropped].",
    ),
]
ObjectiveOption = Annotated[
    str,
    typer.Option(
        "--objective", help="auto, clm (next-token loss), mlm (masked-token loss) or hidden (cosine to the unmodified model)."
    ),
]
BootstrapOption = Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples over blocks for the 95% intervals.")]


def parse_float_list(text: str, option: str) -> list[float]:
    """``"1e-3, 0.01"`` -> ``[0.001, 0.01]``.

    >>> parse_float_list("0, 1e-3,0.1", "--lambdas")
    [0.0, 0.001, 0.1]
    """
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AttnlensError(f"{option} '{text}' is not a comma-separated list of numbers, e.g. {option} 0.01,0.1") from None


@app.command()
def importance(
    out: OutOption,
    model: ModelOption = "minilm-l6",
    corpus: CorpusOption = ImportanceSettings.corpus,
    classes: ClassesOption = ImportanceSettings.classes,
    objective: ObjectiveOption = ImportanceSettings.objective,
    per: Annotated[
        str, typer.Option("--per", help="Ablation scope beside the whole model: model, layer or head.")
    ] = ImportanceSettings.per,
    seq_len: SeqLenOption = ImportanceSettings.seq_len,
    num_seqs: Annotated[int, typer.Option("--num-seqs", help="Held-out blocks to evaluate on.")] = ImportanceSettings.num_seqs,
    batch_size: BatchSizeOption = ImportanceSettings.batch_size,
    bootstrap: BootstrapOption = ImportanceSettings.bootstrap,
    gradient: Annotated[
        bool, typer.Option("--gradient/--no-gradient", help="Also compute gradient importance.")
    ] = ImportanceSettings.gradient,
    task: TaskOption = ImportanceSettings.task,
    protocol: ProtocolOption = ImportanceSettings.protocol,
    task_train: TaskTrainOption = ImportanceSettings.task_train,
    task_eval: TaskEvalOption = ImportanceSettings.task_eval,
    text_column: TextColumnOption = ImportanceSettings.text_column,
    label_column: LabelColumnOption = ImportanceSettings.label_column,
    probe_c: ProbeCOption = ImportanceSettings.probe_c,
    finetune_steps: FinetuneStepsOption = ImportanceSettings.finetune_steps,
    finetune_lr: FinetuneLrOption = ImportanceSettings.finetune_lr,
    seed: SeedOption = ImportanceSettings.seed,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Attention mass, ablation importance (with a random control) and gradient importance of position classes."""
    from attnlens.analysis.importance import importance as run
    from attnlens.io.results import check_out

    settings = settings_from(ImportanceSettings, locals())  # checked before any model loads
    check_out(out, overwrite)
    result = run(model, settings, device=device, progress=progress)
    save_result(result, out, overwrite=overwrite, figures=figures)
    columns = [
        c
        for c in ("class", "share", "mass", "delta", "delta_low", "delta_high", "random", "random_low", "random_high", "gradient")
        if c in result.table
    ]
    typer.echo(result.table[result.table["occurs"]][columns].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for name, note in result.meta["notes"].items():
        typer.echo(f"{name}: {note}")
    echo_task(result)
    typer.echo(f"wrote importance result to {out}")
