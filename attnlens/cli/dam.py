"""``attnlens dam``: learned sparse attention masks, against fixed patterns."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.analysis.dam import DamSettings

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
from .importance import BootstrapOption, ClassesOption, ObjectiveOption, parse_float_list

D = DamSettings  # the defaults live there


@app.command()
def dam(
    out: OutOption,
    model: ModelOption = "minilm-l6",
    corpus: CorpusOption = D.corpus,
    variant: Annotated[
        str, typer.Option("--variant", help="unstructured, structured (per head and offset) or class.")
    ] = D.variant,
    lambdas: Annotated[
        str, typer.Option("--lambdas", help="Comma-separated sparsity weights λ >= 0 (loss units per unit of density).")
    ] = ",".join(map(str, D.lambdas)),
    steps: Annotated[int, typer.Option("--steps", help="Training steps (one batch each) per λ.")] = D.steps,
    tau: Annotated[
        str, typer.Option("--tau", help="Gumbel-sigmoid temperature: fixed (1.0) or annealed start:end (2:0.2).")
    ] = str(D.tau),
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate of the mask logits.")] = D.lr,
    init_keep: Annotated[float, typer.Option("--init-keep", help="Initial keep probability of every position.")] = D.init_keep,
    removal: Annotated[str, typer.Option("--removal", help="1e4 (add -10^4 to removed scores) or inf.")] = D.removal,
    train_weights: Annotated[bool, typer.Option("--train-weights", help="Also fine-tune the model's weights.")] = D.train_weights,
    weights_lr: Annotated[
        float, typer.Option("--weights-lr", help="Learning rate of the weights with --train-weights.")
    ] = D.weights_lr,
    classes: ClassesOption = D.classes,
    objective: ObjectiveOption = D.objective,
    seq_len: SeqLenOption = D.seq_len,
    train_seqs: Annotated[int, typer.Option("--train-seqs", help="Blocks to train the masks on.")] = D.train_seqs,
    eval_seqs: Annotated[int, typer.Option("--eval-seqs", help="Held-out blocks to judge them on.")] = D.eval_seqs,
    batch_size: BatchSizeOption = D.batch_size,
    patterns: Annotated[
        bool, typer.Option("--patterns/--no-patterns", help="Also judge the fixed sparse patterns.")
    ] = D.patterns,
    bootstrap: BootstrapOption = D.bootstrap,
    task: TaskOption = DamSettings.task,
    protocol: ProtocolOption = DamSettings.protocol,
    task_train: TaskTrainOption = DamSettings.task_train,
    task_eval: TaskEvalOption = DamSettings.task_eval,
    text_column: TextColumnOption = DamSettings.text_column,
    label_column: LabelColumnOption = DamSettings.label_column,
    probe_c: ProbeCOption = DamSettings.probe_c,
    finetune_steps: FinetuneStepsOption = DamSettings.finetune_steps,
    finetune_lr: FinetuneLrOption = DamSettings.finetune_lr,
    seed: SeedOption = D.seed,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Learn sparse attention masks (DAM) for each λ and compare them with fixed sparse patterns."""
    from attnlens.analysis.dam import dam as run
    from attnlens.io.results import check_out

    settings = settings_from(
        DamSettings, locals(), lambdas=parse_float_list(lambdas, "--lambdas")
    )  # checked before any model loads
    check_out(out, overwrite)
    result = run(model, settings, device=device, progress=progress)
    save_result(result, out, overwrite=overwrite, figures=figures)
    typer.echo(
        result.table[
            [c for c in ("lambda", "sparsity", "loss", "delta", "delta_low", "delta_high") if c in result.table]
        ].to_string(index=False, float_format=lambda v: f"{v:.4f}")
    )
    typer.echo(
        result.keep_summary.pivot(index="class", columns="lambda", values="keep_probability").to_string(
            float_format=lambda v: f"{v:.3f}"
        )
    )
    for name, note in result.meta["notes"].items():
        typer.echo(f"{name}: {note}")
    echo_task(result)
    typer.echo(f"wrote dam result to {out}")
