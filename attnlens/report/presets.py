"""The report's presets: what each stage runs and on how much data (``--quick``, the default, ``--full``),
and how long each stage took when last measured (the progress bar's stretches).

:data:`FULL` runs everything the claims rest on, at the size that decides them. :data:`DEFAULT` keeps
what decides within the budget of 10 minutes on 2 cores (``bench/bench_report.py`` measures it) and
runs the rest at :data:`QUICK`'s sizes, so a reader sees the machinery; the claims those stages carry
say "run --full". :data:`QUICK` is a first look at everything in under 2 minutes.

>>> preset("probe", quick=False, full=False) == ("default", DEFAULT)
True
>>> preset("finetune", quick=True, full=False)[0], FULL.dam_mask_seeds, DEFAULT.dam_mask_seeds
('quick', 3, 1)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources

from attnlens.errors import BadInput
from attnlens.settings import one_of


@dataclass(frozen=True)
class ReportSettings:
    """Sizes of every stage; :data:`FULL`, :data:`DEFAULT` and :data:`QUICK` are the presets (``--full``,
    none, ``--quick``). The fields' defaults are :data:`FULL`'s: everything the claims rest on, at the size
    that decides them; :data:`DEFAULT` keeps what decides within the budget of 10 minutes on 2 cores and
    runs the rest at :data:`QUICK`'s sizes, a look at the machinery whose claims say "run --full"."""

    seq_len: int = 128
    eigen_seqs: int = 256
    dim: int | None = None  # the overlap matrices' d: None picks it from the split-half check
    reconstruct_seqs: int = 128
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    strategies: tuple[str, ...] = ("greedy", "random", "stride")
    scopes: tuple[str, ...] = ("head", "layer", "all")
    plug_in_scopes: tuple[str, ...] = ("head", "all")
    batch_size: int = 16
    importance_seqs: int = 32  # held-out blocks of the importance and DAM judgements (the same blocks)
    # DAM learns at n = 64 (attention 4x cheaper than at 128) so that its runs converge within the
    # budget; its held-out blocks are then blocks of 64 tokens, not section 4's.
    # The target: each mask meets it, so patterns compare at the same sparsity. One target, three masks
    # (each its own noise and batch order): a verdict about a learned mask holds for every seed or for none.
    dam_sparsity: tuple[float, ...] = (0.9,)
    dam_mask_seeds: int = 3
    dam_reference: str | None = "band"  # the swap search beside the masks, from the band at the target
    dam_reference_rounds: int = 20
    dam_polish_rounds: int = 20  # the swap search that finishes each mask at its target
    dam_seq_len: int = 64
    dam_steps: int = 300  # the cap; the stopping rule ends the schedule when the mask has stopped changing
    dam_stop_window: int = 20
    dam_check_window: int = 40  # converged: no improvement over this many steps at a meaningful learning rate
    dam_train_seqs: int = 64
    # The task that judges the headline changes by accuracy (probe protocol). Each judgement is a
    # forward of the held-out examples it needs, so the task judges the claims' changes only, each
    # sequentially until its paired interval decides ("auto": attnlens.analysis.sequential).
    task: str | None = "rotten-tomatoes"
    # The task of the claims about computing fewer scores (k exact scores, the plan): a saving is only seen
    # on texts that fill the attention it changes. IMDB draws only reviews that fill n (90% of them at n = 128,
    # cut to their first n tokens); Rotten Tomatoes' sentences fill a fifth of 128 (median 27 tokens).
    savings_task: str | None = "imdb"
    task_train: int = 5000  # the probe's training features are computed once and cached
    task_eval: int | str = "auto"
    task_target: float = 0.02
    # Which stages the task judges: DAM's judge at its own n fits a probe of its own.
    reconstruct_task: bool = True
    dam_task: bool = True
    task_ks: tuple[int, ...] = (8, 16, 32, 64)  # keys chosen by task_strategies in every layer
    task_strategies: tuple[str, ...] = ("greedy", "random", "stride")
    task_scopes: tuple[str, ...] = ("head", "all")  # the maps' scopes the task judges
    task_classes: tuple[str, ...] = ("self", "cls", "sep")  # removed everywhere, each beside its random control
    # The papers' protocol (the FINETUNE preset): each judged change inside fine-tuning on the task,
    # several seeds; R also trained jointly with the weights; DAM's masks learned with the weights.
    protocol: str = "probe"
    seeds: int = 1
    finetune_steps: int = 200
    task_joint_r: bool = False
    dam_train_weights: bool = False
    # The plan: per head exact, partial or a window, at the fewest FLOPs within each budget of accuracy
    # (points), chosen on half of plan_task_eval examples and checked on the other half, always by the
    # probe (a fine-tune for every plan the search runs is out of reach). Skipped without a task.
    plan_budgets: tuple[float, ...] = (0.5, 1.0, 2.0)
    plan_task_eval: int = 3000
    plan_fit_seqs: int = 64
    plan_curve_seqs: int = 16
    plan_ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    plan_widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


