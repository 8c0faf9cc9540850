"""``attnlens figures``: regenerate every figure from saved results, without the model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import OutOption, ProgressOption, app


@app.command()
def figures(
    result_dirs: Annotated[list[Path], typer.Argument(help="Result directories written by attnlens commands.")],
    out: OutOption,
    progress: ProgressOption = True,
) -> None:
    """Redraw the figures of saved results (PNG and PDF), one folder per result, named after it."""
    from attnlens.io.results import load_result
    from attnlens.progress import progress_bar

    results = [(path, load_result(path)) for path in result_dirs]  # read everything before writing anything
    said = []
    with progress_bar(total=len(results), desc="figures", unit="result", enabled=progress) as bar:
        for path, result in results:
            name = path.resolve().name
            written = result.save_figures(Path(out) / name, on_figure=lambda figure: bar.set_postfix_str(f"{name}: {figure}"))
            said.append(f"{path}: {len(written) // 2} figures in {Path(out) / name}")
            bar.update(1)
    typer.echo("\n".join(said))
