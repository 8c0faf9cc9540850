"""attnlens: look inside the self-attention of pretrained transformers.

The pipeline, one module per step: :mod:`~attnlens.models.loading` (load a model),
:mod:`~attnlens.data.corpus` (text into blocks of n tokens), :mod:`~attnlens.models.capture`
(record or change attention), :mod:`~attnlens.io.store` (captured scores on disk),
:mod:`~attnlens.io.extract` (corpus -> capture -> store), :mod:`~attnlens.rows.moments`
(streaming row sums), :mod:`~attnlens.analysis.eigen` and :mod:`~attnlens.analysis.overlap` (spectra and
shared subspaces), :mod:`~attnlens.analysis.reconstruct` (partial computation),
:mod:`~attnlens.data.positions` (position classes), :mod:`~attnlens.analysis.importance` (mass, ablation
and gradient importance of position classes), :mod:`~attnlens.analysis.dam` (learned attention
masks), :mod:`~attnlens.analysis.dam.patterns` (fixed sparse patterns), :mod:`~attnlens.report` (every
analysis of a model in one HTML page) and :mod:`~attnlens.figures` (one function per figure).
Scaling out: :mod:`~attnlens.rows.jobs` (moments sharded over torchrun ranks and passes, resumable),
:mod:`~attnlens.rows.partials` (partial files, merging, merged moments), :mod:`~attnlens.rows.budgets`
(memory plans), :mod:`~attnlens.io.ranks` (ranks and exact sums on torch.distributed).
"""

from attnlens.models.capture import Capture
from attnlens.data.corpus import Blocks, Corpus, load_corpus
from attnlens.analysis.dam import DamResult, dam
from attnlens.analysis.eigen import EigenResult, EigenSettings, eigen
from attnlens.errors import AttnlensError, BadFile, BadInput, UnsupportedModel
from attnlens.io.extract import extract
from attnlens.analysis.importance import ImportanceResult, importance
from attnlens.rows.jobs import run_moments
from attnlens.models.loading import LoadedModel, list_models, load_model
from attnlens.rows.moments import Moments
from attnlens.analysis.overlap import OverlapResult, overlap
from attnlens.rows.partials import MomentsResult, load_moments, merge_partials
from attnlens.data.positions import class_masks, parse_classes
from attnlens.analysis.reconstruct import ReconstructResult, reconstruct
from attnlens.io.results import Result, load_result
from attnlens.io.store import Store, open_store

__all__ = [
    "AttnlensError",
    "BadFile",
    "BadInput",
    "Blocks",
    "Capture",
    "Corpus",
    "DamResult",
    "EigenResult",
    "EigenSettings",
    "ImportanceResult",
    "LoadedModel",
    "Moments",
    "MomentsResult",
    "OverlapResult",
    "ReconstructResult",
    "Result",
    "Store",
    "UnsupportedModel",
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
