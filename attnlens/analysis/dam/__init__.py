"""DAM: Differentiable Attention Masks learned on a pretrained model (SparseBERT), in parts.

Mask logits ``α`` decide which (query, key) positions a model's attention keeps. Each
training step draws a Gumbel-sigmoid sample and uses its hard mask in the forward pass
with a straight-through gradient; removed positions are removed by renormalising the
kept weights (``removal="renormalise"``, the default: it equals setting removed scores to
``-inf`` in the forward pass and, unlike SparseBERT's additive ``-10⁴``, gives a removed
position the gradient of coming back). The loss is ``objective + λ·density``. Target
sparsities find their λ by dual ascent; the stopping rule ends a run whose hard mask has
stopped changing, and a check says whether it converged while the learning rate could still
move it. The deterministic mask ``α > 0`` is then judged on held-out blocks, beside fixed
sparse patterns at matched sparsity, across seeds (``mask_seeds``) and beside a discrete
swap search (``reference``).

The parts, one idea each:

- :mod:`~attnlens.analysis.dam.settings`: :class:`DamSettings`, the recipe's defaults;
- :mod:`~attnlens.analysis.dam.layouts`: how logits map onto positions (:data:`LAYOUTS`);
- :mod:`~attnlens.analysis.dam.masked_forward`: a sampled mask inside attention, with its straight-through gradient;
- :mod:`~attnlens.analysis.dam.training`: :class:`DamTrainer`, its schedules, dual ascent (or a mask held on its way);
- :mod:`~attnlens.analysis.dam.stopping`: :class:`StoppingRule` and the convergence check;
- :mod:`~attnlens.analysis.dam.judging`: masks and patterns judged on blocks and task batches;
- :mod:`~attnlens.analysis.dam.reference`: the swap search a learned mask is set against;
- :mod:`~attnlens.analysis.dam.seeds`: masks per seed combined (spread, verdicts counting every seed);
- :mod:`~attnlens.analysis.dam.result`: :class:`DamResult`, with the comparisons at matched sparsity;
- :mod:`~attnlens.analysis.dam.runs`: what the runs of one call share (``Setup``) and what each ends with (``Run``);
- :mod:`~attnlens.analysis.dam.mask_run`: one run, its mask trained, polished and judged;
- :mod:`~attnlens.analysis.dam.compared`: the patterns set beside each mask (adapted, or matched for the task);
- :mod:`~attnlens.analysis.dam.assemble`: the result's tables, arrays and metadata from the runs;
- :mod:`~attnlens.analysis.dam.run`: :func:`dam`, the steps of a run.
"""

from attnlens.analysis.dam.layouts import LAYOUTS, MaskLayout
from attnlens.analysis.dam.result import DamResult
from attnlens.analysis.dam.run import dam
from attnlens.analysis.dam.settings import DEFAULT_SPARSITY, DamSettings
from attnlens.analysis.dam.stopping import StoppingRule
from attnlens.analysis.dam.training import DamTrainer

__all__ = ["DEFAULT_SPARSITY", "LAYOUTS", "DamResult", "DamSettings", "DamTrainer", "MaskLayout", "StoppingRule", "dam"]
