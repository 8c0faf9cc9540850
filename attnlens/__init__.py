"""attnlens: look inside the self-attention of pretrained transformers.

The pipeline, one module per step: :mod:`~attnlens.models` (load a model),
:mod:`~attnlens.corpus` (text into blocks of n tokens), :mod:`~attnlens.capture`
(record or change attention), :mod:`~attnlens.store` (captured scores on disk),
:mod:`~attnlens.extract` (corpus -> capture -> store), :mod:`~attnlens.positions`
(position classes), :mod:`~attnlens.importance` (mass, ablation and gradient importance
of position classes), :mod:`~attnlens.dam` (learned attention masks) and
:mod:`~attnlens.patterns` (fixed sparse patterns).
"""

from .capture import Capture
from .corpus import Blocks, Corpus, load_corpus
from .dam import DamResult, dam
from .errors import AttnlensError
from .extract import extract
from .importance import ImportanceResult, importance
from .models import LoadedModel, list_models, load_model
from .positions import class_masks, parse_classes
from .store import Store, open_store

__all__ = [
    "AttnlensError",
    "Blocks",
    "Capture",
    "Corpus",
    "DamResult",
    "ImportanceResult",
    "LoadedModel",
    "Store",
    "class_masks",
    "dam",
    "extract",
    "importance",
    "list_models",
    "load_corpus",
    "load_model",
    "open_store",
    "parse_classes",
]
