"""Results: one base class for every kind, and one registry of kinds.

A result holds ``meta`` (its kind, settings and provenance: model, corpus, versions,
command), named tables (pandas) and named arrays (numpy). :meth:`Result.save` writes a
directory (:mod:`attnlens.io.result_files`: ``result.json``, one CSV per table and one
``.npy`` per array, written atomically). Saving does not draw; figures are drawn on demand
(:meth:`Result.figures`, :meth:`Result.save_figures`, ``attnlens figures``) from the saved
numbers alone (:mod:`attnlens.io.result_figures`).

:data:`REGISTRY` is the one list of result kinds, filled by the result classes
themselves: each names its ``kind`` and the figures module that draws it (a module with
``draw(result)``, yielding ``(name, figure)`` pairs, the main figure first) by import path,
so this storage layer imports neither the analyses nor matplotlib. Each kind also says
which columns a reader sees and how it reads as text (:meth:`Result.view`,
:meth:`Result.text`): the command line, the report and notebooks all show that.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import pandas as pd

from attnlens.errors import BadFile
from attnlens.io.outcomes import task_outcomes
from attnlens.io.result_figures import FIGURE_FORMATS, draw, save_figures
from attnlens.io.result_files import check_out, check_resumable_out, read_meta, read_result_dir, write_result
from attnlens.io.result_html import result_html

# The directory functions (attnlens.io.result_files) are re-exported: the command line, the report, the
# rows' jobs and extraction import them from here.
__all__ = [
    "REGISTRY",
    "Result",
    "check_out",
    "check_resumable_out",
    "format_table",
    "load_result",
    "read_result_dir",
    "result_class",
    "write_result",
]


# ---------------------------------------------------------------------- the registry


REGISTRY: dict[str, type[Result]] = {}
"""Every kind of result, by kind: a subclass of :class:`Result` that names its ``kind`` registers
itself when its module is imported (importing :mod:`attnlens` imports every analysis)."""


def result_class(kind: str) -> type[Result]:
    """The class of results of ``kind``."""
    if kind not in REGISTRY:
        raise BadFile(f"results of kind '{kind}' cannot be read by this attnlens (it reads {', '.join(REGISTRY)})")
    return REGISTRY[kind]


def load_result(path: str | Path) -> Result:
    """Read any attnlens result back (eigen, overlap, ...), as the object that wrote it."""
    return result_class(read_meta(Path(path))["kind"]).load(path)


# ---------------------------------------------------------------------- the base class


class Result:
    """A result: ``meta``, named ``tables`` and ``arrays``, and where it was saved (``path``).

    Subclasses set ``kind`` (which registers them in :data:`REGISTRY`), the module that draws
    them (``figures_module``, a module with ``draw(result)``), and may name their
    ``main_table``; ``shown`` names the columns of each table a reader sees first, in order
    (the CLI, the report and notebooks show the same), and ``column_notes`` what columns mean.
    They add properties that read their tables and arrays, override :meth:`text` to say more
    than the main table, and :meth:`_save_extra` / :meth:`_from_disk` only when they keep
    something other than tables and arrays.
    """

    kind: ClassVar[str] = ""
    main_table: ClassVar[str] = "table"
    figures_module: ClassVar[str | None] = None
    shown: ClassVar[dict[str, tuple[str, ...]]] = {}
    column_notes: ClassVar[dict[str, str]] = {}
    task_table: ClassVar[str] = "task"  # the table whose rows are task judgements (a `change` column names each)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            REGISTRY[cls.kind] = cls

    def __init__(
        self,
        meta: dict,
        tables: dict[str, pd.DataFrame] | None = None,
        arrays: dict[str, np.ndarray] | None = None,
        path: Path | None = None,
    ) -> None:
        self.meta = meta
        self.tables = dict(tables or {})
        self.arrays = dict(arrays or {})
        self.path = None if path is None else Path(path)

    # ------------------------------------------------------------------ contents
    @property
    def settings(self) -> dict:
        return self.meta.get("settings", {})

    @property
    def table(self) -> pd.DataFrame | None:
        return self.tables.get(self.main_table)

    @property
    def model_name(self) -> str:
        """The model's name; for results that compare models (overlap), their names joined by ' × '."""
        model = self.meta.get("model")
        if isinstance(model, dict):
            return str(model.get("name", ""))
        return " × ".join(map(str, self.meta.get("models", [])))

    def summary(self) -> str:
        """One line on what the result holds (subclasses say more)."""
        parts = [f"{len(table)} rows in {name}" for name, table in self.tables.items()]
        return ", ".join(parts) if parts else f"{len(self.arrays)} arrays"

    def view(self, name: str | None = None, frame: pd.DataFrame | None = None) -> pd.DataFrame:
        """Table ``name`` (default: the main table), or ``frame`` shown as that table, with the
        columns a reader sees first (:attr:`shown`, those present; every column if none are named)."""
        name = name or self.main_table
        frame = self.tables[name] if frame is None else frame
        columns = [column for column in self.shown.get(name, ()) if column in frame]
        return frame[columns] if columns else frame

    def outcomes(self, change: str | int | pd.Series, *, every: bool = False) -> pd.DataFrame:
        """The per-example task outcomes of one judged ``change``, beside the unmodified model's on the
        same examples (columns ``row``, the example's row in the task; ``correct``; ``loss``, the
        classifier's cross-entropy; ``unmodified_correct``; ``unmodified_loss``), on the examples its
        judgement used (its ``held_out``; ``every``: every example it was run on, more where a
        comparison needed them), in the order judged: pair two changes by subtracting their
        ``correct`` columns over the examples both have.

        ``change``: its key (the task table's ``change`` column; ``"unmodified"`` for the unmodified
        model), a row of the task table (:attr:`task_table`: ``task``, or ``plug_in`` for a
        reconstruction), or that row's number. See :mod:`attnlens.io.outcomes`.
        """
        return task_outcomes(self.arrays, change, self.tables.get(self.task_table), every=every)

    def notes_for(self, frame: pd.DataFrame) -> list[str]:
        """What the columns of ``frame`` that need saying mean (:attr:`column_notes`), one line each."""
        return [f"{column}: {note}" for column, note in self.column_notes.items() if column in frame]

    def text(self) -> str:
        """The result as the command line prints it: the main table (its shown columns), what its
        columns mean, and the task judgement when there is one."""
        if self.table is None:  # a kind without tables (moments) says what it holds
            return self.summary()
        shown = self.view()
        return "\n".join([format_table(shown), *self.notes_for(shown), *self.task_lines()])

    def task_lines(self) -> list[str]:
        """The task table (accuracy with intervals, beside the unmodified model and the majority class), if any."""
        table, task = self.tables.get("task"), self.meta.get("task")
        if table is None or not task:
            return []
        majority_from = f" (the most frequent class of the {task['majority_from']})" if task.get("majority_from") else ""
        said = (
            f"task {task['task']} ({task['protocol']}, {len(task['held_out_rows'])} held out): unmodified accuracy "
            f"{task['unmodified_accuracy']:.4f}, majority class {task['majority_accuracy']:.4f}{majority_from}"
        )
        lines = [said]
        exclusion = task.get("exclusion")
        if exclusion:
            lines.append(
                f"--task-exclude: {exclusion['excluded']} examples excluded (matching {exclusion['texts']} texts), "
                f"{exclusion['duplicates']} duplicates dropped, {exclusion['available']} left to draw from"
            )
        sequential = task.get("sequential")
        if sequential:
            lines.append(
                f"--task-eval auto: each change judged sequentially on up to {sequential['examples_available']} examples "
                f"(looks at {', '.join(map(str, sequential['grid']))}), until its paired Δ interval answers its question "
                f"against the margin {sequential.get('margin', float('nan')):g} (a change: wholly above or below −margin; two "
                "choices: zero excluded, or within ±margin), the rest of the examples would decide it less than one time "
                "in ten, or they run out (held_out: examples used; stopped: why)"
            )
        hidden = ("change", "protocol", "unmodified_accuracy", "majority_accuracy", "task_loss")  # change: Result.outcomes
        lines.append(format_table(table[[column for column in table.columns if column not in hidden]]))
        if "detectable_delta" in table:
            lines.append(
                "delta_halfwidth: half the paired Δ accuracy interval; delta_bound: that half-width in standard errors (the "
                "look's boundary); detectable_delta: the smallest Δ these examples detect 80% of the time at the interval's level"
            )
        return lines

    # ------------------------------------------------------------------ disk
    def save(self, out: str | Path, *, overwrite: bool = False) -> Path:
        """Write the result directory atomically (tables as CSV, arrays as .npy); no figures."""
        self.path = write_result(
            out, self.kind, self.meta, tables=self.tables, arrays=self.arrays, overwrite=overwrite, extra=self._save_extra
        )
        return self.path

    def _save_extra(self, directory: Path) -> None:
        """Hook: write files beside the tables and arrays (into the staging directory)."""

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a result directory of this kind (arrays are memory-mapped)."""
        meta, tables, arrays = read_result_dir(path, cls.kind)
        return cls._from_disk(meta, tables, arrays, Path(path))

    @classmethod
    def _from_disk(cls, meta: dict, tables: dict, arrays: dict, path: Path) -> Self:
        return cls(meta, tables, arrays, path)

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict[str, Any]:
        """Every figure of this result, drawn now: ``{name: matplotlib Figure}``."""
        return dict(draw(self))

    def save_figures(
        self, directory: str | Path, on_figure: Callable[[str], None] | None = None, formats: tuple[str, ...] = FIGURE_FORMATS
    ) -> list[Path]:
        """Draw every figure and write it in each of ``formats`` (PNG and PDF) into ``directory``
        (replaced atomically); ``on_figure(name)`` is called as each is written (a progress bar)."""
        return save_figures(self, directory, on_figure, formats)

    # ------------------------------------------------------------------ display
    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        model = f"model={self.model_name!r}, " if self.model_name else ""
        return f"{type(self).__name__}({model}{self.summary()}{where})"

    def _repr_html_(self) -> str:
        """Jupyter: provenance, the head of the main table, and the main figure."""
        return result_html(self)


# ---------------------------------------------------------------------- text


def format_table(frame: pd.DataFrame) -> str:
    """A table as plain text: no index, numbers to 4 significant digits, missing values empty
    (a cell that does not apply to its row, such as a control's excess over itself).

    >>> print(format_table(pd.DataFrame({"k": [1, 16], "error": [0.123456, None], "n": [2, 3]})))
     k  error  n
     1 0.1235  2
    16         3
    """
    if frame.empty:
        return "(no rows)"
    return frame.to_string(index=False, float_format=lambda value: f"{value:.4g}", na_rep="")
