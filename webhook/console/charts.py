"""Inline SVG line charts for the Fairness page (pure; no chart library).

Contract: :func:`line_chart` maps series of ``[t, value]`` points over ``[since,
until]`` (whole pixels) into a ``width`` x ``height`` box with a margin for axis labels and returns
the SVG ``points`` attribute per series plus y-axis ticks and a time axis (``xticks``: five
``(x, label, anchor)`` from ``since`` to ``until``, UTC ``HH:MM``, ``MM-DD HH:MM`` over
more than a day); values are clipped at 0 and
the y range is ``[0, top]``, ``top`` by default ``max(values, 1e-9)`` rounded up to a
"nice" number. :func:`shared_top` is that number over every tenant's samples, so that the
Fairness page draws the tenants of a page on one y-scale (a small tenant is a low line,
not a spike). :func:`split_series` splits the Fairness page's ``[t, used,
entitlement]`` samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
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
               until: float, top: float | None = None) -> dict[str, Any]:
    """``{"width", "height", "left", "bottom", "lines": {name: points}, "ticks": [(y,
    label)], "xticks": [(x, label, anchor)], "top"}``; ``top``: the y range's top (by
    default the series' own, see the module contract)."""
    if top is None:
        top = nice_ceiling(max((p[1] for points in series.values() for p in points),
                               default=0.0))
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
            "lines": lines, "ticks": ticks, "xticks": time_ticks(since, until), "top": top}


def time_ticks(since: float, until: float) -> list[tuple[int, str, str]]:
    """Five ``(x, label, text-anchor)`` marks of the time axis from ``since`` to ``until``
    (unix seconds): UTC ``HH:MM``, or ``MM-DD HH:MM`` when the span exceeds a day; the
    first label starts at its mark and the last ends at it, so both stay in the box."""
    span = max(until - since, 1e-9)
    form = "%H:%M" if span <= 24 * 3600 else "%m-%d %H:%M"
    marks = []
    for i in range(5):
        at = since + span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        label = datetime.fromtimestamp(at, UTC).strftime(form)
        marks.append((round(LEFT + (WIDTH - LEFT) * i / 4), label, anchor))
    return marks


def shared_top(samples: Mapping[str, Sequence[Sequence[float]]]) -> float:
    """The y range's top that holds every used and entitlement value of every tenant's
    ``[t, used, entitlement]`` samples (a "nice" number, as :func:`line_chart`'s own)."""
    return nice_ceiling(max((v for points in samples.values() for p in points
                             for v in p[1:3]), default=0.0))


def split_series(points: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[list[float]]]:
    """``[[t, used, entitlement], ...]`` as two series ``[[t, used]]``, ``[[t, entitlement]]``."""
    return [[p[0], p[1]] for p in points], [[p[0], p[2]] for p in points]
