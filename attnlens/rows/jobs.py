"""Moments jobs: sharded over ranks and passes, checkpointed, resumable, combined exactly.

``attnlens moments SOURCE --out WORKDIR`` (:func:`run_moments`) computes the moments of
a store or of a model's rows over corpus blocks, in one process or in many started by
``torchrun``, and leaves::

    WORKDIR/job.json         settings and how the job is split (rank 0 writes it once; --resume checks it)
    WORKDIR/partials/        passPPP-rankRRRRR.npz: each rank's sums in each pass, replaced atomically
                             every --checkpoint-every batches (see attnlens.rows.partials)
    WORKDIR/moments/         the merged moments (a result of kind "moments"), written by rank 0 at the end

How the work is split (:mod:`attnlens.rows.budgets`): without ``--max-memory`` every rank
accumulates every (layer, head) unit over its own contiguous share of the sequences.
With it, the units are divided into groups that fit the budget; teams of ranks take a
group each, and passes over the data repeat until every group is done. Each rank
checkpoints its sums with the sequences it has finished, so a rank that dies loses only
the batches since its last checkpoint (its current batch, by default), and ``--resume``
continues every rank from its own file. At the end every rank's sums are reduced onto
rank 0 unit by unit (``torch.distributed.reduce``, in float64), which writes the merged
moments; ``attnlens merge WORKDIR/partials/*.npz`` gives the same sums from the files.

The split halves (for overlap's split-half check) are assigned over all sequences with
the job's seed, exactly as :func:`attnlens.rows.accumulate.compute_moments` does, so a job's
moments equal those of a single in-memory pass up to float64 summation order.

>>> import tempfile
>>> result = run_moments("minilm-l6", tempfile.mkdtemp() + "/job", seq_len=8, num_seqs=6, layers=[0],
...                      batch_size=4, progress=False)
>>> float(result.halves.total.count[0, 0, 0]), result.meta["run"]["world_size"]      # 6 blocks x 8 rows
(48.0, 1)
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from attnlens.data.corpus import Corpus, load_corpus
from attnlens.errors import BadFile, BadInput
from attnlens.io.files import write_json_atomic
from attnlens.io.provenance import provenance
from attnlens.io.ranks import World, init_world, local_gpus
from attnlens.io.results import check_resumable_out, write_result
from attnlens.io.store import Store, is_store
from attnlens.models.loading import LoadedModel, Placement
from attnlens.progress import progress_bar
from attnlens.rows.accumulate import UnitSums, accumulate_rows, check_rows_for_per_query
from attnlens.rows.budgets import ACCUMULATE, MomentsCost, Plan, format_bytes, format_option, parse_bytes, plan_units
from attnlens.rows.moments import ARRAYS, QUANTITIES, split_halves
from attnlens.rows.partials import (
    MergedWriter,
    MomentsResult,
    first_difference,
    load_partial,
    merged_meta,
    partial_name,
    remove_staging_leftovers,
    save_partial,
    values_at,
)
from attnlens.rows.sources import ModelRows, StoreRows, check_source_path, load_source_model, open_rows
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero, one_of

JOB_FILE = "job.json"
JOB_FORMAT = "attnlens-moments-job"
MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_moments(
    source: str | Path | Store | LoadedModel,
    out: str | Path,
    *,
    corpus: str | Path | Corpus = "kjv",
    seq_len: int = 128,
    num_seqs: int = 256,
    batch_size: int = 32,
    quantity: str = "scores",
    queries: list[int] | None = None,
    per_query: bool = False,
    layers: list[int] | None = None,
    seed: int = 0,
    device: str = "cpu",
    model_dtype: str = "float32",
    device_map: str | None = None,
    max_memory: str | int | None = None,
    accumulate: str = "float64",
    checkpoint_every: int = 1,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> MomentsResult | None:
    """Run (or, with ``resume``, finish) a moments job in ``out``; see the module docstring.

    ``source``, ``corpus``, ``seq_len``, ``num_seqs``, ``seed``, ``quantity``,
    ``queries``/``per_query`` and ``layers`` mean what they mean for :func:`attnlens.analysis.eigen`.
    ``model_dtype`` is the dtype of the model's weights (scores are accumulated in
    ``accumulate`` regardless), ``device_map="auto"`` spreads a large model over the
    GPUs, ``max_memory`` (``"8GB"``) bounds the sums each process holds. Returns the
    merged :class:`~attnlens.rows.partials.MomentsResult` on rank 0, ``None`` on other ranks.
    """
    out = Path(out)
    _check_options(batch_size, checkpoint_every, quantity, model_dtype, device_map)
    _check_sizes(seq_len, num_seqs, accumulate, layers, queries)
    budget = parse_bytes(max_memory) if isinstance(max_memory, str) else max_memory
    world = init_world(device, spread=device_map is not None)
    world.run_on_main(lambda: _check_out(out, resume=resume, overwrite=overwrite))  # before the slow part
    rows = _open_rows(
        source,
        world,
        corpus=corpus,
        seq_len=seq_len,
        num_seqs=num_seqs,
        seed=seed,
        device=device,
        model_dtype=model_dtype,
        device_map=device_map,
    )
    layers = rows.check_layers(layers)
    queries = _check_queries(rows.n, queries, per_query)
    check_rows_for_per_query(rows.num_seqs, rows.n, queries)
    cost = MomentsCost(
        rows.n,
        None if queries is None else tuple(queries),
        accumulate,
        batch_size,
        causal=bool(rows.model_info.get("causal", False)),
    )
    units = [(layer, head) for layer in layers for head in range(rows.num_heads)]
    plan = plan_units(units, cost, budget=budget, world_size=world.size, heads_per_layer=rows.num_heads)
    if budget is None:
        _check_fits(plan, world, rows.model.device if isinstance(rows, ModelRows) else torch.device(world.device(device)))
    settings = _settings(rows, quantity, layers, queries, seed, accumulate, model_dtype)
    run = {"batch_size": batch_size, "max_memory": budget, "world_size": world.size, "plan": plan.describe()}
    job = {"format": JOB_FORMAT, "format_version": 1, "settings": settings, "run": run, **provenance(command)}
    world.run_on_main(lambda: _prepare(out, job, resume=resume, overwrite=overwrite))
    (out / "partials").mkdir(parents=True, exist_ok=True)  # for ranks whose work directory is a local disk

    sums_device = rows.model.device if isinstance(rows, ModelRows) else torch.device(world.device(device))
    half = split_halves(rows.num_seqs, seed)
    start, stop = plan.sequences(world.rank, rows.num_seqs)
    label = "moments" if not world.distributed else f"moments rank 0/{world.size}"
    with progress_bar(total=plan.passes * (stop - start), desc=label, unit="seq", enabled=progress and world.is_main) as bar:
        for pass_ in range(plan.passes):
            _accumulate_pass(rows, world, plan, pass_, out, settings, run, half, sums_device, checkpoint_every, resume, bar)
    meta_extra = {
        "run": run,
        "distributed": world.describe(),
        "merged_by": "all-reduce" if world.distributed else "single process",
        # which corpus block each sequence is, and its half: enough to recompute any number
        "blocks": {"block_index": rows.block_index.tolist(), "half_of_block": half.tolist()},
    }
    return _combine(world, plan, cost, out, settings, meta_extra, sums_device, command)


# ---------------------------------------------------------------------- checks


def _check_options(batch_size: int, checkpoint_every: int, quantity: str, model_dtype: str, device_map: str | None) -> None:
    if batch_size < 1:
        raise BadInput(f"`batch_size` {batch_size} must be at least 1")
    if checkpoint_every < 1:
        raise BadInput(f"`checkpoint_every` {checkpoint_every} must be at least 1 (batches between checkpoints)")
    if quantity not in QUANTITIES:
        raise BadInput(f"`quantity` {quantity} is unknown; use one of {', '.join(QUANTITIES)}")
    if model_dtype not in MODEL_DTYPES:
        raise BadInput(f"`model_dtype` {model_dtype} is unknown; use one of {', '.join(MODEL_DTYPES)}")
    if device_map not in (None, "auto"):
        raise BadInput(f"`device_map` {device_map} is not supported; use `device_map` auto, or leave it out")


def _check_sizes(seq_len: int, num_seqs: int, accumulate: str, layers: list[int] | None, queries: list[int] | None) -> None:
    """The rest of the checks that need no model, so that bad input fails before it loads."""
    CorpusSettings(seq_len=seq_len)
    at_least("num_seqs", num_seqs, 1)
    one_of("accumulate", accumulate, ACCUMULATE)
    numbered_from_zero("layers", layers)
    numbered_from_zero("queries", queries, "query positions")


def _check_queries(n: int, queries: list[int] | None, per_query: bool) -> list[int] | None:
    if per_query and queries is None:
        return list(range(n))
    if queries is not None:
        bad = [q for q in queries if not 0 <= q < n]
        if bad:
            raise BadInput(f"`queries` {bad[0]} is out of range; query positions run from 0 to {n - 1}")
        return sorted(set(queries))
    return None


def _check_out(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse, before any work, an `out` that cannot take this job."""
    check_resumable_out(
        out, resume=resume, overwrite=overwrite, owned=lambda path: (path / JOB_FILE).is_file(), what="moments job"
    )


