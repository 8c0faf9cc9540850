"""The report sized to the time a user gives it (``attnlens report --budget 10m``), on their model and machine.

The sizes come from the forecast (:mod:`attnlens.forecast`): each candidate's work is counted and priced
by the units already timed on the model (the preset's shapes at its largest and its smallest sizes; a
shape between is read off its kind's timed ones), so trying a size costs a fraction of a second, not a run
(timing each size's shapes had taken 37 s of gemma3-270m's 95 before its first stage).

- **The preset.** The largest of the quick, default and full presets whose forecast fits (each forecast
  only when the one before it fits, so a large model times only the quick preset's units).
- **Its levers**, in the order they are cut (:data:`LEVERS`): the examples each task judgement may use
  (its pool, judged sequentially: from 4,000 down to 64), the blocks every stage runs (down to a quarter
  of the preset's), the seeds of DAM's masks (down to one) and DAM's training steps (down to twice its
  stopping window). The pools go first: a judgement that decides early never uses its pool's end, and
  one left undecided says how many examples more it needs and what budget gives them. Each lever is set
  to the largest size that fits with the levers after it at their largest, so a larger budget gives
  back the steps, seeds and blocks first and the pools last.
- **The time it fills.** The forecast's middle fills at most :data:`FILL` of the time left once the
  model has loaded and the units are timed; the forecasts came within ±30% of the actual
  (``bench/bench_report.py``), and a judgement that stops early leaves time unspent.

The sizes chosen are kept in ``result.json`` (the settings, and :class:`Budget`), and
``attnlens report --sizes-from DIR`` makes exactly those settings again on any machine. With the sizes,
the budget keeps, for each pool, the least budget that would give it: what deciding a claim the
pool left undecided takes (:mod:`attnlens.report.deciding`).

>>> parse_duration("10m"), parse_duration("1h30m"), parse_duration("90s")
(600.0, 5400.0, 90.0)
>>> from attnlens.report.presets import QUICK
>>> shrunk(QUICK, {"blocks": 0.5, "pools": 288, "seeds": 1, "steps": 1.0}).dam.train_seqs
8
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnlens.analysis.task.settings import AUTO_POOL, task_of
from attnlens.errors import BadInput
from attnlens.report.presets import STAGES, ReportSettings, duration

FILL = 0.9  # the share of the time left that the forecast may fill
# A budget the report suggests covers its own forecast's spread: the units are timed afresh on each run, and
# their prices moved by about 10% from run to run on one machine (a decoder of 135M parameters: 15 and 16.5
# minutes forecast for the same smallest report), so a suggestion of the forecast alone was refused next time.
SPREAD = 1.25
POOLS = (64, 96, 144, 192, 288, 432, 624, 912, 1296, 1872, 2736, AUTO_POOL)  # about ×1.45 a step, as the design's looks
SHARES = (1.0, 0.75, 0.5, 0.35, 0.25)  # of the preset's blocks, and of its steps
LEVERS = ("pools", "blocks", "seeds", "steps")  # the order they are cut
LEAST = {"blocks": SHARES[-1], "pools": POOLS[0], "seeds": 1, "steps": SHARES[-1]}  # the smallest report fit may give
# The blocks each stage runs, and the fewest it is given (its analysis's own least, or a bootstrap's).
BLOCKS = {
    "eigen": {"num_seqs": 16},
    "reconstruct": {"num_seqs": 16},
    "importance": {"num_seqs": 4},
    "dam": {"train_seqs": 4, "eval_seqs": 4},  # a mask learns on one batch of 4 blocks at least, as it is judged on
    "plan": {"fit_seqs": 8, "curve_seqs": 2, "select_seqs": 4, "eval_seqs": 4},
}


@dataclass(frozen=True)
class Budget:
    """The time given (``seconds``), the preset it sized (``base``), each lever's setting (``levers``: the share
    of the blocks and of the steps, each judgement's pool, DAM's seeds; ``None``: the preset's own), the seconds
    spent before the stages (loading, timing the units) and, for each pool, the least budget that gives it."""

    seconds: float
    base: str
    levers: dict[str, Any]
    spent: float
    forecast: float
    pools: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "base": self.base,
            "levers": self.levers,
            "spent_s": self.spent,
            "forecast_s": self.forecast,
            "pools": {str(pool): seconds for pool, seconds in self.pools.items()},
        }

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Budget:
        """A budget as :meth:`to_dict` saved it."""
        pools = {int(pool): seconds for pool, seconds in saved.get("pools", {}).items()}
        return cls(saved["seconds"], saved["base"], saved["levers"], saved["spent_s"], saved["forecast_s"], pools)

    def table(self) -> str:
        """The sizes chosen, in one line, as the report prints them before it starts."""
        levers = self.levers
        pools = "" if levers["pools"] is None else f", each judgement on at most {levers['pools']:,} examples"
        return (
            f"sized to {self.said}: the {self.base} preset with {levers['blocks']:.0%} of its blocks{pools}, "
            f"DAM's masks {levers['seeds']} seed(s) of {levers['steps']:.0%} of its steps; forecast {self.forecast:.0f} s "
            f"after {self.spent:.0f} s loading and timing"
        )

    @property
    def said(self) -> str:
        """``--budget 10m``, as the page and the README name what made a report."""
        return f"--budget {format_duration(self.seconds)}"


def parse_duration(text: str) -> float:
    """``10m``, ``2h``, ``1h30m``, ``90s`` in seconds; anything else is bad input, said in one line."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*", text.lower())
    if not text.strip() or parts is None or not any(parts.groups()):
        raise BadInput(f"--budget '{text}' is not a duration; give hours, minutes or seconds: 10m, 2h, 1h30m, 90s")
    hours, minutes, seconds = (float(part or 0) for part in parts.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise BadInput(f"--budget '{text}' gives no time; give hours, minutes or seconds: 10m, 2h, 1h30m, 90s")
    return total


def format_duration(seconds: float) -> str:
    """The shortest form :func:`parse_duration` reads back: ``10m``, ``2h``, ``1h30m``, ``45s``.

    >>> format_duration(600), format_duration(5400), format_duration(7200), format_duration(45), format_duration(90)
    ('10m', '1h30m', '2h', '45s', '1m30s')
    """
    hours, rest = divmod(round(seconds), 3600)
    minutes, rest = divmod(rest, 60)
    return "".join(f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (rest, "s")) if value) or "0s"


