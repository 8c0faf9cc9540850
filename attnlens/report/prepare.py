"""A report checked, sized and forecast before its first stage (:func:`prepare`, :func:`forecast_report`).

Everything a report can fail on that needs no stage is checked here, in seconds: the names the user
gave, the model's positions against the preset's blocks, the task at each width a stage judges at. The
settings are sized for the model (:meth:`~attnlens.report.presets.ReportSettings.sized_for`), and the
forecast counts and prices what the stages will run (:mod:`attnlens.forecast`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlens.analysis.margin import Margin
from attnlens.analysis.task import PreparedTask, TaskSettings
from attnlens.analysis.task.settings import AUTO, task_of
from attnlens.errors import AttnlensError, BadInput
from attnlens.forecast import Forecast
from attnlens.models.aliases import ALIASES, missing_distributions
from attnlens.models.loading import LoadedModel, check_device, load_model
from attnlens.models.locate import locate_model
from attnlens.report.budget import FILL
from attnlens.report.presets import QUICK, STAGES, ReportSettings, preset, stage_weights

if TYPE_CHECKING:
    from attnlens.report.budget import Budget

# A second model of the same geometry to compare subspaces with, when it is installed.
COMPANIONS = {"minilm-l6": "minilm-l3", "minilm-l3": "minilm-l6"}


def companion_for(model: LoadedModel) -> str | None:
    name = COMPANIONS.get(model.name)
    return name if name is not None and not missing_distributions(ALIASES[name]) else None


@dataclass(frozen=True)
class Prepared:
    """A report checked and sized before its first stage: the preset's name and settings as the stages get
    them, the model, the second model (or None), each judged stage's task as it prepares it, and where the
    report was sized to a time given, how (:class:`~attnlens.report.budget.Budget`)."""

    name: str
    settings: ReportSettings
    loaded: LoadedModel
    second: str | None
    tasks: dict[str, PreparedTask]
    per_query: bool  # the reconstruction's maps are one per query (a causal model, or an encoder's windows)
    precision: str
    task_seconds: dict[str, float]  # how long preparing each stage's task took (each stage prepares it again)
    geometry: tuple[bool, int]  # whether an encoder has windows shorter than n; the most keys a query sees
    budget: Budget | None = None

    def sized(self, settings: ReportSettings) -> ReportSettings:
        """``settings`` sized for this model (:meth:`ReportSettings.sized_for`)."""
        return settings.sized_for(self.loaded.causal, *self.geometry)

    def tasks_for(self, settings: ReportSettings) -> dict[str, PreparedTask]:
        """Each stage's task as ``settings`` prepare it, read off the tasks prepared here: a sequential
        judgement's pool cut to its ``task_pool`` (the budget's candidates differ in nothing else a task sees)."""
        cut = {}
        for stage, task in self.tasks.items():
            judged = task_of(getattr(settings, stage))
            pool = judged.task_pool if judged is not None and judged.task_eval == AUTO else len(task.pool)
            cut[stage] = dataclasses.replace(task, pool=task.pool.take(slice(0, pool)))
        return cut


def prepare(
    model: str | LoadedModel = "minilm-l6",
    *,
    corpus: str = "kjv",
    compare: str | None = "auto",
    quick: bool = False,
    full: bool = False,
    protocol: str = "probe",
    task: str | None = "default",
    seed: int = 0,
    device: str = "cpu",
    precision: str = "float32",
    margin: float | str | None = None,
    budget: float | None = None,
    sizes_from: str | Path | None = None,
) -> Prepared:
    """Everything :func:`report` checks and sizes before its first stage (the arguments are its own): a bad
    choice fails here, in seconds, and :func:`forecast_report` forecasts what this gives. ``budget``: seconds
    the report is sized to (:mod:`attnlens.report.budget`); ``sizes_from``: a saved report whose settings it
    makes again."""
    began = time.perf_counter()
    run: dict[str, Any] = dict(corpus=corpus, seed=seed, precision=precision, **({} if task == "default" else {"task": task}))
    if margin is not None:
        run["margin"] = Margin.parse(margin).setting  # a bad margin fails here, before the model loads
    sized: Budget | None = None  # the budget that sized the saved report's settings
    if sizes_from is not None:
        _check_saved_alone(quick, full, budget, run)
        name, settings, sized = saved_settings(sizes_from)
        precision = settings.importance.flat()["precision"]
    else:
        if budget is not None and (quick or full):
            raise BadInput("`budget` chooses the sizes itself; drop --quick and --full, or drop --budget for a preset's sizes")
        name, settings = preset(protocol, quick=quick or budget is not None, full=full)
        # the user's task judges every stage the preset judges by a task (the savings' too); the settings are
        # checked as they are made, the task's file too, before the model loads
        settings = settings.for_run(**run)
    check_device(device)
    _check_inputs(settings.eigen.corpus, compare)
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    if budget is None:
        prepared = _prepared(loaded, name, settings, compare, precision)
        return dataclasses.replace(prepared, budget=sized)
    return _budgeted(loaded, protocol, run, compare, budget, began, device)


def _prepared(loaded: LoadedModel, name: str, settings: ReportSettings, compare: str | None, precision: str) -> Prepared:
    """The report of preset ``name`` with ``settings`` on ``loaded``, checked and sized."""
    _check_lengths(loaded, settings, name)
    geometry = _geometry(loaded, settings)
    settings = settings.sized_for(loaded.causal, *geometry)
    seed = settings.eigen.seed
    tasks, seconds = _check_task(loaded, settings, seed)  # before the first stage's forward pass, not stages later
    second = companion_for(loaded) if compare == "auto" else compare
    per_query = loaded.causal or geometry[0]
    return Prepared(name, settings, loaded, second, tasks, per_query, precision, seconds, geometry)


def _budgeted(
    loaded: LoadedModel, protocol: str, run: dict[str, Any], compare: str | None, seconds: float, began: float, device: str
) -> Prepared:
    """The report sized to ``seconds`` (:mod:`attnlens.report.budget`): the largest preset whose forecast fits,
    each tried only when the smaller fits; then its levers. A preset too long for the model's positions is
    not tried."""
    from attnlens.report import budget as sizing

    quick_name, quick = preset(protocol, quick=True, full=False)
    largest = {"blocks": 1.0, "pools": sizing.POOLS[-1], "seeds": quick.dam.mask.seeds, "steps": 1.0}
    opened = sizing.shrunk(quick.for_run(**run), largest)
    chosen, is_open = _prepared(loaded, quick_name, opened, compare, run["precision"]), True
    price = pricer(chosen, device=device)
    if price(chosen.settings).seconds <= FILL * seconds - (time.perf_counter() - began):  # try the larger presets
        for name, settings in dict(preset(protocol, quick=False, full=full) for full in (False, True)).items():
            try:
                larger = _prepared(loaded, name, settings.for_run(**run), compare, run["precision"])
            except BadInput:  # its blocks are longer than the model's positions
                break
            priced = pricer(larger, device=device)
            if priced(larger.settings).seconds > FILL * seconds - (time.perf_counter() - began):
                break
            chosen, price, is_open = larger, priced, False
    else:  # the levers will move: the smallest sizes' shapes timed too, as the largest's were
        price(chosen.sized(sizing.shrunk(chosen.settings, sizing.LEAST)))
    spent = time.perf_counter() - began
    budget = sizing.fit(  # every size between read off the shapes timed: a second, not a unit timed per size
        chosen.name,
        chosen.settings,
        lambda settings: price(chosen.sized(settings), new_shapes=False).seconds,
        seconds,
        spent,
        is_open,
    )
    settings = chosen.sized(sizing.shrunk(chosen.settings, budget.levers))
    return dataclasses.replace(chosen, settings=settings, tasks=chosen.tasks_for(settings), budget=budget)


def forecast_report(prepared: Prepared, *, device: str = "cpu") -> Forecast:
    """How long each stage of the ``prepared`` report will take here: its work counted from its settings and
    priced by timing each kind of it on the model (:mod:`attnlens.forecast`); seconds, not minutes."""
    return pricer(prepared, device=device)(prepared.settings)


def pricer(prepared: Prepared, *, device: str = "cpu") -> Callable[..., Forecast]:
    """The forecast of ``prepared``'s report with other settings of the same preset (other sizes): what does not
    change with the sizes (the second model, the probes' set-up, the stages not counted) made once, and each
    kind of work timed once in this process (:class:`~attnlens.forecast.units.Calibration`); ``new_shapes=False``
    reads a shape not timed yet off the kind's timed ones."""
    from attnlens.forecast import forecast
    from attnlens.forecast.figures import figures_seconds
    from attnlens.forecast.stages import Facts

    loaded = prepared.loaded
    cached, setup = _probes_ready(prepared)
    second = load_model(prepared.second, device=device) if prepared.second else None
    measured = stage_weights(prepared.name)  # the stages the forecast does not count: as bench_report measured them
    second_layers = None if second is None else second.num_layers

    def priced(settings: ReportSettings, new_shapes: bool = True) -> Forecast:
        tasks = prepared.tasks_for(settings)
        facts = Facts(loaded.num_layers, loaded.num_heads, loaded.causal, prepared.per_query, loaded.objective, tasks, cached)
        # the figures: minilm-l6's seconds per panel drawn, times the panels this model's figures draw
        figures = figures_seconds(measured["figures"], settings, loaded.num_layers, loaded.num_heads, second_layers)
        fixed = {"overlap": measured["overlap"], "figures": figures}
        return forecast(
            loaded, settings, facts, second=second, fixed=fixed, extra=setup, precision=prepared.precision, new_shapes=new_shapes
        )

    return priced


def _probes_ready(prepared: Prepared) -> tuple[frozenset[str], dict[str, float]]:
    """Which stages find their probe's training features computed (in the cache, or by an earlier stage of the
    same key), and each judged stage's set-up seconds: its task prepared again (as :func:`prepare` timed it) and,
    where its probe's C is not cached, the cross-validation that chooses it (timed on features of its shape)."""
    from attnlens.analysis.task.judge import train_features_key
    from attnlens.forecast.units import probe_seconds
    from attnlens.models.cache import is_cached

    earlier: set[str] = set()  # the keys of the stages before: their features are computed by the time it runs
    cached, setup = set(), {}
    for stage, task in prepared.tasks.items():  # in the order the stages run
        s = getattr(prepared.settings, stage)
        key = train_features_key(prepared.loaded, task, s.batch_size, prepared.precision)
        ready = key is None or key in earlier or is_cached("task-features", key)
        if ready:
            cached.add(stage)
        elif key is not None:
            earlier.add(key)  # computed in this stage, and the probe's C chosen on them
        choosing = not ready and s.task.probe_c is None
        setup[stage] = prepared.task_seconds[stage] + (
            probe_seconds(len(task.train), prepared.loaded.hidden_size) if choosing else 0.0
        )
    return frozenset(cached), setup


def saved_settings(directory: str | Path) -> tuple[str, ReportSettings, Budget | None]:
    """The preset's name, the settings and the budget that sized them (if one did) of the report saved in
    ``directory`` (its ``result.json``), made again."""
    from attnlens.report.budget import Budget

    path = Path(directory) / "result.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        raise BadInput(
            f"--sizes-from '{directory}' holds no readable report (no {path.name}); give a directory `attnlens report` wrote"
        ) from None
    if meta.get("kind") != "report":
        raise BadInput(
            f"--sizes-from '{directory}' holds a {meta.get('kind', 'result')}, not a report; give a report's directory"
        )
    budget = meta.get("budget")
    return meta["preset"], ReportSettings.from_dict(meta["settings"]), None if budget is None else Budget.from_dict(budget)