def device_memory(device: torch.device, world: World) -> int:
    """Memory one rank may count on: its GPU's, or this machine's RAM shared by its ranks."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // world.local_size


def _check_fits(plan: Plan, world: World, device: torch.device) -> None:
    """Without `max_memory`, refuse up front sums that cannot fit, rather than fail halfway."""
    available = device_memory(device, world)
    if plan.peak_bytes > available:
        raise BadInput(
            f"the moments need {format_bytes(plan.peak_bytes)} per process ({len(plan.units)} units of "
            f"{format_bytes(plan.unit_bytes)} plus working memory), more than the {format_bytes(available)} a rank has here; "
            f"give `max_memory` (e.g. {format_option(available // 2)}) to split the units into passes"
        )


def _prepare(out: Path, job: dict, *, resume: bool, overwrite: bool) -> None:
    """Rank 0: create the work directory, or check that the job to resume is this one."""
    _check_out(out, resume=resume, overwrite=overwrite)
    if resume:
        try:
            made = json.loads((out / JOB_FILE).read_text())
            parts = {part: made[part] for part in ("settings", "run")}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise BadFile(
                f"cannot resume {out}: its {JOB_FILE} is damaged ({type(error).__name__}); use `overwrite` to start the job again"
            ) from None
        for part, then_settings in parts.items():
            key = first_difference(then_settings, job[part])
            if key is not None:
                then, now = values_at(key, then_settings, job[part])
                raise BadInput(
                    f"cannot resume {out}: it was started with {key} = {then}, this run has {now}; rerun with the original "
                    "settings (and number of ranks), or use `overwrite` to start again"
                )
        remove_staging_leftovers(out, "moments")
        return
    if overwrite and out.exists():
        shutil.rmtree(out)
    (out / "partials").mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / JOB_FILE, job)


# ---------------------------------------------------------------------- source


def _open_rows(
    source: str | Path | Store | LoadedModel,
    world: World,
    *,
    corpus,
    seq_len: int,
    num_seqs: int,
    seed: int,
    device: str,
    model_dtype: str,
    device_map: str | None,
) -> StoreRows | ModelRows:
    """Rows of a store, or of a model loaded in ``model_dtype`` on this rank's device(s)."""
    if isinstance(source, (Store, LoadedModel)) or is_store(Path(str(source))):
        return open_rows(source, corpus=corpus, seq_len=seq_len, num_seqs=num_seqs, seed=seed, device=world.device(device))
    check_source_path(source, moments=False)  # a moments job reads rows: a store or a model
    placement: Placement = {}
    if device_map is not None:
        memory = None
        if world.local_size > 1 and torch.cuda.is_available():
            # Ranks sharing a machine each spread their copy of the model over their own GPUs.
            memory = {gpu: torch.cuda.mem_get_info(gpu)[0] for gpu in local_gpus(world.local_rank, world.local_size)}
        placement = {"device_map": device_map, "device_memory": memory}
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)  # before the model: a bad corpus fails fast
    model = load_source_model(source, moments=False, device=world.device(device), dtype=MODEL_DTYPES[model_dtype], **placement)
    return open_rows(model, corpus=corpus, seq_len=seq_len, num_seqs=num_seqs, seed=seed)


