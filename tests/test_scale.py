"""Scaling out: real multi-process jobs (torchrun, gloo, 2 ranks on localhost) against one process.

Every multi-rank job here is a real ``torchrun --nproc-per-node 2`` launch of the
command line; references are computed in this process, by brute force (every layer
captured whole, summed by numpy: ``tiny_models.reference_moments``) or by a
single-process run, never copied from the code under test. Forward passes in other batch
compositions, processes or thread counts round differently (``FORWARD_ROUNDING``); comparisons
across them allow for that, comparisons of the same float32 rows stay exact or at float64 rounding.
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
import torch

import attnlens
from attnlens.models.capture import Capture
from attnlens.rows.accumulate import UnitSums, compute_moments
from attnlens.rows.budgets import MomentsCost, parse_bytes, plan_units
from attnlens.rows.jobs import run_moments
from attnlens.rows.moments import ARRAYS, LEVELS, HalfMoments, Moments, split_halves
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


# ---------------------------------------------------------------------- float32 rounding of forward passes

U32 = 2.0**-24  # unit roundoff of float32
# Forward passes of the same blocks in another batch composition, process or thread count run other GEMM kernels and
# reduction orders (BLAS picks them by shape and thread count), so their float32 scores differ by rounding. A score of
# minilm-l6 ends a chain of at most ~40 float32 products (per layer: the q, k, v projections, q·kᵀ, weights·v, the
# output projection and the two feed-forward products, inner dimensions K <= 1536). Each adds a relative error of about
# sqrt(K)·u <= 40u of the magnitudes it multiplies (the probabilistic bound of Higham & Mary, 2019), and LayerNorm
# keeps those magnitudes in scale: one forward is within ~40 x 40u = 1600u of exact, two forwards within twice that.
# Hence C = 2**12, applied below to the rows' own magnitudes. Measured against other MKL code paths (MKL_CBWR=COMPATIBLE)
# and float64 forwards, the sums here move by at most 1/30 of the bounds below (n = 512) and 1/250 (n = 16).
FORWARD_ROUNDING = 2**12 * U32


def rounding_bounds(moments: Moments) -> dict[str, np.ndarray]:
    """Bounds on how far ``sum`` and ``sum_outer`` move when the same rows come from other float32 forwards.

    With |Δx| <= FORWARD_ROUNDING·|x| per entry, |ΔΣx_j| <= FORWARD_ROUNDING·Σ|x_j|, and since
    Δ(x_i x_j) = Δx_i·x_j + x_i·Δx_j (+ a negligible second-order term), |ΔΣx_i x_j| <= 2·FORWARD_ROUNDING·Σ|x_i||x_j|.
    Both magnitudes are bounded from the float64 sums by Cauchy–Schwarz: Σ|x_j| <= sqrt(rows_j·Σx_j²) and
    Σ|x_i||x_j| <= sqrt(Σx_i²·Σx_j²).
    """
    squares = np.diagonal(np.asarray(moments.sum_outer), axis1=-2, axis2=-1)  # Σx_j²
    return {
        "sum": FORWARD_ROUNDING * np.sqrt(moments.key_count * squares),
        "sum_outer": 2 * FORWARD_ROUNDING * np.sqrt(squares[..., :, None] * squares[..., None, :]),
    }


def assert_same_moments_up_to_rounding(got: HalfMoments, expected: HalfMoments) -> None:
    """Moments of the same rows from forwards that may round differently: the same rows enter (counts equal
    exactly: which rows enter never depends on the scores), and the sums agree within :func:`rounding_bounds`.
    A dropped or doubled batch of the job changes the counts, and moves the sums by more than 10³ times the bound.
    """
    for half in ("a", "b"):
        x, y = getattr(got, half), getattr(expected, half)
        for name in ("count", "key_count"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=f"{half}.{name}")
        for name, bound in rounding_bounds(y).items():
            difference = np.abs(np.asarray(getattr(x, name)) - getattr(y, name))
            assert (difference <= bound).all(), f"{half}.{name}: {(difference / np.maximum(bound, 1e-300)).max():.3g} x the bound"


def eigenvalue_tolerance(moments: Moments, level: str) -> np.ndarray:
    """(L, H, Q) bound on Σ_k |Δλ_k|, how far the covariance eigenvalues of ``level`` move in all when the rows X
    (R of them, centred Y) move by ΔX with ‖ΔX‖_F <= FORWARD_ROUNDING·‖X‖_F (as |Δx| <= FORWARD_ROUNDING·|x| per entry).

    C = YᵀY/(R - 1) moves by (ΔXᵀY + YᵀΔX + ΔYᵀΔY)/(R - 1) (the mean's change drops out, as Σ Y = 0), whose nuclear
    norm is at most (2‖ΔX‖_F‖Y‖_F + ‖ΔX‖_F²)/(R - 1) (Hölder), and Σ_k |Δλ_k| <= ‖ΔC‖_* (Lidskii). float64
    rounding of C and of eigh (~1e-16 ‖C‖) is far below it."""
    pool = lambda array: np.asarray(array).sum(axis={"head": (), "layer": (1,), "model": (0, 1)}[level], keepdims=True)
    rows, sums = pool(moments.count), pool(moments.sum)
    squares = np.trace(pool(moments.sum_outer), axis1=-2, axis2=-1)  # ‖X‖_F²
    centred = squares - (sums**2).sum(-1) / rows  # ‖Y‖_F²
    moved = FORWARD_ROUNDING * np.sqrt(squares)  # >= ‖ΔX‖_F
    return (2 * moved * np.sqrt(centred) + moved**2) / (rows - 1)


def k90_range(eigenvalues: np.ndarray, tolerance: np.ndarray, energy: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest k90 of eigenvalues within Σ_k |Δλ_k| <= ``tolerance`` (..., 1) of these: the energy
    fractions F_k = S_k/T move by |ΔF_k| <= (|ΔS_k| + F_k|ΔT|)/(T - |ΔT|) <= 2ε/(T - ε) (clipping at 0 only shrinks
    Δλ), and k90 is the first k with F_k >= energy - 1e-12 (components_for_energy)."""
    values = np.clip(eigenvalues, 0, None)
    total = values.sum(-1, keepdims=True)
    band, fractions, threshold = 2 * tolerance / (total - tolerance), np.cumsum(values, -1) / total, energy - 1e-12
    return (fractions < threshold - band).sum(-1) + 1, (fractions < threshold + band).sum(-1) + 1


class CapturedRows:
    """A row source with ModelRows' batches, cut from the scores of one forward pass of all blocks in this process:
    the forward pass :func:`tiny_models.reference_moments` makes (same blocks, one batch), so accumulator and
    reference sum the same float32 rows and differ only by float64 summation order."""

    def __init__(self, model, blocks, layers: list[int]) -> None:
        with torch.no_grad(), Capture(layers) as capture:
            model.run_attention(torch.as_tensor(np.asarray(blocks.ids)))
        self.scores, self.valid = capture.scores, capture.valid
        self.n, self.num_heads, self.num_seqs = blocks.n, model.num_heads, len(blocks)

    def check_layers(self, layers):
        return sorted(self.scores) if layers is None else sorted(set(layers))

    def for_each_batch(self, sequences, layers, consume, *, batch_size: int, **_) -> None:
        sequences = np.sort(np.asarray(sequences))
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start : start + batch_size]
            for layer in layers:
                consume(layer, self.scores[layer][chunk], self.valid[layer][chunk], chunk)


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
    # Independent reference: numpy's sums of the same blocks' captured scores (one forward of all 12 blocks).
    reference = reference_moments(minilm_l6, kjv.blocks(minilm_l6, n=16, num_blocks=12, seed=0).ids, [0, 3], seed=0)
    # Ranks run one thread each (torchrun's default), this process its own count, the reference one batch of 12.
    assert_same_moments_up_to_rounding(two.halves, one.halves)
    assert_same_moments_up_to_rounding(two.halves, reference)
    assert two.meta["distributed"]["world_size"] == 2 and two.meta["distributed"]["backend"] == "gloo"
    assert [part["sequences"] for part in two.meta["partials"]] == [[0, 6], [6, 12]]
    # eigen reads the job directory; same spectra as eigen straight from the model (its own forward passes),
    # within what the rounding of the sums can move an eigenvalue, and the same k90 wherever that cannot change it.
    from_job = attnlens.eigen(two_rank_job, keep=4, progress=False)
    direct = attnlens.eigen("minilm-l6", seq_len=16, num_seqs=12, layers=[0, 3], keep=4, progress=False)
    low, high = [], []
    for level in LEVELS:
        tolerance = eigenvalue_tolerance(reference.total, level)
        got, expected = from_job.arrays[f"{level}_eigenvalues"], direct.arrays[f"{level}_eigenvalues"]
        moved = np.abs(got - expected).sum(-1)
        assert (moved <= tolerance).all(), (level, (moved / tolerance).max())
        for bounds, k90 in zip((low, high), k90_range(expected, tolerance[..., None])):
            bounds.append(k90.ravel())  # in the table's order: levels, then units in index order
    assert (from_job.table.level.to_numpy() == direct.table.level.to_numpy()).all()
    k90, low, high = from_job.table.k90.to_numpy(), np.concatenate(low), np.concatenate(high)
    assert ((low <= k90) & (k90 <= high)).all(), (k90, low, high)  # low == high: the direct k90, exactly
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
    # Each rank continues with the same batches from its checkpoint, with the same thread count (both jobs are
    # torchrun ranks): the same float32 rows, added in the same order, so the same sums bit for bit.
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
    # Every rank of both jobs runs batches of sequences (0, 1), (2, 3), ... with torchrun's thread count, so the
    # float32 rows are the same bit for bit; only the float64 sums are grouped differently (one rank over all
    # sequences, or two ranks reduced), hence 1e-9.
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
    # torchrun stops rank 0 when rank 1 dies; on a busy machine rank 0 may not have finished either.
    with pytest.raises(attnlens.AttnlensError, match=r"unfinished \((rank 0: \d of 5 sequences; )?rank 1: 2 of 5 sequences\)"):
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
        # Ranks run one thread each, rank 1 on batches (5, 6), (7, 8), (9); this process its own thread count on (4, 5),
        # (6, 7), (8, 9): float32 rounding, FORWARD_ROUNDING of the magnitudes involved, here each row's largest score.
        got, expected = np.asarray(sharded.scores(layer), dtype=np.float64), np.asarray(single.scores(layer), dtype=np.float64)
        bound = FORWARD_ROUNDING * np.abs(expected).max(-1, keepdims=True)
        assert (np.abs(got - expected) <= bound).all(), (np.abs(got - expected) / bound).max()
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
    against numpy's sums of the captured rows.

    Both are fed the reference's own float32 rows (CapturedRows): the point is the accumulator, and forwards in
    batches of 7 or 4 would round differently from the reference's one batch of 20 (see FORWARD_ROUNDING)."""
    blocks = kjv.blocks(minilm_l6, n=16, num_blocks=20, seed=1)
    rows = CapturedRows(minilm_l6, blocks, [1, 4])
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
    rows = CapturedRows(model, blocks, [0, 1])  # the reference's own rows, as in the test above
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


@pytest.mark.integration  # runs a real model by name
def test_float32_sums_stay_within_the_documented_bound(tmp_path, one_process_job):
    out = tmp_path / "f32"
    run_moments("minilm-l6", out, accumulate="float32", **JOB_SETTINGS)
    single, double = load_moments(out).halves.total, load_moments(one_process_job).halves.total
    assert load_partial(out / "partials" / "pass000-rank00000.npz")[1]["sum_outer"].dtype == np.float32
    c32, c64 = single.second_moment(), double.second_moment()
    error = np.linalg.norm(c32 - c64, axis=(-2, -1)) / np.linalg.norm(c64, axis=(-2, -1))
    # docs/scaling.md, "float32 sums": error <= kappa * eps32 * (2 + 0.3 sqrt(K)), K batches added per rank,
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
    # The job's forward passes take one block at a time, the reference's both at once: float32 rounding.
    assert_same_moments_up_to_rounding(result.halves, reference_moments(minilm_l6, blocks.ids, [5]))


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
