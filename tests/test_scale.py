"""Scaling out: real multi-process jobs (torchrun, gloo, 2 ranks on localhost) against one process.

Every multi-rank job here is a real ``torchrun --nproc-per-node 2`` launch of the
command line; references are computed in this process, by brute force (every layer
captured whole, summed by numpy: ``tiny_models.reference_moments``) or by a
single-process run, never copied from the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

import attnlens
from attnlens.rows.budgets import MomentsCost, parse_bytes, plan_units
from attnlens.rows.jobs import run_moments
from attnlens.rows.moments import ARRAYS, UnitSums, compute_moments, split_halves
from attnlens.rows.partials import load_moments, load_partial
from attnlens.rows.sources import ModelRows
from tiny_models import assert_one_line_error, reference_moments, run_cli, save_tiny

# The repository this attnlens comes from goes first on the path of every launched rank.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(attnlens.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
}
JOB = ["minilm-l6", "--seq-len", "16", "--num-seqs", "12", "--batch-size", "2", "--layers", "0,3", "--no-progress"]
JOB_SETTINGS = dict(seq_len=16, num_seqs=12, batch_size=2, layers=[0, 3], progress=False)


def torchrun(*args: str, script: Path | None = None) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m attnlens ARGS`` (or a script); a free port each time."""
    target = [str(script)] if script else ["-m", "attnlens"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *target, *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def assert_same_moments(got, expected, *, exact: bool = False, rtol: float = 1e-12) -> None:
    for half in ("a", "b"):
        for name in ARRAYS:
            x, y = np.asarray(getattr(getattr(got, half), name)), np.asarray(getattr(getattr(expected, half), name))
            if exact:
                np.testing.assert_array_equal(x, y, err_msg=f"{half}.{name}")
            else:
                np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(), err_msg=f"{half}.{name}")


@pytest.fixture(scope="module")
def two_rank_job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scale") / "job2"
    result = torchrun("moments", *JOB, "--out", str(out))
    assert_ok(result)
    assert result.stdout.count("wrote merged moments") == 1, "only rank 0 reports"
    return out


@pytest.fixture(scope="module")
def one_process_job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scale") / "job1"
    run_moments("minilm-l6", out, **JOB_SETTINGS)
    return out


# ---------------------------------------------------------------------- exactness


def test_two_ranks_equal_one_process_and_the_in_memory_moments(two_rank_job, one_process_job, minilm_l6, kjv):
    two, one = load_moments(two_rank_job), load_moments(one_process_job)
    assert_same_moments(two.halves, one.halves)
    # Independent reference: numpy's sums of the same blocks' captured scores.
    reference = reference_moments(minilm_l6, kjv.blocks(minilm_l6, n=16, num_blocks=12, seed=0).ids, [0, 3], seed=0)
    assert_same_moments(two.halves, reference)
    assert two.meta["distributed"]["world_size"] == 2 and two.meta["distributed"]["backend"] == "gloo"
    assert [part["sequences"] for part in two.meta["partials"]] == [[0, 6], [6, 12]]
    # eigen reads the job directory; same spectra as eigen straight from the model.
    from_job = attnlens.eigen(two_rank_job, keep=4, progress=False)
    direct = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=12, layers=[0, 3], keep=4, progress=False)
    for level in ("head", "layer", "model"):
        np.testing.assert_allclose(
            from_job.arrays[f"{level}_eigenvalues"], direct.arrays[f"{level}_eigenvalues"], rtol=1e-9, atol=1e-9
        )
    assert (from_job.table.k90.to_numpy() == direct.table.k90.to_numpy()).all()
    assert from_job.meta["moments"]["run"]["world_size"] == 2


