"""The settings of :func:`~attnlens.analysis.sinks.sinks`: the blocks read, and the papers' thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.errors import BadInput
from attnlens.settings import CorpusSettings, at_least, probability

GU_EPSILON = 0.3  # Gu et al. (ICLR 2025): a head has a sink when its mean first-token weight exceeds this
H2O_FRACTION = 0.01  # H2O (Zhang et al. 2023): a weight below 1% of its row's largest is negligible
TOP_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # the shares of a row's keys whose mass the curve reads
HEAVY_TOP = 0.05  # the claim's: the mass the top 5% of a row's keys hold
FAR_MARGIN = 0.01  # nats: a head whose restriction alone costs more looks far (the proxy's margin)


@dataclass(frozen=True)
class SinkSettings(CorpusSettings):
    """What :func:`~attnlens.analysis.sinks.sinks` reads and how it counts.

    ``num_seqs`` corpus blocks of ``seq_len`` tokens (64: Gu et al.'s inputs); a head is a sink head when
    its mean weight on the block's first token exceeds ``epsilon`` (Gu et al.'s 0.3); a weight is negligible
    below ``fraction`` of its row's largest (H2O's 1%); the top ``top`` of a row's keys (5%) are its heavy
    hitters, read on rows of at least ``min_keys`` keys (on a shorter row the top 5% is one key of a
    handful, which holds much of it by construction); ``bootstrap`` resamples of the blocks give the intervals.
    With ``far`` (a language model's), each head is restricted alone to the first 4 keys and the ``window`` before
    each query on the first ``far_seqs`` blocks (:mod:`~attnlens.analysis.sinks.far`: a forward pass per head), and a
    head left undecided on twice as many, up to ``far_max_seqs``; a head whose cost lies above ``far_margin`` nats of
    next-token loss looks far.
    """

    num_seqs: int = 64
    seq_len: int = 64
    batch_size: int = 16
    epsilon: float = GU_EPSILON
    fraction: float = H2O_FRACTION
    top: float = HEAVY_TOP
    min_keys: int = 20
    far: bool = False
    far_seqs: int = 16
    far_max_seqs: int = 64
    window: int = 16
    far_margin: float = FAR_MARGIN
    bootstrap: int = 1000

    def validate(self) -> None:
        super().validate()
        at_least("num_seqs", self.num_seqs, 2)
        probability("epsilon", self.epsilon)
        probability("fraction", self.fraction)
        probability("top", self.top)
        at_least("min_keys", self.min_keys, 1)
        at_least("window", self.window, 1)
        at_least("far_seqs", self.far_seqs, 2)
        at_least("far_margin", self.far_margin, 0)
        if self.far and self.far_max_seqs > self.num_seqs:
            raise BadInput(
                f"`far_max_seqs` {self.far_max_seqs} is more than the {self.num_seqs} blocks read; "
                f"give `far_max_seqs` {self.num_seqs} or less"
            )
        if self.far and self.far_seqs > self.far_max_seqs:
            raise BadInput(
                f"`far_seqs` {self.far_seqs} is more than `far_max_seqs` {self.far_max_seqs}; give it {self.far_max_seqs} or less"
            )
        if self.min_keys > self.seq_len:
            raise BadInput(
                f"`min_keys` {self.min_keys} is more than the {self.seq_len} keys of a block: no row would be read; "
                f"give `min_keys` {self.seq_len} or less"
            )
        at_least("bootstrap", self.bootstrap, 100)

    @property
    def fractions(self) -> tuple[float, ...]:
        """The shares of a row's keys the heavy-hitter curve reads: :data:`TOP_FRACTIONS` and ``top``."""
        return tuple(sorted({*TOP_FRACTIONS, self.top}))
