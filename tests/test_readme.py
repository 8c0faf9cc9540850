"""The README is a short front door whose claims section is what the generator writes from a saved
report. (tests/test_docs.py runs its code blocks, the tour's command lines among them.)"""

from __future__ import annotations

import importlib.util
import re

import pytest

import attnlens
from tiny_models import README, readme_tour


def test_the_readme_is_a_front_door():
    """Short, with the blocks that CI and the tests read (tests/test_docs.py runs every block)."""
    text = README.read_text()
    assert len(text.encode()) <= 15_000, "reference material belongs in docs/, linked from the README"
    markers = ["<!-- main command -->", "<!-- test command -->", "<!-- tour -->", "<!-- claims -->", "<!-- claims end -->"]
    assert [text.count(marker) for marker in markers] == [1] * len(markers)
    assert [text.index(marker) for marker in markers] == sorted(text.index(marker) for marker in markers)
    toured = {line[0] for line in readme_tour()}
    assert toured >= {"report", "models", "extract", "eigen", "overlap", "reconstruct", "importance", "dam"}
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", text))
    assert linked == {path.relative_to(README.parent).as_posix() for path in (README.parent / "docs").glob("*.md")}


def _generator():
    spec = importlib.util.spec_from_file_location("readme_claims", README.parent / "scripts" / "readme_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_claims_section_is_what_the_generator_writes_from_saved_reports(tmp_path, quick_report):
    """Two reports, two model columns (the same report named twice stands in for two models): each cell
    its report's verdict exactly as printed, with the preset that made it."""
    import json
    import shutil

    generator = _generator()
    second = tmp_path / "second"
    shutil.copytree(quick_report, second)
    meta = json.loads((second / "result.json").read_text())
    meta["model"]["name"] = "another-model"
    (second / "result.json").write_text(json.dumps(meta))
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    section = generator.update([quick_report, second], readme, figure=None)  # the screenshot: tests/test_browser.py
    text = readme.read_text()
    assert section in text and text.count(generator.BEGIN) == 1
    before, after = README.read_text().split(generator.BEGIN)[0], README.read_text().split(generator.END)[1]
    assert text.startswith(before) and text.endswith(after), "only the claims section changes"
    report = attnlens.load_result(quick_report)
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0] == f"| claim | papers report | `{report.meta['model']['name']}` | `another-model` |"
    assert len(lines) - 1 == len(report.claims)
    for line, (_, claim) in zip(lines[1:], report.claims.iterrows()):
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        verdict = f"{claim['verdict']} ({claim['made by']})"
        assert cells == [claim["claim"], claim["papers report"], verdict, verdict], "each cell exactly as the report prints it"


def test_the_readme_claims_section_is_untouched_generator_output():
    generator = _generator()
    text = README.read_text()
    section = text[text.index(generator.BEGIN) : text.index(generator.END)]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    (stated,) = re.findall(r"<!-- claims digest ([0-9a-f]{16}) -->", section)
    assert stated == generator.digest(table), "edit the report and rerun scripts/readme_claims.py, not the table"
    assert table.splitlines()[0].startswith("| claim | papers report | `")
    # 9,500: the papers' claims and a decoder's four (sink, heavy hitters, sink + window, far heads)
    assert len(section.encode()) <= 9_500, "the claims section answers at a glance; the numbers live in the report"
    assert "run --full" not in table, "an undecided cell says what deciding it takes here, not which preset to run"


@pytest.mark.parametrize("typed", [True, False], ids=["phrase", "saved-before-phrase"])
def test_a_full_report_fills_the_claims_the_default_leaves_to_it(typed):
    """A claim the default leaves to --full is found by its phrase (a report saved before the phrase
    column was written: by the verdict's words)."""
    import pandas as pd

    generator = _generator()
    at_size = generator.Phrase.AT_THIS_SIZE
    default = pd.DataFrame([["a", "p", "holds: 1", "default"], ["b", "p", at_size.value, "default"]], columns=generator.COLUMNS)
    if typed:
        default["phrase"] = ["HOLDS", at_size.name]
    full = pd.DataFrame([["a", "p", "does not hold: 2", "full"], ["b", "p", "holds: 3", "full"]], columns=generator.COLUMNS)
    merged = generator.merged(default, full)
    assert merged["verdict"].tolist() == ["holds: 1", "holds: 3"] and merged["made by"].tolist() == ["default", "full"]
    older = generator.merged(default, full, older="0.1.0")  # a full report of another version says which
    assert older["made by"].tolist() == ["default", "full, attnlens 0.1.0"]