def test_merge_of_partial_files_equals_the_all_reduce(capsys, tmp_path, two_rank_job):
    code, out, _ = run_cli(capsys, "merge", str(two_rank_job / "partials"), "--out", str(tmp_path / "merged"), "--no-progress")
    assert code == 0 and "merged 2 partial files" in out
    merged = attnlens.load_result(tmp_path / "merged")
    # Two operands per entry: float addition is commutative, so the sums agree bit for bit.
    assert_same_moments(merged.halves, load_moments(two_rank_job).halves, exact=True)
    assert merged.meta["merged_by"] == "attnlens merge" and len(merged.meta["partials"]) == 2
    eigen = attnlens.eigen(tmp_path / "merged", keep=4, progress=False)
    assert eigen.meta["moments"]["num_seqs"] == 12
    # One rank's file alone does not cover the sequences.
    assert_one_line_error(
        *run_cli(capsys, "merge", str(two_rank_job / "partials" / "pass000-rank00000.npz"), "--out", str(tmp_path / "m2"))[::2],
        "sequences 6 to 11",
        "are missing",
    )


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import attnlens.rows.partials as partials
    from attnlens.cli import main
    original, calls = partials._dump, []
    def dump_then_die(path, meta, arrays):
        calls.append(path)
        if os.environ["RANK"] == "1" and len(calls) == 2:   # rank 1, checkpoint of its second batch
            with open(path, "wb") as handle:
                handle.write(b"PK\\x03\\x04 half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)
        original(path, meta, arrays)
    partials._dump = dump_then_die
    main(sys.argv[1:])
    """
)


def test_a_killed_rank_resumes_to_the_uninterrupted_result(capsys, tmp_path, two_rank_job):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    out = tmp_path / "job"
    killed = torchrun("moments", *JOB, "--out", str(out), script=script)
    assert killed.returncode != 0
    meta, _ = load_partial(out / "partials" / "pass000-rank00001.npz")
    assert meta["done"] == 2, "rank 1 loses only the batch it was checkpointing"
    with pytest.raises(attnlens.AttnlensError, match="has not finished"):
        load_moments(out)
    shutil.copytree(out / "partials", tmp_path / "unfinished")
    # torchrun stops rank 0 when rank 1 dies; on a busy machine rank 0 may not have finished either.
    first = next(path for path in sorted((out / "partials").glob("*.npz")) if load_partial(path)[0]["done"] < 6)
    done = load_partial(first)[0]["done"]
    assert_one_line_error(
        *run_cli(capsys, "merge", str(tmp_path / "unfinished"), "--out", str(tmp_path / "m"))[::2],
        f"{first.name} is unfinished ({done} of 6 sequences)",
        "--resume",
    )
    assert_one_line_error(*run_cli(capsys, "moments", *JOB, "--out", str(out))[::2], "already exists", "--resume")
    resumed = torchrun("moments", *JOB, "--out", str(out), "--resume")
    assert_ok(resumed)
    # Each rank continues with the same batches from its checkpoint: the same sums, bit for bit.
    assert_same_moments(load_moments(out).halves, load_moments(two_rank_job).halves, exact=True)


def test_head_sharding_under_a_small_budget_gives_the_same_eigenvalues(tmp_path, two_rank_job):
    out, budget = tmp_path / "sharded", "40kB"
    assert_ok(torchrun("moments", *JOB, "--out", str(out), "--max-memory", budget))
    merged = load_moments(out)
    plan = merged.meta["run"]["plan"]
    assert plan["passes"] > 1 and plan["groups_per_pass"] == 2, plan
    partials = sorted((out / "partials").glob("*.npz"))
    assert len(partials) == 2 * plan["passes"]
    held = [sum(array.nbytes for array in load_partial(path)[1].values()) for path in partials]
    assert max(held) <= parse_bytes(budget) - plan["working_bytes"], "every rank's sums stay under the budget"
    assert sum(len(load_partial(path)[0]["units"]) for path in partials) == 24, "each unit once"
    sharded = attnlens.eigen(out, keep=4, progress=False)
    whole = attnlens.eigen(two_rank_job, keep=4, progress=False)
    for level in ("head", "layer", "model"):
        np.testing.assert_allclose(
            sharded.arrays[f"{level}_eigenvalues"], whole.arrays[f"{level}_eigenvalues"], rtol=1e-9, atol=1e-9
        )
        np.testing.assert_allclose(
            np.abs(sharded.arrays[f"{level}_eigenvectors_a"]), np.abs(whole.arrays[f"{level}_eigenvectors_a"]), atol=1e-5
        )


# ---------------------------------------------------------------------- sharded stores

STORE_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from attnlens.io.files import pwrite_all
    from attnlens.io.store import StoreWriter
    from attnlens.cli import main
    calls = []
    def write_then_die(descriptor, data, offset):
        calls.append(offset)
        if os.environ["RANK"] == "1" and len(calls) == 6:   # rank 1, second batch: half an array, then SIGKILL
            pwrite_all(descriptor, data[: len(data) // 2], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        pwrite_all(descriptor, data, offset)
    StoreWriter._write_at = staticmethod(write_then_die)
    main(sys.argv[1:])
    """
)
STORE = ["--seq-len", "16", "--num-seqs", "10", "--batch-size", "2", "--layers", "0,2", "--dtype", "float32", "--no-progress"]


