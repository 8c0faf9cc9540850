"""Results: one base class for every kind, one registry, one directory format on disk.

A result holds ``meta`` (its kind, settings and provenance: model, corpus, versions,
command), named tables (pandas) and named arrays (numpy). :meth:`Result.save` writes a
directory: ``result.json``, one CSV per table and one ``.npy`` per array, staged in a
hidden sibling directory and renamed into place, so a crash never leaves half a result,
and an existing result is replaced only when the caller says ``overwrite``. Saving does
not draw; figures are drawn on demand (:meth:`Result.figures`,
:meth:`Result.save_figures`, ``attnlens figures``) from the saved numbers alone.

:data:`REGISTRY` is the one list of result kinds, filled by the result classes
themselves: each names its ``kind`` and the figures module that draws it (a module with
``draw(result)``, yielding ``(name, figure)`` pairs, the main figure first) by import path,
so this storage layer imports neither the analyses nor matplotlib. Each kind also says
which columns a reader sees and how it reads as text (:meth:`Result.view`,
:meth:`Result.text`): the command line, the report and notebooks all show that.

>>> import tempfile, numpy as np, pandas as pd
>>> out = tempfile.mkdtemp() + "/r"
>>> _ = write_result(out, "demo", {"answer": 42}, tables={"table": pd.DataFrame({"a": [1, 2]})},
...                  arrays={"x": np.arange(3)})
>>> meta, tables, arrays = read_result_dir(out, "demo")
>>> meta["answer"], tables["table"]["a"].tolist(), arrays["x"].tolist()
(42, [1, 2], [0, 1, 2])
"""

from __future__ import annotations

import base64
import html
import importlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import pandas as pd

from attnlens.errors import BadFile, BadInput
from attnlens.io.files import json_safe, swap_into_place
from attnlens.io.outcomes import task_outcomes

FORMAT_VERSION = 1
FIGURE_FORMATS = ("png", "pdf")  # every figure is saved in each


# ---------------------------------------------------------------------- the registry


REGISTRY: dict[str, type[Result]] = {}
"""Every kind of result, by kind: a subclass of :class:`Result` that names its ``kind`` registers
itself when its module is imported (importing :mod:`attnlens` imports every analysis)."""


def _imported(path: str) -> Any:
    module, _, name = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name) if name else loaded


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
                f"(early looks at {', '.join(map(str, sequential['grid']))}; the last sized by the spread), until its paired "
                f"Δ interval excludes zero or its half-width is at most {sequential['target_halfwidth']:g} (held_out: examples "
                "used; stopped: why)"
            )
        hidden = ("change", "protocol", "unmodified_accuracy", "majority_accuracy", "task_loss")  # change: Result.outcomes
        lines.append(format_table(table[[column for column in table.columns if column not in hidden]]))
        if "detectable_delta" in table:
            lines.append(
                "delta_halfwidth: half the paired Δ accuracy interval; detectable_delta: the smallest Δ these examples "
                "detect 80% of the time at the interval's level"
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
        parts = [f"<h4>{html.escape(type(self).__name__)}</h4>", _provenance_html(self.meta)]
        if self.table is not None:
            parts.append(f"<p>{html.escape(self.main_table)} ({len(self.table)} rows), first 10:</p>")
            table = self.view().head(10).to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0, na_rep="")
            parts.append(f'<div style="overflow-x:auto">{table}</div>')  # a wide table scrolls in its box, not the page
        figure = first_figure(self)
        if figure is not None:
            parts.append(f'<img src="data:image/png;base64,{figure}" style="max-width:640px">')
        return "\n".join(parts)


def _provenance_html(meta: dict) -> str:
    """A small table: model, corpus, settings, when and with what it was made, and the command."""
    rows = []
    model = meta.get("model")
    if isinstance(model, dict):
        rows.append(("model", f"{model.get('name', '')} ({model.get('architecture', '')})"))
    elif meta.get("models"):
        rows.append(("model", " × ".join(map(str, meta["models"]))))
    corpus = meta.get("corpus")
    if isinstance(corpus, dict):
        rows.append(("corpus", str(corpus.get("source", corpus.get("name", "")))))
    if meta.get("settings"):
        rows.append(
            (
                "settings",
                ", ".join(
                    f"{key}={value}"
                    for key, value in meta["settings"].items()
                    if not isinstance(value, (dict, list)) or len(str(value)) < 60
                ),
            )
        )
    versions = meta.get("versions") or {}
    rows.append(
        (
            "made",
            f"{meta.get('created', '')} with attnlens {versions.get('attnlens', '')}, "
            f"torch {versions.get('torch', '')}, transformers {versions.get('transformers', '')}",
        )
    )
    if meta.get("command"):
        rows.append(("command", f"<code>{html.escape(str(meta['command']))}</code>"))
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(key)}</th><td style='text-align:left'>"
        f"{value if key == 'command' else html.escape(value)}</td></tr>"
        for key, value in rows
    )
    return f"<table>{body}</table>"


# ---------------------------------------------------------------------- drawing through the registry


def draw(result: Result) -> Iterator[tuple[str, Any]]:
    """``(name, figure)`` for every figure of ``result``, main figure first (none for kinds without figures)."""
    if result.figures_module is None:
        return iter(())
    return _imported(result.figures_module).draw(result)


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


