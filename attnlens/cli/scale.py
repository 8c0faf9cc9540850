"""``attnlens moments`` (sharded, resumable moments jobs) and ``attnlens merge``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    LayersOption,
    ModelOption,
    NumSeqsOption,
    OverwriteOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    SourceArgument,
    app,
    model_named,
    parse_int_list,
)


@app.command()
def moments(
    source: SourceArgument = None,
    *,
    out: Annotated[Path, typer.Option("--out", "-o", help="Work directory of the job (job.json, partials/, moments/).")],
    model: ModelOption = None,
    corpus: CorpusOption = "kjv",
    seq_len: SeqLenOption = 128,
    num_seqs: NumSeqsOption = 256,
    batch_size: BatchSizeOption = 32,
    quantity: Annotated[str, typer.Option("--quantity", help="scores, weights or log-weights.")] = "scores",
    per_query: Annotated[bool, typer.Option("--per-query", help="Moments of every query position separately.")] = False,
    queries: Annotated[
        str | None, typer.Option("--queries", help="Comma-separated query positions (implies --per-query).")
    ] = None,
    layers: LayersOption = None,
    seed: SeedOption = 0,
    device: DeviceOption = "cpu",
    model_dtype: Annotated[
        str, typer.Option("--model-dtype", help="Weights: float32, bfloat16 or float16 (sums stay float64).")
    ] = "float32",
    device_map: Annotated[
        str | None, typer.Option("--device-map", help="auto: spread a model too large for one GPU over several.")
    ] = None,
    max_memory: Annotated[
        str | None,
        typer.Option("--max-memory", help="Most memory for sums per process, e.g. 8GB; heads are split into passes to fit."),
    ] = None,
    accumulate: Annotated[
        str, typer.Option("--accumulate", help="float64, or float32 (half the memory; the error: docs/scaling.md, float32 sums).")
    ] = "float64",
    checkpoint_every: Annotated[
        int, typer.Option("--checkpoint-every", help="Batches between checkpoints of each rank's sums.")
    ] = 1,
    resume: Annotated[bool, typer.Option("--resume", help="Finish an interrupted job in --out.")] = False,
    overwrite: OverwriteOption = False,
    progress: ProgressOption = True,
) -> None:
    """Moments of attention rows, sharded over torchrun ranks and checkpointed; eigen reads the result."""
    from attnlens.rows.jobs import run_moments, summary

    result = run_moments(
        model_named(source, model, None, what="SOURCE"),  # a model, or a store as SOURCE
        out,
        corpus=corpus,
        seq_len=seq_len,
        num_seqs=num_seqs,
        batch_size=batch_size,
        quantity=quantity,
        queries=parse_int_list(queries, "--queries"),
        per_query=per_query,
        layers=parse_int_list(layers, "--layers"),
        seed=seed,
        device=device,
        model_dtype=model_dtype,
        device_map=device_map,
        max_memory=max_memory,
        accumulate=accumulate,
        checkpoint_every=checkpoint_every,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
    )
    if result is not None:  # rank 0
        typer.echo(summary(result))
        typer.echo(f"wrote merged moments to {out / 'moments'}; analyse them with: attnlens eigen {out} --out DIR")


@app.command()
def merge(
    partials: Annotated[
        list[Path], typer.Argument(help="Partial files (.npz), or job directories / partials/ folders holding them.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the merged moments to.")],
    overwrite: OverwriteOption = False,
    progress: ProgressOption = True,
) -> None:
    """Add the partial moment files of a job's ranks and passes into one moments result."""
    from attnlens.rows.partials import merge_partials

    files = [file for path in partials for file in _partial_files(path)]
    result = merge_partials(files, out, overwrite=overwrite, progress=progress)
    settings = result.settings
    typer.echo(
        f"merged {len(files)} partial files: {settings['num_seqs']} sequences x {len(settings['layers'])} layers x "
        f"{settings['num_heads']} heads, n = {settings['n']}"
    )
    typer.echo(f"wrote merged moments to {out}; analyse them with: attnlens eigen {out} --out DIR")


def _partial_files(path: Path) -> list[Path]:
    from attnlens.errors import BadFile

    if path.is_dir():
        folder = path / "partials" if (path / "partials").is_dir() else path
        files = sorted(folder.glob("*.npz"))
        if not files:
            raise BadFile(f"no partial files (*.npz) in {folder}; give a moments job's directory or its partial files")
        return files
    if not path.is_file():
        raise BadFile(f"partial file {path} does not exist")
    return [path]