def _check_saved_alone(quick: bool, full: bool, budget: float | None, run: dict[str, Any]) -> None:
    """``sizes_from`` takes every setting from the saved report: an option that would choose one too is refused."""
    chose = [flag for flag, given in (("--quick", quick), ("--full", full), ("--budget", budget is not None),
             ("--corpus", run["corpus"] != "kjv"), ("--seed", run["seed"] != 0), ("--task", "task" in run),
             ("--precision", run["precision"] != "float32"), ("--margin", "margin" in run)) if given]  # fmt: skip
    if chose:
        raise BadInput(f"--sizes-from takes every setting from the saved report; drop {', '.join(chose)}")


def _check_inputs(corpus: str, compare: str | None) -> None:
    """What the user chose, checked before the model loads: a bad name fails in seconds, not stages later."""
    from attnlens.data.corpus import load_corpus

    load_corpus(corpus)  # quick (kjv: a tenth of a second); the stages read it again by name
    if compare not in (None, "auto"):
        try:
            locate_model(compare)
        except AttnlensError as error:  # the model's own message and kind, said of the option that named it
            raise type(error)(f"`compare`: {error.args[0]}") from None


def _check_lengths(loaded: LoadedModel, settings: ReportSettings, preset_name: str) -> None:
    """Every stage's blocks fit the model's positions, checked before the first stage: the report has no
    ``--seq-len``, so the way out is a preset with shorter blocks, or the analyses one by one."""
    longest = max(getattr(settings, stage).seq_len for stage in STAGES if getattr(settings, stage) is not None)
    if longest <= loaded.max_positions:
        return
    quick = max(getattr(QUICK, stage).seq_len for stage in STAGES)
    way = (
        f"run 'attnlens report --quick' (blocks of {quick})"
        if quick <= loaded.max_positions and preset_name != "quick"
        else "run the analyses one by one with a shorter --seq-len (attnlens eigen, reconstruct, importance, dam, plan)"
    )
    raise BadInput(
        f"model '{loaded.name}' supports {loaded.max_positions} positions, fewer than the {longest} tokens of the "
        f"{preset_name} report's blocks; {way}"
    )


