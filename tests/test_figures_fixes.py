"""Figures of DAM and importance results: labels inside the figure, and every interval of the
tables drawn (fixed patterns' error bars, the per-head importance intervals)."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer

import attnlens


@pytest.fixture(scope="module")
def dam_run(minilm_l6):
    """A mask at 80% against every fixed pattern, on small settings."""
    return attnlens.dam(minilm_l6, sparsity=[0.8], steps=3, stop_window=2, seq_len=16, train_seqs=2, eval_seqs=4,
                        batch_size=2, bootstrap=50, progress=False)  # fmt: skip


def with_task(result):
    """The result with a made-up task table: one row per mask and per pattern, with intervals
    of different widths, as a task judgement writes it."""
    import pandas as pd

    rng = np.random.default_rng(0)
    masks = result.table.assign(kind="dam")
    patterns = result.patterns.assign(kind="pattern")
    task = pd.concat([masks, patterns], ignore_index=True)
    task["task_sparsity"] = task["sparsity"] * 0.9
    task["accuracy"] = rng.uniform(0.6, 0.8, len(task))
    task["accuracy_low"] = task["accuracy"] - rng.uniform(0.01, 0.08, len(task))
    task["accuracy_high"] = task["accuracy"] + rng.uniform(0.01, 0.08, len(task))
    meta = {**result.meta, "task": {"task": "made-up", "protocol": "probe", "held_out_rows": list(range(64)),
                                    "unmodified_accuracy": 0.75, "majority_accuracy": 0.5}}  # fmt: skip
    return type(result)(meta, {**result.tables, "task": task}, result.arrays)


def test_training_figure_keeps_every_label_inside(dam_run):
    from attnlens.figures.dam import plot_training

    figure = plot_training(dam_run)
    figure.canvas.draw()
    renderer, frame = figure.canvas.get_renderer(), figure.bbox
    for ax in figure.axes:
        for text in (ax.yaxis.label, ax.xaxis.label, ax.title):
            box = text.get_window_extent(renderer)
            inside = (
                frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5 and frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5
            )
            assert inside or not text.get_text(), (text.get_text(), box, frame)
    undecided = figure.axes[2]
    assert undecided.get_ylabel().startswith("undecided")
    assert "0.1 < σ(α/s) < 0.9" in undecided.get_title() + undecided.get_ylabel(), "the definition is still said"
    plt.close(figure)


def _bars(container: ErrorbarContainer) -> dict[float, tuple[float, float]]:
    """x → (bottom, top) of each vertical error bar of a container."""
    (bars,) = container.lines[2]
    return {
        round(float(segment[0][0]), 9): tuple(sorted((float(segment[0][1]), float(segment[1][1]))))
        for segment in bars.get_segments()
    }


@pytest.mark.parametrize("figure", ["loss_vs_sparsity", "accuracy_vs_sparsity"])
def test_every_fixed_pattern_carries_its_intervals(dam_run, figure):
    """One error-bar container per pattern, named after it, whose bars span the table's
    interval at each of its points (loss: the patterns table; accuracy: the task table)."""
    from attnlens.figures import dam as figures

    result = with_task(dam_run)
    if figure == "loss_vs_sparsity":
        table, x, y = result.patterns, "sparsity", "delta"
    else:
        table, x, y = result.tables["task"].query("kind == 'pattern'"), "task_sparsity", "accuracy"
    ax = getattr(figures, f"plot_{figure}")(result)
    containers = {container.get_label(): container for container in ax.containers if isinstance(container, ErrorbarContainer)}
    for name, points in table.groupby("pattern"):
        assert name in containers, (figure, name)
        bars = _bars(containers[name])
        expected = {round(float(at), 9): (low, high) for at, low, high in zip(points[x], points[f"{y}_low"], points[f"{y}_high"])}
        assert bars.keys() == expected.keys(), (figure, name)
        for at, (low, high) in expected.items():
            assert bars[at] == pytest.approx((low, high), rel=1e-9, abs=1e-12), (figure, name, at)
            assert low <= points.loc[np.isclose(points[x], at), y].iloc[0] <= high
    assert "95%" in ax.get_title()
    plt.close(ax.figure)


@pytest.fixture(scope="module")
def importance_run(minilm_l6):
    return attnlens.importance(minilm_l6, classes="self,cls,other", seq_len=16, num_seqs=4, bootstrap=50, progress=False)


_SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")


def test_head_importance_writes_every_heads_interval(importance_run):
    """Each cell of the layer × head map reads its importance and 95% interval, in the unit the
    colour bar names (×10^e), to the two decimals written."""
    from attnlens.figures.importance import plot_head_importance

    table = importance_run.gradient.query("level == 'head' and `class` == 'all'")
    ax = plot_head_importance(importance_run)
    label = ax.collections[0].colorbar.ax.get_ylabel()
    found = re.search(r"×10([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)\)", label)
    scale = 10.0 ** int(found.group(1).translate(_SUPERSCRIPT)) if found else 1.0
    cells = {(round(text.get_position()[1] - 0.5), round(text.get_position()[0] - 0.5)): text.get_text() for text in ax.texts}
    assert len(cells) == len(table) > 1
    for row in table.itertuples():
        written = cells[(row.layer, row.head)]
        value, low, high = (float(number) * scale for number in re.fullmatch(r"(\S+)\n(\S+)–(\S+)", written).groups())
        assert (value, low, high) == pytest.approx((row.importance, row.importance_low, row.importance_high), abs=0.0051 * scale)
        assert low <= value <= high
    assert 1 <= table.importance.max() / scale < 10, "the largest value reads between 1 and 10"
    assert "95% interval" in ax.get_title()
    plt.close(ax.figure)
