"""The main job on every model attnlens captures: ``attnlens report --quick --model DIR`` writes its page.

Each architecture of tests/zoo.py that is captured exactly runs the report through the command
line, at the smallest sizes that exercise every stage (:func:`zoo.tiny_report`: blocks of 16 tokens, longer
than the zoo's windows of 4 keys, so windowed layers are windowed; a few blocks and examples; every
stage's machinery runs: spectra, overlaps, maps fitted per query where the rows need them, plug-in
and a task-judged k, position importance with its random controls, DAM beside its patterns, a plan
under an accuracy budget). Its results are reloaded and read: every layer has a spectrum, every
stage a result, every claim a row, and the spectrum's directory is named from the model's.

Every report builds every figure from its tables (the plotting functions run on each model's results).
Rendering them to pixels depends on the figure, not on the model, and takes two thirds of a tiny
report's time: all 38 would take the suite past its 10 minutes. So :data:`zoo.DRAWN`, one architecture of
each geometry (bidirectional, causal with grouped queries, a windowed encoder, a windowed decoder with
soft-capping), renders every figure; the others save each built figure as a blank PNG of one pixel.

The encoders run here, the decoders in tests/test_zoo_report_decoders.py: two files, so that the
suite's two workers (each takes whole files) can share them.
"""

from __future__ import annotations

import sys

import pytest

from tiny_models import assert_one_line_error, run_cli
from zoo import CAPTURED, ENCODERS, build, check_report


@pytest.mark.parametrize("architecture", ENCODERS)
def test_the_report_runs_on_every_captured_encoder(architecture, tmp_path, minilm_l6, monkeypatch, capsys):
    check_report(architecture, tmp_path, minilm_l6, monkeypatch, capsys)


def test_a_model_too_short_for_the_reports_blocks_is_refused_before_any_stage(tmp_path, minilm_l6, monkeypatch, capsys):
    """The zoo's models have 64 positions; the default report's blocks are 128 tokens: refused in one line,
    naming the preset whose blocks fit, before the first stage (which would have run minutes)."""
    path, _ = build(tmp_path, minilm_l6, CAPTURED["bert"])
    stages_ran = []
    monkeypatch.setattr(sys.modules["attnlens.report"], "analyses", lambda *args, **kwargs: stages_ran.append(1))
    code, _, err = run_cli(capsys, "report", "--model", str(path), "--out", str(tmp_path / "report"), "--no-progress")
    assert_one_line_error(code, err, "supports 64 positions", "attnlens report --quick")
    assert not stages_ran and not (tmp_path / "report").exists()


@pytest.mark.parametrize("architecture", ["bert", "modernbert (local 4, global every 2)", "mistral (sliding 4)"])
def test_the_reports_stages_are_sized_for_the_models_geometry_before_any_stage(architecture, tmp_path, minilm_l6, monkeypatch):
    """Sized before the first stage: ModernBERT's local windows (4 keys at n = 16) make its rows differ by query, as
    a causal model's do, so the reconstruction's blocks are sized for n + 1 per-query maps; Mistral's every layer
    sees at most 4 keys, so the plan offers choices narrower than that (the preset's k = 4 and window 2: k = 2 and
    window 1), which save something there, where it would otherwise find nothing to plan after every other stage."""
    from attnlens.report import report
    from attnlens.report.presets import PRESETS
    from zoo import W, tiny_report

    path, _ = build(tmp_path, minilm_l6, CAPTURED[architecture])
    tiny = tiny_report().stages(reconstruct={"num_seqs": 8}, plan={"ks": (4,), "widths": (2,)})
    monkeypatch.setitem(PRESETS, ("probe", "quick"), tiny)
    seen = []

    def stop(model, second, settings, **kwargs):
        seen.append(settings)
        raise KeyboardInterrupt  # nothing past the sizing is wanted here

    monkeypatch.setattr(sys.modules["attnlens.report"], "analyses", stop)
    with pytest.raises(KeyboardInterrupt):
        report(tmp_path / "report", model=str(path), quick=True, compare=None, progress=False)
    (settings,) = seen
    recon, plan = settings.reconstruct, settings.plan
    fitted = recon.num_seqs - max(1, round(recon.eval_fraction * recon.num_seqs))  # held_out_split's count
    if architecture == "bert":
        assert recon.num_seqs == 8 and (plan.ks, plan.widths) == ((4,), (2,))
    elif architecture.startswith("modernbert"):
        assert fitted == recon.seq_len + 1 and (plan.ks, plan.widths) == ((4,), (2,))  # its global layers see every key
    else:
        assert plan.ks and plan.widths and max(plan.ks) < W and max(plan.widths) < W - 1
