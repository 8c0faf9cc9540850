"""Changes to attention, each one object, built once and applied alike to corpus blocks and task batches.

A :class:`Change` has a stable ``key`` (it names the change in caches and tables), the
``layers`` it applies to (``None``: every layer) and :meth:`Change.intervention`, which
gives the capture intervention (:data:`attnlens.models.capture.Intervention`) for one
:class:`Batch`. A batch is what a change may read of the sequences it changes: their
token ids (roles and position classes follow from them) and an ``index`` that seeds the
batch's random draws. Whether the batch holds corpus blocks judged by a proxy objective
or task examples judged by accuracy, the same change removes the same positions of the
same ids (tested for every change kind).

The kinds:

- :class:`Ablation`: one position class removed (``control="class"``), or as many valid
  positions per row chosen at random (``control="random"``), in every layer or one layer,
  every head or one head;
- :class:`MaskChange`: the hard mask ``α > 0`` of a learned mask in any layout
  (:mod:`attnlens.analysis.dam.layouts`);
- :class:`PatternChange`: a fixed sparse pattern (:mod:`attnlens.analysis.patterns`);
- :class:`FixedChange`: an intervention that reads no tokens (a reconstruction map);
- :class:`FunctionChange`: any function of the batch (a user's own change).

Removals follow the one row guard (:func:`attnlens.analysis.evaluation.guard_rows`): a
row that would lose every valid key loses none.

>>> import torch
>>> from attnlens import load_model
>>> model = load_model("minilm-l6")
>>> batch = Batch(torch.tensor([[101, 1999, 1996, 2927, 102]]), model, index=0)
>>> valid = torch.ones(1, 5, 5, dtype=torch.bool)
>>> Ablation("self", ("self", "other")).removed(batch, 0, valid)[0, 0].int().tolist()[:2]
[[1, 0, 0, 0, 0], [0, 1, 0, 0, 0]]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from attnlens.analysis.evaluation import guard_rows
from attnlens.analysis.patterns import PATTERNS, build, removed_mask
from attnlens.data.positions import TokenRoles, chosen_mask, class_masks, reads_scores, token_roles
from attnlens.models.capture import Intervention
from attnlens.models.loading import LoadedModel


class Layout(Protocol):
    """What a learned mask's change reads of its layout (a DAM
    :class:`~attnlens.analysis.dam.layouts.MaskLayout`, named here, not imported: layouts import this module)."""

    @property
    def shared_by_layers(self) -> bool: ...

    def context(self, batch: Batch) -> torch.Tensor: ...

    def expand(self, logits: torch.Tensor, layer: int, context: torch.Tensor) -> torch.Tensor: ...


RANDOM_STREAM = 2  # the random control's keys (importance)
PATTERN_STREAM = 13  # BigBird's random keys (fixed patterns)


def seeded(seed: int, *stream: int) -> int:
    """A seed for one stream of random draws, independent of every other stream of ``seed``.

    >>> seeded(0, 2, 5) == seeded(0, 2, 5) != seeded(0, 2, 6)
    True
    """
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


@dataclass
class Batch:
    """One batch of sequences as a change sees it.

    ``ids`` (batch, n) are the tokens as read (before an objective masks any), ``index``
    seeds the batch's random draws so that a sequence is changed the same way wherever it
    is batched: for corpus blocks the corpus index of the batch's first block, for task
    examples the number of the batch's first example. Task batches draw each class's random
    keys from a stream of its own (``keys_by_class``); corpus batches draw every class's
    keys from one stream. Where ``sequences`` (one number per sequence) is given, each
    sequence's keys are its own draws, seeded by its number, drawn at ``draw_width`` and cut to
    the batch's width: then neither the batch a sequence lands in nor its padding changes
    them (length-bucketed task batches). Roles, class masks and keys are computed once per batch.
    """

    ids: torch.Tensor
    model: LoadedModel
    index: int
    keys_by_class: bool = False
    sequences: list[int] | None = None
    draw_width: int | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def roles(self) -> TokenRoles:
        if "roles" not in self._cache:
            self._cache["roles"] = token_roles(self.ids, self.model)
        return self._cache["roles"]

    def classes(self, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """(batch, n, n) masks of position classes ``names`` (``other``: what the others leave)."""
        key = ("classes", names)
        if key not in self._cache:
            self._cache[key] = class_masks(self.ids, self.model, names, roles=self.roles())
        return self._cache[key]

    def random_keys(self, seed: int, classes: tuple[str, ...], name: str) -> torch.Tensor:
        """(batch, n, n) uniform numbers that choose class ``name``'s random control."""
        if self.sequences is not None:
            return self._own_keys(seed, classes.index(name), self.sequences)
        shape = (*self.ids.shape, self.ids.shape[-1])
        if self.keys_by_class:
            generator = torch.Generator().manual_seed(seeded(seed, RANDOM_STREAM, classes.index(name), self.index))
            return torch.rand(shape, generator=generator).to(self.ids.device)
        key = ("keys", seed, classes)
        if key not in self._cache:
            generator = torch.Generator().manual_seed(seeded(seed, RANDOM_STREAM, self.index))
            self._cache[key] = torch.rand((len(classes), *shape), generator=generator).to(self.ids.device)
        return self._cache[key][classes.index(name)]

    def _own_keys(self, seed: int, number: int, sequences: list[int]) -> torch.Tensor:
        """(batch, n, n) keys of class ``number``: each sequence's own draws at ``draw_width``, cut to n
        (``sequences``: the batch's numbered sequences)."""
        n, width = self.ids.shape[-1], self.draw_width or self.ids.shape[-1]
        keys = [
            torch.rand((width, width), generator=torch.Generator().manual_seed(seeded(seed, RANDOM_STREAM, number, sequence)))
            for sequence in sequences
        ]
        return torch.stack(keys)[:, :n, :n].to(self.ids.device)

    def generator(self, seed: int, stream: int) -> torch.Generator:
        """A generator for this batch's draws of one stream."""
        return torch.Generator().manual_seed(seeded(seed, stream, self.index))

    def own_generator(self, seed: int, stream: int, row: int) -> torch.Generator:
        """A generator for the draws of the batch's sequence ``row`` alone, seeded by its number."""
        assert self.sequences is not None, "only a batch of numbered sequences draws per sequence"
        return torch.Generator().manual_seed(seeded(seed, stream, 0, self.sequences[row]))  # 4 numbers: not a batch's seed


