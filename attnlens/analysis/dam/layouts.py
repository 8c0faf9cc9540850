"""Mask layouts: how DAM's logits map onto the attention positions of every layer and head.

A layout owns everything about itself: its ``name`` (the ``variant`` users ask for), a
one-line ``summary`` (the CLI's help), whether every layer shares its logits
(``shared_by_layers``), which fixed patterns it can express exactly (``expresses``:
pattern -> the parameter values it can express, ``None`` for all of them), and how it
reads a batch (:meth:`MaskLayout.context`: nothing, or the tokens' classes or roles).
Subclasses register themselves in :data:`LAYOUTS` by naming themselves, so that adding a
layout is adding one class: the settings' validation, the CLI's help, the figures (from
the ``layout`` a result records) and :meth:`DamResult.compared` all read the registry.

- ``unstructured`` (DAM_u): one logit per layer, head, query and key;
- ``structured`` (DAM_s): one logit per head and offset ``|i - j|``, shared by all layers;
- ``structured+global``: DAM_s plus, per head, logits for the rows and columns of the
  ``[CLS]`` (first) and ``[SEP]`` (last) tokens: the family of Longformer-like patterns;
- ``class``: one logit per layer, head and position class (each position belongs to the
  first listed class that contains it; ``other`` takes the rest).

>>> sorted(LAYOUTS)
['class', 'structured', 'structured+global', 'unstructured']
>>> LAYOUTS["structured"].shared_by_layers, LAYOUTS["structured"].can_express("band", 3)
(True, True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch

from attnlens.analysis.changes import Batch, MaskChange
from attnlens.data.positions import exclusive_index

LAYOUTS: dict[str, type[MaskLayout]] = {}
"""Every layout by name; a subclass of :class:`MaskLayout` with a ``name`` registers itself."""


class _Take(torch.autograd.Function):
    """``values[:, index]`` whose backward sums each logit's gradient in a fixed order: the indexing's
    own backward (a parallel scatter-add on the CPU) sums in an order that varies from run to run,
    so two runs of the same command trained different masks in the last digits."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.logits = values.shape[1]
        return values[:, index]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        flat, rows = index.flatten(), grad.reshape(grad.shape[0], -1)
        summed = [torch.bincount(flat, weights=row, minlength=ctx.logits) for row in rows]  # a serial sum per row
        return torch.stack(summed).to(grad.dtype), None


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[:, index]`` for (head, logit) ``values``, with a backward that is the same in every run.

    >>> values = torch.arange(6.0).reshape(2, 3).requires_grad_(True)
    >>> take(values, torch.tensor([[2, 2], [0, 1]])).sum().backward()
    >>> values.grad.tolist()
    [[1.0, 1.0, 2.0], [1.0, 1.0, 2.0]]
    """
    return _Take.apply(values, index)


class MaskLayout:
    """How mask logits map onto attention positions of the ``num_layers`` layers.

    ``expand(values, layer, context)`` gives a tensor broadcastable to (batch, head, n, n);
    ``counts(context, valid)`` how many valid positions of the batch each logit controls;
    ``context(batch)`` what ``expand`` needs of a batch beyond positions. ``valid`` is the
    (layer, n, n) valid mask of unpadded blocks; ``classes`` the partition of positions the
    ``class`` layout learns (others ignore it).

    A batch of task examples may be narrower than n (length-bucketed) and padded: a layout
    decides positions by their place, so such a batch takes the (w, w) corner of ``expand``,
    and ``counts`` is given the batch's own (batch, layer, w, w) valid positions
    (:meth:`positions`); without them, a batch is unpadded blocks of n.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    shared_by_layers: ClassVar[bool] = False
    expresses: ClassVar[dict[str, tuple[int, ...] | None]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            LAYOUTS[cls.name] = cls

    def __init__(self, num_layers: int, num_heads: int, n: int, valid: torch.Tensor, classes: tuple[str, ...]) -> None:
        self.num_layers, self.num_heads, self.n = num_layers, num_heads, n
        self.valid = valid  # (layer, n, n)
        self.classes = classes

    @classmethod
    def can_express(cls, pattern: str, value: int) -> bool:
        """Whether the layout can express pattern ``pattern`` at parameter ``value`` exactly."""
        if pattern not in cls.expresses:
            return False
        values = cls.expresses[pattern]
        return values is None or int(value) in values

    @classmethod
    def describe(cls) -> dict[str, object]:
        """What a result records of its layout (the figures and comparisons read it)."""
        expresses = {name: None if values is None else list(values) for name, values in cls.expresses.items()}
        return {"name": cls.name, "shared_by_layers": cls.shared_by_layers, "expresses": expresses}

    @property
    def shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def positions(self, valid: torch.Tensor | None) -> torch.Tensor:
        """(batch or 1, layer, w, w): a batch's valid positions, ``valid`` where it is given, else
        the unpadded blocks' own (the batch dimension 1 standing for every block)."""
        return self.valid[None] if valid is None else valid

    def summed(self, context: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """(layer, w, w) float: in how many of the batch's sequences each position is valid."""
        return self.positions(valid).sum(0).to(torch.float32) * (context.shape[0] if valid is None else 1)

    def expand(self, values: torch.Tensor, layer: int, context: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def counts(self, context: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """How many valid positions each logit decides in a batch (``valid``: its own, default unpadded blocks)."""
        raise NotImplementedError

    def context(self, batch: Batch) -> torch.Tensor:
        """What ``expand`` needs of a batch beyond positions: nothing, a (batch, 1, 1) placeholder."""
        return torch.zeros(batch.ids.shape[0], 1, 1, dtype=torch.long, device=self.valid.device)


class Unstructured(MaskLayout):
    """DAM_u: a logit per (layer, head, query, key)."""

    name = "unstructured"
    summary = "a logit per layer, head, query and key (DAM_u)"
    # per position, shared by all blocks: not BigBird's random keys, drawn per block
    expresses = {"band": None, "no-diagonal": None, "local": None, "strided": None, "fixed": None}

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_heads, self.n, self.n)

    def expand(self, values, layer, context):
        return values[layer][None]

    def counts(self, context, valid=None):
        summed = self.summed(context, valid)
        pad = self.n - summed.shape[-1]
        return torch.nn.functional.pad(summed, (0, pad, 0, pad))[:, None].expand(self.shape)


class Structured(MaskLayout):
    """DAM_s: a logit per (head, offset |i - j|), shared by all layers."""

    name = "structured"
    summary = "a logit per head and offset |i - j|, shared by all layers (DAM_s)"
    shared_by_layers = True
    expresses = {"band": None, "no-diagonal": None}  # a function of the offset alone

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        index = torch.arange(self.n)
        self.offset = (index[:, None] - index[None, :]).abs().to(self.valid.device)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.n)

    def expand(self, values, layer, context):
        return values[:, self.offset][None]

    def counts(self, context, valid=None):
        summed = self.summed(context, valid).sum(0)
        width = summed.shape[-1]
        per_offset = torch.zeros(self.n, device=self.valid.device)
        per_offset.index_add_(0, self.offset[:width, :width].flatten(), summed.flatten())
        return per_offset.expand(self.shape)


class StructuredGlobal(Structured):
    """DAM_s plus global tokens: per head, the offset logits and four more, for the rows and
    columns of the ``cls`` ([CLS] or the first token) and ``sep`` ([SEP] or the last token)
    roles, shared by all layers. Where they meet, a ``cls`` column beats a ``cls`` row beats a
    ``sep`` column beats a ``sep`` row. The family Longformer-like patterns (band + global) are in;
    a position in a global row or column is decided by that logit alone, so a band inside the
    ``sep`` row and column (``local(w)`` keeps it) is not expressible: one logit keeps or drops it all."""

    name = "structured+global"
    summary = "structured, plus a logit per head for the cls and sep rows and columns"
    expresses = {"band": None, "no-diagonal": None, "local": None}  # the [CLS] rows and columns local(w) keeps
    GLOBALS = ("cls row", "cls column", "sep row", "sep column")  # logits n, n + 1, n + 2, n + 3

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.n + len(self.GLOBALS))

    def context(self, batch: Batch) -> torch.Tensor:
        roles = batch.roles()
        cls, sep = roles.cls.to(self.valid.device), roles.sep.to(self.valid.device)
        width = cls.shape[-1]  # n, or less for a length-bucketed task batch
        code = torch.zeros(cls.shape[0], width, width, dtype=torch.long, device=self.valid.device)
        # from the lowest priority to the highest: a later assignment wins where they meet
        for number, role, axis in ((3, sep, "row"), (4, sep, "column"), (1, cls, "row"), (2, cls, "column")):
            hit = role[:, :, None] if axis == "row" else role[:, None, :]  # the query (row) or key (column) has the role
            code = torch.where(hit.expand_as(code), number, code)
        return code  # 0: an offset logit decides; k > 0: global logit n + k - 1

    def expand(self, values, layer, context):
        width = context.shape[-1]
        offsets = values[:, self.offset[:width, :width]][None]  # (1, head, width, width)
        globals_ = take(values, self.n - 1 + context.clamp_min(1)).transpose(0, 1)  # (batch, head, width, width)
        return torch.where(context[:, None] > 0, globals_, offsets)

    def counts(self, context, valid=None):
        positions, width = self.positions(valid), context.shape[-1]
        per_logit = torch.zeros(self.n + len(self.GLOBALS), device=self.valid.device)
        for index, code in enumerate(context):
            weight = positions[0 if valid is None else index].sum(0).to(torch.float32)  # (w, w): layers each position is valid in
            offsets = torch.where(code == 0, self.offset[:width, :width], self.n + code - 1)  # the logit deciding each position
            per_logit.index_add_(0, offsets.flatten(), weight.flatten())
        return per_logit.expand(self.shape)


class PerClass(MaskLayout):
    """A logit per (layer, head, position class)."""

    name = "class"
    summary = "a logit per layer, head and position class (--classes)"
    expresses = {"band": (1,), "no-diagonal": None}  # with the default classes (self, prev, next): band(1), all but self

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_heads, len(self.classes))

    def expand(self, values, layer, context):
        return take(values[layer], context).transpose(0, 1)  # (batch, head, n, n)

    def context(self, batch: Batch) -> torch.Tensor:
        return exclusive_index(batch.classes(self.classes)).to(self.valid.device)

    def counts(self, context, valid=None):
        positions = self.positions(valid).expand(context.shape[0], -1, -1, -1)
        counts = torch.stack(
            [
                torch.bincount(context[positions[:, layer]], minlength=len(self.classes))[: len(self.classes)]
                for layer in range(self.num_layers)
            ]
        ).to(torch.float32)  # (layer, class)
        return counts[:, None].expand(self.shape)


