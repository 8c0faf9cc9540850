"""Every task check comes before any model pass: a task a command cannot judge costs seconds.

Forward passes are counted by a global forward pre-hook on every transformers model, so a
check that ran after a pass, any pass (valid masks, moments, references, probe features),
fails here.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch
import transformers

import attnlens
from attnlens.errors import BadInput
from tiny_models import assert_one_line_error, run_cli

# every analysis that judges a change by a task, on settings small enough that the passes would be quick
ANALYSES = {
    "importance": lambda model, **task: attnlens.importance(model, seq_len=16, num_seqs=2, progress=False, **task),
    "dam": lambda model, **task: attnlens.dam(
        model, seq_len=16, train_seqs=4, eval_seqs=4, steps=20, stop_window=2, check_window=2, progress=False, **task
    ),
    "plan": lambda model, **task: attnlens.plan(
        model,
        seq_len=16,
        fit_seqs=4,
        curve_seqs=4,
        select_seqs=4,
        eval_seqs=4,
        ks=[2],
        widths=[2],
        max_drop=[50.0],
        progress=False,
        **task,
    ),
    "reconstruct": lambda model, **task: attnlens.reconstruct(
        model, seq_len=16, num_seqs=8, ks=[4], layers=[0], plug_in=True, progress=False, **task
    ),
}


class Forwards:
    """Counts calls of transformers models (a pass through a model with a head counts its base model too:
    zero means no pass at all)."""

    def __init__(self) -> None:
        self.count = 0
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self._seen)

    def _seen(self, module, args) -> None:
        if isinstance(module, transformers.PreTrainedModel):
            self.count += 1

    def close(self) -> None:
        self.handle.remove()


@pytest.fixture
def forwards():
    counter = Forwards()
    yield counter
    counter.close()


@pytest.fixture(scope="module")
def untrained_classifier(minilm_l6, tmp_path_factory) -> attnlens.LoadedModel:
    """minilm-l6 with an untrained classification head (negative, positive): only its id2label matters here."""
    names = {0: "negative", 1: "positive"}
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        minilm_l6.source, num_labels=2, id2label=names, label2id={name: index for index, name in names.items()}
    )
    directory = tmp_path_factory.mktemp("classifier")
    model.save_pretrained(directory)
    minilm_l6.tokenizer.save_pretrained(directory)
    return attnlens.load_model(str(directory))


@pytest.fixture(scope="module")
def other_classes(tmp_path_factory):
    """A task whose classes (bad, good) are not the head's (negative, positive)."""
    path = tmp_path_factory.mktemp("task") / "films.csv"
    pd.DataFrame({"text": ["a good film", "a bad film"] * 30, "label": ["good", "bad"] * 30}).to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("analysis", ANALYSES)
def test_a_head_whose_id2label_does_not_match_is_refused_before_any_forward(
    untrained_classifier, other_classes, forwards, analysis
):
    started = time.perf_counter()
    with pytest.raises(BadInput, match=r"classes \(bad, good\) do not match the head's id2label \(negative, positive\)"):
        ANALYSES[analysis](untrained_classifier, task=other_classes)
    assert forwards.count == 0 and time.perf_counter() - started < 10


@pytest.mark.parametrize("analysis", ANALYSES)
def test_head_on_a_model_without_a_head_is_refused_before_any_forward(minilm_l6, forwards, analysis):
    with pytest.raises(BadInput, match="sequence-classification head"):
        ANALYSES[analysis](minilm_l6, task="rotten-tomatoes", protocol="head")
    assert forwards.count == 0


def test_too_few_examples_for_the_split_are_refused_before_any_forward(minilm_l6, other_classes, forwards):
    with pytest.raises(BadInput, match="fewer than the"):
        ANALYSES["importance"](minilm_l6, task=other_classes, task_train=50, task_eval=40)
    assert forwards.count == 0


def test_masks_that_learn_from_a_heads_task_need_training_examples(untrained_classifier, forwards):
    with pytest.raises(BadInput, match="give task_train"):
        ANALYSES["dam"](untrained_classifier, task="rotten-tomatoes", train_on="task")
    assert forwards.count == 0


def test_the_command_line_refuses_a_wrong_id2label_in_seconds(untrained_classifier, other_classes, tmp_path, capsys, forwards):
    attnlens.load_model(untrained_classifier.source)  # what loading alone runs (its probe pass), the baseline
    loading = forwards.count
    started = time.perf_counter()
    code, _, err = run_cli(
        capsys, "importance", untrained_classifier.source, "--out", str(tmp_path / "o"), "--task", other_classes, "--no-progress"
    )
    took = time.perf_counter() - started
    assert_one_line_error(code, err, "do not match the head's id2label")
    assert forwards.count == 2 * loading, "the command ran no pass beyond loading the model"
    assert took < 10, f"refused after {took:.1f} s"
