"""The result of :func:`attnlens.plan`: each budget's plan, how it was judged, and its maps.

Tables: ``summary`` (per budget: the plan, the cheapest uniform plans meeting the budget on
the selection data, and a random allocation of the plan's price; each with its FLOPs share
(and, for a plan made in seconds, the share of attention seconds its timing table predicts),
its cost on the selection and the held-out check with intervals, whether it meets the
budget there, and the held-out paired difference plan − it), ``choices`` (per budget,
layer and head: the choice), ``curves`` (per head and choice alone), ``path`` (the greedy
path), ``probes`` (every step the verification ran on the model) and ``maps`` (the partial
heads' maps, with the arrays ``positions``, ``weights`` and ``offset``).

:meth:`PlanResult.apply` runs a model under one budget's plan through the partial
attention function (or, with ``fast``, each head group on its fastest kernel), and refuses a
model of another geometry or other weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from typing import ClassVar, NamedTuple

from attnlens.analysis.plan.assemble import SavedMaps, layer_plans
from attnlens.analysis.plan.choices import Assignment, parse
from attnlens.analysis.plan.seconds import Timings
from attnlens.errors import BadInput
from attnlens.io.results import Result, format_table
from attnlens.models.kernels import KERNEL_IMPLEMENTATION
from attnlens.models.loading import LoadedModel
from attnlens.models.partial import PARTIAL_IMPLEMENTATION, LayerPlan, planned


def choices_name(budget: float) -> str:
    """The name of a budget's layer × head figure, without a dot (it is a file's stem): ``choices_0_5``."""
    return f"choices_{budget:g}".replace(".", "_")


GEOMETRY = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "causal")


class Form(StrEnum):
    """What a method of the summary is (its ``form`` column): a step of the greedy path, one choice
    for every head (its ``choice`` column names it), every head exact (no uniform plan met the
    budget), or the random allocation."""

    STEP = "step"
    UNIFORM = "uniform"
    EXACT = "exact"
    RANDOM = "random"


class Method(NamedTuple):
    """A judged method: its label for the reader (``detail``), its :class:`Form` and, uniform, its choice."""

    detail: str
    form: Form
    choice: str = ""


NONE_MEETS = Method("none meets: exact", Form.EXACT)


class PlanResult(Result):
    """Per-head plans meeting each budget; see the module docstring."""

    kind = "plan"
    main_table = "summary"
    figures_module = "attnlens.figures.plan"
    shown: ClassVar[dict[str, tuple[str, ...]]] = {
        "summary": (
            "budget", "method", "detail", "flops_ratio", "flops_ratio_padded", "changes_nothing", "seconds_ratio", "select_cost_high", "check_cost", "check_cost_low",
            "check_cost_high", "check_allowance", "check_meets", "plan_minus", "plan_minus_low", "plan_minus_high",
        ),
    }  # fmt: skip
    column_notes: ClassVar[dict[str, str]] = {
        "detail": "the plan's step on the greedy path (or the uniform plan it is, where one meeting the budget was cheaper), or the uniform choice (none meets: exact attention is the cheapest that does)",
        "flops_ratio": "attention FLOPs on the valid (query, key) pairs of the examples judged, their own lengths, as a share of every head exact",
        "flops_ratio_padded": "the same at width n, padding counted (as a padded batch computes it)",
        "form": "what the method is: a step of the greedy path, uniform (one choice, the choice column, for every head), exact (no uniform plan met the budget) or random",
        "path_step": "the plan's step on the greedy path (the heads it changes), where the plan is one",
        "changes_nothing": "no valid pair of the examples judged is changed: a window wider than every text (its saving is padding)",
        "seconds_ratio": "attention seconds per call the timing table predicts, as a share of every head exact (sdpa)",
        "select_cost_high": "upper end of the paired 95% interval of the cost on the selection data (where the plan was chosen)",
        "check_cost": "mean cost on the held-out check (accuracy drop, or proxy loss increase), 95% paired interval beside it",
        "check_meets": "the interval's upper end is within the allowance",
        "plan_minus": "held-out cost of the plan minus this method's, paired (negative: the plan loses less)",
    }

    methods = property(lambda self: self.tables["summary"])

    @property
    def budgets(self) -> list[float]:
        return sorted(self.tables["choices"].budget.unique().tolist())

    def assignment(self, budget: float) -> Assignment:
        """The plan's choice for every (layer, head) at ``budget``."""
        rows = self.tables["choices"].query("budget == @budget")
        if rows.empty:
            raise BadInput(f"this result has no plan for budget {budget:g}; it has {', '.join(f'{b:g}' for b in self.budgets)}")
        return {(int(row.layer), int(row.head)): parse(row.choice) for row in rows.itertuples()}

    def layer_plans(self, budget: float) -> dict[int, LayerPlan]:
        maps = self.tables.get("maps")
        bank = SavedMaps([] if maps is None else maps.to_dict("records"), self.arrays)
        timed = self.settings.get("timings")  # a plan made in seconds runs each window on the kernel it was timed on
        timings = None if timed is None else Timings.read(timed)
        kernels = None if timings is None else {layer: timings.kernels_of(layer) for layer in range(len(timings.spans))}
        return layer_plans(self.assignment(budget), bank, int(self.settings["seq_len"]), self.meta["model"]["causal"], kernels)

    def check_model(self, model: LoadedModel) -> None:
        """Refuse a model this plan was not made for: another geometry, or other weights."""
        made = self.meta["model"]
        described = model.describe()
        for name in GEOMETRY:
            if described[name] != made[name]:
                raise BadInput(
                    f"the plan was made for '{made['name']}' ({name} {made[name]}), not '{model.name}' ({name} {described[name]}); "
                    "make a plan for this model with 'attnlens plan'"
                )
        weights = model.weights_sha256()  # what describe() records, as a str
        if weights != made["weights_sha256"]:
            raise BadInput(
                f"the plan's maps were fitted to the scores of '{made['name']}' (weights {made['weights_sha256'][:12]}), "
                f"not to these weights ({weights[:12]}); make a plan for this model"
            )

    @contextlib.contextmanager
    def apply(self, model: LoadedModel, budget: float, *, fast: bool = False) -> Iterator[None]:
        """Run ``model`` under the plan for ``budget`` inside the ``with`` (inputs of the plan's n tokens):
        through ``"attnlens-partial"`` (eager, capture works), or with ``fast`` through ``"attnlens-kernels"``
        (exact heads on sdpa, windows on the kernel the plan's timing table chose, no attention weights)."""
        self.check_model(model)
        with planned(model, self.layer_plans(budget), KERNEL_IMPLEMENTATION if fast else PARTIAL_IMPLEMENTATION):
            yield

    def misses(self) -> list[str]:
        """One line per budget whose plan misses it on the held-out check (or one saying none does).

        >>> import attnlens
        >>> result = attnlens.plan("minilm-l3", seq_len=16, fit_seqs=8, curve_seqs=4, select_seqs=4, eval_seqs=4, max_loss=[0.05],
        ...                        ks=[2], widths=[2], progress=False)
        >>> result.misses()[0].startswith(("every plan meets", "MISSES"))
        True
        """
        plans = self.methods[self.methods.method == "plan"]
        missed = plans[~plans.check_meets.astype(bool)]
        if missed.empty:
            return [f"every plan meets its budget on the held-out check ({len(plans)} of {len(plans)})"]
        points = self.settings.get("max_drop") is not None  # accuracy costs are fractions: say them in points
        scale, unit = (100, " points") if points else (1, "")
        return [
            f"MISSES on the held-out check: the plan for {row.budget:g}{unit} costs {scale * row.check_cost:.4g} "
            f"[{scale * row.check_cost_low:.4g}, {scale * row.check_cost_high:.4g}]{unit}, above its allowance of "
            f"{scale * row.check_allowance:.4g}{unit}"
            for row in missed.itertuples()
        ]

    def text(self) -> str:
        lines = [f"plans for {self.model_name} at n = {self.settings['seq_len']}, budgets {', '.join(self.settings['budgets'])}"]
        shown = self.view("summary")
        lines += [format_table(shown), *self.notes_for(shown), "", *self.misses(), ""]
        lines.append("choices per layer (heads at each choice), by budget:")
        counts = self.tables["choices"].groupby(["budget", "layer", "choice"]).size().rename("heads").reset_index()
        lines.append(format_table(counts))
        return "\n".join(lines)
