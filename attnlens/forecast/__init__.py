"""How long the report will take, on this model and this machine, said before it starts.

The forecast counts each stage's work from the settings it will run with (:mod:`attnlens.forecast.stages`:
batches of blocks and examples through the model, training steps, moments, the maps' fits) and prices
each kind of work by running it once on the model (:mod:`attnlens.forecast.units`): a few seconds for
MiniLM, under a minute for a model 10× its size. A count that a stage decides as it goes (a sequential
judgement's examples, DAM's steps, a swap search's rounds, the plan's search) is a range; the forecast
is its middle, and ``low``/``high`` carry the range.

>>> from attnlens.forecast.units import Calibration, Unit
>>> from attnlens.forecast.work import Item
>>> stage = StageForecast.of("eigen", [Item("moments", Unit("moments", 32, 128), 8)], Calibration({Unit("moments", 32, 128): 0.5}))
>>> stage.seconds, stage.low, stage.high
(4.0, 4.0, 4.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from attnlens.forecast.units import KINDS, Calibration, Unit, priced_as
from attnlens.forecast.work import Item

if TYPE_CHECKING:
    from attnlens.analysis.dam.settings import DamSettings
    from attnlens.analysis.eigen import EigenSettings
    from attnlens.analysis.importance import ImportanceSettings
    from attnlens.analysis.plan.settings import PlanSettings
    from attnlens.analysis.reconstruct.settings import ReconstructSettings
    from attnlens.analysis.sinks.settings import SinkSettings
    from attnlens.forecast.stages import Facts
    from attnlens.models.loading import LoadedModel

__all__ = ["Forecast", "StageForecast", "forecast"]


class StageSettings(Protocol):
    """Each stage's settings, as the report gives them (:class:`~attnlens.report.presets.ReportSettings`)."""

    @property
    def eigen(self) -> EigenSettings: ...
    @property
    def reconstruct(self) -> ReconstructSettings: ...
    @property
    def importance(self) -> ImportanceSettings: ...
    @property
    def dam(self) -> DamSettings: ...
    @property
    def plan(self) -> PlanSettings | None: ...
    @property
    def sinks(self) -> SinkSettings | None: ...


ORDER = (
    "eigen",
    "eigen (second model)",
    "overlap",
    "sinks",
    "reconstruct",
    "importance",
    "dam",
    "plan",
    "figures",
)  # as the report runs them


@dataclass(frozen=True)
class StageForecast:
    """One stage: its forecast seconds (the middle of every range), the least and the most, and its items priced."""

    name: str
    seconds: float
    low: float
    high: float
    items: tuple[tuple[Item, float], ...] = ()

    @classmethod
    def of(cls, name: str, items: list[Item], calibration: Calibration, setup: float = 0.0) -> StageForecast:
        """``items`` priced by ``calibration``, and ``setup`` seconds measured apart."""
        priced = [(item, calibration.seconds(item.unit)) for item in items]
        mid = sum(item.count * each for item, each in priced)
        low = sum(item.bounds[0] * each for item, each in priced)
        high = sum(item.bounds[1] * each for item, each in priced)
        return cls(name, setup + mid, setup + low, setup + high, tuple(priced))