@pytest.mark.slow  # real torchrun launches
def test_sharded_store_killed_and_resumed_reads_as_the_single_process_store(tmp_path, minilm_l6, kjv):
    script = tmp_path / "killer.py"
    script.write_text(STORE_KILLER)
    out = tmp_path / "sharded"
    killed = torchrun("extract", "--out", str(out), *STORE, script=script)
    assert killed.returncode != 0
    with pytest.raises(attnlens.AttnlensError, match=r"unfinished \(rank 1: 2 of 5 sequences\)"):
        attnlens.open_store(out)
    assert json.loads((out / "progress-rank00001.json").read_text())["complete"] == 7, "rank 1 kept its first batch"
    resumed = torchrun("extract", "--out", str(out), "--resume", *STORE)
    assert_ok(resumed)
    assert resumed.stdout.count("wrote 10 sequences") == 1
    sharded = attnlens.open_store(out)
    assert sharded.manifest["shards"] == [[0, 5], [5, 10]] and sharded.manifest["format_version"] == 2
    single = attnlens.extract(
        minilm_l6,
        tmp_path / "single",
        corpus=kjv,
        seq_len=16,
        num_seqs=10,
        batch_size=2,
        layers=[0, 2],
        dtype="float32",
        progress=False,
    )
    np.testing.assert_array_equal(sharded.tokens, single.tokens)
    for layer in (0, 2):
        np.testing.assert_array_equal(sharded.valid(layer), single.valid(layer))
        # Ranks run with one thread each, this process with more: allow BLAS rounding.
        np.testing.assert_allclose(sharded.scores(layer), single.scores(layer), rtol=1e-5, atol=1e-5)
    with pytest.raises(attnlens.AttnlensError, match="extracted by 2 rank"):
        attnlens.extract(
            minilm_l6,
            out,
            corpus=kjv,
            seq_len=16,
            num_seqs=10,
            batch_size=2,
            layers=[0, 2],
            dtype="float32",
            resume=True,
            progress=False,
        )


# ---------------------------------------------------------------------- in one process


def test_unit_sums_equal_moments_on_any_subset_of_heads(minilm_l6, kjv):
    """The accumulator of a head subset (in chunks, per query, any quantity), and the in-memory pipeline,
    against numpy's sums of the captured rows."""
    blocks = kjv.blocks(minilm_l6, n=16, num_blocks=20, seed=1)
    rows = ModelRows(minilm_l6, blocks)
    units = [(1, head) for head in range(5, 12)] + [(4, head) for head in range(0, 3)]
    for quantity, queries in (("scores", None), ("weights", [0, 7, 15]), ("log-weights", None)):
        reference = reference_moments(minilm_l6, blocks.ids, [1, 4], quantity=quantity, queries=queries, seed=2)
        in_memory = compute_moments(rows, quantity=quantity, queries=queries, layers=[1, 4], batch_size=7, seed=2, progress=False)
        assert_same_moments(in_memory, reference, rtol=1e-10)
        sums = UnitSums(units, n=16, num_heads=12, quantity=quantity, queries=queries, head_chunk=3)
        half = split_halves(20, 2)
        rows.for_each_batch(
            np.arange(20), [1, 4], lambda layer, s, v, seqs: sums.add(layer, s, v, half[seqs]), batch_size=4, progress=False
        )
        got = sums.halves([1, 4])
        held = np.zeros((2, 12), dtype=bool)
        for layer, head in units:
            held[[1, 4].index(layer), head] = True
        for part, expected in ((got.a, reference.a), (got.b, reference.b)):
            for name in ARRAYS:
                np.testing.assert_allclose(getattr(part, name)[held], getattr(expected, name)[held], rtol=1e-10, atol=1e-10)
                assert not getattr(part, name)[~held].any()


