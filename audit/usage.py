"""The ``diff`` of the dispatcher's usage records: what billing reads from them.

Contract: one builder per decision, so writer (:mod:`fairshare.dispatcher`) and reader
(:mod:`cost.billing`) agree on the keys. Values are plain JSON.
- ``start`` (a pod seen Running): ``{"pod": {"band", "node", "gpuProduct"}}``.
- ``preempt`` (a pod that ran, preempted by the scheduler):
  ``{"preemption": {"band", "ranSeconds", "preemptor"}}`` (``preemptor``:
  ``namespace/name`` or None when the cluster does not say).
- ``capacity`` (what fairgate's pods can use changed): per resource
  ``{"before": n | None, "after": n}``.
- ``pricing`` (the prices the dispatcher runs with changed, or it started): per
  ``platform.yaml`` path (``pricing.gpuHour.default``, ...) ``{"before", "after"}``, the
  same form as a ``quota-change`` diff of ``fairgate-platform``.
- ``budget`` (a tenant's budget state changed: ``ok``, ``warning``, ``exhausted``, or
  ``""`` for none): ``{"budget": {"before", "after", "spent", "monthly", "currency",
  "month"}}`` (``spent`` to the cent, ``month`` as ``YYYY-MM``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Detail = dict[str, dict[str, Any]]


def start_detail(band: str, node: str | None, product: str | None) -> Detail:
    """The ``diff`` of a ``start`` record."""
    return {"pod": {"band": band, "node": node, "gpuProduct": product}}


def preempt_detail(band: str, ran_seconds: float, preemptor: str | None) -> Detail:
    """The ``diff`` of a ``preempt`` record (``ranSeconds`` to the millisecond)."""
    return {"preemption": {"band": band, "ranSeconds": round(ran_seconds, 3),
                           "preemptor": preemptor}}


def capacity_detail(before: Mapping[str, int] | None, after: Mapping[str, int]) -> Detail:
    """The ``diff`` of a ``capacity`` record: per resource ``{before, after}``."""
    old = before or {}
    return {name: {"before": old.get(name), "after": after.get(name, 0)}
            for name in sorted(set(old) | set(after))}


def pricing_detail(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> Detail:
    """The ``diff`` of a ``pricing`` record: per path ``{before, after}`` (None: absent)."""
    old = before or {}
    return {path: {"before": old.get(path), "after": after.get(path)}
            for path in sorted(set(old) | set(after))}


def budget_detail(before: str, after: str, spent: float, monthly: float | None,
                  currency: str, month: str) -> Detail:
    """The ``diff`` of a ``budget`` record."""
    return {"budget": {"before": before, "after": after, "spent": round(spent, 2),
                       "monthly": monthly, "currency": currency, "month": month}}


def read_start(diff: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """``(band, gpuProduct)`` of a ``start`` record's diff (None where absent)."""
    pod = (diff or {}).get("pod")
    if not isinstance(pod, Mapping):
        return None, None
    band, product = pod.get("band"), pod.get("gpuProduct")
    return (band if isinstance(band, str) and band else None,
            product if isinstance(product, str) and product else None)


def read_preemptor(diff: Mapping[str, Any] | None) -> str | None:
    """``preemptor`` of a ``preempt`` or ``reclaim`` record's diff (for a reclaim: the
    head it was made for), None when absent."""
    preemption = (diff or {}).get("preemption")
    by = preemption.get("preemptor") if isinstance(preemption, Mapping) else None
    return by if isinstance(by, str) else None


def read_ran_seconds(diff: Mapping[str, Any] | None) -> float:
    """``ranSeconds`` of a ``preempt`` record's diff (0 when absent)."""
    preemption = (diff or {}).get("preemption")
    ran = preemption.get("ranSeconds") if isinstance(preemption, Mapping) else None
    return float(ran) if isinstance(ran, (int, float)) and not isinstance(ran, bool) else 0.0
