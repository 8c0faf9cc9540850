"""A DAM run's result: learned masks and fixed patterns judged on the same held-out blocks.

Tables: ``summary`` (one row per run: sparsity, held-out loss and its change against the
unmodified model, with bootstrap intervals), ``keep`` (run, layer, head, class:
keep-probability σ(α/s) and the fraction the hard mask keeps), ``keep_summary`` (run,
class), ``patterns`` (pattern, parameter value: sparsity, loss, its change), ``training``
(run, step), and with a task ``task``; with ``train_weights`` and patterns,
``patterns_adapted``. Runs are keyed by their λ (a target's run: the λ dual ascent ended at).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.analysis.dam.layouts import LAYOUTS
from attnlens.analysis.dam.seeds import seeds_agree, spread, verdicts_across_seeds
from attnlens.analysis.dam.stopping import TARGET_WITHIN
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.margin import PROXY_MARGIN, compared
from attnlens.io.results import Result, format_table

MATCH_WITHIN = 0.03  # a pattern is compared with a mask only within 3 points of its sparsity
MATCHED_COLUMNS = [
    "lambda", "dam_sparsity", "dam_delta", "pattern", "family", "value", "sparsity", "delta", "delta_low", "delta_high",
    "expressible", "difference", "difference_low", "difference_high",
]  # fmt: skip
ABSOLUTE_LOSS = ("loss", "loss_low", "loss_high")
ABSOLUTE_LOSS_NOTE = (
    "absent with the hidden objective: its loss, 1 - cosine to the unmodified model, is 0 for that model "
    "by definition, so loss would repeat delta"
)


class DamResult(Result):
    """A set of learned masks, with the fixed patterns judged on the same held-out blocks; see the
    module docstring. With the ``hidden`` objective ``summary`` and ``patterns`` carry the change
    (``delta``) only: the unmodified model's loss is 0 by definition, so the loss would repeat
    it (``meta["columns"]``); the unmodified loss is ``meta["baseline"]``. Arrays: ``logits``
    (run, *layout shape), ``keep_images`` (run, layer, head, n, n) keep-probabilities on the
    first held-out block, per-block losses.
    """

    kind = "dam"
    figures_module = "attnlens.figures.dam"
    main_table = "summary"
    shown = {
        "summary": (
            "target_sparsity", "mask_seed", "lambda", "trained_sparsity", "sparsity", "expected_sparsity", "rows_rescued",
            "loss", "delta", "delta_low", "delta_high", "steps", "schedule_end", "check_step", "check_delta",
            "relaxed_converged", "polish_swaps", "converged",
        ),
        "compared": (
            "dam_sparsity", "scope", "pattern", "value", "sparsity", "dam_delta", "delta", "difference", "difference_low",
            "difference_high", "verdict",
        ),
    }  # fmt: skip
    column_notes = {
        "sparsity": "share of valid positions the judged (hard, α > 0) mask removes on the held-out blocks",
        "trained_sparsity": "the hard mask on the training blocks when training stopped, before the threshold shift "
        "that meets the target",
        "steps": "steps of the schedule, until the mask stopped changing (schedule_end annealed) or the cap",
        "check_delta": "change of the judged mask's training loss over the convergence check's window, the last "
        "while the learning rate was meaningful (check_low, check_high: its 95% interval over training blocks)",
        "converged": "polished (polish_swaps shown): the swap search that finished the mask stopped at a local optimum, "
        "not its round cap; else the relaxation's check (relaxed_converged where polished): over that window, at that "
        "learning rate, the judged mask's loss did not change beyond the interval, and (with a target) the threshold "
        "shift to it changed training's own hard mask by at most a point (check_shifted: the share it removed there)",
        "polish_swaps": "swaps the finishing search kept, each lowering the training loss (relaxed_train_loss: before it)",
        "relaxed_converged": "whether the relaxation alone had settled before the swap search finished the mask; the "
        "verdict on the mask judged is converged",
        "expected_sparsity": "of the masks sampled at the final noise scale (1 - mean keep-probability)",
        "rows_rescued": "share of rows the mask would leave empty; they keep their keys of largest logit",
        "delta": "change of the held-out loss against the unmodified model, with its 95% bootstrap interval over blocks",
    }
    keep = property(lambda self: self.tables["keep"])
    keep_summary = property(lambda self: self.tables["keep_summary"])

    @property
    def table(self) -> pd.DataFrame:
        """``summary``, one row per run (every DAM result has it)."""
        table = super().table
        assert table is not None, "a DAM result always has its summary"
        return table

    patterns = property(lambda self: self.tables["patterns"])
    training = property(lambda self: self.tables["training"])
    logits = property(lambda self: self.arrays["logits"])

    @property
    def layout(self) -> dict:
        """What the run's layout is (name, shared by layers, the patterns it can express), as recorded."""
        recorded = self.meta.get("layout")
        return recorded if recorded is not None else LAYOUTS[self.settings["variant"]].describe()

    def expressible(self, pattern: str, value: int) -> bool:
        """Whether the run's layout can express pattern ``pattern`` at ``value`` exactly."""
        expresses = self.layout["expresses"]
        return pattern in expresses and (expresses[pattern] is None or int(value) in expresses[pattern])

    def run_labels(self) -> dict[float, str]:
        """Each run's name, keyed by its λ: "λ = 0.1", or "target 90%" for a run aimed at a sparsity
        (and ", seed 1" with more than one mask per target)."""
        table = self.table
        targets = table["target_sparsity"] if "target_sparsity" in table else [float("nan")] * len(table)
        seeds = table["mask_seed"] if "mask_seed" in table else [None] * len(table)
        return {
            lam: (f"λ = {lam:g}" if np.isnan(target) else f"target {target:.0%}") + ("" if seed is None else f", seed {seed}")
            for lam, target, seed in zip(table["lambda"], targets, seeds)
        }

    def nearest(self, sparsity: float = 0.85) -> int:
        """Index of the run whose sparsity is nearest ``sparsity``."""
        return int((self.table["sparsity"] - sparsity).abs().argmin())

    def matched(self, within: float = MATCH_WITHIN) -> pd.DataFrame:
        """For each run and each pattern, the pattern point whose sparsity is nearest the mask's, if it
        is within ``within`` of it (a pattern that cannot come that close is left out: a comparison
        at another sparsity is not a comparison). With ``train_weights`` the patterns are those given
        the same weight training (``patterns_adapted``). ``expressible``: the mask's layout can
        express the pattern; ``difference`` is the mask's held-out loss minus the pattern's, paired
        over blocks, with its bootstrap interval."""
        adapted = "patterns_adapted" in self.tables
        points = self.tables["patterns_adapted"] if adapted else self.patterns
        losses = self.arrays["adapted_pattern_losses" if adapted else "pattern_losses"]
        rows, differences = [], []
        for number, dam_row in self.table.reset_index(drop=True).iterrows():
            candidates = points[points["lambda"] == dam_row["lambda"]] if adapted else points
            for name, group in candidates.groupby("pattern", sort=False):
                position = int((group["sparsity"] - dam_row["sparsity"]).abs().argmin())
                nearest = group.iloc[position]
                if abs(nearest["sparsity"] - dam_row["sparsity"]) > within:
                    continue
                rows.append(
                    {
                        "lambda": dam_row["lambda"],
                        "dam_sparsity": dam_row["sparsity"],
                        "dam_delta": dam_row["delta"],
                        **{
                            column: nearest[column]
                            for column in ("family", "value", "sparsity", "delta", "delta_low", "delta_high")
                        },
                        "pattern": name,
                        "expressible": self.expressible(name, nearest["value"]),
                    }
                )
                differences.append(self.arrays["eval_losses"][number] - losses[group.index[position]])
        table = pd.DataFrame(rows, columns=MATCHED_COLUMNS[:-3])
        if rows:
            mean, low, high = bootstrap_interval(np.stack(differences), self.settings["bootstrap"], self.settings["seed"])
        else:
            mean = low = high = np.zeros(0)
        return table.assign(difference=mean, difference_low=low, difference_high=high)

    def compared(self, within: float = MATCH_WITHIN) -> pd.DataFrame:
        """Per run, the mask against the best pattern (lowest held-out loss) its own layout can express
        (``scope`` "own family") and the best of all (``scope`` "overall"), at matched sparsity:
        ``verdict`` is "worse" or "better" when the paired interval of the difference excludes 0, "on par"
        where it lies within ±:data:`~attnlens.analysis.margin.PROXY_MARGIN`, else "not decided"."""
        matched = self.matched(within)
        rows = []
        for _, group in matched.groupby("lambda", sort=False):
            for scope, candidates in (("own family", group[group["expressible"]]), ("overall", group)):
                if not len(candidates):
                    continue
                best = candidates.loc[candidates["delta"].idxmin()]
                # lower loss is better: DAM's verdict is that of the negated difference, on par only within the margin
                verdict = compared(-best["difference_high"], -best["difference_low"], PROXY_MARGIN)
                rows.append({**best.to_dict(), "scope": scope, "verdict": verdict})
        return pd.DataFrame(rows, columns=[*MATCHED_COLUMNS, "scope", "verdict"])

    def across_seeds(self) -> dict[str, pd.DataFrame]:
        """With more than one mask per target (``mask_seeds``): the spread of the held-out change
        and whether the seeds' masks agree on the same blocks (``delta``; :func:`seeds_agree`), each comparison with the patterns counting every seed (``compared``, and
        ``task_compared`` with a task), and with ``reference`` the spread of the mask's loss less the
        swap search's (``reference``). Empty with one mask per target."""
        if "mask_seed" not in self.table:
            return {}
        agree = seeds_agree(self.table, self.arrays["eval_losses"], self.settings["bootstrap"], self.settings["seed"])
        tables = {
            "delta": spread(self.table).merge(agree, on="target_sparsity"),
            "compared": verdicts_across_seeds(self.compared(), self.table, lower_is_better=True),
        }
        if "task_compared" in self.tables:
            tables["task_compared"] = verdicts_across_seeds(self.tables["task_compared"], self.table, lower_is_better=False)
        if "reference" in self.tables:
            reference = self.tables["reference"].merge(self.table[["lambda", "target_sparsity", "converged"]], on="lambda")
            tables["reference"] = spread(reference, "difference")
        return tables

    def summary(self) -> str:
        settings = self.settings
        runs = f"sparsity {settings['sparsity']}" if settings["lambdas"] is None else f"lambdas {settings['lambdas']}"
        return f"variant {settings['variant']!r}, {runs}"

    def text(self) -> str:
        """The runs, what their sparsity columns mean, the keep-probability per class, how each run
        ended, the comparison with the fixed patterns, notes and the task."""
        table = self.view(frame=self.table.dropna(axis=1, how="all"))
        lines = [format_table(table), *self.notes_for(table), *self._keep_lines()]
        lines += self._convergence_lines()
        if len(self.patterns):
            lines.append("against the best pattern at matched sparsity (difference: the mask's loss minus the pattern's):")
            lines.append(format_table(self.view("compared", self.compared())))
        lines += self._reference_lines()
        for name, table in self.across_seeds().items():
            lines += [f"across the {self.settings['mask_seeds']} seeds of each target, {SEED_TABLES[name]}:", format_table(table)]
        lines += [f"{name}: {note}" for name, note in self.meta["notes"].items()]
        return "\n".join([*lines, *self.task_lines()])

    def _reference_lines(self) -> list[str]:
        """The swap search beside each mask: its held-out change and the mask's loss less its own."""
        if "reference" not in self.tables:
            return []
        shown = ["lambda", "start", "rounds", "swaps", "train_loss", "dam_train_loss", "sparsity", "delta", "dam_delta",
                 "difference", "difference_low", "difference_high", "verdict"]  # fmt: skip
        return [
            "the swap search at each mask's sparsity (reference; difference: the mask's held-out loss minus the search's):",
            format_table(self.tables["reference"][shown]),
        ]

    def _convergence_lines(self) -> list[str]:
        """How each run ended, in words: the schedule (annealed or capped), then the check's verdict."""
        settings, labels, lines = self.settings, self.run_labels(), []
        rate = f"a learning rate at least {settings['check_lr']:g} of its start"
        for row in self.table.to_dict("records"):
            ended = "annealed" if row["schedule_end"] == "annealed" else f"capped at {settings['steps']} steps"
            if polished(row):
                # the verdict is the search's; the relaxation before it is said in other words, so the two never clash
                relaxed = _verdict(row, settings, rate, row["relaxed_converged"])
                relaxed = relaxed.replace("not converged: ", "had not settled: ", 1).replace("converged: ", "had settled: ", 1)
                verdict = f"{_polish_verdict(row, settings)}; before the search, the relaxation alone {relaxed}"
            else:
                verdict = _verdict(row, settings, rate, row["converged"])
            lines.append(f"{labels[row['lambda']]}: schedule {ended} after {row['steps']} steps; {verdict}")
        return lines

    def _keep_lines(self) -> list[str]:
        """The keep-probability per class (rows) and run (columns), each class equal to another by
        construction shown once, under both names."""
        keep = self.keep_summary
        same = self.meta.get("equal_by_construction", {})
        shown = keep[keep["same_as"] == keep["class"]]
        labels = self.run_labels()
        grid = shown.pivot(index="class", columns="lambda", values="keep_probability").reindex(
            list(dict.fromkeys(shown["class"]))
        )
        grid.columns = [labels[lam] for lam in grid.columns]
        grid.index = [" = ".join([name, *[other for other, first in same.items() if first == name]]) for name in grid.index]
        grid.index.name, grid.columns.name = None, None
        lines = ["keep-probability σ(α/s) per position class (the chance a sample at the final noise scale keeps it):"]
        lines.append(grid.to_string(float_format=lambda value: f"{value:.3f}"))
        if same:
            lines.append(
                f"a = b: equal by construction (the {self.settings['variant']} layout decides them from the same logits)"
            )
        return lines


