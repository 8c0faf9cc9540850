"""The blocks the report's page is built of: a section that answers its question in its first
sentence, figures shown at a width where their text reads, and tables that fit the page with
readable headers, each header's meaning beside it, long ones folded.

>>> print(table(pd.DataFrame({"head_k90_median": [3.0]}), notes={"head_k90_median": "over heads"}))
<div class='table'><table class='data'><thead><tr><th title='over heads'>median head: k for 90%</th></tr></thead><tbody><tr><td>3</td></tr></tbody></table><p class='notes'><b>median head: k for 90%</b>: over heads</p></div>
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

FOLD_ROWS = 12  # a longer table is folded: its first rows show, the rest open on a click
# Readable headers for the columns the report shows; any other column reads with its underscores as spaces.
HEADERS = {
    "head_k90_median": "median head: k for 90%",
    "head_k90_min": "least head",
    "head_k90_max": "most head",
    "baseline_k90": "Gaussian rows: k for 90%",
    "head_effective_rank": "median head: effective rank",
    "ones_fraction": "variance along all-ones",
    "pooled_k90": "heads pooled: k for 90%",
    "pooled_k95": "k for 95%",
    "pooled_k99": "k for 99%",
    "rel_error": "relative error",
    "rel_error_zero": "error vs zero",
    "flops_ratio": "FLOPs ×",
    "delta_accuracy": "Δ accuracy",
    "delta_halfwidth": "± (half-width)",
    "held_out": "examples",
    "split_half_a": "split-half a",
    "split_half_b": "split-half b",
}


def header(column: str) -> str:
    """The header a reader sees for ``column``."""
    return HEADERS.get(column, column.replace("_", " "))


def table(
    frame: pd.DataFrame, *, notes: dict[str, str] | None = None, digits: int = 3, text: bool = False, kind: str = ""
) -> str:
    """An HTML table with readable headers, each note as the header's title and listed under the
    table; longer than :data:`FOLD_ROWS` rows, the rest folded; ``text`` tables are left-aligned prose;
    ``kind`` adds a class of its own (``claims``)."""
    classes = " ".join(["data", *(["text"] if text else []), *([kind] if kind else [])])
    notes = {column: note for column, note in (notes or {}).items() if column in frame}
    shown = frame.rename(columns={column: header(column) for column in frame.columns})

    def render(part: pd.DataFrame) -> str:
        body = part.to_html(index=False, float_format=lambda value: f"{value:.{digits}g}", border=0, na_rep="", escape=True)
        body = body.replace('<table class="dataframe">', f"<table class='{classes}'>")
        for column, note in notes.items():
            body = body.replace(
                f"<th>{html.escape(header(column))}</th>",
                f"<th title='{html.escape(note)}'>{html.escape(header(column))}</th>",
                1,
            )
        return _compact(body)

    said = "".join(f"<b>{html.escape(header(column))}</b>: {html.escape(note)}; " for column, note in notes.items())
    listed = f"<p class='notes'>{said.rstrip('; ')}</p>" if said else ""
    if len(shown) <= FOLD_ROWS:
        return f"<div class='table'>{render(shown)}{listed}</div>"
    rest = f"<details><summary>{len(shown) - FOLD_ROWS} more rows</summary>{render(shown.iloc[FOLD_ROWS:])}</details>"
    return f"<div class='table'>{render(shown.iloc[:FOLD_ROWS])}{rest}{listed}</div>"


def _compact(rendered: str) -> str:
    """pandas' HTML without its line breaks and indentation (the page is one file; a doctest reads it)."""
    lines = [line.strip() for line in rendered.splitlines()]
    return "".join(lines).replace('<tr style="text-align: right;">', "<tr>")


def section(title: str, answer: str, body: list[str], method: str = "", anchor: str = "") -> str:
    """A section: its question as the title, its answer in the first sentence (with the number that
    answers it), the figures and tables, and how it was measured, folded."""
    how = (
        f"<details class='method'><summary>How this was measured</summary><p>{html.escape(method)}</p></details>"
        if method
        else ""
    )
    ident = f" id='{anchor}'" if anchor else ""
    return (
        f"<section{ident}><h2>{html.escape(title)}</h2><p class='answer'>{html.escape(answer)}</p>{''.join(body)}{how}</section>"
    )


def folded(summary: str, parts: list[str]) -> str:
    """``parts`` behind a click: the secondary figures and tables of a section."""
    shown = [part for part in parts if part]
    return f"<details><summary>{html.escape(summary)}</summary>{''.join(shown)}</details>" if shown else ""


class Figures:
    """The figures the page embeds, at the page's full width (so their text reads as drawn), each
    linked to its PNG beside the page; it remembers them so the page can show the ones no section showed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.shown: set[Path] = set()

    def embed(self, path: Path, caption: str) -> str:
        self.shown.add(path.resolve())
        data = base64.b64encode(path.read_bytes()).decode()
        link = html.escape(path.relative_to(self.directory).as_posix())
        return (
            f"<figure><a href='{link}'><img src='data:image/png;base64,{data}' alt='{html.escape(caption)}'></a>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )

    def embed_if_saved(self, path: Path, caption: str) -> str:
        return self.embed(path, caption) if path.is_file() else ""

    def rest(self, name: str) -> list[Path]:
        """The saved PNG figures of result directory ``name`` that no section embedded."""
        return [path for path in sorted((self.directory / name / "figures").glob("*.png")) if path.resolve() not in self.shown]


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 1.2em auto; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; font-size: 1.25em; }
p.lede { color: #555; margin: 0.2em 0 0.8em; } p.answer { font-size: 1.05em; }
figure { margin: 0.8em 0; } figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { font-size: 0.85em; color: #555; text-align: center; }
table.data { border-collapse: collapse; font-size: 0.82em; margin: 0.6em 0; max-width: 100%; }
table.data td, table.data th { padding: 0.2em 0.5em; border-bottom: 1px solid #e4e4e4; text-align: right; vertical-align: top; }
table.data th { font-weight: 600; } table.data td:first-child, table.data th:first-child { text-align: left; }
table.text td, table.text th { text-align: left; } div.table { overflow-x: auto; }
p.notes { font-size: 0.8em; color: #555; margin-top: 0.2em; }
details { margin: 0.6em 0; } summary { cursor: pointer; color: #225; }
table.claims { font-size: 0.88em; } table.claims td:nth-child(3) { width: 48%; }
code, pre { background: #f5f5f5; padding: 0.1em 0.3em; } pre { padding: 0.6em; overflow-x: auto; }
"""
