"""attnlens: look inside the self-attention of pretrained transformers.

The package's folders are the pipeline, each depending only on those before it:

- :mod:`attnlens.models` — load a model (aliases, conversions, cache) and **capture**, the
  one place that reads and changes attention;
- :mod:`attnlens.data` — corpora packed into blocks of n tokens, position classes, labelled tasks;
- :mod:`attnlens.io` — the store of captured scores on disk, extraction into it, results
  (one base class, one registry), atomic files, ranks on torch.distributed;
- :mod:`attnlens.rows` — row sources (store or model), the one moments engine, and moments
  jobs sharded over ranks and passes (memory budgets, partial files, merging);
- :mod:`attnlens.analysis` — eigen, overlap, reconstruct, importance, dam (with fixed
  patterns), sinks (the first-token sink and heavy hitters), plan (the cheapest attention within a budget), objectives, task accuracy (probe, refit, finetune) and held-out evaluation;
- :mod:`attnlens.figures` — one module per result kind, drawing saved numbers only;
- :mod:`attnlens.report` — every analysis of a model in one HTML page;
- :mod:`attnlens.cli` — the ``attnlens`` command, a thin layer over the functions here.

Every analysis takes a source and one frozen settings object (``EigenSettings``,
``ReconstructSettings``, ...) or keyword changes to its defaults, and returns a
:class:`Result` that saves, reloads (:func:`load_result`) and draws itself.
"""

import importlib.metadata

from attnlens.analysis.dam import DamResult, DamSettings, dam
from attnlens.analysis.eigen import EigenResult, EigenSettings, eigen
from attnlens.analysis.importance import ImportanceResult, ImportanceSettings, importance
from attnlens.analysis.overlap import OverlapResult, OverlapSettings, overlap
from attnlens.analysis.plan import PlanResult, PlanSettings, plan
from attnlens.analysis.reconstruct import ReconstructResult, ReconstructSettings, reconstruct
from attnlens.analysis.sinks import SinkResult, SinkSettings, sinks
from attnlens.analysis.task import TaskJudge, TaskSettings
from attnlens.data.corpus import Blocks, Corpus, load_corpus
from attnlens.data.positions import class_masks, parse_classes
from attnlens.data.tasks import Task, load_task
from attnlens.errors import AttnlensError, AttnlensWarning, BadFile, BadInput, UnsupportedModel
from attnlens.io.extract import extract
from attnlens.io.results import Result, load_result
from attnlens.io.store import Store, open_store
from attnlens.models.aliases import list_models
from attnlens.models.capture import Capture
from attnlens.models.loading import LoadedModel, load_model
from attnlens.report import Report, report
from attnlens.rows.jobs import run_moments
from attnlens.rows.moments import Moments
from attnlens.rows.partials import MomentsResult, load_moments, merge_partials

try:
    __version__ = importlib.metadata.version("attnlens")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "AttnlensError",
    "AttnlensWarning",
    "BadFile",
    "BadInput",
    "Blocks",
    "Capture",
    "Corpus",
    "DamResult",
    "DamSettings",
    "EigenResult",
    "EigenSettings",
    "ImportanceResult",
    "ImportanceSettings",
    "LoadedModel",
    "Moments",
    "MomentsResult",
    "OverlapResult",
    "OverlapSettings",
    "PlanResult",
    "PlanSettings",
    "ReconstructResult",
    "ReconstructSettings",
    "Report",
    "SinkResult",
    "SinkSettings",
    "Result",
    "Store",
    "Task",
    "TaskJudge",
    "TaskSettings",
    "UnsupportedModel",
    "__version__",
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
    "load_task",
    "merge_partials",
    "open_store",
    "overlap",
    "parse_classes",
    "plan",
    "reconstruct",
    "report",
    "run_moments",
    "sinks",
]
