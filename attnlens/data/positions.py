"""Position classes: which (query, key) pairs of an attention matrix are of which kind.

A class is a boolean (query, key) mask over a block, computed from positions and tokens:

========  ===========================================================================
self      the query attends to itself, ``j = i``
prev      the previous token, ``j = i - 1``
next      the next token, ``j = i + 1`` (never valid in a causal model)
band(w)   a neighbour within ``w``, ``0 < |i - j| <= w`` (``w >= 1``)
cls       the key is in the ``[CLS]`` role: the tokens the tokenizer puts *before* a
          text (``[CLS]``; ``<bos>`` for decoders), or position 0 when it puts none
sep       the key is in the ``[SEP]`` role: the tokens it puts *after* a text
          (``[SEP]``), or the last position of the block when it puts none (decoders)
punct     the key is a punctuation token: its text, without word-boundary marks
          (``##``, ``▁``, ``Ġ``), is only punctuation characters (Unicode ``P*``)
sink(s)   the key is one of the block's first ``s`` positions, whatever its token (the
          attention sink of decoders, StreamingLLM's initial tokens); ``sink`` is ``sink(1)``
heavy(k)  the row's ``k`` keys of largest score in each layer and head (H2O's heavy hitters:
          softmax is monotone, so they hold the row's largest weights), among the keys no
          other class asked for holds; ``heavy`` is ``heavy(1)``
other     none of the other classes asked for
========  ===========================================================================

Classes may overlap (``self`` and ``cls`` share (0, 0); ``band(2)`` holds ``prev``);
``other`` is what none of the others covers, so ``{self, prev, next, other}`` or
``{cls, sep, punct, other}`` partition every row. Which tokens took the ``cls`` and
``sep`` roles is reported by :func:`token_roles` and recorded in every result. A model's default
classes depend on its kind (:func:`default_classes`): a decoder's first token is its ``sink``, and
it has no ``[CLS]`` or ``[SEP]`` to ask about (``cls`` would be that same first token, ``sep`` its last).

The table :data:`PREDICATES` maps each class name to a predicate over query positions
``i``, key positions ``j`` and the tokens' roles; adding a class is adding a row.

``heavy(k)`` is the one class chosen by scores, so its positions differ by layer and head.
:func:`class_masks` gives, for it and for ``other``, the keys it chooses among (those no other
class holds), and :func:`choose` narrows both with one layer's scores: ``heavy(k)`` to each
row's ``k`` largest (ties to the earlier key), ``other`` to the rest. How many positions each
holds does not depend on the scores, so a count needs none. With ``sink`` asked for,
``heavy(k)`` are the heavy hitters beside the sink.

>>> import torch
>>> from attnlens import load_model
>>> from attnlens.data.positions import class_masks, parse_classes
>>> model = load_model("minilm-l6")
>>> ids = torch.tensor([[101, 1999, 1996, 2927, 1010, 102]])    # [CLS] in the beginning , [SEP]
>>> masks = class_masks(ids, model, parse_classes("self,band(1),punct,other"))
>>> masks["punct"][0].nonzero()[:2].tolist()                      # every query's key 4 (",")
[[0, 4], [1, 4]]
>>> int(masks["band(1)"][0].sum()), int(masks["other"][0].sum())
(10, 17)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnlens.errors import BadInput

if TYPE_CHECKING:
    from attnlens.models.loading import LoadedModel

DEFAULT_CLASSES: tuple[str, ...] = ("self", "prev", "next", "cls", "sep", "punct", "other")
DECODER_CLASSES: tuple[str, ...] = ("self", "prev", "sink", "punct", "other")
_SIZED = re.compile(r"(band|sink|heavy)\((-?\d+)\)")  # the classes that take a size: band(w), sink(s), heavy(k)
_SIZE_NAMES = {"band": "width w", "sink": "size s", "heavy": "number k"}
_WORD_MARKS = ("##", "\u2581", "\u0120")  # WordPiece continuation, SentencePiece and byte-BPE spaces


@dataclass(frozen=True)
class TokenRoles:
    """Per-token roles of a batch of blocks, each (batch, n) bool, and what took them."""

    cls: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor
    description: dict[str, str]


Predicate = Callable[[torch.Tensor, torch.Tensor, TokenRoles, int | None], torch.Tensor]
"""``predicate(i, j, roles, width)``: ``i`` (1, n, 1) query and ``j`` (1, 1, n) key positions."""


def _band(i: torch.Tensor, j: torch.Tensor, width: int | None) -> torch.Tensor:
    """``band(w)``: keys within ``width`` of the query, the query itself aside."""
    assert width is not None, "band(w) always comes with its width (_predicate)"
    return ((i - j).abs() <= width) & (i != j)


def _sink(j: torch.Tensor, size: int | None) -> torch.Tensor:
    """``sink(s)``: the block's first ``s`` keys (``sink`` alone: the first)."""
    return j < (1 if size is None else size)


