"""``attnlens sinks``: each head's first-token weight (the attention sink) and its heavy hitters."""

from __future__ import annotations

from typing import Annotated

import typer

from attnlens.analysis.sinks import SinkSettings

from .app import (
    BatchSizeOption,
    BootstrapOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    ModelOption,
    NumSeqsOption,
    OutOption,
    OverwriteOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    SourceArgument,
    app,
    model_named,
    run_and_save,
    settings_from,
)


@app.command()
def sinks(
    source: SourceArgument = None,
    *,
    out: OutOption,
    model: ModelOption = None,
    corpus: CorpusOption = SinkSettings.corpus,
    seq_len: SeqLenOption = SinkSettings.seq_len,
    num_seqs: NumSeqsOption = SinkSettings.num_seqs,
    batch_size: BatchSizeOption = SinkSettings.batch_size,
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="A sink head's least mean weight on the first token (Gu et al.: 0.3).")
    ] = SinkSettings.epsilon,
    fraction: Annotated[
        float, typer.Option("--fraction", help="A weight below this share of its row's largest is negligible (H2O: 0.01).")
    ] = SinkSettings.fraction,
    top: Annotated[float, typer.Option("--top", help="The share of a row's keys that are its heavy hitters.")] = SinkSettings.top,
    min_keys: Annotated[
        int, typer.Option("--min-keys", help="The heavy hitters are read on rows of at least this many keys.")
    ] = SinkSettings.min_keys,
    far: Annotated[
        bool, typer.Option("--far", help="Keep each head alone to the first 4 keys and --window recent ones: a forward per head.")
    ] = SinkSettings.far,
    far_seqs: Annotated[
        int, typer.Option("--far-seqs", help="Blocks each head is kept so on, with --far.")
    ] = SinkSettings.far_seqs,
    far_max_seqs: Annotated[
        int,
        typer.Option("--far-max-seqs", help="A head not decided on --far-seqs blocks is measured on twice as many, up to this."),
    ] = SinkSettings.far_max_seqs,
    window: Annotated[int, typer.Option("--window", help="The recent keys a head keeps beside the first 4, with --far.")] = (
        SinkSettings.window
    ),
    bootstrap: BootstrapOption = SinkSettings.bootstrap,
    seed: SeedOption = SinkSettings.seed,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """The attention sink (each head's mean weight on the first token, Gu et al.'s sink heads), heavy hitters
    (the share of weights below 1% of their row's largest, H2O's; the mass a row's top keys hold) and, with --far,
    the heads that look far (each kept alone to the sink and a recent window)."""
    from attnlens.analysis.sinks import sinks as run

    source = model_named(source, model)
    settings = settings_from(SinkSettings, locals())  # checked before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(source, settings, device=device, progress=progress))