def _geometry(loaded: LoadedModel, settings: ReportSettings) -> tuple[bool, int]:
    """What :meth:`ReportSettings.sized_for` reads of the model, from the pairs each layer computes at the
    reconstruction's and the plan's n (one forward of one block per n): whether an encoder has windows shorter
    than n, and the most keys any query sees where every layer is windowed."""
    from attnlens.rows.sources import model_pairs, partial_row_layers

    recon_n = settings.reconstruct.seq_len
    plan_n = settings.plan.seq_len if settings.plan is not None else recon_n
    pairs = {n: model_pairs(loaded, n) for n in {recon_n, plan_n}}
    windowed = not loaded.causal and bool(partial_row_layers(pairs[recon_n]))
    widest = max(int(layer.sum(-1).max()) for layer in pairs[plan_n].values())
    return windowed, widest


def _check_task(loaded: LoadedModel, settings: ReportSettings, seed: int) -> tuple[dict[str, PreparedTask], dict[str, float]]:
    """Every check of the task that needs the model (the protocol, the split at each width a stage
    judges at), made by preparing it as the stages will: each stage's prepared task (the forecast counts
    its examples; the stages prepare it again, at the cost of tokenising: the seconds it took here)."""
    from attnlens.analysis.task import prepare_task

    prepared: dict[tuple[TaskSettings, int, int | None], tuple[PreparedTask, float]] = {}
    for key in settings.judged().values():
        task, seq_len, pad_to = key
        if key not in prepared:
            began = time.perf_counter()
            prepared[key] = (prepare_task(loaded, task, seq_len=seq_len, seed=seed, pad_to=pad_to), time.perf_counter() - began)
    stages = {stage: prepared[task, seq_len, pad_to] for stage, (task, seq_len, pad_to) in settings.judged().items()}
    return {stage: task for stage, (task, _) in stages.items()}, {stage: seconds for stage, (_, seconds) in stages.items()}