PREDICATES: dict[str, Predicate] = {
    "self": lambda i, j, roles, width: i == j,
    "prev": lambda i, j, roles, width: j == i - 1,
    "next": lambda i, j, roles, width: j == i + 1,
    "band": lambda i, j, roles, width: _band(i, j, width),
    "cls": lambda i, j, roles, width: roles.cls[:, None, :],
    "sep": lambda i, j, roles, width: roles.sep[:, None, :],
    "punct": lambda i, j, roles, width: roles.punct[:, None, :],
    "sink": lambda i, j, roles, width: _sink(j, width),
}
CLASS_HELP = "self, prev, next, band(w), cls, sep, punct, sink(s), heavy(k), other"
CHOSEN = ("heavy", "other")  # chosen among the same keys by each head's scores, where heavy(k) is asked for


def default_classes(causal: bool) -> tuple[str, ...]:
    """The classes asked for when none are named: :data:`DECODER_CLASSES` for a causal model, else
    :data:`DEFAULT_CLASSES`.

    >>> default_classes(causal=True)
    ('self', 'prev', 'sink', 'punct', 'other')
    """
    return DECODER_CLASSES if causal else DEFAULT_CLASSES


def parse_classes(text: str | Iterable[str] | None, causal: bool = False) -> tuple[str, ...]:
    """Check and normalise class names: ``"self, band(2)"`` -> ``('self', 'band(2)')``.

    ``None`` gives the defaults of a model that is ``causal`` or not (:func:`default_classes`). Raises :class:`BadInput` for an unknown
    name, ``band(w)`` with ``w < 1``, a repeated class or an empty list.

    >>> parse_classes(" self,prev , band(3), sink(4) ")
    ('self', 'prev', 'band(3)', 'sink(4)')
    >>> parse_classes("band(0)")
    Traceback (most recent call last):
    ...
    attnlens.errors.BadInput: classes band(0): the width w of band(w) must be at least 1, e.g. band(2)
    """
    if text is None:
        return default_classes(causal)
    parts = [part.strip() for part in (text.split(",") if isinstance(text, str) else text)]
    parts = [part.replace(" ", "") for part in parts if part]
    if not parts:
        raise BadInput(f"`classes` is empty; name at least one of {CLASS_HELP}")
    for name in parts:
        sized = _SIZED.fullmatch(name)
        if sized is not None and int(sized.group(2)) < 1:
            kind, size = sized.group(1), _SIZE_NAMES[sized.group(1)]
            raise BadInput(f"`classes` {name}: the {size} of {kind}({size[-1]}) must be at least 1, e.g. {kind}(2)")
        if sized is None and (name not in PREDICATES or name == "band") and name not in ("other", "heavy"):
            raise BadInput(f"unknown position class '{name}' in `classes`; use {CLASS_HELP}")
    repeated = sorted({name for name in parts if parts.count(name) > 1})
    if repeated:
        raise BadInput(f"`classes` names '{repeated[0]}' more than once; name each class once")
    if len([name for name in parts if _kind(name) == "heavy"]) > 1:
        raise BadInput("`classes` names heavy(k) more than once; name one k (a larger k holds every smaller one's keys)")
    return tuple(parts)


def _kind(name: str) -> str:
    """A class's kind: its name without a size (``band(2)`` -> ``band``)."""
    sized = _SIZED.fullmatch(name)
    return sized.group(1) if sized else name


