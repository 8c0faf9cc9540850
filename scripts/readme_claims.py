"""Rewrite the README's claims section from saved reports, so the two cannot disagree.

The section between the ``<!-- claims -->`` and ``<!-- claims end -->`` markers of README.md is
generated, never edited by hand: each claim with what the papers report and a column per model, each
cell its verdict (the report's own words and rounding) and the preset that made it; one line of
settings and provenance per model, a digest that tests check against the table, and the first
model's report's first screen at 1,280 px as ``docs/report.png``. A claim a default report leaves to
``--full`` is taken from that model's full report when one is given. After a change to the report::

    attnlens report --out r-l6 && attnlens report --full --out r-l6-full
    attnlens report minilm-l3 --out r-l3 && attnlens report gemma3-270m --out r-g3
    attnlens report --protocol finetune --out r-l6-ft
    python scripts/readme_claims.py r-l6 r-l3 r-g3 --full r-l6-full --finetune r-l6-ft

A column whose report is not made again keeps its cells and its line as the README prints them
(``--keep '`gemma3-270m`'``, once per column), in the README's order: the default report of
gemma3-270m alone takes over an hour on 2 cores (65 minutes, `bench_report.py --from`), the finetune protocol about 85 minutes.
A kept column takes the claims it lacks (claims added since its report was made) from a newer report of its
model (``--add DIR``), each such cell naming that report's preset and attnlens version.

>>> claims = pd.DataFrame([["q", "yes", "holds: a | b", "default"]], columns=COLUMNS)
>>> section = claims_section([column(claims, {"model": {"name": "m"}})])
>>> "holds: a \\\\| b (default)" in section
True
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from attnlens.analysis.margin import Margin
from attnlens.report.budget import format_duration
from attnlens.report.claims import CLAIM_COLUMNS, SEEDS_COLUMN
from attnlens.report.verdicts import Phrase

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- claims -->", "<!-- claims end -->"
COLUMNS = ["claim", "papers report", "verdict", "made by"]
TASK_COLUMN = CLAIM_COLUMNS[4]  # the task's Δ: a finetune report's column keeps the claims it judged
FIGURE_COPY = Path("docs") / "report.png"
WIDTH, HEIGHT = 1280, 800  # the first screen a reader sees of the report page


class Column(NamedTuple):
    """One column of the claims table: its heading, its model's line, and per claim (as the table
    prints it) the cell and what the papers report."""

    heading: str
    line: str
    cells: dict[str, str]
    papers: dict[str, str]

    @property
    def model(self) -> str:
        return self.heading.split("`")[1]


def cell(text: object) -> str:
    """A table cell's text: ``|`` escaped, on one line ("" for nothing)."""
    return "" if pd.isna(text) else str(text).replace("|", "\\|").replace("\n", " ")


def column(claims: pd.DataFrame, meta: dict) -> Column:
    """A report's column: each claim exactly as the report prints its verdict (and, fine-tuned with
    seeds, the Δ across them), with the preset that made it."""

    def verdict(row: pd.Series) -> str:
        seeds = row.get(SEEDS_COLUMN, "")
        across = f"; {cell(seeds)}" if isinstance(seeds, str) and seeds else ""  # the column says fine-tuned
        return f"{cell(row['verdict'])}{across} ({row['made by']})"

    rows = [(cell(row["claim"]), row) for _, row in claims.iterrows()]
    return Column(
        _heading(meta),
        described(meta),
        {claim: verdict(row) for claim, row in rows},
        {claim: cell(row["papers report"]) for claim, row in rows},
    )


