"""``attnlens models`` and ``attnlens extract``."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import (
    BatchSizeOption,
    CorpusOption,
    DeviceOption,
    LayersOption,
    ModelArgument,
    ModelOption,
    NumSeqsOption,
    OutOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    app,
    model_named,
    parse_int_list,
)


@app.command()
def models() -> None:
    """List the model aliases and whether each is installed."""
    from attnlens.models.aliases import list_models
    from attnlens.models.cache import cache_dir

    rows = list_models()
    width = max(len(str(row["alias"])) for row in rows)
    for row in rows:
        state = "installed" if row["installed"] else f"not installed ({row['install']})"
        typer.echo(f"{row['alias']:<{width}}  {state}\n{'':<{width}}  {row['description']}")
    typer.echo(f"\nConverted models are cached in {cache_dir() / 'models'}")


@app.command()
def extract(
    model: ModelArgument = None,
    *,
    out: OutOption,
    model_option: ModelOption = None,
    corpus: CorpusOption = "kjv",
    seq_len: SeqLenOption = 128,
    num_seqs: NumSeqsOption = 256,
    batch_size: BatchSizeOption = 32,
    dtype: Annotated[str, typer.Option("--dtype", help="float16 or float32.")] = "float16",
    layers: LayersOption = None,
    weights: Annotated[bool, typer.Option("--weights", help="Also store post-softmax weights.")] = False,
    device: DeviceOption = "cpu",
    seed: SeedOption = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Finish an interrupted extraction in --out.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing store in --out.")] = False,
    progress: ProgressOption = True,
) -> None:
    """Capture pre-softmax attention scores of corpus blocks into a store."""
    from attnlens.io.extract import extract as run

    store = run(
        model_named(model, model_option),
        out,
        corpus=corpus,
        seq_len=seq_len,
        num_seqs=num_seqs,
        batch_size=batch_size,
        dtype=dtype,
        layers=parse_int_list(layers, "--layers"),
        weights=weights,
        device=device,
        seed=seed,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
    )
    if store is not None:  # rank 0 (the only one without torchrun)
        typer.echo(
            f"wrote {store.num_seqs} sequences x {len(store.layers)} layers x {store.num_heads} heads of {store.n}x{store.n} scores to {out}"
        )