def test_unit_sums_of_a_causal_model_use_only_full_rows(tmp_path, minilm_l6, kjv):
    """Causal rows: pooled sums take the last (full-length) row of each block, per-query sums the valid prefix."""
    model = attnlens.load_model(str(save_tiny(tmp_path, minilm_l6, "causal")))
    blocks = kjv.blocks(model, n=12, num_blocks=16, seed=0)
    rows = ModelRows(model, blocks)
    for queries in (None, [0, 5, 11]):
        reference = reference_moments(model, blocks.ids, [0, 1], quantity="weights", queries=queries, seed=1)
        in_memory = compute_moments(rows, quantity="weights", queries=queries, batch_size=5, seed=1, progress=False)
        assert_same_moments(in_memory, reference, rtol=1e-10)
        sums = UnitSums([(1, 1), (1, 2), (1, 3)], n=12, num_heads=4, quantity="weights", queries=queries, head_chunk=2)
        half = split_halves(16, 1)
        rows.for_each_batch(
            np.arange(16), [1], lambda layer, s, v, seqs: sums.add(layer, s, v, half[seqs]), batch_size=3, progress=False
        )
        got = sums.halves([0, 1])
        for part, expected in ((got.a, reference.a), (got.b, reference.b)):
            for name in ARRAYS:
                np.testing.assert_allclose(getattr(part, name)[1, 1:], getattr(expected, name)[1, 1:], rtol=1e-10, atol=1e-12)
        assert got.a.count[1, 1, 0] + got.b.count[1, 1, 0] == 16


def test_float32_sums_stay_within_the_documented_bound(tmp_path, one_process_job):
    out = tmp_path / "f32"
    run_moments("minilm-l6", out, accumulate="float32", **JOB_SETTINGS)
    single, double = load_moments(out).halves.total, load_moments(one_process_job).halves.total
    assert load_partial(out / "partials" / "pass000-rank00000.npz")[1]["sum_outer"].dtype == np.float32
    c32, c64 = single.second_moment(), double.second_moment()
    error = np.linalg.norm(c32 - c64, axis=(-2, -1)) / np.linalg.norm(c64, axis=(-2, -1))
    # README, "float32 sums": error <= kappa * eps32 * (2 + 0.3 sqrt(K)), K batches added per rank,
    # kappa = |E[x x^T]|_F / |C|_F (cancellation when the covariance is formed), here from the float64 sums.
    kappa = np.linalg.norm(double.second_moment(centred=False), axis=(-2, -1)) / np.linalg.norm(c64, axis=(-2, -1))
    batches = 12 // 2
    bound = kappa * np.finfo(np.float32).eps * (2 + 0.3 * np.sqrt(batches))
    assert (error <= bound).all(), (error / bound).max()
    assert error.min() > 0, "float32 sums differ from float64 ones"


def test_long_sequences_stream_one_layer_at_a_time(tmp_path, minilm_l6, kjv):
    """n = 512 (minilm's maximum): each layer's scores are gone before the next layer arrives,
    and a job under a budget that forces head chunks and passes gives the in-memory moments."""
    blocks = kjv.blocks(minilm_l6, n=512, num_blocks=2, seed=0)
    rows = ModelRows(minilm_l6, blocks)
    sums = UnitSums(
        [(layer, head) for layer in (2, 5) for head in range(12)],
        n=512,
        num_heads=12,
        quantity="scores",
        queries=None,
        head_chunk=2,
    )
    seen: list[weakref.ref] = []

    def consume(layer, scores, valid, sequences):
        assert all(ref() is None for ref in seen), "an earlier layer's scores are still in memory"
        seen.append(weakref.ref(scores.untyped_storage()))
        sums.add(layer, scores, valid, np.zeros(len(sequences), dtype=np.int64))

    rows.for_each_batch(np.arange(2), [0, 1, 2, 3, 4, 5], consume, batch_size=1, progress=False)
    assert len(seen) == 12
    out = tmp_path / "long"
    result = run_moments(minilm_l6, out, seq_len=512, num_seqs=2, batch_size=1, layers=[5], max_memory="30MB", progress=False)
    plan = result.meta["run"]["plan"]
    assert plan["head_chunk"] < 12 and plan["passes"] > 1, plan
    assert_same_moments(result.halves, reference_moments(minilm_l6, blocks.ids, [5]), rtol=1e-10)