def first_figure(result: Result) -> str | None:
    """The main figure as base64 PNG, or None."""
    figures = draw(result)
    try:
        _, figure = next(figures)
    except StopIteration:
        return None
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    plt.close(figure)
    figures.close() if hasattr(figures, "close") else None
    return base64.b64encode(buffer.getvalue()).decode()


def save_figures(
    result: Result,
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
    """Write a matplotlib figure as ``stem.png`` and ``stem.pdf`` (``formats``); close the figure."""
    import matplotlib.pyplot as plt  # only once there is a figure: this storage layer does not load matplotlib

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in formats:
        path = stem.with_suffix(f".{suffix}")
        figure.savefig(path, dpi=150)
        paths.append(path)
    plt.close(figure)
    return paths


# ---------------------------------------------------------------------- result directories


def is_result_dir(path: Path) -> bool:
    return (Path(path) / "result.json").is_file()


def check_out(out: str | Path, overwrite: bool) -> Path:
    """Fail early (before any work) if ``out`` cannot receive a result."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"`out` {out} is a file; give a directory path")
    if out.exists() and any(out.iterdir()):
        if not is_result_dir(out):
            raise BadInput(f"`out` {out} is a non-empty directory that is not an attnlens result; choose another `out`")
        if not overwrite:
            raise BadInput(f"a result already exists in {out}; pass `overwrite` to replace it, or choose another `out`")
    return out


def check_resumable_out(out: Path, *, resume: bool, overwrite: bool, owned: Callable[[Path], bool], what: str) -> bool:
    """Fail early if ``out`` cannot take a resumable job (a store, a moments job).

    ``owned(out)`` says whether a non-empty ``out`` holds such a job; ``what`` names it in
    the messages. Returns whether an existing job is to be replaced (``overwrite``).
    """
    if resume and overwrite:
        raise BadInput("`resume` and `overwrite` contradict each other; choose one")
    if out.exists() and not out.is_dir():
        raise BadInput(f"`out` {out} is a file; give a directory path")
    if not out.exists() or not any(out.iterdir()):
        if resume:
            raise BadInput(f"nothing to resume in {out}; run without `resume` to start a new {what}")
        return False
    if not owned(out):
        raise BadInput(f"`out` {out} is a non-empty directory that is not an attnlens {what}; choose another `out`")
    if not resume and not overwrite:
        raise BadInput(f"a {what} already exists in {out}; pass `resume` to finish it or `overwrite` to replace it")
    return overwrite


def write_result(
    out: str | Path,
    kind: str,
    meta: dict,
    *,
    tables: dict[str, pd.DataFrame] | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a result directory atomically; ``extra(dir)`` may add files to it."""
    out = check_out(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise BadInput(f"cannot write to {out}: {error.strerror or error}; choose a writable `out`") from None
    try:
        for name, table in (tables or {}).items():
            table.to_csv(staging / f"{name}.csv", index=False)
        for name, array in (arrays or {}).items():
            np.save(staging / f"{name}.npy", array)
        if extra is not None:
            extra(staging)
        payload = {
            **meta,
            "kind": kind,
            "format_version": FORMAT_VERSION,
            "tables": sorted(tables or {}),
            "arrays": sorted(arrays or {}),
        }
        (staging / "result.json").write_text(json.dumps(json_safe(payload), indent=2, allow_nan=False))
        swap_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _text_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Free-text columns (``note``) read back as the empty strings they were written as."""
    for column in ("note",):
        if column in table:
            table[column] = table[column].fillna("").astype(str)
    return table


def _read_table(file: Path) -> pd.DataFrame:
    """A saved table; one with neither rows nor columns (nothing matched) is written as an empty file."""
    try:
        return _text_columns(pd.read_csv(file))
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def read_result_dir(path: str | Path, kind: str | None = None) -> tuple[dict, dict[str, pd.DataFrame], dict[str, np.ndarray]]:
    """Read and validate a result directory: (meta, tables, arrays); arrays are memory-mapped."""
    path = Path(path)
    meta = read_meta(path)
    if kind is not None and meta["kind"] != kind:
        raise BadFile(f"'{path}' holds a {meta['kind']} result, not the {kind} result this needs")
    try:
        tables = {name: _read_table(path / f"{name}.csv") for name in meta.get("tables", [])}
        arrays = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in meta.get("arrays", [])}
    except (OSError, ValueError) as error:
        raise BadFile(f"result '{path}' is damaged ({error})") from None
    return meta, tables, arrays


def read_meta(path: Path) -> dict:
    """``result.json`` of a result directory, checked."""
    if not path.is_dir():
        raise BadFile(f"result '{path}' does not exist")
    if not is_result_dir(path):
        raise BadFile(f"'{path}' is not an attnlens result (no result.json); give a directory an attnlens command wrote")
    try:
        meta = json.loads((path / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadFile(f"result '{path}' is damaged ({type(error).__name__} reading result.json)") from None
    if not isinstance(meta, dict) or "kind" not in meta:
        raise BadFile(f"'{path}' is not an attnlens result (its result.json has no kind)")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise BadFile(f"result '{path}' was written by a newer attnlens (format {meta['format_version']}); upgrade attnlens")
    return meta
