"""Figures: one plotting function per figure, each taking a result and an optional Axes.

No computation happens here: every number plotted is read from a result, so figures
can be regenerated from saved results without the model (``attnlens figures``).
:func:`save_figures` writes every figure of a result, under fixed file names:

- eigen: ``spectra``, ``energy``
- overlap: ``overlap_layers_<i>``, ``overlap_heads_<i>``, ``overlap_layers_<i>_<j>``,
  ``overlap_heads_<i>_<j>``, ``split_half_<i>``
- reconstruct: ``error_vs_k``, ``tv_vs_k``, ``error_vs_flops``, ``fidelity_vs_k``
- importance: ``mass``, ``ablation``, ``gradient``, ``head_importance``,
  ``ablation_per_layer`` or ``ablation_per_head``
- dam: ``keep_per_class``, ``loss_vs_sparsity``, ``training``, ``masks``

each as ``.png`` and ``.pdf``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# kind -> "module:function" that saves every figure of a result of that kind
SAVERS = {
    "eigen": "attnlens.figures.eigen:save_eigen_figures",
    "overlap": "attnlens.figures.eigen:save_overlap_figures",
    "reconstruct": "attnlens.figures.reconstruct:save_reconstruct_figures",
    "importance": "attnlens.figures.importance:save_importance_figures",
    "dam": "attnlens.figures.dam:save_dam_figures",
}


def save_figures(result: object, directory: str | Path) -> list[Path]:
    """Write every figure of ``result`` into ``directory`` (PNG and PDF)."""
    module, function = SAVERS[result.kind].split(":")
    return getattr(importlib.import_module(module), function)(result, Path(directory))
