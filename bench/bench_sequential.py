"""What sequential judging costs and covers: simulated paired 0/1 outcomes of known Δ, judged by the
task's design (attnlens.analysis.sequential) and, as the baseline in the same run, by the earlier
design (every look on the grid spends α·t² of the pool and may stop on the half-width), each against
a fixed design of the same half-width (1.96² σ² / target², σ² = discordance − Δ²).

Run:  python bench/bench_sequential.py [--reps 2000] [--pool 4000] [--target 0.02]

Prints per case the coverage and the examples used (median, max) of both designs, and the ratio of
their medians to the fixed design's examples.
"""

from __future__ import annotations

import argparse

import numpy as np

from attnlens.analysis.sequential import ALPHA, Decision, Design, _boundary, spending

Z = 1.959964


def earlier(design: Design, sums) -> Decision:
    """The earlier rule: boundaries spending α·t² of the pool at every look of the grid, the last look
    the rest, and a stop at the first look whose interval excludes zero or is as narrow as the target."""
    history = ()
    for count in design.grid:
        last = count == design.grid[-1]
        bound = _boundary(history, count, 1 - (ALPHA if last else spending(count / design.available)))
        history += ((count, bound),)
        mean, half = design.interval_of_sums(count, *sums(count), bound)
        reason = "excludes zero" if abs(mean) > half else "half-width reached" if half <= design.target else None
        if reason or last:
            return Decision(mean, mean - half, mean + half, half, count, len(history) - 1, bound, reason or "examples ran out")
    raise AssertionError("unreachable")


def simulate(design: Design, delta: float, discordant: float, reps: int, seed: int):
    """Per design (new, earlier): coverage and the examples each judgement used."""
    rng = np.random.default_rng(seed)
    cuts = np.array(design.cuts)
    steps = np.diff(cuts, prepend=0)
    probabilities = [(discordant + delta) / 2, (discordant - delta) / 2, 1 - discordant]
    counts = np.cumsum(np.stack([rng.multinomial(step, probabilities, size=reps) for step in steps], 1), 1)
    at = {count: index for index, count in enumerate(cuts)}
    results = {"new": ([], []), "earlier": ([], [])}
    for plus, minus in zip(counts[..., 0], counts[..., 1]):

        def sums(count):
            return float(plus[at[count]] - minus[at[count]]), float(plus[at[count]] + minus[at[count]])

        for name, decision in (("new", design.run_on_sums(sums)), ("earlier", earlier(design, sums))):
            results[name][0].append(decision.low <= delta <= decision.high)
            results[name][1].append(decision.examples)
    return {name: (np.mean(covered), np.array(used)) for name, (covered, used) in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4000)
    parser.add_argument("--target", type=float, default=0.02)
    args = parser.parse_args()
    design = Design.for_pool(args.pool, args.target)
    print(f"{args.reps} judgements per case, pool {args.pool}, target half-width {args.target}")
    print(f"{'discordant':>10} {'delta':>7} {'fixed':>6} | {'coverage':>8} {'median':>6} {'max':>5} {'x fixed':>7} | "
          f"{'earlier: coverage':>17} {'median':>6} {'max':>5} {'x fixed':>7}")  # fmt: skip
    for discordant in (0.05, 0.1, 0.2, 0.4):
        for delta in (0.0, -0.01, -0.025, -0.05):
            fixed = min(Z**2 * (discordant - delta**2) / args.target**2, args.pool)
            found = simulate(design, delta, discordant, args.reps, seed=int(1e4 * (discordant - delta)))
            cells = [f"{found[name][0]:8.4f} {np.median(found[name][1]):6.0f} {found[name][1].max():5d} "
                     f"{np.median(found[name][1]) / fixed:7.2f}" for name in ("new", "earlier")]  # fmt: skip
            print(f"{discordant:10.2f} {delta:7.3f} {fixed:6.0f} | {cells[0]} | {'':>9}{cells[1]}", flush=True)


if __name__ == "__main__":
    main()
