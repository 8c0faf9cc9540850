"""From per-head choices to what runs: the maps of partial heads, the layer plans, the change.

An **assignment** maps ``(layer, head)`` to a :class:`~attnlens.analysis.plan.choices.Choice`
(heads it leaves out are exact). :class:`MapBank` fits the closed-form maps of partial heads
(greedy keys, one map per head, per query position for causal models) from the fitting
blocks' moments, once per (layer, k). :func:`layer_plans` groups a layer's heads by choice into
a :class:`~attnlens.models.partial.LayerPlan`, which runs two ways: through
``"attnlens-partial"`` (:func:`~attnlens.models.partial.planned`, computing only what the plan
asks), or as a capture intervention (:func:`plan_change`, the plug-in path the analyses judge
with).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from attnlens.analysis.changes import FixedChange
from attnlens.analysis.plan.choices import Assignment, Choice
from attnlens.analysis.reconstruct import LayerMaps, MapFitter
from attnlens.models.partial import LayerPlan, MaskedHeads, PartialHeads


class MapBank:
    """Each layer's greedy per-head maps at each k, fitted once from ``fitter`` (float32, as they run);
    ``None`` where no choice is partial, so none is ever asked for."""

    def __init__(self, fitter: MapFitter | None) -> None:
        self.fitter = fitter
        self._maps: dict[tuple[int, int], LayerMaps] = {}

    def maps(self, layer: int, k: int) -> LayerMaps:
        if (layer, k) not in self._maps:
            assert self.fitter is not None, "only a partial choice has maps, and a plan with one fits them"
            maps, _ = self.fitter.layer_maps("greedy", "head", k, layer)
            self._maps[layer, k] = LayerMaps(maps.positions, maps.weights.float(), maps.offset.float())
        return self._maps[layer, k]

    def heads(self, layer: int, k: int, heads: list[int]) -> PartialHeads:
        maps = self.maps(layer, k)
        return PartialHeads(heads, maps.positions[heads], maps.weights[heads], maps.offset[heads])


def layer_plans(
    assignment: Assignment, bank: MapBank | SavedMaps, n: int, causal: bool, kernels: dict[int, dict[str, str]] | None = None
) -> dict[int, LayerPlan]:
    """One :class:`LayerPlan` per layer with a head that is not exact; ``kernels``: per layer, the kernel
    each window runs on under ``"attnlens-kernels"`` (by the choice's name; sdpa where none is named)."""
    kernels = kernels or {}
    grouped: dict[int, dict[Choice, list[int]]] = defaultdict(lambda: defaultdict(list))
    for (layer, head), choice in sorted(assignment.items()):
        if choice.kind != "exact":
            grouped[layer][choice].append(head)
    plans = {}
    for layer, groups in grouped.items():
        plans[layer] = LayerPlan(
            n=n,
            partial=[bank.heads(layer, c.size, heads) for c, heads in groups.items() if c.kind == "partial"],
            masked=[
                MaskedHeads(heads, c.keep(n, causal), kernels.get(layer, {}).get(str(c), "sdpa"))
                for c, heads in groups.items()
                if c.kind == "window"
            ],
        )
    return plans


def plan_change(plans: dict[int, LayerPlan], key: str) -> FixedChange:
    """The plans as a :class:`~attnlens.analysis.changes.Change` (the plug-in path: every score
    computed, then replaced), for the judges that take changes."""
    return FixedChange(key, lambda layer, scores, valid: plans[layer].replace(scores), sorted(plans))


EXACT_KEY = "plan/exact"  # the key of an assignment that leaves every head exact


def assignment_key(assignment: Assignment) -> str:
    """A short stable name for an assignment (its non-exact choices).

    >>> assignment_key({}) == EXACT_KEY, assignment_key({(1, 0): Choice("window", 2)})
    (True, 'plan/1.0=window(2)')
    """
    chosen = sorted((layer, head, str(choice)) for (layer, head), choice in assignment.items() if choice.kind != "exact")
    return "plan/" + ";".join(f"{layer}.{head}={choice}" for layer, head, choice in chosen) if chosen else EXACT_KEY


def saved_maps(bank: MapBank | SavedMaps, units: set[tuple[int, int, int]]) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The maps of ``units`` (layer, head, k), padded to one k and stacked for saving: rows
    (layer, head, k) and arrays ``positions`` (U, Q, K), ``weights`` (U, Q, n, K), ``offset`` (U, Q, n)."""
    rows, parts = [], []
    for layer, head, k in sorted(units):
        rows.append({"layer": layer, "head": head, "k": k})
        parts.append(bank.heads(layer, k, [head]))
    if not parts:
        return [], {}
    width = max(part.positions.shape[-1] for part in parts)

    def stacked(name: str, pad: int) -> np.ndarray:
        tensors = [getattr(part, name)[0] for part in parts]
        return torch.stack([torch.nn.functional.pad(t, (0, width - t.shape[-1]) if pad else (0, 0)) for t in tensors]).numpy()

    return rows, {"positions": stacked("positions", 1), "weights": stacked("weights", 1), "offset": stacked("offset", 0)}


class SavedMaps:
    """The maps :func:`saved_maps` stacked, read back: the same :meth:`heads` as :class:`MapBank`."""

    def __init__(self, rows: list[dict], arrays: dict[str, np.ndarray]) -> None:
        self.index = {(row["layer"], row["head"], row["k"]): i for i, row in enumerate(rows)}
        self.arrays = {name: torch.from_numpy(np.array(value)) for name, value in arrays.items()}

    def heads(self, layer: int, k: int, heads: list[int]) -> PartialHeads:
        units = [self.index[layer, head, k] for head in heads]  # each unit cut back to its own k
        return PartialHeads(
            heads,
            self.arrays["positions"][units, ..., :k],
            self.arrays["weights"][units, ..., :k],
            self.arrays["offset"][units],
        )
