"""DAM's verdicts against the step budget: the convergence check, masks per seed, the swap-search reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import transformers

import attnlens
from attnlens.analysis.dam import LAYOUTS
from attnlens.analysis.dam.judging import MaskSplit, evaluate_mask
from attnlens.analysis.dam.runs import Setup
from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.experiment import Experiment
from attnlens.report.dam import dam_claims, standing
from attnlens.report.verdicts import Context, Phrase
from tiny_models import assert_one_line_error, run_cli, save_with_minilm_tokenizer

# polish_rounds=0: the relaxation alone, but where a test is about the swap search that finishes it
SMALL = dict(
    seq_len=32, train_seqs=8, eval_seqs=4, batch_size=4, bootstrap=200, patterns=False, progress=False, stop_window=10,
    polish_rounds=0,
)  # fmt: skip


def _setup(model, kjv, **settings) -> Setup:
    """The blocks, layout and objectives a dam() call with ``settings`` uses, built again."""
    s = DamSettings.build(None, corpus=kjv, **{name: value for name, value in settings.items() if name != "progress"})
    experiment = Experiment.start(
        model, s, classes=s.mask.classes, objective=s.judging.objective, num_eval=s.eval_seqs, num_train=s.train_seqs
    )
    return Setup.of(experiment, s)


@pytest.mark.slow
def test_a_run_whose_loss_still_falls_when_the_schedule_ends_is_not_converged(minilm_l6, kjv):
    """The check scores the judged mask every 20 steps. Given 100 steps, the mask was still improving
    between the last two scores 40 steps apart while the learning rate was at least a quarter of its
    start: not converged, though the stopping rule ended the annealed schedule. Given 10 steps there
    is no such window: not converged. Given 300, the score has settled, but training's own mask was
    short of the target by more than a point, which the threshold shift made up: not converged either.
    (The relaxation alone: no swap search finishes the masks.)"""
    runs = {steps: attnlens.dam(minilm_l6, corpus=kjv, sparsity=[0.9], steps=steps, **SMALL) for steps in (10, 100, 300)}
    short, middle, long = (runs[steps].table.iloc[0] for steps in (10, 100, 300))
    assert not short["converged"] and "check_step" not in runs[10].table, "no window to judge"
    assert "raise --steps" in runs[10].text()
    assert not middle["converged"] and middle["check_high"] < 0
    curve = runs[100].training.set_index("step")["judged_loss"]
    end = int(middle["check_step"])
    rates = runs[100].training.set_index("step")["lr"] / runs[100].settings["lr"]
    assert rates[end] >= 0.25 > rates[end + 20], "the window is the last at a quarter of the starting rate or more"
    assert middle["check_delta"] == pytest.approx(curve[end] - curve[end - 40], abs=1e-6), "the scores it compared"
    assert long["check_low"] <= 0 <= long["check_high"], "settled"
    assert long["check_shifted"] > 0.01 and not long["converged"] and "threshold shift removed" in runs[300].text()
    # the shift at the check is training's own mask against the target: what the end of the schedule shows too
    assert long["target_sparsity"] - long["trained_sparsity"] == pytest.approx(long["check_shifted"], abs=0.01)


@pytest.mark.slow
def test_the_polish_ends_at_a_local_optimum_at_the_target_and_never_above_the_relaxation(minilm_l3, kjv):
    """The swap search that finishes a mask keeps it at the target, never raises its training loss
    above the relaxation's, and is converged only where no swap it judged helped: with its rounds cut to
    one while swaps still help, it says so. The table's training loss is the polished mask's, judged
    again independently, and the relaxation's own check is kept beside it."""
    full = attnlens.dam(minilm_l3, corpus=kjv, sparsity=[0.9], steps=60, **{**SMALL, "polish_rounds": 20})
    cut = attnlens.dam(minilm_l3, corpus=kjv, sparsity=[0.9], steps=60, **{**SMALL, "polish_rounds": 1})
    row, first = full.table.iloc[0], cut.table.iloc[0]
    assert row["train_loss"] <= row["relaxed_train_loss"] and abs(row["sparsity"] - 0.9) <= 0.01
    assert row["polish_rounds"] < 20 and row["converged"] and "local optimum" in full.text()
    assert "relaxed_converged" in full.table and "the relaxation alone had not settled" in full.text()
    assert "not converged" not in full.text().split("before the search")[1].split("\n")[0], "one verdict word per run"
    assert row["polish_swaps"] >= 1 and first["polish_swaps"] == 1, "the relaxation's mask was not a local optimum"
    assert not first["converged"] and "raise --polish-rounds" in cut.text()
    assert row["relaxed_train_loss"] == first["relaxed_train_loss"], "the same relaxation before either search"
    setup = _setup(minilm_l3, kjv, sparsity=[0.9], **SMALL)
    trained = evaluate_mask(setup.layout, torch.as_tensor(np.asarray(full.logits[0])), setup.train_objective, setup.train)
    assert row["train_loss"] == pytest.approx(trained["losses"].mean(), rel=1e-5)


