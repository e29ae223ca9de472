"""``fairgate simulate --timeline/--plot``: allocation against entitlement over time.

Contract:
- A :class:`TimelineRow` is one tenant at one virtual instant: the GPU-equivalents its
  running pods hold (``allocated``), the same split by class (``by_class``: inference,
  training; they sum to ``allocated``) and its entitlement (``entitlement``, from
  :func:`fairshare.queue.entitlement.fairness`: the capacity water-filled by weight among the
  tenants with demand at that instant, each capped at running + waiting and at nominal +
  borrow limit).
- :func:`write_csv` writes ``time,tenant,allocated_gpu_eq,entitlement_gpu_eq,
  inference_gpu_eq,training_gpu_eq`` (one row per tenant per instant, in time order).
  ``time`` is written by :func:`format_seconds`: the shortest decimal that reads back as
  the same float, never in exponent notation, so distinct instants stay distinct rows
  at any magnitude (``%g`` wrote 1000000 and 1000030 both as ``1e+06``).
- :func:`plot` draws each tenant's allocation (solid) and entitlement (dashed, same
  colour, wide and pale, under the allocation) over time into a PNG with matplotlib's
  Agg backend (no display needed).
  matplotlib is the optional extra ``fairgate[plot]``: :func:`require_matplotlib` raises
  :class:`PlotUnavailableError` saying how to install it; call it before a long run.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tenants.models import CLASSES, PodClass

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
    by_class: Mapping[PodClass, float] = field(default_factory=dict)  # missing: 0


HEADER = ["time", "tenant", "allocated_gpu_eq", "entitlement_gpu_eq",
          *(f"{cls}_gpu_eq" for cls in CLASSES)]


def format_seconds(value: float) -> str:
    """``value`` as a plain decimal: the shortest that reads back as the same float,
    without exponent and without a trailing ``.0`` (``1000030``, ``0.25``, ``1e-07`` as
    ``0.0000001``)."""
    text = format(Decimal(repr(float(value))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def write_csv(rows: Sequence[TimelineRow], path: Path) -> None:
    """Write ``rows`` as CSV with the header :data:`HEADER`."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for row in rows:
            writer.writerow([format_seconds(row.time), row.tenant, f"{row.allocated:.4f}",
                             f"{row.entitlement:.4f}",
                             *(f"{row.by_class.get(cls, 0.0):.4f}" for cls in CLASSES)])


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