def _settings(
    rows: StoreRows | ModelRows,
    quantity: str,
    layers: list[int],
    queries: list[int] | None,
    seed: int,
    accumulate: str,
    model_dtype: str,
) -> dict:
    """What the numbers mean: partial files merge, and a job resumes, only with equal settings."""
    tokens = np.ascontiguousarray(rows.tokens(np.arange(rows.num_seqs)), dtype=np.int64)
    return {
        "quantity": quantity,
        "n": rows.n,
        "layers": list(layers),
        "num_heads": rows.num_heads,
        "queries": queries,
        "seed": seed,
        "num_seqs": rows.num_seqs,
        "accumulate": accumulate,
        "model_dtype": model_dtype,
        "tokens_sha256": hashlib.sha256(tokens.tobytes()).hexdigest(),
        "model": rows.model_info,
        "corpus": {key: value for key, value in rows.corpus_info.items() if key != "store"},
    }


# ---------------------------------------------------------------------- accumulation


def _accumulate_pass(
    rows: StoreRows | ModelRows,
    world: World,
    plan: Plan,
    pass_: int,
    out: Path,
    settings: dict,
    run: dict,
    half: np.ndarray,
    device: torch.device,
    checkpoint_every: int,
    resume: bool,
    bar,
) -> None:
    """This rank's share of one pass: its unit group over its sequences, from its last checkpoint on.

    Checkpoints are read only when resuming: a work directory on a rank's own disk may
    hold files of an earlier job that rank 0 could not clear."""
    group = plan.group_of(world.rank, pass_)
    units = plan.group_units(group)
    start, stop = plan.sequences(world.rank, rows.num_seqs)
    path = out / "partials" / partial_name(pass_, world.rank)
    meta = {
        "settings": settings,
        "run": run,
        "rank": world.rank,
        "pass": pass_,
        "group": group,
        "world_size": world.size,
        "units": [list(unit) for unit in units],
        "sequences": [start, stop],
    }
    sums = UnitSums(
        units,
        n=rows.n,
        num_heads=rows.num_heads,
        quantity=settings["quantity"],
        queries=settings["queries"],
        accumulate=settings["accumulate"],
        device=device,
        head_chunk=plan.head_chunk,
    )
    done = _restore(path, meta, sums) if resume and path.is_file() else 0
    bar.update(done)
    if done == stop - start:
        if done == 0:  # an empty share still leaves a (finished) partial file
            save_partial(path, {**meta, "done": 0}, sums.state())
        return
    batches = 0

    def checkpoint(chunk: np.ndarray) -> None:
        nonlocal done, batches
        done, batches = done + len(chunk), batches + 1
        if batches % checkpoint_every == 0 or done == stop - start:
            save_partial(path, {**meta, "done": done}, sums.state())
        bar.update(len(chunk))

    accumulate_rows(rows, sums, np.arange(start + done, stop), half, batch_size=run["batch_size"], after_batch=checkpoint)