def markdown_table(columns: list[Column]) -> str:
    """The claims as a Markdown table, a column per model (or protocol); a claim a column does not
    make (a second model of its geometry is not installed): "—"."""
    header = ["claim", "papers report", *(one.heading for one in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for claim in dict.fromkeys(name for one in columns for name in one.cells):
        papers = next(one.papers[claim] for one in columns if claim in one.papers)
        lines.append("| " + " | ".join([claim, papers, *(one.cells.get(claim, "—") for one in columns)]) + " |")
    return "\n".join(lines)


def kept(readme: str, headings: list[str]) -> list[Column]:
    """The columns under ``headings`` as the README's claims section prints them now, each with its
    model's line: for a column whose report is not made again (gemma3-270m's default report takes
    over an hour on 2 cores) beside those that are. Refused where the section's table is not the
    generator's own (its digest) or lacks a heading.

    >>> one = Column("`m`", "`m` on `kjv`.", {"a": "holds: 1 (default)"}, {"a": "p"})
    >>> section = claims_section([one])
    >>> kept(section, ["`m`"]) == [one]
    True
    """
    header, rows, lines = _printed(readme)
    columns = []
    for heading in headings:
        if heading not in header:
            raise ValueError(f"the README's claims table has no column {heading}; it has {', '.join(header)}")
        at = header.index(heading)
        made = {row[0]: row[2 + at] for row in rows if row[2 + at] != "—"}
        columns.append(Column(heading, lines[at], made, {row[0]: row[1] for row in rows if row[0] in made}))
    return columns


def added(columns: list[Column], claims: pd.DataFrame, meta: dict) -> list[Column]:
    """``columns`` with the column of ``meta``'s model given each claim of ``claims`` it lacks, its cell naming the
    report's preset and attnlens version (the column's line is another report's).

    >>> one = Column("`m`", "`m` on `kjv`.", {"a": "holds: 1 (default)"}, {"a": "p"})
    >>> new = pd.DataFrame([["a", "p", "no: 2", "quick"], ["b", "q", "holds: 3", "quick"]], columns=COLUMNS)
    >>> added([one], new, {"model": {"name": "m"}, "attnlens_version": "9.9"})[0].cells
    {'a': 'holds: 1 (default)', 'b': 'holds: 3 (quick, attnlens 9.9)'}
    """
    heading = _heading(meta)
    if heading not in [one.heading for one in columns]:
        raise ValueError(f"--add: the report of {heading} has no kept column to add to; --keep its column")
    newer = claims.assign(**{"made by": claims["made by"] + f", attnlens {meta.get('attnlens_version', '?')}"})
    extra = column(newer, meta)
    return [
        one._replace(
            cells={**one.cells, **{claim: text for claim, text in extra.cells.items() if claim not in one.cells}},
            papers={**one.papers, **{claim: text for claim, text in extra.papers.items() if claim not in one.papers}},
        )
        if one.heading == heading
        else one
        for one in columns
    ]


def in_order(columns: list[Column], readme: str) -> list[Column]:
    """``columns`` in the order of the README's table; one it does not have goes last."""
    order = _printed(readme)[0]
    return sorted(columns, key=lambda one: order.index(one.heading) if one.heading in order else len(order))


def _printed(readme: str) -> tuple[list[str], list[list[str]], list[str]]:
    """The README's claims section as printed: the table's headings (models from the third), its
    rows' cells, and the models' lines; refused where the table is not the generator's (its digest)."""
    section = readme[readme.index(BEGIN) : readme.index(END)]
    table = [line for line in section.splitlines() if line.startswith("|")]
    if f"<!-- claims digest {digest(chr(10).join(table))} -->" not in section:
        raise ValueError("the README's claims table is not the generator's output; it cannot keep a column of it")
    split = lambda line: [part.strip() for part in re.split(r"(?<!\\)\|", line)[1:-1]]
    lines = [line[2:] for line in section.splitlines() if line.startswith("- `")]
    return split(table[0])[2:], [split(line) for line in table[2:]], lines


def finetuned(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims a finetune report judges by fine-tuning (the others are the probe reports')."""
    judged = claims[TASK_COLUMN].fillna("").astype(str).str.len() > 0
    return claims[judged & ~at_this_size(claims)]


def at_this_size(claims: pd.DataFrame) -> pd.Series:
    """The claims a report leaves to a larger size: by their phrase (reports before the phrase column was
    written: by the verdict's words, which were the phrase's alone)."""
    if "phrase" in claims:
        return claims["phrase"] == Phrase.AT_THIS_SIZE.name
    return claims["verdict"].astype(str).str.startswith(Phrase.AT_THIS_SIZE.value)


def digest(table: str) -> str:
    """A short digest of the table's text: a hand edit of the table no longer matches it."""
    return hashlib.sha256(table.encode()).hexdigest()[:16]


def merged(default: pd.DataFrame, full: pd.DataFrame | None, older: str | None = None) -> pd.DataFrame:
    """The default report's claims, each it leaves to ``--full`` taken from the full report instead; ``older``: the
    attnlens version that made the full report, where it is not the default report's (its cells say so)."""
    if full is None:
        return default
    by_claim = full.set_index("claim")
    if older is not None:
        by_claim = by_claim.assign(**{"made by": by_claim["made by"] + f", attnlens {older}"})
    later = at_this_size(default)
    rows = [by_claim.loc[row["claim"]] if later[index] and row["claim"] in by_claim.index else row
            for index, row in default.iterrows()]  # fmt: skip
    return pd.DataFrame([{"claim": claim, **row[COLUMNS[1:]].to_dict()} for claim, row in zip(default["claim"], rows)])


def _heading(meta: dict) -> str:
    """A column's heading: the model, and "fine-tuned" for a finetune report."""
    name = meta.get("model", {}).get("name", "?")
    return f"`{name}`, fine-tuned" if meta.get("preset") == "finetune" else f"`{name}`"


def described(meta: dict) -> str:
    """One model's line: model, corpus, n, the tasks, when and with which attnlens."""
    settings = meta.get("settings", {})
    model = meta.get("model", {}).get("name", "?")
    main, savings = settings.get("importance") or {}, settings.get("reconstruct") or {}
    protocol = main.get("protocol", "probe")
    seeds = f", fine-tuned with each change ({main.get('seeds')} seeds)" if protocol == "finetune" else ""
    task = f"; task `{main['task']}` under the {protocol} protocol" if main.get("task") else ""
    if main.get("task") and savings.get("task") and savings["task"] != main["task"]:
        task = f"; {protocol} protocol on `{savings['task']}` for k and the plan, `{main['task']}` for the rest"
    if main.get("task"):  # a report from before margins held its claims to zero: it says nothing here
        task += "" if "margin" not in main else f"; margin {Margin.parse(main['margin'])}"
    budget = meta.get("budget")
    sized = "" if budget is None else f"; sized to `--budget {format_duration(budget['seconds'])}` here ({budget['base']} preset)"
    return (
        f"`{model}`{seeds} on `{meta.get('corpus', 'kjv')}`, n = {(settings.get('eigen') or {}).get('seq_len')}{task}{sized}; made "
        f"{meta.get('created', '?')[:10]} with attnlens {meta.get('attnlens_version', '?')}."
    )


def claims_section(columns: list[Column]) -> str:
    """The README's claims section (markers included) from its columns (a finetune report's column,
    headed "fine-tuned", sits beside its model's)."""
    table = markdown_table(columns)
    return "\n".join(
        [
            BEGIN,
            "<!-- generated by scripts/readme_claims.py from saved reports; do not edit by hand -->",
            "",
            *(f"- {one.line}" for one in columns),
            "",
            "The papers used BERT-base on GLUE, fine-tuned: these are findings about these models, task verdicts against "
            "each line's margin, the proxy's against 0.01 ([how](docs/science.md#how-the-report-decides-a-claim)).",
            "",
            table,
            "",
            f"![The default report's first screen, {columns[0].model}]({FIGURE_COPY.as_posix()})",
            "",
            f"<!-- claims digest {digest(table)} -->",
            END,
        ]
    )


def replace_section(readme: str, section: str) -> str:
    """``readme`` with the text from its begin marker to its end marker replaced by ``section``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"the README needs exactly one {BEGIN} … {END} section")
    return readme[: readme.index(BEGIN)] + section + readme[readme.index(END) + len(END) :]


def screenshot(page: Path, path: Path) -> None:
    """The report page's first screen at 1,280 px, as a reader opens it (headless Chromium, selenium)."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    driver = webdriver.Chrome(options=options)
    try:
        driver.get(page.resolve().as_uri())
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
    finally:
        driver.quit()


def update(
    reports: list[Path],
    readme: Path = ROOT / "README.md",
    figure: Path | None = ROOT / FIGURE_COPY,
    full: list[Path] = (),
    finetune: list[Path] = (),
    keep: list[str] = (),
    add: list[Path] = (),
) -> str:
    """Rewrite ``readme``'s claims section (and ``figure``, the first column's report's first screen, unless
    that column is kept) from the
    default reports in ``reports``, a column each (and each ``full`` report's verdicts where its
    model's default leaves them to it; each ``finetune`` report's column beside its model's), with
    the columns headed ``keep`` as the README has them, in the README's order, each given the claims it lacks from
    the report of its model in ``add``); returns the section."""
    import attnlens
    from attnlens.io.files import write_bytes_atomic

    fulls = {result.meta["model"]["name"]: result for result in map(attnlens.load_result, full)}
    finetunes = {result.meta["model"]["name"]: result for result in map(attnlens.load_result, finetune)}
    columns, pages = [], {}
    for directory in reports:
        report = attnlens.load_result(directory)
        name = report.meta["model"]["name"]
        made = fulls.get(name)
        older = (
            None
            if made is None or made.meta.get("attnlens_version") == report.meta.get("attnlens_version")
            else made.meta.get("attnlens_version")
        )
        columns.append(column(merged(report.claims, None if made is None else made.claims, older), report.meta))
        pages[columns[-1].heading] = directory / "report.html"
        if name in finetunes:
            columns.append(column(finetuned(finetunes[name].claims), finetunes[name].meta))
    text = readme.read_text()
    if keep:
        columns = in_order(columns + kept(text, list(keep)), text)
    for directory in add:
        newer = attnlens.load_result(directory)
        columns = added(columns, newer.claims, newer.meta)
    section = claims_section(columns)
    write_bytes_atomic(readme, replace_section(text, section).encode())
    if figure is not None and columns[0].heading in pages:  # the first column's report; a kept one keeps its figure
        screenshot(pages[columns[0].heading], figure)
    return section


def _first_heading(readme: Path) -> str:
    """The heading of the README's first model column (the figure's report)."""
    header = next(line for line in readme.read_text().splitlines() if line.startswith("| claim | papers report |"))
    return header.split(" | ")[2]


def _refused(directory: Path, presets: tuple[str, ...]) -> str | None:
    """Why ``directory`` cannot be read as a report of one of ``presets``, or ``None``."""
    if not (directory / "result.json").is_file():
        return f"{directory} is not a report directory; make one with attnlens report --out DIR"
    made = json.loads((directory / "result.json").read_text()).get("preset")
    return None if made in presets else f"{directory} is a {made} report; give a {' or '.join(presets)} one here"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+", help="`attnlens report` directories (default or --quick), one per model")
    parser.add_argument("--full", type=Path, action="append", default=[], help="a `--full` report, for the claims it decides")
    parser.add_argument("--finetune", type=Path, action="append", default=[], help="a `--protocol finetune` report: a column")
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="HEADING",
        help="a column kept as the README has it (its report not made again)",
    )
    parser.add_argument(
        "--add", type=Path, action="append", default=[], help="a newer report of a kept column's model: the claims it lacks"
    )
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args(argv)
    # a model's column comes from its default report (a quick one where no default fits: its cells say so)
    checks = (
        [(directory, ("default", "quick")) for directory in args.reports]
        + [(directory, ("full",)) for directory in args.full]
        + [(directory, ("finetune",)) for directory in args.finetune]
        + [(directory, ("default", "quick", "full")) for directory in args.add]
    )
    for directory, presets in checks:
        if (why := _refused(directory, presets)) is not None:
            print(f"readme_claims: error: {why}", file=sys.stderr)
            return 2
    try:
        update(args.reports, args.readme, full=args.full, finetune=args.finetune, keep=args.keep, add=args.add)
    except ValueError as error:
        print(f"readme_claims: error: {error}", file=sys.stderr)
        return 2
    figure = "" if _first_heading(args.readme) in args.keep else f" and {FIGURE_COPY}"  # a kept first column keeps its figure
    print(f"rewrote the claims section of {args.readme}{figure} from {', '.join(map(str, args.reports))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
