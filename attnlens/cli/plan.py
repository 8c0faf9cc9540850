"""``attnlens plan``: the cheapest attention, head by head, within a budget of accuracy or proxy loss."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from attnlens.analysis.plan import PlanSettings

from .app import (
    ANALYSIS,
    SOURCE,
    BatchSizeOption,
    BootstrapOption,
    CorpusOption,
    DeviceOption,
    FiguresOption,
    ModelArgument,
    ModelOption,
    ObjectiveOption,
    OutOption,
    OverwriteOption,
    PrecisionOption,
    ProgressOption,
    SeedOption,
    SeqLenOption,
    app,
    model_named,
    parse_float_list,
    parse_int_list,
    run_and_save,
    settings_from,
)
from .task_options import task_options

P = PlanSettings.defaults()  # the defaults live there


def _sizes(text: str, option: str) -> list[int]:
    """``--ks``/``--widths``: a comma-separated list, or ``none`` for no choice of that kind."""
    return [] if text.strip().lower() == "none" else parse_int_list(text, option)


def _blocks(name: str, help: str) -> typer.models.OptionInfo:
    return typer.Option(name, help=help, rich_help_panel=SOURCE)


@app.command()
@task_options(P, leave_out=("margin", "finetune_steps", "finetune_lr", "seeds"))
def plan(
    model: ModelArgument = None,
    max_drop: Annotated[
        str | None,
        typer.Option(
            "--max-drop",
            help="Budgets: the most task accuracy may drop, in points, e.g. 0.5,1,2 (needs --task).",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    max_loss: Annotated[
        str | None,
        typer.Option(
            "--max-loss",
            help="Budgets: the most the proxy loss may be (1 − cosine for encoders, next-token nats for decoders).",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    ks: Annotated[
        str, typer.Option("--ks", help="Exact keys per query a partial head may keep, or none.", rich_help_panel=ANALYSIS)
    ] = ",".join(map(str, P.ks)),
    widths: Annotated[
        str, typer.Option("--widths", help="Window widths a head may keep, or none.", rich_help_panel=ANALYSIS)
    ] = ",".join(map(str, P.widths)),
    cost: Annotated[
        str,
        typer.Option(
            "--cost",
            help="What a plan spends: flops (attention FLOPs), or seconds (measured per call on this machine at n, "
            "cached; windows run on FlexAttention where it is faster).",
            rich_help_panel=ANALYSIS,
        ),
    ] = P.cost,
    head_costs: Annotated[
        str,
        typer.Option(
            "--head-costs",
            help="How each head's cost under each choice is found: screen (with --max-drop: every head at once, from one "
            "forward and a backward pass per class: docs/plan.md), forwards (each head alone, a forward each), or auto "
            "(screen with --max-drop, forwards with --max-loss).",
            rich_help_panel=ANALYSIS,
        ),
    ] = P.head_costs,
    corpus: CorpusOption = P.corpus,
    seq_len: SeqLenOption = P.seq_len,
    fit_seqs: Annotated[int, _blocks("--fit-seqs", "Blocks to fit the partial maps on.")] = P.fit_seqs,
    curve_seqs: Annotated[int, _blocks("--curve-seqs", "Other blocks to measure each head's curve on.")] = P.curve_seqs,
    select_seqs: Annotated[int, _blocks("--select-seqs", "Other blocks to choose a loss budget's plan on.")] = P.select_seqs,
    eval_seqs: Annotated[int, _blocks("--eval-seqs", "Held-out blocks the plan is checked on.")] = P.eval_seqs,
    batch_size: BatchSizeOption = P.batch_size,
    seed: SeedOption = P.seed,
    objective: ObjectiveOption = P.objective,
    bootstrap: BootstrapOption = P.bootstrap,
    precision: PrecisionOption = P.precision,
    *,
    task_options: dict[str, Any],
    out: OutOption,
    model_option: ModelOption = None,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Per layer and head: exact, partial with its own k, or a window, at the fewest attention FLOPs (or
    seconds) within each budget; verified on the model, checked on held-out data beside uniform and random plans."""
    from attnlens.analysis.plan import plan as run

    named = model_named(model, model_option)
    settings = settings_from(
        PlanSettings,
        {**locals(), **task_options},
        max_drop=parse_float_list(max_drop, "--max-drop"),
        max_loss=parse_float_list(max_loss, "--max-loss"),
        ks=_sizes(ks, "--ks"),
        widths=_sizes(widths, "--widths"),
    )
    settings.budgets  # noqa: B018 -- no budget is bad input, before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(named, settings, device=device, progress=progress))
