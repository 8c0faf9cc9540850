"""What each choice costs in seconds on this machine: a timing table, measured once and cached.

With ``cost="seconds"`` a plan spends measured time instead of FLOPs. For the model's
geometry (query heads H, key heads, head dimension, causal) at width n, batch 1, in float32
on the plan's device, one attention layer is timed with all H heads under each choice,
through ``"attnlens-kernels"`` (:mod:`attnlens.models.kernels`, the path a plan runs on for
speed), best of ``repeats`` calls after a warm-up; a head's price is that time over H:

- **exact**: one sdpa call (causal through sdpa's own causal path where the layer's mask is
  plain causal);
- **partial(k)**: the partial path with maps of the right shape (time does not depend on
  their values);
- **window(w)**: timed twice, through compiled FlexAttention and through sdpa with the mask;
  the faster kernel is the window's (``kernels``), and is the one the plan runs.

A model whose layers differ in their own mask (gemma3's sliding-window layers beside its
full ones) gets one table per kind of layer (:func:`layer_spans`): exact attention under a
sliding window's mask costs sdpa the full n × n, while a plain causal layer takes sdpa's
causal path, so a window can save time in the one and not in the other.

Prices add over heads: the table's sum predicts a plan's attention time, not its whole
forward (``bench/bench_plan_seconds.py`` measures the model under the plan against sdpa).
The table is kept in the cache (``timings/``), keyed by the processor, the thread count, the
torch version, the device, the geometry, n and the choices, so that a second plan on the
same machine does not time again.

>>> from attnlens.analysis.plan.choices import Choice
>>> table = measure(Geometry(heads=2, kv_heads=1, head_dim=8, causal=True), n=16,
...                 choices=[Choice("window", 4)], repeats=1, flex=False, cached=False)
>>> sorted(table.seconds["all"]), table.kernels
(['exact', 'window(4)'], {'all': {'window(4)': 'sdpa'}})
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlens.analysis.plan.choices import EXACT, Choice, window_keep
from attnlens.errors import BadInput
from attnlens.models.cache import cached_array
from attnlens.models.kernels import kernel_attention
from attnlens.models.loading import LoadedModel
from attnlens.models.partial import LayerPlan, MaskedHeads, PartialHeads, set_plan

TABLE_VERSION = 1  # bump when what is timed changes: older tables are measured again


@dataclass(frozen=True)
class Geometry:
    """One model's attention shapes: query heads, key heads, head dimension, causal, and each layer's own
    span (``spans``: the keys a query sees at most this far away in the model's own mask, a sliding
    window; ``None``: every key)."""

    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    spans: tuple[int | None, ...] = (None,)

    @classmethod
    def of(cls, model: LoadedModel) -> Geometry:
        return cls(model.num_heads, model.num_kv_heads, model.head_dim, model.causal, layer_spans(model))


def layer_spans(model: LoadedModel) -> tuple[int | None, ...]:
    """Each layer's own span, read from the model's config as transformers reads it: a layer typed
    ``"sliding_attention"`` sees the ``sliding_window`` keys up to its query (a span of ``sliding_window``
    − 1 positions), any other layer every key.

    >>> from attnlens import load_model
    >>> layer_spans(load_model("minilm-l3"))
    (None, None, None)
    """
    from transformers import PretrainedConfig

    own = model.model.config
    config = own.get_text_config() if isinstance(own, PretrainedConfig) else own  # a multimodal model's text layers
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * model.num_layers
    window = getattr(config, "sliding_window", None)
    return tuple(window - 1 if kind == "sliding_attention" and window else None for kind in kinds)


def span_name(span: int | None) -> str:
    return "all" if span is None else f"within {span}"


@dataclass(frozen=True)
class Timings:
    """Seconds per head and call of each choice (``seconds``) and the kernel each window runs on
    (``kernels``), both by the layers' own span (:func:`span_name`), the span of each layer
    (``spans``), and the machine they were measured on; JSON-ready (:meth:`describe`, :meth:`read`)."""

    spans: tuple[int | None, ...]
    seconds: dict[str, dict[str, float]]
    kernels: dict[str, dict[str, str]]
    machine: dict[str, Any]

    def price(self, layer: int, choice: Choice) -> float:
        """Seconds per call of one head of ``layer`` under ``choice``."""
        return self.seconds[span_name(self.spans[layer])][str(choice)]

    def kernels_of(self, layer: int) -> dict[str, str]:
        """The kernel each window runs on in ``layer``, by the window's name."""
        return self.kernels[span_name(self.spans[layer])]

    def describe(self) -> dict[str, Any]:
        return {
            "spans": list(self.spans),
            "seconds_per_head": self.seconds,
            "window_kernels": self.kernels,
            "machine": self.machine,
        }

    @classmethod
    def read(cls, described: dict[str, Any]) -> Timings:
        return cls(tuple(described["spans"]), described["seconds_per_head"], described["window_kernels"], described["machine"])


def machine() -> dict[str, Any]:
    """What a timing depends on besides the shapes: processor, threads, torch."""
    processor = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        processor = names[0] if names else processor
    except OSError:
        pass
    return {"processor": processor, "threads": torch.get_num_threads(), "torch": torch.__version__}


