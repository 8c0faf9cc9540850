"""``attnlens overlap``: shared subspaces of eigen results, across layers, heads and models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnlens.analysis.overlap import OverlapSettings

from .app import FiguresOption, OutOption, OverwriteOption, app, save_result


@app.command()
def overlap(
    eigen_dirs: Annotated[list[Path], typer.Argument(help="One or more eigen result directories.")],
    out: OutOption,
    dim: Annotated[int, typer.Option("--dim", "-d", help="Dimension of the compared eigenspaces.")] = OverlapSettings.dim,
    query: Annotated[int | None, typer.Option("--query", help="Query position for per-query results (default: last).")] = None,
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
) -> None:
    """Overlap of top-d eigenspaces across layers, heads and models, with chance level and split-half check."""
    from attnlens.analysis.eigen import EigenResult
    from attnlens.analysis.overlap import overlap as run
    from attnlens.io.results import check_out

    settings = OverlapSettings(dim=dim, query=query)  # checked before any result is read
    check_out(out, overwrite)
    result = run([EigenResult.load(path) for path in eigen_dirs], settings)
    save_result(result, out, overwrite=overwrite, figures=figures)
    typer.echo(f"chance level d/n = {result.chance:.3f}")
    for index, model in enumerate(result.meta["models"]):
        typer.echo(f"{model}: layer x layer overlap at d={dim}")
        typer.echo(_format_matrix(result.matrix(f"layers_{index}"), result.meta["layers"][index]))
    typer.echo(f"wrote overlap result to {out}")


def _format_matrix(matrix, labels) -> str:
    header = "      " + " ".join(f"L{label:<4}" for label in labels)
    rows = [f"L{label:<4} " + " ".join(f"{value:5.2f}" for value in row) for label, row in zip(labels, matrix)]
    return "\n".join([header, *rows])