# ----------------------------------------------------------------------------- what a layout decides


def total(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The sum of ``tensors`` (at least one), added in order as ``sum`` adds them, as a new tensor
    (``sum``'s start, 0, would leave its result typed ``Tensor | int``).

    >>> total([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]).tolist()
    [4.0, 6.0]
    """
    remaining = iter(tensors)
    result = next(remaining).clone()
    for tensor in remaining:
        result = result + tensor
    return result


def decided(layout: MaskLayout, contexts: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """How many positions of a set (``masks``: one (batch, n, n) per context of unpadded blocks)
    each logit decides, over the valid positions of every layer: the adjoint of ``expand`` applied
    to the set (the gradient of Σ expand(values)·set)."""
    values = torch.zeros(layout.shape, requires_grad=True, device=layout.valid.device)
    terms: list[torch.Tensor] = []
    for context, mask in zip(contexts, masks):
        for layer in range(layout.num_layers):
            chosen = (mask & layout.valid[layer][None]).to(torch.float32)[:, None]  # (batch, 1, n, n)
            terms.append((layout.expand(values, layer, context) * chosen).sum())
    (counts,) = torch.autograd.grad(total(terms), values)
    return counts


def pattern_logits(layout: MaskLayout, keeps: list[tuple[torch.Tensor, torch.Tensor]], inside: float = 0.95) -> torch.Tensor:
    """Logits that start a layout at a fixed pattern: each logit's keep-probability is
    ``1 - inside`` plus ``2·inside - 1`` times the fraction of the positions it decides that the
    pattern keeps (so ``inside`` where the pattern keeps all of them, ``1 - inside`` where it
    keeps none). ``keeps``: (context, keep (batch, n, n)) of some batches of unpadded blocks.
    """
    contexts = [context for context, _ in keeps]
    kept = decided(layout, contexts, [keep for _, keep in keeps])
    counts = total(layout.counts(context) for context in contexts)
    fraction = (kept / counts.clamp_min(1)).clamp(0, 1)
    probability = (1 - inside) + (2 * inside - 1) * fraction
    return torch.log(probability / (1 - probability))


def equal_by_construction(
    layout: MaskLayout, contexts: list[torch.Tensor], masks: list[dict[str, torch.Tensor]]
) -> dict[str, str]:
    """Classes whose keep-probability equals an earlier class's for any logits, because the layout
    decides both from the same logits in the same shares (DAM_s decides ``next`` by offset 1 as it
    does ``prev``, and in a bidirectional model the ``cls`` column meets every offset once, as the
    ``sep`` column does): class -> the earlier class it repeats.

    >>> n = 6
    >>> layout = LAYOUTS["structured"](1, 1, n, torch.ones(1, n, n, dtype=torch.bool), ())
    >>> i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    >>> sets = {"prev": (j == i - 1)[None], "next": (j == i + 1)[None], "cls": (j == 0).expand(1, n, n), "sep": (j == n - 1).expand(1, n, n)}
    >>> equal_by_construction(layout, [torch.zeros(1, 1, 1, dtype=torch.long)], [sets])
    {'next': 'prev', 'sep': 'cls'}
    """
    names = list(masks[0])
    shares = {}
    for name in names:
        counts = decided(layout, contexts, [batch[name] for batch in masks])
        shares[name] = counts / counts.sum().clamp_min(1)
    same = {}
    for index, name in enumerate(names):
        earlier = next(
            (other for other in names[:index] if other not in same and torch.allclose(shares[other], shares[name], atol=1e-7)),
            None,
        )
        if earlier is not None and bool(shares[name].sum() > 0):
            same[name] = earlier
    return same


def hard_removals(
    layout: MaskLayout, logits: torch.Tensor, context: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], float, float]:
    """Per layer, the (batch|1, head, w, w) valid positions of the batch (``valid``, or unpadded
    blocks: :meth:`MaskLayout.positions`) that the hard mask α > 0 removes
    (:class:`~attnlens.analysis.changes.MaskChange`), and the rows it would have left empty
    (rescued) and all rows, counted over heads."""
    change, positions = MaskChange(layout, logits, ""), layout.positions(valid)
    removals, rescued, rows = [], 0.0, 0.0
    for layer in range(layout.num_layers):
        here = positions[:, layer]  # (batch|1, w, w)
        width = here.shape[-1]
        values = layout.expand(logits, layer, context)[..., :width, :width]
        removals.append(change.remove(context, layer, here))
        shape = (context.shape[0], layout.num_heads)
        kept_rows = (values.masked_fill(~here[:, None], float("-inf")) > 0).any(-1)
        rescued += float((~kept_rows & here.any(-1)[:, None]).expand(*shape, -1).sum())
        rows += float(here.any(-1)[:, None].expand(*shape, -1).sum())
    return removals, rescued, rows


def hard_sparsity(
    layout: MaskLayout, logits: torch.Tensor, contexts: list[torch.Tensor], valids: list[torch.Tensor | None] | None = None
) -> float:
    """The fraction of valid (layer, head, query, key) positions of ``contexts`` (each batch's
    ``valids``, or unpadded blocks) that the hard mask α > 0 removes, rows left empty rescued
    (:func:`~attnlens.analysis.changes.rescue_rows`)."""
    removed = total = 0.0
    for context, valid in zip(contexts, valids or [None] * len(contexts)):
        removals, _, _ = hard_removals(layout, logits, context, valid)
        positions = layout.positions(valid).expand(context.shape[0], -1, -1, -1)
        for layer, removal_now in enumerate(removals):
            removed += float(removal_now.expand(context.shape[0], layout.num_heads, -1, -1).sum())
            total += float(positions[:, layer].sum()) * layout.num_heads
    return removed / total
