"""The options of the task that judges a change by accuracy, declared once (:data:`TASK_OPTIONS`) and
given to every command that judges by a task with :func:`task_options`.

A command decorated with ``@task_options(defaults)`` takes one parameter, ``task_options``: the values
of every task option it was given, by setting name, which it passes on with its own options to its
settings (:func:`~attnlens.cli.app.settings_from`). Their defaults are the command's settings' own.

>>> import inspect
>>> from attnlens.analysis.importance import ImportanceSettings
>>> @task_options(ImportanceSettings.defaults(), leave_out=("seeds",))
... def command(num_seqs: int = 8, *, task_options: dict) -> dict:
...     return task_options
>>> list(inspect.signature(command).parameters)[:4]
['num_seqs', 'task', 'protocol', 'task_exclude']
>>> command(num_seqs=8, **{name: None for name in TASK_OPTIONS if name != "seeds"})["margin"] is None
True
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Annotated, Any, TypeVar

import typer

from attnlens.analysis.margin import Margin
from attnlens.errors import BadInput

from .app import TASK

F = TypeVar("F", bound=Callable[..., Any])


def _task_eval(value: str | int) -> int | str:
    """``--task-eval``: a number, or ``auto``."""
    if value == "auto" or isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"--task-eval '{value}' is neither a number of held-out examples nor 'auto'") from None


def _margin(value: str | float | None) -> float | str | None:
    """``--margin``: points of accuracy (``2``), or a share of the unmodified accuracy (``3%``); checked here,
    before any model loads (``None``: not given, where a command's default is its preset's)."""
    return None if value is None else Margin.parse(value).setting


def _option(name: str, help: str, **kwargs: Any) -> Any:
    return typer.Option(name, help=help, rich_help_panel=TASK, **kwargs)


# Each task option: its type and option, by the name of the setting it sets (TaskSettings).
TASK_OPTIONS: dict[str, Any] = {
    "task": Annotated[
        str | None,
        _option(
            "--task",
            "Also judge by accuracy on a labelled task: imdb, rotten-tomatoes, or a .csv/.jsonl file or folder. Both "
            "built-ins are their datasets' usual train splits (IMDB's 25,000 train reviews; Rotten Tomatoes' 8,530 train "
            "sentences): a classifier fine-tuned on them has seen them; see --task-exclude.",
        ),
    ],
    "protocol": Annotated[
        str,
        _option(
            "--protocol",
            "auto (head if the model has a classification head, else probe), probe (frozen readout), refit (readout "
            "refitted per change), finetune, or head (the model's own classifier).",
        ),
    ],
    "task_exclude": Annotated[
        str | None,
        _option(
            "--task-exclude",
            "Texts to keep out of the task before any split (the classifier's training data): one per line, or a task "
            "file whose --text-column is read; matched case and whitespace aside; duplicates within the task are dropped "
            "too.",
        ),
    ],
    "task_train": Annotated[
        int | None,
        _option(
            "--task-train",
            "Task examples to fit the probe (or fine-tune) on [default: 1024; under --protocol head none: every example "
            "not excluded is held out].",
            show_default=False,
        ),
    ],
    "task_eval": Annotated[
        str,
        _option(
            "--task-eval",
            "Held-out task examples to judge on, or auto: each change on as many as its interval needs to decide against "
            "--margin.",
            callback=_task_eval,
        ),
    ],
    "task_pool": Annotated[int, _option("--task-pool", "With --task-eval auto: the most held-out examples a judgement may use.")],
    "margin": Annotated[
        str,
        _option(
            "--margin",
            "The loss of accuracy a change may cost and still keep the model: points (2) or a share of the unmodified "
            "accuracy (3%). A change keeps the model when its paired Δ interval lies above −margin; two choices are on "
            "par only within ±margin.",
            callback=_margin,
        ),
    ],
    "text_column": Annotated[str, _option("--text-column", "Text column of a task file.")],
    "label_column": Annotated[str, _option("--label-column", "Label column of a task file.")],
    "probe_c": Annotated[
        float | None,
        _option("--probe-c", "The probe's inverse L2 strength [default: chosen by 5-fold CV on the training examples]."),
    ],
    "finetune_steps": Annotated[int, _option("--finetune-steps", "AdamW steps of the finetune protocol.")],
    "finetune_lr": Annotated[float, _option("--finetune-lr", "Encoder learning rate of the finetune protocol (head: 100x).")],
    "seeds": Annotated[int, _option("--seeds", "Fine-tune runs per change (finetune protocol), seeds --seed, --seed + 1, ...")],
}
TEXT_DEFAULTS = ("task_eval", "margin")  # options read as text (a number or a word): their defaults are shown as text


def task_options(defaults: SimpleNamespace, *, leave_out: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give a command every task option (but ``leave_out``), with ``defaults`` (its settings' own); the
    command receives their values as one dict, ``task_options``, by setting name."""
    names = [name for name in TASK_OPTIONS if name not in leave_out]

    def decorate(command: F) -> F:
        own = inspect.signature(command, eval_str=True)
        parameters = [parameter for parameter in own.parameters.values() if parameter.name != "task_options"]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=TASK_OPTIONS[name], default=_shown(name, defaults))
            for name in names
        ]

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            given = {name: values.pop(name) for name in names}
            return command(**values, task_options=given)

        signature = own.replace(parameters=[*parameters, *added])
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return wrapper  # type: ignore[return-value]

    return decorate


def _shown(name: str, defaults: SimpleNamespace) -> Any:
    value = getattr(defaults, name)
    if name not in TEXT_DEFAULTS:
        return value
    return f"{value:g}" if isinstance(value, float) else str(value)