class Change:
    """A change to attention: ``key``, ``layers`` and the intervention for one :class:`Batch`."""

    if TYPE_CHECKING:
        # Every change names itself, with a field or a property. Declared for the type checker
        # alone: a class attribute here would be the default of the dataclass kinds' ``key`` field.

        @property
        def key(self) -> str: ...

    @property
    def layers(self) -> list[int] | None:
        """The layers the change applies to (``None``: every layer); a kind may make it a field."""
        return None

    def intervention(self, batch: Batch) -> Intervention | None:
        raise NotImplementedError

    def trainable(self) -> tuple[Change, list[dict]]:
        """The change as a fine-tune trains it (with the model's weights): a copy with fresh tensors,
        and their optimiser parameter groups. Most changes have nothing to train."""
        return self, []


@dataclass(frozen=True)
class FixedChange(Change):
    """A change that reads no tokens (a reconstruction map, a fixed score edit)."""

    key: str
    intervene: Intervention
    layers: list[int] | None = None

    def intervention(self, batch: Batch) -> Intervention:
        return self.intervene


@dataclass(frozen=True)
class FunctionChange(Change):
    """A change written as a function of the batch (``make(batch) -> intervention``): a user's own."""

    key: str
    make: Callable[[Batch], Intervention | None]
    layers: list[int] | None = None

    def intervention(self, batch: Batch) -> Intervention | None:
        return self.make(batch)


