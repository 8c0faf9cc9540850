"""Figures whose size and cost do not grow with the model: drawn for a tiny random model of 30 layers × 16 heads
(and, where a figure reads only a table or an array, for 80 layers × 64 heads made up), every figure keeps its
panels, legend entries, written cells and pixels bounded, and every PNG is at most 1 MB. What makes drawing
cheap is asserted (axes, cells, texts, pixels), never seconds: speed is measured in bench/, not timed in tests.
The figures' forecast counts the panels that are drawn."""

from __future__ import annotations

import json
import os
import types

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from matplotlib.collections import QuadMesh
from matplotlib.image import AxesImage
from PIL import Image

import attnlens
from attnlens.analysis.dam import DamResult
from attnlens.analysis.overlap import OverlapResult
from attnlens.figures.dam import plot_masks
from attnlens.figures.style import LEGEND_LAYERS, MOST_TICKS
from attnlens.io.result_figures import MOST_PNG_BYTES, draw, save_figure, save_png
from tiny_models import save_with_minilm_tokenizer

LAYERS, HEADS = 30, 16
CHOSEN = 5  # pairs of layers a row of the curves figure (attnlens.figures.overlap.CHOSEN)
MOST_AXES = 24  # a figure's axes, colour bars included (the curves of 435 pairs once had 435)
MOST_PIXELS = 2400 * 2400  # a PNG's (the curves of 435 pairs once were 1,725 × 24,930)
MOST_CELLS = 1000 * 1000  # values a figure's heat maps and pictures draw (5,120 heads × 5,120 heads are 26 million)
MOST_MAP_CELLS = 256 * 256  # of an overlap heat map (500 heads × 500 heads are 250,000)


@pytest.fixture(scope="module")
def deep(minilm_l6, tmp_path_factory) -> attnlens.LoadedModel:
    """A random BERT of 30 layers × 16 heads (hidden size 64), minilm's tokenizer; named "deep" (loaded from its
    directory's name, not its path, so that the titles that name the model are as long as a real model's)."""
    config = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("models")
    save_with_minilm_tokenizer(directory / "deep", transformers.BertModel(config), minilm_l6)
    here = os.getcwd()
    os.chdir(directory)
    try:
        return attnlens.load_model("deep")
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def results(deep) -> dict:
    """The cheap analyses of the deep model at tiny sizes (seconds each): eigen and overlap, importance with
    its layer × head maps (the ablations of one head at a time take longer: :func:`widened` makes up a table
    of them), the reconstruction with its plug-in in every layer, and DAM's masks, one per layer and head."""
    spectra = attnlens.eigen(deep, seq_len=16, num_seqs=16, progress=False)
    masks = attnlens.dam(deep, lambdas=[0.0], variant="unstructured", steps=2, stop_window=2, seq_len=16, train_seqs=2,
                         eval_seqs=2, batch_size=2, bootstrap=20, patterns=False, progress=False)  # fmt: skip
    return {
        "eigen": spectra,
        "overlap": attnlens.overlap(spectra, max_dim=6, progress=False),
        "importance": attnlens.importance(deep, classes="self,other", seq_len=16, num_seqs=2, bootstrap=20, progress=False),
        "reconstruct": attnlens.reconstruct(
            deep, seq_len=16, num_seqs=24, ks=[4], scopes=["head"], strategies=["greedy"], plug_in=True, progress=False
        ),  # fmt: skip
        "dam": masks,
    }


def widened(result, layers: int, heads: int):
    """The importance ``result`` made over for a model of ``layers`` × ``heads``, with the ablation of each
    class in each head (``per`` head): every layer × head table made up of random values."""
    rng = np.random.default_rng(0)
    units = pd.DataFrame([(layer, head) for layer in range(layers) for head in range(heads)], columns=["layer", "head"])
    classes = list(result.mass["class"].drop_duplicates())
    share = result.mass.groupby("class")["share"].mean()
    mass = pd.concat([units.assign(**{"class": name, "share": share[name]}) for name in classes], ignore_index=True)
    mass["mass"] = rng.random(len(mass))
    entropy = units.assign(entropy=rng.random(len(units)), uniform_entropy=2.77)
    importance = rng.random(len(units))
    per_head = units.assign(level="head", **{"class": "all"}, importance=importance, importance_low=0.9 * importance,
                            importance_high=1.1 * importance)  # fmt: skip
    gradient = pd.concat([result.gradient.query("level == 'model'"), per_head], ignore_index=True)
    removed = pd.concat([units.assign(scope="head", control="class", **{"class": name}) for name in classes], ignore_index=True)
    ablation = pd.concat([result.ablation, removed.assign(delta=rng.random(len(removed)))], ignore_index=True)
    meta = {**result.meta, "settings": {**result.meta["settings"], "per": "head"}}
    tables = {**result.tables, "mass": mass, "entropy": entropy, "gradient": gradient, "ablation": ablation}
    return type(result)(meta, tables, result.arrays)


