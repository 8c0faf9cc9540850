"""The report's presets: what each stage runs and on how much data (``--quick``, the default, ``--full``),
and how long each stage took when last measured on MiniLM (the times the help states).

A preset is a :class:`ReportSettings`: each stage's own analysis settings (:class:`EigenSettings`,
:class:`ReconstructSettings`, ...), exactly what the stage passes to its analysis, so no field is
copied by hand. :data:`FULL` runs everything the claims rest on, at the largest size its budget of
30 minutes on 2 cores allows (where a claim stays undecided there, its verdict says why).
:data:`DEFAULT` keeps what decides within the budget of 10 minutes on 2 cores
(``bench/bench_report.py`` measures it) and runs DAM and the plan at :data:`QUICK`'s sizes, so a
reader sees the machinery; the claims those stages carry say what their full size takes. :data:`QUICK` is a first
look at everything in under 2 minutes. :data:`FINETUNE` is the papers' protocol (``--protocol finetune``):
each judged change inside fine-tuning, 33 runs within 90 minutes.

>>> preset("probe", quick=False, full=False) == ("default", DEFAULT)
True
>>> preset("finetune", quick=True, full=False)[0], FULL.dam.mask.seeds, DEFAULT.dam.mask.seeds
('quick', 3, 1)
>>> DEFAULT.reconstruct.task.name, DEFAULT.importance.task.name      # fewer scores judged on texts that fill n
('imdb', 'rotten-tomatoes')
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from attnlens.analysis.dam.settings import DamSettings
from attnlens.analysis.eigen import EigenSettings
from attnlens.analysis.importance import ImportanceSettings
from attnlens.analysis.margin import Margin
from attnlens.analysis.plan.settings import PlanSettings
from attnlens.analysis.reconstruct.settings import ReconstructSettings
from attnlens.analysis.sinks.settings import SinkSettings
from attnlens.analysis.task.settings import TaskSettings, task_of
from attnlens.errors import BadInput
from attnlens.io.legacy import upgraded_settings
from attnlens.models.precision import DEFAULT_PRECISION
from attnlens.settings import Settings, one_of

DECIDING = ("full", "finetune")  # the presets whose undecided claims the data leave open, not the size
STAGES = ("eigen", "sinks", "reconstruct", "importance", "dam", "plan")  # the stages with settings of their own, in order
_NEED_TASK = {
    "reconstruct": ("task_joint_r", "task_joint_ks"),
    "dam": ("train_on", "task_patterns"),
}  # fields that mean nothing without one
_PADDED = ("reconstruct", "plan")  # the stages whose task examples are padded to their n


@dataclass(frozen=True)
class ReportSettings:
    """Each stage's analysis settings, as the stage passes them on (the corpus and the seed are the
    report's, set on every stage by :meth:`for_run`); ``dim``: the overlap matrices' d (``None``:
    picked from the split-half check). A stage whose ``task`` is ``None`` is judged by its proxy
    only; the plan (``None`` without a task) runs only with one: its budgets are points of accuracy. ``sinks``
    (the first-token sink and heavy hitters) runs on decoders only (:meth:`sized_for`): its claims are theirs."""

    eigen: EigenSettings
    reconstruct: ReconstructSettings
    importance: ImportanceSettings
    dam: DamSettings
    plan: PlanSettings | None
    dim: int | None = None
    sinks: SinkSettings | None = None

    def stages(self, **changes: Mapping[str, Any]) -> ReportSettings:
        """These settings with ``changes`` applied to the stages named: ``stages(dam={"steps": 40})``."""
        return dataclasses.replace(
            self, **{name: getattr(self, name).replace(**change) for name, change in changes.items() if getattr(self, name)}
        )

    def for_run(
        self,
        *,
        corpus: str,
        seed: int,
        task: str | None | object = ...,
        precision: str = DEFAULT_PRECISION,
        margin: float | str | None = None,
    ) -> ReportSettings:
        """Every stage on ``corpus`` with ``seed``, its ``ks`` within its n, every stage that judges at ``precision``
        and, where ``task`` is given, that task for every stage the preset judges by one (``None``: none, and no plan);
        ``margin`` (``None``: the preset's) for every stage judged by a task."""
        changed = {}
        for name in STAGES:
            stage: Settings | None = getattr(self, name)
            if stage is None:
                continue
            change: dict[str, Any] = {"corpus": corpus, "seed": seed}
            if "precision" in stage.flat():  # the stages that judge a change (the eigen analysis judges none)
                change["precision"] = precision
            if margin is not None and "margin" in stage.flat():
                change["margin"] = margin
            if task is not ... and task_of(stage) is not None:
                change["task"] = task
            if task is None:  # the proxies only: what needs a task goes back to its default
                defaults = type(stage)().flat()
                change.update(
                    {field: defaults[field] for field in ("protocol", "seeds", *_NEED_TASK.get(name, ())) if field in defaults}
                )
            changed[name] = change
        settings = self.stages(**{name: change for name, change in changed.items() if not (name == "plan" and task is None)})
        recon = settings.reconstruct
        fits = {
            name: tuple(k for k in ks if k <= recon.seq_len)
            for name, ks in (("ks", recon.maps.ks), ("task_ks", recon.on_task.ks))
            if ks
        }
        plan = settings.plan
        if task is None or plan is None:
            plan = None
        else:
            plan = plan.replace(ks=tuple(k for k in plan.ks if k <= plan.seq_len), **_plan_budgets(plan, margin))
        return dataclasses.replace(settings.stages(reconstruct=fits), plan=plan)

    def sized_for(self, causal: bool, windowed: bool = False, keys: int | None = None) -> ReportSettings:
        """These settings for a model: a causal model's maps (the reconstruction's, the plan's partial
        heads) are one per query, fitted on one row per block, so they fit on at least n + 1 blocks
        (more than an encoder's pooled rows need), beside the held-out blocks the preset asks for; so are the
        reconstruction's maps of an encoder with ``windowed`` layers (a local or sliding window shorter than n: its
        queries see different keys).
        ``keys``: the most keys any query of any layer sees at the plan's n (fewer than n where every
        layer is windowed): the plan offers only the ks and widths that save something there, or, where
        none of the preset's does, half and a quarter of those keys. A causal model's report measures its
        sinks and judges removing its first token (``sink``) by task beside the diagonal; an encoder's does
        neither (its first token is ``[CLS]``). Sized before any stage runs: a
        stage that found too few blocks, or no choice to plan, would fail after the others had run.

        >>> causal, encoder = DEFAULT.sized_for(causal=True), DEFAULT.sized_for(causal=False)
        >>> causal.reconstruct.num_seqs, causal.plan.fit_seqs, encoder.reconstruct.num_seqs, encoder.plan.fit_seqs
        (161, 129, 128, 16)
        >>> round(causal.reconstruct.eval_fraction * 161), round(encoder.reconstruct.eval_fraction * 128)  # held out alike
        (32, 32)
        >>> windowed = QUICK.sized_for(causal=False, windowed=True)
        >>> windowed.reconstruct.num_seqs, windowed.plan.fit_seqs, round(windowed.reconstruct.eval_fraction * 81)
        (81, 16, 16)
        >>> narrow = QUICK.sized_for(causal=True, keys=4).plan                # every layer a window of 4 keys
        >>> QUICK.plan.ks, QUICK.plan.widths, narrow.ks, narrow.widths
        ((16,), (8,), (2,), (1,))
        >>> causal.sinks.seq_len, encoder.sinks, causal.importance.task_classes, encoder.importance.task_classes
        (64, None, ('self', 'sink'), ('self',))
        """
        sized = self._for_kind(causal)
        recon = self.reconstruct
        held = max(1, round(recon.eval_fraction * recon.num_seqs))  # held_out_split's count: the preset's, kept
        if (causal or windowed) and recon.num_seqs - held < recon.seq_len + 1:
            blocks = recon.seq_len + 1 + held
            sized = sized.stages(reconstruct={"num_seqs": blocks, "eval_fraction": held / blocks})
        plan = self.plan
        if plan is not None and keys is not None and keys < plan.seq_len:
            ks = tuple(k for k in plan.ks if k < keys) or ((max(1, keys // 2),) if plan.ks else ())
            widths = tuple(w for w in plan.widths if w < keys - 1) or ((max(1, keys // 4),) if plan.widths else ())
            sized = sized.stages(plan={"ks": ks, "widths": widths})
        if causal and sized.plan is not None and sized.plan.ks:
            sized = sized.stages(plan={"fit_seqs": max(sized.plan.fit_seqs, sized.plan.seq_len + 1)})
        return sized

    def _for_kind(self, causal: bool) -> ReportSettings:
        """The sinks stage and the first token judged by task on a causal model; neither on an encoder."""
        if not causal:
            return dataclasses.replace(self, sinks=None)
        chosen = self.importance.task_classes
        if chosen is None or "sink" in chosen:
            return self
        return self.stages(importance={"task_classes": (*chosen, "sink")})

    def judged(self) -> dict[str, tuple[TaskSettings, int, int | None]]:
        """Per stage judged by a task: its task, the width it judges at and the width its examples are padded
        to (the reconstruction's and the plan's changes have the shape of n: their examples keep it)."""
        judged = {}
        for name in STAGES:
            stage = getattr(self, name)
            task = task_of(stage) if stage is not None else None
            if task is not None:
                judged[name] = (task, stage.seq_len, stage.seq_len if name in _PADDED else None)
        return judged

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> ReportSettings:
        """The settings a report saved (:meth:`to_dict`, through JSON), made again.

        >>> ReportSettings.from_dict(json.loads(json.dumps(QUICK.to_dict()))) == QUICK
        True
        """
        classes: dict[str, type[Settings]] = {"eigen": EigenSettings, "sinks": SinkSettings,
                   "reconstruct": ReconstructSettings, "importance": ImportanceSettings, "dam": DamSettings,
                   "plan": PlanSettings}  # fmt: skip
        stages = {
            name: None if saved.get(name) is None else classes[name].build(**upgraded_settings(saved[name])) for name in STAGES
        }
        return cls(**stages, dim=saved.get("dim"))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        stages = {name: getattr(self, name) for name in STAGES}
        return {**{name: None if stage is None else stage.to_dict() for name, stage in stages.items()}, "dim": self.dim}


def _plan_budgets(plan: PlanSettings, margin: float | str | None) -> dict[str, Any]:
    """The plan's budgets for a report's ``margin`` in points: the margin, and half of it (its claim is read at the
    margin, :func:`attnlens.report.plan.headline`); a share of the unmodified accuracy keeps the preset's budgets,
    the claim read at the nearest.

    >>> _plan_budgets(DEFAULT.plan, 3), _plan_budgets(DEFAULT.plan, "3%"), _plan_budgets(DEFAULT.plan, None)
    ({'max_drop': (1.5, 3.0)}, {}, {})
    """
    given = None if margin is None else Margin.parse(margin)
    if given is None or given.relative or plan.max_drop is None:
        return {}
    return {"max_drop": (given.value / 2, given.value)}


_BLOCKS: dict[str, Any] = dict(seq_len=128, batch_size=16)
# The task that judges the claims' changes by accuracy (probe protocol), each sequentially until its
# paired interval decides against the margin (attnlens.analysis.sequential); the probe's training features
# are cached.
_TASK: dict[str, Any] = dict(task="rotten-tomatoes", protocol="probe", task_train=5000, task_eval="auto")
# The task of the claims about computing fewer scores (k exact scores, the plan): a saving is only seen
# on texts that fill the attention it changes. IMDB draws only reviews that fill n (90% of them at n = 128,
# cut to their first n tokens); Rotten Tomatoes' sentences fill a fifth of 128 (median 27 tokens).
_SAVINGS: dict[str, Any] = {**_TASK, "task": "imdb"}

FULL = ReportSettings(
    eigen=EigenSettings.build(num_seqs=256, seq_len=128),
    # a decoder's first-token weight at Gu et al.'s n = 64 and its heavy hitters on 64 blocks (seconds), and each head
    # kept alone to the sink and a recent window on 16 (a forward pass per head: --full's; the default leaves it)
    sinks=SinkSettings(far=True),
    reconstruct=ReconstructSettings.build(
        num_seqs=128,
        ks=(1, 2, 4, 8, 16, 32, 64, 128),
        strategies=("greedy", "random", "stride"),
        scopes=("head", "layer", "all"),
        plug_in=True,
        plug_in_scopes=("head", "all"),
        # the task judges the claims' maps (greedy keys, one per head) at each k; strategies and scopes are
        # compared by the proxy (24 task-judged configs took 812 s of the 30 minutes, measured stage by stage)
        task_ks=(8, 16, 32, 64),
        task_strategies=("greedy",),
        task_scopes=("head",),
        **_BLOCKS,
        **_SAVINGS,
    ),  # fmt: skip
    # held-out blocks of the importance and DAM judgements (the same blocks); each class beside its random control
    importance=ImportanceSettings.build(num_seqs=32, task_classes=("self", "cls", "sep"), **_BLOCKS, **_TASK),
    # DAM learns at n = 64 (attention 4x cheaper than at 128) so that its runs converge within the budget.
    # One target, three masks (each its own noise and batch order): a verdict about a learned mask holds for
    # every seed or for none. The swap search from the band at the target beside them (the reference); a
    # swap search finishes each mask at its target. 300 steps are the cap: the stopping rule ends the
    # schedule when the mask has stopped changing; converged: no improvement over check_window steps.
    dam=DamSettings.build(
        sparsity=(0.9,),
        mask_seeds=3,
        reference="band",
        reference_rounds=20,
        polish_rounds=20,
        steps=300,
        stop_window=20,
        check_window=40,
        train_seqs=64,
        eval_seqs=32,
        task_patterns="compared",
        seq_len=64,
        batch_size=16,
        **_TASK,
    ),  # fmt: skip
    # Per head exact, partial or a window, at the fewest FLOPs within each budget of accuracy (points), chosen
    # on half of task_eval examples and checked on the other half, always by the probe (a fine-tune for every
    # plan the search runs is out of reach). 1,200 examples: the fewest at which one lost example forecasts
    # within the claim's 1 point (1,148, judging.task_eval_needed); every example a plan is judged on costs a
    # forward pass of a full review, and the search judges dozens of plans (those that clearly miss stop early).
    plan=PlanSettings.build(
        max_drop=(1.0, 2.0),
        fit_seqs=64,
        curve_seqs=16,
        eval_seqs=32,
        ks=(1, 2, 4, 8, 16, 32),
        widths=(1, 2, 4, 8, 16, 32, 64),
        forecastable_only=False,
        **_BLOCKS,
        **{**_SAVINGS, "task_eval": 1200},
    ),  # fmt: skip
)
# DAM and the plan at the quick report's sizes (a look at the machinery: their claims say what the full size takes).
_MACHINERY: dict[str, Any] = dict(
    # 40 steps barely move a logit across the threshold: two seeds would end alike; the schedule is not
    # converged, and the claims say so
    dam=dict(mask_seeds=1, reference=None, reference_rounds=2, polish_rounds=2, steps=40, stop_window=10, check_window=10,
             train_seqs=16, task=None, protocol="auto"),
    plan=dict(max_drop=(1.0, 2.0), task_eval=64, fit_seqs=16, curve_seqs=4, ks=(16,), widths=(8,)),
)  # fmt: skip
# The default judges by task only the changes its claims read: the claims' k, and the diagonal beside its random
# control (--full adds [CLS] and [SEP], which no claim reads, 7,500 more examples on minilm-l6).
DEFAULT = FULL.stages(
    # the claims' k judged by the savings task; each k costs about a minute and a half (bench/bench_report.py)
    reconstruct=dict(plug_in_scopes=("head",), task_ks=(16, 32)),
    importance=dict(task_classes=("self",)),
    sinks=dict(far=False),
    **_MACHINERY,
)
QUICK = FULL.stages(
    eigen=dict(seq_len=64, num_seqs=96),
    reconstruct=dict(seq_len=64, num_seqs=64, ks=(1, 4, 16, 64), strategies=("greedy", "random"), scopes=("head", "all"),
                     plug_in_scopes=("head",), task_ks=(16,),
                     task_train=256, task_eval=64),
    importance=dict(seq_len=64, num_seqs=8, task_train=256, task_eval=64),
    sinks=dict(num_seqs=32, far=False),
    # a probe on 256 examples costs seconds: the quick look shows DAM's task too; 20 steps (half the default's)
    # keep the look within 2 minutes: training is most of DAM's time (bench/bench_report.py)
    dam={**_MACHINERY["dam"], "eval_seqs": 8, "steps": 20, "task": _TASK["task"], "protocol": "probe", "task_train": 256,
         "task_eval": 64},
    plan={**_MACHINERY["plan"], "seq_len": 64, "eval_seqs": 8, "task_train": 256},
)  # fmt: skip

# The papers' protocol: the headline changes inside fine-tuning, 3 seeds each (cached per run), at n = 64.
# A run is 200 steps of 16 examples, about 2 minutes on 2 cores (bench/bench_report.py --presets finetune),
# so the runs are the budget: 33 of them fit the 90 minutes. Every stage judges on imdb (reviews that fill
# n = 64), so all stages share one unmodified run per seed. Paper A's questions: R shared by every layer or one
# per layer at k = 16 and 32 (R fixed), and R fixed or learned with the weights at k = 16 (the small k);
# SparseBERT's: self removed (beside its random control), and a mask learned with the weights on the task
# against local given the same training, at matched sparsity (a window with global tokens, the paper's
# Longformer; its widths come within 2 points of 90% at n = 64). The seed-to-seed spread, not examples, limits a fine-tuned verdict: 1,000 examples each. The plan
# is attnlens's own claim, judged by the probe: the finetune report takes a quick look at it.
_FINETUNED: dict[str, Any] = dict(protocol="finetune", seeds=3, task_eval=1000, seq_len=64, task="imdb")
FINETUNE = FULL.stages(
    eigen=dict(seq_len=64),
    reconstruct=dict(**_FINETUNED, plug_in_scopes=("head", "layer", "all"), task_ks=(16, 32), task_strategies=("greedy",),
                     task_scopes=("layer", "all"), task_joint_r=True, task_joint_ks=(16,)),
    importance=dict(**_FINETUNED, task_classes=("self",)),
    # the fine-tune seeds give the spread; a swap search is for the pretrained weights; these masks learn with theirs
    dam=dict(**_FINETUNED, mask_seeds=1, reference=None, train_weights=True, task_patterns="adapted", train_on="task",
             adapted_patterns=("local",)),
    plan={**_MACHINERY["plan"], "seq_len": 64},
)  # fmt: skip
_QUICK_FINETUNED: dict[str, Any] = dict(protocol="finetune", seeds=2, finetune_steps=10, task="imdb")
QUICK_FINETUNE = QUICK.stages(
    reconstruct=dict(**_QUICK_FINETUNED, plug_in_scopes=("head", "all"), task_scopes=("all",), task_joint_r=True),
    importance=dict(**_QUICK_FINETUNED, task_classes=("self",)),
    dam=dict(**_QUICK_FINETUNED, mask_seeds=1, reference=None, train_weights=True, task_patterns="adapted", train_on="task",
             adapted_patterns=("local",)),
)  # fmt: skip
REPORT_PROTOCOLS = ("probe", "finetune")
REPORT_PRESETS = ("quick", "default", "full")
# --protocol finetune is the papers' protocol at one size (FINETUNE), with or without --full; --quick shrinks it.
PRESETS = {
    ("probe", "quick"): QUICK,
    ("probe", "default"): DEFAULT,
    ("probe", "full"): FULL,
    ("finetune", "quick"): QUICK_FINETUNE,
    ("finetune", "default"): FINETUNE,
    ("finetune", "full"): FINETUNE,
}


def preset(protocol: str, *, quick: bool, full: bool) -> tuple[str, ReportSettings]:
    """The name (``quick``, ``default``, ``full``; ``finetune`` for the papers' protocol at its one size) and
    settings of ``protocol`` at the size asked for (``quick`` and ``full`` exclude each other)."""
    one_of("protocol", protocol, REPORT_PROTOCOLS)
    if quick and full:
        raise BadInput(
            "`quick` and `full` ask for opposite sizes; choose one (--quick: a first look, --full: every claim at full size)"
        )
    name = "quick" if quick else "full" if full else "default"
    return ("finetune" if protocol == "finetune" and not quick else name), PRESETS[protocol, name]


def stage_weights(name: str) -> dict[str, float]:
    """How long each stage of preset ``name`` took on minilm-l6, in the order they run: the seconds
    ``bench/bench_report.py`` measured (``stage_weights.json``). They are the times the README and ``--help``
    state, and the forecast's seconds of the stages it does not count (the overlap, the figures).

    >>> list(stage_weights("quick"))[:3]
    ['eigen', 'eigen (second model)', 'overlap']
    """
    weights = json.loads(resources.files("attnlens.report").joinpath("stage_weights.json").read_text())
    return weights[name]


def took(name: str) -> str:
    """How long preset ``name`` took when last measured, in words, with the machine it was measured on:
    "about 6 minutes on 2 cores of AMD EPYC (AVX2, no AVX-512)".

    >>> took("quick").startswith("about ") and " on 2 cores" in took("quick")
    True
    """
    measured = json.loads(resources.files("attnlens.report").joinpath("stage_weights.json").read_text()).get("machine")
    return f"{duration(sum(stage_weights(name).values()))} on 2 cores" + (f" of {measured}" if measured else "")


def duration(seconds: float) -> str:
    """A measured duration as the help and the README say it.

    >>> duration(48.4), duration(163.3), duration(9000)
    ('about 48 seconds', 'about 3 minutes', 'about 2.5 hours')
    """
    if seconds < 120:
        return f"about {seconds:.0f} seconds"
    return f"about {seconds / 60:.0f} minutes" if seconds < 7200 else f"about {seconds / 3600:.1f} hours"