@pytest.mark.slow
def test_a_fixed_lambda_run_that_settles_is_converged(minilm_l3, kjv):
    """Without a target nothing is shifted. A λ too small to remove anything stops at once, at full
    learning rate, its judged loss unchanged from the start: converged. A large λ still emptying the
    mask when the rate falls below a quarter is not."""
    settled = attnlens.dam(minilm_l3, corpus=kjv, lambdas=[0.1], steps=300, **SMALL).table.iloc[0]
    assert settled["sparsity"] == 0 and settled["converged"] and settled["check_delta"] == 0
    moving = attnlens.dam(minilm_l3, corpus=kjv, lambdas=[100.0], steps=300, **SMALL).table.iloc[0]
    assert moving["check_high"] < 0 and not moving["converged"]


@pytest.mark.slow
def test_mask_seeds_draw_different_noise_and_are_judged_on_the_same_blocks(minilm_l3, kjv):
    result = attnlens.dam(minilm_l3, corpus=kjv, sparsity=[0.9], steps=60, mask_seeds=2, **SMALL)
    table, curves = result.table, result.training
    assert table["mask_seed"].tolist() == [0, 1]
    first, second = (curves[curves["lambda"] == lam] for lam in table["lambda"])
    assert len(first) == table["steps"].iloc[0] and len(second) == table["steps"].iloc[1], "two runs, told apart"
    assert first["density"].iloc[0] != second["density"].iloc[0], "another draw of the noise from the same logits"
    # judged again, independently, on the held-out blocks the command samples: each run's losses are its mask's there
    setup = _setup(minilm_l3, kjv, sparsity=[0.9], **SMALL)
    for number in range(2):
        logits = torch.as_tensor(np.asarray(result.logits[number]))
        again = evaluate_mask(setup.layout, logits, setup.judging_objective, setup.held_out)["losses"]
        np.testing.assert_allclose(again, result.arrays["eval_losses"][number], rtol=1e-5, atol=1e-6)
    assert "target 90%, seed 1" in result.text()
    across = result.across_seeds()
    spread = across["delta"].iloc[0]
    assert spread["seeds"] == 2 and spread["delta_min"] == table["delta"].min() and spread["delta_max"] == table["delta"].max()
    losses = result.arrays["eval_losses"]  # the two masks on the same blocks: their paired difference, and whether it spans 0
    assert spread["apart_seeds"] == "1 − 0" and spread["apart"] == pytest.approx((losses[1] - losses[0]).mean(), abs=1e-9)
    assert spread["apart_low"] <= spread["apart"] <= spread["apart_high"]
    assert spread["agree"] == (spread["apart_low"] <= 0 <= spread["apart_high"])
    # the claim stands on these masks only if both converged and the seeds agree, or each seed's mask decides it
    # alike (both within the proxy's tolerance of 0.01, or both beyond it); else it is not decided
    full = Context("full")
    verdict = dam_claims(result, full, standing(result, full))[0].verdict
    expected = "a run did not converge" if not table["converged"].all() else None if spread["agree"] else "seeds disagree"
    alike = len({bool(delta <= 0.01) for delta in table["delta"]}) == 1
    if expected is None or (expected == "seeds disagree" and alike):
        assert verdict.phrase.decided, verdict
        assert verdict.said.endswith("every seed") == (expected is not None)
    else:
        assert verdict.phrase is Phrase.NOT_DECIDED and expected in verdict.said, verdict
    default = Context("default")
    assert dam_claims(result, default, standing(result, default))[0].verdict.text == (
        "not decided at this size (run --full)" if expected else verdict.text
    ), "below the full size, an undecided claim says run --full"


