"""Reconstruction maps trained jointly with the weights (Paper A's "R learned"), under the finetune protocol."""

from __future__ import annotations

import pytest
import torch

from attnlens.analysis.reconstruct import reconstruct
from attnlens.analysis.task import TaskJudge

SMALL = dict(
    num_seqs=8, seq_len=16, strategies=("greedy",), plug_in=True, batch_size=8, task="rotten-tomatoes", protocol="finetune",
    task_joint_r=True, task_train=16, task_eval=20, finetune_steps=3, progress=False,
)  # fmt: skip


def _runs(result) -> dict[tuple[str | None, int], dict]:
    """The result's fine-tune runs' saved states, by (change key, seed)."""
    return {
        (run["change"], run["seed"]): torch.load(run["cache"], weights_only=True)
        for run in result.meta["task"]["finetune"]["runs"]
    }


@pytest.fixture(scope="module")
def at_n(minilm_l3, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield reconstruct(minilm_l3, ks=(16,), scopes=("head", "all"), **SMALL)


def test_joint_r_at_k_equal_n_is_training_without_the_change(at_n):
    # every row is a chosen key's: nothing to train, every score exact, so the encoder and head
    # train as they do with nothing inside attention, bit for bit
    runs = _runs(at_n)
    plain = runs[(None, 0)]
    joint = [state for (key, _), state in runs.items() if key and key.endswith("/joint")]
    assert len(joint) == 2, "one per scope"
    for state in joint:
        for part in ("encoder", "head"):
            for name, value in state[part].items():
                assert torch.equal(value, plain[part][name]), name
        assert torch.equal(state["curve"], plain["curve"])
    row = at_n.plug_in.iloc[0]
    assert row["joint_accuracy"] == row["unmodified_accuracy"]


@pytest.mark.slow
def test_joint_r_trains_the_maps_and_shares_them_as_its_scope_says(minilm_l3, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    result = reconstruct(minilm_l3, ks=(4,), scopes=("head", "layer", "all"), **SMALL)
    runs = {key: state for (key, _), state in _runs(result).items() if key and key.endswith("/joint")}
    units = {key.split("/")[2]: state["change"] for key, state in runs.items()}
    layers, heads = minilm_l3.num_layers, minilm_l3.num_heads
    assert len(units["head"]) == 2 * layers and units["head"][0].shape[0] == heads  # a map per head, per layer
    assert len(units["layer"]) == 2 * layers and units["layer"][0].shape[0] == 1  # one per layer, shared by its heads
    assert len(units["all"]) == 2 and units["all"][0].shape[0] == 1  # one for the whole model
    fixed = {key: state for (key, _), state in _runs(result).items() if key and not key.endswith("/joint")}
    for key, state in runs.items():  # the joint run moved the encoder differently from the fixed-R run
        twin = fixed[key.removesuffix("/joint")]
        assert not torch.equal(
            state["encoder"]["embeddings.word_embeddings.weight"], twin["encoder"]["embeddings.word_embeddings.weight"]
        )
    assert {"joint_accuracy", "joint_delta_accuracy_low"} <= set(result.plug_in.columns)


def test_a_cached_joint_run_reloads_without_training(at_n, minilm_l3, monkeypatch):
    monkeypatch.setattr(TaskJudge, "_train", lambda *args: pytest.fail("trained again"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNLENS_CACHE", str(at_n.meta["task"]["finetune"]["runs"][0]["cache"]).rsplit("/finetune/", 1)[0])
        again = reconstruct(minilm_l3, ks=(16,), scopes=("head", "all"), **SMALL)
    columns = ["accuracy", "joint_accuracy", "joint_delta_accuracy"]
    assert again.plug_in[columns].equals(at_n.plug_in[columns])


def test_joint_r_needs_the_finetune_protocol(capsys, tmp_path):
    from attnlens.analysis.reconstruct import ReconstructSettings
    from attnlens.errors import BadInput
    from tiny_models import assert_one_line_error, run_cli

    with pytest.raises(BadInput, match="needs protocol finetune"):
        ReconstructSettings.build(task="rotten-tomatoes", plug_in=True, task_joint_r=True)
    code, _, err = run_cli(
        capsys,
        "reconstruct",
        "minilm-l6",
        "--out",
        str(tmp_path / "r"),
        "--plug-in",
        "--task",
        "rotten-tomatoes",
        "--task-joint-r",
    )
    assert_one_line_error(code, err, "finetune")


def test_task_joint_ks_picks_the_ks_judged_with_maps_trained_with_the_weights():
    from attnlens.analysis.reconstruct import ReconstructSettings
    from attnlens.analysis.reconstruct.judging import _judged_jointly
    from attnlens.errors import BadInput

    common = dict(task="imdb", protocol="finetune", plug_in=True, task_ks=(16, 32))
    some = _judged_jointly(ReconstructSettings.build(**common, task_joint_r=True, task_joint_ks=(16,)))
    every = _judged_jointly(ReconstructSettings.build(**common, task_joint_r=True))
    none = _judged_jointly(ReconstructSettings.build(**common, task_joint_ks=(16,)))
    assert [some(16), some(32), every(16), every(32), none(16)] == [True, False, True, True, False]
    with pytest.raises(BadInput, match="task_joint_ks 8 is not among the task_ks"):
        ReconstructSettings.build(**common, task_joint_r=True, task_joint_ks=(8,))
