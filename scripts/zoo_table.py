"""Print docs/cli.md's table of architectures: the zoo of tests/zoo.py, captured or refused.

Each captured architecture is built tiny from its config, loaded by attnlens and compared with
transformers' eager attention on two sentences (one padded), as tests/test_zoo.py checks it;
each refused one gives its one-line message. The column "report" is what ``attnlens report
--quick --model DIR`` did on it, run as a user runs it (a process of its own, the real --quick
preset), and how long it took. Paste the output over the table in docs/cli.md (the test checks
that the table names every architecture with its outcome)::

    python scripts/zoo_table.py > /tmp/zoo.md
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import attnlens  # noqa: E402
from zoo import CAPTURED, REFUSED, build, measure, refusal  # noqa: E402


def report(directory: Path, minilm, architecture: str) -> str:
    """``attnlens report --quick`` on the entry, in a process of its own: "page, 41 s", or its error line."""
    path, _ = build(directory, minilm, CAPTURED[architecture])
    command = ["attnlens", "report", "--quick", "--model", str(path), "--out", str(directory / "report"), "--no-progress"]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode == 0 and (directory / "report" / "report.html").is_file():
        return f"page, {seconds:.0f} s"
    errors = [line for line in done.stderr.splitlines() if line.startswith("attnlens: error")] or done.stderr.splitlines()[-1:]
    return f"failed after {seconds:.0f} s: {' '.join(errors)[:160]}"


def main() -> None:
    minilm = attnlens.load_model("minilm-l6")
    print("| architecture | outcome | max \\|weights − eager\\| | max \\|outputs − eager\\| | report | note |")
    print("|---|---|---|---|---|---|")
    for architecture in CAPTURED:
        with tempfile.TemporaryDirectory() as directory:
            model, measured = measure(Path(directory), minilm, architecture)
        with tempfile.TemporaryDirectory() as directory:
            page = report(Path(directory), minilm, architecture)
        built, read = CAPTURED[architecture]()[1], type(model.model).__name__
        note = f"the encoder ({read})" if read != built else ""  # an encoder-decoder is read by its encoder
        print(
            f"| {architecture} | captured | {measured['weights']:.1e} | {measured['outputs']:.1e} | {page} | {note} |", flush=True
        )
    for architecture in REFUSED:
        with tempfile.TemporaryDirectory() as directory:
            message = refusal(Path(directory), minilm, architecture) or "NOT REFUSED"
        reason = message.split(") ", 1)[-1].split(";")[0]  # after "model '<path>' (<family>)"
        print(f"| {architecture} | refused | | | | {reason} |")


if __name__ == "__main__":
    main()