@dataclass(frozen=True)
class Forecast:
    """Every stage's forecast, in the order they run, and the calibration it was priced by."""

    stages: dict[str, StageForecast]
    calibration: Calibration = field(default_factory=Calibration)

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages.values())

    @property
    def range(self) -> tuple[float, float]:
        return sum(s.low for s in self.stages.values()), sum(s.high for s in self.stages.values())

    def table(self) -> str:
        """Stage by stage: the forecast and its range, in seconds; then the total."""
        lines = [f"{'stage':24}{'forecast':>10}{'range':>20}"]
        for stage in self.stages.values():
            lines.append(f"{stage.name:24}{stage.seconds:9.0f}s{_span(stage.low, stage.high):>20}")
        low, high = self.range
        lines.append(f"{'total':24}{self.seconds:9.0f}s{_span(low, high):>20}")
        lines.append(f"(each kind of work timed once on this model and machine: {self.calibration.timed_s:.0f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The forecast as ``result.json`` keeps it: per stage seconds, least and most; the units' timings."""
        return {
            "stages_s": {name: {"forecast": s.seconds, "low": s.low, "high": s.high} for name, s in self.stages.items()},
            "total_s": self.seconds,
            "calibration_s": self.calibration.timed_s,
            "units_s": self.calibration.to_dict(),
        }


def _span(low: float, high: float) -> str:
    return f"{low:.0f}–{high:.0f} s"


def forecast(
    loaded: LoadedModel,
    settings: StageSettings,
    facts: Facts,
    *,
    second: LoadedModel | None = None,
    fixed: dict[str, float] | None = None,
    extra: dict[str, float] | None = None,
    precision: str = "float32",
    new_shapes: bool = True,
) -> Forecast:
    """Each stage of a report with ``settings`` on ``loaded`` (and the eigen analysis of ``second``), its
    work counted (``facts``: what the counts need of the model and the tasks) and priced on this machine;
    ``fixed``: seconds of stages that are not priced by their work (the overlap, the figures); ``extra``: seconds
    measured apart that a stage adds to its work (its task's set-up); ``precision``:
    the judging forwards' (the stages judge at it, so their units are timed at it); without ``new_shapes``, a
    kind of work timed before at another shape is read off it, not timed again (:meth:`Calibration.measure`)."""
    from attnlens.data.corpus import load_corpus

    work = stage_work(settings, facts)
    blocks = load_corpus(settings.eigen.corpus).blocks(loaded, max(_widths(work)), 16, settings.eigen.seed).ids
    units = [u for items in work.values() for u in _units(items)]
    calibration = Calibration.measure(loaded, units, blocks, precision, new_shapes=new_shapes)
    stages = {name: StageForecast.of(name, items, calibration, (extra or {}).get(name, 0.0)) for name, items in work.items()}
    if second is not None:
        from attnlens.forecast.stages import eigen_work

        items = eigen_work(settings.eigen)
        theirs = Calibration.measure(second, _units(items), blocks, precision, new_shapes=new_shapes)
        stages = {
            "eigen": stages.pop("eigen"),
            "eigen (second model)": StageForecast.of("eigen (second model)", items, theirs),
            **stages,
        }
    for name, seconds in (fixed or {}).items():
        stages[name] = StageForecast(name, seconds, seconds, seconds)
    return Forecast({name: stages[name] for name in ORDER if name in stages}, calibration)


def stage_work(settings: StageSettings, facts: Facts) -> dict[str, list[Item]]:
    """Each stage's items (:mod:`attnlens.forecast.stages`), in the order the stages run."""
    from attnlens.forecast import stages as counted

    work = {
        "eigen": counted.eigen_work(settings.eigen),
        **({"sinks": counted.sinks_work(settings.sinks, facts)} if settings.sinks is not None else {}),
        "reconstruct": counted.reconstruct_work(settings.reconstruct, facts),
        "importance": counted.importance_work(settings.importance, facts),
        "dam": counted.dam_work(settings.dam, facts),
    }
    if settings.plan is not None:
        work["plan"] = counted.plan_work(settings.plan, facts)
    return {name: [item for item in items if item.bounds[1] > 0] for name, items in work.items()}  # nothing to time for none


def _units(items: list[Item]) -> list[Unit]:
    """The units to time for ``items``: per kind, at the batch that carries most of its sequences, the narrowest
    and the widest width (the others are read off the line through them and scaled to their batch), and every
    fit unit as it is. Few units keep the calibration to seconds; the objective's unmodified loss is priced as
    a changed one (capture's path costs a few percent more, on a pass or two a stage)."""
    timed = [item.unit for item in items if item.unit.kind not in KINDS]
    carried: dict[tuple[str, bool], dict[int, float]] = {}
    widths: dict[tuple[str, bool], set[int]] = {}
    for item in (i for i in items if i.unit.kind in KINDS):
        key = (priced_as(item.unit.kind), item.unit.per_query)
        carried.setdefault(key, {}).setdefault(item.unit.batch, 0.0)
        carried[key][item.unit.batch] += item.count * item.unit.batch
        widths.setdefault(key, set()).add(item.unit.width)
    for (kind, per_query), by_batch in carried.items():
        batch = max(by_batch, key=lambda size: (by_batch[size], size))
        timed += [
            Unit(kind, batch, width, per_query) for width in sorted({min(widths[kind, per_query]), max(widths[kind, per_query])})
        ]
    return timed


def _widths(work: dict[str, list[Item]]) -> list[int]:
    return [item.unit.width for items in work.values() for item in items]