def made_up_masks(layers: int, heads: int, n: int = 32) -> DamResult:
    """A DAM result of one mask of each of ``layers`` × ``heads`` (what the masks figure reads): each head keeps
    a band of its own width, as learned masks keep nearly all or nothing of a position."""
    widths = np.random.default_rng(0).integers(0, n // 4, size=(1, layers, heads, 1, 1))
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    keep = (distance <= widths).astype(np.float32)
    meta = {"model": {"name": "made-up"}, "layout": {"shared_by_layers": False},
            "settings": {"variant": "unstructured", "objective": "hidden", "n": n, "eval_seqs": 2}}  # fmt: skip
    return DamResult(meta, {"summary": pd.DataFrame({"lambda": [0.1], "sparsity": [0.85]})}, {"keep_images": keep})


def cells(figure) -> int:
    """The values the figure's heat maps and images draw (each a path or a pixel to render), colour bars aside."""
    count = 0
    for ax in (ax for ax in figure.axes if ax.get_label() != "<colorbar>"):
        count += sum(image.get_array().size for image in ax.images if isinstance(image, AxesImage))
        count += sum(mesh.get_array().size for mesh in ax.collections if isinstance(mesh, QuadMesh))
    return count


def titles_outside(figure) -> list[str]:
    """The titles (the figure's and each axes') that run past the figure's left or right edge (a title naming
    every layer once did)."""
    figure.draw_without_rendering()
    frame = figure.bbox
    titles = [figure._suptitle, *(ax.title for ax in figure.axes)]
    return [
        title.get_text()
        for title in titles
        if title is not None
        and title.get_text()
        and not (frame.x0 - 1 <= title.get_window_extent().x0 and title.get_window_extent().x1 <= frame.x1 + 1)
    ]


def legend_entries(figure) -> int:
    legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend() is not None)]
    return max((len(legend.get_texts()) for legend in legends), default=0)


def test_every_figure_of_a_deep_model_is_bounded(results, tmp_path):
    """Every figure of every result of the deep model, and of importance per head and DAM's masks of 80 layers
    × 64 heads: at most MOST_AXES axes, a legend no longer than a dozen layers, at most MOST_CELLS values
    drawn, titles within the figure, and a PNG of at most MOST_PIXELS pixels and MOST_PNG_BYTES bytes, written
    at the figures' own resolution (150 dpi: none had to be shrunk to fit)."""
    drawn = {**results, "importance 80 × 64": widened(results["importance"], 80, 64), "dam 80 × 64": made_up_masks(80, 64)}
    found = {}
    for key, result in drawn.items():
        for name, figure in draw(result) if key != "dam 80 × 64" else [("masks", plot_masks(result))]:
            inches = figure.get_size_inches()
            facts = {"axes": len(figure.axes), "legend": legend_entries(figure), "cells": cells(figure)}
            facts["titles outside"] = titles_outside(figure)
            (path,) = save_figure(figure, tmp_path / f"{key}_{name}", ("png",))
            with Image.open(path) as image:
                facts |= {"pixels": image.size[0] * image.size[1], "bytes": path.stat().st_size}
                facts["dpi"] = round(image.size[0] / inches[0])
            found[f"{key}/{name}"] = facts
    expected = {"overlap/curves_layers_0", "importance 80 × 64/ablation_per_head", "eigen/spectra", "dam/masks"}
    assert expected | {"reconstruct/fidelity_vs_k"} <= set(found)
    too_large = {
        name: facts
        for name, facts in found.items()
        if facts["axes"] > MOST_AXES
        or facts["legend"] > LEGEND_LAYERS + 4
        or facts["cells"] > MOST_CELLS
        or facts["pixels"] > MOST_PIXELS
        or facts["bytes"] > MOST_PNG_BYTES
        or facts["dpi"] != 150
        or facts["titles outside"]
    }
    assert too_large == {}, json.dumps(too_large, indent=1)


