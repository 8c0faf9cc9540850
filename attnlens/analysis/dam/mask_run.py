"""One run: a mask trained, finished by a swap search where the layout allows, and judged.

:func:`train_and_judge` trains one mask (:class:`~attnlens.analysis.dam.training.DamTrainer`),
polishes it at its target (:func:`polish`), judges it on the held-out blocks and by the task, gives
the patterns nearest its sparsity the same weight training when the weights train alongside, and,
with ``reference``, sets it against a swap search from its start (:func:`judge_reference`).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnlens.analysis.changes import MaskChange
from attnlens.analysis.dam.compared import adapt_patterns
from attnlens.analysis.dam.judging import evaluate_mask
from attnlens.analysis.dam.reference import SearchOutcome, start_mask, swap_search
from attnlens.analysis.dam.result import summary_row
from attnlens.analysis.dam.runs import Adapted, Run, Setup
from attnlens.analysis.dam.training import DamTrainer
from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.margin import PROXY_MARGIN, compared
from attnlens.analysis.task import content_key, task_columns


def train_and_judge(setup: Setup, lam: float | None, target: float | None, seed: int, patterns: pd.DataFrame, bar) -> Run:
    """Train one mask (its noise and batch order drawn from ``seed``), judge it on the held-out
    blocks (and the task), then give the patterns nearest its sparsity the same weight training
    when the weights train alongside."""
    s, model = setup.settings, setup.experiment.model
    original = copy.deepcopy(model.model.state_dict()) if s.training.train_weights else None
    began = time.perf_counter()
    density = None if target is None else 1.0 - target
    trainer = DamTrainer(setup.layout, s, lam=lam, target_density=density, init_logits=setup.init_logits, seed=seed)
    order = setup.order(seed)
    curve = trainer.fit(model, setup.train_objective, setup.train, order, bar)
    # a target's run ends at the λ dual ascent (or, held, the balance) found: its key in every table
    lam = trainer.lam
    assert lam is not None, "fit leaves every run with its λ"
    logits, polished = trainer.logits_.detach(), None
    if setup.polishes:
        polished = polish(setup, trainer, bar)
        logits = polished.logits
    trained = evaluate_mask(setup.layout, logits, setup.train_objective, setup.train)
    seconds = time.perf_counter() - began
    noise = trainer.noise(trainer.steps_used_ - 1)  # the sampler's at the end: keep-probabilities are σ(α / noise)
    judged = evaluate_mask(setup.layout, logits, setup.judging_objective, setup.held_out, noise)
    task: dict[str, Any] | None = None  # the run's row of the task table
    change = None
    if setup.task is not None:  # before the weights are restored: a mask trained with them is judged with them
        change = MaskChange(setup.layout, logits, content_key(f"dam/{s.mask.variant}/{lam}", logits))
        outcome = setup.task.judge(change)
        task = {"lambda": lam, "sparsity": float(judged["sparsity"]), **task_columns(outcome)}
    bar.update(1)
    if original is not None:
        model.model.load_state_dict(original)
    adapted: list[Adapted] = []
    if original is not None:
        matched = float(judged["sparsity"]) if task is None else task["task_sparsity"]
        adapted = adapt_patterns(setup, lam, matched, curve, order, patterns, original, bar)
    summary = {
        **summary_row(lam, s.mask.variant, judged, setup.baseline, curve, trainer, s.bootstrap, s.seed),
        "mask_seed": seed,
        "seconds": seconds,
        "train_loss": float(trained["losses"].mean()),
        # on the task's own positions when it learned from them (on corpus blocks it is `sparsity` again)
        "train_sparsity": float(trained["sparsity"]) if setup.trained_on == "task" else float("nan"),
        **setup.start,
        **(polish_columns(polished, trainer) if polished is not None else {}),
    }
    image = _keep_image(setup, logits, noise)
    run = Run(lam, judged, curve.assign(**{"lambda": lam}), summary, logits.cpu().numpy(), image, task, adapted, change)
    if s.judging.reference is not None:
        run.reference, run.reference_logits = judge_reference(setup, trainer, run, bar)
    return run


def polish(setup: Setup, trainer: DamTrainer, bar) -> SearchOutcome:
    """The recipe's last step where the layout allows it: the swap search
    (:mod:`~attnlens.analysis.dam.reference`) from the trained mask, calibrated to its target, on the
    training blocks. The relaxation ends near a good mask but not at one: its hard mask settles short of
    the target, the threshold shift removes positions it never tried without, and a few single swaps
    still lower the loss. The search ends where none of the swaps it judges does."""
    logits, target = trainer.logits_.detach(), trainer.target_density
    assert target is not None, "only a run aimed at a target is polished (Setup.polishes)"
    s, data = setup.settings, setup.train
    return swap_search(trainer, setup.train_objective, data, logits > 0, logits, target, s.judging.polish_rounds, bar)


def polish_columns(polished: SearchOutcome, trainer: DamTrainer) -> dict:
    """A polished run's columns of ``summary``: the relaxation's own training loss and check, the
    search's rounds and swaps, and ``converged`` as the search ended (a local optimum, or its cap)."""
    return {
        "relaxed_train_loss": polished.start_loss,
        "relaxed_converged": trainer.converged_,
        "polish_rounds": polished.rounds,
        "polish_swaps": len(polished.swaps),
        "converged": polished.local_optimum,
    }


