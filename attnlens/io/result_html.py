"""A result as a notebook shows it (:meth:`attnlens.io.results.Result._repr_html_`): its provenance,
the head of its main table, and its main figure."""

from __future__ import annotations

import base64
import html
import io

from attnlens.io.result_figures import Drawable, draw


def result_html(result: Drawable) -> str:
    """Provenance, the head of the main table (its shown columns), and the main figure, as HTML."""
    parts = [f"<h4>{html.escape(type(result).__name__)}</h4>", provenance_html(result.meta)]
    if result.table is not None:
        parts.append(f"<p>{html.escape(result.main_table)} ({len(result.table)} rows), first 10:</p>")
        table = result.view().head(10).to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0, na_rep="")
        parts.append(f'<div style="overflow-x:auto">{table}</div>')  # a wide table scrolls in its box, not the page
    figure = first_figure(result)
    if figure is not None:
        parts.append(f'<img src="data:image/png;base64,{figure}" style="max-width:640px">')
    return "\n".join(parts)


def provenance_html(meta: dict) -> str:
    """A small table: model, corpus, settings, when and with what it was made, and the command."""
    rows = []
    model = meta.get("model")
    if isinstance(model, dict):
        rows.append(("model", f"{model.get('name', '')} ({model.get('architecture', '')})"))
    elif meta.get("models"):
        rows.append(("model", " × ".join(map(str, meta["models"]))))
    corpus = meta.get("corpus")
    if isinstance(corpus, dict):
        rows.append(("corpus", str(corpus.get("source", corpus.get("name", "")))))
    if meta.get("settings"):
        rows.append(
            (
                "settings",
                ", ".join(
                    f"{key}={value}"
                    for key, value in meta["settings"].items()
                    if not isinstance(value, (dict, list)) or len(str(value)) < 60
                ),
            )
        )
    versions = meta.get("versions") or {}
    rows.append(
        (
            "made",
            f"{meta.get('created', '')} with attnlens {versions.get('attnlens', '')}, "
            f"torch {versions.get('torch', '')}, transformers {versions.get('transformers', '')}",
        )
    )
    if meta.get("command"):
        rows.append(("command", f"<code>{html.escape(str(meta['command']))}</code>"))
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(key)}</th><td style='text-align:left'>"
        f"{value if key == 'command' else html.escape(value)}</td></tr>"
        for key, value in rows
    )
    return f"<table>{body}</table>"


def first_figure(result: Drawable) -> str | None:
    """The main figure as base64 PNG, or None."""
    figures = draw(result)
    try:
        _, figure = next(figures)
    except StopIteration:
        return None
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    plt.close(figure)
    figures.close() if hasattr(figures, "close") else None
    return base64.b64encode(buffer.getvalue()).decode()