def test_the_generator_refuses_what_is_not_a_default_report(tmp_path, capsys):
    generator = _generator()
    assert generator.main([str(tmp_path)]) == 2
    assert "not a report directory" in capsys.readouterr().err


def test_a_finetune_report_is_a_column_beside_its_model_with_the_claims_it_fine_tuned():
    import pandas as pd

    generator = _generator()
    columns = generator.CLAIM_COLUMNS + [generator.SEEDS_COLUMN]
    probe = pd.DataFrame([["a", "p", "holds: 1", "default"], ["b", "p", "holds: 2", "default"]], columns=generator.COLUMNS)
    finetune = pd.DataFrame(
        [
            ["a", "p", "does not hold: 3", "", "−3.0 [−4.0, −2.0]", "finetune", "−2.9 [−5.0, −0.8] over 3 seeds (0.7 0.7 0.7)"],
            ["b", "p", "holds: 4", "", "", "finetune", ""],  # no task judged it: the probe's claim alone
            ["c", "q", "not decided: 5", "", "R fixed: 5", "finetune", ""],
            ["d", "q", generator.Phrase.AT_THIS_SIZE.value, "", "plan 90%", "finetune", ""],
        ],
        columns=columns,
    )
    section = generator.claims_section(
        [
            generator.column(probe, {"model": {"name": "m"}}),
            generator.column(generator.finetuned(finetune), {"model": {"name": "m"}, "preset": "finetune"}),
        ]
    )
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0] == "| claim | papers report | `m` | `m`, fine-tuned |"
    assert (
        lines[1] == "| a | p | holds: 1 (default) | does not hold: 3; −2.9 [−5.0, −0.8] over 3 seeds (0.7 0.7 0.7) (finetune) |"
    )
    assert lines[2] == "| b | p | holds: 2 (default) | — |"
    assert lines[3] == "| c | q | — | not decided: 5 (finetune) |" and len(lines) == 4


def test_a_kept_column_is_the_readmes_own_in_its_place_and_a_hand_edit_is_refused():
    """``--keep``: a column whose report is not made again keeps its cells and its model's line, and the
    columns stay in the README's order whichever way they arrive; a table whose digest no longer
    matches (edited by hand) cannot lend a column."""
    import pandas as pd

    generator = _generator()
    claims = lambda verdict: pd.DataFrame([["a | b", "p", verdict, "default"]], columns=generator.COLUMNS)
    first = generator.column(claims("holds: 1"), {"model": {"name": "m1"}, "created": "2026-01-01"})
    second = generator.column(claims("not decided: 2"), {"model": {"name": "m2"}, "created": "2026-01-02"})
    readme = f"intro\n{generator.claims_section([first, second])}\noutro\n"
    (kept,) = generator.kept(readme, ["`m1`"])
    assert kept == first and kept.line.endswith("made 2026-01-01 with attnlens ?.")
    again, new = (generator.column(claims("holds: 3"), {"model": {"name": name}}) for name in ("m2", "m3"))
    assert [one.heading for one in generator.in_order([new, again, kept], readme)] == ["`m1`", "`m2`", "`m3`"]
    edited = readme.replace("holds: 1 (default)", "holds: 9 (default)")
    with pytest.raises(ValueError, match="not the generator's output"):
        generator.kept(edited, ["`m1`"])
    with pytest.raises(ValueError, match="has no column `m3`"):
        generator.kept(readme, ["`m3`"])
