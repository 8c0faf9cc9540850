"""Bring your own classifier: the ``head`` protocol judges a change through the model's own
sequence-classification head and its ``id2label``.

The classifier is made here: minilm-l3 with a classification head, fine-tuned on Rotten
Tomatoes by transformers itself and saved with ``save_pretrained``. Its predictions under
attnlens are checked against transformers' own ``model(**batch).logits.argmax(-1)``, one
unpadded example at a time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import attnlens
from attnlens.analysis.changes import Ablation
from attnlens.analysis.task import TaskJudge, TaskSettings
from attnlens.data.tasks import load_task
from attnlens.errors import BadInput
from tiny_models import assert_one_line_error, fine_tuned_classifier, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def classifier_dir(minilm_l3, tmp_path_factory):
    """minilm-l3 fine-tuned on 320 Rotten Tomatoes sentences for 20 AdamW steps, saved by transformers."""
    rows = np.random.default_rng(7).permutation(len(load_task("rotten-tomatoes")))[:320]
    return fine_tuned_classifier(minilm_l3.source, rows, tmp_path_factory.mktemp("classifier"), max_length=64)


@pytest.fixture(scope="module")
def classifier(classifier_dir):
    return attnlens.load_model(str(classifier_dir))


def test_a_classifier_is_judged_through_its_own_head_and_agrees_with_transformers(classifier, classifier_dir):
    judge = TaskJudge(classifier, TaskSettings(name="rotten-tomatoes", task_train=8, task_eval=48), seq_len=64, batch_size=16)
    assert judge.protocol == "head" and judge.probe is None, "auto picks the head of a classifier"
    correct = judge.judge(None)["correct"]
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    names = load_task("rotten-tomatoes").label_names
    held = judge.held_out
    compared = 0
    for index in range(len(held)):
        ids = torch.from_numpy(held.ids[index, : held.lengths[index]])[None]  # one example, no padding
        with torch.no_grad():
            logits = reference(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        if (logits.max() - logits.min()).item() < 1e-4:  # a near-tie: float32 rounding of batched vs single forwards may flip it
            continue
        right = names.index(reference.config.id2label[logits.argmax().item()]) == held.labels[index]
        assert correct[index] == float(right), index
        compared += 1
    assert compared >= len(held) - 2
    assert 0.5 < correct.mean(), "the fine-tuned head reads the task"


def test_a_change_is_judged_through_the_head(classifier):
    judge = TaskJudge(classifier, TaskSettings(name="rotten-tomatoes", task_train=8, task_eval=48), seq_len=64, batch_size=16)
    judged = judge.judge(Ablation("other", ("self", "cls", "sep", "other")))
    assert judged["protocol"] == "head" and judged["task_sparsity"] > 0.5
    assert judge.describe()["head"]["classes"] == ["negative", "positive"]


def test_head_protocol_on_a_model_without_a_head_says_so(minilm_l6):
    with pytest.raises(BadInput, match="sequence-classification head"):
        TaskJudge(
            minilm_l6, TaskSettings(name="rotten-tomatoes", protocol="head", task_train=8, task_eval=24), seq_len=32, batch_size=8
        )


def test_task_classes_that_do_not_match_the_heads_id2label_say_so(classifier, tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"text": ["good film", "bad film"] * 20, "label": ["good", "bad"] * 20}).to_csv(path, index=False)
    with pytest.raises(BadInput, match="do not match the head's id2label"):
        TaskJudge(classifier, TaskSettings(name=str(path), task_train=8, task_eval=24), seq_len=32, batch_size=8)


def test_head_protocol_without_a_head_is_one_line_on_the_command_line(tmp_path, capsys):
    code, _, err = run_cli(
        capsys, "importance", "-o", str(tmp_path / "out"), "--seq-len", "16", "--num-seqs", "2", "--no-progress",
        "--task", "rotten-tomatoes", "--protocol", "head", "--task-train", "8", "--task-eval", "20",
    )  # fmt: skip
    assert_one_line_error(code, err, "sequence-classification head")
    assert not (tmp_path / "out").exists()
