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
- ``charge`` (what a pod sharing a ResourceClaim is charged changed: the charge of a
  shared claim moved to it or away from it), and the ``dispatch`` of a *rider* (a pod
  released charged only its own demand): ``{"charge": {"before", "after", "riding"}}``,
  ``before``/``after`` demand texts (``gpu=3``; ``""`` for nothing), ``riding``: per
  claim uid the pod is not charged for, ``{"claim": its name or None, "payer":
  "namespace/name" of the pod that pays it}``. Billing bills the pod's ``after`` from
  the record's time on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

Detail = dict[str, dict[str, Any]]


class Riding(NamedTuple):
    """A shared ResourceClaim a pod is not charged for: its name (None when not known)
    and ``namespace/name`` of the pod that pays it."""

    claim: str | None
    payer: str

    def words(self, uid: str) -> str:
        """``claim data (uid u-1) that ns/pod pays for``."""
        named = f"{self.claim} (uid {uid})" if self.claim else f"uid {uid}"
        return f"claim {named} that {self.payer} pays for"


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


def charge_detail(before: str, after: str, riding: Mapping[str, Riding]) -> Detail:
    """The ``diff`` of a ``charge`` record, or of a rider's ``dispatch``."""
    return {"charge": {"before": before, "after": after, "riding": {
        uid: {"claim": ride.claim, "payer": ride.payer} for uid, ride in sorted(riding.items())}}}


def read_charge(diff: Mapping[str, Any] | None) -> tuple[str, dict[str, Riding]] | None:
    """``(after, riding)`` of a record's ``charge`` diff: the demand the pod is charged from
    the record's time on and the shared claims it rides on (claim uid -> :class:`Riding`);
    None when the record states no charge (older records, other decisions)."""
    charge = (diff or {}).get("charge")
    after = charge.get("after") if isinstance(charge, Mapping) else None
    if not isinstance(charge, Mapping) or not isinstance(after, str):
        return None
    riding = charge.get("riding")
    rides: dict[str, Riding] = {}
    for uid, ride in (riding.items() if isinstance(riding, Mapping) else ()):
        if isinstance(ride, Mapping):
            claim = ride.get("claim")
            rides[str(uid)] = Riding(claim if isinstance(claim, str) and claim else None,
                                     str(ride.get("payer", "")))
    return after, rides


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
