"""Outcomes kept: every task judgement's per-example outcomes are saved with the result, and
re-pairing them gives back the reported Δ and its interval exactly, sequential or bootstrap.

The judge is a classifier's own head (no probe to fit, so judging is one forward per example);
the outcomes are checked against transformers' own logits, one example at a time, and the
intervals are recomputed from the saved arrays alone (after a round trip through the disk).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import attnlens
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.margin import COMPARISON
from attnlens.analysis.sequential import Design
from attnlens.data.tasks import load_task
from attnlens.errors import BadInput
from tiny_models import fine_tuned_classifier

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def classifier(minilm_l3, tmp_path_factory):
    """minilm-l3 fine-tuned two epochs on 256 sentences: it reads the task well enough that removing
    attention flips some of its predictions (so changes stop at different looks)."""
    rows = np.random.default_rng(3).permutation(len(load_task("rotten-tomatoes")))[:256]
    directory = fine_tuned_classifier(
        minilm_l3.source, rows, tmp_path_factory.mktemp("classifier"), max_length=32, lr=1e-4, epochs=2, seed=1
    )
    return directory, rows


@pytest.fixture(scope="module")
def task_file(classifier, tmp_path_factory):
    """650 Rotten Tomatoes sentences the classifier did not see: a pool with five looks (200 ... 650)."""
    task = load_task("rotten-tomatoes")
    rows = np.array(
        [row for row in np.random.default_rng(4).permutation(len(task))[:1000] if row not in set(classifier[1])][:650]
    )
    path = tmp_path_factory.mktemp("task") / "unseen.csv"
    labels = [task.label_names[label] for label in task.labels[rows]]  # as the head's id2label names them
    pd.DataFrame({"text": [task.texts[row] for row in rows], "label": labels}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def sequential(classifier, task_file, tmp_path_factory):
    """Importance judged through the head, sequentially: [CLS] and 'other' removed (far from zero) and self (near it)."""
    result = attnlens.importance(
        str(classifier[0]), seq_len=32, num_seqs=2, gradient=False, bootstrap=200, task=str(task_file), task_eval="auto", margin=0.5,
        task_classes="self,other", progress=False,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("results") / "importance"
    result.save(out)
    return attnlens.load_result(out)


def test_saved_outcomes_re_pair_to_the_reported_delta_and_interval(sequential):
    table, task = sequential.tables["task"], sequential.meta["task"]
    design = Design.for_pool(task["sequential"]["examples_available"], task["sequential"]["margin"])
    assert design.grid == tuple(task["sequential"]["grid"])
    looks = set()
    for number, row in table.iterrows():
        outcomes = sequential.outcomes(number)
        assert len(outcomes) == row.held_out and outcomes.correct.mean() == pytest.approx(row.accuracy, abs=1e-12)
        paired = (outcomes.correct - outcomes.unmodified_correct).to_numpy()
        if row.change == "unmodified":
            continue
        every = sequential.outcomes(number, every=True).correct - sequential.outcomes(number, every=True).unmodified_correct
        decision = design.run(lambda used: every.to_numpy()[:used])  # the rule replayed on the saved outcomes
        assert decision.examples == row.held_out
        looks.add(decision.look)
        mean, low, high, _ = design.interval(paired, decision.bound)
        assert (mean, low, high) == pytest.approx(
            (row.delta_accuracy, row.delta_accuracy_low, row.delta_accuracy_high), abs=1e-12
        )
    assert len(looks) >= 2, f"the changes stopped at different looks: {table[['class', 'control', 'held_out', 'stopped']]}"


def test_a_class_against_its_random_control_re_pairs_too(sequential):
    """The excess over the control was judged by a comparison that may run both on more examples than
    either's own judgement: every example each was run on is kept, and Design.run on them gives it back."""
    table = sequential.tables["task"]
    for number in np.flatnonzero((table["control"] == "class").to_numpy()):
        first, second = sequential.outcomes(number, every=True), sequential.outcomes(number + 1, every=True)
        count = min(len(first), len(second))
        paired = (first.correct - second.correct).to_numpy()[:count]
        task = sequential.meta["task"]["sequential"]
        design = Design.for_pool(task["examples_available"], task["margin"])
        decision = design.run(lambda used: paired[:used], question=COMPARISON)
        row = table.iloc[number]
        expected = (row.excess_accuracy, row.excess_accuracy_low, row.excess_accuracy_high)
        assert (decision.mean, decision.low, decision.high) == pytest.approx(expected, abs=1e-12)


def test_outcomes_are_the_classifiers_own_predictions(sequential, classifier, task_file):
    """The unmodified model's saved outcomes against transformers' logits, one unpadded example at a time."""
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(classifier[0]).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier[0])
    frame = pd.read_csv(task_file)
    unmodified = sequential.outcomes("unmodified")
    for row, correct, loss in unmodified[["row", "correct", "loss"]].head(24).itertuples(index=False):
        batch = tokenizer(frame.text[row], truncation=True, max_length=32, return_tensors="pt")
        with torch.no_grad():
            logits = reference(**batch).logits[0].double()
        label = ["negative", "positive"].index(frame.label[row])
        assert loss == pytest.approx(float(torch.logsumexp(logits, 0) - logits[label]), abs=1e-4)
        if abs(float(logits[0] - logits[1])) > 1e-4:  # a near-tie may flip between batched and single passes
            assert correct == float(int(logits.argmax()) == label)


def test_outcomes_name_a_change_by_key_row_or_number_and_refuse_others(sequential):
    table = sequential.tables["task"]
    by_number = sequential.outcomes(1)
    pd.testing.assert_frame_equal(by_number, sequential.outcomes(table.iloc[1]))
    pd.testing.assert_frame_equal(by_number, sequential.outcomes(table.change[1]))
    with pytest.raises(BadInput, match="no judged change is named"):
        sequential.outcomes("no/such/change")
    with pytest.raises(BadInput, match="row 99 is not in the task table"):
        sequential.outcomes(99)


def test_with_a_fixed_number_of_examples_the_bootstrap_re_pairs(classifier, task_file, tmp_path):
    result = attnlens.reconstruct(
        str(classifier[0]), seq_len=16, num_seqs=8, ks=[4], layers=[0], strategies=["greedy"], scopes=["head"],
        plug_in=True, task=str(task_file), task_eval=40, bootstrap=200, progress=False,
    )  # fmt: skip
    result.save(tmp_path / "r")
    loaded = attnlens.load_result(tmp_path / "r")
    row = loaded.plug_in.iloc[0]
    outcomes = loaded.outcomes(0)  # row 0 of the plug-in table, the reconstruction's task table
    assert len(outcomes) == row.held_out == 40
    paired = (outcomes.correct - outcomes.unmodified_correct).to_numpy()
    mean, low, high = bootstrap_interval(paired[None], 200, loaded.settings["seed"])
    assert (mean[0], low[0], high[0]) == pytest.approx(
        (row.delta_accuracy, row.delta_accuracy_low, row.delta_accuracy_high), abs=1e-12
    )
    assert outcomes.row.tolist() == loaded.meta["task"]["held_out_rows"]
