"""The result of :func:`~attnlens.analysis.eigen.eigen`: the spectra of every unit at every level, and the moments they came from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attnlens.io.results import Result, format_table
from attnlens.rows.moments import HalfMoments


class EigenResult(Result):
    """Spectra of every unit at every level; see :func:`~attnlens.analysis.eigen.eigen`.

    ``table``: one row per unit (``level`` head / layer / model, ``layer`` and
    ``head`` = -1 where pooled, ``query`` = -1 when rows are pooled over queries).
    ``arrays[f"{level}_eigenvalues"]`` etc. have shape (L, H, Q, ...) with H = 1 for
    layers and L = H = 1 for the model; eigenvectors (..., n, keep) are float32 and in
    full key coordinates; ``_a`` / ``_b`` are the same from two halves of the data.
    """

    kind = "eigen"
    figures_module = "attnlens.figures.eigen"
    shown = {"table": ("level", "layer", "head", "query", "rows", "k90", "k95", "k99", "effective_rank", "baseline_k90")}

    def __init__(
        self,
        meta: dict,
        tables: dict[str, pd.DataFrame],
        arrays: dict[str, np.ndarray],
        path: Path | None = None,
        moments: HalfMoments | None = None,
    ) -> None:
        super().__init__(meta, tables, arrays, path)
        self.moments = moments  # the row moments of the two halves, when computed here (not for moments read from disk)

    @property
    def table(self) -> pd.DataFrame:
        """One row per unit (every eigen result has it)."""
        table = super().table
        assert table is not None, "an eigen result always has its table"
        return table

    @property
    def matrix_table(self) -> pd.DataFrame | None:
        """Spectra of whole score matrices (``full_matrices``), else None."""
        return self.tables.get("matrix_table")

    @property
    def n(self) -> int:
        return int(self.meta["n"])

    @property
    def keep(self) -> int:
        return int(self.meta["settings"]["keep"])

    def eigenvectors(self, level: str, half: str = "") -> np.ndarray:
        """(L, H, Q, n, keep) top eigenvectors at ``level``; ``half`` "a" or "b" for the halves."""
        return self.arrays[f"{level}_eigenvectors" + (f"_{half}" if half else "")]

    def _save_extra(self, directory: Path) -> None:
        if self.moments is not None:
            self.moments.save(directory)

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> EigenResult:
        moments = HalfMoments.load(path) if (path / "moments_a.npz").is_file() else None
        return cls(meta, tables, arrays, path, moments)

    def summary(self) -> str:
        settings = self.settings
        return f"n={self.n}, {settings['quantity']}, {len(self.meta['layers'])} layers x {self.meta['num_heads']} heads"

    def text(self) -> str:
        """Per layer and for the model (heads pooled; the last query analysed): components for 90, 95
        and 99% of the energy, the effective rank, and the Gaussian baseline's k90."""
        table = self.table
        pooled = table[(table["level"] != "head") & (table["query"] == table["query"].max())]
        notes = [f"{unit}: {note}" for unit, note in self.meta.get("notes", {}).items()]  # what a reader should know
        return "\n".join([format_table(self.view(frame=pooled.drop(columns=["head", "query"]))), *self.notes_for(pooled), *notes])
