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
) -> None:
    """Overlap of top-d eigenspaces across layers, heads and models, at every d, with chance level and split-half check."""
    from attnlens.analysis.eigen import EigenResult
    from attnlens.analysis.overlap import overlap as run
    from attnlens.io.results import check_out

    settings = OverlapSettings(dim=dim, max_dim=max_dim, level=level, query=query)  # checked before any result is read
    check_out(out, overwrite)
    result = run([EigenResult.load(path) for path in eigen_dirs], settings)
    save_result(result, out, overwrite=overwrite, figures=figures)
    typer.echo(f"matrices at d = {result.dim} ({result.meta['dim_rule']}); chance level d/n = {result.chance:.3f}")
    for name in result.layer_matrices:
        first, last = result.results_of(name)
        models = (
            result.meta["models"][first] if first == last else f"{result.meta['models'][first]} x {result.meta['models'][last]}"
        )
        typer.echo(f"{models}: layer x layer overlap at d = {result.dim}")
        typer.echo(_format_matrix(result.matrix(name), result.meta["layers"][first], result.meta["layers"][last]))
    typer.echo(f"layer pairs at the largest d where both split-half overlaps stay >= {result.meta['level']:g}:")
    typer.echo(_format_pairs(result))
    typer.echo(f"wrote overlap result to {out}: every d up to {result.max_dim} and the head pairs in its tables")


def _format_matrix(matrix, rows, columns) -> str:
    header = "      " + " ".join(f"L{label:<4}" for label in columns)
    lines = [f"L{label:<4} " + " ".join(f"{value:5.2f}" for value in row) for label, row in zip(rows, matrix)]
    return "\n".join([header, *lines])


def _format_pairs(result) -> str:
    pairs = result.pairs
    lines = [f"{'unit a':<16} {'unit b':<16} {'d':>3} {'overlap':>7} {'split-half a':>12} {'split-half b':>12} {'chance':>6}"]
    for _, row in pairs.iterrows():
        a, b = (f"{row[f'model_{x}']} " + (f"L{row[f'layer_{x}']}" if row[f"layer_{x}"] >= 0 else "all") for x in "ab")
        values = f"{row['overlap']:7.2f} {row['split_half_a']:12.2f} {row['split_half_b']:12.2f} {row['chance']:6.3f}"
        lines.append(f"{a:<16} {b:<16} {row['d']:>3} " + (values if row["d"] else "no d the data determine for both"))
    return "\n".join(lines)
