"""Figures without pyplot: each plot is its own matplotlib Figure, rendered to PNG by us.

pyplot keeps global state that the Jupyter inline backend hooks into; a figure redrawn from an
ipywidgets callback (outside any cell) could come out half-drawn. Figures built on
matplotlib.figure.Figure are never registered with pyplot, so nothing else draws or closes them.
"""
from __future__ import annotations

import io
from typing import Any

DPI = 100


def figure(figsize: tuple[float, float], ncols: int = 1, **subplot_kw: Any):
    """A new Figure and its axes (one Axes, or an array of `ncols`)."""
    from matplotlib.figure import Figure  # lazy: matplotlib (~0.55 s); `runbook kv` imports this module via kv/report.py

    fig = Figure(figsize=figsize, dpi=DPI)
    return fig, fig.subplots(1, ncols, **subplot_kw)


def png(fig) -> bytes:
    """The figure as PNG bytes, cropped to what is drawn (as Jupyter's inline backend does)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return buf.getvalue()


def show(*figs) -> None:
    """Display each figure as a PNG in Jupyter; outside Jupyter there is nothing to show. A list stands for its
    figures; None (a display function's answer for an empty report, or a plot with nothing to draw) is skipped."""
    try:
        from IPython import get_ipython  # lazy: IPython (~60 ms) only where a figure is shown
        from IPython.display import Image, display  # lazy: IPython only where a figure is shown
    except ImportError:  # pragma: no cover - IPython ships with the runbook's environment
        return
    if get_ipython() is None:
        return
    for fig in (f for it in figs for f in (it if isinstance(it, (list, tuple)) else [it])):
        if fig is not None:
            display(Image(data=png(fig), format="png"))
