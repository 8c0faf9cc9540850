"""Task accuracy: judge a change to attention by what a classifier on the model gets right.

The papers judge attention by a downstream task (MNLI, GLUE); so can attnlens, on a
labelled task (:mod:`attnlens.data.tasks`), under one of four protocols (``auto``, the
default: ``head`` for a model with a sequence-classification head, ``probe`` otherwise):

- ``probe``: the frozen model's pooled features (:data:`POOLING`: the mean of the valid
  tokens' final hidden states for encoders, the last valid token's for decoders), a
  scikit-learn logistic regression (features standardised by :func:`standardiser`, L2
  penalty ``probe_c``, chosen by cross-validation unless given) fitted on the
  **unmodified** model's training features. A change is judged by the held-out
  accuracy of that same probe on the changed model's features: the readout does not adapt.
- ``refit``: the probe is fitted again on the changed model's training features (a
  readout that adapts to the change, the encoder still frozen).
- ``finetune``: the encoder and a linear head on the pooled features trained together,
  with the change inside attention during training (the papers' protocol). The head
  (:class:`ProbeHead`) starts from the unmodified probe; ``finetune_steps`` AdamW steps on
  the training examples, dropout on (the fixed budget is the stopping rule; the curve is
  recorded). Each run's weights are cached under the attnlens cache, keyed by model, task,
  split, probe, settings, change and seed, so a rerun loads them instead of training.
- ``head``: the model's own classification head (a local ``…ForSequenceClassification``
  directory, such as a model fine-tuned on the task), its classes matched to the task's
  by name through its ``id2label``; no probe.

Every judgement carries the accuracy with a percentile-bootstrap interval over held-out
examples, the change in accuracy paired over examples with its interval (with ``task_eval="auto"``
judged sequentially, :mod:`attnlens.analysis.sequential`: each change on as many examples as
its interval needs to decide against the ``margin``), the probe's cross-entropy, the
unmodified model's accuracy and the majority-class baseline on the same examples. Every judged
change's per-example outcomes are kept (:meth:`TaskJudge.outcome_arrays`), so a result can re-pair any two.

The package, one idea a module: :mod:`~attnlens.analysis.task.settings` (what to judge by, and
the constants), :mod:`~attnlens.analysis.task.prepare` (the task loaded, excluded, checked and split
before any model pass), :mod:`~attnlens.analysis.task.batching` (batches, pooled features, a change on a
batch), :mod:`~attnlens.analysis.task.probe`, :mod:`~attnlens.analysis.task.outcomes` (per-example
outcomes and their statistics), :mod:`~attnlens.analysis.task.head` and
:mod:`~attnlens.analysis.task.finetune` (two of the protocols) and :mod:`~attnlens.analysis.task.judge`
(:class:`TaskJudge`, which uses them all). Every public name is exported here.

>>> from attnlens import load_model
>>> judge = TaskJudge(load_model("minilm-l6"), TaskSettings(name="rotten-tomatoes", task_train=64, task_eval=32),
...                   seq_len=64, batch_size=32)
>>> unmodified = judge.judge(None)
>>> unmodified["accuracy"] == judge.unmodified_accuracy, unmodified["delta_accuracy"]
(True, 0.0)
"""

from attnlens.analysis.task.batching import TaskBatch, batches, in_order, pooled_features
from attnlens.analysis.task.finetune import FINETUNE_VERSION, content_key
from attnlens.analysis.task.head import head_columns
from attnlens.analysis.task.judge import TaskJudge, TaskLoss
from attnlens.analysis.task.outcomes import (
    SEED_COLUMN,
    UNMODIFIED,
    outcome_arrays,
    paired_difference,
    seed_columns,
    seed_differences,
    seed_values,
    seeds_difference,
    t_halfwidth,
    t_interval,
    task_columns,
)
from attnlens.analysis.task.prepare import PreparedTask, prepare_task, resolve_protocol
from attnlens.analysis.task.probe import CONSTANT_SPREAD, PROBE_CS, Probe, ProbeHead, choose_c, fit_probe, standardiser
from attnlens.analysis.task.settings import (
    AUTO,
    AUTO_POOL,
    DEFAULT_TRAIN,
    FEATURES_VERSION,
    MIN_HELD_OUT,
    POOLING,
    PROTOCOLS,
    TaskSettings,
)

__all__ = [
    "AUTO",
    "AUTO_POOL",
    "CONSTANT_SPREAD",
    "DEFAULT_TRAIN",
    "FEATURES_VERSION",
    "FINETUNE_VERSION",
    "MIN_HELD_OUT",
    "POOLING",
    "PROBE_CS",
    "PROTOCOLS",
    "UNMODIFIED",
    "Probe",
    "PreparedTask",
    "ProbeHead",
    "TaskBatch",
    "TaskJudge",
    "TaskLoss",
    "TaskSettings",
    "batches",
    "choose_c",
    "content_key",
    "fit_probe",
    "head_columns",
    "in_order",
    "outcome_arrays",
    "paired_difference",
    "pooled_features",
    "prepare_task",
    "resolve_protocol",
    "SEED_COLUMN",
    "seed_columns",
    "seed_differences",
    "seed_values",
    "seeds_difference",
    "standardiser",
    "t_halfwidth",
    "t_interval",
    "task_columns",
]
