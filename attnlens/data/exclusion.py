"""Examples kept out of a task: the texts a classifier was trained on, so it is judged on examples it never saw.

A classifier judged through its own head (``protocol="head"``) must not be judged on its own
training data. ``task_exclude`` names a file of the texts it saw: plain text, one per line, or a
task file in any format :func:`attnlens.data.tasks.load_task` reads (``.csv``, ``.jsonl``, a folder
of them, a ``datasets`` folder), of which the text column is read. Texts match by
:func:`normalised` text: case, surrounding and repeated whitespace aside. :func:`excluding` takes
every task row whose text matches out of the task, then every row that repeats an earlier row's
text (a duplicate would be judged twice, or trained on and judged), before any split, and counts both.

>>> from attnlens.data.tasks import load_task
>>> task = load_task("rotten-tomatoes")
>>> kept = excluding(task, ["  THE ROCK is destined to be the 21st century's new \\" conan \\" and that he's going to "
...                         "make a splash even greater than arnold schwarzenegger , jean-claud van damme or steven segal . "])
>>> kept.excluded, kept.duplicates, len(kept.usable), 0 in kept.usable
(1, 0, 8529, False)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnlens.data.tasks import DATASETS_MARKERS, TASK_SUFFIXES, Task, read_task_table
from attnlens.errors import BadFile, BadInput


def normalised(text: str) -> str:
    """``text`` as it is matched: case folded, whitespace runs made one space, the ends stripped.

    >>> normalised("  A  good\\tfilm ") == normalised("a good film")
    True
    """
    return " ".join(str(text).split()).casefold()


def read_exclusion(source: str | Path, *, text_column: str = "text") -> tuple[str, ...]:
    """The texts of ``source``: a task file or folder (its ``text_column``), or plain text, one per
    line (blank lines skipped). Raises :class:`BadInput` for a missing file, a missing column or a
    file without texts."""
    path = Path(source).expanduser()
    if not path.exists():
        raise BadInput(f"`task_exclude` {source} does not exist; give a file of the texts the classifier was trained on")
    return _read_exclusion(str(path.resolve()), path.stat().st_mtime_ns, text_column)


@functools.lru_cache(maxsize=8)
def _read_exclusion(path: str, mtime: int, text_column: str) -> tuple[str, ...]:
    """Read once per path, modification time and column: the settings check it, the judge reads it."""
    file = Path(path)
    tabular = file.suffix in TASK_SUFFIXES or (file.is_dir() and _holds_tables(file))
    if tabular:
        frame = read_task_table(file)
        if text_column not in frame.columns:
            raise BadInput(
                f"`task_exclude` {file} has no column '{text_column}' (its columns: {', '.join(map(str, frame.columns))}); "
                "name its text column with `text_column`, or give plain text, one per line"
            )
        texts = [str(text) for text in frame[text_column] if text is not None and str(text).strip()]
    elif file.is_dir():
        raise BadInput(f"`task_exclude` {file} is a folder without .csv or .jsonl files; give a file of texts, one per line")
    else:
        try:
            texts = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError:
            raise BadFile(f"`task_exclude` {file} is not UTF-8 text; give texts one per line, or a .csv/.jsonl file") from None
    if not texts:
        raise BadInput(f"`task_exclude` {file} holds no texts; give the texts the classifier was trained on")
    return tuple(texts)


def _holds_tables(folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in DATASETS_MARKERS) or any(
        path.suffix in TASK_SUFFIXES for path in folder.rglob("*")
    )


def excluding(task: Task, texts: Iterable[str]) -> Task:
    """``task`` without the rows whose text matches one of ``texts`` (:func:`normalised`), nor the rows
    that repeat an earlier kept row's text: its ``usable`` rows (numbers in the full task, so
    recorded rows still name the task's own rows), with ``excluded`` and ``duplicates`` counted."""
    unwanted = {normalised(text) for text in texts}
    usable, seen, excluded, duplicates = [], set(), 0, 0
    for row in task.rows_in_use():
        key = normalised(task.texts[row])
        if key in unwanted:
            excluded += 1
        elif key in seen:
            duplicates += 1
        else:
            seen.add(key)
            usable.append(int(row))
    return dataclasses.replace(
        task,
        usable=np.asarray(usable, dtype=np.int64),
        excluded=task.excluded + excluded,
        duplicates=task.duplicates + duplicates,
        exclusion_texts=len(unwanted),
    )
