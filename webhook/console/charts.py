"""Inline SVG line charts for the Fairness page (pure; no chart library).

Contract: :func:`line_chart` maps series of ``[t, value]`` points over ``[since,
until]`` (whole pixels) into a ``width`` x ``height`` box with a margin for axis labels and returns
the SVG ``points`` attribute per series plus y-axis ticks; values are clipped at 0 and
the y range is ``[0, max(values, 1e-9)]`` rounded up to a "nice" number.
:func:`split_series` splits the Fairness page's ``[t, used, entitlement]`` samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 180, 48, 22, 8


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0):
        if step * power >= value - 1e-12:
            return step * power
    return 10.0 * power


def line_chart(series: Mapping[str, Sequence[Sequence[float]]], since: float,
               until: float) -> dict[str, Any]:
    """``{"width", "height", "lines": {name: points}, "ticks": [(y, label)], "top"}``."""
    values = [p[1] for points in series.values() for p in points]
    top = nice_ceiling(max(values, default=0.0))
    span = max(until - since, 1e-9)
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    x_scale, y_scale, base = plot_w / span, plot_h / top, TOP + plot_h

    def points(series_points: Sequence[Sequence[float]]) -> str:
        # whole pixels: a 640-wide chart needs no more, and it keeps big pages cheap
        return " ".join(
            f"{round(LEFT + (min(max(t, since), until) - since) * x_scale)},"
            f"{round(base - max(v, 0.0) * y_scale)}" for t, v, *_ in series_points)

    lines = {name: points(pts) for name, pts in series.items()}
    ticks = [(TOP + plot_h - f * plot_h, f"{top * f:g}") for f in (0, 0.5, 1)]
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "bottom": HEIGHT - BOTTOM,
            "lines": lines, "ticks": ticks, "top": top}


def split_series(points: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[list[float]]]:
    """``[[t, used, entitlement], ...]`` as two series ``[[t, used]]``, ``[[t, entitlement]]``."""
    return [[p[0], p[1]] for p in points], [[p[0], p[2]] for p in points]
