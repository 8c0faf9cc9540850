"""``attnlens dam``: learned sparse attention masks, against fixed patterns."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.analysis.dam import DEFAULT_SPARSITY, DamSettings

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
        str,
        typer.Option(
            "--variant",
            help="unstructured, structured (per head and offset), structured+global (plus cls/sep rows and columns) or class.",
        ),
    ] = D.variant,
    lambdas: Annotated[
        str | None,
        typer.Option(
            "--lambdas",
            help="Comma-separated sparsity weights λ >= 0 (loss units per unit of density), instead of --sparsity.",
        ),
    ] = None,
    sparsity: Annotated[
        str | None,
        typer.Option(
            "--sparsity",
            help="Comma-separated target sparsities in (0, 1): λ found by dual ascent; default "
            + ",".join(map(str, DEFAULT_SPARSITY))
            + ".",
        ),
    ] = None,
    dual_lr: Annotated[float, typer.Option("--dual-lr", help="Step of the dual ascent on λ with --sparsity.")] = D.dual_lr,
    dual_start: Annotated[
        float | None,
        typer.Option(
            "--dual-start",
            help="λ a --sparsity run starts from; default 0.1, or with --init where the first batches' gradients balance.",
        ),
    ] = D.dual_start,
    steps: Annotated[
        int, typer.Option("--steps", help="Most training steps (one batch each) per λ; fewer when the stopping rule holds.")
    ] = D.steps,
    stop_window: Annotated[
        int, typer.Option("--stop-window", help="Stopping rule: steps over which the mask must stop changing.")
    ] = D.stop_window,
    stop_flips: Annotated[
        float, typer.Option("--stop-flips", help="Stopping rule: most fraction of hard-mask positions flipped in the window.")
    ] = D.stop_flips,
    stop_plateau: Annotated[
        float, typer.Option("--stop-plateau", help="Stopping rule: most relative change of the objective across the window.")
    ] = D.stop_plateau,
    stop_margin: Annotated[
        float, typer.Option("--stop-margin", help="Stopping rule: a decision changes when its logit crosses 0 by more than this.")
    ] = D.stop_margin,
    tau: Annotated[
        str, typer.Option("--tau", help="Gumbel-sigmoid temperature: fixed (1.0) or annealed start:end (2:0.2).")
    ] = str(D.tau),
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate of the mask logits.")] = D.lr,
    lr_end: Annotated[
        float, typer.Option("--lr-end", help="Learning rate at the step cap, as a fraction of --lr (cosine schedule).")
    ] = D.lr_end,
    noise_end: Annotated[
        float, typer.Option("--noise-end", help="Scale of the Gumbel noise at the step cap (cosine schedule from 1).")
    ] = D.noise_end,
    init_keep: Annotated[float, typer.Option("--init-keep", help="Initial keep probability of every position.")] = D.init_keep,
    init: Annotated[
        str | None, typer.Option("--init", help="Start the logits at a fixed pattern, e.g. local(6), band(4), bigbird(3).")
    ] = D.init,
    removal: Annotated[
        str,
        typer.Option(
            "--removal",
            help="renormalise (zero removed weights, renormalise the rest), 1e4 (add -10^4 to removed scores) or inf.",
        ),
    ] = D.removal,
    train_weights: Annotated[
        bool,
        typer.Option(
            "--train-weights",
            help="Also fine-tune the model's weights; band, local and bigbird at matched sparsity get the same weight training.",
        ),
    ] = D.train_weights,
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
        DamSettings,
        locals(),
        lambdas=parse_float_list(lambdas, "--lambdas") if lambdas is not None else None,
        sparsity=parse_float_list(sparsity, "--sparsity") if sparsity is not None else None,
    )  # checked before any model loads
    check_out(out, overwrite)
    result = run(model, settings, device=device, progress=progress)
    save_result(result, out, overwrite=overwrite, figures=figures)
    shown = ("lambda", "target_sparsity", "trained_sparsity", "sparsity", "expected_sparsity", "rows_rescued", "loss",
             "delta", "delta_low", "delta_high", "steps", "converged")  # fmt: skip
    table = result.table.dropna(axis=1, how="all")
    typer.echo(table[[c for c in shown if c in table]].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    keep = result.keep_summary
    typer.echo(
        keep[keep["same_as"] == keep["class"]]
        .pivot(index="class", columns="lambda", values="keep_probability")
        .to_string(float_format=lambda v: f"{v:.3f}")
    )
    same = result.meta["equal_by_construction"]
    if same:
        equal = ", ".join(f"{name} = {other}" for name, other in same.items())
        typer.echo(f"equal by construction (the {settings.variant} layout decides them from the same logits): {equal}")
    capped = result.table.loc[~result.table["converged"].astype(bool), "lambda"].tolist()
    if capped:
        typer.echo(
            f"λ {', '.join(f'{lam:g}' for lam in capped)}: hit the step cap ({settings.steps}) before the stopping rule held"
        )
    if len(result.patterns):
        compared = result.compared()
        columns = ["lambda", "scope", "pattern", "value", "sparsity", "dam_delta", "delta", "difference", "difference_low",
                   "difference_high", "verdict"]  # fmt: skip
        typer.echo("against the best pattern at matched sparsity (difference: the mask's loss minus the pattern's):")
        typer.echo(compared[columns].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for name, note in result.meta["notes"].items():
        typer.echo(f"{name}: {note}")
    echo_task(result)
    typer.echo(f"wrote dam result to {out}")
