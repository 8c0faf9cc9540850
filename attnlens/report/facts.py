"""The few facts of the results that the claims and the sections both read: the tasks that judged
them, and each layer's spectra in one row."""

from __future__ import annotations

import pandas as pd


def task_meta(results: dict) -> dict | None:
    """The report's main task, the one that judged the position classes (or the first any stage used), if any."""
    tasks = task_metas(results)
    main = results["importance"].meta.get("task") if "importance" in results else None
    return main or next(iter(tasks.values()), None)


def task_metas(results: dict) -> dict[str, dict]:
    """Every task that judged a stage's changes, by name, in the order the stages ran (the main task
    and the savings task, where they differ); ``"stages"`` adds the results each judged."""
    found: dict[str, dict] = {}
    for key, result in results.items():
        task = result.meta.get("task")
        if task:
            found.setdefault(task["task"], {**task, "stages": []})["stages"].append(key)
    return found


def layer_summary(eigen_result) -> pd.DataFrame:
    """Per layer: components for 90% energy of single heads (median, min, max over heads), the
    Gaussian baseline's, and of the heads pooled."""
    table = eigen_result.table
    heads = table[(table["level"] == "head") & (table["query"] == table["query"].max())]
    per_layer = heads.groupby("layer").agg(
        head_k90_median=("k90", "median"),
        head_k90_min=("k90", "min"),
        head_k90_max=("k90", "max"),
        baseline_k90=("baseline_k90", "median"),
        head_effective_rank=("effective_rank", "median"),
        ones_fraction=("ones_fraction", "median"),
    )
    pooled = table[(table["level"] == "layer") & (table["query"] == table["query"].max())]
    layers = pooled.set_index("layer")[["k90", "k95", "k99"]].add_prefix("pooled_")
    return per_layer.join(layers).reset_index()
