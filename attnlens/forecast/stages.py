"""Each stage's work (:class:`~attnlens.forecast.work.Item`), counted from the settings the report gives it.

One function a stage, mirroring what the analysis runs (its module named in each docstring). A count
that the analysis decides as it goes is a range (:mod:`attnlens.forecast.work`). ``tests/test_forecast.py``
counts what a small run of each stage really runs and checks these counts against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from attnlens.analysis.plan.choices import windows
from attnlens.analysis.reconstruct.cost import default_ks
from attnlens.analysis.sequential import FIRST_LOOK
from attnlens.data.positions import parse_classes
from attnlens.forecast.units import Unit
from attnlens.forecast.work import Item, batches, examples

if TYPE_CHECKING:
    from attnlens.analysis.dam.settings import DamSettings
    from attnlens.analysis.eigen import EigenSettings
    from attnlens.analysis.importance import ImportanceSettings
    from attnlens.analysis.plan.settings import PlanSettings
    from attnlens.analysis.reconstruct.settings import ReconstructSettings
    from attnlens.analysis.sinks.settings import SinkSettings
    from attnlens.analysis.task.prepare import PreparedTask
    from attnlens.analysis.task.settings import TaskSettings

SWAP_CANDIDATES = 8  # attnlens.analysis.dam.reference: the swaps a round judges at a time
FAR_UNDECIDED = 0.2  # heads a first round leaves undecided, measured again (gemma3-270m: 12 of 72 after 16 blocks)
PLAN_LOOKS = (192, 384, 768)  # attnlens.analysis.plan.judging.EARLY_LOOKS


@dataclass(frozen=True)
class Facts:
    """What the counts need of the model and the data: its layers and heads, whether it is causal, whether
    the reconstruction's maps are one per query, its objective, and the task each stage judges by, prepared as the stage
    prepares it (``tasks`` by stage; ``cached``: the stages whose probe's training features are already cached)."""

    layers: int
    heads: int
    causal: bool
    per_query: bool
    objective: str  # what the model's "auto" objective is (a bare encoder's hidden states need a reference forward)
    tasks: dict[str, PreparedTask] = field(default_factory=dict)
    cached: frozenset[str] = frozenset()


def eigen_work(s: EigenSettings) -> list[Item]:
    """:func:`attnlens.analysis.eigen.eigen`: the blocks folded into moments (the eigendecompositions are seconds)."""
    return [batches("moments of the blocks", "moments", s.num_seqs, s.batch_size, s.seq_len, s.per_query)]


def sinks_work(s: SinkSettings, facts: Facts) -> list[Item]:
    """:func:`attnlens.analysis.sinks.sinks`: one forward pass per batch of blocks, its weights read as they are made;
    with ``far``, a language model's unmodified losses and a forward pass per head on ``far_seqs`` blocks."""
    # the backbone alone with its weights read layer by layer: priced as a batch of moments (the eigen stage's pass)
    items = [batches("the blocks' attention weights", "moments", s.num_seqs, s.batch_size, s.seq_len)]
    if s.far and facts.objective == "clm":
        heads = facts.layers * facts.heads
        items.append(
            batches("each head kept to the sink and a window", "changed", s.far_seqs, s.batch_size, s.seq_len, passes=heads + 1)
        )
        if s.far_max_seqs > s.far_seqs:  # the heads not decided, on more blocks: as many as gemma3-270m's
            again = math.ceil(FAR_UNDECIDED * heads) + 1
            more = s.far_max_seqs - s.far_seqs
            items.append(batches("undecided heads on more blocks", "changed", more, s.batch_size, s.seq_len, passes=again))
    return items


def reconstruct_work(s: ReconstructSettings, facts: Facts) -> list[Item]:
    """:func:`attnlens.analysis.reconstruct.reconstruct`: the fitted blocks' moments, the held-out rows,
    every config's maps fitted and measured, the plug-in runs, and the task's judgements."""
    n, b, per_query = s.seq_len, s.batch_size, facts.per_query
    held = max(1, round(s.eval_fraction * s.num_seqs))
    items = [
        batches("moments of the fitted blocks", "moments", s.num_seqs - held, b, n, per_query),
        batches("the held-out rows", "scores", held, b, n),
    ]
    ks = [k for k in (s.maps.ks or default_ks(n)) if k <= n]
    configs = [(strategy, scope, k) for strategy in s.maps.strategies for scope in s.maps.scopes for k in ks]
    for strategy in s.maps.strategies:
        for scope in s.maps.scopes:  # the selection order, once per strategy and scope: per layer but for "all"
            items.append(
                Item(
                    f"selection order, {strategy}/{scope}",
                    Unit(f"order {strategy} {scope}", 1, n, per_query),
                    1 if scope == "all" else facts.layers,
                )
            )
    items += [Item(f"maps, {st}/{sc} k={k}", Unit(f"fit {st} {sc}", k, n, per_query), facts.layers) for st, sc, k in configs]
    items.append(
        batches("maps measured on the held-out rows", "measure", held, b, n, per_query, passes=len(configs) * facts.layers)
    )
    if not s.plug_in.enabled:
        return items
    plugged = [c for c in configs if c[1] in (s.plug_in.scopes or s.maps.scopes)]
    items += [
        batches("plug-in: the unmodified objective", "objective", held, b, n, passes=references(s.plug_in.objective, facts) + 1),
        batches("plug-in: each config inside attention", "changed", held, b, n, passes=len(plugged)),
    ]
    task = facts.tasks.get("reconstruct")
    if task is not None:
        on = s.on_task
        judged = [c for c in plugged if all(w is None or v in w for v, w in zip(c, (on.strategies, on.scopes, on.ks)))]
        items += task_work(s.task, task, b, len(judged), cached="reconstruct" in facts.cached)
    return items


def importance_work(s: ImportanceSettings, facts: Facts) -> list[Item]:
    """:func:`attnlens.analysis.importance.importance`: per held-out batch, the unmodified pass (the mass),
    each ablation and its random control, and the gradients; then each task class and its control judged."""
    n, b = s.seq_len, s.batch_size
    classes = len(parse_classes(s.classes, facts.causal))
    per = {"model": 1, "layer": 1 + facts.layers, "head": 1 + facts.layers * facts.heads}[s.per]
    items = [
        batches("the objective's references", "objective", s.num_seqs, b, n, passes=references(s.objective, facts)),
        batches("the unmodified pass (attention mass)", "changed", s.num_seqs, b, n),
        batches("each class ablated, and its random control", "changed", s.num_seqs, b, n, passes=2 * classes * per),
    ]
    if s.gradient:
        items.append(batches("gradient importance", "step", s.num_seqs, b, n))
    task = facts.tasks.get("importance")
    if task is not None:
        chosen = len(parse_classes(s.task_classes)) if s.task_classes is not None else classes
        items += task_work(s.task, task, b, 2 * chosen, compares=chosen, cached="importance" in facts.cached)
    return items


def dam_work(s: DamSettings, facts: Facts) -> list[Item]:
    """:func:`attnlens.analysis.dam.dam`: the splits' references and baseline, the fixed patterns, each run's
    training (its stopping rule: a range), swap searches and judgements, and the task's judgements."""
    from attnlens.analysis.dam.judging import pattern_points

    n, b = s.seq_len, s.batch_size
    runs = len(s.runs())
    train_batches = s.train_seqs / b
    every = max(s.stopping.check_window // 2, 1)  # the convergence check judges the mask on its training blocks this often
    least, most = min(s.training.steps, s.stopping.window), s.training.steps  # the rule first looks after a window
    judged = batches("", "changed", s.train_seqs, b, n)
    items = [
        batches("the unmodified baseline", "objective", s.eval_seqs, b, n),
        batches(
            "the objective's references",
            "objective",
            s.eval_seqs + s.train_seqs,
            b,
            n,
            passes=references(s.judging.objective, facts),
        ),
        # the schedule (learning rate, noise, temperature) ends at the cap, and the stopping rule, which waits for the
        # mask to stop flipping, rarely stops far before it: the cap is the forecast, twice the window the least
        Item("training steps", Unit("step", min(b, s.train_seqs), n), runs * most, runs * least, runs * most),  # a batch a step
        Item(
            "the mask judged as it trains",
            judged.unit,
            runs * (2 + most // every) * judged.count,
            runs * (2 + least // every) * judged.count,
            runs * (2 + most // every) * judged.count,
        ),  # fmt: skip
        batches("each mask judged (training and held-out blocks)", "changed", s.train_seqs + s.eval_seqs, b, n, passes=runs),
    ]
    points = len(pattern_points(n, facts.causal)) if s.judging.patterns else 0
    if points:
        items.append(batches("the fixed patterns", "changed", s.eval_seqs, b, n, passes=points))
    polish = s.judging.polish_rounds if s.target.lambdas is None and not s.training.train_weights else 0
    searched = len(s.target.targets) if s.judging.reference is not None and s.target.lambdas is None else 0
    for what, searches, rounds in (
        ("swap search (polish)", runs, polish),
        ("swap search (reference)", searched, s.judging.reference_rounds),
    ):
        if searches and rounds:  # a round: the mask's gradient, then swaps judged SWAP_CANDIDATES at a time
            items.append(
                Item.ranged(f"{what}: gradients", Unit("step", b, n), searches * train_batches, searches * rounds * train_batches)
            )
            trials = SWAP_CANDIDATES * train_batches
            items.append(
                Item.ranged(f"{what}: swaps judged", Unit("changed", b, n), searches * trials, searches * rounds * 2 * trials)
            )
    task = facts.tasks.get("dam")
    if task is not None:
        compared = 0 if not points or s.training.train_weights else points if s.judging.task_patterns == "all" else 3 * runs
        items += task_work(s.task, task, b, runs + compared, cached="dam" in facts.cached)
    return items


def plan_work(s: PlanSettings, facts: Facts) -> list[Item]:
    """:func:`attnlens.analysis.plan.plan`: the maps' moments, every head's curve (one change per head and
    choice), then per budget the search along the path and the methods judged on the check half."""
    n, b = s.seq_len, s.batch_size
    units, choices = facts.layers * facts.heads, len(s.ks) + len(windows(s.widths, causal=facts.causal))
    items = []
    if s.ks:
        items.append(batches("moments of the fit blocks", "moments", s.fit_seqs, b, n, facts.causal))
    task = facts.tasks.get("plan") if s.max_drop is not None else None
    kinds = int(bool(s.ks)) + int(bool(s.widths))
    (least, most), checks = _searched(units, choices, kinds, len(s.budgets)), _checked(kinds, len(s.budgets))
    if task is None:  # the proxy: the curves and every plan on corpus blocks
        select, held = batches("", "changed", s.select_seqs, b, n), batches("", "changed", s.eval_seqs, b, n)
        return [
            *items,
            batches(
                "the objective's references",
                "objective",
                s.curve_seqs + s.select_seqs + s.eval_seqs,
                b,
                n,
                passes=references(s.objective, facts),
            ),
            batches("curves: one change per head and choice", "changed", s.curve_seqs, b, n, passes=units * choices),
            Item(
                "plans judged on the selection blocks",
                select.unit,
                least * select.count,
                least * select.count,
                most * select.count,
            ),
            _checks("plans judged on the held-out blocks", held, checks),
        ]
    half = int(s.task.task_eval) // 2
    curve, size = task.train.take(slice(0, s.curve_seqs)), min(s.curve_seqs, b)
    items.append(examples("curves: the unmodified predictions", "features", curve, size))
    if s.screened:  # every head at once: a forward and a backward per class, whatever the heads and choices
        screen = examples("curves: the screen, a backward per class", "screen", curve, size)
        items.append(replace(screen, count=len(task.task.label_names) * screen.count))
    else:
        per_curve = examples("curves: one change per head and choice", "judged", curve, size)
        items.append(replace(per_curve, count=units * choices * per_curve.count))
    if "plan" not in facts.cached:
        items.append(examples("task: the probe's training features", "features", task.train, b))
    pool, first = task.pool, min(PLAN_LOOKS[0], half)
    one = replace(examples("", "judged", pool, b), count=half / b)  # a plan judged on a half, whole
    return [
        *items,
        examples("task: the unmodified outcomes", "features", pool, b),
        # the least plans, each seen whole (one that misses may stop early, after its first look)
        Item("plans judged on the choosing half", one.unit, least * one.count, least * first / b, most * one.count),
        _checks("plans judged on the check half", one, checks),
    ]


def task_work(
    t: TaskSettings, task: PreparedTask, batch: int, changes: int, compares: int = 0, cached: bool = False
) -> list[Item]:
    """A task judging ``changes`` changes (and ``compares`` comparisons between two of them): the probe's
    training features unless cached, the unmodified outcomes, and each change on its examples: between the
    first look and the pool where judged sequentially (:mod:`attnlens.analysis.sequential`)."""
    pool = task.pool
    auto = t.task_eval == "auto"
    first, last = (min(FIRST_LOOK, len(pool)), len(pool)) if auto else (len(pool), len(pool))
    items = []
    if task.protocol != "head" and not cached:
        items.append(examples("task: the probe's training features", "features", task.train, batch))
    items.append(examples("task: the unmodified outcomes", "features", pool, batch, first, last))
    runs = t.seeds * t.finetune_steps if t.protocol == "finetune" else 0
    if runs:  # each change inside fine-tuning, on each seed: the steps, then its examples
        items.append(Item("task: fine-tuning steps", Unit("train", batch, pool.ids.shape[1]), (changes + 1) * runs))
    items.append(examples(f"task: {changes} changes judged", "judged", pool, batch, changes * first, changes * last))
    if compares and auto:  # a comparison needs about the examples its two changes were judged on: it extends them at most
        unit = examples("", "judged", pool, batch).unit
        items.append(Item("task: comparisons extended", unit, 0.0, 0.0, compares * 2 * (last - first) / batch))
    return items


def references(objective: str, facts: Facts) -> int:
    """The passes an objective's references take over a split: one for ``hidden`` (the unmodified model's
    final hidden states, :meth:`~attnlens.analysis.objectives.Objective.prepare`), none for a language model's loss."""
    return int((facts.objective if objective == "auto" else objective) == "hidden")


def _searched(units: int, choices: int, kinds: int, budgets: int) -> tuple[int, int]:
    """How many plans the budgets' search judges on the choosing data: at least one binary search along the path (its
    steps: every head's choices in turn), since a later budget finds the path's points and the uniform plans judged
    already (minilm-l6's and gemma3-270m's reports judged 16–19 plans in all at two budgets, their checks included);
    at most, per budget, that search, every uniform plan and the methods compared."""
    search = math.ceil(math.log2(units * choices + 1)) + 1
    return search, budgets * (search + choices + _methods(kinds))


def _checked(kinds: int, budgets: int) -> tuple[int, int, int]:
    """How many plans the check judges: at least each budget's random allocation and one plan; as a rule each budget's
    plan and random allocation and each kind's two uniform plans, the same for every budget; at most every method of
    every budget."""
    return budgets + 1, 2 * budgets + 2 * kinds, budgets * _methods(kinds)


def _checks(what: str, one: Item, checks: tuple[int, int, int]) -> Item:
    """The check's plans (``one``: a plan judged on its data), as many as the rule of :func:`_checked`, within its range."""
    low, rule, high = (count * one.count for count in checks)
    return Item(what, one.unit, rule, low, high)


def _methods(kinds: int) -> int:
    """The methods a budget compares on the check: the plan, the random allocation, and per kind of choice
    (partial, window) the cheapest uniform plan and the uniform plan at the plan's FLOPs."""
    return 2 + 2 * kinds
