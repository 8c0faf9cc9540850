"""Memory budgets: what moment sums cost, and how to split (layer, head) units so each
process stays under ``--max-memory``.

The sums of one (layer, head) **unit** are, for each of the two split halves, a row
count, per-key counts, Σx (n) and Σxxᵀ (n × n) per query unit (one when rows are
pooled, ``Q`` per query position). At n = 4096 that is 268 MB per unit in float64, and
a 32 × 32-head model has 1,024 units: no single process holds them all. The plan
divides the units into **groups** small enough for the budget; each group must see all
the data once. ``groups_per_pass`` groups run side by side (the ranks split into that
many teams, each team splitting the data among its members), and ``passes`` such
rounds run one after another until every group is done. It picks the fewest groups
(the forward passes over the corpus are repeated once per group), then the fewest
passes.

>>> cost = MomentsCost(n=128, queries=None, accumulate="float64", batch_size=8)
>>> format_bytes(cost.unit_bytes)
'266.3 kB'
>>> plan = plan_units([(layer, head) for layer in range(6) for head in range(12)], cost,
...                   budget=parse_bytes("8MB"), world_size=2)
>>> plan.passes, plan.groups_per_pass, plan.max_group_units   # 6 groups of 12 units: 2 teams, 3 passes
(3, 2, 12)
>>> plan_units([(0, 0)], cost, budget=None, world_size=4).passes   # no budget: one group, data-parallel
1
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from attnlens.errors import BadInput
from attnlens.io.ranks import shard_range

_ITEMSIZE = {"float64": 8, "float32": 4}  # bytes per element of the sums, by `accumulate`
ACCUMULATE = tuple(_ITEMSIZE)
# Per-batch working copies of one chunk of heads' rows: the chosen rows in the model's
# dtype, cast to the accumulation dtype, masked, and laid out for the matrix product.
_WORKING_COPIES = 4
# Share of the budget that per-batch working memory may take before heads are processed
# in smaller chunks (they are never split below one head).
_WORKING_SHARE = 0.25

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


def parse_bytes(text: str) -> int:
    """A memory size: ``8GB`` (10⁹), ``8GiB`` or ``8G`` (2³⁰), ``512MB``, ``1.5TB``, plain bytes.

    >>> parse_bytes("8GB"), parse_bytes("8GiB"), parse_bytes("1.5 kB"), parse_bytes("4096")
    (8000000000, 8589934592, 1500, 4096)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
        raise BadInput(
            f"`max_memory` '{text}' is not a memory size; write a positive number with a unit, e.g. 8GB, 512MB or 16GiB"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(count: float) -> str:
    """``1234567`` -> ``'1.2 MB'`` (decimal units).

    >>> format_bytes(999), format_bytes(268_435_456)
    ('999 B', '268.4 MB')
    """
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def format_option(count: float) -> str:
    """A size to pass as ``--max-memory``: no space, rounded up.

    >>> format_option(4_212_345), format_option(12.6e9)
    ('4.3MB', '12.6GB')
    """
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= size:
            return f"{math.ceil(count / size * 10 - 1e-9) / 10:g}{unit}"
    return f"{math.ceil(count)}B"


@dataclass(frozen=True)
class MomentsCost:
    """Bytes of moment sums per unit, and working memory per batch, for one setting.

    ``queries`` is ``None`` for rows pooled over queries, else the query positions.
    Counts are always float64 (exact integers up to 2⁵³ rows); Σx and Σxxᵀ are in the
    ``accumulate`` dtype. Pooled rows of a ``causal`` model are one per sequence (the
    only row whose every key is valid), else ``n``.
    """

    n: int
    queries: tuple[int, ...] | None
    accumulate: str
    batch_size: int
    causal: bool = False

    def __post_init__(self) -> None:
        if self.accumulate not in ACCUMULATE:
            raise BadInput(f"`accumulate` {self.accumulate} is unknown; use one of {', '.join(ACCUMULATE)}")

    @property
    def query_units(self) -> int:
        return 1 if self.queries is None else len(self.queries)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.accumulate]

    def unit_bytes_as(self, itemsize: int) -> int:
        n, q = self.n, self.query_units
        return 2 * q * (8 + 8 * n + itemsize * (n + n * n))  # two halves: count, key_count, Σx, Σxxᵀ

    @property
    def unit_bytes(self) -> int:
        """Sums of one (layer, head) unit, both halves."""
        return self.unit_bytes_as(self.itemsize)

    def working_bytes(self, heads: int) -> int:
        """Transient memory to add one batch of ``heads`` heads of one layer: copies of their
        rows, and the Σxxᵀ product before it is added; also bounds the buffer that reduces
        one unit across ranks at the end (always float64)."""
        rows_per_head = self.batch_size * (self.query_units if self.queries is not None else 1 if self.causal else self.n)
        per_head = _WORKING_COPIES * rows_per_head * self.n + self.query_units * self.n * self.n
        return max(heads * per_head * self.itemsize, self.unit_bytes_as(8))

    def head_chunk(self, heads_per_layer: int, budget: int | None) -> int:
        """How many heads of a layer one step processes: all of them without a budget, else
        as many as fit in a quarter of it (at least one)."""
        if budget is None:
            return heads_per_layer
        fitting = [h for h in range(1, heads_per_layer + 1) if self.working_bytes(h) <= _WORKING_SHARE * budget]
        return max(fitting, default=1)


