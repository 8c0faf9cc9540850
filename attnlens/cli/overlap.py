"""``attnlens overlap``: shared subspaces of eigen results, across layers, heads and models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnlens.analysis.overlap import OverlapSettings

from .app import FiguresOption, OutOption, OverwriteOption, ProgressOption, app, run_and_save


@app.command()
def overlap(
    eigen_dirs: Annotated[list[Path], typer.Argument(help="One or more eigen result directories.")],
    out: OutOption,
    dim: Annotated[
        int | None,
        typer.Option("--dim", "-d", help="d of the overlap matrices (default: chosen from the split-half check)."),
    ] = OverlapSettings.dim,
    max_dim: Annotated[
        int | None, typer.Option("--max-dim", help="Overlaps are computed for every d up to this (default: n/2).")
    ] = OverlapSettings.max_dim,
    level: Annotated[
        float, typer.Option("--level", help="Split-half overlap a d must keep to count as determined by the data.")
    ] = OverlapSettings.level,
    query: Annotated[int | None, typer.Option("--query", help="Query position for per-query results (default: last).")] = None,
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Overlap of top-d eigenspaces across layers, heads and models, at every d, with chance level and split-half check."""
    from attnlens.analysis.eigen import EigenResult
    from attnlens.analysis.overlap import overlap as run

    settings = OverlapSettings(dim=dim, max_dim=max_dim, level=level, query=query)  # checked before any result is read
    run_and_save(
        out,
        overwrite=overwrite,
        figures=figures,
        work=lambda: run([EigenResult.load(path) for path in eigen_dirs], settings, progress=progress),
    )
