"""``fairgate simulate --timeline/--plot``: allocation against entitlement over time.

Contract:
- A :class:`TimelineRow` is one tenant at one virtual instant: the GPU-equivalents its
  running pods hold (``allocated``) and its entitlement (``entitlement``, from
  :func:`fairshare.entitlement.fairness`: the capacity water-filled by weight among the
  tenants with demand at that instant, each capped at running + waiting and at nominal +
  borrow limit).
- :func:`write_csv` writes ``time,tenant,allocated_gpu_eq,entitlement_gpu_eq`` (one row
  per tenant per instant, in time order).
- :func:`plot` draws each tenant's allocation (solid) and entitlement (dashed, same
  colour, wide and pale, under the allocation) over time into a PNG with matplotlib's
  Agg backend (no display needed).
  matplotlib is the optional extra ``fairgate[plot]``: :func:`require_matplotlib` raises
  :class:`PlotUnavailableError` saying how to install it; call it before a long run.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'fairgate[plot]'"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class TimelineRow:
    """One tenant at one virtual instant (seconds; GPU-equivalents)."""

    time: float
    tenant: str
    allocated: float
    entitlement: float


def write_csv(rows: Sequence[TimelineRow], path: Path) -> None:
    """Write ``rows`` as CSV with the header ``time,tenant,allocated_gpu_eq,entitlement_gpu_eq``."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time", "tenant", "allocated_gpu_eq", "entitlement_gpu_eq"])
        for row in rows:
            writer.writerow([f"{row.time:g}", row.tenant, f"{row.allocated:.4f}",
                             f"{row.entitlement:.4f}"])


def require_matplotlib() -> Any:
    """matplotlib's pyplot on the Agg backend; PlotUnavailableError when not installed."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailableError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def plot(rows: Sequence[TimelineRow], path: Path, title: str, capacity: float) -> None:
    """Draw allocation (solid) and entitlement (dashed) per tenant over time to ``path``."""
    pyplot = require_matplotlib()
    tenants = list(dict.fromkeys(row.tenant for row in rows))
    horizon = max((row.time for row in rows), default=0.0)
    minutes = horizon > 600
    scale, unit = (60.0, "minutes") if minutes else (1.0, "seconds")
    figure, axes = pyplot.subplots(figsize=(10, 5), dpi=110)
    colours = pyplot.get_cmap("tab10")
    for index, tenant in enumerate(tenants):
        mine = [row for row in rows if row.tenant == tenant]
        times = [row.time / scale for row in mine]
        colour = colours(index % 10)
        # entitlement: a wide pale dashed band under the allocation line, so both stay
        # visible where they coincide
        axes.plot(times, [row.entitlement for row in mine], color=colour, linewidth=3.5,
                  alpha=0.45, linestyle="--", label=f"{tenant} entitlement")
        axes.plot(times, [row.allocated for row in mine], color=colour, linewidth=1.4,
                  label=f"{tenant} allocated")
    axes.axhline(capacity, color="grey", linewidth=0.8, linestyle=":", label="capacity")
    axes.set_xlim(0, horizon / scale if horizon else 1)
    axes.set_ylim(0, capacity * 1.08 if capacity else 1)
    axes.set_xlabel(f"virtual time ({unit})")
    axes.set_ylabel("GPU-equivalents")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
