"""The one-command report end to end (--quick), and figures redrawn from its saved results without the model."""

from __future__ import annotations

import base64
import html
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import scipy.stats

import attnlens
from attnlens.analysis.task import seed_values
from attnlens.models import loading as models
from tiny_models import assert_one_line_error, run_cli


def test_report_page_embeds_figures_tables_and_provenance(quick_report):
    page = (quick_report / "report.html").read_text()
    images = re.findall(r"src=['\"]data:image/png;base64,([A-Za-z0-9+/=]+)['\"]", page)
    assert len(images) >= 8 and all(len(image) > 10_000 for image in images), "figures are embedded"
    assert "<table" in page and "papers report" in page and "verdict" in page
    assert "attnlens report --quick" in page and "<td>torch</td>" in page  # the versions, as a table
    report = attnlens.load_result(quick_report)
    assert set(report.meta["results"]) >= {"eigen", "eigen_second", "overlap", "reconstruct", "importance", "dam"}
    assert "Which positions of the attention matrix matter?" in page and "The diagonal (self) matters least" in page
    overlap = report.result("overlap")
    assert overlap.meta["models"] == ["minilm-l6", "minilm-l3"]
    # the task section: accuracy against k, per class and against sparsity, and task numbers in the claims
    assert "What does the task say?" in page and "Δ accuracy, points" in page and "typical head" in page
    for key, table in (("reconstruct", "plug_in"), ("importance", "task"), ("dam", "task")):
        judged = report.result(key).tables[table].dropna(subset=["accuracy"])
        assert judged["accuracy"].between(0, 1).all() and (judged["accuracy_low"] <= judged["accuracy_high"]).all()
        # the claims about computing fewer scores on texts that fill the attention, the positions on sentences
        assert report.result(key).meta["task"]["task"] == ("imdb" if key == "reconstruct" else "rotten-tomatoes")
    # the task judges the claims' changes only, and the page says which, on how many examples
    plug = report.result("reconstruct").plug_in.dropna(subset=["accuracy"])
    assert set(zip(plug.strategy, plug.scope, plug.k)) == {("greedy", "head", 16)}
    ablated = report.result("importance").tables["task"]
    assert set(ablated["class"]) <= {"none", "self", "cls", "sep"} and set(ablated["control"]) == {"none", "class", "random"}
    assert "Judged by the task" in page and "held-out examples" in page
    compared = report.result("dam").tables["task_compared"]
    assert (abs(compared["task_sparsity"] - compared["dam_task_sparsity"]) <= 0.03).all(), "matched on the task's positions"


def test_report_page_holds_every_figure_the_stages_saved(quick_report):
    page = (quick_report / "report.html").read_text()
    embedded = re.findall(r"src=['\"]data:image/png;base64,([A-Za-z0-9+/=]+)['\"]", page)
    saved = sorted(quick_report.glob("*/figures/*.png"))
    assert len(saved) > 20
    assert sorted(embedded) == sorted(base64.b64encode(path.read_bytes()).decode() for path in saved), "each exactly once"