class Removal(Change):
    """A change that removes positions: their scores are set to -inf before softmax.

    Subclasses say what one batch needs (:meth:`prepare`, once per batch) and which
    positions go in one layer (:meth:`remove`, broadcastable to (batch, head, n, n)).
    Layers with equal valid masks share the result.
    """

    @property
    def shared_by_layers(self) -> bool:
        """Whether the positions removed depend on the layer only through its valid mask."""
        return True

    def prepare(self, batch: Batch) -> Any:
        """What the kind needs of one batch (its own type, given back to :meth:`remove`); here the batch."""
        return batch

    @property
    def reads_scores(self) -> bool:
        """Whether the positions removed depend on the layer's scores (:meth:`remove_scored`)."""
        return False

    def remove(self, prepared: Any, layer: int, valid: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def remove_scored(self, prepared: Any, layer: int, valid: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The positions removed where they depend on the layer's ``scores`` (batch, head, n, n)."""
        return self.remove(prepared, layer, valid)

    def removed(self, batch: Batch, layer: int, valid: torch.Tensor) -> torch.Tensor:
        """The positions removed in ``layer`` of ``batch`` whose valid mask is ``valid`` (batch or 1, n, n)."""
        return self.remove(self.prepare(batch), layer, valid)

    def intervention(self, batch: Batch) -> Intervention:
        prepared = self.prepare(batch)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (valid mask, positions removed) of the layers so far

        def intervene(layer: int, scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            if self.reads_scores:
                return scores.masked_fill(self.remove_scored(prepared, layer, valid, scores), float("-inf"))
            hit = next((remove for v, remove in seen if v.shape == valid.shape and torch.equal(v, valid)), None)
            if hit is None or not self.shared_by_layers:
                hit = self.remove(prepared, layer, valid)
                seen.append((valid, hit))
            return scores.masked_fill(hit, float("-inf"))

        return intervene


@dataclass(frozen=True)
class Ablation(Removal):
    """Position class ``cls`` removed (``control="class"``), or as many valid positions per row
    at random (``"random"``, seeded by ``seed`` and the batch), in ``layer`` (-1: every layer)
    and ``head`` (-1: every head). ``classes`` is the partition the class belongs to (``other``
    is what the rest leave), and keys the random draws. Removing ``heavy(k)`` (or ``other`` beside
    it) reads each head's scores in each layer (:func:`~attnlens.data.positions.choose`); its
    random control, as many positions per row, does not need them.
    """

    cls: str
    classes: tuple[str, ...]
    control: str = "class"
    layer: int = -1
    head: int = -1
    seed: int = 0

    @property
    def scope(self) -> str:
        return "model" if self.layer < 0 else "layer" if self.head < 0 else "head"

    @property
    def key(self) -> str:
        where = f"{self.scope}/{self.layer}/{self.head}"
        return f"ablate/{where}/{self.cls}/{self.control}/{self.seed}/{','.join(self.classes)}"

    @property
    def layers(self) -> list[int] | None:
        return None if self.layer < 0 else [self.layer]

    @property
    def reads_scores(self) -> bool:
        return self.control == "class" and reads_scores(self.cls, self.classes)

    def prepare(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        keys = batch.random_keys(self.seed, self.classes, self.cls) if self.control == "random" else None
        heads = None
        if self.head >= 0:  # (head, 1, 1): this head only
            heads = torch.eye(batch.model.num_heads, dtype=torch.bool, device=batch.ids.device)[self.head][:, None, None]
        return batch.classes(self.classes), keys, heads

    def positions(self, prepared, valid: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, heads or 1, n, n): the positions removed, in every head the ablation applies to (a
        class chosen by ``scores`` without them: as many per row, which is all a count needs)."""
        masks, keys, _ = prepared
        valid = valid.reshape(-1, 1, *valid.shape[-2:])  # (batch or 1, 1, n, n): every head's
        remove = guard_rows(chosen_mask(masks, self.cls, scores, valid[:, 0]) & valid, valid)
        return remove if keys is None else random_positions(remove, valid, keys[:, None])

    def remove(self, prepared, layer: int, valid: torch.Tensor) -> torch.Tensor:
        return self.remove_scored(prepared, layer, valid, None)

    def remove_scored(self, prepared, layer: int, valid: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
        remove = self.positions(prepared, valid, scores if self.reads_scores else None)
        heads = prepared[2]
        return remove if heads is None else remove & heads


def random_positions(remove: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """As many positions per row as ``remove`` has, chosen uniformly among the row's valid keys.

    ``keys`` are uniform random numbers of the same shape; the positions with the smallest
    keys among the valid ones are taken, so the choice never leaves the valid set.

    >>> valid = torch.ones(1, 3, 3, dtype=torch.bool)
    >>> chosen = random_positions(torch.eye(3, dtype=torch.bool)[None], valid, torch.rand(1, 3, 3))
    >>> chosen.sum(-1).tolist()
    [[1, 1, 1]]
    """
    count = remove.sum(-1, keepdim=True)
    rank = torch.where(valid, keys, torch.full_like(keys, 2.0)).argsort(-1).argsort(-1)
    return rank < count


@dataclass(frozen=True)
class PatternChange(Removal):
    """Fixed pattern ``name`` at ``value`` on blocks of ``n`` tokens, under the row guard;
    BigBird's random keys are seeded by ``seed`` and the batch (or each sequence). ``weights``
    names the model weights the pattern was trained with, where they are not the model's own
    (a judgement is remembered by the change's key)."""

    name: str
    value: int
    n: int
    seed: int = 0
    weights: str = ""

    @property
    def key(self) -> str:
        return f"pattern/{self.name}/{self.value}/{self.seed}" + (f"/weights {self.weights}" if self.weights else "")

    def prepare(self, batch: Batch) -> torch.Tensor:
        """The keep mask at the batch's width. A pattern of positions alone, cut to a width, is the
        pattern built at that width; random keys are drawn per sequence at ``draw_width`` and cut, so
        a length-bucketed example keeps the keys it would keep padded to n."""
        cls = batch.roles().cls
        if batch.sequences is None or not PATTERNS[self.name].random:
            return build(self.name, cls.shape[-1], self.value, cls, batch.generator(self.seed, PATTERN_STREAM))
        width, n = batch.draw_width or cls.shape[-1], cls.shape[-1]
        rows = range(len(batch.sequences))
        keys = torch.stack(
            [torch.rand((width, width), generator=batch.own_generator(self.seed, PATTERN_STREAM, row)) for row in rows]
        )
        keep = build(self.name, width, self.value, nn.functional.pad(cls, (0, width - n)), keys=keys)
        return keep[:, :n, :n]

    def remove(self, keep: torch.Tensor, layer: int, valid: torch.Tensor) -> torch.Tensor:
        return removed_mask(keep, valid)[:, None]


def rescue_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The keep mask ``values > 0`` among valid keys; a row that would keep no valid key keeps
    the valid keys of largest value (a query must attend somewhere).

    >>> valid = torch.ones(2, 3, dtype=torch.bool)
    >>> rescue_rows(torch.tensor([[1.0, -1.0, 2.0], [-3.0, -1.0, -2.0]]), valid).tolist()
    [[True, False, True], [False, True, False]]
    """
    masked = values.masked_fill(~valid, float("-inf"))
    keep = masked > 0
    empty = ~keep.any(-1, keepdim=True) & valid.any(-1, keepdim=True)
    best = masked == masked.amax(-1, keepdim=True)
    return keep | (empty & best & valid)


@dataclass(frozen=True, eq=False)
class MaskChange(Removal):
    """The hard mask ``α > 0`` of ``logits`` in ``layout`` (a learned DAM mask): what it drops is
    removed, except that a row it would leave with no valid key keeps its keys of largest logit
    (:func:`rescue_rows`). The layout reads what it needs of each batch (its context: the
    tokens' classes or roles), so a mask removes the same positions of the same ids on corpus
    blocks and on task examples."""

    layout: Layout
    logits: torch.Tensor
    key: str

    @property
    def shared_by_layers(self) -> bool:
        return self.layout.shared_by_layers

    def prepare(self, batch: Batch) -> torch.Tensor:
        return self.layout.context(batch)

    def remove(self, context: torch.Tensor, layer: int, valid: torch.Tensor) -> torch.Tensor:
        # a layout decides positions by their place: a batch narrower than n takes its corner
        width, valid = valid.shape[-1], valid[:, None]
        return valid & ~rescue_rows(self.layout.expand(self.logits, layer, context)[..., :width, :width], valid)
