"""Write the report's stage weights from saved reports, so the progress bar's stretches follow what
the stages cost rather than numbers typed into the code.

Each report given (a default one, a ``--quick`` one, or both) replaces the weights of its kind in
``attnlens/report/stage_weights.json`` with the seconds its stages took (``timings_s`` in its
``result.json``)::

    attnlens report --out report && attnlens report --quick --out first-look
    python scripts/stage_weights.py report first-look
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent.parent / "attnlens" / "report" / "stage_weights.json"


def update(reports: list[Path], weights: Path = WEIGHTS) -> dict:
    """The weights file with each report's timings in place of its kind's; written atomically."""
    data = json.loads(weights.read_text())
    for report in reports:
        meta = json.loads((report / "result.json").read_text())
        if meta.get("kind") != "report":
            raise ValueError(f"{report} is not a report directory (attnlens report --out DIR)")
        data["quick" if meta["quick"] else "default"] = {name: round(seconds, 1) for name, seconds in meta["timings_s"].items()}
    temporary = weights.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    temporary.replace(weights)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args(argv)
    try:
        update(args.reports)
    except (OSError, ValueError, KeyError) as error:
        print(f"stage_weights: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
