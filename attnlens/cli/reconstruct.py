"""``attnlens reconstruct``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from attnlens.analysis.reconstruct import ReconstructSettings

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    LayersOption,
    ModelOption,
    NumSeqsOption,
    OutOption,
    OverwriteOption,
    PrecisionOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    SourceArgument,
    app,
    parse_int_list,
    run_and_save,
    settings_from,
    source_named,
)
from .task_options import task_options


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


R = ReconstructSettings.defaults()  # the defaults live there


@app.command()
@task_options(R)
def reconstruct(
    source: SourceArgument = None,
    *,
    task_options: dict[str, Any],
    out: OutOption,
    ks: Annotated[str | None, typer.Option("--ks", help="Comma-separated k values; default 1,2,4,...,n.")] = None,
    select: Annotated[str, typer.Option("--select", help="Strategies: greedy, random, stride, local+global, eigen.")] = ",".join(
        R.strategies
    ),
    scope: Annotated[str, typer.Option("--scope", help="Map scopes: head, layer, all.")] = ",".join(R.scopes),
    rows: Annotated[str, typer.Option("--rows", help="auto, pooled or per-query (causal models: per-query).")] = R.rows,
    ridge: Annotated[float, typer.Option("--ridge", help="Relative ridge of the least-squares fit.")] = R.ridge,
    pairs: Annotated[
        bool, typer.Option("--pairs", help="Also pairs mode: k*n (query, key) pairs per matrix (needs a store).")
    ] = R.pairs,
    plug_in: Annotated[
        bool, typer.Option("--plug-in", help="Run the model with the reconstruction inside attention.")
    ] = R.plug_in,
    plug_in_layers: Annotated[
        str | None, typer.Option("--plug-in-layers", help="Layers to reconstruct in plug-in mode; default all.")
    ] = None,
    plug_in_scope: Annotated[
        str | None, typer.Option("--plug-in-scope", help="Scopes to run in plug-in mode; default all of --scope.")
    ] = None,
    objective: Annotated[str, typer.Option("--objective", help="auto, clm, mlm or hidden.")] = R.objective,
    precision: PrecisionOption = R.precision,
    model: ModelOption = None,
    learn_r: Annotated[
        bool, typer.Option("--learn-r", help="Fine-tune the maps on the objective (first strategy and scope).")
    ] = R.learn_r,
    learn_steps: Annotated[int, typer.Option("--learn-steps", help="Gradient steps of --learn-r.")] = R.learn_steps,
    eval_fraction: Annotated[
        float, typer.Option("--eval-fraction", help="Share of blocks held out for evaluation.")
    ] = R.eval_fraction,
    corpus: CorpusOption = R.corpus,
    seq_len: SeqLenOption = R.seq_len,
    num_seqs: NumSeqsOption = R.num_seqs,
    batch_size: BatchSizeOption = R.batch_size,
    layers: LayersOption = None,
    task_ks: Annotated[
        str | None,
        typer.Option("--task-ks", help="The k values the task judges (each a forward of every held-out example); default all."),
    ] = None,
    task_joint_r: Annotated[
        bool,
        typer.Option(
            "--task-joint-r", help="With --protocol finetune: also fine-tune each judged config with its maps trained jointly."
        ),
    ] = R.task_joint_r,
    seed: SeedOption = R.seed,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Compute k exact scores per row, rebuild the rest by least squares, measure the error on held-out blocks."""
    from attnlens.analysis.reconstruct import reconstruct as run

    source, model = source_named(source, model)  # a model as SOURCE or --model; a store as SOURCE, its model as --model
    settings = settings_from(
        ReconstructSettings,
        {**locals(), **task_options},
        ks=parse_int_list(ks, "--ks"),
        strategies=_names(select),
        scopes=_names(scope),
        layers=parse_int_list(layers, "--layers"),
        plug_in_layers=parse_int_list(plug_in_layers, "--plug-in-layers"),
        plug_in_scopes=None if plug_in_scope is None else _names(plug_in_scope),
        task_ks=parse_int_list(task_ks, "--task-ks"),
    )  # checked before any model loads
    run_and_save(
        out,
        overwrite=overwrite,
        figures=figures,
        work=lambda: run(source, settings, model=model, device=device, progress=progress),
    )