SEED_TABLES = {
    "delta": "the held-out change (t interval of the mean across seeds), and the two seeds furthest apart "
    "(paired over blocks; agree: every pair's interval contains 0)",
    "compared": "each mask against its best pattern at matched sparsity (better or worse only when every seed "
    "is, or the interval across seeds excludes 0)",
    "task_compared": "the task's comparisons, likewise",
    "reference": "the mask's held-out loss minus the swap search's",
}


def _polish_verdict(row: dict, settings: dict) -> str:
    """How the swap search that finished a run ended: a local optimum, or its round cap."""
    swaps = (
        f"{row['polish_swaps']:.0f} swaps took the training loss from {row['relaxed_train_loss']:.4f} to {row['train_loss']:.4f}"
    )
    if row["converged"]:
        return f"converged: the swap search stopped at a local optimum after {row['polish_rounds']:.0f} rounds ({swaps})"
    rounds = settings["polish_rounds"]
    return f"not converged: the swap search still improved when its {rounds} rounds ran out ({swaps}); raise --polish-rounds"


def polished(row) -> bool:
    """Whether a swap search finished a run of ``summary`` (its ``polish_rounds`` is set, not NaN)."""
    rounds = row.get("polish_rounds", float("nan"))
    return rounds == rounds


def _verdict(row: dict, settings: dict, rate: str, converged: bool) -> str:
    """The convergence check's verdict (``converged``: its outcome) on one run, and why."""
    if row.get("check_step", float("nan")) != row.get("check_step", float("nan")):  # NaN: no window at a meaningful rate
        return f"not converged: too few steps at {rate} to judge; raise --steps"
    change = f"{row['check_delta']:+.4f} [{row['check_low']:+.4f}, {row['check_high']:+.4f}]"
    window = f"over the {settings['check_window']} steps to step {row['check_step']:.0f}"
    shifted = row.get("check_shifted", 0.0)
    if converged:
        return f"converged: {window}, at {rate}, the judged mask's training loss changed by {change}"
    if abs(shifted) > TARGET_WITHIN:
        return (
            f"not converged: at step {row['check_step']:.0f} ({rate}) training's own mask was {abs(shifted):.1%} of the "
            f"positions {'short of' if shifted > 0 else 'past'} the target, which the threshold shift "
            f"{'removed' if shifted > 0 else 'brought back'}; "
            f"{window} the judged mask's training loss changed by {change}"
        )
    return f"not converged: {window}, at {rate}, the judged mask's training loss still changed by {change}; raise --steps"


