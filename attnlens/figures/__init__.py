"""Figures: one module per result kind, each drawing numbers read from a result, never computing.

Every module has ``plot_*`` functions that take a result (and an optional matplotlib
``Axes``) and a ``draw(result)`` that yields ``(name, figure)`` for every figure of the
result, main figure first; :data:`attnlens.io.results.REGISTRY` says which module draws
which kind, and :meth:`attnlens.io.results.Result.save_figures` writes them as
``NAME.png`` and ``NAME.pdf``. Because nothing is computed here, figures can be redrawn
from saved results without the model (``attnlens figures``):

- eigen: ``spectra``, ``energy``
- overlap: ``overlap_layers_<i>``, ``overlap_heads_<i>``, ``overlap_layers_<i>_<j>``,
  ``overlap_heads_<i>_<j>``, ``split_half_<i>``
- reconstruct: ``error_vs_k``, ``tv_vs_k``, ``error_vs_flops``, ``fidelity_vs_k``
- importance: ``ablation``, ``mass``, ``gradient``, ``head_importance``,
  ``ablation_per_layer`` or ``ablation_per_head``
- dam: ``loss_vs_sparsity``, ``keep_per_class``, ``training``, ``masks``
"""