def judge_reference(setup: Setup, trainer: DamTrainer, run: Run, bar) -> tuple[dict, np.ndarray]:
    """The swap search (:mod:`~attnlens.analysis.dam.reference`) from ``reference``'s start at the
    run's sparsity, on its training blocks, judged on the held-out blocks: its change against the
    unmodified model and the mask's loss less the search's, paired over blocks. From the band it is
    one search per target, shared by the target's seeds. Returns the row of ``reference`` and the
    search's logits."""
    s, density = setup.settings, trainer.target_density
    assert s.judging.reference is not None and density is not None, "a swap search beside a run aimed at a target (DamSettings)"
    # from the band one search per target serves every seed, unless each seed trains on its own blocks
    key = density if s.judging.reference == "band" and not s.resample else (density, run.summary["mask_seed"])
    if key not in setup.references:
        logits = torch.as_tensor(run.logits, device=setup.layout.valid.device)
        kept, rank = start_mask(s.judging.reference, setup.layout, setup.train, logits, density, s.seq_len, s.seed)
        found = swap_search(trainer, setup.train_objective, setup.train, kept, rank, density, s.judging.reference_rounds, bar)
        setup.references[key] = (found, evaluate_mask(setup.layout, found.logits, setup.judging_objective, setup.held_out))
    else:
        bar.update(s.judging.reference_rounds)
    found, held = setup.references[key]
    paired = np.stack([held["losses"] - setup.baseline, run.judged["losses"] - held["losses"]])
    mean, low, high = bootstrap_interval(paired, s.bootstrap, s.seed)
    said = compared(-high[1], -low[1], PROXY_MARGIN)  # lower loss is better: the mask's verdict on the negated difference
    verdict = f"DAM {said}" if said in ("better", "worse") else said
    row = {
        "lambda": run.lam,
        "mask_seed": run.summary["mask_seed"],
        "start": s.judging.reference,
        "rounds": found.rounds,
        "swaps": len(found.swaps),
        "start_train_loss": found.start_loss,
        "train_loss": float(found.losses.mean()),
        "dam_train_loss": run.summary["train_loss"],
        "sparsity": float(held["sparsity"]),
        "dam_sparsity": run.summary["sparsity"],
        "delta": mean[0], "delta_low": low[0], "delta_high": high[0],
        "dam_delta": run.summary["delta"],
        "difference": mean[1], "difference_low": low[1], "difference_high": high[1],
        "verdict": verdict,
    }  # fmt: skip
    return row, found.logits.cpu().numpy()


def _keep_image(setup: Setup, logits: torch.Tensor, noise: float) -> np.ndarray:
    """(layer, head, n, n) keep-probabilities on the first held-out block."""
    probability = torch.sigmoid(logits / max(noise, 1e-6))
    context = setup.held_out.contexts[0][:1]
    layers = range(setup.layout.num_layers)
    return torch.stack([setup.layout.expand(probability, layer, context)[0] for layer in layers]).cpu().numpy().astype(np.float16)
