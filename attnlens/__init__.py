"""attnlens: look inside the self-attention of pretrained transformers.

The pipeline, one module per step: :mod:`~attnlens.models` (load a model),
:mod:`~attnlens.corpus` (text into blocks of n tokens), :mod:`~attnlens.capture`
(record or change attention), :mod:`~attnlens.store` (captured scores on disk),
:mod:`~attnlens.extract` (corpus -> capture -> store), :mod:`~attnlens.moments`
(streaming row sums), :mod:`~attnlens.eigen` and :mod:`~attnlens.overlap` (spectra and
shared subspaces), :mod:`~attnlens.reconstruct` (partial computation),
:mod:`~attnlens.positions` (position classes), :mod:`~attnlens.importance` (mass, ablation
and gradient importance of position classes), :mod:`~attnlens.dam` (learned attention
masks), :mod:`~attnlens.patterns` (fixed sparse patterns), :mod:`~attnlens.report` (every
analysis of a model in one HTML page) and :mod:`~attnlens.figures` (one function per figure).
Scaling out: :mod:`~attnlens.job` (moments sharded over torchrun ranks and passes, resumable),
:mod:`~attnlens.partials` (partial files, merging, merged moments), :mod:`~attnlens.budget`
(memory plans), :mod:`~attnlens.distributed` (ranks and exact sums on torch.distributed).
"""

from .capture import Capture
from .corpus import Blocks, Corpus, load_corpus
from .dam import DamResult, dam
from .eigen import EigenResult, eigen
from .errors import AttnlensError
from .extract import extract
from .importance import ImportanceResult, importance
from .job import run_moments
from .models import LoadedModel, list_models, load_model
from .moments import Moments
from .overlap import OverlapResult, overlap
from .partials import MomentsResult, load_moments, merge_partials
from .positions import class_masks, parse_classes
from .reconstruct import ReconstructResult, reconstruct
from .results import load_result
from .store import Store, open_store

__all__ = [
    "AttnlensError",
    "Blocks",
    "Capture",
    "Corpus",
    "DamResult",
    "EigenResult",
    "ImportanceResult",
    "LoadedModel",
    "Moments",
    "MomentsResult",
    "OverlapResult",
    "ReconstructResult",
    "Store",
    "class_masks",
    "dam",
    "eigen",
    "extract",
    "importance",
    "list_models",
    "load_corpus",
    "load_model",
    "load_moments",
    "load_result",
    "merge_partials",
    "open_store",
    "overlap",
    "parse_classes",
    "reconstruct",
    "run_moments",
]
