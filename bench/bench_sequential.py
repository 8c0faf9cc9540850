"""What sequential judging against a margin costs, decides and covers: simulated paired 0/1 outcomes of
known Δ, judged by the task's design (attnlens.analysis.sequential) and, as the baseline in the same run,
by a fixed design of the same power: 80% to show that a change costing nothing lies above −δ, on
(z + z_β)² σ² / δ² examples (σ² = discordance − Δ²), capped by the pool, its interval 1.96 standard errors.

Run:  python bench/bench_sequential.py [--reps 2000] [--pool 4000] [--margin 0.02]

Prints per case (Δ at 0, −δ/2 = −δ + 1 point, −δ, −δ − 1 point and −3δ, at 5–40% discordance; a Δ
beyond the discordance cannot be) each
design's coverage of Δ, how often its verdict holds (interval above −δ) and does not hold (below −δ),
and the examples it used (the sequential design's median and mean, and their ratio to the fixed design's).
"""

from __future__ import annotations

import argparse

import numpy as np

from attnlens.analysis.margin import non_inferior
from attnlens.analysis.sequential import Z_POWER, Design, Z

DISCORDANCE = (0.05, 0.1, 0.2, 0.4)


def deltas(margin: float) -> list[float]:
    """Δ at 0, −δ/2, −δ, −δ ± 1 point (−δ + 1 point is −δ/2 at the default margin) and −3δ, in that order."""
    return sorted({0.0, -margin / 2, -margin, -margin + 0.01, -margin - 0.01, -3 * margin}, reverse=True)


def fixed_size(delta: float, discordant: float, margin: float, pool: int) -> int:
    return int(min(np.ceil((Z + Z_POWER) ** 2 * (discordant - delta**2) / margin**2), pool))


def simulate(design: Design, delta: float, discordant: float, reps: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Per design (sequential, fixed): per judgement, whether its interval covers Δ, its verdict, its examples."""
    rng = np.random.default_rng(seed)
    fixed = fixed_size(delta, discordant, design.margin, design.available)
    cuts = np.array(sorted({*design.cuts, fixed}))
    probabilities = [(discordant + delta) / 2, (discordant - delta) / 2, 1 - discordant]
    counts = np.cumsum(np.stack([rng.multinomial(step, probabilities, size=reps) for step in np.diff(cuts, prepend=0)], 1), 1)
    at = {count: index for index, count in enumerate(cuts)}
    found: dict[str, dict[str, list]] = {name: {"covered": [], "verdict": [], "used": []} for name in ("sequential", "fixed")}
    for plus, minus in zip(counts[..., 0], counts[..., 1]):

        def sums(count: int) -> tuple[float, float]:
            return float(plus[at[count]] - minus[at[count]]), float(plus[at[count]] + minus[at[count]])

        decision = design.run_on_sums(sums)
        mean, half = design.interval_of_sums(fixed, *sums(fixed), Z)
        for name, (low, high, used) in (("sequential", (decision.low, decision.high, decision.examples)),
                                         ("fixed", (mean - half, mean + half, fixed))):  # fmt: skip
            found[name]["covered"].append(low <= delta <= high)
            found[name]["verdict"].append(non_inferior(low, high, design.margin))
            found[name]["used"].append(used)
    return {name: {key: np.array(values) for key, values in columns.items()} for name, columns in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4000)
    parser.add_argument("--margin", type=float, default=0.02)
    args = parser.parse_args()
    design = Design.for_pool(args.pool, args.margin)
    print(f"{args.reps} judgements per case, pool {args.pool}, margin {args.margin:g} (target half-width {design.target:.4f})")
    print(
        "| discordant | Δ | fixed: examples | coverage | holds | does not hold | sequential: coverage | holds | does not hold "
        "| median examples | × fixed | mean examples | × fixed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for discordant in DISCORDANCE:
        for delta in deltas(args.margin):
            if abs(delta) >= discordant:  # a loss larger than the discordance: no such paired outcomes
                continue
            found = simulate(design, delta, discordant, args.reps, seed=int(1e4 * (discordant - delta)))
            fixed = int(found["fixed"]["used"][0])
            cells = []
            for name in ("fixed", "sequential"):
                got = found[name]
                share = lambda verdict: f"{(got['verdict'] == verdict).mean():.3f}"  # noqa: E731
                cells += [f"{got['covered'].mean():.3f}", share("holds"), share("does not hold")]
            used = found["sequential"]["used"]
            print(f"| {discordant:.2f} | {100 * delta:+.0f} | {fixed} | {' | '.join(cells)} | {np.median(used):.0f} | "
                  f"{np.median(used) / fixed:.2f} | {used.mean():.0f} | {used.mean() / fixed:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