@pytest.mark.slow
@pytest.mark.parametrize("start", ["dam", "band"])
def test_the_reference_search_never_ends_worse_than_its_start(minilm_l3, kjv, start):
    """Its training loss never rises above the start's, and its mask, judged again independently,
    has the training and held-out losses and the sparsity the table reports."""
    result = attnlens.dam(minilm_l3, corpus=kjv, sparsity=[0.9], steps=30, reference=start, reference_rounds=3, **SMALL)
    row = result.tables["reference"].iloc[0]
    assert row["train_loss"] <= row["start_train_loss"]
    if start == "dam":
        assert row["start_train_loss"] == pytest.approx(row["dam_train_loss"], rel=1e-6), "it starts at DAM's mask"
    setup = _setup(minilm_l3, kjv, sparsity=[0.9], **SMALL)
    logits = torch.as_tensor(np.asarray(result.arrays["reference_logits"][0]))
    held = evaluate_mask(setup.layout, logits, setup.judging_objective, setup.held_out)
    trained = evaluate_mask(setup.layout, logits, setup.train_objective, setup.train)
    assert row["train_loss"] == pytest.approx(trained["losses"].mean(), rel=1e-5)
    assert row["delta"] == pytest.approx((held["losses"] - setup.baseline).mean(), abs=1e-6)
    assert row["sparsity"] == pytest.approx(float(held["sparsity"])) and abs(row["sparsity"] - 0.9) <= 0.01


