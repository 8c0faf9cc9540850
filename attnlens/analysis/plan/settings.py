"""The settings of :func:`attnlens.plan`."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.analysis.plan.judging import Budget, one_loss_forecast, task_eval_needed
from attnlens.analysis.task import TaskSettings
from attnlens.data.positions import refuse_heavy
from attnlens.errors import BadInput
from attnlens.models.precision import DEFAULT_PRECISION, PRECISIONS
from attnlens.settings import CorpusSettings, at_least, group, one_of, positive

COSTS = ("flops", "seconds")  # what a plan spends: attention FLOPs, or measured seconds per call
HEAD_COSTS = (
    "auto",
    "screen",
    "forwards",
)  # how each head's cost under each choice is found: screened at once, or measured alone
PER_QUERY_LIMIT = 4 * 2**30  # bytes of per-query moments a causal model's maps may need


@dataclass(frozen=True)
class PlanSettings(CorpusSettings):
    """What a plan must keep, and what it may choose from.

    Budgets (one kind, one or more values, each planned): ``max_drop``, the most task
    accuracy may drop, in points (needs ``task``); or ``max_loss``, the most the proxy loss
    may be (1 − cosine for encoders, whose unmodified loss is 0; next-token loss for
    decoders, in nats). Choices: partial computation with each of ``ks`` exact keys per
    query, windows of each of ``widths``. Four disjoint sets of blocks: the maps are fitted
    on ``fit_seqs`` (a causal model's per-query maps need more than n), the heads' curves are
    measured on ``curve_seqs`` (not the fitting blocks, on which the maps look better than they
    are; with a task, ``curve_seqs`` of its training examples), a loss budget's plan is chosen
    on ``select_seqs`` (not the curves' blocks: the forecast holds for plans fixed before the
    selection data are seen), and the proxy's held-out check runs on ``eval_seqs``. With a
    task, ``task_eval`` held-out examples are split in two halves: the first chooses, the
    second checks. ``bootstrap`` resamples give every interval. ``precision`` is the arithmetic of the
    forwards that judge (curves, selection, check: :mod:`attnlens.models.precision`); the maps are
    fitted, and seconds timed, in float32. ``cost``: what a plan spends,
    attention ``"flops"``, or ``"seconds"`` per call measured on this machine at n
    (:mod:`~attnlens.analysis.plan.seconds`; windows then run on the faster of FlexAttention and sdpa). An accuracy budget that one lost
    example already forecasts above, at these halves, is refused with the ``task_eval`` it needs
    (``forecastable_only``; the report plans anyway at its small sizes and says "not decided").
    ``head_costs``: how each head's cost under each choice is found before the path is built: ``"forwards"``
    (each head alone under each choice, a forward each) or, under an accuracy budget, ``"screen"`` (every head at
    once, from one forward and a backward pass per class of the task, :mod:`~attnlens.analysis.plan.screen`: a cost
    that does not grow with the heads; refused without an accuracy budget); ``"auto"``: the screen under an
    accuracy budget, forwards under a proxy budget (:attr:`screened`).

    >>> PlanSettings.build(max_loss=(0.01,), max_drop=(1.0,), task="rotten-tomatoes")
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: give one kind of budget, max_drop (accuracy points) or max_loss (proxy loss), not both
    """

    max_drop: tuple[float, ...] | None = None
    max_loss: tuple[float, ...] | None = None
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    fit_seqs: int = 64
    curve_seqs: int = 16
    select_seqs: int = 32
    eval_seqs: int = 32
    objective: str = "auto"
    classes: str | None = None
    cost: str = "flops"
    head_costs: str = "auto"
    forecastable_only: bool = True
    bootstrap: int = 1000
    precision: str = DEFAULT_PRECISION  # the judging forwards' arithmetic, the task's too (passed down)
    task: TaskSettings = group(TaskSettings)

    @property
    def screened(self) -> bool:
        """Whether the heads' costs are screened at once (:mod:`~attnlens.analysis.plan.screen`) rather than measured by
        forwards: asked for, or ``"auto"`` under an accuracy budget (the screen reads a task's predictions).

        >>> PlanSettings.build(max_drop=(2.0,), task="imdb", forecastable_only=False).screened
        True
        >>> PlanSettings.build(max_loss=(0.01,)).screened
        False
        """
        return self.head_costs == "screen" or (self.head_costs == "auto" and self.max_drop is not None)

    def validate(self) -> None:
        super().validate()
        if self.max_drop is not None and self.max_loss is not None:
            raise BadInput("give one kind of budget, `max_drop` (accuracy points) or `max_loss` (proxy loss), not both")
        for name, values in (("max_drop", self.max_drop), ("max_loss", self.max_loss)):
            for value in values or ():
                positive(
                    name, value, ": a budget of zero or below cannot be met by any change, and exact attention needs no plan"
                )
        if self.cost not in COSTS:
            raise BadInput(f"`cost` '{self.cost}' is unknown; use one of {', '.join(COSTS)}")
        one_of("head_costs", self.head_costs, HEAD_COSTS)
        refuse_heavy(self.classes, "plan")
        if self.head_costs == "screen" and self.max_drop is None:
            raise BadInput("`head_costs` screen estimates what a change does to a task's predictions: give `max_drop` (a budget of "
                           "accuracy, with a task), or measure the proxy's costs by forwards (`head_costs` forwards)")  # fmt: skip
        if self.max_drop is not None and self.task.name is None:
            raise BadInput("`max_drop` is a budget of task accuracy: name a task (imdb, rotten-tomatoes or a file)")
        for k in self.ks:
            at_least("ks", k, 1, " exact key per query")
            if k > self.seq_len:
                raise BadInput(
                    f"`ks` {k} is larger than n = {self.seq_len} (the keys of a row); use ks of at most {self.seq_len}"
                )
        for width in self.widths:
            at_least("widths", width, 1, " position on each side")
        at_least("fit_seqs", self.fit_seqs, 2, " blocks to fit the maps on")
        at_least("curve_seqs", self.curve_seqs, 1, " block to measure the heads' curves on")
        at_least("select_seqs", self.select_seqs, 2, " blocks to choose the plan on")
        at_least("eval_seqs", self.eval_seqs, 2, " held-out blocks")
        at_least("bootstrap", self.bootstrap, 10, " resamples for an interval (1000 is usual)")
        one_of("precision", self.precision, PRECISIONS)
        if self.forecastable_only:
            self._check_forecastable()

    def _check_forecastable(self) -> None:
        """Refuse an accuracy budget these halves cannot forecast: one lost example (the least a change
        that costs anything can lose) forecasts above it, so only changes that lose nothing could meet it."""
        if self.max_drop is None or not isinstance(self.task.task_eval, int):
            return
        select, check = self.task.task_eval // 2, self.task.task_eval - self.task.task_eval // 2
        forecast, value = one_loss_forecast(select, check), min(self.max_drop)  # the smallest budget is the hardest
        if forecast > value / 100:
            points = f"{value:g} point{'' if value == 1 else 's'}"
            raise BadInput(
                f"a budget of {points} cannot be forecast on {select} + {check} held-out examples: one example lost among "
                f"them already forecasts {100 * forecast:.2g} points on the check; give `task_eval` at least "
                f"{task_eval_needed(value / 100):,} (half chooses the plan, half checks it)"
            )

    @property
    def budgets(self) -> list[Budget]:
        """The budgets to plan for, smallest first; asking with none given is an error."""
        if self.max_drop is not None:
            return [Budget("accuracy", value) for value in sorted(self.max_drop)]
        if self.max_loss is not None:
            return [Budget("loss", value) for value in sorted(self.max_loss)]
        raise BadInput(
            "give a budget: `max_drop` (the most accuracy may drop, in points) or `max_loss` (the most the proxy loss may be)"
        )

    def check_geometry(self, num_layers: int, num_heads: int, causal: bool) -> None:
        """Refuse per-query maps (causal models) whose moments would not fit in memory."""
        n = self.seq_len
        needed = 3 * num_layers * num_heads * n**3 * 8  # per-query Σxxᵀ in float64, with its two halves
        if causal and self.ks and needed > PER_QUERY_LIMIT:
            raise BadInput(
                f"partial maps of a causal model are per query: at n = {n} their moments take {needed / 2**30:.0f} GiB; "
                "plan with windows only (`ks` empty, --ks none) or a smaller `seq_len`"
            )