def test_the_curves_show_adjacent_closest_and_farthest_pairs(results):
    """Of 435 pairs, 15 panels: five adjacent pairs from the first to the last layers, then the five closest
    and the five farthest of the rest by the pairs table's overlap at their d, each row named."""
    from attnlens.figures.overlap import plot_overlap_curves

    overlap_result = results["overlap"]
    figure = plot_overlap_curves(overlap_result)
    shown = [ax for ax in figure.axes if ax.get_visible()]
    assert len(shown) == 3 * CHOSEN
    titled = [tuple(int(layer) for layer in ax.get_title().split(",")[0].replace("L", "").split(" × ")) for ax in shown]
    adjacent, closest, farthest = titled[:CHOSEN], titled[CHOSEN : 2 * CHOSEN], titled[2 * CHOSEN :]
    assert all(b == a + 1 for a, b in adjacent) and adjacent[0] == (0, 1) and adjacent[-1] == (LAYERS - 2, LAYERS - 1)
    pairs = overlap_result.pairs.query("comparison == 'layers_0' and d > 0").set_index(["layer_a", "layer_b"])["overlap"]
    rest = pairs.drop([pair for pair in adjacent if pair in pairs.index]).sort_values(ascending=False, kind="stable")
    assert closest == list(rest.index[:CHOSEN])
    assert farthest == list(rest.index[::-1][:CHOSEN])
    assert [shown[at].get_ylabel() for at in (0, CHOSEN, 2 * CHOSEN)] == ["adjacent", "closest", "farthest"]
    assert "15 of 435 pairs" in figure.texts[-1].get_text() + str(figure.get_suptitle())
    plt.close(figure)


def test_a_small_model_keeps_every_pair(deep):
    """Six layers (minilm-l6's depth) keep a panel for each of their 15 pairs, as before."""
    from attnlens.figures.overlap import plot_overlap_curves

    spectra = attnlens.eigen(deep, seq_len=16, num_seqs=16, layers=list(range(6)), progress=False)
    figure = plot_overlap_curves(attnlens.overlap(spectra, max_dim=4))
    titles = [ax.get_title().split(",")[0] for ax in figure.axes if ax.get_visible()]
    assert titles == [f"L{a} × L{b}" for a in range(6) for b in range(a + 1, 6)]
    plt.close(figure)


def made_up_overlap(layers: int, heads: int) -> OverlapResult:
    """An overlap result of one model of ``layers`` × ``heads`` with random heat maps (what plot_overlap reads)."""
    rng = np.random.default_rng(0)
    comparisons = [{"name": "layers_0", "level": "layer", "result_a": 0, "result_b": 0},
                   {"name": "heads_0", "level": "head", "result_a": 0, "result_b": 0}]  # fmt: skip
    meta = {"models": ["made-up"], "layers": [list(range(layers))], "num_heads": [heads], "n": 128, "dim": 8,
            "chance": 8 / 128, "comparisons": comparisons}  # fmt: skip
    units = layers * heads
    arrays = {"layers_0_overlap": rng.random((layers, layers)), "heads_0_overlap": rng.random((units, units))}
    return OverlapResult(meta, {}, arrays)


@pytest.mark.parametrize(("layers", "heads"), [(80, 1), (32, 16), (80, 64)])
def test_overlap_heat_maps_stay_bounded(layers, heads, tmp_path):
    """80 layers, and 512 and 5,120 heads a side: at most MOST_MAP_CELLS values, a dozen ticks a side, a bounded
    figure and a PNG under 1 MB; blocks averaged above 256 a side, and the title says so."""
    from attnlens.figures.overlap import plot_overlap

    name = "layers_0" if heads == 1 else "heads_0"
    ax = plot_overlap(made_up_overlap(layers, heads), name)
    figure = ax.figure
    assert cells(figure) <= MOST_MAP_CELLS
    assert len(ax.get_xticks()) <= MOST_TICKS and len(ax.get_yticks()) <= MOST_TICKS
    assert ("each cell the mean of" in ax.get_title()) == (layers * heads > 256)
    (path,) = save_figure(figure, tmp_path / name, ("png",))
    with Image.open(path) as image:
        assert image.size[0] * image.size[1] <= 1200 * 1000
    assert path.stat().st_size <= MOST_PNG_BYTES


def test_overlap_heat_maps_average_whole_blocks():
    """A pooled cell is the mean of its block of units."""
    from attnlens.figures.overlap import pooled

    matrix = np.arange(600.0 * 600).reshape(600, 600)
    values, block = pooled(matrix)
    assert block == 3 and values.shape == (200, 200)
    assert values[1, 2] == matrix[3:6, 6:9].mean()


