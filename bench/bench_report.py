"""The report's budget, measured: the seconds of every stage of the quick and the default report,
each run in its own process from a cold cache (the one-off conversion of the models aside; the task's
features included), in one run.

Run:  python bench/bench_report.py [--presets quick,default] [--write] [--keep DIR]
      python bench/bench_report.py --from REPORT_DIR ... --write      (a saved report's own timings: --full, finetune)
      python bench/bench_report.py --from FULL_DIR --write --stored finetune   (keeps stating a time no change touched)

Prints each stage's seconds per preset, the totals and the wall time of the whole command against
the budgets (the default report in 10 minutes, --quick in 2, --full in 30, --protocol finetune in 90). ``--write`` stores the stages' seconds
in attnlens/report/stage_weights.json (the stretches of the report's progress bar, and the times
``attnlens report --help`` states) and the README's sentence between its report-times markers, so
that no time a reader sees is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = ROOT / "attnlens" / "report" / "stage_weights.json"
README = ROOT / "README.md"
BUDGETS = {"quick": 120, "default": 600, "full": 1800, "finetune": 5400}  # seconds on 2 cores
FLAGS = {"quick": ["--quick"], "default": [], "full": ["--full"], "finetune": ["--protocol", "finetune"]}
BEGIN, END = "<!-- report times -->", "<!-- report times end -->"


def run_report(preset: str, out: Path) -> tuple[dict[str, float], float]:
    """One report in a fresh process and a cold cache (converted models kept): its stages' seconds
    and the command's wall time."""
    import attnlens
    from attnlens.models.cache import cache_dir

    for alias in ("minilm-l6", "minilm-l3"):  # the one-off conversion, outside the measurement
        attnlens.load_model(alias)
    with tempfile.TemporaryDirectory(prefix="attnlens-cold-") as cold:
        (Path(cold) / "models").symlink_to(cache_dir() / "models")
        began = time.perf_counter()
        command = [sys.executable, "-m", "attnlens", "report", *FLAGS[preset], "--out", str(out), "--no-progress"]
        subprocess.run(command, check=True, env={**os.environ, "ATTNLENS_CACHE": cold}, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - began
    return json.loads((out / "result.json").read_text())["timings_s"], wall


def saved(report: Path) -> tuple[str, dict[str, float]]:
    """A saved report's preset and its stages' seconds."""
    meta = json.loads((report / "result.json").read_text())
    if meta.get("kind") != "report":
        raise SystemExit(f"bench_report: {report} is not a report directory (attnlens report --out DIR)")
    return meta["preset"], meta["timings_s"]


def table(timings: dict[str, dict[str, float]], walls: dict[str, float]) -> str:
    """Stage by stage, a column per preset; the totals, the wall times and the budgets."""
    presets = list(timings)
    stages = list(dict.fromkeys(stage for seconds in timings.values() for stage in seconds))
    lines = [f"{'stage':24}" + "".join(f"{name:>12}" for name in presets)]
    for stage in stages:
        lines.append(f"{stage:24}" + "".join(f"{timings[name].get(stage, float('nan')):12.1f}" for name in presets))
    lines.append(f"{'stages, total':24}" + "".join(f"{sum(timings[name].values()):12.1f}" for name in presets))
    lines.append(f"{'command, wall':24}" + "".join(f"{walls.get(name, float('nan')):12.1f}" for name in presets))
    for name in presets:
        if name in BUDGETS and name in walls:
            verdict = "within" if walls[name] <= BUDGETS[name] else "OVER"
            lines.append(f"{name}: {walls[name]:.0f} s against a budget of {BUDGETS[name]} s: {verdict} budget")
    return "\n".join(lines)


def write(timings: dict[str, dict[str, float]], stored: tuple[str, ...] = ()) -> None:
    """The measured seconds into stage_weights.json and the README's time sentence (both atomically);
    ``stored``: presets not measured now whose stored time the sentence still states."""
    from attnlens.report.presets import duration  # the words `attnlens report --help` uses too

    weights = json.loads(WEIGHTS.read_text())
    for name, seconds in timings.items():
        weights[name] = {stage: round(value, 1) for stage, value in seconds.items()}
    _replace(WEIGHTS, json.dumps(weights, indent=2) + "\n")
    total = {name: sum(seconds.values()) for name, seconds in weights.items() if name != "about"}
    # --full's and the finetune protocol's times only when this run measured them: a stored figure may be from older code
    slow = "".join(
        f", `{' '.join(FLAGS[name])}` {duration(total[name])}"
        for name in ("full", "finetune")
        if name in timings or name in stored
    )
    sentence = (
        f"On 2 cores the report takes {duration(total['default'])} (`--quick` {duration(total['quick'])}{slow}), as "
        "`python bench/bench_report.py` measured it."
    )
    text = README.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    _replace(README, text[:start] + "\n" + sentence + "\n" + text[stop:])


def _replace(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="quick,default", help="which reports to run: quick, default, full, finetune")
    parser.add_argument("--from", dest="saved", nargs="*", type=Path, default=[], help="saved reports to read instead")
    parser.add_argument("--keep", type=Path, help="keep the reports in this directory")
    parser.add_argument("--write", action="store_true", help="store the seconds (stage_weights.json, README)")
    parser.add_argument(
        "--stored", default="", help="with --write: presets (full, finetune) not measured now whose stored time still holds"
    )
    args = parser.parse_args()
    timings, walls = {}, {}
    for report in args.saved:
        name, seconds = saved(report)
        timings[name] = seconds
    if not args.saved:
        with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
            base = args.keep or Path(scratch)
            for name in args.presets.split(","):
                timings[name], walls[name] = run_report(name, base / name)
                print(f"{name}: {walls[name]:.1f} s", file=sys.stderr, flush=True)
    print(table(timings, walls))
    if args.write:
        write(timings, tuple(filter(None, args.stored.split(","))))


if __name__ == "__main__":
    main()
