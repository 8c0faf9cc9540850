"""The figures stage's seconds, from what the report will draw for this model: its figures and their panels.

The stage is timed once, on minilm-l6 (``stage_weights.json``, written by ``bench/bench_report.py``): about 11 s
on 2 cores for the 33 figures and 86 panels (an axes of a plot or a heat map each; a picture of tiles is one) of
its quick report. Half of that time is priced per figure (about 0.17 s: opening, laying out and saving one) and
half per panel (about 0.06 s), and another model's figures at those prices times the figures and the panels its
own report draws (:func:`figure_panels`, which counts them as :mod:`attnlens.figures` draws them). Every figure
bounds its panels whatever the model (the curves of at most 20 pairs of layers, one picture for more than 72
masks), so a 30-layer model's figures are forecast at about minilm's, as they take. The forecast this replaces
scaled minilm's seconds with the layers (33 s for 30 layers), while the figures, one panel per pair of layers,
took 898 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlens.data.positions import parse_classes

if TYPE_CHECKING:
    from attnlens.forecast import StageSettings

# minilm-l6's layers and heads and its companion minilm-l3's layers: the report the figures' seconds are measured on.
REFERENCE = (6, 12, 3)
# The share of those seconds that goes with the figures (opening, laying out and saving each, whatever it holds); the
# rest goes with their panels. Half and half fits what bench/bench_figures.py measures: the figures of 30 × 16 and
# 64 × 8 models, a layer × head mask each, took 0.62 to 0.82 of minilm-l6's shape's in two runs (forecast: 0.63),
# where pricing by panels alone (72 small masks priced as 72 plots) forecast 0.28.
PER_FIGURE = 0.5


def figure_panels(
    settings: StageSettings, layers: int, heads: int, second_layers: int | None = None
) -> dict[str, tuple[int, int]]:
    """The figures and the panels of the figures (an axes each, a colour bar aside; a picture of tiles is one) the
    report with ``settings`` draws for a model of ``layers`` × ``heads`` (and a second model of ``second_layers``
    layers, compared with it), by result, as each result's figures module draws them.

    >>> from attnlens.report.presets import QUICK
    >>> figure_panels(QUICK, 30, 16)["overlap"], figure_panels(QUICK, 80, 64)["overlap"]  # 2 heat maps, split-half, curves
    ((4, 18), (4, 18))
    """
    from attnlens.analysis.dam.layouts import LAYOUTS
    from attnlens.figures.dam import mask_panels
    from attnlens.figures.overlap import curve_panels

    models = 1 if second_layers is None else 2
    curves = [curve_panels(count) for count in (layers, second_layers) if count is not None and count > 1]
    if second_layers is not None:
        curves.append(curve_panels(layers, second_layers))
    recon, importance, dam = settings.reconstruct, settings.importance, settings.dam
    classes = len(parse_classes(importance.classes))
    judged = [recon.task.name is not None, importance.task.name is not None, dam.task.name is not None]
    per = {"layer": 1, "head": classes}.get(importance.per, 0)  # the ablations of a class in each layer, or in each head
    masks = mask_panels(layers, heads, LAYOUTS[dam.mask.variant].shared_by_layers)
    counted = {
        "eigen": (2 * models, 2 * models),  # spectra and energy of each model
        # layer and head heat maps (within and between the models), each model's split-half check, the curves
        "overlap": ((2 if models == 1 else 6) + models + len(curves), (2 if models == 1 else 6) + models + sum(curves)),
        "reconstruct": (3 + recon.plug_in.enabled + judged[0],) * 2,  # error and TV against k, against FLOPs; plug-in; task
        # ablation, mass (a map per class and entropy), task, gradient and head importance, per layer or head
        "importance": (
            2 + judged[1] + 2 * importance.gradient + (per > 0),
            1 + (classes + 1) + judged[1] + 2 * importance.gradient + per,
        ),
        "dam": (4 + judged[2], 5 + judged[2] + masks),  # loss against sparsity, keep per class, training (3 panels), task, masks
    }
    if settings.plan is not None:
        counted["plan"] = (1 + len(settings.plan.budgets),) * 2  # FLOPs by budget, and each budget's map of choices
    if settings.sinks is not None:  # first-token weight per head (one map), sink heads by layer, heavy hitters; far heads
        counted["sinks"] = (3 + settings.sinks.far,) * 2
    return counted


def figures_seconds(measured: float, settings: StageSettings, layers: int, heads: int, second_layers: int | None = None) -> float:
    """The figures stage's forecast: ``measured``, its seconds on minilm-l6 with ``settings``' preset, :data:`PER_FIGURE`
    of it scaled by the figures this model's report draws over those minilm-l6's drew, the rest by the panels
    (:func:`figure_panels`).

    >>> from attnlens.report.presets import QUICK
    >>> encoder, decoder = QUICK.sized_for(causal=False), QUICK.sized_for(causal=True)
    >>> figures_seconds(11.0, encoder, *REFERENCE), round(figures_seconds(11.0, encoder, 30, 16) / 11.0, 2)
    (11.0, 0.72)
    >>> round(figures_seconds(11.0, decoder, 30, 16) / 11.0, 2)    # and the sinks' 3 figures
    0.79
    """
    drawn, reference = (figure_panels(settings, *shape) for shape in ((layers, heads, second_layers), REFERENCE))
    reference.pop("sinks", None)  # minilm-l6 is an encoder: its report draws no sinks
    figures, panels = (sum(counts[at] for counts in drawn.values()) for at in (0, 1))
    figures_then, panels_then = (sum(counts[at] for counts in reference.values()) for at in (0, 1))
    return measured * (PER_FIGURE * figures / figures_then + (1 - PER_FIGURE) * panels / panels_then)
