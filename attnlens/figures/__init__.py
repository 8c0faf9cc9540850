"""Figures: one plotting function per figure, each taking a result and an optional Axes.

No computation happens here: every number plotted is read from a saved result.
"""
