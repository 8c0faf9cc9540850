"""Reconstruction maps trained together with the model's weights: Paper A's "R learned jointly".

Under the ``finetune`` task protocol a change is inside attention while the encoder trains
(:class:`attnlens.analysis.task.TaskJudge`). A :class:`JointMaps` change starts from the
closed-form maps (the chosen keys, the least-squares R) and hands the fine-tune its maps'
weights and offsets to train alongside the encoder, at their own learning rate; the chosen
keys' rows stay pinned to their exact scores. The scope of the maps says what is shared:
``head`` trains one map per head, ``layer`` one per layer shared by its heads, ``all``
one map shared by every head of every layer (Paper A's "shared R").

At k = n every row is a chosen key's: nothing is left to train and the change computes
every score exactly, so fine-tuning with it is fine-tuning without it (tested).

>>> import torch
>>> from attnlens.analysis.reconstruct import LayerMaps
>>> maps = {0: LayerMaps(torch.tensor([[[0]]]), torch.ones(1, 1, 2, 1), torch.zeros(1, 1, 2))}
>>> trained, groups = JointMaps(maps, "head", "joint").trainable()
>>> [tuple(t.shape) for t in groups[0]["params"]]   # the weights and offsets of the one map
[(1, 1, 2, 1), (1, 1, 2)]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnlens.analysis.changes import Change
from attnlens.analysis.reconstruct.maps import LayerMaps, exact_mask
from attnlens.errors import BadInput

JOINT_LR = 1e-3  # the maps' learning rate in the fine-tune (the encoder's is ~2e-5: R's entries are of order 1)
SHARED = {"head": "nothing", "layer": "the heads of a layer", "all": "every layer and head"}


@dataclass(frozen=True, eq=False)
class JointMaps(Change):
    """The maps of ``scope`` (head, layer or all) in their layers, trainable in a fine-tune from
    the closed form ``maps``; ``units`` holds the trained tensors once :meth:`trainable` made them."""

    maps: dict[int, LayerMaps]
    scope: str
    key: str
    lr: float = JOINT_LR
    units: tuple = ()  # ((unit, (weights, offset)), ...): one unit per layer, or one for all ("all")
    pinned: tuple = ()  # ((layer, exact_mask(maps)), ...): the rows that stay exact, made once by trainable()

    def __post_init__(self) -> None:
        if self.scope not in SHARED:
            raise BadInput(f"`scope` {self.scope} is unknown; use one of {', '.join(SHARED)}")

    @property
    def layers(self) -> list[int]:
        return list(self.maps)

    def _unit(self, layer: int) -> int:
        return -1 if self.scope == "all" else layer

    def trainable(self) -> tuple[JointMaps, list[dict]]:
        """A copy whose maps' weights and offsets are fresh tensors to train (from the closed form),
        and the optimiser's parameter group for them."""
        units: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer, maps in self.maps.items():
            if self._unit(layer) in units:
                continue
            weights, offset = maps.weights.float(), maps.offset.float()
            if self.scope != "head":  # shared by the heads: fitted alike, trained as one
                weights, offset = weights[:1], offset[:1]
            units[self._unit(layer)] = (weights.clone().requires_grad_(True), offset.clone().requires_grad_(True))
        pinned = tuple((layer, exact_mask(maps)) for layer, maps in self.maps.items())
        trained = replace(self, units=tuple(units.items()), pinned=pinned)
        return trained, [{"params": [tensor for pair in units.values() for tensor in pair], "lr": self.lr}]

    def state(self) -> list[torch.Tensor]:
        """The trained tensors, to cache with the fine-tuned weights."""
        return [tensor.detach().clone() for _, pair in self.units for tensor in pair]

    def load(self, state: list[torch.Tensor]) -> None:
        """Set the trained tensors from :meth:`state`."""
        with torch.no_grad():
            for tensor, saved in zip([tensor for _, pair in self.units for tensor in pair], state, strict=True):
                tensor.copy_(saved)

    def current(self, layer: int, device: torch.device | str = "cpu") -> LayerMaps:
        """The layer's maps as trained so far (the closed form before :meth:`trainable`), on ``device``."""
        maps = self.maps[layer]
        if not self.units:
            return LayerMaps(maps.positions.to(device), maps.weights.to(device), maps.offset.to(device))
        pinned, values, pinned_offset = (tensor.to(device) for tensor in dict(self.pinned)[layer])
        weights, offset = (tensor.to(device) for tensor in dict(self.units)[self._unit(layer)])
        heads = maps.weights.shape[0]
        weights = torch.where(pinned, values, weights.expand(heads, -1, -1, -1))
        offset = torch.where(pinned_offset, torch.zeros((), device=device), offset.expand(heads, -1, -1))
        return LayerMaps(maps.positions.to(device), weights, offset)

    def intervention(self, batch: object):
        return lambda layer, scores, valid: self.current(layer, scores.device).apply(scores)
