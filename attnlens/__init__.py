"""attnlens: look inside the self-attention of pretrained transformers.

The pipeline, one module per step: :mod:`~attnlens.models` (load a model),
:mod:`~attnlens.corpus` (text into blocks of n tokens), :mod:`~attnlens.capture`
(record or change attention), :mod:`~attnlens.store` (captured scores on disk),
:mod:`~attnlens.extract` (corpus -> capture -> store).
"""

from .capture import Capture
from .corpus import Blocks, Corpus, load_corpus
from .errors import AttnlensError
from .extract import extract
from .models import LoadedModel, list_models, load_model
from .store import Store, open_store

__all__ = [
    "AttnlensError",
    "Blocks",
    "Capture",
    "Corpus",
    "LoadedModel",
    "Store",
    "extract",
    "list_models",
    "load_corpus",
    "load_model",
    "open_store",
]
