"""The plan's head screen (attnlens.analysis.plan.screen): every head's cost under every choice estimated from
one forward and a backward pass per class, checked against forwards of the model with the change made by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import entropy, spearmanr

import attnlens
from attnlens.analysis.plan import PlanSettings, _curves, _planner
from attnlens.errors import BadInput

LAYER, HEAD, WIDTH = 1, 3, 2
SETTINGS = dict(seq_len=32, task="rotten-tomatoes", task_train=64, task_eval=40, max_drop=(50.0,), fit_seqs=4, curve_seqs=8,
                ks=(), widths=(WIDTH,), forecastable_only=False, head_costs="screen")  # fmt: skip


def mixed(t: float, valid_keys: torch.Tensor):
    """The hooks of a forward whose head ``HEAD`` of layer ``LAYER`` takes the weights w + t (w_window − w): the window's
    weights by hand, softmax over the scores of the keys within ``WIDTH`` positions (and valid)."""
    kept: dict[int, torch.Tensor] = {}

    def keep(layer, scores, valid):
        kept[layer] = scores.detach()

    def weights(layer, w, valid):
        if layer != LAYER:
            return None
        n = w.shape[-1]
        near = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= WIDTH
        allowed = near & valid_keys[:, None, :]
        window = torch.softmax(kept[layer][:, HEAD].masked_fill(~allowed, float("-inf")), -1)
        window = torch.where(allowed.any(-1, keepdim=True), window, w[:, HEAD])  # a padded query with no key left keeps its row
        w = w.clone()
        w[:, HEAD] = w[:, HEAD] + t * (window - w[:, HEAD])
        return w

    return keep, weights


@pytest.mark.integration
def test_the_screen_is_the_second_order_limit_of_the_measured_divergence(minilm_l3):
    """A head moved a small step t towards its window: the divergence of the classifier's predictions, measured by
    forwards (scipy's KL of the probabilities), divided by t², is the screen's estimate for that head and window
    (the mean over the curve examples), to within the third-order term: a share of t (0.3% here at t = 0.02, 1.4% at
    0.1, 12% for the whole change)."""
    planner = _planner(minilm_l3, PlanSettings.build(**SETTINGS), "cpu", False)
    screened = _curves(planner, False).set_index(["layer", "head"]).cost
    judge = planner.costs.task
    t, by_hand = 0.02, []
    for batch in planner.costs.curve.inputs:
        with torch.no_grad():
            unmodified = torch.softmax(judge.logits(batch).double(), 1).numpy()
            keep, weights = mixed(t, batch.attention_mask.bool())
            with attnlens.Capture(intervene=keep, intervene_weights=weights, record=False):
                changed = torch.softmax(judge.logits(batch).double(), 1).numpy()
        by_hand += [entropy(p, q) for p, q in zip(unmodified, changed)]
    measured = np.mean(by_hand) / t**2
    assert measured > 1e-5, "the window moves the predictions: the comparison can fail"
    assert screened[LAYER, HEAD] == pytest.approx(measured, rel=0.01)


@pytest.mark.integration
def test_the_screen_ranks_the_changes_as_their_forwards_do(minilm_l3):
    """Whole changes (every head under a window of 2 keys a side): the screen's estimates against the divergences
    the forwards measure head by head on the same examples, rank for rank and in size."""
    planner = _planner(minilm_l3, PlanSettings.build(**SETTINGS), "cpu", False)
    by_forwards = dataclasses.replace(planner, s=planner.s.replace(head_costs="forwards"))
    screened, forwards = (_curves(one, False).set_index(["layer", "head", "choice"]).cost for one in (planner, by_forwards))
    assert spearmanr(screened, forwards.loc[screened.index]).statistic > 0.9
    assert 0.7 < np.median(screened / forwards.loc[screened.index]) < 1.4
    assert (screened >= 0).all()


def test_a_screen_needs_an_accuracy_budget():
    with pytest.raises(BadInput, match="max_drop"):
        PlanSettings.build(max_loss=(0.01,), head_costs="screen")
