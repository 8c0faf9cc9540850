"""Your own classifier, judged on examples it never saw: ``task_exclude`` takes the texts it was
trained on out of the task before any split, and under ``head`` nothing else is set aside.

The classifier is made here: minilm-l3 with a classification head, fine-tuned by plain
transformers/torch on a known subset of Rotten Tomatoes sentences and saved with
``save_pretrained``. Matching is checked against the test's own normalisation (case and
whitespace aside), written independently of attnlens'.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd
import pytest

import attnlens
from attnlens.analysis.task import TaskSettings, prepare_task
from attnlens.data.exclusion import excluding, read_exclusion
from attnlens.data.tasks import load_task
from attnlens.errors import AttnlensWarning, BadInput
from tiny_models import assert_one_line_error, fine_tuned_classifier, run_cli

SEEN = 192  # sentences the classifier is fine-tuned on: 12 steps of 16


def plain(text: str) -> str:
    """The test's own normalisation: lower case, words joined by single spaces."""
    return " ".join(text.lower().split())


# ---------------------------------------------------------------------------- without a model


def test_exclusion_matches_case_and_whitespace_aside_and_drops_duplicates(tmp_path):
    texts = ["A good film.", "a  GOOD film. ", "Bad film", "bad film", "An odd one", "Seen before", "another"]
    path = tmp_path / "t.csv"
    pd.DataFrame({"text": texts, "label": [1, 1, 0, 0, 1, 0, 1]}).to_csv(path, index=False)
    task = load_task(str(path))
    kept = excluding(task, ["  seen   BEFORE", "nothing like it"])
    # by hand: row 1 repeats row 0, row 3 repeats row 2, row 5 is excluded
    assert kept.usable.tolist() == [0, 2, 4, 6]
    assert (kept.excluded, kept.duplicates, kept.exclusion_texts) == (1, 2, 2)
    assert kept.describe()["exclusion"]["available"] == 4 and task.usable is None


def test_an_exclusion_file_is_lines_of_text_or_a_task_files_text_column(tmp_path):
    lines = tmp_path / "seen.txt"
    lines.write_text("first sentence\n\n  second sentence \n")
    assert read_exclusion(lines) == ("first sentence", "  second sentence ")
    table = tmp_path / "seen.csv"
    pd.DataFrame({"sentence": ["one", "two"], "label": [0, 1]}).to_csv(table, index=False)
    assert read_exclusion(table, text_column="sentence") == ("one", "two")
    records = tmp_path / "seen.jsonl"
    records.write_text('{"text": "three"}\n{"text": "four"}\n')
    assert read_exclusion(records) == ("three", "four")


@pytest.mark.parametrize(
    "make, phrase",
    [
        (lambda path: None, "does not exist"),
        (lambda path: path.write_text("\n  \n"), "holds no texts"),
        (lambda path: pd.DataFrame({"sentence": ["x"]}).to_csv(path.with_suffix(".csv"), index=False), "has no column 'text'"),
    ],
)
def test_a_bad_exclusion_file_is_one_line_before_any_model_loads(tmp_path, capsys, make, phrase):
    path = tmp_path / "seen.txt"
    make(path)
    given = path.with_suffix(".csv") if path.with_suffix(".csv").exists() else path
    started = time.perf_counter()
    code, _, err = run_cli(
        capsys,
        "importance",
        "minilm-l6",
        "--out",
        str(tmp_path / "out"),
        "--task",
        "rotten-tomatoes",
        "--task-exclude",
        str(given),
    )
    assert_one_line_error(code, err, "--task-exclude", phrase)
    assert time.perf_counter() - started < 10 and not (tmp_path / "out").exists()


def test_an_exclusion_needs_a_task():
    with pytest.raises(BadInput, match="task_exclude takes examples out of a task"):
        TaskSettings(task_exclude=__file__)


# ---------------------------------------------------------------------------- a classifier of our own


@pytest.fixture(scope="module")
def seen_rows() -> np.ndarray:
    return np.random.default_rng(11).permutation(len(load_task("rotten-tomatoes")))[:SEEN]


@pytest.fixture(scope="module")
def classifier_dir(minilm_l3, seen_rows, tmp_path_factory):
    """minilm-l3 with a classification head, fine-tuned by transformers on the seen rows (each once), saved."""
    return fine_tuned_classifier(minilm_l3.source, seen_rows, tmp_path_factory.mktemp("classifier"), max_length=48)


