"""The result of :func:`attnlens.plan`: each budget's plan, how it was judged, and its maps.

Tables: ``summary`` (per budget: the plan, the cheapest uniform plans meeting the budget on
the selection data, and a random allocation of the plan's FLOPs; each with its FLOPs share,
its cost on the selection and the held-out check with intervals, whether it meets the
budget there, and the held-out paired difference plan − it), ``choices`` (per budget,
layer and head: the choice), ``curves`` (per head and choice alone), ``path`` (the greedy
path), ``probes`` (every step the verification ran on the model) and ``maps`` (the partial
heads' maps, with the arrays ``positions``, ``weights`` and ``offset``).

:meth:`PlanResult.apply` runs a model under one budget's plan through the partial
attention function, and refuses a model of another geometry or other weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

from attnlens.analysis.plan.assemble import SavedMaps, layer_plans
from attnlens.analysis.plan.choices import Assignment, parse
from attnlens.errors import BadInput
from attnlens.io.results import Result, format_table
from attnlens.models.loading import LoadedModel
from attnlens.models.partial import LayerPlan, planned


def choices_name(budget: float) -> str:
    """The name of a budget's layer × head figure, without a dot (it is a file's stem): ``choices_0_5``."""
    return f"choices_{budget:g}".replace(".", "_")


GEOMETRY = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "causal")


class PlanResult(Result):
    """Per-head plans meeting each budget; see the module docstring."""

    kind = "plan"
    main_table = "summary"
    figures_module = "attnlens.figures.plan"
    shown: ClassVar[dict[str, tuple[str, ...]]] = {
        "summary": (
            "budget", "method", "detail", "flops_ratio", "select_cost_high", "check_cost", "check_cost_low",
            "check_cost_high", "check_allowance", "check_meets", "plan_minus", "plan_minus_low", "plan_minus_high",
        ),
    }  # fmt: skip
    column_notes: ClassVar[dict[str, str]] = {
        "flops_ratio": "attention FLOPs as a share of every head exact",
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
        return layer_plans(self.assignment(budget), bank, int(self.settings["seq_len"]), self.meta["model"]["causal"])

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
        if described["weights_sha256"] != made["weights_sha256"]:
            raise BadInput(
                f"the plan's maps were fitted to the scores of '{made['name']}' (weights {made['weights_sha256'][:12]}), "
                f"not to these weights ({described['weights_sha256'][:12]}); make a plan for this model"
            )

    @contextlib.contextmanager
    def apply(self, model: LoadedModel, budget: float) -> Iterator[None]:
        """Run ``model`` under the plan for ``budget`` inside the ``with`` (inputs of the plan's n tokens)."""
        self.check_model(model)
        with planned(model, self.layer_plans(budget)):
            yield

    def text(self) -> str:
        lines = [f"plans for {self.model_name} at n = {self.settings['seq_len']}, budgets {', '.join(self.settings['budgets'])}"]
        lines += [format_table(self.view("summary")), "", "choices per layer (heads at each choice), by budget:"]
        counts = self.tables["choices"].groupby(["budget", "layer", "choice"]).size().rename("heads").reset_index()
        lines.append(format_table(counts))
        return "\n".join(lines)
