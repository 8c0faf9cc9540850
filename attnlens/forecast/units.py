"""What one unit of a report's work costs on this model and this machine, timed by running it once.

A unit is one batch of one kind of pass at one shape (:class:`Unit`): the model's forward with
and without a change inside attention, a training step, one batch folded into moments. Each is
timed by the code the stages run (the objective, the task's pooled features, :class:`Capture`,
:func:`compute_moments`), on real corpus tokens, at the precision the stages judge at; so a
model 10× the size, a causal model's per-query moments or a slower machine show in the seconds,
not in a constant measured elsewhere. Task batches come in many widths (bucketed by length): a
kind is timed at two widths and read off the line through them (:meth:`Calibration.seconds`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel
from attnlens.models.precision import judging

KINDS = ("features", "judged", "objective", "changed", "step", "train", "screen", "moments", "scores")
# features: the model without its head, unmodified (a task's pooled features);
# judged: the same with a change inside attention (a task judging a change: capture's path);
# objective: the objective's loss of a batch of blocks, unmodified (a language model's head included);
# changed: the same with a change inside attention (the proxy judging a change);
# step: a changed objective and its backward to a mask (DAM's steps, the gradients, a swap search's gradient);
# train: the same with the weights' gradients too (a fine-tune's step);
# screen: the model without its head, a gate on every layer's scores, and the backward to the gates (the plan's
#   head screen, a forward and a backward per class of the task: priced as that many of these);
# moments: one batch of blocks folded into the moments (pooled; per_query: one row per query);
# scores: a forward that records every layer's scores (the held-out rows a map is measured on).


_TIMED: dict[tuple[tuple[str, str, str], Unit], float] = {}  # (weights, device, precision), unit -> seconds, this process


@dataclass(frozen=True, order=True)
class Unit:
    """One batch of ``kind`` at ``batch`` × ``width`` tokens (``per_query``: moments kept per query)."""

    kind: str
    batch: int
    width: int
    per_query: bool = False


@dataclass
class Calibration:
    """Seconds of each :class:`Unit` on one model, as timed (:meth:`measure`) or given (tests, a saved forecast)."""

    seconds_of: dict[Unit, float] = field(default_factory=dict)
    timed_s: float = 0.0  # how long the timing took

    @classmethod
    def measure(
        cls, model: LoadedModel, units: Iterable[Unit], blocks: np.ndarray, precision: str = "float32", *, new_shapes: bool = True
    ) -> Calibration:
        """Each of ``units`` timed on ``model`` (after one untimed pass of each kind), on token ids from
        ``blocks`` (rows of a corpus's blocks at least as wide as any unit); the maps' fits by :func:`time_fits`.
        A unit timed before in this process on the same weights is not timed again (a notebook's second report).
        Without ``new_shapes`` a unit whose kind was timed before at another shape is read off those
        (:meth:`seconds`), not timed: the budget's search prices dozens of sizes in a second, not a minute."""
        began, seconds = time.perf_counter(), {}
        model_key = (model.weights_sha256(), str(model.device), precision)
        asked = set(units)
        mine = {unit: value for (key, unit), value in _TIMED.items() if key == model_key}
        kinds = {(unit.kind, unit.per_query) for unit in mine}
        wanted = sorted(
            (u for u in asked if new_shapes or (priced_as(u.kind), u.per_query) not in kinds),
            key=lambda u: (u.kind, -u.batch * u.width),
        )  # a kind's largest first: it warms the kind
        known = mine if not new_shapes else {unit: value for unit, value in mine.items() if unit in asked}
        warmed: set[str] = set()
        for unit in (u for u in wanted if u.kind in KINDS and u not in known):
            if unit.kind not in warmed:  # a kind's first call pays one-off costs (allocations, lazy set-up): on a small batch
                _runner(model, Unit(unit.kind, 2, min(unit.width, 16), unit.per_query), blocks, precision)()
                warmed.add(unit.kind)
            seconds[unit] = _best_of(_runner(model, unit, blocks, precision))
        fits = [u for u in wanted if u.kind not in KINDS]  # timed together per width and row mode: a group with any unit new
        stale = {(u.width, u.per_query) for u in fits if u not in known}
        seconds.update(_fits(model, [u for u in fits if (u.width, u.per_query) in stale]))
        _TIMED.update({(model_key, unit): value for unit, value in seconds.items()})
        return cls({**known, **seconds}, time.perf_counter() - began)

    def seconds(self, unit: Unit) -> float:
        """``unit``'s seconds: timed, or for a width between two timed ones of its kind and batch, read off
        the line through them (a forward costs a fixed part and a part per token), scaled to its batch."""
        if unit in self.seconds_of:
            return self.seconds_of[unit]
        kind = priced_as(unit.kind)
        same = sorted(
            (u for u in self.seconds_of if (u.kind, u.per_query) == (kind, unit.per_query)),
            key=lambda u: (abs(u.batch - unit.batch), u.width),
        )
        assert same, f"no {unit.kind} unit was timed"
        batch = same[0].batch
        points = sorted((u.width, self.seconds_of[u]) for u in same if u.batch == batch)
        widths, values = np.array([w for w, _ in points], float), np.array([v for _, v in points])
        if len(points) == 1:
            at = values[0] * unit.width / widths[0]
        else:  # the line through the two nearest timed widths (extrapolated past the ends)
            nearest = np.argsort(np.abs(widths - unit.width))[:2]
            (w0, w1), (v0, v1) = widths[nearest], values[nearest]
            at = v0 + (v1 - v0) * (unit.width - w0) / (w1 - w0)
        return max(float(at), 0.0) * unit.batch / batch

    def to_dict(self) -> dict[str, float]:
        return {
            f"{u.kind}{'/per-query' if u.per_query else ''} {u.batch}x{u.width}": s for u, s in sorted(self.seconds_of.items())
        }


def priced_as(kind: str) -> str:
    """The kind a unit is timed as: the objective's unmodified loss as a changed pass (see forecast._units)."""
    return "changed" if kind == "objective" else kind


def _best_of(run: Callable[[], object], budget: float = 0.5, tries: int = 3) -> float:
    """The least of up to ``tries`` timings of ``run``, as many as fit in ``budget`` seconds (at least one):
    the least is the one a busy machine disturbed least."""
    times: list[float] = []
    while len(times) < tries and (not times or sum(times) + times[-1] <= budget):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _fits(model: LoadedModel, units: list[Unit]) -> dict[Unit, float]:
    """The seconds of the reconstruction's fit units (``order …``, ``fit …``, ``measure``), timed by :func:`time_fits`
    at each width and row mode they come in."""
    from attnlens.forecast.fits import time_fits
    from attnlens.rows.sources import model_pairs

    seconds: dict[Unit, float] = {}
    for n, per_query in sorted({(u.width, u.per_query) for u in units}):
        mine = [u for u in units if (u.width, u.per_query) == (n, per_query)]
        configs = [u.kind.split()[1:] for u in mine if u.kind.startswith("fit ")]
        if not configs:
            continue
        strategies, scopes = sorted({c[0] for c in configs}), sorted({c[1] for c in configs})
        ks = sorted({u.batch for u in mine if u.kind.startswith("fit ")})
        pairs = model_pairs(model, n)
        valid = min(
            pairs.values(), key=lambda layer: int(layer.sum())
        )  # the layer with the fewest keys: a window where there is one
        batch = max((u.batch for u in mine if u.kind == "measure"), default=16)
        times = time_fits(model.num_heads, n, torch.from_numpy(np.asarray(valid)), per_query, strategies, scopes, ks, batch)
        for unit in mine:
            kind, *config = unit.kind.split()
            if kind == "order":
                seconds[unit] = times.order[config[0], config[1]]
            elif kind == "fit":
                seconds[unit] = times.config(config[0], config[1], unit.batch)
            else:
                seconds[unit] = times.measure * unit.batch / batch
    return seconds


def _runner(model: LoadedModel, unit: Unit, blocks: np.ndarray, precision: str) -> Callable[[], object]:
    """A function that runs ``unit`` once on ``model``."""
    from attnlens.analysis.objectives import Objective

    ids = torch.from_numpy(blocks[np.resize(np.arange(len(blocks)), unit.batch), : unit.width]).to(model.device)
    if unit.kind == "moments":
        return lambda: _moments(model, ids.cpu().numpy(), unit.per_query)
    if unit.kind == "scores":
        return lambda: _no_grad(lambda: model.forward(ids), Capture())
    if unit.kind in ("features", "judged"):
        return lambda: _no_grad(lambda: _features(model, ids, precision), _change(unit.kind == "judged"))
    if unit.kind == "screen":
        return lambda: _gated_backward(model, lambda: _features(model, ids, precision))
    objective = Objective(model, precision=precision)
    batch = objective.prepare(ids)
    if unit.kind in ("step", "train"):
        return lambda: _step(objective, batch, weights=unit.kind == "train")
    return lambda: _no_grad(lambda: objective.evaluate(batch), _change(unit.kind == "changed"))


def _change(changed: bool) -> contextlib.AbstractContextManager:
    """A change inside attention that changes nothing (it takes capture's path, as every judged change does)."""
    return Capture(intervene=lambda layer, scores, valid: None, record=False) if changed else contextlib.nullcontext()


def _no_grad(run: Callable[[], object], inside: contextlib.AbstractContextManager) -> object:
    with torch.no_grad(), inside:
        return run()


def _features(model: LoadedModel, ids: torch.Tensor, precision: str) -> torch.Tensor:
    with judging(precision, model.device):
        return model.backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def _step(objective, batch, weights: bool) -> None:
    """The objective with a learnable gate on every layer's scores, and the backward to the gates alone, the
    weights frozen (a mask's step; gradient importance's pass), or with ``weights`` to theirs too (a fine-tune's
    step; the gradients are dropped after, so the model is left as it was)."""
    _gated_backward(objective.model, lambda: objective.evaluate(batch)["loss"], weights)


def _gated_backward(model: LoadedModel, output: Callable[[], torch.Tensor], weights: bool = False) -> None:
    """``output()`` with a learnable gate on every layer's scores, and one backward of its sum to the gates (and,
    with ``weights``, to the weights, whose gradients are dropped after): a mask's step, a fine-tune's, or with
    the backbone's features the plan's head screen (:mod:`attnlens.analysis.plan.screen`)."""
    from attnlens.analysis.evaluation import frozen

    gates = torch.ones(model.num_layers, device=model.device, requires_grad=True)
    with contextlib.nullcontext() if weights else frozen(model.model), torch.enable_grad():
        with Capture(intervene=lambda layer, scores, valid: scores * gates[layer], record=False):
            value = output()
        value.float().sum().backward()
    model.model.zero_grad(set_to_none=True)


def _moments(model: LoadedModel, ids: np.ndarray, per_query: bool) -> None:
    """One batch folded into the moments as :func:`~attnlens.rows.accumulate.compute_moments` folds it
    (its check of enough blocks for per-query moments aside: the forecast times one batch)."""
    from attnlens.data.corpus import Blocks
    from attnlens.rows.accumulate import UnitSums, accumulate_rows
    from attnlens.rows.sources import ModelRows

    rows = ModelRows(model, Blocks(ids, np.arange(len(ids)), len(ids)))
    n = ids.shape[1]
    units = [(layer, head) for layer in rows.layers for head in range(model.num_heads)]
    queries = tuple(range(n)) if per_query else None
    sums = UnitSums(units, n=n, num_heads=model.num_heads, quantity="scores", queries=queries, device=model.device)
    accumulate_rows(rows, sums, np.arange(len(ids)), np.zeros(len(ids), dtype=np.int64), batch_size=len(ids))


def probe_seconds(examples: int, hidden: int) -> float:
    """Seconds :func:`~attnlens.analysis.task.probe.choose_c` takes on ``examples`` features of ``hidden`` numbers
    (its cross-validation over every C): timed once per shape in this process, on random features with a linear
    label (the solver's iterations, not the numbers, set the time)."""
    from attnlens.analysis.task.probe import choose_c

    key = (("probe", "", ""), Unit("probe", examples, hidden))
    if key not in _TIMED:
        rng = np.random.default_rng(0)
        features = rng.standard_normal((examples, hidden)).astype(np.float32)
        labels = (features @ rng.standard_normal(hidden) + 3 * rng.standard_normal(examples) > 0).astype(np.int64)
        start = time.perf_counter()
        choose_c(features, labels)
        _TIMED[key] = time.perf_counter() - start
    return _TIMED[key]