def measure(
    geometry: Geometry,
    n: int,
    choices: list[Choice],
    *,
    device: str = "cpu",
    repeats: int = 5,
    flex: bool = True,
    cached: bool = True,
) -> Timings:
    """The timing table of ``choices`` (and exact) at width ``n``, for each of the layers' own spans;
    see the module docstring. ``flex=False`` times windows through sdpa only; ``cached=False`` neither
    reads nor keeps the table."""
    where = {**machine(), "device": device}
    everything = [EXACT, *choices]
    seconds, kernels = {}, {}
    for span in sorted(set(geometry.spans), key=lambda span: -1 if span is None else span):
        shapes = [vars(geometry) | {"spans": span}, n, [str(c) for c in choices], repeats, flex]
        key = hashlib.sha256(json.dumps([TABLE_VERSION, where, *shapes], sort_keys=True).encode()).hexdigest()[:24]

        def compute(span: int | None = span) -> np.ndarray:
            return _timed(geometry, span, n, everything, device, repeats, flex)

        table = cached_array("timings", key, compute) if cached else compute()
        faster = np.isfinite(table[:, 1]) & (table[:, 1] < table[:, 0])  # FlexAttention where it ran and won
        name = span_name(span)
        seconds[name] = {str(c): float(table[row, 1 if faster[row] else 0]) for row, c in enumerate(everything)}
        kernels[name] = {str(c): "flex" if faster[row] else "sdpa" for row, c in enumerate(everything) if c.kind == "window"}
    return Timings(geometry.spans, seconds, kernels, where)


def _timed(
    geometry: Geometry, span: int | None, n: int, choices: list[Choice], device: str, repeats: int, flex: bool
) -> np.ndarray:
    """(choices, 2): each choice's seconds per head in a layer of own ``span``, through sdpa or its own
    path, and through FlexAttention (windows with ``flex`` only; NaN otherwise or where it cannot run)."""
    g, generator = geometry, torch.Generator().manual_seed(0)
    query = torch.randn(1, g.heads, n, g.head_dim, generator=generator).to(device)
    key, value = (torch.randn(1, g.kv_heads, n, g.head_dim, generator=generator).to(device) for _ in range(2))
    mask = _layer_mask(n, span, g.causal, device)
    table = np.full((len(choices), 2), np.nan)
    heads = list(range(g.heads))
    for row, choice in enumerate(choices):
        if choice.kind == "window":
            keep = choice.keep(n, g.causal)
            table[row, 0] = _seconds(LayerPlan(n, masked=[MaskedHeads(heads, keep, "sdpa")]), query, key, value, mask, repeats)
            if flex:
                table[row, 1] = _flex_seconds(
                    LayerPlan(n, masked=[MaskedHeads(heads, keep, "flex")]), query, key, value, mask, repeats
                )
        else:
            plan = LayerPlan(n, partial=[_random_maps(g, n, choice.size, generator)]) if choice.kind == "partial" else None
            table[row, 0] = _seconds(plan, query, key, value, mask, repeats)
    if not np.isfinite(table[0, 0]) or table[0, 0] <= 0:
        raise BadInput(
            f"no timing table can be measured on this machine (exact attention timed at {table[0, 0]} s); use --cost flops"
        )
    return table / g.heads


def _layer_mask(n: int, span: int | None, causal: bool, device: str) -> torch.Tensor | None:
    """The boolean (1, 1, n, n) mask a layer of own ``span`` is given (``None``: an encoder's full attention)."""
    if span is None and not causal:
        return None
    keep = window_keep(n, n if span is None else span, causal)
    return keep[None, None].to(device)


def _seconds(plan: LayerPlan | None, query, key, value, mask, repeats: int) -> float:
    """Best wall time of ``repeats`` calls of one layer through ``"attnlens-kernels"``, after a warm-up."""
    module = nn.Module().eval()
    set_plan(module, plan)
    with torch.no_grad():
        kernel_attention(module, query, key, value, mask)
        best = np.inf
        for _ in range(repeats):
            _synchronise(query.device)
            start = time.perf_counter()
            kernel_attention(module, query, key, value, mask)
            _synchronise(query.device)
            best = min(best, time.perf_counter() - start)
    return best


def _flex_seconds(plan: LayerPlan, query, key, value, mask, repeats: int) -> float:
    """As :func:`_seconds`, NaN where FlexAttention cannot be compiled here (no C++ compiler, say)."""
    try:
        return _seconds(plan, query, key, value, mask, repeats)
    except Exception:  # noqa: BLE001 -- any compile failure means "not on this machine": the window runs on sdpa
        return float("nan")


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _random_maps(g: Geometry, n: int, k: int, generator: torch.Generator) -> PartialHeads:
    """Maps of a partial layer's shapes (one per head, per query for causal models), random values."""
    queries = n if g.causal else 1
    positions = torch.randint(0, n, (g.heads, queries, k), generator=generator)
    if g.causal:  # a causal query's keys are at or before it
        positions = torch.minimum(positions, torch.arange(n)[None, :, None])
    weights = torch.randn(g.heads, queries, n, k, generator=generator) / k**0.5
    return PartialHeads(list(range(g.heads)), positions, weights, torch.zeros(g.heads, queries, n))
