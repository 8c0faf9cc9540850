"""The result of :func:`~attnlens.analysis.importance.importance`: per class, mass, ablation and gradient importance."""

from __future__ import annotations

import pandas as pd

from attnlens.io.results import Result, format_table


class ImportanceResult(Result):
    """Tables of one importance run; see :mod:`attnlens.analysis.importance`.

    ``table`` (one row per class: mass, share, ablation delta and random control with
    intervals, gradient importance; ``share`` and ``removed`` agree for a model whose every
    query sees every key, and part for a causal one), ``mass``, ``entropy``, ``ablation``
    (``loss``, the objective under the ablation, only for ``clm``/``mlm``: the ``hidden``
    loss of the unmodified model is 0, so it would repeat ``delta``), ``gradient``,
    ``classes`` (``positions``: valid (layer, block, query, key) occurrences); ``arrays["ablation_blocks"]`` (condition, block) losses in the order of
    ``ablation``'s rows, ``arrays["gradient_blocks"]`` (block, layer, head, class + all)
    signed derivatives; ``meta`` holds provenance, settings and the token roles.
    """

    kind = "importance"
    figures_module = "attnlens.figures.importance"
    shown = {
        "summary": (
            "class", "share", "mass", "removed", "delta", "delta_low", "delta_high", "random", "random_low", "random_high",
            "gradient", "note",
        )
    }  # fmt: skip
    column_notes = {
        "share": "mass a query would put on the class with uniform attention over its valid keys",
        "mass": "average attention weight a query puts on the class (mean over layers and heads)",
        "delta": "change of the held-out objective with the class removed everywhere, 95% interval over blocks",
        "random": "the same with as many random valid positions removed per row (the control)",
    }
    main_table = "summary"
    classes = property(lambda self: self.tables["classes"])
    mass = property(lambda self: self.tables["mass"])
    entropy = property(lambda self: self.tables["entropy"])
    ablation = property(lambda self: self.tables["ablation"])
    gradient = property(lambda self: self.tables["gradient"])

    @property
    def table(self) -> pd.DataFrame:
        """``summary``, one row per class (every importance result has it)."""
        table = super().table
        assert table is not None, "an importance result always has its summary"
        return table

    def summary(self) -> str:
        settings = self.settings
        return f"objective {settings['objective']!r}, classes {settings['classes']}"

    def text(self) -> str:
        """Per class that occurs: its share and mass, what removing it costs beside the random control,
        its gradient importance; then why any class was dropped, and the task."""
        table = self.table[self.table["occurs"].astype(bool)]
        notes = [f"{name}: {note}" for name, note in self.meta["notes"].items()]
        return "\n".join(
            [format_table(self.view(frame=table.drop(columns=["note"]))), *self.notes_for(table), *notes, *self.task_lines()]
        )
