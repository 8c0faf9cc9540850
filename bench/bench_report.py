"""The report's budget, measured: the seconds of every stage of the quick and the default report,
each run in its own process from a cold cache (the one-off conversion of the models aside; the task's
features included), in one run, beside the forecast the report made before its first stage.

Run:  python bench/bench_report.py [--presets quick,default] [--model minilm-l6] [--write] [--keep DIR]
      python bench/bench_report.py --presets budget=10m --model gemma3-270m      (attnlens report --budget 10m)
      python bench/bench_report.py --from REPORT_DIR ... --write      (a saved report's own timings: --full, finetune)
      python bench/bench_report.py --from FULL_DIR --write --stored finetune   (keeps stating a time no change touched)

Prints each stage's seconds per preset with its forecast beside it (actual/forecast), the totals, the
total's forecast as a share of the actual (within ±30%: the forecast's promise), and the wall time of
the whole command against the budgets (the default report in 10 minutes, --quick in 2, --full in 30,
--protocol finetune in 90). ``--write`` (minilm-l6 only) stores the stages' seconds
in attnlens/report/stage_weights.json (the forecast's seconds of the overlap and the figures, and the times
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


def run_report(preset: str, out: Path, model: str, extra: list[str]) -> tuple[dict[str, float], dict[str, float], float]:
    """One report in a fresh process and a cold cache (converted models kept): its stages' seconds, their
    forecast and the command's wall time."""
    import attnlens
    from attnlens.models.cache import cache_dir

    for alias in {model, *(("minilm-l6", "minilm-l3") if model.startswith("minilm") else ())}:  # the one-off conversion
        attnlens.load_model(alias)
    with tempfile.TemporaryDirectory(prefix="attnlens-cold-") as cold:
        (Path(cold) / "models").symlink_to(cache_dir() / "models")
        began = time.perf_counter()
        flags = [*_flags(preset), "--model", model, *extra, "--out", str(out), "--no-progress"]
        subprocess.run([sys.executable, "-m", "attnlens", "report", *flags], check=True, env={**os.environ, "ATTNLENS_CACHE": cold},
                       stdout=subprocess.DEVNULL)  # fmt: skip
        wall = time.perf_counter() - began
    return (*saved(out)[1:], wall)


def _flags(preset: str) -> list[str]:
    """A preset's flags; ``budget=10m``: ``--budget 10m``."""
    return ["--budget", preset.split("=", 1)[1]] if preset.startswith("budget=") else FLAGS[preset]


def _budget(preset: str) -> float | None:
    """A report's budget in seconds: its preset's, or the one it was given."""
    from attnlens.report.budget import parse_duration

    return parse_duration(preset.split("=", 1)[1]) if preset.startswith("budget=") else BUDGETS.get(preset)


def saved(report: Path) -> tuple[str, dict[str, float], dict[str, float]]:
    """A saved report's preset, its stages' seconds and their forecast (empty for a report saved before forecasts)."""
    meta = json.loads((report / "result.json").read_text())
    if meta.get("kind") != "report":
        raise SystemExit(f"bench_report: {report} is not a report directory (attnlens report --out DIR)")
    forecast = {stage: value["forecast"] for stage, value in meta.get("forecast", {}).get("stages_s", {}).items()}
    return meta["preset"], meta["timings_s"], forecast