def heavy_class(classes: Iterable[str]) -> str | None:
    """The ``heavy(k)`` class among ``classes``, if one is asked for.

    >>> heavy_class(("self", "heavy(4)", "other")), heavy_class(("self", "other"))
    ('heavy(4)', None)
    """
    return next((name for name in classes if _kind(name) == "heavy"), None)


def reads_scores(name: str, classes: Iterable[str]) -> bool:
    """Whether class ``name``'s positions among ``classes`` depend on each head's scores: ``heavy(k)``,
    and ``other`` beside it."""
    return _kind(name) in CHOSEN and heavy_class(classes) is not None


def refuse_heavy(classes: str | Iterable[str] | None, where: str) -> None:
    """Raise :class:`BadInput` where an analysis (``where``) fixes positions by tokens and places, so
    cannot take ``heavy(k)``."""
    if classes is not None and heavy_class(parse_classes(classes)) is not None:
        raise BadInput(
            f"{where} learns or keeps positions fixed by tokens and places, and heavy(k) is chosen by each head's "
            "scores; drop it from `classes` (attnlens importance measures it)"
        )


def _predicate(name: str) -> tuple[Predicate, int | None]:
    sized = _SIZED.fullmatch(name)
    return (PREDICATES[sized.group(1)], int(sized.group(2))) if sized else (PREDICATES[name], None)


def heavy_size(name: str) -> int:
    """The ``k`` of a ``heavy(k)`` class (``heavy``: 1)."""
    sized = _SIZED.fullmatch(name)
    return int(sized.group(2)) if sized else 1


def is_punctuation(token: str) -> bool:
    """Whether a token's text, without word-boundary marks, is only punctuation.

    >>> [is_punctuation(t) for t in (",", "\u2581--", ")...", "##s", "\u2581", "3.5")]
    [True, True, True, False, False, False]
    """
    for mark in _WORD_MARKS:
        token = token.replace(mark, "")
    token = token.strip()
    return bool(token) and all(unicodedata.category(char).startswith("P") for char in token)


def token_roles(ids: torch.Tensor, model: LoadedModel) -> TokenRoles:
    """Which tokens of ``ids`` (batch, n) are in the cls, sep and punct roles.

    The roles come from the tokenizer's layout (:class:`attnlens.models.loading.SpecialTokens`):
    ``cls`` are the ids it puts before a text, ``sep`` those it puts after; a tokenizer
    that puts none gets position 0 (``cls``) or the last position (``sep``) instead.
    """
    special, tokenizer = model.special, model.tokenizer
    batch, n = ids.shape
    positions = torch.arange(n, device=ids.device).expand(batch, n)
    roles, description = {}, {}
    for role, special_ids, fallback, where in (
        ("cls", special.prefix, 0, "first"),
        ("sep", special.suffix, n - 1, "last"),
    ):
        if special_ids:
            roles[role] = torch.isin(ids, torch.tensor(special_ids, device=ids.device))
            names = tokenizer.convert_ids_to_tokens(list(special_ids))
            description[role] = " ".join(f"{name} (id {token})" for name, token in zip(names, special_ids))
        else:
            roles[role] = positions == fallback
            description[role] = (
                f"the {where} position of each block (the tokenizer adds no token {'before' if role == 'cls' else 'after'} a text)"
            )
    unique = torch.unique(ids).tolist()
    punctuation = [
        token
        for token, text in zip(unique, tokenizer.convert_ids_to_tokens(unique))
        if token not in special.all_special and is_punctuation(text)
    ]
    roles["punct"] = torch.isin(ids, torch.tensor(punctuation, dtype=ids.dtype, device=ids.device))
    description["punct"] = "tokens made only of punctuation characters"
    return TokenRoles(cls=roles["cls"], sep=roles["sep"], punct=roles["punct"], description=description)