@pytest.mark.parametrize(("layers", "heads"), [(6, 12), (LAYERS, HEADS), (80, 64)])
def test_the_masks_of_many_heads_are_one_picture(layers, heads, tmp_path):
    """minilm-l6's 72 layer × head masks keep a panel each; 480 (30 × 16) and 5,120 (80 × 64) are tiles of one
    picture of at most 1,000 pixels a side, not an axes each."""
    figure = plot_masks(made_up_masks(layers, heads))
    shown = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    assert len(shown) == (72 if layers * heads <= 72 else 1)
    assert max(image.get_array().shape[0] for ax in shown for image in ax.images) <= 1000
    (path,) = save_figure(figure, tmp_path / "masks", ("png",))
    assert path.stat().st_size <= MOST_PNG_BYTES


def test_maps_of_80_layers_and_64_heads_thin_their_ticks_and_texts():
    """The layer × head maps (importance's, the plan's choices) tick at most 16 rows and columns, and the plan's
    map writes no choice in 5,120 cells."""
    from attnlens.figures.plan import choice_map
    from attnlens.figures.style import heatmap

    figure, ax = plt.subplots()
    heatmap(ax, pd.DataFrame(np.random.default_rng(0).random((80, 64))), "viridis", "mass")
    assert len(ax.get_xticks()) <= MOST_TICKS and len(ax.get_yticks()) <= MOST_TICKS
    plt.close(figure)
    choices = pd.DataFrame(
        [(1.0, layer, head, "window(8)" if (layer + head) % 3 else "exact") for layer in range(80) for head in range(64)],
        columns=["budget", "layer", "head", "choice"],
    )
    plan = types.SimpleNamespace(
        tables={"choices": choices, "summary": pd.DataFrame({"budget_kind": ["accuracy"]})},
        settings={"head_flops": {"exact": 1.0, "window(8)": 0.1}},
        model_name="made-up",
    )
    ax = choice_map(plan, 1.0)
    assert len(ax.texts) == 0
    assert len(ax.get_xticks()) <= MOST_TICKS and len(ax.get_yticks()) <= MOST_TICKS
    plt.close(ax.figure)


def test_a_png_over_the_limit_is_written_again_smaller(tmp_path):
    """The last guard: noise, which compresses badly, saved at a lower resolution until it fits."""
    figure, ax = plt.subplots(figsize=(12, 12))
    ax.imshow(np.random.default_rng(0).random((1500, 1500)), interpolation="nearest")
    path = tmp_path / "noise.png"
    dpi = save_png(figure, path)
    assert dpi < 150 and path.stat().st_size <= MOST_PNG_BYTES
    plt.close(figure)


def test_the_figures_forecast_counts_the_panels_drawn(results):
    """The forecast's figures and panels are those the figures draw, and a deep, wide model's figures are forecast
    at about minilm-l6's (they are bounded), not at its layers' pairs."""
    from attnlens.figures.dam import PANELLED, mask_panels
    from attnlens.figures.overlap import ALL_PAIRS, curve_panels
    from attnlens.forecast.figures import REFERENCE, figure_panels, figures_seconds
    from attnlens.report.presets import DEFAULT, QUICK

    counted = figure_panels(QUICK, LAYERS, HEADS)
    drawn = {}
    for key in ("eigen", "overlap"):
        figures = list(draw(results[key]))
        panels = sum(1 for _, figure in figures for ax in figure.axes if ax.get_visible() and ax.get_label() != "<colorbar>")
        drawn[key] = (len(figures), panels)
        for _, figure in figures:
            plt.close(figure)
    assert drawn == {"eigen": counted["eigen"], "overlap": counted["overlap"]} == {"eigen": (2, 2), "overlap": (4, 18)}
    assert curve_panels(LAYERS) == 15 < curve_panels(*REFERENCE[::2]) == 18 <= ALL_PAIRS
    assert mask_panels(*REFERENCE[:2], shared=False) == 72 == PANELLED and mask_panels(LAYERS, HEADS, shared=False) == 1
    assert mask_panels(80, 64, shared=True) == 64  # a layout shared by layers: a panel per head, up to 72
    for preset in (QUICK.sized_for(causal=False), DEFAULT.sized_for(causal=False)):  # minilm-l6's: an encoder's
        measured = 12.0
        assert figures_seconds(measured, preset, *REFERENCE) == pytest.approx(measured)
        assert 0.5 * measured < figures_seconds(measured, preset, LAYERS, HEADS) < 1.5 * measured
        assert figures_seconds(measured, preset, 80, 64) < 1.5 * measured
