"""The skeleton shared by the analyses that change attention and judge the change on held-out blocks.

:meth:`Experiment.start` is the prologue of :func:`~attnlens.analysis.importance.importance`
and :func:`~attnlens.analysis.dam.dam`: the corpus and the model (loaded unless given),
the checks that need them (with ``task``, every check of the task's: :func:`~attnlens.analysis.task.prepare.prepare_task`,
before the first forward pass), the objective, disjoint held-out and training blocks
(:func:`~attnlens.analysis.evaluation.split_blocks`), the valid masks, the tokens' roles,
and the position classes that occur (a class that never occurs is an error when named,
else dropped with a note). :meth:`Experiment.split` gives a set of blocks as judging needs
them (:class:`Split`), and :meth:`Experiment.metadata` the result's ``meta``.

>>> from attnlens.analysis.importance import ImportanceSettings
>>> experiment = Experiment.start("minilm-l6", ImportanceSettings.build(seq_len=16), classes="self,cls,other", num_eval=4)
>>> experiment.classes, experiment.valid.shape
(('self', 'cls', 'other'), torch.Size([6, 16, 16]))
>>> held_out = experiment.split(experiment.held_out, batch_size=3)
>>> [batch.input_ids.shape[0] for batch in held_out.inputs]
[3, 1]
>>> [view.index for view in held_out.views] == experiment.held_out.index[[0, 3]].tolist()   # each batch's first block
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlens.analysis.changes import Batch
from attnlens.analysis.evaluation import Starts, check_classes_occur, class_counts, prepare_batches, split_blocks, valid_masks
from attnlens.analysis.objectives import Objective
from attnlens.analysis.task.prepare import PreparedTask, prepare_task
from attnlens.analysis.task.settings import TaskSettings
from attnlens.data.corpus import Blocks, Corpus, load_corpus
from attnlens.data.positions import TokenRoles, class_masks, parse_classes, token_roles
from attnlens.data.tasks import Examples
from attnlens.io.provenance import result_meta
from attnlens.models.loading import LoadedModel, load_model
from attnlens.models.precision import DEFAULT_PRECISION
from attnlens.settings import CorpusSettings


@dataclass
class Split:
    """A set of sequences as judging needs them, one entry per batch: what the objective
    evaluates (``inputs``: :class:`~attnlens.analysis.objectives.PreparedBatch` of corpus
    blocks, or :class:`~attnlens.analysis.task.TaskBatch` of task examples) and what a change
    reads (``views``); ``ids`` (sequences, n) are the tokens as read; ``starts`` lets a change to
    layers ≥ l run from layer l."""

    inputs: list
    views: list[Batch]
    ids: torch.Tensor
    starts: Starts | None = None  # each batch's layer inputs, so a change to layers >= l runs from l

    @property
    def sizes(self) -> list[int]:
        return [view.ids.shape[0] for view in self.views]

    @classmethod
    def of_examples(cls, examples: Examples, model: LoadedModel, batch_size: int, precision: str = DEFAULT_PRECISION) -> Split:
        """Task examples in batches (their first example's number seeds their draws); a change to layers
        ≥ l judged through :func:`~attnlens.analysis.evaluation.evaluate_change` runs from layer l, its
        layer inputs recorded at the ``precision`` of the task that judges it."""
        from attnlens.analysis.task import batches

        inputs = list(batches(examples, batch_size, model.device))
        starts = Starts(model, precision=precision)
        return cls(inputs, [batch.view(model) for batch in inputs], torch.from_numpy(examples.ids), starts)


@dataclass
class Experiment:
    """What importance and DAM share before their own work; see the module docstring."""

    model: LoadedModel
    corpus: Corpus
    objective: Objective
    held_out: Blocks
    train: Blocks | None
    valid: torch.Tensor  # (layer, n, n) of unpadded blocks, on the CPU
    roles: TokenRoles  # of the held-out blocks
    classes: tuple[str, ...]  # the classes that occur
    counts: dict[str, int]  # valid (layer, block, query, key) positions of every class asked for
    notes: dict[str, str]  # class -> why it was dropped
    task: PreparedTask | None = None  # the task, loaded, checked and split before any forward pass

    @classmethod
    def start(
        cls,
        source: str | LoadedModel,
        s: CorpusSettings,
        *,
        classes: str | tuple[str, ...] | None = None,
        objective: str = "auto",
        num_eval: int,
        num_train: int = 0,
        device: str = "cpu",
        task: TaskSettings | None = None,
        task_pad_to: int | None = None,
        task_trains: bool = False,
        precision: str = DEFAULT_PRECISION,
    ) -> Experiment:
        """The prologue, for corpus settings ``s``, the position ``classes`` and the ``objective`` (its
        forwards at ``precision``, :mod:`attnlens.models.precision`);
        with ``task`` (settings whose task judges the analysis), the task prepared at ``s.seq_len``
        (padded to ``task_pad_to``; ``task_trains``: something trains on its examples) before the first
        forward pass, so a task that cannot be judged costs seconds, not the passes before its judge."""
        parse_classes(classes)  # a bad name fails before the model loads
        corpus = s.corpus if isinstance(s.corpus, Corpus) else load_corpus(s.corpus)
        model = source if isinstance(source, LoadedModel) else load_model(source, device=device)
        named = parse_classes(classes, model.causal)
        model.check_seq_len(s.seq_len)
        prepared = None
        if task is not None and task.name is not None:
            prepared = prepare_task(model, task, seq_len=s.seq_len, seed=s.seed, pad_to=task_pad_to, train_needed=task_trains)
        judged_by = Objective(model, objective, seed=s.seed, precision=precision)
        held_out, train = split_blocks(corpus, model, s.seq_len, num_eval, num_train, seed=s.seed)
        valid = valid_masks(model, held_out.ids)
        ids = torch.from_numpy(held_out.ids)
        roles = token_roles(ids, model)
        counts = class_counts(class_masks(ids, model, named, roles=roles), valid)
        occurring, notes = check_classes_occur(named, counts, model, len(held_out), explicit=classes is not None)
        return cls(model, corpus, judged_by, held_out, train, valid, roles, occurring, counts, notes, prepared)

    def split(self, blocks: Blocks, batch_size: int, objective: Objective | None = None) -> Split:
        """Corpus ``blocks`` in batches: the inputs of ``objective`` (default the experiment's; its
        references from the unmodified model, prepared once, at its precision) and the views, seeded by
        each batch's first block in the corpus."""
        objective = objective or self.objective
        inputs = prepare_batches(objective, blocks.ids, batch_size)
        ids = torch.from_numpy(blocks.ids)
        starts = range(0, len(blocks), batch_size)
        views = [
            Batch(ids[start : start + batch_size].to(self.model.device), self.model, int(blocks.index[start])) for start in starts
        ]
        return Split(inputs, views, ids, Starts(self.model, precision=objective.precision))

    def metadata(self, s: CorpusSettings, command: str | None, *, settings: dict, **extra: object) -> dict[str, object]:
        """The result's ``meta``: the model, the corpus with the blocks it gave, the settings as
        run (``settings`` adds to ``s``), the roles and notes, ``extra`` and provenance."""
        corpus = {
            **self.corpus.describe(),
            "blocks_available": self.held_out.available,
            **(
                {"block_index": self.held_out.index.tolist()}
                if self.train is None
                else {"eval_block_index": self.held_out.index.tolist(), "train_block_index": self.train.index.tolist()}
            ),
        }
        dropped = [name for name in self.notes]
        run = {"classes": list(self.classes), "classes_dropped": dropped, "objective": self.objective.name, "n": s.seq_len}
        return result_meta(
            model=self.model.describe(),
            corpus=corpus,
            settings={**s.to_dict(), **run, **settings},
            command=command,
            roles=self.roles.description,
            notes=self.notes,
            **extra,
        )
