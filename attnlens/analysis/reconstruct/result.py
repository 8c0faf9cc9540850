"""The result of :func:`attnlens.analysis.reconstruct.reconstruct`: its tables, the chosen keys, and how it reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attnlens.io.results import Result, format_table


class ReconstructResult(Result):
    """``table``: one row per (strategy, scope, k, layer, head), with ``layer = head = -1``
    for the totals over all evaluated heads; ``plug_in`` and ``learned`` tables when asked
    for (``plug_in`` carries ``loss`` only for ``clm``/``mlm``: the ``hidden`` loss of the
    unmodified model is 0, so it would repeat ``loss_increase``, which is 1 − ``token_cosine``);
    ``selections``: the chosen keys of every map, keyed ``strategy/scope/k``."""

    kind = "reconstruct"
    figures_module = "attnlens.figures.reconstruct"
    task_table = "plug_in"  # each plug-in run judged by the task names its change (and joint_change with task_joint_r)
    shown = {
        "table": (
            "strategy", "scope", "k", "layer", "head", "rel_error", "rel_error_low", "rel_error_high", "rel_error_zero", "tv",
            "kl", "flops_ratio",
        ),
        "plug_in": (
            "strategy", "scope", "k", "loss", "loss_increase", "token_cosine", "pooled_cosine", "accuracy", "accuracy_low",
            "accuracy_high", "delta_accuracy", "task_flops_ratio",
        ),
    }  # fmt: skip
    column_notes = {
        "rel_error": "held-out ‖s − ŝ‖² / ‖s − μ‖², μ the training mean row (1: no better than the mean row)",
        "rel_error_zero": "held-out ‖s − ŝ‖² / ‖s‖²",
        "tv": "total variation between the weights and the rebuilt rows' weights, mean over rows",
        "flops_ratio": "attention FLOPs with k exact scores per row, against full attention, on blocks of n tokens",
        "task_flops_ratio": "the same on the valid pairs of the task examples judged, at their own lengths (no padding)",
    }

    def __init__(
        self,
        meta: dict,
        tables: dict[str, pd.DataFrame],
        arrays: dict[str, np.ndarray] | None = None,
        path: Path | None = None,
        selections: dict[str, np.ndarray] | None = None,
    ) -> None:
        super().__init__(meta, tables, arrays, path)
        self.selections = selections or {}

    plug_in = property(lambda self: self.tables.get("plug_in"))
    learned = property(lambda self: self.tables.get("learned"))

    def _save_extra(self, directory: Path) -> None:
        # Integer arrays only: no pickles written, as np.load reads them back without allowing any.
        np.savez_compressed(
            directory / "selections.npz",
            allow_pickle=False,
            **{key.replace("/", "|"): value for key, value in self.selections.items()},
        )

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> ReconstructResult:
        with np.load(path / "selections.npz") as data:
            selections = {key.replace("|", "/"): data[key] for key in data.files}
        return cls(meta, tables, arrays, path, selections)

    def summary(self) -> str:
        settings = self.settings
        return f"ks {settings.get('ks')}, strategies {settings.get('strategies')}, scopes {settings.get('scopes')}"

    def text(self) -> str:
        """Held-out errors over all heads per strategy, scope and k; the plug-in runs and learned maps when there are any."""
        table = self.table
        assert table is not None, "a reconstruct result always has its table"
        overall = table[table["layer"] == -1].drop(columns=["layer", "head"])
        lines = [format_table(self.view(frame=overall)), *self.notes_for(overall)]
        if self.plug_in is not None:
            lines += ["the model with the reconstruction inside attention (held-out blocks):", format_table(self.view("plug_in"))]
        if self.learned is not None:
            lines += ["maps learned on the objective against the closed form:", format_table(self.learned)]
        return "\n".join(lines)
