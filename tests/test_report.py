"""The one-command report end to end (--quick), and figures redrawn from its saved results without the model."""

from __future__ import annotations

import base64
import html
import re

import matplotlib.pyplot as plt

import attnlens
from attnlens.models import loading as models
from tiny_models import assert_one_line_error, run_cli


def test_report_page_embeds_figures_tables_and_provenance(quick_report):
    page = (quick_report / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 8 and all(len(image) > 10_000 for image in images), "figures are embedded, not linked"
    assert "<table" in page and "papers report" in page and "measured here" in page
    assert "attnlens report --quick" in page and "<td>torch</td>" in page  # the versions, as a table
    report = attnlens.load_result(quick_report)
    assert set(report.meta["results"]) >= {"eigen", "eigen_second", "overlap", "reconstruct", "importance", "dam"}
    assert "Which positions of the attention matrix matter?" in page and "cheapest class to remove" in page
    overlap = report.result("overlap")
    assert overlap.meta["models"] == ["minilm-l6", "minilm-l3"]
    # the task section: accuracy against k, per class and against sparsity, and task numbers in the claims
    assert "What does the task say?" in page and "task accuracy here" in page and "typical head: median" in page
    for key, table in (("reconstruct", "plug_in"), ("importance", "task"), ("dam", "task")):
        judged = report.result(key).tables[table]
        assert judged["accuracy"].between(0, 1).all() and (judged["accuracy_low"] <= judged["accuracy_high"]).all()
        assert report.result(key).meta["task"]["task"] == "rotten-tomatoes"


def test_report_page_holds_every_figure_the_stages_saved(quick_report):
    page = (quick_report / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    saved = sorted(quick_report.glob("*/figures/*.png"))
    assert len(saved) > 20
    assert sorted(embedded) == sorted(base64.b64encode(path.read_bytes()).decode() for path in saved), "each exactly once"


def test_report_claims_are_the_page_summary_and_reload(quick_report):
    report = attnlens.load_result(quick_report)
    claims = report.claims
    assert list(claims.columns) == ["claim", "papers report", "measured here (proxy)", "task accuracy here"]
    page = (quick_report / "report.html").read_text()
    summary = page[page.index("Summary: the papers") : page.index("1. Are attention score rows")]
    for cell in claims.to_numpy().ravel():
        assert f">{html.escape(cell, quote=False)}<" in summary, cell  # the page prints the saved table, cell for cell
    overlap = report.result("overlap")
    own = overlap.split_half.query("result == 0 and level == 'layer'")
    stated = ", ".join(f"L{row.layer} {row.stable_dim}" for row in own.itertuples())
    assert f"up to d = {stated};" in claims.iloc[1]["measured here (proxy)"]


def test_report_refuses_to_overwrite(capsys, quick_report):
    before = (quick_report / "report.html").stat().st_mtime_ns
    assert_one_line_error(*run_cli(capsys, "report", "--quick", "--out", str(quick_report))[::2], "already exists")
    assert (quick_report / "report.html").stat().st_mtime_ns == before


def test_figures_are_redrawn_from_results_without_the_model(capsys, tmp_path, quick_report, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("figures must not load a model")

    monkeypatch.setattr(models, "load_model", no_model)
    monkeypatch.setattr(attnlens, "load_model", no_model)
    report = attnlens.load_result(quick_report)
    dirs = [str(quick_report / name) for name in report.meta["results"].values()]
    code, out, _ = run_cli(capsys, "figures", *dirs, "--out", str(tmp_path / "figs"))
    assert code == 0
    expected = {
        report.meta["results"]["eigen"]: ["spectra", "energy"],
        "overlap": [
            "overlap_layers_0",
            "overlap_heads_0",
            "overlap_layers_0_1",
            "overlap_heads_0_1",
            "split_half_0",
            "split_half_1",
        ],
        "reconstruct": ["error_vs_k", "tv_vs_k", "error_vs_flops", "fidelity_vs_k"],
        "importance": ["mass", "ablation", "gradient", "head_importance"],
        "dam": ["keep_per_class", "loss_vs_sparsity", "training", "masks"],
    }
    for directory, stems in expected.items():
        for stem in stems:
            for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
                path = tmp_path / "figs" / directory / f"{stem}{suffix}"
                assert path.read_bytes()[:4] == magic, path


def test_every_figure_function_draws_on_given_axes(quick_report):
    from attnlens.figures import attention, dam, eigen, importance, overlap, reconstruct

    report = attnlens.load_result(quick_report)
    e, o, r = report.result("eigen"), report.result("overlap"), report.result("reconstruct")
    i, d = report.result("importance"), report.result("dam")
    calls = [
        lambda ax: eigen.plot_spectra(e, ax),
        lambda ax: eigen.plot_energy(e, ax),
        lambda ax: overlap.plot_overlap(o, "layers_0_1", ax),
        lambda ax: overlap.plot_split_half(o, ax),
        lambda ax: reconstruct.plot_error_vs_k(r, ax),
        lambda ax: reconstruct.plot_error_vs_flops(r, ax),
        lambda ax: reconstruct.plot_fidelity_vs_k(r, ax),
        lambda ax: reconstruct.plot_accuracy_vs_k(r, ax),
        lambda ax: importance.plot_task_ablation(i, ax),
        lambda ax: dam.plot_accuracy_vs_sparsity(d, ax),
        lambda ax: importance.plot_mass(i, "self", ax),
        lambda ax: importance.plot_entropy(i, ax),
        lambda ax: importance.plot_ablation(i, ax),
        lambda ax: importance.plot_gradient(i, ax),
        lambda ax: importance.plot_head_importance(i, ax),
        lambda ax: dam.plot_keep(d, ax),
        lambda ax: dam.plot_loss_vs_sparsity(d, ax),
        lambda ax: attention.plot_attention(e.arrays["layer_eigenvectors"][0, 0, 0][:, :8], ax, kind="scores"),
    ]
    for draw in calls:
        figure, ax = plt.subplots()
        assert draw(ax) is ax
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        plt.close(figure)
    plt.close(dam.plot_masks(d))
    training = dam.plot_training(d)  # three panels: objective, densities, undecided logits
    assert [ax.get_ylabel() for ax in training.axes][2].startswith("undecided") and len(training.axes) == 3
    plt.close(training)


def test_every_result_shows_itself_in_a_terminal_and_in_jupyter(quick_report):
    """repr: the class, the model and what it holds; _repr_html_: provenance, the main table's head, the main figure."""
    report = attnlens.load_result(quick_report)
    for key in report.meta["results"]:
        result = report.result(key)
        text = repr(result)
        assert text.startswith(type(result).__name__ + "(") and result.model_name in text and "\n" not in text
        page = result._repr_html_()
        assert "<th style='text-align:left'>model</th>" in page and result.model_name in page
        assert "command" in page and "attnlens report --quick" in page, "the provenance names the command"
        if result.table is not None:
            first = result.table.columns[0]
            assert f"<th>{first}</th>" in page, f"{key}: the head of its main table"
        assert re.search(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', page), f"{key}: its main figure"
    assert "Report(" in repr(report)
