"""Masks per seed, combined: the spread of their held-out change, and verdicts that count it.

A learned mask is a result only when another run reproduces it. With ``mask_seeds`` > 1 each
target trains several masks (each its own Gumbel noise and batch order, on the same blocks);
these tables say how far apart they ended and whether a comparison with a pattern holds for
all of them.

>>> import pandas as pd
>>> runs = pd.DataFrame({"lambda": [1.0, 2.0, 3.0], "target_sparsity": [0.9] * 3, "mask_seed": [0, 1, 2]})
>>> compared = pd.DataFrame({"lambda": [1.0, 2.0, 3.0], "scope": ["own family"] * 3, "pattern": ["band"] * 3,
...                          "value": [3, 3, 3], "difference": [-0.02, -0.03, -0.025], "verdict": ["better"] * 3})
>>> verdicts_across_seeds(compared, runs, lower_is_better=True)[["seeds", "verdicts", "verdict"]].values.tolist()
[[3, 'better 3', 'better']]
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from attnlens.analysis.evaluation import bootstrap_interval
from attnlens.analysis.task import t_halfwidth


def spread(runs: pd.DataFrame, column: str = "delta") -> pd.DataFrame:
    """Per target sparsity, the ``column`` of every seed's mask: mean, median, least, most, standard
    deviation and the t interval of the mean across seeds, and how many of the runs converged."""
    rows = []
    for target, group in runs.groupby("target_sparsity", sort=False):
        values = group[column].to_numpy(dtype=float)
        half = t_halfwidth(values) if len(values) > 1 else float("nan")
        rows.append(
            {
                "target_sparsity": target,
                "seeds": len(values),
                column: values.mean(),
                f"{column}_median": float(np.median(values)),
                f"{column}_min": values.min(),
                f"{column}_max": values.max(),
                f"{column}_sd": values.std(ddof=1) if len(values) > 1 else float("nan"),
                f"{column}_seeds_low": values.mean() - half,
                f"{column}_seeds_high": values.mean() + half,
                "converged": f"{int(group['converged'].astype(bool).sum())} of {len(values)}",
            }
        )
    return pd.DataFrame(rows)


def seeds_agree(runs: pd.DataFrame, losses: np.ndarray, bootstrap: int, seed: int) -> pd.DataFrame:
    """Per target sparsity, every pair of its seeds' masks on the same held-out blocks (``losses``:
    one row of per-block losses per row of ``runs``): the pair furthest apart, its paired difference
    (the later seed's loss less the earlier's) with a 95% bootstrap interval over blocks, and whether
    the seeds ``agree``: every pair's interval contains 0. Where they do not, each mask may be at an
    optimum (``converged``) and still not be the result another run gives.

    >>> runs = pd.DataFrame({"target_sparsity": [0.9] * 3, "mask_seed": [0, 1, 2]})
    >>> losses = np.array([[1.0, 2.0, 3.0, 4.0], [1.01, 1.99, 3.0, 4.0], [1.5, 2.5, 3.5, 4.5]])
    >>> seeds_agree(runs, losses, 200, 0)[["apart_seeds", "apart", "agree"]].values.tolist()
    [['2 − 0', 0.5, False]]
    """
    rows = []
    for target, group in runs.reset_index(drop=True).groupby("target_sparsity", sort=False):
        pairs = []
        for first, second in itertools.combinations(group.index, 2):
            mean, low, high = bootstrap_interval((losses[second] - losses[first])[None], bootstrap, seed)
            pairs.append((abs(mean[0]), mean[0], low[0], high[0], first, second, low[0] <= 0 <= high[0]))
        _, mean, low, high, first, second, _ = max(pairs)
        rows.append(
            {
                "target_sparsity": target,
                "apart_seeds": f"{group.loc[second, 'mask_seed']} − {group.loc[first, 'mask_seed']}",
                "apart": mean, "apart_low": low, "apart_high": high,
                "agree": all(pair[-1] for pair in pairs),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)


def verdicts_across_seeds(compared: pd.DataFrame, runs: pd.DataFrame, *, lower_is_better: bool) -> pd.DataFrame:
    """Per target and scope, every seed's mask against the pattern it was compared with (``compared``:
    rows of lambda, scope, pattern, value, difference, verdict; ``runs``: lambda, target_sparsity,
    mask_seed). ``verdict`` is "better" (or "worse") only when every seed's own paired interval
    says so, or the t interval of the mean difference across seeds excludes 0 on that side; "on
    par" when every seed is on par (within the margin); "not decided" where some seed's interval is
    neither; else "seeds disagree". Either of the last two decides nothing.
    ``lower_is_better``: the difference is of losses (else of accuracies)."""
    table = compared.merge(runs[["lambda", "target_sparsity", "mask_seed"]], on="lambda")
    rows = []
    for (target, scope), group in table.groupby(["target_sparsity", "scope"], sort=False):
        values = group["difference"].to_numpy(dtype=float)
        mean, half = values.mean(), t_halfwidth(values) if len(values) > 1 else float("inf")
        low, high = mean - half, mean + half
        counts = group["verdict"].value_counts()
        better = counts.get("better", 0) == len(group) or (high < 0 if lower_is_better else low > 0)
        worse = counts.get("worse", 0) == len(group) or (low > 0 if lower_is_better else high < 0)
        verdict = (
            "better" if better else "worse" if worse else "on par" if counts.get("on par", 0) == len(group)
            else "not decided" if counts.get("not decided", 0) else "seeds disagree"
        )  # fmt: skip
        rows.append(
            {
                "target_sparsity": target,
                "scope": scope,
                "seeds": len(group),
                "patterns": ", ".join(dict.fromkeys(f"{p}({int(v)})" for p, v in zip(group["pattern"], group["value"]))),
                "difference": mean,
                "difference_min": values.min(),
                "difference_max": values.max(),
                "difference_seeds_low": low,
                "difference_seeds_high": high,
                "verdicts": ", ".join(f"{name} {count}" for name, count in counts.items()),
                "verdict": verdict,
            }
        )
    return pd.DataFrame(rows)
