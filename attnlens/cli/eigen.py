"""``attnlens eigen``: spectra of attention rows per head, layer and model."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.analysis.eigen import EigenSettings

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
    ProgressOption,
    SeedOption,
    SeqLenOption,
    SourceArgument,
    app,
    model_named,
    parse_int_list,
    run_and_save,
    settings_from,
)


@app.command()
def eigen(
    source: SourceArgument = None,
    *,
    out: OutOption,
    model: ModelOption = None,
    corpus: CorpusOption = EigenSettings.corpus,
    seq_len: SeqLenOption = EigenSettings.seq_len,
    num_seqs: NumSeqsOption = EigenSettings.num_seqs,
    batch_size: BatchSizeOption = EigenSettings.batch_size,
    quantity: Annotated[
        str | None, typer.Option("--quantity", help="scores, weights or log-weights (default scores).")
    ] = EigenSettings.quantity,
    uncentred: Annotated[
        bool, typer.Option("--uncentred", help="Second moment instead of covariance.")
    ] = not EigenSettings.centred,
    project_ones: Annotated[
        bool, typer.Option("--project-ones", help="Remove the all-ones direction (softmax ignores it).")
    ] = EigenSettings.project_ones,
    per_query: Annotated[
        bool, typer.Option("--per-query", help="Analyse every query position separately.")
    ] = EigenSettings.per_query,
    queries: Annotated[
        str | None, typer.Option("--queries", help="Comma-separated query positions (implies --per-query).")
    ] = None,
    full_matrices: Annotated[
        bool, typer.Option("--full-matrices", help="Also analyse flattened n x n matrices (needs a store).")
    ] = EigenSettings.full_matrices,
    keep: Annotated[int, typer.Option("--keep", help="Eigenvectors kept per unit.")] = EigenSettings.keep,
    layers: LayersOption = None,
    seed: SeedOption = EigenSettings.seed,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Eigen analysis of attention rows per head, layer and model, against a Gaussian baseline."""
    from attnlens.analysis.eigen import eigen as run

    source = model_named(source, model, None, what="SOURCE")  # a model, or a store or moments as SOURCE
    settings = settings_from(
        EigenSettings,
        locals(),
        centred=not uncentred,
        queries=parse_int_list(queries, "--queries"),
        layers=parse_int_list(layers, "--layers"),
    )  # checked before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(source, settings, device=device, progress=progress))
