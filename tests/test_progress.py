"""Progress bars: the report's one bar moves inside every stage, and every bar leaves one final line.

tqdm draws an update only when 0.1 s have passed since its last draw (a stage redraws its parent
at most every half second); the tests give both a clock that moves a second at every reading, so
every update draws and a line drawn twice shows.
"""

from __future__ import annotations

import io
import itertools
import types

import pytest
from tqdm import std as tqdm_std
from tqdm import tqdm

import attnlens
import attnlens.progress
from attnlens.progress import Stage, progress_bar, split
from attnlens.report import _Stages
from tiny_models import run_cli, save_tiny


@pytest.fixture
def every_update_draws(monkeypatch):
    """The clocks of tqdm and of the stages advance one second per reading: every update may draw."""
    ticks = itertools.count(start=1_000_000)
    clock = lambda: float(next(ticks))
    monkeypatch.setattr(tqdm_std, "time", clock)
    monkeypatch.setattr(attnlens.progress, "time", types.SimpleNamespace(monotonic=clock))


class RecordingBar(tqdm):
    """A parent bar that writes nowhere and keeps every count it was moved to."""

    def __init__(self, total: int) -> None:
        super().__init__(total=total, desc="report", file=io.StringIO())
        self.seen: list[float] = []

    def update(self, n: float = 1) -> bool | None:
        moved = super().update(n)
        self.seen.append(self.n)
        return moved


def final_lines(err: str, marker: str) -> list[str]:
    """The drawn states of a bar (tqdm separates them with carriage returns) that contain ``marker``."""
    return [state.strip() for state in err.replace("\n", "\r").split("\r") if marker in state]


# ---------------------------------------------------------------------------- a stage's bars move its parent


def test_a_stage_bar_moves_the_parent_through_its_stretch_and_no_further():
    parent = RecordingBar(total=100)
    stage = Stage(parent, "report: dam", 20, 60)
    with progress_bar(total=8, desc="dam", unit="step", enabled=stage) as bar:
        for step in range(8):
            bar.update(1)
            assert 20 <= parent.n <= 60
            assert "dam" in parent.desc and "step" in parent.desc and f"{step + 1}/8" in parent.desc
        bar.update(5)  # more than the bar's total: the parent stays inside the stage
    stage.finish()
    assert parent.seen == sorted(parent.seen), "the parent never moves back"
    assert len(set(parent.seen)) >= 8, "it moved at every step, not once at the stage's end"
    assert parent.n == 60 and max(parent.seen) == 60


def test_a_bar_inside_another_bars_step_names_its_count_and_leaves_the_parent_where_it_is():
    # a fine-tune inside one judgement: its steps show on the report's bar, which neither moves nor jumps ahead
    parent = RecordingBar(total=100)
    stage = Stage(parent, "report: importance", 20, 60)
    with progress_bar(total=4, desc="importance: task", unit="condition", enabled=stage) as outer:
        outer.update(1)
        where = parent.n
        with progress_bar(total=200, desc="fine-tune, seed 0", unit="step", enabled=stage.here()) as inner:
            inner.update(120)
            assert parent.n == where and "fine-tune, seed 0 120/200 step" in parent.desc
        outer.update(1)
    assert parent.n > where and parent.seen == sorted(parent.seen)


def test_a_judgements_examples_move_the_bar_through_the_unit_under_way(minilm_l3):
    """A judgement that runs many looks (a small change against a small margin) moves the report's bar at each
    slice of examples it judges, inside the unit its caller counts (a condition), never past it, never back."""
    from attnlens.analysis.changes import Ablation
    from attnlens.analysis.task import TaskJudge, TaskSettings
    from attnlens.data.positions import parse_classes

    parent = RecordingBar(total=100)
    stage = Stage(parent, "report: importance", 20, 60)
    settings = TaskSettings(name="rotten-tomatoes", task_train=48, task_eval="auto", task_pool=480, margin=0.1)
    judge = TaskJudge(minilm_l3, settings, seq_len=32, batch_size=32)
    with progress_bar(total=2, desc="importance: task", unit="condition", enabled=stage) as bar:
        bar.update(1)
        where = parent.n
        with judge.moving(bar):
            judged = judge.judge(Ablation("sep", parse_classes("self,sep,other"), "random"))
        assert judged["held_out"] > 192, "more than one look"
        moved = [count for count in parent.seen if count > where]
        assert len(moved) >= 2 and max(moved) <= 60, "each slice moved it, within the unit under way (from 40 to 60)"
        assert "examples" in parent.desc
        bar.update(1)
    assert parent.seen == sorted(parent.seen) and parent.n == 60