def _restore(path: Path, meta: dict, sums: UnitSums) -> int:
    """Load a rank's checkpoint; returns how many of its sequences it had finished."""
    saved, arrays = load_partial(path)
    for key in ("settings", "run", "rank", "pass", "units", "sequences"):
        if saved.get(key) != meta[key]:
            raise BadFile(
                f"partial file {path} does not belong to this job (its {key} differs); use `overwrite` to start the job again"
            )
    try:
        sums.load_state(arrays)
        return int(saved["done"])
    except (BadFile, KeyError, TypeError, ValueError) as error:
        detail = f"no {error}" if isinstance(error, KeyError) else str(error)
        raise BadFile(f"partial file {path} is damaged ({detail}); use `overwrite` to start the job again") from None


# ---------------------------------------------------------------------- combination


def _combine(
    world: World,
    plan: Plan,
    cost: MomentsCost,
    out: Path,
    settings: dict,
    meta_extra: dict,
    device: torch.device,
    command: str | None,
) -> MomentsResult | None:
    """Reduce every rank's finished sums onto rank 0, unit chunk by unit chunk, in float64;
    rank 0 writes them into the merged moments result."""
    reduce_device = device if world.backend == "nccl" else torch.device("cpu")
    chunk_units = max(1, plan.working_bytes // cost.unit_bytes_as(8))
    shapes = _chunk_shapes(settings)

    def reduce_all(writer: MergedWriter | None) -> None:
        for pass_ in range(plan.passes):
            mine = plan.group_of(world.rank, pass_)
            arrays = load_partial(out / "partials" / partial_name(pass_, world.rank))[1]
            for group in range(pass_ * plan.groups_per_pass, (pass_ + 1) * plan.groups_per_pass):
                units = plan.group_units(group)
                for low in range(0, len(units), chunk_units):
                    high = min(low + chunk_units, len(units))
                    # One float64 buffer per chunk; a rank that holds other units adds zeros.
                    buffer = torch.zeros(
                        sum(int(np.prod((2, high - low, *shape))) for shape in shapes.values()),
                        dtype=torch.float64,
                        device=reduce_device,
                    )
                    if group == mine:
                        _pack(buffer, arrays, low, high, shapes)
                    world.reduce_to_main(buffer)
                    if writer is not None:
                        writer.write_units(units[low:high], _unpack(buffer.cpu().numpy(), high - low, shapes))
            del arrays

    if not world.is_main:
        reduce_all(None)
        world.barrier()  # leave together: a rank that tears gloo down while rank 0 still writes can abort at exit
        return None

    def fill(directory: Path) -> None:
        writer = MergedWriter(directory, settings["layers"], settings["num_heads"], _query_units(settings), settings["n"])
        reduce_all(writer)
        writer.close()

    parts = [_plan_record(plan, rank, pass_, settings["num_seqs"]) for pass_ in range(plan.passes) for rank in range(world.size)]
    write_result(out / "moments", "moments", merged_meta(settings, parts, meta_extra, command), overwrite=True, extra=fill)
    world.barrier()
    return MomentsResult.load(out / "moments")


def _query_units(settings: dict) -> int:
    return 1 if settings["queries"] is None else len(settings["queries"])


def _chunk_shapes(settings: dict) -> dict[str, tuple[int, ...]]:
    """Shape of each sum per (half, unit), after those two axes."""
    q, n = _query_units(settings), settings["n"]
    return {"count": (q,), "key_count": (q, n), "sum": (q, n), "sum_outer": (q, n, n)}


def _pack(buffer: torch.Tensor, arrays: dict[str, np.ndarray], low: int, high: int, shapes: dict[str, tuple[int, ...]]) -> None:
    """Copy units ``low:high`` of each sum into ``buffer`` (widening float32), without temporaries."""
    offset = 0
    for name in ARRAYS:
        size = int(np.prod((2, high - low, *shapes[name])))
        buffer[offset : offset + size].view(2, high - low, *shapes[name]).copy_(torch.from_numpy(arrays[name][:, low:high]))
        offset += size


def _unpack(flat: np.ndarray, units: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    arrays, offset = {}, 0
    for name in ARRAYS:
        size = int(np.prod((2, units, *shapes[name])))
        arrays[name] = flat[offset : offset + size].reshape(2, units, *shapes[name])
        offset += size
    return arrays


def _plan_record(plan: Plan, rank: int, pass_: int, num_seqs: int) -> dict:
    group = plan.group_of(rank, pass_)
    units = plan.group_units(group)
    return {
        "rank": rank,
        "pass": pass_,
        "group": group,
        "sequences": list(plan.sequences(rank, num_seqs)),
        "units": f"L{units[0][0]}H{units[0][1]}-L{units[-1][0]}H{units[-1][1]}",
        "world_size": plan.world_size,
    }


def summary(result: MomentsResult) -> str:
    """One paragraph for the command line: what was computed, how it was split, where it went."""
    s, run = result.settings, result.meta["run"]
    plan = run["plan"]
    budget = f" (budget {format_bytes(run['max_memory'])})" if run["max_memory"] else ""
    rows = "pooled rows" if s["queries"] is None else f"{len(s['queries'])} query positions"
    return (
        f"moments of {s['num_seqs']} sequences x {len(s['layers'])} layers x {s['num_heads']} heads, n = {s['n']}, "
        f"{s['quantity']}, {rows}, {s['accumulate']} sums\n"
        f"{run['world_size']} rank(s), {plan['passes']} pass(es) of {plan['groups_per_pass']} unit group(s); "
        f"sums per rank at most {format_bytes(plan['max_group_units'] * plan['unit_bytes'])} plus "
        f"{format_bytes(plan['working_bytes'])} working memory{budget}"
    )
