"""The typer app, the option types every command shares, and the entry point.

Bad input never shows a traceback: :class:`AttnlensError` and click's usage errors
become one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar, overload

import typer

from attnlens.errors import AttnlensError, AttnlensWarning, BadInput

if TYPE_CHECKING:
    from attnlens.io.results import Result
    from attnlens.settings import Settings

S = TypeVar("S", bound="Settings")

app = typer.Typer(
    name="attnlens",
    help="Look inside the self-attention of pretrained transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # option groups (help panels) and whole command summaries; brackets stay literal
)

# The groups of options in `--help`, the same on every command.
SOURCE, MASK, TRAINING, STOPPING, TASK, OUTPUT = "Model and corpus", "Mask", "Training", "Stopping rule", "Task", "Output"
ANALYSIS = "Analysis"

# ------------------------------------------------------------------ shared options
# The model is named the same way on every command: positional (MODEL, or SOURCE where a store or
# moments may stand in its place) or --model, either one; both, naming different models, is bad input
# (model_named, source_named).
DEFAULT_MODEL = "minilm-l6"
ModelArgument = Annotated[
    str | None,
    typer.Argument(
        help=f"The model: alias (see 'attnlens models'), local directory or Hub id; or give it as --model [default: {DEFAULT_MODEL}].",
        metavar="MODEL",
        show_default=False,
    ),
]
SourceArgument = Annotated[
    str | None,
    typer.Argument(
        help="A model (alias, local directory or Hub id; or give it as --model) to stream from, a store directory "
        "(attnlens extract), or for eigen moments (attnlens moments, attnlens merge).",
        metavar="SOURCE",
        show_default=False,
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="The model, as the positional MODEL names it (give one of the two); with a store as SOURCE, the store's model.",
        show_default=False,
        rich_help_panel=SOURCE,
    ),
]
CorpusOption = Annotated[
    str, typer.Option("--corpus", "-c", help="Built-in name (kjv, wordnet), .txt/.jsonl file, or folder.", rich_help_panel=SOURCE)
]
SeqLenOption = Annotated[
    int, typer.Option("--seq-len", "-n", help="Tokens per block, special tokens included.", rich_help_panel=SOURCE)
]
NumSeqsOption = Annotated[
    int, typer.Option("--num-seqs", help="Number of blocks (chosen by --seed when the corpus has more).", rich_help_panel=SOURCE)
]
BatchSizeOption = Annotated[int, typer.Option("--batch-size", help="Blocks per forward pass.", rich_help_panel=SOURCE)]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed for every random choice.", rich_help_panel=SOURCE)]
LayersOption = Annotated[
    str | None, typer.Option("--layers", help="Comma-separated layer numbers; default all.", rich_help_panel=ANALYSIS)
]
OutOption = Annotated[Path, typer.Option("--out", "-o", help="Directory to write the result to.", rich_help_panel=OUTPUT)]
DeviceOption = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:1, ...", rich_help_panel=OUTPUT)]
ProgressOption = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.", rich_help_panel=OUTPUT)]
OverwriteOption = Annotated[
    bool, typer.Option("--overwrite", help="Replace an existing result in --out.", rich_help_panel=OUTPUT)
]
FiguresOption = Annotated[
    bool,
    typer.Option("--figures/--no-figures", help="Also draw the figures (PNG and PDF) into OUT/figures.", rich_help_panel=OUTPUT),
]

ClassesOption = Annotated[
    str | None,
    typer.Option(
        "--classes",
        help="Comma-separated position classes: self, prev, next, band(w), cls, sep, punct, other "
        "[default: all but band; classes that never occur are dropped].",
        rich_help_panel=MASK,
    ),
]
ObjectiveOption = Annotated[
    str,
    typer.Option(
        "--objective",
        help="auto, clm (next-token loss), mlm (masked-token loss) or hidden (cosine to the unmodified model).",
        rich_help_panel=ANALYSIS,
    ),
]

# The options of the task that judges a change by accuracy are declared once, in attnlens.cli.task_options.
BootstrapOption = Annotated[
    int, typer.Option("--bootstrap", help="Bootstrap resamples for the 95% intervals.", rich_help_panel=ANALYSIS)
]
PrecisionOption = Annotated[
    str,
    typer.Option(
        "--precision",
        help="Arithmetic of the forwards and the training that judge a change (proxy, task, DAM, plan, fine-tunes): "
        "float32, or bfloat16 (autocast; faster on hardware with bfloat16 matrix units). Captured scores, moments and "
        "maps stay float32.",
        rich_help_panel=ANALYSIS,
    ),
]


# Help texts read from a registry (the mask layouts), written when the command line is built rather
# than when its module is imported, so that what registers later shows in --help too.
LIVE_HELP: dict[tuple[str, str], Callable[[], str]] = {}


def _fill_live_help(group) -> None:
    for (command, parameter), text in LIVE_HELP.items():
        for option in group.commands[command].params:
            if option.name == parameter:
                option.help = text()


def _quiet_flags(command) -> None:
    """A flag takes no value, so --help shows none beside it (typer would show ``<bool>``); the help
    option included, which the command makes on first use."""
    helper = command.get_help_option(command.context_class(command))
    for param in [*command.params, *([helper] if helper is not None else [])]:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _quiet_flags(sub)


# Library parameters whose command-line option is not simply --parameter-name (errors name parameters).
OPTION_NAMES = {"strategies": "--select", "scopes": "--scope", "plug_in_scopes": "--plug-in-scope", "source": "SOURCE"}

# Commands that split their work over the ranks torchrun starts; the others run in one process.
DISTRIBUTED_COMMANDS = ("extract", "moments")


def _print_version(value: bool) -> None:
    if value:
        from attnlens import __version__

        typer.echo(f"attnlens {__version__}")
        raise typer.Exit()


@app.callback()
def _launch(
    context: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    # Under torchrun every rank runs the command line: a command that does not split its
    # work would run N times and write N times to the same --out, so it is refused.
    from attnlens.io.ranks import ReportedError, environment_world_size

    if environment_world_size() > 1 and context.invoked_subcommand not in DISTRIBUTED_COMMANDS:
        message = (
            f"'attnlens {context.invoked_subcommand}' runs in one process; launch it without torchrun "
            f"(commands that split work over ranks: {', '.join(DISTRIBUTED_COMMANDS)})"
        )
        raise (BadInput if os.environ.get("RANK", "0") == "0" else ReportedError)(message)


def model_named(positional: str | None, option: str | None, default: str | None = DEFAULT_MODEL, *, what: str = "MODEL") -> str:
    """The model a command runs on: the positional ``what`` or ``--model``, either (the same name
    twice is fine), else ``default``; two different names, or none without a default, are bad input.

    >>> model_named(None, "minilm-l3"), model_named("minilm-l3", None), model_named(None, None)
    ('minilm-l3', 'minilm-l3', 'minilm-l6')
    >>> model_named("minilm-l3", "minilm-l6")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: MODEL 'minilm-l3' and model 'minilm-l6' name different models; name the model once, as MODEL or model
    """
    if positional is not None and option is not None and positional != option:
        raise BadInput(
            f"{what} '{positional}' and `model` '{option}' name different models; name the model once, as {what} or `model`"
        )
    named = positional if positional is not None else option if option is not None else default
    if named is None:
        raise BadInput(f"name what to read: {what} (a model, a store or moments) or `model`")
    return named


def source_named(source: str | None, option: str | None) -> tuple[str, str | None]:
    """(what a command reads, the store's model): ``SOURCE`` or ``--model``, as :func:`model_named`
    says; with a store as SOURCE, ``--model`` is the model the store was made with (for the commands
    that run it, reconstruct's plug-in runs), not a second source."""
    from attnlens.io.store import is_store

    if source is not None and option is not None and is_store(Path(source)):
        return source, option
    return model_named(source, option, None, what="SOURCE"), None


@overload
def parse_int_list(text: str, option: str) -> list[int]: ...
@overload
def parse_int_list(text: None, option: str) -> None: ...
def parse_int_list(text: str | None, option: str) -> list[int] | None:
    """``"0,2,5"`` -> ``[0, 2, 5]``; ``None`` stays ``None``.

    >>> parse_int_list("0, 2,5", "--layers")
    [0, 2, 5]
    """
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"{option} '{text}' is not a comma-separated list of integers, e.g. {option} 0,1,2") from None


def settings_from(cls: type[S], options: Mapping[str, object], **parsed: object) -> S:
    """The settings ``cls`` of a command: every option named like one of its fields, with
    ``parsed`` (values the command parsed from text) taking precedence. Made, and so
    checked, before any model loads.

    >>> from attnlens.analysis.overlap import OverlapSettings
    >>> settings_from(OverlapSettings, {"dim": 8, "out": "runs/o", "query": None})
    OverlapSettings(dim=8, max_dim=None, level=0.9, query=None)
    """
    names = cls.paths()
    return cls.build(None, **{**{name: value for name, value in options.items() if name in names}, **parsed})


def run_and_save(out: Path, *, overwrite: bool, figures: bool, work: Callable[[], Result]) -> Result:
    """The sequence every analysis command shares, once its settings are made (and so checked):
    check that ``out`` can take a result, run ``work``, save the result (and its figures), print
    it as text, and say where it went."""
    from attnlens.io.results import check_out

    check_out(out, overwrite)
    result = work()
    result.save(out, overwrite=overwrite)
    if figures:
        result.save_figures(Path(out) / "figures")
    typer.echo(result.text())
    typer.echo(f"wrote {result.kind} result to {out}")
    return result


def parse_float_list(text: str | None, option: str) -> list[float] | None:
    """``"1e-3, 0.01"`` -> ``[0.001, 0.01]``; ``None`` stays ``None``.

    >>> parse_float_list("0, 1e-3,0.1", "--lambdas")
    [0.0, 0.001, 0.1]
    """
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"{option} '{text}' is not a comma-separated list of numbers, e.g. {option} 0.01,0.1") from None


