"""``attnlens dam``: learned sparse attention masks, against fixed patterns."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from attnlens.analysis.dam import DEFAULT_SPARSITY, LAYOUTS, DamSettings

from .app import (
    LIVE_HELP,
    MASK,
    SOURCE,
    STOPPING,
    TASK,
    TRAINING,
    BatchSizeOption,
    BootstrapOption,
    ClassesOption,
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
    run_and_save,
    settings_from,
)
from .task_options import task_options

D = DamSettings.defaults()  # the defaults live there
LIVE_HELP[("dam", "variant")] = lambda: (
    "How logits map onto positions: " + "; ".join(f"{name}: {layout.summary}" for name, layout in LAYOUTS.items())
)


def _option(name: str, help: str, panel: str, **kwargs) -> typer.models.OptionInfo:
    return typer.Option(name, help=help, rich_help_panel=panel, **kwargs)


DualStartOption = Annotated[
    float | None,
    _option(
        "--dual-start",
        "λ a --sparsity run starts from; default 0.1, or with --init or a held mask where the first batches' gradients balance.",
        TRAINING,
    ),
]
DualOption = Annotated[
    str,
    _option(
        "--dual",
        "How a --sparsity run meets its target: ascent (dual ascent on λ), hold (the mask held at a density brought "
        "down to the target) or auto (hold with --train-weights).",
        TRAINING,
    ),
]
MaskSeedsOption = Annotated[
    int,
    _option(
        "--mask-seeds",
        "Masks per target, seeds --seed, --seed + 1, ...: each its own Gumbel noise and batch order, the same blocks.",
        MASK,
    ),
]
ReferenceOption = Annotated[
    str | None,
    _option(
        "--reference",
        "A swap search beside each mask at its sparsity, on the training blocks, from the mask (dam) or the band "
        "(band); layouts of few logits only.",
        MASK,
    ),
]
TrainWeightsOption = Annotated[
    bool,
    _option(
        "--train-weights",
        "Also fine-tune the model's weights; band, local and bigbird at matched sparsity get the same weight training.",
        TRAINING,
    ),
]
TaskPatternsOption = Annotated[
    str,
    typer.Option(
        "--task-patterns",
        help="Patterns the task judges (each a forward of every held-out example): all; compared (best of the mask's "
        "family and best overall at matched sparsity); adapted (band, local, bigbird). With --train-weights: the "
        "adapted ones, each judged with the weights it trained.",
        rich_help_panel=TASK,
    ),
]
TrainOnOption = Annotated[
    str,
    typer.Option(
        "--train-on",
        help="What the masks learn from: objective (the corpus), task (its classifier's loss on its training examples; "
        "with --train-weights, SparseBERT's protocol), or auto (the task where its examples fill n tokens).",
        rich_help_panel=TASK,
    ),
]


SparsityOption = Annotated[
    str | None,
    _option(
        "--sparsity",
        "Comma-separated target sparsities in (0, 1): λ found by dual ascent; default "
        + ",".join(map(str, DEFAULT_SPARSITY))
        + ".",
        MASK,
    ),
]

LambdasOption = Annotated[
    str | None,
    _option(
        "--lambdas", "Comma-separated sparsity weights λ >= 0 (loss units per unit of density), instead of --sparsity.", MASK
    ),
]

RemovalOption = Annotated[
    str,
    _option(
        "--removal",
        "renormalise (zero removed weights, renormalise the rest), 1e4 (add -10^4 to removed scores) or inf.",
        MASK,
    ),
]

InitOption = Annotated[
    str | None, _option("--init", "Start the logits at a fixed pattern, e.g. local(6), band(4), bigbird(3).", MASK)
]

TrainObjectiveOption = Annotated[
    str | None,
    _option(
        "--train-objective",
        "What the masks learn from, if not --objective (which judges them): e.g. hidden, cheaper than clm on a large vocabulary.",
        TRAINING,
    ),
]

StepsOption = Annotated[
    int, _option("--steps", "Most training steps (one batch each) per run; fewer when the stopping rule holds.", TRAINING)
]

LrEndOption = Annotated[
    float, _option("--lr-end", "Learning rate at the step cap, as a fraction of --lr (cosine schedule).", TRAINING)
]

NoiseEndOption = Annotated[
    float, _option("--noise-end", "Scale of the Gumbel noise at the step cap (cosine schedule from 1).", TRAINING)
]

TauOption = Annotated[str, _option("--tau", "Gumbel-sigmoid temperature: fixed (1.0) or annealed start:end (2:0.2).", TRAINING)]

WeightsLrOption = Annotated[float, _option("--weights-lr", "Learning rate of the weights with --train-weights.", TRAINING)]

StopWindowOption = Annotated[int, _option("--stop-window", "Steps over which the mask must stop changing.", STOPPING)]

StopFlipsOption = Annotated[
    float, _option("--stop-flips", "Most fraction of hard-mask positions flipped in the window.", STOPPING)
]

StopPlateauOption = Annotated[
    float, _option("--stop-plateau", "Most relative change of the objective across the window.", STOPPING)
]

StopMarginOption = Annotated[
    float, _option("--stop-margin", "A decision changes when its logit crosses 0 by more than this.", STOPPING)
]

CheckWindowOption = Annotated[
    int, _option("--check-window", "Converged: the judged mask did not improve over this many steps ...", STOPPING)
]

CheckLrOption = Annotated[
    float, _option("--check-lr", "... while the learning rate was at least this fraction of --lr.", STOPPING)
]

ReferenceRoundsOption = Annotated[
    int, _option("--reference-rounds", "Most rounds of the swap search (one swap kept per round).", MASK)
]

ResampleOption = Annotated[
    bool,
    _option(
        "--resample/--no-resample",
        "Each mask seed after the first trains on its own draw of training blocks (the held-out blocks stay).",
        MASK,
    ),
]

PolishRoundsOption = Annotated[
    int,
    _option(
        "--polish-rounds",
        "Most rounds of the swap search that finishes each --sparsity mask at its target (layouts of few logits); "
        "0: the relaxation's mask as it is.",
        MASK,
    ),
]


@app.command()
@task_options(D)
def dam(
    model: ModelArgument = None,
    corpus: CorpusOption = D.corpus,
    seq_len: SeqLenOption = D.seq_len,
    train_seqs: Annotated[int, _option("--train-seqs", "Blocks to train the masks on.", SOURCE)] = D.train_seqs,
    eval_seqs: Annotated[int, _option("--eval-seqs", "Held-out blocks to judge them on.", SOURCE)] = D.eval_seqs,
    batch_size: BatchSizeOption = D.batch_size,
    seed: SeedOption = D.seed,
    variant: Annotated[str, _option("--variant", "How logits map onto positions (the registered layouts).", MASK)] = D.variant,
    sparsity: SparsityOption = None,
    lambdas: LambdasOption = None,
    removal: RemovalOption = D.removal,
    classes: ClassesOption = None,
    init: InitOption = D.init,
    init_keep: Annotated[float, _option("--init-keep", "Initial keep probability of every position.", MASK)] = D.init_keep,
    patterns: Annotated[bool, _option("--patterns/--no-patterns", "Also judge the fixed sparse patterns.", MASK)] = D.patterns,
    objective: ObjectiveOption = D.objective,
    train_objective: TrainObjectiveOption = D.train_objective,
    steps: StepsOption = D.steps,
    lr: Annotated[float, _option("--lr", "Adam learning rate of the mask logits.", TRAINING)] = D.lr,
    lr_end: LrEndOption = D.lr_end,
    noise_end: NoiseEndOption = D.noise_end,
    tau: TauOption = str(D.tau),
    dual_lr: Annotated[float, _option("--dual-lr", "Step of the dual ascent on λ with --sparsity.", TRAINING)] = D.dual_lr,
    dual_start: DualStartOption = D.dual_start,
    dual: DualOption = D.dual,
    train_weights: TrainWeightsOption = D.train_weights,
    weights_lr: WeightsLrOption = D.weights_lr,
    stop_window: StopWindowOption = D.stop_window,
    stop_flips: StopFlipsOption = D.stop_flips,
    stop_plateau: StopPlateauOption = D.stop_plateau,
    stop_margin: StopMarginOption = D.stop_margin,
    check_window: CheckWindowOption = D.check_window,
    check_lr: CheckLrOption = D.check_lr,
    mask_seeds: MaskSeedsOption = D.mask_seeds,
    resample: ResampleOption = D.resample,
    reference: ReferenceOption = D.reference,
    reference_rounds: ReferenceRoundsOption = D.reference_rounds,
    polish_rounds: PolishRoundsOption = D.polish_rounds,
    bootstrap: BootstrapOption = D.bootstrap,
    precision: PrecisionOption = D.precision,
    task_patterns: TaskPatternsOption = D.task_patterns,
    train_on: TrainOnOption = D.train_on,
    *,
    task_options: dict[str, Any],
    out: OutOption,
    model_option: ModelOption = None,
    device: DeviceOption = "cpu",
    overwrite: OverwriteOption = False,
    figures: FiguresOption = True,
    progress: ProgressOption = True,
) -> None:
    """Learn sparse attention masks (DAM) to target sparsities and compare them with fixed sparse patterns at matched sparsity."""
    from attnlens.analysis.dam import dam as run

    named = model_named(model, model_option)
    settings = settings_from(
        DamSettings,
        {**locals(), **task_options},
        lambdas=parse_float_list(lambdas, "--lambdas"),
        sparsity=parse_float_list(sparsity, "--sparsity"),
    )  # checked before any model loads
    run_and_save(out, overwrite=overwrite, figures=figures, work=lambda: run(named, settings, device=device, progress=progress))
