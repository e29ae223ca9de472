"""GPU-time and cost per tenant from audit records: the accounting engine (pure, no I/O).

Contract:
- :func:`bill` reads audit records (oldest first, as the stream holds them) and returns a
  :class:`Bill` for the window ``[since, until)``: one :class:`BillRow` per (tenant,
  class) with GPU-equivalent hours (slices / 7), borrowed hours, cost, preemptions,
  reclaims, and
  the breakdown by band (``inference``, ``training``, ``borrowed``), resource (``gpu`` or
  a MIG profile) and GPU product; totals; and the cluster's idle GPU hours.
- A pod's GPU-time runs from its ``start`` record (the dispatcher saw it Running) to its
  ``release`` record (the dispatcher saw it end, or deleted). The first ``start`` of a
  ticket counts (a restarted or second dispatcher records it again). A pod released
  without a ``start`` record (it ran and ended between two looks of the dispatcher, or
  the dispatcher was down) is billed from its ``dispatch`` (gate lifted) or ``admit``
  (fast path) record: the latest moment it cannot have started before. A release saying
  it never ran (``pod deleted before it ran``, ``pod gone before its gate was lifted``)
  bills nothing. A pod still running at ``until`` is billed up to ``until``. Intervals
  are clipped exactly to the window (times have millisecond resolution; all sums are
  exact integers of slice-milliseconds until the final division).
- What a pod is billed for is its record's ``demand``, except where the log says it was
  charged otherwise: a pod sharing a ResourceClaim (docs/dra.md, "Shared claims") is
  charged a shared claim only while it pays it. A rider's ``dispatch`` and every
  ``charge`` record carry ``diff.charge.after`` (:func:`audit.usage.read_charge`): the
  demand billed from that record's time on (its pod's ``start`` and ``release`` keep
  its full demand). So a shared claim's GPU-time is billed once, to the pod that pays
  it while it pays it, however many pods hold it. Records written before charges were
  recorded carry none: their pods are billed their full demand, as they were.
- Prices (:class:`tenants.models.PricingSpec`): a whole GPU of product P costs
  ``gpuHour[P]`` (else ``gpuHour.default``) per hour; a MIG slice slices/7 of its parent
  GPU's price (the product of the node it ran on, when the start record names it). A
  price change is a ``quota-change`` record of ``fairgate-platform`` (the webhook's)
  or a ``pricing`` record (the dispatcher's, when it starts or its config's prices
  change) whose ``diff`` holds ``pricing.*`` paths: it applies from that record's time
  on, never before. Before a field's first audited change its ``before`` value applies
  (an edit's; the dispatcher's record states no ``before``); a field never recorded in
  the log, or only by the dispatcher, has ``pricing`` (the caller's current config, None
  in ``fairgate report``) before that.
- Preemptions: a ``preempt`` record counts in the window holding its time, with the whole
  GPU-time the pod had run (``diff.preemption.ranSeconds`` x slices / 7): lost work is
  one event, not spread over time. A ``reclaim`` record (fairgate evicted the pod for a
  tenant owed its fair share, ``fairShare.reclaim``) counts the same way, in
  ``reclaimed_pods`` and ``reclaimed_gpu_hours`` of the tenant that lost it.
- Idle: ``capacity`` records (the dispatcher's capacity, ``diff`` of per-resource
  ``before``/``after``) give capacity over time; ``idle_gpu_hours`` is capacity hours
  minus used hours over the part of the window where capacity is known (None when no
  capacity record precedes ``until``), never below zero. With ``share_idle`` the idle
  hours and their cost (at the default price) are shared among rows in proportion to
  their GPU hours (OpenCost's ``shareIdle``).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from audit.chain import (
    ADMIT,
    CAPACITY,
    CHARGE,
    DISPATCH,
    PREEMPT,
    PRICING,
    QUOTA_CHANGE,
    RECLAIM,
    RELEASE,
    START,
    AuditRecord,
)
from audit.usage import read_charge, read_ran_seconds, read_start
from tenants import resources
from tenants.models import CONTROL_NAMESPACE, PLATFORM_CONFIGMAP, PricingSpec

MS_PER_HOUR = 3_600_000
SLICES = resources.SLICES_PER_GPU
NEVER_RAN = ("pod deleted before it ran", "pod gone before its gate was lifted")
"""Release reasons (the dispatcher's) of pods that never held a GPU."""
PRICE_PREFIX = "pricing.gpuHour"
UNKNOWN_PRODUCT = "unknown"
_UNKNOWN = object()  # a price the record does not state


@dataclass
class Usage:
    """GPU-time and cost of one (band, resource, product) of a row."""

    band: str
    resource: str
    product: str
    slice_ms: int = 0
    cost: float = 0.0

    @property
    def gpu_hours(self) -> float:
        """GPU-equivalent hours."""
        return self.slice_ms / SLICES / MS_PER_HOUR


@dataclass
class BillRow:
    """One tenant and class over the window."""

    tenant: str
    pod_class: str
    usage: dict[tuple[str, str, str], Usage] = field(default_factory=dict)
    preempted_pods: int = 0
    preempted_slice_ms: int = 0
    reclaimed_pods: int = 0
    reclaimed_slice_ms: int = 0
    idle_gpu_hours: float = 0.0  # its share, with share_idle
    idle_cost: float = 0.0

    @property
    def gpu_hours(self) -> float:
        """GPU-equivalent hours in all bands."""
        return sum(u.slice_ms for u in self.usage.values()) / SLICES / MS_PER_HOUR

    @property
    def borrowed_gpu_hours(self) -> float:
        """GPU-equivalent hours of the ``borrowed`` band."""
        return sum(u.slice_ms for u in self.usage.values()
                   if u.band == "borrowed") / SLICES / MS_PER_HOUR

    @property
    def cost(self) -> float:
        """Cost of its GPU-time (without any idle share)."""
        return sum(u.cost for u in self.usage.values())

    @property
    def preempted_gpu_hours(self) -> float:
        """GPU-equivalent hours its preempted pods had run (lost work)."""
        return self.preempted_slice_ms / SLICES / MS_PER_HOUR

    @property
    def reclaimed_gpu_hours(self) -> float:
        """GPU-equivalent hours its reclaimed pods had run (lost work)."""
        return self.reclaimed_slice_ms / SLICES / MS_PER_HOUR

    def lose(self, decision: str, slice_ms: int) -> None:
        """Count one pod preempted (``preempt``) or reclaimed (``reclaim``) that had run
        ``slice_ms`` slice-milliseconds."""
        if decision == RECLAIM:
            self.reclaimed_pods += 1
            self.reclaimed_slice_ms += slice_ms
        else:
            self.preempted_pods += 1
            self.preempted_slice_ms += slice_ms

    def to_json(self) -> dict[str, Any]:
        """Plain data in snake_case, with OpenCost's own names for the same figures under
        ``opencost`` (``gpuHours``, ``gpuCost``), as OpenCost spells them."""
        return {
            "tenant": self.tenant, "class": self.pod_class,
            "gpu_hours": self.gpu_hours, "borrowed_gpu_hours": self.borrowed_gpu_hours,
            "cost": self.cost, "preempted_pods": self.preempted_pods,
            "preempted_gpu_hours": self.preempted_gpu_hours,
            "reclaimed_pods": self.reclaimed_pods,
            "reclaimed_gpu_hours": self.reclaimed_gpu_hours,
            "idle_gpu_hours": self.idle_gpu_hours, "idle_cost": self.idle_cost,
            "total_cost": self.cost + self.idle_cost,
            "opencost": {"gpuHours": self.gpu_hours, "gpuCost": self.cost},
            "usage": [{"band": u.band, "resource": u.resource, "gpu_product": u.product,
                       "gpu_hours": u.gpu_hours, "cost": u.cost}
                      for _, u in sorted(self.usage.items())],
        }


@dataclass
class Bill:
    """The bill of a window: rows by (tenant, class), totals and idle capacity."""

    since: datetime
    until: datetime
    currency: str
    rows: list[BillRow]
    capacity_gpu_hours: float | None
    idle_gpu_hours: float | None
    idle_cost: float | None
    share_idle: bool = False

    def totals(self) -> BillRow:
        """The sum of every row (tenant and class ``total``)."""
        total = BillRow("total", "")
        for row in self.rows:
            for key, use in row.usage.items():
                into = total.usage.setdefault(key, Usage(*key))
                into.slice_ms += use.slice_ms
                into.cost += use.cost
            total.preempted_pods += row.preempted_pods
            total.preempted_slice_ms += row.preempted_slice_ms
            total.reclaimed_pods += row.reclaimed_pods
            total.reclaimed_slice_ms += row.reclaimed_slice_ms
            total.idle_gpu_hours += row.idle_gpu_hours
            total.idle_cost += row.idle_cost
        return total

    def to_json(self) -> dict[str, Any]:
        """Plain data: window, currency, rows, totals and the idle capacity."""
        return {
            "since": self.since.isoformat().replace("+00:00", "Z"),
            "until": self.until.isoformat().replace("+00:00", "Z"),
            "currency": self.currency, "share_idle": self.share_idle,
            "rows": [row.to_json() for row in self.rows],
            "totals": self.totals().to_json(),
            "capacity_gpu_hours": self.capacity_gpu_hours,
            "idle_gpu_hours": self.idle_gpu_hours, "idle_cost": self.idle_cost,
        }


@dataclass(slots=True)
class _Pod:
    tenant: str
    pod_class: str
    demand: str
    band: str = "training"
    product: str | None = None
    start: int | None = None  # ms
    fallback: int | None = None  # dispatch or admit time, ms
    end: int | None = None
    ran: bool = True
    charges: list[tuple[int, str]] | None = None  # (ms, demand) charged from then on


class _Prices:
    """Each pricing field's value over time, from the config and the audited changes."""

    def __init__(self, current: PricingSpec | None) -> None:
        self.current = current.paths() if current is not None else {}
        self.changes: dict[str, list[tuple[int, Any, Any]]] = {}  # path -> (ms, before, after)
        self._times: list[int] = []
        self._segments: dict[tuple[str | None, int], float] = {}

    def change(self, at: int, path: str, before: Any, after: Any) -> None:
        self.changes.setdefault(path, []).append((at, before, after))

    def times(self) -> list[int]:
        """The times prices change at (segment ``k`` starts at ``times()[k - 1]``).
        Each field's changes are put in time order first: writers' clocks may interleave
        their records slightly out of order in the stream."""
        for runs in self.changes.values():
            runs.sort(key=lambda run: run[0])
        self._times = sorted({at for runs in self.changes.values() for at, _, _ in runs})
        return self._times

    def segment_price(self, product: str | None, k: int) -> float:
        """:meth:`price` during segment ``k`` of :meth:`times` (constant there)."""
        key = (product, k)
        price = self._segments.get(key)
        if price is None:
            at = self._times[k - 1] if k else -(2**62)
            price = self._segments[key] = self.price(product, at)
        return price

    def value(self, path: str, at: int) -> Any:
        runs = self.changes.get(path)
        if not runs:
            return self.current.get(path)
        i = bisect.bisect_right(runs, at, key=lambda run: run[0])
        if i:
            return runs[i - 1][2]
        first = runs[0][1]
        return self.current.get(path) if first is _UNKNOWN else first

    def price(self, product: str | None, at: int) -> float:
        for path in ((f"{PRICE_PREFIX}.{product}",) if product else ()) + (
                f"{PRICE_PREFIX}.default", PRICE_PREFIX):
            value = self.value(path, at)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return 0.0

    def currency(self, at: int) -> str:
        value = self.value("pricing.currency", at)
        return value if isinstance(value, str) else "USD"


def ms_of(when: datetime) -> int:
    """A timezone-aware time in epoch milliseconds."""
    return round(when.timestamp() * 1000)


class _TimeParser:
    """Record times (RFC 3339) in epoch ms. The usual form, ``YYYY-MM-DDTHH:MM:SS.mmmZ``
    (:func:`audit.chain.format_time`), is parsed once per hour and its minutes, seconds
    and milliseconds added; any other form in full (as is an invalid one, which raises
    ValueError)."""

    def __init__(self) -> None:
        self._hours: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if len(text) == 24 and text[13] == ":" and text[16] == ":" and text[19] == "." \
                and text[23] == "Z":
            minute, second, millis = text[14:16], text[17:19], text[20:23]
            digits = minute + second + millis
            if digits.isascii() and digits.isdigit() and minute < "60" and second < "60":
                hour = self._hours.get(text[:13])
                if hour is None:
                    hour = self._hours[text[:13]] = ms_of(
                        datetime.fromisoformat(text[:13] + ":00:00Z"))
                return hour + int(minute) * 60_000 + int(second) * 1000 + int(millis)
        return ms_of(datetime.fromisoformat(text))


def _band_of(reason: str) -> str | None:
    # "reserved as borrowed" (admit) or "released as borrowed after 3.0s" (dispatch)
    for marker in ("reserved as ", "released as "):
        if reason.startswith(marker):
            return reason[len(marker):].split(" ", 1)[0]
    return None


def bill(records: Iterable[AuditRecord], since: datetime, until: datetime,
         pricing: PricingSpec | None = None, *, share_idle: bool = False) -> Bill:
    """The bill of ``[since, until)`` from ``records`` (oldest first); see the module
    docstring for the rules. ``pricing`` is the current config's (None: no prices
    configured, every cost 0 unless the log holds audited prices)."""
    return bill_bodies((record.fields() for record in records), since, until, pricing,
                       share_idle=share_idle)


def bill_bodies(bodies: Iterable[Mapping[str, Any]], since: datetime, until: datetime,
                pricing: PricingSpec | None = None, *, share_idle: bool = False) -> Bill:
    """:func:`bill` from the records' wire mappings (``class``, not ``pod_class``; the
    bodies :class:`audit.log.ChainScan` yields): what ``fairgate report`` bills from
    without building a record object per stream entry."""
    if until <= since:
        raise ValueError(f"the window is empty: until ({until}) must be after since ({since})")
    lo, hi = ms_of(since), ms_of(until)
    pods: dict[str, _Pod] = {}
    prices = _Prices(pricing)
    capacity: list[tuple[int, int]] = []  # (ms, slices) from each capacity record on
    capacity_now: dict[str, int] = {}
    losses: list[tuple[str, str, str, int]] = []  # decision, tenant, class, slice-ms lost
    record_ms = _TimeParser()
    for body in bodies:
        decision = body["decision"]
        if decision == START:
            pod = pods.get(body["uid"])
            if pod is None:
                pod = pods[body["uid"]] = _Pod(body["tenant"], body["class"], body["demand"])
            if pod.start is None:
                band, pod.product = read_start(body.get("diff"))
                pod.start = record_ms(body["time"])
                pod.band = band or pod.band
        elif decision == RELEASE:
            pod = pods.get(body["uid"])
            if pod is not None and pod.end is None:
                pod.end = record_ms(body["time"])
                pod.ran = pod.start is not None or body["reason"] not in NEVER_RAN
        elif decision in (DISPATCH, ADMIT):
            band = _band_of(body["reason"])
            if band is None:  # an admit that is not a reservation (fail open)
                band = "inference" if body["class"] == "inference" else "training"
            pod = pods.get(body["uid"])
            if pod is None:
                pods[body["uid"]] = _Pod(body["tenant"], body["class"], body["demand"],
                                         band=band, fallback=record_ms(body["time"]))
            elif pod.start is None:
                pod.fallback, pod.band = record_ms(body["time"]), band
            if decision == DISPATCH:  # a rider's states its charge
                _note_charge(pods, body, record_ms)
        elif decision == CHARGE:
            _note_charge(pods, body, record_ms)
        elif decision in (PREEMPT, RECLAIM):
            at = record_ms(body["time"])
            if lo <= at < hi:
                lost = round(read_ran_seconds(body.get("diff")) * 1000) * _slices(body["demand"])
                losses.append((decision, body["tenant"], body["class"], lost))
        elif decision == CAPACITY and body.get("diff"):
            for name, change in body["diff"].items():
                after = change.get("after") if isinstance(change, Mapping) else None
                if isinstance(after, int) and after > 0:
                    capacity_now[name] = after
                else:
                    capacity_now.pop(name, None)
            capacity.append((record_ms(body["time"]), _slices_of_counts(capacity_now)))
        elif (decision == PRICING or (decision == QUOTA_CHANGE
              and body["name"] == PLATFORM_CONFIGMAP
              and body["namespace"] in (CONTROL_NAMESPACE, ""))) and body.get("diff"):
            at = record_ms(body["time"])
            for path, change in body["diff"].items():
                if path.startswith("pricing") and isinstance(change, Mapping):
                    # the dispatcher states prices from now on; what held before, it may
                    # not know (a restart): only an edit's ``before`` is evidence
                    before = change.get("before") if decision == QUOTA_CHANGE else _UNKNOWN
                    prices.change(at, path, before, change.get("after"))
    breaks = prices.times()
    capacity.sort(key=lambda step: step[0])  # several dispatchers' clocks may interleave
    rows: dict[tuple[str, str], BillRow] = {}
    used_ms: list[tuple[int, int, int]] = []  # clipped (start, end, slices) for idle
    for pod in pods.values():
        begin = pod.start if pod.start is not None else (
            pod.fallback if pod.end is not None and pod.ran else None)
        if begin is None or not pod.ran:
            continue
        a, b = max(begin, lo), min(pod.end if pod.end is not None else hi, hi)
        if b <= a:
            continue
        row = rows.get((pod.tenant, pod.pod_class))
        if row is None:
            row = rows[(pod.tenant, pod.pod_class)] = BillRow(pod.tenant, pod.pod_class)
        product = pod.product or UNKNOWN_PRODUCT
        for start, end, text in _charged_spans(pod, a, b):
            demand = _demand(text)
            for name, slices in demand:
                key = (pod.band, name, product)
                use = row.usage.get(key)
                if use is None:
                    use = row.usage[key] = Usage(*key)
                use.slice_ms += slices * (end - start)
                use.cost += _cost(prices, breaks, pod.product, slices, start, end)
            used_ms.append((start, end, sum(slices for _, slices in demand)))
    for decision, tenant, pod_class, lost in losses:
        row = rows.get((tenant, pod_class))
        if row is None:
            row = rows[(tenant, pod_class)] = BillRow(tenant, pod_class)
        row.lose(decision, lost)
    ordered = [rows[key] for key in sorted(rows)]
    capacity_hours, idle_hours, idle_cost = _idle(capacity, used_ms, prices, breaks, lo, hi)
    if share_idle and idle_hours is not None and idle_cost is not None:
        used_total = sum(row.gpu_hours for row in ordered)
        for row in ordered:
            share = row.gpu_hours / used_total if used_total else 0.0
            row.idle_gpu_hours = idle_hours * share
            row.idle_cost = idle_cost * share
    return Bill(since, until, prices.currency(hi - 1), ordered, capacity_hours, idle_hours,
                idle_cost, share_idle)


def _note_charge(pods: dict[str, _Pod], body: Mapping[str, Any],
                 record_ms: _TimeParser) -> None:
    """Keep the charge a ``dispatch`` or ``charge`` record states for its pod, if any."""
    charge = read_charge(body.get("diff"))
    if charge is None:
        return
    pod = pods.get(body["uid"])
    if pod is None:
        pod = pods[body["uid"]] = _Pod(body["tenant"], body["class"], body["demand"])
    if pod.charges is None:
        pod.charges = []
    pod.charges.append((record_ms(body["time"]), charge[0]))


def _charged_spans(pod: _Pod, a: int, b: int) -> list[tuple[int, int, str]]:
    """``[a, b)`` cut where ``pod``'s charge changes: ``(start, end, demand)`` spans, each
    billed the last charge recorded at or before its start (the pod's demand before
    any)."""
    if not pod.charges:
        return [(a, b, pod.demand)]
    changes = sorted(pod.charges, key=lambda change: change[0])  # clocks may interleave
    spans: list[tuple[int, int, str]] = []
    at = bisect.bisect_right(changes, a, key=lambda change: change[0])
    current = changes[at - 1][1] if at else pod.demand
    start = a
    for when, text in changes[at:]:
        if when >= b:
            break
        if when > start:
            spans.append((start, when, current))
            start = when
        current = text
    spans.append((start, b, current))
    return spans


@functools.lru_cache(maxsize=4096)
def _demand(text: str) -> tuple[tuple[str, int], ...]:
    """``(resource, slices)`` of a demand text, sorted (empty: not a demand fairgate
    writes, nothing to bill). Pods share a handful of demands: parsed once each."""
    try:
        counts = resources.parse_counts(text)
    except ValueError:
        return ()
    by_resource: dict[str, int] = {}  # capacity keys (gpu@pool, ...) bill as their resource
    for name, n in counts.items():
        base = resources.base_of(name)
        by_resource[base] = by_resource.get(base, 0) + resources.slices_of(name) * n
    return tuple(sorted(by_resource.items()))


def _slices(demand: str) -> int:
    return sum(slices for _, slices in _demand(demand))


def _slices_of_counts(counts: Mapping[str, int]) -> int:
    return sum(resources.slices_of(name) * n for name, n in counts.items()
               if resources.is_known(resources.base_of(name)))


def _cost(prices: _Prices, breaks: list[int], product: str | None, slices: int,
          a: int, b: int) -> float:
    """Cost of ``slices`` of ``product`` over ``[a, b)`` ms, split at price changes."""
    total = 0.0
    cut = bisect.bisect_right(breaks, a)
    while a < b:
        end = min(breaks[cut], b) if cut < len(breaks) else b
        total += slices * (end - a) * prices.segment_price(product, cut)
        a, cut = end, cut + 1
    return total / SLICES / MS_PER_HOUR


def _idle(capacity: list[tuple[int, int]], used: list[tuple[int, int, int]],
          prices: _Prices, breaks: list[int], lo: int,
          hi: int) -> tuple[float | None, float | None, float | None]:
    """Capacity hours, idle hours and idle cost (default price) where capacity is known."""
    if not capacity or capacity[0][0] >= hi:
        return None, None, None
    known = max(lo, capacity[0][0])
    capacity_ms = capacity_cost = 0.0
    for i, (at, slices) in enumerate(capacity):
        a = max(at, known)
        b = min(capacity[i + 1][0] if i + 1 < len(capacity) else hi, hi)
        if b > a:
            capacity_ms += slices * (b - a)
            capacity_cost += _cost(prices, breaks, None, slices, a, b)
    used_ms = used_cost = 0.0
    for a, b, slices in used:
        a = max(a, known)
        if b > a:
            used_ms += slices * (b - a)
            used_cost += _cost(prices, breaks, None, slices, a, b)
    capacity_hours = capacity_ms / SLICES / MS_PER_HOUR
    idle_hours = max(0.0, (capacity_ms - used_ms) / SLICES / MS_PER_HOUR)
    return capacity_hours, idle_hours, max(0.0, capacity_cost - used_cost)