FULL = ReportSettings()
# DAM and the plan at the quick report's sizes (a look at the machinery: their claims say "run --full").
_MACHINERY = dict(
    dam_mask_seeds=1,  # 40 steps barely move a logit across the threshold: two seeds would end alike
    dam_reference=None,
    dam_reference_rounds=2,
    dam_polish_rounds=2,
    dam_steps=40,  # a short schedule: the mask is not converged, and the claims say so
    dam_stop_window=10,
    dam_check_window=10,
    dam_train_seqs=16,
    dam_task=False,
    plan_budgets=(1.0, 2.0),
    plan_task_eval=64,
    plan_fit_seqs=16,
    plan_curve_seqs=4,
    plan_ks=(16,),
    plan_widths=(8,),
)
DEFAULT = replace(
    FULL,
    plug_in_scopes=("head",),
    task_ks=(16, 32),  # the claims' k, judged by the savings task
    task_strategies=("greedy",),
    task_scopes=("head",),
    **_MACHINERY,
)
QUICK = replace(
    FULL,
    seq_len=64,
    eigen_seqs=96,
    reconstruct_seqs=64,
    ks=(1, 4, 16, 64),
    strategies=("greedy", "random"),
    scopes=("head", "all"),
    plug_in_scopes=("head",),
    importance_seqs=8,
    task_train=256,
    task_eval=64,
    task_ks=(16,),
    task_strategies=("greedy",),
    task_scopes=("head",),
    # a probe on 256 examples costs seconds: the quick look shows DAM's task too; 20 steps (half the default's)
    # keep the look within 2 minutes: training is most of DAM's time (bench/bench_report.py)
    **{**_MACHINERY, "dam_task": True, "dam_steps": 20},
)

# The papers' protocol: the headline changes inside fine-tuning, 3 seeds each (cached per run), at n = 64.
# Each run is 200 steps of 16 examples (about 95 s on 2 cores, measured; up to 45 runs, so about 80 minutes
# there; minutes on a GPU), and a rerun loads every run from the cache. Paper A's questions
# (R fixed or learned jointly, shared by every layer or one per layer, k = 16 and 32) and SparseBERT's
# (a mask learned with the weights on the task against fixed patterns given the same training, at matched sparsity).
FINETUNE = replace(
    FULL,
    seq_len=64,
    plug_in_scopes=("head", "layer", "all"),
    task_eval=1000,  # seed-to-seed spread, not examples, limits a fine-tuned verdict
    task_ks=(16, 32),
    task_strategies=("greedy",),
    task_scopes=("layer", "all"),
    task_classes=("self",),
    dam_mask_seeds=1,  # the fine-tune seeds give the spread
    dam_reference=None,  # a swap search is for the pretrained weights; these masks learn with theirs
    protocol="finetune",
    seeds=3,
    task_joint_r=True,
    dam_train_weights=True,
)
QUICK_FINETUNE = replace(
    QUICK, plug_in_scopes=("head", "all"), task_scopes=("all",), task_classes=("self",), protocol="finetune", seeds=2,
    finetune_steps=10, task_joint_r=True, dam_train_weights=True, dam_mask_seeds=1, dam_reference=None, reconstruct_task=True,
    dam_task=True,
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
    """The name (``quick``, ``default``, ``full``) and settings of ``protocol`` at the size asked for
    (``quick`` and ``full`` exclude each other)."""
    one_of("protocol", protocol, REPORT_PROTOCOLS)
    if quick and full:
        raise BadInput(
            "`quick` and `full` ask for opposite sizes; choose one (--quick: a first look, --full: every claim decided)"
        )
    name = "quick" if quick else "full" if full else "default"
    return name, PRESETS[protocol, name]


def stage_weights(name: str) -> dict[str, float]:
    """How long each stage of preset ``name`` took, in the order they run: the seconds
    ``bench/bench_report.py`` measured (``stage_weights.json``). They set how wide each stage's stretch of
    the one progress bar is, and the times the README and ``--help`` state.

    >>> list(stage_weights("quick"))[:3]
    ['eigen', 'eigen (second model)', 'overlap']
    """
    weights = json.loads(resources.files("attnlens.report").joinpath("stage_weights.json").read_text())
    return weights[name]


def took(name: str) -> str:
    """How long preset ``name`` took when last measured, in words: "about 6 minutes on 2 cores".

    >>> took("quick").startswith("about ") and took("quick").endswith(" on 2 cores")
    True
    """
    return f"{duration(sum(stage_weights(name).values()))} on 2 cores"


def duration(seconds: float) -> str:
    """A measured duration as the help and the README say it.

    >>> duration(48.4), duration(163.3), duration(9000)
    ('about 48 seconds', 'about 3 minutes', 'about 2.5 hours')
    """
    if seconds < 120:
        return f"about {seconds:.0f} seconds"
    return f"about {seconds / 60:.0f} minutes" if seconds < 7200 else f"about {seconds / 3600:.1f} hours"