def class_masks(
    ids: torch.Tensor,
    model: LoadedModel,
    classes: Sequence[str],
    valid: torch.Tensor | None = None,
    roles: TokenRoles | None = None,
) -> dict[str, torch.Tensor]:
    """Boolean (batch, n, n) masks, one per class, for blocks ``ids`` (batch, n).

    ``other`` is everything no other listed class covers. With ``valid`` (batch or 1, n, n)
    every mask is restricted to the pairs the model may attend to. A ``heavy(k)`` class and
    ``other`` beside it are both the keys it chooses among; :func:`choose` narrows them.
    """
    ids = torch.as_tensor(ids)
    batch, n = ids.shape
    roles = roles if roles is not None else token_roles(ids, model)
    i = torch.arange(n, device=ids.device)[None, :, None]
    j = torch.arange(n, device=ids.device)[None, None, :]
    masks: dict[str, torch.Tensor] = {}
    for name in classes:
        if _kind(name) in CHOSEN:
            continue
        predicate, width = _predicate(name)
        masks[name] = predicate(i, j, roles, width).expand(batch, n, n)
    chosen = [name for name in classes if _kind(name) in CHOSEN]
    if chosen:
        covered = torch.zeros(batch, n, n, dtype=torch.bool, device=ids.device)
        for mask in masks.values():
            covered |= mask
        masks.update(dict.fromkeys(chosen, ~covered))
    if valid is not None:
        masks = {name: mask & valid for name, mask in masks.items()}
    return {name: masks[name] for name in classes}


def choose(masks: dict[str, torch.Tensor], scores: torch.Tensor | None, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """One layer's masks, (batch, heads or 1, n, n): :func:`class_masks`' ``masks`` with ``heavy(k)``
    narrowed to each row's ``k`` valid keys of largest ``scores`` (batch, heads, n, n) among those it
    chooses from, ties to the earlier key, and ``other`` to the rest; ``valid`` (batch or 1, n, n).
    Without ``scores`` every key ties, so the first ``k`` are taken: the same number of positions in
    every row as any head's scores take, which is all a count needs.

    >>> masks = {"heavy(2)": torch.ones(1, 3, 3, dtype=torch.bool), "other": torch.ones(1, 3, 3, dtype=torch.bool)}
    >>> scores = torch.tensor([[[[0.0, 5.0, 1.0]] * 3]])
    >>> chosen = choose(masks, scores, torch.ones(1, 3, 3, dtype=torch.bool).tril())
    >>> chosen["heavy(2)"][0, 0].int().tolist(), chosen["other"][0, 0, 2].int().tolist()
    ([[1, 0, 0], [1, 1, 0], [0, 1, 1]], [1, 0, 0])
    """
    heavy = heavy_class(masks)
    chosen = {name: mask[:, None] for name, mask in masks.items()}
    if heavy is None:
        return chosen
    among = masks[heavy][:, None] & valid[:, None]
    ranked = (scores if scores is not None else torch.zeros(among.shape, device=among.device)).masked_fill(~among, float("-inf"))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices  # stable: ties to the earlier key
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    chosen[heavy] = among & (rank < heavy_size(heavy))
    if "other" in masks:
        chosen["other"] = chosen["other"] & ~chosen[heavy]
    return chosen


def chosen_mask(masks: dict[str, torch.Tensor], name: str, scores: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
    """Class ``name``'s mask from :func:`choose`, (batch, heads or 1, n, n), narrowing only where ``name`` reads
    scores (a class of tokens and places is its mask as it stands)."""
    if not reads_scores(name, masks):
        return masks[name][:, None]
    return choose(masks, scores, valid)[name]


def exclusive_index(masks: dict[str, torch.Tensor]) -> torch.Tensor:
    """(batch, n, n) int64: the first class (in ``masks`` order) each position belongs to.

    Positions in no class get ``len(masks)``. Used where each position needs exactly one
    class (per-class DAM masks).

    >>> m = {"a": torch.tensor([[[True, True]]]), "b": torch.tensor([[[False, True]]])}
    >>> exclusive_index(m).tolist()
    [[[0, 0]]]
    """
    stacked = torch.stack(list(masks.values()))  # (C, batch, n, n)
    first = stacked.to(torch.int8).argmax(0)
    return torch.where(stacked.any(0), first, torch.full_like(first, len(masks))).long()