def loss_columns(objective: str) -> dict[str, str]:
    """What ``loss`` and ``delta`` of ``summary`` and ``patterns`` hold, for ``meta["columns"]``."""
    delta = "change of the held-out loss against the unmodified model (paired over blocks, with interval)"
    if objective == "hidden":
        return {"loss": ABSOLUTE_LOSS_NOTE, "delta": delta}
    return {"loss": f"held-out {objective} loss (nats) under the mask or pattern", "delta": delta}


def without_absolute_loss(table: pd.DataFrame, objective: str) -> pd.DataFrame:
    """``table`` without ``loss`` (and its interval) under the ``hidden`` objective, where it
    equals ``delta`` (the unmodified model's loss is 0); the other objectives keep both: the
    held-out loss in nats and its change against the unmodified model."""
    if objective != "hidden":
        return table
    return table.drop(columns=[name for name in ABSOLUTE_LOSS if name in table])


def summary_row(
    lam: float, variant: str, judged: dict, baseline: np.ndarray, curve: pd.DataFrame, trainer, bootstrap: int, seed: int
) -> dict:
    """One run's row of ``summary``: what was judged on the held-out blocks, and how training ended."""
    losses = judged["losses"]
    mean, low, high = bootstrap_interval(np.stack([losses, losses - baseline]), bootstrap, seed)
    tail = curve.tail(max(1, len(curve) // 10))
    targeted = trainer.target_density is not None
    return {
        "lambda": lam,
        "target_sparsity": 1.0 - trainer.target_density if targeted else float("nan"),
        "variant": variant,
        "sparsity": float(judged["sparsity"]),
        "expected_sparsity": float(judged["expected_sparsity"]),
        "rows_rescued": float(judged["rows_rescued"]),
        "loss": mean[0],
        "loss_low": low[0],
        "loss_high": high[0],
        "delta": mean[1],
        "delta_low": low[1],
        "delta_high": high[1],
        "train_objective": tail["objective"].mean(),
        "train_density": tail["density"].mean(),
        # the hard mask's sparsity when training stopped, before the last shift: how far dual ascent got
        "trained_sparsity": 1.0 - float(curve["hard_density"].iloc[-1]) if targeted else float("nan"),
        "lambda_start": trainer.lambda_start_ if targeted else float("nan"),  # where dual ascent began (NaN: λ given)
        "threshold_shift": trainer.shift_,  # subtracted from the logits to meet a target sparsity (NaN for a given λ)
        "steps": trainer.steps_used_,  # the schedule's, without the check's
        "schedule_end": "annealed" if trainer.annealed_ else "cap",
        **trainer.check_,
        "converged": trainer.converged_,  # the check's verdict: no continuation at a meaningful rate did better
    }


def keep_rows(lam: float, classes: tuple[str, ...], judged: dict) -> list[dict]:
    """One run's rows of ``keep``: per layer, head and class."""
    num_layers, num_heads, _ = judged["keep_probability"].shape
    return [
        {
            "lambda": lam,
            "layer": layer,
            "head": head,
            "class": name,
            "keep_probability": judged["keep_probability"][layer, head, index],
            "kept": judged["kept"][layer, head, index],
            "positions": judged["positions"][layer, index],
        }
        for layer in range(num_layers)
        for head in range(num_heads)
        for index, name in enumerate(classes)
    ]


def keep_summary_rows(lam: float, classes: tuple[str, ...], judged: dict, same: dict[str, str]) -> list[dict]:
    """One run's rows of ``keep_summary``: per class, pooled over layers and heads by positions."""
    positions = judged["positions"]  # (layer, class): weights for pooling over layers
    rows = []
    for index, name in enumerate(classes):
        weight = positions[:, index][:, None]
        total = weight.sum() * judged["keep_probability"].shape[1]
        rows.append(
            {
                "lambda": lam,
                "class": name,
                "keep_probability": float((judged["keep_probability"][:, :, index] * weight).sum() / total),
                "kept": float((judged["kept"][:, :, index] * weight).sum() / total),
                "positions": float(positions[:, index].sum()),
                "same_as": same.get(name, name),  # the first class it equals by construction (itself if none)
            }
        )
    return rows
