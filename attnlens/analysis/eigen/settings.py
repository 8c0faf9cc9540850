"""The settings of :func:`~attnlens.analysis.eigen.eigen`: which quantity, how it is centred, per query or pooled, whole matrices."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.rows.moments import QUANTITIES
from attnlens.settings import CorpusSettings, at_least, numbered_from_zero, one_of


@dataclass(frozen=True)
class EigenSettings(CorpusSettings):
    """What :func:`~attnlens.analysis.eigen.eigen` computes, and from which rows (the corpus fields apply when the source is a model).

    ``quantity``: ``scores`` (the default, pre-softmax), ``weights`` or ``log-weights``;
    ``centred``: covariance, else the uncentred second moment; ``project_ones``: remove
    the all-ones direction, which softmax ignores; ``per_query`` / ``queries``: one
    analysis per query position (all, or those listed) instead of pooling rows over
    queries; ``full_matrices``: also the spectra of whole n×n matrices (from a store);
    ``keep``: eigenvectors kept per unit; ``layers``: default all.
    """

    num_seqs: int = 256
    quantity: str | None = None
    centred: bool = True
    project_ones: bool = False
    per_query: bool = False
    queries: tuple[int, ...] | None = None
    full_matrices: bool = False
    keep: int = 32
    layers: tuple[int, ...] | None = None

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 1)
        at_least("keep", self.keep, 1)
        if self.quantity is not None:
            one_of("quantity", self.quantity, QUANTITIES)
        numbered_from_zero("queries", self.queries, "query positions")
        numbered_from_zero("layers", self.layers)
