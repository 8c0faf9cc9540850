"""Which overlap matrices a result holds: within each eigen result (its layers, its heads) and between
each pair of them (layers, heads, the whole models), each named, with the level of its units and the two
results it compares (:class:`Comparison`), recorded in an overlap result's ``meta["comparisons"]``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Comparison:
    """One overlap matrix: ``name``, the stem of its arrays (``<name>_overlap``, ``_angles``,
    ``_curve``) and its rows' ``comparison`` in the tables; ``level``, its units ("layer",
    "head" or "model"); ``result_a`` and ``result_b``, the eigen results (indices into
    ``meta["models"]``) of its rows and its columns, equal for a matrix within one result."""

    name: str
    level: str
    result_a: int
    result_b: int

    @property
    def within(self) -> bool:
        """Whether the matrix compares the units of one result with each other."""
        return self.result_a == self.result_b


def comparisons(count: int) -> list[Comparison]:
    """Every matrix of ``count`` eigen results: within each result, then between each pair.

    >>> [c.name for c in comparisons(2)]
    ['layers_0', 'heads_0', 'layers_0_1', 'heads_0_1', 'model_0_1', 'layers_1', 'heads_1']
    >>> comparisons(2)[2]
    Comparison(name='layers_0_1', level='layer', result_a=0, result_b=1)
    """
    comparisons = []
    for i in range(count):
        comparisons += [Comparison(f"layers_{i}", "layer", i, i), Comparison(f"heads_{i}", "head", i, i)]
        for j in range(i + 1, count):
            comparisons += [
                Comparison(f"layers_{i}_{j}", "layer", i, j),
                Comparison(f"heads_{i}_{j}", "head", i, j),
                Comparison(f"model_{i}_{j}", "model", i, j),
            ]
    return comparisons


def comparisons_of_old_layout(models: int, arrays: Mapping[str, np.ndarray]) -> list[Comparison]:
    """The comparisons of an overlap result saved before ``meta["comparisons"]`` was recorded (the
    old layout): its matrices were named by the rule :func:`comparisons` still follows for its
    ``models`` eigen results, so they are that list, less any matrix whose arrays it lacks.

    >>> old = {"layers_0_overlap": np.eye(2), "heads_0_overlap": np.eye(4)}
    >>> [c.name for c in comparisons_of_old_layout(1, old)]
    ['layers_0', 'heads_0']
    """
    return [comparison for comparison in comparisons(models) if f"{comparison.name}_overlap" in arrays]
