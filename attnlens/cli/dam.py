"""``attnlens dam``: learned sparse attention masks, against fixed patterns."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    ModelOption,
    OutOption,
    OverwriteOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    app,
    save_result,
)
from .importance import BootstrapOption, ClassesOption, ObjectiveOption, parse_float_list


@app.command()
def dam(
    out: OutOption,
    model: ModelOption = "minilm-l6",
    corpus: CorpusOption = "kjv",
    variant: Annotated[str, typer.Option("--variant", help="unstructured, structured (per head and offset) or class.")] = "structured",
    lambdas: Annotated[str, typer.Option("--lambdas", help="Comma-separated sparsity weights λ >= 0 (loss units per unit of density).")] = "0.01,0.03,0.1,0.3",
    steps: Annotated[int, typer.Option("--steps", help="Training steps (one batch each) per λ.")] = 100,
    tau: Annotated[str, typer.Option("--tau", help="Gumbel-sigmoid temperature: fixed (1.0) or annealed start:end (2:0.2).")] = "1.0",
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate of the mask logits.")] = 0.05,
    init_keep: Annotated[float, typer.Option("--init-keep", help="Initial keep probability of every position.")] = 0.9,
    removal: Annotated[str, typer.Option("--removal", help="1e4 (add -10^4 to removed scores) or inf.")] = "1e4",
    train_weights: Annotated[bool, typer.Option("--train-weights", help="Also fine-tune the model's weights.")] = False,
    weights_lr: Annotated[float, typer.Option("--weights-lr", help="Learning rate of the weights with --train-weights.")] = 1e-5,
    classes: ClassesOption = None,
    objective: ObjectiveOption = "auto",
    seq_len: SeqLenOption = 128,
    train_seqs: Annotated[int, typer.Option("--train-seqs", help="Blocks to train the masks on.")] = 256,
    eval_seqs: Annotated[int, typer.Option("--eval-seqs", help="Held-out blocks to judge them on.")] = 64,
    batch_size: BatchSizeOption = 16,
    patterns: Annotated[bool, typer.Option("--patterns/--no-patterns", help="Also judge the fixed sparse patterns.")] = True,
    bootstrap: BootstrapOption = 1000,
    seed: SeedOption = 0,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Learn sparse attention masks (DAM) for each λ and compare them with fixed sparse patterns."""
    from attnlens.analysis.dam import dam as run
    from attnlens.io.results import check_out

    check_out(out, overwrite)
    result = run(model, corpus, variant=variant, lambdas=parse_float_list(lambdas, "--lambdas"), steps=steps, tau=tau, lr=lr,
                 init_keep=init_keep, removal=removal, train_weights=train_weights, weights_lr=weights_lr, classes=classes,
                 objective=objective, seq_len=seq_len, train_seqs=train_seqs, eval_seqs=eval_seqs, batch_size=batch_size,
                 patterns=patterns, bootstrap=bootstrap, seed=seed, device=device, progress=progress)
    save_result(result, out, overwrite=overwrite, figures=figures)
    typer.echo(result.table[["lambda", "sparsity", "loss", "delta", "delta_low", "delta_high"]].to_string(
        index=False, float_format=lambda v: f"{v:.4f}"))
    typer.echo(result.keep_summary.pivot(index="class", columns="lambda", values="keep_probability").to_string(
        float_format=lambda v: f"{v:.3f}"))
    for name, note in result.meta["notes"].items():
        typer.echo(f"{name}: {note}")
    typer.echo(f"wrote dam result to {out}")
