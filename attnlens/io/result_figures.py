"""A result's figures, drawn through the registry and saved as PNG and PDF.

Each result class names the module that draws it (``figures_module``, an import path: a module
with ``draw(result)`` yielding ``(name, figure)`` pairs, the main figure first), so this storage
layer imports neither the analyses nor matplotlib until there is a figure to draw or save.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from attnlens.io.files import swap_into_place


class Drawable(Protocol):
    """What saving and showing a result's figures reads of it (:class:`attnlens.io.results.Result` is one;
    named here, not imported, since that module imports this one)."""

    @property
    def figures_module(self) -> str | None: ...

    @property
    def meta(self) -> dict: ...

    @property
    def main_table(self) -> str: ...

    @property
    def table(self) -> pd.DataFrame | None: ...

    def view(self, name: str | None = None, frame: pd.DataFrame | None = None) -> pd.DataFrame: ...


FIGURE_FORMATS = ("png", "pdf")  # every figure is saved in each
DPI = 150
# No PNG is larger: the page embeds every one (base64), and a reader's browser should open it at once. The figures
# are drawn to stay well below it whatever the model (attnlens.figures bounds their panels and pixels); one that
# still passes it (an image of noise compresses badly) is saved again at a lower resolution.
MOST_PNG_BYTES = 1_000_000


def _imported(path: str) -> Any:
    module, _, name = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name) if name else loaded


def draw(result: Drawable) -> Iterator[tuple[str, Any]]:
    """``(name, figure)`` for every figure of ``result``, main figure first (none for kinds without figures)."""
    if result.figures_module is None:
        return iter(())
    return _imported(result.figures_module).draw(result)


def save_figures(
    result: Drawable,
    directory: str | Path,
    on_figure: Callable[[str], None] | None = None,
    formats: tuple[str, ...] = FIGURE_FORMATS,
) -> list[Path]:
    """Every figure of ``result`` as ``NAME.png`` and ``NAME.pdf`` (``formats``) in ``directory``, which is
    written into a staging directory and swapped into place (a crash leaves the old figures)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        written = []
        for name, figure in draw(result):
            written += [path.name for path in save_figure(figure, staging / name, formats)]
            if on_figure is not None:
                on_figure(name)
        swap_into_place(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [directory / name for name in written]


def save_figure(figure: Any, stem: str | Path, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Write a matplotlib figure as ``stem.png`` and ``stem.pdf`` (``formats``), the PNG at most
    :data:`MOST_PNG_BYTES` (:func:`save_png`); close the figure."""
    import matplotlib.pyplot as plt  # only once there is a figure: this storage layer does not load matplotlib

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in formats:
        path = stem.with_suffix(f".{suffix}")
        if suffix == "png":
            save_png(figure, path)
        else:
            figure.savefig(path, dpi=DPI)
        paths.append(path)
    plt.close(figure)
    return paths


def save_png(figure: Any, path: Path, most: int = MOST_PNG_BYTES) -> int:
    """Write ``figure`` as a PNG at :data:`DPI`, or where that passes ``most`` bytes, again at the resolution
    its bytes suggest (they grow about as the pixels, the square of the dpi), until it fits; the dpi written.

    >>> import tempfile, matplotlib.pyplot as plt, numpy as np
    >>> figure, ax = plt.subplots(figsize=(8, 8))
    >>> image = ax.imshow(np.random.default_rng(0).random((600, 600)), interpolation="nearest")
    >>> path = Path(tempfile.mkdtemp()) / "noise.png"
    >>> save_png(figure, path, most=200_000) < DPI, path.stat().st_size <= 200_000
    (True, True)
    """
    dpi = DPI
    figure.savefig(path, dpi=dpi)
    while (size := path.stat().st_size) > most and dpi > 20:
        dpi = max(20, int(dpi * min(0.9, 0.95 * (most / size) ** 0.5)))
        figure.savefig(path, dpi=dpi)
    return dpi
