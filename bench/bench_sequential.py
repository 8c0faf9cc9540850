"""What sequential judging against a margin costs, decides and covers: simulated paired 0/1 outcomes of
known Δ, judged by the task's design (attnlens.analysis.sequential) and, as the baselines in the same run,
by fixed designs: one of the whole pool (the sequential design's most examples), simulated on the same
outcomes, and one of the same power (the examples a fixed design needs to reach the right side of −δ as
often as the sequential design did: ((z + z_p) σ / |Δ + δ|)², σ² = discordance − Δ², normal approximation);
and by the sequential design without its futility rule (``futility=0``: an undecided judgement runs to the
pool's end), on the same outcomes.

Run:  python bench/bench_sequential.py [--reps 2000] [--pool 4000] [--margin 0.02]

Prints per case (Δ at 0, −δ/2 = −δ + 1 point, −δ, −δ − 1 point and −3δ, at 5–40% discordance; a Δ
beyond the discordance cannot be) each design's coverage of Δ and how often its verdict holds (interval
above −δ) and does not hold (below −δ), and the sequential design's examples: mean and median, against
the pool and against the fixed design of the same power, and how often it stopped because the pool would
not decide; then, without the futility rule, how often it holds, does not hold, and its mean examples.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
from scipy.stats import norm

from attnlens.analysis.margin import non_inferior
from attnlens.analysis.sequential import REASONS, Design, Z

DISCORDANCE = (0.05, 0.1, 0.2, 0.4)


def deltas(margin: float) -> list[float]:
    """Δ at 0, −δ/2, −δ, −δ ± 1 point (−δ + 1 point is −δ/2 at the default margin) and −3δ, in that order."""
    return sorted({0.0, -margin / 2, -margin, -margin + 0.01, -margin - 0.01, -3 * margin}, reverse=True)


def same_power(delta: float, discordant: float, margin: float, power: float, reps: int) -> float:
    """The examples of a fixed design whose interval reaches the right side of −δ with probability ``power``
    (a power of 1 read as 1 − 1/reps, what the simulation can tell from it; NaN at −δ, where no size decides,
    or where the power is no more than a miss's)."""
    if abs(delta + margin) < 1e-12 or power <= 0.025:
        return float("nan")
    power = min(power, 1 - 1 / reps)
    return float(((Z + norm.ppf(power)) * np.sqrt(discordant - delta**2) / abs(delta + margin)) ** 2)


def simulate(design: Design, delta: float, discordant: float, reps: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Per design (sequential; whole: the same without its futility rule; pool: the fixed design of the whole pool):
    per judgement, whether its interval covers Δ, its verdict, its examples and why it stopped."""
    rng = np.random.default_rng(seed)
    cuts = np.array(design.cuts)
    probabilities = [(discordant + delta) / 2, (discordant - delta) / 2, 1 - discordant]
    counts = np.cumsum(np.stack([rng.multinomial(step, probabilities, size=reps) for step in np.diff(cuts, prepend=0)], 1), 1)
    at = {count: index for index, count in enumerate(cuts)}
    names = ("sequential", "whole", "pool")
    found: dict[str, dict[str, list]] = {name: {"covered": [], "verdict": [], "used": [], "reason": []} for name in names}
    whole = dataclasses.replace(design, futility=0.0)
    for plus, minus in zip(counts[..., 0], counts[..., 1]):

        def sums(count: int) -> tuple[float, float]:
            return float(plus[at[count]] - minus[at[count]]), float(plus[at[count]] + minus[at[count]])

        decisions = [design.run_on_sums(sums), whole.run_on_sums(sums)]
        mean, half = design.interval_of_sums(design.available, *sums(design.available), Z)
        fixed = (mean - half, mean + half, design.available, "")
        for name, (low, high, used, reason) in zip(names, [(d.low, d.high, d.examples, d.reason) for d in decisions] + [fixed]):
            found[name]["covered"].append(low <= delta <= high)
            found[name]["verdict"].append(non_inferior(low, high, design.margin))
            found[name]["used"].append(used)
            found[name]["reason"].append(reason)
    return {name: {key: np.array(values) for key, values in columns.items()} for name, columns in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4000)
    parser.add_argument("--margin", type=float, default=0.02)
    args = parser.parse_args()
    design = Design.for_pool(args.pool, args.margin)
    print(f"{args.reps} judgements per case, pool {args.pool}, margin {args.margin:g}")
    print(
        "| discordant | Δ, points | fixed, pool: coverage | holds | does not hold | sequential: coverage | holds | "
        "does not hold | mean examples | median | × pool | fixed of the same power: examples | mean × it | "
        "stopped: the pool would not decide | without that rule: holds | does not hold | mean examples |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for discordant in DISCORDANCE:
        for delta in deltas(args.margin):
            if abs(delta) >= discordant:  # a loss larger than the discordance: no such paired outcomes
                continue
            found = simulate(design, delta, discordant, args.reps, seed=int(1e4 * (discordant - delta)))
            cells = []
            for name in ("pool", "sequential"):
                got = found[name]
                share = lambda verdict: f"{(got['verdict'] == verdict).mean():.3f}"  # noqa: E731
                cells += [f"{got['covered'].mean():.3f}", share("holds"), share("does not hold")]
            got, right = found["sequential"], "holds" if delta > -args.margin else "does not hold"
            power = float((got["verdict"] == right).mean())
            same = same_power(delta, discordant, args.margin, power, args.reps)
            used = got["used"]
            matched = "— | —" if np.isnan(same) else f"{same:.0f} | {used.mean() / same:.2f}"
            futile = f"{(np.array(got['reason']) == REASONS[1]).mean():.3f}"
            other = found["whole"]
            without = f"{(other['verdict'] == 'holds').mean():.3f} | {(other['verdict'] == 'does not hold').mean():.3f} | {other['used'].mean():.0f}"
            print(f"| {discordant:.2f} | {100 * delta:+.0f} | {' | '.join(cells)} | {used.mean():.0f} | {np.median(used):.0f} | "
                  f"{used.mean() / args.pool:.2f} | {matched} | {futile} | {without} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