@dataclass(frozen=True)
class Plan:
    """Which units each rank accumulates in each pass, and on which sequences.

    In pass ``p`` rank ``r`` belongs to team ``g = r % groups_per_pass`` and accumulates
    unit group ``p * groups_per_pass + g`` over its share of the sequences (the team's
    members split them with :func:`shard_range`).
    """

    units: tuple[tuple[int, int], ...]
    bounds: tuple[tuple[int, int], ...]  # [start, stop) into units, one per group
    passes: int
    groups_per_pass: int
    world_size: int
    unit_bytes: int
    working_bytes: int
    head_chunk: int
    budget: int | None

    def group_of(self, rank: int, pass_: int) -> int:
        return pass_ * self.groups_per_pass + rank % self.groups_per_pass

    def group_units(self, group: int) -> list[tuple[int, int]]:
        start, stop = self.bounds[group]
        return list(self.units[start:stop])

    def team(self, group: int) -> list[int]:
        """The ranks that accumulate ``group``, in member order."""
        return [rank for rank in range(self.world_size) if rank % self.groups_per_pass == group % self.groups_per_pass]

    def sequences(self, rank: int, num_seqs: int) -> tuple[int, int]:
        """The range of sequence indices rank ``rank`` covers (the same in every pass)."""
        members = self.world_size // self.groups_per_pass
        return shard_range(num_seqs, rank // self.groups_per_pass, members)

    @property
    def max_group_units(self) -> int:
        return max(stop - start for start, stop in self.bounds)

    @property
    def peak_bytes(self) -> int:
        """The most a rank holds at once: its largest group's sums plus working memory."""
        return self.max_group_units * self.unit_bytes + self.working_bytes

    def describe(self) -> dict[str, object]:
        return {
            "passes": self.passes,
            "groups_per_pass": self.groups_per_pass,
            "world_size": self.world_size,
            "units": len(self.units),
            "max_group_units": self.max_group_units,
            "unit_bytes": self.unit_bytes,
            "working_bytes": self.working_bytes,
            "head_chunk": self.head_chunk,
            "budget_bytes": self.budget,
            "peak_bytes": self.peak_bytes,
            "groups": [list(bounds) for bounds in self.bounds],
        }


def plan_units(
    units: list[tuple[int, int]],
    cost: MomentsCost,
    *,
    budget: int | None,
    world_size: int,
    heads_per_layer: int | None = None,
) -> Plan:
    """Split ``units`` into groups that fit ``budget`` bytes per process (see the module docstring).

    Raises :class:`BadInput`, saying what one unit needs, when not even one fits.
    """
    heads_per_layer = heads_per_layer or max(sum(1 for other, _ in units if other == layer) for layer, _ in units)
    chunk = cost.head_chunk(heads_per_layer, budget)
    working = cost.working_bytes(chunk)
    if budget is None:
        capacity = len(units)
    else:
        capacity = (budget - working) // cost.unit_bytes
        if capacity < 1:
            need = cost.unit_bytes + cost.working_bytes(1)
            raise BadInput(
                f"`max_memory` {format_bytes(budget)} is too small: one (layer, head) unit needs {format_bytes(need)} "
                f"({format_bytes(cost.unit_bytes)} of {cost.accumulate} sums for n = {cost.n}, both halves, "
                f"{cost.query_units} query unit(s), plus {format_bytes(cost.working_bytes(1))} working memory per batch of "
                f"{cost.batch_size}); give `max_memory` {format_option(need)} or more, or use `accumulate` float32, "
                "a smaller `batch_size` or fewer `queries`"
            )
    passes, per_pass = _passes(len(units), min(capacity, len(units)), world_size)
    groups = passes * per_pass
    sizes = [len(units) // groups + (1 if index < len(units) % groups else 0) for index in range(groups)]
    starts = [sum(sizes[:index]) for index in range(groups)]
    return Plan(
        units=tuple(units),
        bounds=tuple((start, start + size) for start, size in zip(starts, sizes)),
        passes=passes,
        groups_per_pass=per_pass,
        world_size=world_size,
        unit_bytes=cost.unit_bytes,
        working_bytes=working,
        head_chunk=chunk,
        budget=budget,
    )


def _passes(num_units: int, capacity: int, world_size: int) -> tuple[int, int]:
    """(passes, groups per pass): fewest groups ``passes * per_pass`` of at most
    ``capacity`` units, ``per_pass`` dividing the world size; then fewest passes.

    >>> _passes(1024, 149, 8), _passes(72, 72, 2), _passes(3, 1, 8), _passes(10, 3, 1)
    ((7, 1), (1, 1), (3, 1), (4, 1))
    """
    least = math.ceil(num_units / capacity)
    options = []
    for per_pass in (d for d in range(1, world_size + 1) if world_size % d == 0):
        passes = math.ceil(least / per_pass)
        if passes * per_pass <= num_units:  # no empty group
            options.append((passes * per_pass, passes, per_pass))
    _, passes, per_pass = min(options)
    return passes, per_pass