def test_plans_cover_every_unit_once_within_the_budget():
    rng = np.random.default_rng(0)
    for _ in range(200):
        layers, heads, world = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        cost = MomentsCost(
            n=int(rng.integers(4, 64)),
            queries=None,
            accumulate=str(rng.choice(["float32", "float64"])),
            batch_size=int(rng.integers(1, 8)),
        )
        units = [(layer, head) for layer in range(layers) for head in range(heads)]
        budget = int(cost.working_bytes(heads) + cost.unit_bytes * rng.integers(1, len(units) + 2))
        plan = plan_units(units, cost, budget=budget, world_size=world)
        covered = [unit for group in range(len(plan.bounds)) for unit in plan.group_units(group)]
        assert covered == units
        assert plan.max_group_units * cost.unit_bytes + plan.working_bytes <= budget
        assert world % plan.groups_per_pass == 0 and len(plan.bounds) == plan.passes * plan.groups_per_pass
        for pass_ in range(plan.passes):  # every group of a pass is taken by a team that splits all sequences
            for group in range(pass_ * plan.groups_per_pass, (pass_ + 1) * plan.groups_per_pass):
                team = plan.team(group)
                ranges = sorted(plan.sequences(rank, 37) for rank in team)
                assert all(plan.group_of(rank, pass_) == group for rank in team)
                assert ranges[0][0] == 0 and ranges[-1][1] == 37 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_bad_inputs_give_one_line(capsys, tmp_path, monkeypatch, two_rank_job, one_process_job):
    out = ["--out", str(tmp_path / "j")]
    assert_one_line_error(*run_cli(capsys, "moments", *JOB, *out, "--max-memory", "lots")[::2], "--max-memory 'lots'", "8GB")
    assert_one_line_error(
        *run_cli(capsys, "moments", *JOB, *out, "--max-memory", "10kB")[::2],
        "too small",
        "one (layer, head) unit needs",
        "--accumulate float32",
    )
    assert_one_line_error(*run_cli(capsys, "moments", *JOB, *out, "--accumulate", "float16")[::2], "--accumulate float16")
    assert_one_line_error(
        *run_cli(capsys, "moments", *JOB, "--out", str(two_rank_job), "--resume")[::2],
        "cannot resume",
        "world_size = 2, this run has 1",
    )
    assert_one_line_error(
        *run_cli(capsys, "moments", *JOB, "--out", str(tmp_path / "nothing"), "--resume")[::2], "nothing to resume"
    )
    # Partial files of different settings, and of different splits of the same setting.
    run_moments("minilm-l6", tmp_path / "w", quantity="weights", **JOB_SETTINGS)
    mixed = [
        str(one_process_job / "partials" / "pass000-rank00000.npz"),
        str(tmp_path / "w" / "partials" / "pass000-rank00000.npz"),
    ]
    assert_one_line_error(
        *run_cli(capsys, "merge", *mixed, "--out", str(tmp_path / "m"))[::2],
        "different settings",
        'quantity = "scores"',
        '"weights"',
    )
    twice = [str(one_process_job / "partials"), str(two_rank_job / "partials")]
    assert_one_line_error(*run_cli(capsys, "merge", *twice, "--out", str(tmp_path / "m"))[::2], "in more than one partial file")
    assert_one_line_error(
        *run_cli(capsys, "eigen", str(two_rank_job), "--quantity", "weights", *out)[::2], "are of scores, not weights"
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert_one_line_error(*run_cli(capsys, "reconstruct", "minilm-l6", *out)[::2], "runs in one process", "without torchrun")
