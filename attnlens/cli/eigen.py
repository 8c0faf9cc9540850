"""``attnlens eigen`` and ``attnlens overlap``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    LayersOption,
    NumSeqsOption,
    OutOption,
    OverwriteOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    app,
    parse_int_list,
)


@app.command()
def eigen(
    source: Annotated[str, typer.Argument(
        help="A store directory (attnlens extract), a model to stream from, or moments (attnlens moments WORKDIR, attnlens merge).")],
    out: OutOption,
    corpus: CorpusOption = "kjv",
    seq_len: SeqLenOption = 128,
    num_seqs: NumSeqsOption = 256,
    batch_size: BatchSizeOption = 32,
    quantity: Annotated[str | None, typer.Option("--quantity", help="scores, weights or log-weights (default scores).")] = None,
    uncentred: Annotated[bool, typer.Option("--uncentred", help="Second moment instead of covariance.")] = False,
    project_ones: Annotated[bool, typer.Option("--project-ones", help="Remove the all-ones direction (softmax ignores it).")] = False,
    per_query: Annotated[bool, typer.Option("--per-query", help="Analyse every query position separately.")] = False,
    queries: Annotated[str | None, typer.Option("--queries", help="Comma-separated query positions (implies --per-query).")] = None,
    full_matrices: Annotated[bool, typer.Option("--full-matrices", help="Also analyse flattened n x n matrices (needs a store).")] = False,
    keep: Annotated[int, typer.Option("--keep", help="Eigenvectors kept per unit.")] = 32,
    layers: LayersOption = None,
    seed: SeedOption = 0,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    progress: ProgressOption = True,
) -> None:
    """Eigen analysis of attention rows per head, layer and model, against a Gaussian baseline."""
    from attnlens.analysis.eigen import eigen as run
    from attnlens.io.results import check_out

    check_out(out, overwrite)
    result = run(
        source, corpus=corpus, seq_len=seq_len, num_seqs=num_seqs, batch_size=batch_size, quantity=quantity,
        centred=not uncentred, project_ones=project_ones, queries=parse_int_list(queries, "--queries"),
        per_query=per_query, full_matrices=full_matrices, keep=keep, layers=parse_int_list(layers, "--layers"),
        seed=seed, device=device, progress=progress,
    )
    result.save(out, overwrite=overwrite)
    summary = result.table.query("level != 'head' and query == query.max()")
    typer.echo(summary[["level", "layer", "rows", "k90", "k95", "k99", "effective_rank", "baseline_k90"]].to_string(index=False))
    typer.echo(f"wrote eigen result to {out}")


@app.command()
def overlap(
    eigen_dirs: Annotated[list[Path], typer.Argument(help="One or more eigen result directories.")],
    out: OutOption,
    dim: Annotated[int, typer.Option("--dim", "-d", help="Dimension of the compared eigenspaces.")] = 16,
    query: Annotated[int | None, typer.Option("--query", help="Query position for per-query results (default: last).")] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Overlap of top-d eigenspaces across layers, heads and models, with chance level and split-half check."""
    from attnlens.analysis.eigen import EigenResult
    from attnlens.analysis.overlap import overlap as run
    from attnlens.io.results import check_out

    check_out(out, overwrite)
    result = run([EigenResult.load(path) for path in eigen_dirs], dim=dim, query=query)
    result.save(out, overwrite=overwrite)
    typer.echo(f"chance level d/n = {result.chance:.3f}")
    for index, model in enumerate(result.meta["models"]):
        typer.echo(f"{model}: layer x layer overlap at d={dim}")
        typer.echo(_format_matrix(result.matrix(f"layers_{index}"), result.meta["layers"][index]))
    typer.echo(f"wrote overlap result to {out}")


def _format_matrix(matrix, labels) -> str:
    header = "      " + " ".join(f"L{label:<4}" for label in labels)
    rows = [f"L{label:<4} " + " ".join(f"{value:5.2f}" for value in row) for label, row in zip(labels, matrix)]
    return "\n".join([header, *rows])
