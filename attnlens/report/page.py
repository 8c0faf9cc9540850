"""The report's page: one HTML file with the figures embedded, a section per analysis
(:mod:`attnlens.report.sections`), and the papers' claims next to what the model shows
(:mod:`attnlens.report.claims`)."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from attnlens.io.provenance import provenance
from attnlens.progress import Progress, progress_bar
from attnlens.report.claims import claims
from attnlens.report.sections import (
    Figures,
    _dam_section,
    _eigen_sections,
    _importance_section,
    _other_figures_section,
    _plan_section,
    _reconstruct_section,
    _summary_section,
    _table,
    _task_section,
)


def write_page(
    directory: Path,
    results: dict,
    names: dict[str, str],
    command: str | None,
    preset: str = "default",
    *,
    progress: Progress = False,
) -> tuple[Path, pd.DataFrame]:
    """Save every result (with its figures) into ``directory``, then ``report.html`` from them;
    returns the page and its claims table (the table the README's claims section is made from)."""
    with progress_bar(total=len(results), desc="figures", unit="result", enabled=progress) as bar:
        for key, result in results.items():
            result.save(directory / names[key])
            # PNG only, the page's format (drawing them is most of the stage); `attnlens figures` writes PDFs too
            result.save_figures(directory / names[key] / "figures", formats=("png",))
            bar.update(1)
    figures = Figures(directory)
    table = claims(results, preset)
    sections = [
        _summary_section(results, table),
        *_eigen_sections(results, names, figures),
        _reconstruct_section(results, names, figures),
        _importance_section(results, names, figures),
        _dam_section(results, names, figures),
        _task_section(results, names, figures),
        _plan_section(results, names, figures),
        _other_figures_section(names, figures),
    ]
    page = directory / "report.html"
    page.write_text(_page(results["eigen"], sections, names, command))
    return page, table


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
.question { color: #555; } figure { display: inline-block; margin: 0.5em; width: 48%; vertical-align: top; }
figure img { width: 100%; } figcaption { font-size: 0.85em; color: #555; text-align: center; }
table.data { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
table.data td, table.data th { padding: 0.25em 0.6em; border-bottom: 1px solid #e4e4e4; text-align: right; }
table.data td:first-child, table.data th:first-child { text-align: left; }
table.text td, table.text th { text-align: left; vertical-align: top; } div.table { overflow-x: auto; }
code, pre { background: #f5f5f5; padding: 0.1em 0.3em; } pre { padding: 0.6em; overflow-x: auto; }
"""


def _page(eigen_result, sections: list[str], names: dict[str, str], command: str | None) -> str:
    meta = provenance(command)
    model = eigen_result.meta["model"]
    files = "".join(f"<li><code>{html.escape(name)}/</code></li>" for name in names.values())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>attnlens report: {html.escape(model["name"])}</title>
<style>{STYLE}</style></head><body>
<h1>attnlens report: {html.escape(model["name"])} ({html.escape(model["architecture"])}, {model["num_layers"]} layers ×
{model["num_heads"]} heads) on {html.escape(str(eigen_result.meta["corpus"].get("source")))}</h1>
<p>Made {html.escape(meta["created"])} by <code>{html.escape(meta["command"])}</code></p>
{_table(pd.DataFrame(sorted(meta["versions"].items()), columns=["package", "version"]), text=True)}
{"".join(sections)}
<section><h2>Files</h2><p>Every result is a directory next to this page, readable with
<code>attnlens.load_result(path)</code>; <code>attnlens figures DIR... --out FIGS</code> redraws its figures.</p>
<ul>{files}</ul></section>
</body></html>
"""
