"""A report checked, sized and forecast before its first stage (:func:`prepare`, :func:`forecast_report`).

Everything a report can fail on that needs no stage is checked here, in seconds: the names the user
gave, the model's positions against the preset's blocks, the task at each width a stage judges at. The
settings are sized for the model (:meth:`~attnlens.report.presets.ReportSettings.sized_for`), and the
forecast counts and prices what the stages will run (:mod:`attnlens.forecast`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from attnlens.analysis.task import PreparedTask, TaskSettings
from attnlens.errors import AttnlensError, BadInput
from attnlens.forecast import Forecast
from attnlens.models.aliases import ALIASES, missing_distributions
from attnlens.models.loading import LoadedModel, check_device, load_model
from attnlens.models.locate import locate_model
from attnlens.report.presets import QUICK, STAGES, ReportSettings, preset, stage_weights

# A second model of the same geometry to compare subspaces with, when it is installed.
COMPANIONS = {"minilm-l6": "minilm-l3", "minilm-l3": "minilm-l6"}
REFERENCE_LAYERS = 6  # the layers of minilm-l6, the model bench/bench_report.py measures the figures' seconds on


def companion_for(model: LoadedModel) -> str | None:
    name = COMPANIONS.get(model.name)
    return name if name is not None and not missing_distributions(ALIASES[name]) else None


@dataclass(frozen=True)
class Prepared:
    """A report checked and sized before its first stage: the preset's name and settings as the stages get
    them, the model, the second model (or None), and each judged stage's task as it prepares it."""

    name: str
    settings: ReportSettings
    loaded: LoadedModel
    second: str | None
    tasks: dict[str, PreparedTask]
    per_query: bool  # the reconstruction's maps are one per query (a causal model, or an encoder's windows)
    precision: str
    task_seconds: dict[str, float]  # how long preparing each stage's task took (each stage prepares it again)


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
) -> Prepared:
    """Everything :func:`report` checks and sizes before its first stage (the arguments are its own): a bad
    choice fails here, in seconds, and :func:`forecast_report` forecasts what this gives."""
    name, settings = preset(protocol, quick=quick, full=full)
    check_device(device)
    # the user's task judges every stage the preset judges by a task (the savings' too); the settings are
    # checked as they are made, the task's file too, before the model loads
    settings = settings.for_run(corpus=corpus, seed=seed, precision=precision, **({} if task == "default" else {"task": task}))
    _check_inputs(corpus, compare)
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
    _check_lengths(loaded, settings, name)
    settings, windowed = _sized(loaded, settings)
    tasks, seconds = _check_task(loaded, settings, seed)  # before the first stage's forward pass, not stages later
    second = companion_for(loaded) if compare == "auto" else compare
    return Prepared(name, settings, loaded, second, tasks, loaded.causal or windowed, precision, seconds)


def forecast_report(prepared: Prepared, *, device: str = "cpu") -> Forecast:
    """How long each stage of the ``prepared`` report will take here: its work counted from its settings and
    priced by timing each kind of it on the model (:mod:`attnlens.forecast`); seconds, not minutes."""
    from attnlens.forecast import forecast
    from attnlens.forecast.stages import Facts

    loaded, settings = prepared.loaded, prepared.settings
    cached, setup = _probes_ready(prepared)
    facts = Facts(
        loaded.num_layers, loaded.num_heads, loaded.causal, prepared.per_query, loaded.objective, prepared.tasks, cached
    )
    second = load_model(prepared.second, device=device) if prepared.second else None
    measured = stage_weights(prepared.name)  # the stages the forecast does not count: as bench_report measured them
    # the figures: about half of their seconds are the page's own, half grow with the layers drawn (minilm-l3's
    # 12 s, minilm-l6's 12 s and gemma3-270m's 35 s, as bench_report measured them)
    figures = measured["figures"] * (0.5 + 0.5 * loaded.num_layers / REFERENCE_LAYERS)
    fixed = {"overlap": measured["overlap"], "figures": figures}
    return forecast(loaded, settings, facts, second=second, fixed=fixed, extra=setup, precision=prepared.precision)


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


def _sized(loaded: LoadedModel, settings: ReportSettings) -> tuple[ReportSettings, bool]:
    """``settings`` sized for the model's geometry (:meth:`ReportSettings.sized_for`), read from the pairs each
    layer computes at the reconstruction's and the plan's n (one forward of one block per n): whether an
    encoder has windows shorter than n, and the most keys any query sees where every layer is windowed."""
    from attnlens.rows.sources import model_pairs, partial_row_layers

    recon_n = settings.reconstruct.seq_len
    plan_n = settings.plan.seq_len if settings.plan is not None else recon_n
    pairs = {n: model_pairs(loaded, n) for n in {recon_n, plan_n}}
    windowed = not loaded.causal and bool(partial_row_layers(pairs[recon_n]))
    widest = max(int(layer.sum(-1).max()) for layer in pairs[plan_n].values())
    return settings.sized_for(loaded.causal, windowed, widest), windowed


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