def shrunk(settings: ReportSettings, levers: dict[str, Any]) -> ReportSettings:
    """``settings`` with each lever set: ``blocks`` and ``steps`` a share of the preset's (never below the
    fewest each takes), ``pools`` every judgement sequential on at most that many examples (not the plan's:
    it judges on halves of a fixed count; not a fine-tuned judgement's: its seeds, not its examples, decide),
    ``seeds`` at most that many of DAM's masks."""
    changes: dict[str, dict[str, Any]] = {}
    for stage, fields in BLOCKS.items():
        held = getattr(settings, stage)
        if held is not None:
            given = held.flat()
            changes[stage] = {
                name: min(given[name], max(least, round(given[name] * levers["blocks"]))) for name, least in fields.items()
            }
    for stage in STAGES:
        held = getattr(settings, stage)
        task = task_of(held) if held is not None else None
        if task is not None and stage != "plan" and task.protocol != "finetune" and levers.get("pools") is not None:
            changes[stage] |= {"task_eval": "auto", "task_pool": levers["pools"]}
    dam = settings.dam
    steps = max(2 * dam.stopping.window, round(dam.training.steps * levers["steps"]))
    changes["dam"] |= {"mask_seeds": min(dam.mask.seeds, levers["seeds"]), "steps": min(dam.training.steps, steps)}
    return settings.stages(**changes)


def fit(
    base: str,
    settings: ReportSettings,
    price: Callable[[ReportSettings], float],
    seconds: float,
    spent: float,
    opened: bool,
) -> Budget:
    """The levers for preset ``base`` (``settings``) whose report ``price`` forecasts within the time left of
    ``seconds`` (``spent`` already); ``opened``: its judgements' pools are a lever (a preset that fits at its own
    sizes keeps them). Refused, in one line, where even the smallest sizes do not fit."""
    left = FILL * seconds - spent
    ladders: dict[str, tuple[Any, ...]] = {
        "blocks": SHARES,
        "pools": POOLS[::-1] if opened else (None,),
        "seeds": tuple(range(settings.dam.mask.seeds, 0, -1)),
        "steps": SHARES,
    }
    levers = {lever: ladder[0] for lever, ladder in ladders.items()}
    for lever in LEVERS:
        for value in ladders[lever]:
            levers[lever] = value
            forecast = price(shrunk(settings, levers))
            if forecast <= left:
                pools = _pools(settings, levers, price, spent) if opened else {}
                return Budget(seconds, base, dict(levers), spent, forecast, pools)
    least = forecast  # the last tried: every lever at its least
    raise BadInput(
        f"--budget {format_duration(seconds)} is too short for this model here: the smallest report takes "
        f"{duration(least + spent)} (forecast); give --budget {format_duration(suggested(least, spent))} or more"
    )


def _pools(
    settings: ReportSettings, levers: dict[str, Any], price: Callable[[ReportSettings], float], spent: float
) -> dict[int, float]:
    """For each pool larger than the one chosen, the least budget that gives it (every other lever at the preset's
    size: a larger budget gives them back first)."""
    chosen = levers["pools"]
    given = {"blocks": SHARES[0], "seeds": settings.dam.mask.seeds, "steps": SHARES[0]}
    return {pool: suggested(price(shrunk(settings, {**given, "pools": pool})), spent) for pool in POOLS if pool > chosen}


def suggested(forecast: float, spent: float) -> float:
    """The budget to suggest for a report whose stages are forecast at ``forecast`` seconds, ``spent`` already gone:
    one that fits it with the forecast :data:`SPREAD` times larger, as a rerun's timings may make it, in whole
    minutes (:func:`_rounded`).

    >>> suggested(500.0, 40.0), (500.0 + 40.0) / FILL
    (780.0, 600.0)
    """
    return _rounded((SPREAD * forecast + spent) / FILL)


def _rounded(seconds: float) -> float:
    """A budget to ask for: up to whole minutes, 5 of them past 20 minutes, 15 past 2 hours."""
    step = 60 if seconds <= 1200 else 300 if seconds <= 7200 else 900
    return float(-(-seconds // step) * step)