# ------------------------------------------------------------------ entry point
def main(argv: list[str] | None = None) -> None:
    """Run the CLI; user errors become one line on stderr and exit status 2."""
    from attnlens.io.provenance import set_cli_command

    set_cli_command(sys.argv[1:] if argv is None else list(argv))
    command = typer.main.get_command(app)
    _fill_live_help(command)
    _quiet_flags(command)
    try:
        with warnings.catch_warnings():  # attnlens' own notices as one line each (restored on the way out)
            warnings.simplefilter("always", AttnlensWarning)
            warnings.showwarning = _show_warning
            status = command.main(args=argv, prog_name="attnlens", standalone_mode=False)
    except AttnlensError as error:
        if getattr(error, "reported", False):  # rank 0 has printed it already
            sys.exit(2)
        _fail(error.cli_message(OPTION_NAMES))
    except typer.TyperException as error:  # click's usage errors, as vendored by typer
        if type(error).__name__ == "NoArgsIsHelpError":
            print(error.format_message())
            sys.exit(0)
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        _fail(" ".join(error.format_message().split()) + hint)
    except typer.Abort:
        status = 130
    if status == 130:
        _fail("interrupted; finished work is kept (rerun with --resume where the command has it)", status=130)
    sys.exit(status if isinstance(status, int) else 0)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """An :class:`AttnlensWarning` as one line on stderr, ``attnlens: warning: ...``, its parameters
    spelt as options; any other warning as Python prints it."""
    if isinstance(message, AttnlensWarning):
        print(f"attnlens: warning: {message.cli_message(OPTION_NAMES)}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), file=sys.stderr, end="")


def _fail(message: str, status: int = 2) -> None:
    print(f"attnlens: error: {message}", file=sys.stderr)
    sys.exit(status)