def test_bars_one_after_another_share_the_stage_by_their_weights():
    parent = RecordingBar(total=100)
    first, second = split(Stage(parent, "report: eigen", 0, 40), 3, 1)
    with progress_bar(total=6, desc="moments", unit="seq", enabled=first) as bar:
        bar.update(6)
    assert parent.n == 30 and "moments" in parent.desc, "the first bar fills its three quarters of the stage"
    with progress_bar(total=4, desc="eigen", unit="unit", enabled=second) as bar:
        bar.update(2)
        assert parent.n == 35
        bar.update(2)
    assert parent.n == 40


def test_split_of_a_plain_setting_gives_it_to_every_part():
    assert split(False, 1, 2, 3) == [False, False, False]
    assert split(True, 1) == [True]


def test_entry_points_move_a_stage_while_they_work(tmp_path, minilm_l6):
    """eigen (two bars: moments, then spectra), reconstruct (moments, then configs), importance (passes)
    and dam (training steps) forward to the stage they are given."""
    model = attnlens.load_model(str(save_tiny(tmp_path / "tiny", minilm_l6, "mlm")))
    for stretch, run in (
        ((10, 50), lambda stage: attnlens.eigen(model, seq_len=16, num_seqs=8, batch_size=2, progress=stage)),
        (
            (0, 100),
            lambda stage: attnlens.reconstruct(
                model, seq_len=16, num_seqs=8, batch_size=2, ks=[1, 2, 4], scopes=["head"], strategies=["greedy"], progress=stage
            ),
        ),
        (
            (5, 95),
            lambda stage: attnlens.importance(
                model, seq_len=16, num_seqs=4, batch_size=1, bootstrap=10, gradient=False, progress=stage
            ),
        ),
        (
            (50, 90),
            lambda stage: attnlens.dam(
                model,
                seq_len=16,
                steps=6,
                stop_window=2,
                lambdas=[0.1],
                train_seqs=2,
                eval_seqs=2,
                batch_size=1,
                patterns=False,
                bootstrap=10,
                progress=stage,
            ),
        ),
    ):
        parent = RecordingBar(total=100)
        parent.update(stretch[0])
        run(Stage(parent, "report: work", *stretch))
        inside = [n for n in parent.seen[1:] if n < stretch[1]]
        assert len(set(inside)) >= 3, f"the parent sat still during the work: {parent.seen}"
        assert parent.seen == sorted(parent.seen) and max(parent.seen) <= stretch[1]
        assert parent.n == stretch[1], "its bars, together, fill the stage (none of them is left out)"


# ---------------------------------------------------------------------------- the report's bar


def test_report_bar_advances_inside_stages_and_ends_with_one_line_at_100(capsys, every_update_draws):
    weights = {"eigen": 1, "reconstruct": 3, "dam": 6}
    stages = _Stages(weights, enabled=True)
    during: dict[str, list[float]] = {}

    def work(name: str, steps: int):
        def run(progress):
            with progress_bar(total=steps, desc=name, unit="step", enabled=progress) as bar:
                for _ in range(steps):
                    bar.update(1)
                    during.setdefault(name, []).append(stages.bar.n)

        return run

    for name, steps in (("eigen", 2), ("reconstruct", 5), ("dam", 12)):
        stages.run(name, work(name, steps))
    stages.close()
    seen = [n for name in weights for n in during[name]]
    assert seen == sorted(seen) and max(seen) <= 100
    assert len(set(during["dam"])) > 1, "the bar moved inside the dam stage"
    assert stages.bar.n == stages.bar.total == 100
    lines = final_lines(capsys.readouterr().err, "100%")
    assert len(lines) == 1 and lines[0].startswith("report:"), lines


def test_a_failed_report_leaves_its_bar_where_it_stopped(capsys):
    stages = _Stages({"eigen": 1, "dam": 1}, enabled=True)
    stages.run("eigen", lambda progress: None)
    stages.close(complete=False)
    assert 0 < stages.bar.n < 100
    assert not final_lines(capsys.readouterr().err, "100%")


def test_report_without_progress_passes_no_stage():
    stages = _Stages({"eigen": 1}, enabled=False)
    assert stages.run("eigen", lambda progress: progress) is False


# ---------------------------------------------------------------------------- one final line


def test_a_bar_draws_its_last_state_once(capsys, every_update_draws):
    with progress_bar(total=3, desc="demo", unit="seq") as bar:
        for _ in range(3):
            bar.update(1)
    assert len(final_lines(capsys.readouterr().err, "3/3")) == 1


def test_extract_prints_one_final_line(tmp_path, capsys, minilm_l6, every_update_draws):
    model = save_tiny(tmp_path / "tiny", minilm_l6, "mlm")
    out = tmp_path / "store"
    code, _, err = run_cli(
        capsys, "extract", "--model", str(model), "--out", str(out), "--seq-len", "16", "--num-seqs", "6", "--batch-size", "2"
    )
    assert code == 0
    assert len(final_lines(err, "extract")) >= 3, "the bar drew as it went"
    assert len(final_lines(err, "6/6")) == 1, err
