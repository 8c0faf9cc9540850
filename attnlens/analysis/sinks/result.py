"""The result of :func:`~attnlens.analysis.sinks.sinks`: each head's first-token weight and heavy hitters."""

from __future__ import annotations

import pandas as pd

from attnlens.io.results import Result, format_table


class SinkResult(Result):
    """The first-token sink and the heavy hitters of every head; see :mod:`attnlens.analysis.sinks`.

    ``summary`` (the model's share of sink heads with its interval, the share of negligible weights, the
    heavy hitters' mass, each beside the median and quartiles over heads), ``layers`` (the share of sink heads
    by layer), ``heads``, ``curve`` (mass against the share of keys kept, beside uniform attention's). ``arrays``:
    per block ``first_weight`` (block, layer, head), ``below`` (negligible valid pairs) and ``pairs`` (block, layer:
    valid pairs), ``top_mass`` (block, layer, head, fraction: mean over the rows read), ``uniform_mass`` (block,
    layer, fraction) and ``mass_rows`` (block, layer). With ``far``: ``summary``'s ``far_share`` (its bounds: the
    heads decided far, and those with every undecided head), ``heads``' ``far_cost`` with its interval and ``looks``
    (far, near, not decided), and the arrays ``far_loss`` (layer, head, block) and ``far_unmodified`` (block).
    """

    kind = "sinks"
    figures_module = "attnlens.figures.sinks"
    main_table = "summary"
    shown = {"summary": ("measure", "value", "low", "high", "head_median", "head_q1", "head_q3")}
    column_notes = {
        "value": "sink_share: heads whose mean first-token weight exceeds epsilon; below: valid weights under "
        "fraction × their row's largest; top_mass: weight the top share of a row's keys hold",
        "head_median": "the typical head: median over heads (of the first-token weight for sink_share)",
    }

    @property
    def table(self) -> pd.DataFrame:
        table = super().table
        assert table is not None, "a sinks result always has its summary"
        return table

    def summary(self) -> str:
        s = self.settings
        return f"n = {s['seq_len']}, {s['num_seqs']} blocks, epsilon {s['epsilon']:g}, negligible below {s['fraction']:g} of a row's largest"

    def text(self) -> str:
        """The summary, then the share of sink heads by layer."""
        layers = self.tables["layers"]
        by_layer = ", ".join(f"L{row.layer} {row.sink_share:.0%}" for row in layers.itertuples())
        return "\n".join([format_table(self.view()), f"sink heads by layer: {by_layer}"])