def test_a_reference_asked_of_a_layout_too_large_is_one_line(capsys, tmp_path, minilm_l6):
    code, _, err = run_cli(
        capsys, "dam", "--model", "minilm-l6", "--variant", "unstructured", "--sparsity", "0.9", "--reference", "dam",
        "--seq-len", "32", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert_one_line_error(code, err, "at most 4,096 logits", "unstructured has 73,728")
    assert not (tmp_path / "out").exists()


def test_mask_seeds_zero_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "dam", "--mask-seeds", "0", "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "--mask-seeds 0 must be at least 1")


@pytest.fixture(scope="module")
def next_token(tmp_path_factory, minilm_l6):
    """A 1-layer, 1-head encoder built by hand for n = 8: positions are one-hot in dimensions 0-7 and
    each query looks for the key one place after it, so every token attends to the next one (offset
    1) and the last, with no next, to [CLS] (offset 7); the attention's output, 20 times the next
    token's content, outweighs the residual. So a mask reproduces the model exactly when it keeps
    offsets 1 and 7, whatever else it keeps: the optimum is known."""
    n, size = 8, 16
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=size, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1,
        max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.BertModel(config)
    with torch.no_grad():
        embeddings, layer = model.embeddings, model.encoder.layer[0].attention
        embeddings.word_embeddings.weight[:, :n] = 0
        embeddings.position_embeddings.weight.zero_()
        embeddings.position_embeddings.weight[:n, :n] = 4 * torch.eye(n)
        embeddings.token_type_embeddings.weight.zero_()
        after = torch.zeros(size, size)
        after[torch.arange(1, n), torch.arange(n - 1)] = 20  # the query of position p is the key of position p + 1
        for linear, weight in (
            (layer.self.query, after),
            (layer.self.key, torch.block_diag(torch.eye(n), torch.zeros(size - n, size - n))),
            (layer.self.value, torch.block_diag(torch.zeros(n, n), torch.eye(size - n))),
            (layer.output.dense, 20 * torch.eye(size)),
        ):
            linear.weight.copy_(weight)
            linear.bias.zero_()
    path = save_with_minilm_tokenizer(tmp_path_factory.mktemp("next_token"), model, minilm_l6)
    return attnlens.load_model(str(path))


@pytest.mark.slow
def test_dam_converges_to_the_known_optimum_of_a_model_built_by_hand(next_token, kjv):
    """n = 8: offsets 0..7 decide 8, 14, 12, 10, 8, 6, 4, 2 of the 64 positions, so at 75% sparsity
    (16 kept) offsets 1 and 7 alone are the optimum. DAM_s keeps exactly them, is converged, and no set
    of offsets keeping as many positions (all 256 tried) has a lower training loss."""
    ids = torch.as_tensor(np.asarray(kjv.blocks(next_token, n=8, num_blocks=4, seed=0).ids))
    weights = next_token.forward(ids, output_attentions=True).attentions[0][:, 0]  # (block, query, key)
    rows = torch.arange(8)
    assert (weights[:, rows[:-1], rows[1:]] > 0.95).all() and (weights[:, 7, 0] > 0.9).all(), "built as described"
    settings = dict(seq_len=8, train_seqs=32, eval_seqs=4, batch_size=8, bootstrap=200, patterns=False, progress=False)
    result = attnlens.dam(next_token, corpus=kjv, sparsity=[0.75], stop_window=20, **settings)
    row = result.table.iloc[0]
    learned = set(np.flatnonzero(np.asarray(result.logits[0])[0] > 0).tolist())
    assert learned == {1, 7} and row["converged"], (learned, row)
    setup = _setup(next_token, kjv, sparsity=[0.75], **settings)
    positions = {offset: 8 if offset == 0 else 2 * (8 - offset) for offset in range(8)}
    size = sum(positions[offset] for offset in learned)
    losses = []
    for kept in itertools.chain.from_iterable(itertools.combinations(range(8), count) for count in range(1, 9)):
        if sum(positions[offset] for offset in kept) == size:
            logits = torch.full((1, 8), -1.0)
            logits[0, list(kept)] = 1.0
            losses.append(evaluate_mask(setup.layout, logits, setup.train_objective, setup.train)["losses"].mean())
    assert row["train_loss"] <= min(losses) + 1e-6, (row["train_loss"], min(losses))


def test_layout_sizes_against_the_reference_limit():
    valid = torch.ones(6, 64, 64, dtype=torch.bool)
    names = ("unstructured", "structured", "structured+global", "class")
    sizes = {name: int(np.prod(LAYOUTS[name](6, 12, 64, valid, ("self", "other")).shape)) for name in names}
    assert sizes == {"unstructured": 6 * 12 * 64 * 64, "structured": 12 * 64, "structured+global": 12 * 68, "class": 144}


@pytest.mark.slow
def test_masks_learn_from_a_train_objective_and_are_judged_by_the_objective(tmp_path_factory, minilm_l6, kjv):
    """--train-objective hidden: the training blocks are prepared and scored by the hidden objective
    (train_loss is the hidden loss of the learned mask there, judged again independently), the
    held-out blocks by mlm."""
    from tiny_models import save_tiny

    model = attnlens.load_model(str(save_tiny(tmp_path_factory.mktemp("mlm"), minilm_l6, "mlm")))
    settings = dict(SMALL, sparsity=[0.8], objective="mlm", train_objective="hidden")
    result = attnlens.dam(model, corpus=kjv, steps=20, **settings)
    assert result.meta["settings"]["trained_on"] == "hidden" and result.meta["settings"]["objective"] == "mlm"
    setup = _setup(model, kjv, **settings)
    assert setup.judging_objective.name == "mlm" and setup.train_objective.name == "hidden"
    logits = torch.as_tensor(np.asarray(result.logits[0]))
    trained = evaluate_mask(setup.layout, logits, setup.train_objective, setup.train)["losses"].mean()
    held = evaluate_mask(setup.layout, logits, setup.judging_objective, setup.held_out)["losses"] - setup.baseline
    assert result.table.iloc[0]["train_loss"] == pytest.approx(trained, rel=1e-5)
    assert result.table.iloc[0]["delta"] == pytest.approx(held.mean(), abs=1e-6)


@pytest.mark.slow
def test_resample_draws_each_seed_its_own_training_blocks(minilm_l3, kjv):
    """--resample: the first seed trains on the blocks a plain run does (and gives its numbers), the
    second on its own draw, disjoint from the held-out blocks, which stay; the second mask's training
    loss is its mask's on those blocks, built again independently."""
    settings = dict(SMALL, sparsity=[0.9], steps=20)
    plain = attnlens.dam(minilm_l3, corpus=kjv, **settings)
    result = attnlens.dam(minilm_l3, corpus=kjv, mask_seeds=2, resample=True, **settings)
    corpus = result.meta["corpus"]
    drawn = result.meta["settings"]["train_block_index_by_seed"]
    assert list(drawn) == [1] and len(drawn[1]) == 8
    assert not set(drawn[1]) & set(corpus["eval_block_index"]) and drawn[1] != corpus["train_block_index"]
    assert corpus == plain.meta["corpus"], "the same held-out blocks, and the first seed's training blocks"
    assert result.table["delta"].iloc[0] == plain.table["delta"].iloc[0]
    every = kjv.blocks(minilm_l3, 32, num_blocks=None)
    blocks = type(every)(ids=every.ids[drawn[1]], index=np.asarray(drawn[1]), available=every.available)
    setup = _setup(minilm_l3, kjv, **settings)
    train = MaskSplit.of(setup.experiment.split(blocks, 4), setup.layout, setup.experiment.classes)
    trained = evaluate_mask(setup.layout, torch.as_tensor(np.asarray(result.logits[1])), setup.train_objective, train)
    assert result.table["train_loss"].iloc[1] == pytest.approx(trained["losses"].mean(), rel=1e-5)


def test_resample_with_the_task_as_training_data_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "dam", "--resample", "--task", "rotten-tomatoes", "--train-on", "task", "--out", str(tmp_path / "out")
    )
    assert_one_line_error(code, err, "--resample draws other corpus training blocks", "--train-on task")