@pytest.fixture(scope="module")
def classifier(classifier_dir):
    return attnlens.load_model(str(classifier_dir))


@pytest.fixture(scope="module")
def seen_file(seen_rows, tmp_path_factory):
    """The seen sentences, one per line, written as a user might: some upper case, some with extra spaces."""
    texts = load_task("rotten-tomatoes").texts
    lines = []
    for number, row in enumerate(seen_rows):
        text = texts[row]
        text = text.upper() if number % 3 == 0 else text
        lines.append(f"  {text.replace(' ', '   ', 2)} " if number % 5 == 0 else text)
    path = tmp_path_factory.mktemp("seen") / "seen.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_under_head_no_example_the_classifier_saw_is_held_out(classifier, seen_rows, seen_file):
    texts = load_task("rotten-tomatoes").texts
    seen = {plain(texts[row]) for row in seen_rows}
    settings = TaskSettings(name="rotten-tomatoes", task_exclude=str(seen_file), task_eval="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnlensWarning)  # excluded: no warning
        prepared = prepare_task(classifier, settings, seq_len=64)
    assert prepared.protocol == "head" and len(prepared.train) == 0, "head sets no training examples aside"
    assert not {plain(texts[row]) for row in prepared.pool.rows} & seen
    exclusion = prepared.describe()["exclusion"]
    assert (exclusion["excluded"], exclusion["duplicates"], exclusion["texts"]) == (SEEN, 0, SEEN)
    assert exclusion["available"] == len(texts) - SEEN and len(prepared.pool) == 4000  # auto: up to 4,000 of them
    assert prepared.majority_from == "held-out examples"

    with pytest.warns(AttnlensWarning, match="usual train split.*task_exclude"):
        unguarded = prepare_task(classifier, settings.replace(task_exclude=None), seq_len=64)
    assert {plain(texts[row]) for row in unguarded.pool.rows} & seen, "without the exclusion the seen sentences are judged"


def test_the_command_line_judges_every_example_not_excluded_and_says_so(classifier_dir, seen_rows, seen_file, tmp_path, capsys):
    texts = load_task("rotten-tomatoes")
    others = [row for row in np.random.default_rng(5).permutation(len(texts))[:300] if row not in set(seen_rows)][:64]
    rows = [*seen_rows[:100], *others, others[0], others[1]]  # two repeats: one as it is, one in capitals
    names = texts.label_names  # as the head's id2label names them
    frame = pd.DataFrame({"text": [texts.texts[row] for row in rows], "label": [names[texts.labels[row]] for row in rows]})
    frame.loc[len(frame) - 1, "text"] = frame.loc[len(frame) - 1, "text"].upper()
    task_file = tmp_path / "mine.csv"
    frame.to_csv(task_file, index=False)
    out = tmp_path / "judged"
    code, printed, err = run_cli(
        capsys, "importance", str(classifier_dir), "--out", str(out), "--task", str(task_file), "--task-exclude", str(seen_file),
        "--task-eval", "auto", "--task-classes", "self", "--seq-len", "16", "--num-seqs", "2", "--no-gradient",
        "--bootstrap", "100", "--no-figures", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "warning" not in err, "a task file of one's own gets no warning"
    task = attnlens.load_result(out).meta["task"]
    assert task["exclusion"] == {**task["exclusion"], "excluded": 100, "duplicates": 2, "available": 64}
    assert task["train_rows"] == [] and sorted(task["held_out_rows"]) == list(range(100, 164)), "every example not excluded"
    labels = frame["label"].to_numpy()[100:164]
    majority = max(np.mean(labels == "negative"), np.mean(labels == "positive"))
    assert task["majority_accuracy"] == pytest.approx(majority) and task["majority_from"] == "held-out examples"
    assert "100 examples excluded" in printed and "most frequent class of the held-out examples" in printed


def test_the_command_line_warns_once_when_a_built_in_is_judged_through_a_head_without_exclusion(classifier_dir, tmp_path, capsys):
    code, _, err = run_cli(
        capsys, "importance", "--model", str(classifier_dir), "--out", str(tmp_path / "o"), "--task", "rotten-tomatoes",
        "--task-eval", "20", "--task-classes", "self", "--seq-len", "16", "--num-seqs", "2", "--no-gradient",
        "--bootstrap", "100", "--no-figures", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("attnlens: warning: ")]
    assert len(warned) == 1 and "--task-exclude" in warned[0] and "8,530 sentences are the usual train split" in warned[0]
    assert "Traceback" not in err and "warnings.warn" not in err
