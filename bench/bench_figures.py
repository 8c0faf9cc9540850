"""The figures of deep, wide models: seconds to draw and save as PNG every figure of eigen, overlap and DAM's
masks (one per layer and head) for tiny random BERTs of minilm-l6's shape and of deeper, wider ones, as a ratio
to minilm-l6's shape in the same run, beside the ratio the report's forecast gives them (attnlens.forecast.figures:
its panels over minilm-l6's), the most axes of a figure and the largest PNG.

Run:  python bench/bench_figures.py [--shapes 6x12,30x16,64x8] [--rounds 3]

The models are random (4 dimensions a head, blocks of 16 tokens): what a figure draws depends on the model's layers and
heads, not on its weights. The analyses run once; the figures are drawn in alternating rounds (bench/_timing.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from _timing import rounds  # noqa: E402


def results_of(layers: int, heads: int, directory: Path, minilm) -> list:
    """eigen, overlap and DAM (layer × head masks) of a random BERT of ``layers`` × ``heads``, at tiny sizes."""
    import torch
    import transformers

    import attnlens
    from tiny_models import save_with_minilm_tokenizer

    config = transformers.BertConfig(vocab_size=30522, hidden_size=4 * heads, num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = attnlens.load_model(str(save_with_minilm_tokenizer(directory, transformers.BertModel(config), minilm)))
    spectra = attnlens.eigen(model, seq_len=16, num_seqs=16, progress=False)
    masks = attnlens.dam(model, lambdas=[0.0], variant="unstructured", steps=2, stop_window=2, seq_len=16, train_seqs=2,
                         eval_seqs=2, batch_size=2, bootstrap=20, patterns=False, progress=False)  # fmt: skip
    return [spectra, attnlens.overlap(spectra, max_dim=6, progress=False), masks]


def draw_all(results: list, directory: Path) -> tuple[int, int]:
    """Every figure of ``results`` saved as PNG: the most axes of one, and the largest PNG's bytes."""
    from attnlens.io.result_figures import draw, save_figure

    most_axes, most_bytes = 0, 0
    for number, result in enumerate(results):
        for name, figure in draw(result):
            most_axes = max(most_axes, len(figure.axes))
            (path,) = save_figure(figure, directory / f"{number}_{name}", ("png",))
            most_bytes = max(most_bytes, path.stat().st_size)
    return most_axes, most_bytes


def forecast_share(shape: tuple[int, int], base: tuple[int, int]) -> float:
    """What the report's forecast of the figures (attnlens.forecast.figures) says of the figures drawn here (eigen,
    overlap, DAM's layer × head masks without a task) for ``shape``, as a share of its seconds for ``base``."""
    from attnlens.forecast.figures import PER_FIGURE, figure_panels
    from attnlens.report.presets import QUICK

    drawn = QUICK.stages(dam=dict(variant="unstructured", task=None))
    counts = [figure_panels(drawn, *model) for model in (shape, base)]
    figures, panels = ([sum(count[key][at] for key in ("eigen", "overlap", "dam")) for count in counts] for at in (0, 1))
    return PER_FIGURE * figures[0] / figures[1] + (1 - PER_FIGURE) * panels[0] / panels[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="6x12,30x16,64x8", help="layers x heads of each model; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import attnlens

    shapes = [tuple(int(part) for part in shape.split("x")) for shape in args.shapes.split(",")]
    minilm = attnlens.load_model("minilm-l6")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        results = {shape: results_of(*shape, root / f"model_{shape[0]}x{shape[1]}", minilm) for shape in shapes}
        sizes = {shape: draw_all(results[shape], root / "sizes") for shape in shapes}
        seconds = rounds({shape: lambda shape=shape: draw_all(results[shape], root / "timed") for shape in shapes}, args.rounds)
    base = shapes[0]
    forecast = {shape: forecast_share(shape, base) for shape in shapes}
    print(f"{'layers x heads':>15} {'draw s':>8} {'ratio':>7} {'forecast ratio':>15} {'most axes':>10} {'largest PNG':>12}")
    for shape in shapes:
        axes, largest = sizes[shape]
        print(
            f"{shape[0]:>8} x {shape[1]:<4} {seconds[shape]:8.2f} {seconds[shape] / seconds[base]:7.2f} "
            f"{forecast[shape]:15.2f} {axes:10d} {largest / 1e6:10.2f} MB"
        )
    print(f"(median of {args.rounds} alternating rounds; eigen's spectra and energy, overlap's heat maps, split-half check")
    print(" and curves, DAM's four figures with its layer x head masks; the forecast ratio: what the report's forecast")
    print(" of the figures, from their figures and panels, says of these, over the baseline's)")


if __name__ == "__main__":
    main()