def test_report_claims_are_the_page_summary_and_reload(quick_report):
    from attnlens.report.claims import CLAIM_COLUMNS
    from attnlens.report.verdicts import RECORD_FIELDS, Phrase

    report = attnlens.load_result(quick_report)
    claims = report.claims
    assert list(claims.columns) == CLAIM_COLUMNS + list(RECORD_FIELDS) and set(claims["made by"]) == {"quick"}
    page = (quick_report / "report.html").read_text()
    summary = page[page.index("<section id='claims'>") : page.index("1. Are attention score rows")]
    for cell in claims[CLAIM_COLUMNS].drop(columns=["made by"]).to_numpy().ravel():
        assert f">{html.escape(cell, quote=False)}<" in summary or not cell, (
            cell
        )  # the page prints the saved table, cell for cell
    for name, verdict in zip(claims["phrase"], claims["verdict"]):  # the phrase, then the number that decides it
        assert verdict.startswith(Phrase[name].value), (name, verdict)
    learned = claims[claims["claim"].str.startswith(("A learned mask", "Fixed sparse", "A plan head"))]
    assert (learned["phrase"] == "AT_THIS_SIZE").all() and learned["verdict"].str.fullmatch(
        rf"{Phrase.AT_THIS_SIZE.value} \(--full's (DAM|plan) decides it: [^)]+, about [^)]+ here\)"
    ).all(), "a quick look decides nothing learned, prints no number for it, and says what deciding takes here"
    assert (pd.to_numeric(learned["needs_seconds"]) > 0).all() and (learned["needs_examples"] == "").all()
    # the typed numbers behind a verdict are the ones its words print: the diagonal's by the proxy, or the task
    diagonal = claims.set_index("claim").loc["The diagonal (self) matters least (paper 2)"]
    said = f"{diagonal['difference']:+#.3g} [{diagonal['difference_low']:+#.3g}, {diagonal['difference_high']:+#.3g}]"
    assert said in diagonal["verdict"], (said, diagonal["verdict"])
    overlap = report.result("overlap")
    adjacent = overlap.pairs.query("comparison == 'layers_0' and layer_b == layer_a + 1 and d > 0")
    for row in adjacent.itertuples():
        assert f"L{row.layer_a}–L{row.layer_b} {row.overlap:.2f} at d = {row.d}" in claims.iloc[1]["proxy"]
    # minilm-l6 is an encoder: no sinks stage, none of a decoder's claims, and its overlap names no shared direction
    assert "sinks" not in report.meta["results"] and not claims["claim"].str.contains("sink|heavy-hitter|look far").any()
    assert "all-ones" not in claims.iloc[1]["verdict"] + claims.iloc[1]["proxy"]


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
    # one result of each kind that needs a model to compute (overlap and importance draw the most text, and
    # test_figure_legends.py draws every figure of every kind, so they are left out here)
    names = report.meta["results"]
    dirs = [str(quick_report / names[key]) for key in ("eigen", "reconstruct", "dam", "plan")]
    code, out, _ = run_cli(capsys, "figures", *dirs, "--out", str(tmp_path / "figs"))
    assert code == 0
    expected = {
        names["eigen"]: ["spectra", "energy"],
        names["reconstruct"]: ["error_vs_k", "tv_vs_k", "error_vs_flops", "fidelity_vs_k"],
        names["dam"]: ["keep_per_class", "loss_vs_sparsity", "training", "masks"],
        names["plan"]: ["flops_by_budget"],
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


@pytest.mark.slow
def test_the_finetune_protocol_report_trains_each_change_and_says_so_across_seeds(tmp_path, monkeypatch, minilm_l3):
    # the papers' protocol (QUICK_FINETUNE, made smaller still): every judged change inside
    # fine-tuning, two seeds; R fixed and R joint; DAM against band (local cannot reach 90% at n = 32) matched on the task's
    # positions; the claims gain the column across seeds (reloading a cached run without training
    # is tested in test_joint_r.py); every stage judges on one task, so all share the unmodified runs
    from attnlens.report import PRESETS, QUICK_FINETUNE, report

    tasks = dict(task_train=32, task_eval=24, finetune_steps=2)
    tiny = QUICK_FINETUNE.stages(
        eigen=dict(seq_len=32, num_seqs=48), reconstruct=dict(seq_len=32, ks=(4, 16), num_seqs=32, **tasks),
        importance=dict(seq_len=32, num_seqs=8, **tasks), dam=dict(seq_len=32, steps=10, stop_window=5, train_seqs=8, adapted_patterns=("band",), **tasks),
        plan=dict(seq_len=32, task_train=32),
    )  # fmt: skip
    monkeypatch.setitem(PRESETS, ("finetune", "quick"), tiny)
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    page = report(tmp_path / "ft", model=minilm_l3, quick=True, protocol="finetune", compare=None, progress=False)
    result = attnlens.load_result(page.parent)
    from attnlens.report.claims import CLAIM_COLUMNS, SEEDS_COLUMN

    assert list(result.claims.columns)[len(CLAIM_COLUMNS)] == SEEDS_COLUMN  # after the words, before the typed fields
    assert "over 2 seeds" in " ".join(result.claims[SEEDS_COLUMN])
    plug = result.result("reconstruct").plug_in.dropna(subset=["accuracy"])
    assert set(zip(plug.scope, plug.k)) == {("all", 16)} and plug["joint_accuracy"].between(0, 1).all()
    seeds = seed_values(plug.iloc[0]).tolist()
    assert len(seeds) == 2 and plug["accuracy_seeds"].iloc[0] == pytest.approx(np.mean(seeds), abs=1e-4)
    compared = result.result("dam").tables["task_compared"]
    assert result.result("dam").meta["settings"]["trained_on"] == "task", "SparseBERT's protocol: masks learned on the task"
    assert len(compared) and set(compared["pattern"]) == {"band"}
    assert (compared["scope"] == "same fine-tuning").all()
    runs = result.result("importance").meta["task"]["finetune"]["runs"]
    assert {run["seed"] for run in runs} == {0, 1} and len(runs) == 2 * 3  # unmodified, self and its control
    unmodified = {
        stage: {
            run["seed"]: run["cache"] for run in result.result(stage).meta["task"]["finetune"]["runs"] if run["change"] is None
        }
        for stage in ("reconstruct", "importance", "dam")
    }
    assert unmodified["reconstruct"] == unmodified["importance"] == unmodified["dam"] and len(unmodified["dam"]) == 2
    verdicts = result.claims.set_index("claim")["verdict"]
    assert "(one R shared by every layer)" in verdicts["k = 16 exact scores suffice (paper 1)"], "the maps the task judged"
    assert "learned − fixed" in verdicts["R learned with the weights beats R fixed at k = 16 (paper 1)"]
    # DAM against the pattern trained alike, paired by seed: the t interval of each seed's difference, by scipy
    task = result.result("dam").tables["task"]
    dam_seeds, band_seeds = (seed_values(task[task["kind"] == kind].iloc[0]) for kind in ("dam", "pattern"))
    differences = 100 * (dam_seeds - band_seeds)
    half = scipy.stats.t.ppf(0.975, len(differences) - 1) * differences.std(ddof=1) / np.sqrt(len(differences))
    said = result.claims.set_index("claim").loc["Fixed sparse patterns are worse than DAM (paper 2)", SEEDS_COLUMN]
    stated = [float(value.replace("−", "-")) for value in re.findall(r"[−+]\d+\.\d", said)]
    assert said.endswith("over 2 seeds") and np.allclose(
        stated, [differences.mean(), differences.mean() - half, differences.mean() + half], atol=0.06
    ), said


def _seeds(values) -> str:
    """Per-seed accuracies as results saved by earlier versions held them: one text column."""
    return " ".join(f"{value:.4f}" for value in values)


@pytest.mark.parametrize("saved", ["now", "earlier"])
def test_the_choices_of_r_are_decided_by_differences_paired_by_seed(saved):
    """Paper 1's choices of R from fine-tuned seeds: each claim's interval is the t interval of the
    per-seed differences (scipy, by hand here), and a claim holds only where every training of R says so.
    A result saved by an earlier version (the seeds as text) reads the same, converted as it loads."""
    import pandas as pd
    from scipy import stats

    from attnlens.io.legacy import upgraded
    from attnlens.report.claims import _choices_of_r
    from attnlens.report.verdicts import Context as Evidence

    base = np.array([0.80, 0.82, 0.78])
    accuracies = {  # (scope, k): (R fixed, R learned with the weights or None)
        ("all", 16): (base + [0.031, 0.030, 0.029], base + [0.041, 0.040, 0.042]),
        ("layer", 16): (base, base + [0.010, 0.009, 0.011]),
        ("all", 32): (base, None),
        ("layer", 32): (base + [0.03, -0.03, 0.00], None),
    }
    plug = pd.DataFrame(
        [
            {"strategy": "greedy", "scope": scope, "k": k, "seed_accuracies": _seeds(fixed),
             "joint_seed_accuracies": np.nan if joint is None else _seeds(joint)}
            for (scope, k), (fixed, joint) in accuracies.items()
        ]
    )  # fmt: skip
    read = lambda table: upgraded("reconstruct", {"plug_in": table.copy()})["plug_in"]
    if saved == "now":  # written as this version writes it: a column per seed
        plug = read(plug)
        assert "seed_accuracies" not in plug and {"seed_accuracy_2", "joint_seed_accuracy_2"} <= set(plug)
    claims = {claim.claim: claim for claim in _choices_of_r(read(plug), Evidence("default", seeded=True))}
    shared = claims["A shared R beats one per layer at k = 16 (paper 1)"]
    assert shared.verdict.phrase.value == "holds", "shared − per layer lies above 0 with R fixed and with R learned"
    difference = np.array([0.031, 0.030, 0.029])  # shared − per layer, R fixed, seed by seed
    half = stats.t.ppf(0.975, 2) * difference.std(ddof=1) / np.sqrt(3)
    assert f"[+{100 * (difference.mean() - half):.1f}, +{100 * (difference.mean() + half):.1f}]" in shared.verdict.text
    assert claims["One R per layer beats a shared R at k = 32 (paper 1)"].verdict.phrase.value == "not decided"
    learned = claims["R learned with the weights beats R fixed at k = 16 (paper 1)"]
    assert learned.verdict.phrase.value == "holds" and "R per layer: learned − fixed +1.0" in learned.task
    assert learned.seeds == "by seed, points: one R shared by every layer +1.0 +1.0 +1.3; R per layer +1.0 +0.9 +1.1"
    undecided = base + [0.03, -0.03, 0.0]  # one scope undecided
    if saved == "now":
        plug.loc[plug.scope == "layer", [f"joint_seed_accuracy_{seed}" for seed in range(3)]] = undecided
    else:
        plug.loc[plug.scope == "layer", "joint_seed_accuracies"] = _seeds(undecided)
    claims = {claim.claim: claim for claim in _choices_of_r(read(plug), Evidence("default", seeded=True))}
    assert claims["R learned with the weights beats R fixed at k = 16 (paper 1)"].verdict.phrase.value == "not decided"
    assert claims["A shared R beats one per layer at k = 16 (paper 1)"].verdict.phrase.value == "not decided"


def test_an_unknown_report_protocol_is_one_line(capsys, tmp_path):
    code, out, err = run_cli(capsys, "report", "--protocol", "refit", "--out", str(tmp_path / "r"))
    assert_one_line_error(code, err, "protocol")


def test_quick_and_full_together_are_one_line(capsys, tmp_path):
    code, out, err = run_cli(capsys, "report", "--quick", "--full", "--out", str(tmp_path / "r"))
    assert_one_line_error(code, err, "quick", "full", "choose one")
    assert not (tmp_path / "r").exists()


def test_report_plans_the_cheapest_attention(quick_report):
    """The plan stage: its section, and a claims row whose numbers are the plan result's own."""
    report = attnlens.load_result(quick_report)
    page = (quick_report / "report.html").read_text()
    assert "What is the cheapest attention that keeps the model?" in page
    plan = report.result("plan")
    assert plan.meta["task"]["task"] == "imdb" and plan.settings["protocol"] == "probe"
    from attnlens.report.plan import CLAIM

    row = report.claims[report.claims["claim"] == CLAIM].iloc[0]
    methods = plan.methods[plan.methods.budget == 1.0].set_index("method")
    assert f"plan {methods.loc['plan', 'flops_ratio']:.0%} of the FLOPs" in row["task: Δ accuracy, points (changed − unmodified)"]
    units = plan.settings["units"]
    assert units["select"] + units["check"] == plan.settings["task_eval"]


def test_the_presets_keep_their_budgets_as_last_measured():
    """The stages' seconds bench/bench_report.py measured (the progress bar's weights): the default report
    within 10 minutes on 2 cores, --quick within 2, --full within 30 and the finetune protocol within 90; a
    stage that breaks them goes behind --full. The full plan judges on enough examples for its 1-point claim to be forecast at all."""
    from attnlens.analysis.plan.judging import task_eval_needed
    from attnlens.report.presets import DEFAULT, FULL, QUICK, stage_weights

    assert sum(stage_weights("default").values()) <= 600 and sum(stage_weights("quick").values()) <= 120
    assert sum(stage_weights("full").values()) <= 1800 and sum(stage_weights("finetune").values()) <= 5400
    assert list(stage_weights("default")) == list(stage_weights("quick")) == list(stage_weights("full"))
    assert FULL.dam.mask.seeds == 3 and FULL.dam.judging.reference and FULL.reconstruct.task.name
    assert 1.0 in FULL.plan.max_drop and FULL.plan.task.task_eval >= task_eval_needed(0.01)
    assert DEFAULT.dam.mask.seeds == QUICK.dam.mask.seeds == 1
    assert DEFAULT.reconstruct.task.name and {16, 32} <= set(
        DEFAULT.reconstruct.on_task.ks
    )  # the k claims are decided by the task


def test_a_report_task_option_reaches_every_stage_the_preset_judges_and_none_removes_them():
    """--task NAME: that task for every stage judged by one (the savings' too); --task none: no task, no
    plan, and no field that needs a task left behind (each stage's settings validate as they are made)."""
    from attnlens.report.presets import DEFAULT, FINETUNE

    mine = DEFAULT.for_run(corpus="wordnet", seed=3, task="rotten-tomatoes")
    judged = [mine.reconstruct, mine.importance, mine.plan]
    assert {stage.task.name for stage in judged} == {"rotten-tomatoes"} and mine.dam.task.name is None  # DAM is not judged here
    assert {stage.corpus for stage in (mine.eigen, *judged)} == {"wordnet"} and mine.eigen.seed == 3
    none = FINETUNE.for_run(corpus="kjv", seed=0, task=None)
    assert none.plan is None and not none.reconstruct.on_task.joint_r and none.dam.training.train_on != "task"
    assert [stage.task.name for stage in (none.reconstruct, none.importance, none.dam)] == [None, None, None]


def test_a_report_into_a_new_nested_directory_stages_beside_it(tmp_path, monkeypatch, minilm_l3):
    """`--out a/b/report` where a/b does not exist: the staging directory is made beside `out` (so the last
    move is a rename on the same disk, not a failure after every stage ran), and a failed run leaves nothing."""
    import sys

    report_module = sys.modules["attnlens.report"]  # the package, not the function attnlens exports under its name
    staged = []

    def stop(*args, **kwargs):
        staged.extend(path for path in (tmp_path / "a" / "b").iterdir())
        raise RuntimeError("stopped after staging")

    monkeypatch.setattr(report_module, "analyses", stop)
    with pytest.raises(RuntimeError, match="stopped after staging"):
        report_module.report(
            tmp_path / "a" / "b" / "report", model=minilm_l3, quick=True, task=None, compare=None, progress=False
        )
    assert [path.name.startswith(".report.") for path in staged] == [True]
    assert list((tmp_path / "a" / "b").iterdir()) == []