def table(timings: dict[str, dict[str, float]], walls: dict[str, float], forecasts: dict[str, dict[str, float]]) -> str:
    """Stage by stage, a column per preset (actual / forecast seconds); the totals, the total's forecast as a share
    of the actual, the wall times and the budgets."""
    presets = list(timings)
    stages = list(dict.fromkeys(stage for seconds in timings.values() for stage in seconds))

    def cell(actual: float, predicted: float | None) -> str:
        return f"{actual:9.1f} / {predicted:7.1f}" if predicted is not None else f"{actual:9.1f} / {'':>7}"

    lines = [f"{'stage (actual / forecast s)':28}" + "".join(f"{name:>20}" for name in presets)]
    for stage in stages:
        lines.append(
            f"{stage:28}" + "".join(cell(timings[name].get(stage, float("nan")), forecasts[name].get(stage)) for name in presets)
        )
    totals = {name: (sum(timings[name].values()), sum(forecasts[name].values()) or None) for name in presets}
    lines.append(f"{'stages, total':28}" + "".join(cell(*totals[name]) for name in presets))
    lines.append(f"{'command, wall':28}" + "".join(f"{walls.get(name, float('nan')):20.1f}" for name in presets))
    for name, (actual, predicted) in totals.items():
        if predicted:
            share = predicted / actual
            verdict = "within ±30%" if abs(share - 1) <= 0.3 else "OUTSIDE ±30%"
            lines.append(f"{name}: the total's forecast is {share:.2f} of the actual: {verdict}")
    for name in presets:
        budget = _budget(name)
        if budget is not None and name in walls:
            verdict = "within" if walls[name] <= budget else "OVER"
            lines.append(
                f"{name}: {walls[name]:.0f} s against a budget of {budget:.0f} s ({walls[name] / budget:.2f}): {verdict} budget"
            )
    return "\n".join(lines)


def write(timings: dict[str, dict[str, float]], stored: tuple[str, ...] = ()) -> None:
    """The measured seconds into stage_weights.json and the README's time sentence (both atomically);
    ``stored``: presets not measured now whose stored time the sentence still states."""
    from attnlens.report.presets import duration  # the words `attnlens report --help` uses too

    weights = json.loads(WEIGHTS.read_text())
    for name, seconds in timings.items():
        weights[name] = {stage: round(value, 1) for stage, value in seconds.items()}
    weights["machine"] = machine()  # the times are this machine's: the README and --help name it
    _replace(WEIGHTS, json.dumps(weights, indent=2) + "\n")
    total = {name: sum(seconds.values()) for name, seconds in weights.items() if isinstance(seconds, dict)}
    # --full's and the finetune protocol's times only when this run measured them: a stored figure may be from older code
    slow = "".join(
        f", `{' '.join(FLAGS[name])}` {duration(total[name])}"
        for name in ("full", "finetune")
        if name in timings or name in stored
    )
    sentence = (
        f"On 2 cores of {weights['machine']} a first report (nothing cached) took {duration(total['default'])} (`--quick` "
        f"{duration(total['quick'])}{slow}), as `python bench/bench_report.py` measured it; machines of one kind differ "
        "(twice as fast with AMX), and `attnlens report --dry-run` forecasts it for your model and machine."
    )
    text = README.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    _replace(README, text[:start] + "\n" + sentence + "\n" + text[stop:])


def machine() -> str:
    """The CPU the times were measured on, with the vector and matrix units that set its speed: "AMD EPYC (AVX-512, no AMX)"."""
    import platform

    name, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    units = "AMX" if "amx_tile" in flags else "AVX-512, no AMX" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else ""
    return f"{name} ({units})" if units else name


def _replace(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", default="quick,default", help="which reports to run: quick, default, full, finetune, budget=10m"
    )
    parser.add_argument("--model", default="minilm-l6", help="the model the reports run on")
    parser.add_argument("--flags", default="", help="more flags for attnlens report, e.g. '--precision bfloat16'")
    parser.add_argument("--from", dest="saved", nargs="*", type=Path, default=[], help="saved reports to read instead")
    parser.add_argument("--keep", type=Path, help="keep the reports in this directory")
    parser.add_argument("--write", action="store_true", help="store the seconds (stage_weights.json, README)")
    parser.add_argument(
        "--stored", default="", help="with --write: presets (full, finetune) not measured now whose stored time still holds"
    )
    args = parser.parse_args()
    timings, walls, forecasts = {}, {}, {}
    for report in args.saved:
        name, timings[name], forecasts[name] = saved(report)
    if not args.saved:
        with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
            base = args.keep or Path(scratch)
            for name in args.presets.split(","):
                timings[name], forecasts[name], walls[name] = run_report(name, base / name, args.model, args.flags.split())
                print(f"{name}: {walls[name]:.1f} s", file=sys.stderr, flush=True)
    print(table(timings, walls, forecasts))
    if args.write and args.model != "minilm-l6":
        raise SystemExit("bench_report: --write stores minilm-l6's seconds (the README's and --help's times); drop --model")
    if args.write:
        write(timings, tuple(filter(None, args.stored.split(","))))


if __name__ == "__main__":
    main()
