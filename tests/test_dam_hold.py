"""A held DAM run (`dual` hold): the hard mask kept on a line down to its target, λ where the gradients balance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlens
from attnlens.analysis.dam import DamSettings, DamTrainer
from attnlens.errors import BadInput

SMALL = dict(
    seq_len=32, train_seqs=8, eval_seqs=4, batch_size=4, bootstrap=50, patterns=False, progress=False, stop_window=10,
    check_window=4, polish_rounds=0,
)  # fmt: skip


def bare_trainer(logits: np.ndarray, weights: np.ndarray) -> DamTrainer:
    """A trainer holding only logits and the positions each decides: what project and hold read."""
    trainer = DamTrainer.__new__(DamTrainer)
    trainer.logits_ = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    trainer.weights_ = torch.tensor(weights, dtype=torch.float32)
    return trainer


@pytest.mark.parametrize("density", [0.05, 0.3, 0.8])
def test_project_keeps_the_smallest_prefix_that_reaches_the_density(density):
    """Against brute force: after the shift the hard mask α > 0 keeps the logits sorted from the
    largest up to the first prefix whose weight reaches the density, and only those."""
    rng = np.random.default_rng(int(density * 100))
    logits, weights = rng.normal(size=(6, 40)), rng.uniform(0.1, 3.0, size=(6, 40))
    trainer = bare_trainer(logits, weights)
    trainer.project(density)
    kept = (trainer.logits_.detach() > 0).numpy()
    order = np.argsort(-logits, axis=None)
    shares = np.cumsum(weights.flatten()[order]) / weights.sum()
    first = int(np.flatnonzero(shares >= density)[0])
    assert set(np.flatnonzero(kept.flatten())) == set(order[: first + 1].tolist())
    assert np.ptp(trainer.logits_.detach().numpy() - logits) < 1e-5, "every logit shifted by one constant"


def test_a_held_runs_lambda_balances_the_averaged_gradients_on_the_target_share():
    """Against numpy: λ leaves less than the target's share of the positions on logits whose averaged
    pull exceeds λ times their averaged push, and with those at λ at least that share; the averages are
    Adam's first moment (decay 0.9) of each step's gradients."""
    rng = np.random.default_rng(0)
    weights = rng.uniform(1, 32, size=(12, 32))
    trainer = bare_trainer(np.zeros_like(weights), weights)
    trainer.optimizer_, trainer.moments_, trainer.target_density = torch.optim.Adam([trainer.logits_]), None, 0.2
    pulls, pushes = rng.normal(size=(2, 12, 32)), rng.uniform(0.1, 1.0, size=(2, 12, 32))
    for pull, push in zip(pulls, pushes):
        lam = trainer.balance(torch.tensor(pull, dtype=torch.float32), torch.tensor(push, dtype=torch.float32))
    ratio = (0.9 * pulls[0] + 0.1 * pulls[1]) / (0.9 * pushes[0] + 0.1 * pushes[1])
    share = lambda kept: weights[kept].sum() / weights.sum()  # noqa: E731
    assert share(ratio > lam * (1 + 1e-5)) < 0.2 <= share(ratio >= lam * (1 - 1e-5))


def test_auto_holds_exactly_when_the_weights_train_and_a_held_run_starts_where_gradients_balance():
    assert [DamSettings.build(dual=dual, train_weights=tw).holds for dual in ("auto", "ascent", "hold") for tw in (False, True)] == [
        False, True, False, False, True, True,
    ]  # fmt: skip
    assert DamSettings.build(sparsity=(0.9,), dual="hold").runs() == [(None, 0.9, 0)]
    assert DamSettings.build(sparsity=(0.9,)).runs() == [(0.1, 0.9, 0)]
    with pytest.raises(BadInput, match="dual"):
        DamSettings.build(dual="integral")


@pytest.mark.slow
@pytest.mark.parametrize("train_weights", [False, True])
def test_a_held_mask_follows_its_line_to_the_target_and_is_judged_there(minilm_l3, kjv, train_weights):
    """Every step's hard mask keeps the density on the straight line from the start (every logit
    kept) to the target over the first third of the cap, then the target, within one logit's share
    of the positions; the mask judged on held-out blocks is within a point of the target, and λ
    began where the gradients balance, not at the cold start's 0.1."""
    steps, target = 30, 0.8
    result = attnlens.dam(
        minilm_l3, corpus=kjv, sparsity=[target], steps=steps, dual="hold", train_weights=train_weights, weights_lr=1e-4,
        **SMALL,
    )  # fmt: skip
    curve = result.training
    aim = 1.0 - target * np.minimum((curve["step"] + 1) / (steps / 3), 1.0)  # from 1 down to 1 - target, by hand
    granularity = 1 / 32  # kjv blocks are full: a DAM_s logit (head, offset) decides at most n of n² positions
    assert np.abs(curve["hard_density"] - aim).max() <= granularity, curve[["step", "hard_density"]].assign(aim=aim)
    assert len(curve) >= steps / 3, "a held run does not stop before its line reaches the target"
    assert abs(result.table["sparsity"].iloc[0] - target) <= 0.01
    assert result.table["lambda_start"].iloc[0] != pytest.approx(0.1)
