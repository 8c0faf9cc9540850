"""``attnlens figures``: regenerate every figure from saved results, without the model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import OutOption, app


@app.command()
def figures(
    result_dirs: Annotated[list[Path], typer.Argument(help="Result directories written by attnlens commands.")],
    out: OutOption,
) -> None:
    """Redraw the figures of saved results (PNG and PDF), one folder per result, named after it."""
    from attnlens.io.results import load_result

    results = [(path, load_result(path)) for path in result_dirs]  # read everything before writing anything
    for path, result in results:
        written = result.save_figures(Path(out) / path.resolve().name)
        typer.echo(f"{path}: {len(written) // 2} figures in {Path(out) / path.resolve().name}")
