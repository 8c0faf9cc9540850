"""The report's page: one HTML file with the figures embedded. Its first screen holds each paper's
question with its verdict here (:mod:`attnlens.report.claims`); a section per analysis follows
(:mod:`attnlens.report.sections`, :mod:`attnlens.report.dam`, :mod:`attnlens.report.plan`), then
how it was made."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pandas as pd

from attnlens.io.provenance import provenance
from attnlens.progress import Progress, progress_bar
from attnlens.report.budget import Budget
from attnlens.report.claims import findings
from attnlens.report.dam import dam_section
from attnlens.report.deciding import Deciding
from attnlens.report.decoder import sinks_section
from attnlens.report.html import STYLE, Figures, table
from attnlens.report.plan import CLAIM as PLAN_CLAIM
from attnlens.report.plan import plan_section
from attnlens.report.sections import (
    eigen_sections,
    importance_section,
    other_figures_section,
    reconstruct_section,
    summary_section,
    task_section,
)

PRESETS_SAID = {
    "quick": "the quick report: a first look at every stage on small settings; nothing it shows is decided",
    "default": "the default report: what decides within 10 minutes on 2 cores; `attnlens report --full` decides the rest",
    "full": "the full report: every claim at the size that decides it",
    "finetune": "the papers' protocol: each judged change inside fine-tuning, 3 seeds (the plan: `attnlens report --full`)",
}


def write_page(
    directory: Path,
    results: dict,
    names: dict[str, str],
    command: str | None,
    preset: str = "default",
    *,
    progress: Progress = False,
    deciding: Deciding | None = None,
    budget: Budget | None = None,
) -> tuple[Path, pd.DataFrame]:
    """Save every result (with its figures) into ``directory``, then ``report.html`` from them;
    returns the page and its claims table (the table the README's claims section is made from).
    ``deciding``: what deciding an open claim takes here; ``budget``: how the report was sized, if it was."""
    with progress_bar(total=len(results), desc="figures", unit="result", enabled=progress) as bar:
        for key, result in results.items():
            result.save(directory / names[key])
            # PNG only, the page's format (drawing them is most of the stage); `attnlens figures` writes PDFs too
            result.save_figures(directory / names[key] / "figures", formats=("png",))
            bar.update(1)
    figures = Figures(directory)
    made_by = preset if budget is None else f"{preset}, {budget.said}"
    found = findings(results, preset, deciding, made_by)  # every verdict, once: the claims table and the sections read them
    claimed = found.table()
    sections = [
        summary_section(results, claimed, found.context),
        *eigen_sections(results, names, figures),
        reconstruct_section(results, names, figures, found.k_phrases),
        importance_section(results, names, figures),
        sinks_section(results, names, figures),
        dam_section(results, names, figures, found.masks, found.context),
        task_section(results, names, figures),
        plan_section(results, names, figures, found.claim(PLAN_CLAIM), found.context),
        other_figures_section(names, figures),
    ]
    page = directory / "report.html"
    page.write_text(_page(results["eigen"], sections, names, command, preset, budget))
    return page, claimed


def _page(
    eigen_result, sections: list[str], names: dict[str, str], command: str | None, preset: str, budget: Budget | None
) -> str:
    meta: dict[str, Any] = provenance(command)
    said = PRESETS_SAID.get(preset, preset) + ("" if budget is None else f"; {budget.table()}")
    model = eigen_result.meta["model"]
    files = "".join(f"<li><code>{html.escape(name)}/</code></li>" for name in names.values())
    versions = table(pd.DataFrame(sorted(meta["versions"].items()), columns=["package", "version"]), text=True)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>attnlens report: {html.escape(model["name"])}</title>
<style>{STYLE}</style></head><body>
<h1>attnlens report: {html.escape(model["name"])} on {html.escape(str(eigen_result.meta["corpus"].get("source")))}</h1>
<p class="lede">{html.escape(model["architecture"])}, {model["num_layers"]} layers × {model["num_heads"]} heads;
{html.escape(said)}. Made {html.escape(meta["created"][:10])}.</p>
{"".join(sections)}
<section id="made"><h2>How this report was made</h2><p>By <code>{html.escape(meta["command"])}</code> on
{html.escape(meta["created"])}. Every result is a directory next to this page, readable with
<code>attnlens.load_result(path)</code>; <code>attnlens figures DIR... --out FIGS</code> redraws its figures.</p>
<ul>{files}</ul>{versions}</section>
</body></html>
"""
