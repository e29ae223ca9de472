"""``fairgate simulate``: replay a trace through the real queue on a virtual clock.

Contract:
- :func:`run_simulation` runs the real :class:`~fairshare.queue.fairqueue.FairQueue` (its Lua
  scripts, in a real Redis: ``redis_target``, or a private ``redis-server`` started for the
  run) behind the real :class:`~fairshare.dispatcher.Dispatcher`, against a
  :class:`~fairshare.sim.simcluster.SimulatedCluster` (pods run for their duration; the
  kube-scheduler's preemption is modelled). Time is virtual and event-driven: arrivals
  and completions are events, and after every event the dispatcher runs until nothing
  changes. Keys live under a private prefix that is deleted afterwards, so a shared
  Redis is never disturbed.
- The :class:`SimulationReport` (``to_json`` is the ``--json`` object of
  docs/reference.md): ``jain_index``: over the whole run,
  :func:`~fairshare.queue.entitlement.entitled_jain` of each tenant's GPU-seconds /
  entitled GPU-seconds (the integral of its entitlement, below), None when not defined
  (fewer than two tenants were ever entitled to something, or none ran anything): the
  same figure as ``fairgate status`` and the fairness gauge. ``utilization``: used /
  capacity slice-seconds over busy time (a pod running or waiting). ``wait_seconds``:
  per class, p50/p99/max of creation-to-start; a pod still waiting at the horizon
  counts with the wait so far.
  ``tenants``: weight, share (fraction of all slice-seconds used), admitted (pods
  released that started), waiting (pods not started at the horizon), each pod counted
  once, a preempted one as its re-creation (so admitted + waiting is at most the pods
  submitted), ``gpu_hours`` (GPU-equivalent hours run, slices / 7) and ``cost`` (those
  hours at the trace's ``pricing`` default price, the trace's GPUs having no product;
  None without ``pricing``); ``preemption``: ``pods`` preempted by the modelled
  scheduler and ``gpu_hours_lost``, the GPU-equivalent hours they had run when
  preempted; ``reclaim``: ``pods`` reclaimed (``fairShare.reclaim``: the real
  dispatcher's rule, :func:`fairshare.reclaim.choose`, evicting through the simulated
  cluster), ``gpu_hours_lost`` (the GPU-equivalent hours they had run) and
  ``min_run_seconds`` (the shortest any had run; 0 when none was); zeros when reclaim is
  off. With reclaim on, the dispatcher also wakes every ``reclaim_every`` virtual
  seconds while a pod waits (not only at arrivals and completions), as it does in a
  cluster. ``waited``: per class, how many pods did not start the instant they were
  created (still waiting at the horizon included); ``window``: the window measures
  below; ``gangs``: every gang, each its :class:`~fairshare.sim.gangs.GangReport`
  (``namespace``, ``group``, ``tenant``, ``size``, ``arrived_at``, ``released_at``, null
  unless all its pods were released, ``wait_seconds``, ``ran_seconds``, ``outcome``: see
  :mod:`fairshare.sim.gangs`; an empty list for a trace without gangs). Extra
  attributes for tests and capacity planning: ``backlogged_utilization`` (utilisation
  of the resources that waiting pods ask for, while they wait), ``gang_violations``
  (the gangs partly released), ``quota_violations`` (invariant 1, checked after every event, the
  first ten), ``preemptions``, and ``timeline`` when asked for (``timeline_every``).
- The timeline samples every tenant at 0, N, 2N, ... virtual seconds and at the horizon,
  after the events of that instant: ``allocated`` is what its running pods hold (and
  ``by_class``, the same per class), and ``entitlement`` its fair share at that instant
  (:func:`fairshare.queue.entitlement.fairness` per placement class: each capacity key
  among the tenants with running or waiting pods in it, each capped at running +
  waiting, summed per tenant and capped at nominal + borrow limit; the
  ``fairgate_tenant_fair_share`` gauge still splits the whole capacity, not knowing the
  tenants' demand per class). See :mod:`fairshare.sim.timeline`.
- The window measures (:class:`WindowReport`, over a :class:`Window`, default the whole
  run) integrate, between events (when nothing changes), per tenant: the GPU-seconds
  its running pods hold, by class; that same entitlement (so ``entitled_gpu_seconds``
  is the integral of the timeline's ``entitlement``: idle time earns nothing); the
  seconds it had a pod waiting (``backlogged_seconds``: equal to the window's length
  when it was backlogged throughout). Plus utilisation while a pod waits, the capacity
  held idle for owed entries (drains) while a pod waits, and Jain's index of GPU-seconds
  / entitled GPU-seconds. A pod's GPU-time counts where it runs,
  so a pod running across a window edge counts in part.
- :func:`simulate_command` is the CLI entry: trace path, ``--json``, ``--redis-url``,
  ``--timeline out.csv``, ``--timeline-every N``, ``--plot out.png``, ``--window FROM:TO``.
  Without ``--json`` it prints :func:`report_tables`; with gangs in the trace, a table
  of them (:func:`gang_table`: the ``GANG_ROWS`` most telling, then how many more).
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fairshare.cluster.cluster import GpuPod
from fairshare.connection import RedisTarget, connect_redis
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.localredis import local_redis
from fairshare.queue.entitlement import (
    Fairness,
    TenantFairness,
    TenantLoad,
    entitled_jain,
    fairness,
    jain_text,
    slices_by_key,
)
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.sim.autoscaler import SimAutoscaler
from fairshare.sim.gangs import (
    OUTCOME_WORDS,
    GangReport,
    gang_reports,
    gang_violations,
    most_telling,
)
from fairshare.sim.simcluster import Placement, PodHistory, PodSpec, SimulatedCluster, VirtualClock
from fairshare.sim.timeline import (
    PlotUnavailableError,
    TimelineRow,
    plot,
    require_matplotlib,
    write_csv,
)
from fairshare.sim.trace import Trace, TracePod, load_trace
from tenants import resources
from tenants.models import CLASSES, FairgateConfig
from tenants.schema import ConfigError
from tenants.tables import tenant_table

# Virtual seconds between dispatcher chores; a reconcile is never needed in a simulation.
_SETTINGS = DispatcherSettings(
    expire_every=5.0, reconcile_every=math.inf, status_every=math.inf,
    queued_events_per_pass=0, lift_workers=1,  # lifts in release order: reproducible runs
    service_every=0.0,  # a Redis loss between two steps resumes exactly (tests flush it)
)
_MAX_SETTLE_ROUNDS = 10_000

ProgressHook = Callable[[float], None]  # called with the virtual time


@dataclass(frozen=True)
class WaitStats:
    """Wait percentiles of one class, in seconds."""

    p50: float
    p99: float
    max: float


@dataclass(frozen=True)
class TenantReport:
    """One tenant's outcome."""

    weight: float
    share: float
    admitted: int
    waiting: int
    gpu_hours: float = 0.0
    cost: float | None = None  # None: the trace has no pricing


@dataclass(frozen=True)
class SimulationReport:
    """What a simulation measured (see the module docstring)."""

    jain_index: float | None
    utilization: float
    wait_seconds: dict[str, WaitStats]
    tenants: dict[str, TenantReport]
    backlogged_utilization: float = 1.0
    gang_violations: list[str] = field(default_factory=list)
    gangs: list[GangReport] = field(default_factory=list)
    quota_violations: list[str] = field(default_factory=list)
    preemptions: int = 0
    preempted_gpu_hours: float = 0.0
    reclaims: int = 0
    reclaimed_gpu_hours: float = 0.0
    reclaim_min_run: float = 0.0  # seconds: the shortest run of a reclaimed pod
    horizon: float = 0.0
    timeline: list[TimelineRow] = field(default_factory=list)
    waited: dict[str, int] = field(default_factory=dict)  # pods per class that waited
    window: WindowReport | None = None
    autoscaling_requests: int = 0
    provisioned_gpus: float = 0.0
    provisioning_waits: list[float] = field(default_factory=list)  # seconds, per request

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object: exactly the keys of docs/reference.md."""
        return {
            "jain_index": _ratio(self.jain_index),
            "utilization": round(self.utilization, 4),
            "wait_seconds": {
                cls: {"p50": round(w.p50, 3), "p99": round(w.p99, 3), "max": round(w.max, 3)}
                for cls, w in self.wait_seconds.items()
            },
            "tenants": {
                name: {"weight": t.weight, "share": round(t.share, 4), "admitted": t.admitted,
                       "waiting": t.waiting, "gpu_hours": round(t.gpu_hours, 4),
                       "cost": None if t.cost is None else round(t.cost, 2)}
                for name, t in self.tenants.items()
            },
            "preemption": {"pods": self.preemptions,
                           "gpu_hours_lost": round(self.preempted_gpu_hours, 4)},
            "reclaim": {"pods": self.reclaims,
                        "gpu_hours_lost": round(self.reclaimed_gpu_hours, 4),
                        "min_run_seconds": round(self.reclaim_min_run, 3)},
            "waited": dict(self.waited),
            "window": None if self.window is None else _window_json(self.window),
            "autoscaling": {
                "requests": self.autoscaling_requests,
                "provisioned_gpus": round(self.provisioned_gpus, 2),
                "wait_seconds": {"p50": round(_percentile(self.provisioning_waits, 0.5), 3),
                                 "max": round(max(self.provisioning_waits, default=0.0), 3)}},
            "gangs": [_gang_json(gang) for gang in self.gangs],
        }


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _gang_json(gang: GangReport) -> dict[str, Any]:
    return {
        "namespace": gang.namespace, "group": gang.group, "tenant": gang.tenant,
        "size": gang.size, "arrived_at": round(gang.arrived, 3),
        "released_at": None if gang.released is None else round(gang.released, 3),
        "wait_seconds": round(gang.wait, 3), "ran_seconds": round(gang.ran, 3),
        "outcome": gang.outcome,
    }


def _window_json(window: WindowReport) -> dict[str, Any]:
    return {
        "from": window.start, "to": window.end,
        "utilization": round(window.utilization, 4),
        "held_idle": round(window.held_idle, 4),
        "jain_index": _ratio(window.jain_index),
        "tenants": {
            name: {"gpu_seconds": round(t.gpu_seconds, 3),
                   "gpu_seconds_by_class": {cls: round(v, 3)
                                            for cls, v in t.gpu_seconds_by_class.items()},
                   "entitled_gpu_seconds": round(t.entitled_gpu_seconds, 3),
                   "of_entitlement": _ratio(t.of_entitlement),
                   "backlogged_seconds": round(t.backlogged_seconds, 3)}
            for name, t in window.tenants.items()
        },
    }


@dataclass(frozen=True)
class Window:
    """The span of virtual time the window measures cover: ``start`` to ``end`` seconds
    (``end`` None: the horizon)."""

    start: float = 0.0
    end: float | None = None

    def __post_init__(self) -> None:
        if not self.start >= 0 or (self.end is not None and not self.end > self.start):
            raise ValueError(f"a window needs 0 <= FROM < TO, got {self.start:g}:"
                             f"{'' if self.end is None else f'{self.end:g}'}")


@dataclass(frozen=True)
class TenantWindow:
    """One tenant over the window: GPU-seconds (GPU-equivalents x seconds) its running
    pods held, by class; the integral of its entitlement; seconds it had a pod waiting."""

    gpu_seconds_by_class: dict[str, float]
    entitled_gpu_seconds: float
    backlogged_seconds: float

    @property
    def gpu_seconds(self) -> float:
        return sum(self.gpu_seconds_by_class.values())

    @property
    def of_entitlement(self) -> float | None:
        """GPU-seconds / entitled GPU-seconds (None when entitled to nothing)."""
        entitled = self.entitled_gpu_seconds
        return self.gpu_seconds / entitled if entitled > 0 else None


@dataclass(frozen=True)
class WindowReport:
    """Every tenant against its integrated entitlement over ``start`` .. ``end``.

    ``utilization``: used / capacity over the time in the window when a pod waited (1.0
    when none did); ``held_idle``: over that same time, the capacity the queue held idle
    for entries owed it (a drain for a pod that does not fit yet), as a fraction of the
    capacity (so ``utilization + held_idle <= 1``; the rest was idle with nothing waiting
    that fits it); ``jain_index``: :func:`~fairshare.queue.entitlement.entitled_jain` of
    ``of_entitlement`` (1.0 when all got exactly their entitlement, None: n/a)."""

    start: float
    end: float
    tenants: dict[str, TenantWindow]
    utilization: float
    jain_index: float | None
    held_idle: float = 0.0


def _gpu(slices: float) -> float:
    return slices / resources.SLICES_PER_GPU


class _Meter:
    """Integrates usage, busy time and backlog over virtual time, and over the window
    each tenant's usage by class, entitlement and backlogged time."""

    def __init__(self, trace: Trace, config: FairgateConfig, window: Window) -> None:
        self.capacity = 0
        self.capacity_of: dict[str, int] = {}
        self._capacity(trace.capacity)
        self.weights = {name: t.weight for name, t in trace.tenants.items()}
        self.limits: dict[str, int | None] = {}
        for name in trace.tenants:
            tenant = config.tenant(name)
            self.limits[name] = tenant.nominal_slices + tenant.borrow_slices if tenant else None
        self.used_seconds = dict.fromkeys(self.weights, 0.0)  # slice-seconds
        self.entitled_seconds = dict.fromkeys(self.weights, 0.0)  # GPU-seconds
        self.busy_time = 0.0
        self.busy_used = 0.0
        self.busy_capacity = 0.0  # capacity slice-seconds while busy
        self.window_waiting_capacity = 0.0
        self.waiting_capacity = 0.0  # slice-seconds of resources that pods waited for
        self.waiting_used = 0.0
        self.window_start = float(window.start)
        self.window_end = trace.horizon if window.end is None else min(float(window.end),
                                                                        trace.horizon)
        # over the window: slice-seconds by (tenant, class), entitled GPU-seconds,
        # seconds with a pod waiting; used and capacity slice-seconds while pods wait
        self.window_used: dict[tuple[str, str], float] = {}
        self.window_entitled = dict.fromkeys(self.weights, 0.0)
        self.window_backlogged = dict.fromkeys(self.weights, 0.0)
        self.window_waiting_used = 0.0
        self.window_waiting_time = 0.0
        self.window_held_idle = 0.0  # slice-seconds held idle for owed entries while pods wait
        # at given instants: every tenant's used slice-seconds and entitled GPU-seconds so far
        self.marks: dict[float, tuple[dict[str, float], dict[str, float]]] = {}

    def _capacity(self, counts: Mapping[str, int]) -> None:
        self.capacity_of = slices_by_key(counts)
        self.capacity = sum(self.capacity_of.values())

    def fairness(self, cluster: SimulatedCluster) -> Fairness:
        """Every tenant's allocation and entitlement now (see the module docstring)."""
        running, waiting = cluster.running_slices(), cluster.waiting_slices()
        inference = cluster.inference_slices()
        by_key: dict[str, dict[str, int]] = {name: {} for name in self.weights}
        inference_by_key: dict[str, dict[str, int]] = {name: {} for name in self.weights}
        for (tenant, key, pod_class), n in cluster.demand_by_key().items():
            by_key[tenant][key] = by_key[tenant].get(key, 0) + n
            if pod_class == "inference":
                inference_by_key[tenant][key] = inference_by_key[tenant].get(key, 0) + n
        loads = {
            name: TenantLoad(weight, running.get(name, 0), waiting.get(name, 0),
                             self.limits[name], inference.get(name, 0),
                             by_key[name], inference_by_key[name])
            for name, weight in self.weights.items()
        }
        return fairness(self.capacity, loads, self.capacity_of)

    def interval(self, start: float, end: float, cluster: SimulatedCluster,
                 held: int = 0) -> None:
        """Account for ``start`` .. ``end``, over which ``cluster`` did not change and the
        queue held ``held`` idle slices for entries owed them."""
        dt = end - start
        if dt <= 0:
            return
        self._capacity(cluster.capacity())  # autoscaled pools grow
        usage = cluster.running_slices()
        used_units = cluster.used()
        waiting = cluster.waiting_tenants()
        total = sum(usage.values())
        for tenant, used in usage.items():
            self.used_seconds[tenant] += used * dt
        if total or waiting:
            self.busy_time += dt
            self.busy_used += total * dt
            self.busy_capacity += self.capacity * dt
        for name in cluster.wanted_resources():
            self.waiting_capacity += self.capacity_of.get(name, 0) * dt
            self.waiting_used += used_units.get(name, 0) * resources.slices_of(name) * dt
        fair = self.fairness(cluster).tenants if total or waiting else {}
        for name, share in fair.items():
            self.entitled_seconds[name] += share.entitlement * dt
        inside = min(end, self.window_end) - max(start, self.window_start)
        if inside > 0:
            self._window(inside, cluster, waiting, total, fair, held)

    def _window(self, dt: float, cluster: SimulatedCluster, waiting: set[str],
                total: int, fair: dict[str, TenantFairness], held: int) -> None:
        for key, used in cluster.running_slices_by_class().items():
            self.window_used[key] = self.window_used.get(key, 0.0) + used * dt
        for name, share in fair.items():
            self.window_entitled[name] += share.entitlement * dt
        for tenant in waiting:
            self.window_backlogged[tenant] += dt
        if waiting:
            self.window_waiting_time += dt
            self.window_waiting_used += total * dt
            self.window_waiting_capacity += self.capacity * dt
            self.window_held_idle += held * dt

    def mark(self, at: float) -> None:
        """Remember every tenant's usage and entitlement integrated up to ``at`` (now)."""
        self.marks[at] = (dict(self.used_seconds), dict(self.entitled_seconds))

    def since(self, at: float) -> dict[str, tuple[float, float]]:
        """Per tenant: GPU-seconds used and entitled GPU-seconds from the mark at ``at``
        to now (KeyError: no mark there)."""
        used, entitled = self.marks[at]
        return {name: (_gpu(self.used_seconds[name] - used[name]),
                       self.entitled_seconds[name] - entitled[name]) for name in self.weights}

    def window(self) -> WindowReport:
        tenants = {
            name: TenantWindow(
                gpu_seconds_by_class={
                    cls: _gpu(self.window_used.get((name, cls), 0.0)) for cls in CLASSES
                },
                entitled_gpu_seconds=self.window_entitled[name],
                backlogged_seconds=self.window_backlogged[name],
            )
            for name in self.weights
        }
        busy = self.window_waiting_capacity
        return WindowReport(
            start=self.window_start, end=self.window_end, tenants=tenants,
            utilization=self.window_waiting_used / busy if busy else 1.0,
            jain_index=entitled_jain(t.of_entitlement for t in tenants.values()),
            held_idle=self.window_held_idle / busy if busy else 0.0,
        )

    def jain(self) -> float | None:
        """The headline: entitled_jain of the whole run's GPU-seconds / entitled GPU-seconds."""
        return entitled_jain(
            _gpu(self.used_seconds[t]) / entitled if (entitled := self.entitled_seconds[t]) > 0
            else None for t in self.weights)

    def utilization(self) -> float:
        busy = self.busy_capacity
        return self.busy_used / busy if busy else 1.0

    def waiting_utilization(self) -> float:
        return self.waiting_used / self.waiting_capacity if self.waiting_capacity else 1.0


def quota_violations(config: FairgateConfig, pods: Iterable[GpuPod]) -> list[str]:
    """Invariant 1 over the pods holding quota (released, not ended): per tenant,
    non-borrowed usage per resource <= nominal, non-borrowed training slices <= nominal
    minus the inference reserve, training and borrowed slices <= nominal minus the
    reserve plus the borrow limit, all slices <= nominal plus the borrow limit (a
    borrowed pod may stand in nominal room that training leaves unused)."""
    held: dict[str, list[GpuPod]] = {}
    for pod in pods:
        if pod.holds_capacity:
            held.setdefault(pod.tenant, []).append(pod)
    problems: list[str] = []
    for name, mine in sorted(held.items()):
        tenant = config.tenant(name)
        if tenant is None:
            problems.append(f"{name}: pods hold GPUs but the tenant is unknown")
            continue
        per_resource: dict[str, int] = {}
        for pod in mine:
            if pod.band != "borrowed":
                for key, n in pod.demand.items():  # quota counts resources, not classes
                    resource = resources.base_of(key)
                    per_resource[resource] = per_resource.get(resource, 0) + n
        for resource, n in sorted(per_resource.items()):
            if n > tenant.nominal.get(resource, 0):
                problems.append(f"{name}: {resource}={n} above nominal "
                                f"{tenant.nominal.get(resource, 0)}")
        training = sum(p.slices for p in mine if p.band == "training")
        if training > tenant.nominal_slices - tenant.reserve_slices:
            problems.append(f"{name}: training {training} slices above nominal minus reserve")
        borrowed = sum(p.slices for p in mine if p.band == "borrowed")
        if training + borrowed > tenant.nominal_slices - tenant.reserve_slices \
                + tenant.borrow_slices:
            problems.append(f"{name}: training and borrowed {training + borrowed} slices "
                            f"above nominal minus reserve plus borrowLimit")
        total = sum(p.slices for p in mine)
        if total > tenant.nominal_slices + tenant.borrow_slices:
            problems.append(f"{name}: {total} slices above nominal plus borrowLimit")
    return problems


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _report(
    trace: Trace, meter: _Meter, cluster: SimulatedCluster, violations: list[str],
    timeline: list[TimelineRow], autoscaler: SimAutoscaler | None,
) -> SimulationReport:
    end = trace.horizon
    waits: dict[str, list[float]] = {cls: [] for cls in CLASSES}
    waited: dict[str, int] = dict.fromkeys(CLASSES, 0)
    admitted = dict.fromkeys(trace.tenants, 0)
    waiting = dict.fromkeys(trace.tenants, 0)
    for record in cluster.history.values():
        spec = record.spec
        # Each pod once: a preempted one is counted as its re-creation (its controller's).
        if record.started is None and record.ended is None:
            waiting[spec.tenant] += 1
        elif record.released is not None and not record.preempted and not record.reclaimed:
            admitted[spec.tenant] += 1
        if record.started is not None:
            wait = record.started - record.created
        elif record.ended is None:
            wait = end - record.created
        else:
            continue  # deleted before it started
        waits[spec.pod_class].append(wait)
        waited[spec.pod_class] += wait > 0
    total_used = sum(meter.used_seconds.values())

    def runs(taken: Callable[[PodHistory], bool]) -> list[tuple[float, int]]:
        """(seconds run, slices) of the pods ``taken`` ended before their end."""
        return [(r.ended - r.started, resources.total_slices(r.spec.demand))
                for r in cluster.history.values()
                if taken(r) and r.started is not None and r.ended is not None]

    lost = sum(ran * n for ran, n in runs(lambda r: r.preempted))
    reclaimed = runs(lambda r: r.reclaimed)
    price = trace.pricing.price(None) if trace.pricing is not None else None

    def gpu_hours(slice_seconds: float) -> float:
        return slice_seconds / resources.SLICES_PER_GPU / 3600

    return SimulationReport(
        jain_index=meter.jain(),
        utilization=meter.utilization(),
        wait_seconds={
            cls: WaitStats(_percentile(v, 0.5), _percentile(v, 0.99), max(v, default=0.0))
            for cls, v in waits.items() if v
        },
        tenants={
            name: TenantReport(
                weight=t.weight,
                share=meter.used_seconds[name] / total_used if total_used else 0.0,
                admitted=admitted[name],
                waiting=waiting[name],
                gpu_hours=gpu_hours(meter.used_seconds[name]),
                cost=None if price is None else gpu_hours(meter.used_seconds[name]) * price,
            )
            for name, t in trace.tenants.items()
        },
        backlogged_utilization=meter.waiting_utilization(),
        gang_violations=gang_violations(cluster.history),
        gangs=gang_reports(cluster.history, end),
        quota_violations=violations,
        preemptions=cluster.preemptions,
        preempted_gpu_hours=gpu_hours(lost),
        reclaims=cluster.reclaims,
        reclaimed_gpu_hours=gpu_hours(sum(ran * n for ran, n in reclaimed)),
        reclaim_min_run=min((ran for ran, _ in reclaimed), default=0.0),
        horizon=end,
        timeline=timeline,
        waited=waited,
        window=meter.window(),
        autoscaling_requests=len(autoscaler.requests) if autoscaler else 0,
        provisioned_gpus=autoscaler.provisioned_gpus() if autoscaler else 0.0,
        provisioning_waits=autoscaler.waits(
            {uid: r.started for uid, r in cluster.history.items()}, end) if autoscaler else [],
    )


@contextmanager
def _redis(redis_target: RedisTarget | str | None) -> Iterator[RedisTarget]:
    if redis_target:
        yield RedisTarget.of(redis_target)
    else:
        with local_redis() as url:
            yield RedisTarget(url)


class Simulation:
    """One run of a trace; :meth:`run` drives it to the horizon."""

    def __init__(self, trace: Trace, client: redis.Redis, prefix: str,
                 window: Window | None = None) -> None:
        """Set up queue, dispatcher and cluster on ``client`` under ``prefix``;
        ``window``: what the window measures cover (default: the whole run)."""
        self.trace = trace
        self.clock = VirtualClock(0.0)
        self.queue = FairQueue(client, prefix=prefix)
        config = trace.config()
        self.cluster = SimulatedCluster(dict(trace.capacity), self._admit, self.clock)
        self.autoscaler = None if trace.autoscaling is None else SimAutoscaler(
            self.cluster, self.clock, trace.autoscaling.provision_seconds,
            trace.autoscaling.max_capacity)
        self.dispatcher = Dispatcher(self.queue, self.cluster, lambda: config,
                                     clock=self.clock, settings=_SETTINGS,
                                     provisioner=self.autoscaler, evictor=self.cluster)
        # with reclaim on, the dispatcher's reclaim checks while a pod waits
        self._reclaim_every = (_SETTINGS.reclaim_every
                               if config.platform.fair_share.reclaim is not None else None)
        self.meter = _Meter(trace, config, window or Window())
        self.config = config
        self.quota_violations: list[str] = []
        self._held = 0  # slices the queue holds idle for owed entries, since the last event
        self._marks: list[float] = []  # instants still to mark (meter.mark), latest first
        self._arrivals = trace.pods()
        self._next = 0
        self.dispatcher.sync(force=True)

    def _admit(self, spec: PodSpec, uid: str) -> Placement:
        now = self.clock()
        request = PodRequest(
            ticket=uid, tenant=spec.tenant, namespace=spec.namespace, name=spec.name,
            pod_class=spec.pod_class, demand=dict(spec.demand), group=spec.group,
            group_size=spec.group_size if spec.group else 1, submitted_at=now,
            run_seconds=spec.run_seconds,
        )
        admission = self.queue.admit(request, now)
        return Placement(uid, admission.band, admission.outcome == "queued")

    def settle(self) -> None:
        """Run the dispatcher until the cluster reports no more changes."""
        for _ in range(_MAX_SETTLE_ROUNDS):
            result = self.dispatcher.step()
            if not result.released and not result.requeued and not self.cluster.has_changes():
                return
        raise RuntimeError("the dispatcher did not settle: it keeps releasing or requeuing")

    def advance(self, until: float, progress: ProgressHook | None = None) -> None:
        """Replay every arrival and completion up to ``until`` (at most the horizon)."""
        until = min(until, self.trace.horizon)
        while True:
            pending = self._arrivals[self._next] if self._next < len(self._arrivals) else None
            next_end = self.cluster.next_completion()
            nodes = self.autoscaler.next_due() if self.autoscaler is not None else None
            when = min(pending.at if pending is not None else math.inf,
                       next_end if next_end is not None else math.inf,
                       nodes if nodes is not None else math.inf,
                       self._next_reclaim_check())
            if self._marks and self._marks[-1] < when and self._marks[-1] <= until:
                # a mark between events: nothing happens then
                at = self._marks.pop()
                self.meter.interval(self.clock(), at, self.cluster, self._held)
                self.clock.advance_to(at)
                self.meter.mark(at)
                continue
            if when > until:
                break
            self.meter.interval(self.clock(), when, self.cluster, self._held)
            self.clock.advance_to(when)
            while self._marks and self._marks[-1] <= when:
                self.meter.mark(self._marks.pop())
            self.cluster.advance()
            if self.autoscaler is not None:
                self.autoscaler.provision_due(when)
            while self._next < len(self._arrivals) and self._arrivals[self._next].at <= when:
                self.cluster.create_pod(_spec(self._arrivals[self._next]))
                self._next += 1
            self.settle()
            self._held = self._held_idle(when)
            if len(self.quota_violations) < 10:
                self.quota_violations += [
                    f"t={when:g}: {problem}"
                    for problem in quota_violations(self.config, self.cluster.holding_pods())
                ]
            if progress is not None:
                progress(when)
        self.meter.interval(self.clock(), until, self.cluster, self._held)
        self.clock.advance_to(until)

    def mark_at(self, times: Iterable[float]) -> None:
        """Have the meter mark (:meth:`_Meter.mark`) each of ``times`` (not past yet),
        before the arrivals of that instant; ``self.meter.since(t)`` then integrates from
        it."""
        now = self.clock()
        self._marks = sorted({*self._marks, *(t for t in times if t >= now)}, reverse=True)

    def _held_idle(self, now: float) -> int:
        """The slices the queue holds idle at ``now`` for entries owed them (none
        read while nothing waits or nothing is free)."""
        if not self.cluster.waiting_tenants() or not _free(self.cluster):
            return 0
        return sum(resources.slices_of(key) * n
                   for hold in self.queue.holds(now) for key, n in hold.held.items())

    def _next_reclaim_check(self) -> float:
        """When the dispatcher next checks for reclaim while a pod waits (inf: reclaim
        off, or nothing waits)."""
        if self._reclaim_every is None or not self.cluster.waiting_tenants():
            return math.inf
        return self.clock() + self._reclaim_every

    def sample(self) -> list[TimelineRow]:
        """Every tenant's allocation and entitlement now (see the module docstring)."""
        by_class = self.cluster.running_slices_by_class()
        now = self.clock()
        return [
            TimelineRow(now, name, t.used, t.entitlement,
                        {cls: _gpu(by_class.get((name, cls), 0)) for cls in CLASSES})
            for name, t in self.meter.fairness(self.cluster).tenants.items()
        ]

    def run(
        self, progress: ProgressHook | None = None, timeline_every: float | None = None
    ) -> SimulationReport:
        """Replay the rest of the trace up to the horizon and report; with
        ``timeline_every`` (virtual seconds, > 0), sample the timeline on the way."""
        timeline: list[TimelineRow] = []
        if timeline_every is not None:
            if timeline_every <= 0:
                raise ValueError(f"timeline_every must be > 0 seconds, got {timeline_every}")
            step = 0
            while (at := step * timeline_every) < self.trace.horizon:
                self.advance(at, progress)
                timeline += self.sample()
                step += 1
        self.advance(self.trace.horizon, progress)
        if timeline_every is not None:
            timeline += self.sample()
        return _report(self.trace, self.meter, self.cluster, self.quota_violations, timeline,
                       self.autoscaler)


def _free(cluster: SimulatedCluster) -> bool:
    """Whether some capacity of ``cluster`` is not in use."""
    used = cluster.used()
    return any(n > used.get(key, 0) for key, n in cluster.capacity().items())


def _spec(pod: TracePod) -> PodSpec:
    return PodSpec(
        namespace=f"{pod.tenant}-sim", name=pod.name, tenant=pod.tenant,
        pod_class=pod.pod_class, demand=dict(pod.demand), duration=pod.duration,
        group=pod.group, group_size=pod.group_size, preemptible=pod.preemptible,
        run_seconds=pod.run_seconds,
    )


def run_simulation(
    trace: Trace, redis_target: RedisTarget | str | None = None,
    progress: ProgressHook | None = None, timeline_every: float | None = None,
    window: Window | None = None,
) -> SimulationReport:
    """Simulate ``trace`` (starting a private redis-server when ``redis_target`` is None);
    ``timeline_every``: see :meth:`Simulation.run`; ``window``: the span the window
    measures cover (default: the whole run)."""
    with _redis(redis_target) as target:
        client = connect_redis(target, timeout=None)
        prefix = f"fairgate:sim:{uuid.uuid4().hex[:12]}:"
        try:
            return Simulation(trace, client, prefix, window).run(progress, timeline_every)
        finally:
            for keys in _batches(client.scan_iter(match=f"{prefix}*", count=1000), 500):
                client.delete(*keys)
            client.close()


def _batches(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def report_tables(report: SimulationReport) -> list[Table]:
    """The report as tables that fit 80 columns: the summary, the waits per class, the
    tenants, the gangs and the window measures when the report has them."""
    summary = Table(title="fairgate simulation", show_header=False)
    summary.add_row("Jain's index (GPU-time / entitlement)", jain_text(report.jain_index))
    summary.add_row("utilisation (busy time)", f"{report.utilization:.1%}")
    summary.add_row("utilisation (while pods wait)", f"{report.backlogged_utilization:.1%}")
    summary.add_row("preempted pods (GPU-h they had run)",
                    f"{report.preemptions} ({report.preempted_gpu_hours:.2f})")
    if report.reclaims:
        summary.add_row("reclaimed pods (GPU-h they had run; shortest run)",
                        f"{report.reclaims} ({report.reclaimed_gpu_hours:.2f}; "
                        f"{report.reclaim_min_run:g}s)")
    if report.gang_violations:
        summary.add_row("gangs partly released", ", ".join(report.gang_violations))
    if report.quota_violations:
        summary.add_row("quota exceeded", "; ".join(report.quota_violations))
    waits = tenant_table("wait from creation to start (s)", ("class", "p50", "p99", "max"))
    for cls, w in report.wait_seconds.items():
        waits.add_row(cls, f"{w.p50:.1f}", f"{w.p99:.1f}", f"{w.max:.1f}")
    tenants = tenant_table("tenants", ("tenant", "weight", "share", "per weight", "admitted",
                                       "waiting", "GPU-h", "cost"),
                           caption="share: of the GPU-time used; per weight: share / weight; "
                           "waiting: pods not started at the end; GPU-h: GPU-equivalent hours")
    for name, t in report.tenants.items():
        tenants.add_row(name, f"{t.weight:g}", f"{t.share:.1%}", f"{t.share / t.weight:.3f}",
                        str(t.admitted), str(t.waiting), f"{t.gpu_hours:.2f}",
                        "-" if t.cost is None else f"{t.cost:,.2f}")
    tables = [summary, waits, tenants]
    if report.gangs:
        tables.append(gang_table(report.gangs))
    return tables if report.window is None else [*tables, window_table(report.window)]


def render_report(report: SimulationReport, console: Console) -> None:
    """The report as tables for humans (:func:`report_tables`)."""
    for table in report_tables(report):
        console.print(table)


GANG_ROWS = 10  # the gang table's rows at most; --json lists every gang


def gang_table(gangs: Sequence[GangReport]) -> Table:
    """Did each gang run, when, and whole: the :func:`~fairshare.sim.gangs.most_telling`
    ``GANG_ROWS`` of ``gangs``, how many more there are first in the caption, and in the
    title how many gangs had each outcome. A gang is named by its group (its namespace
    is its tenant's, ``<tenant>-sim``), so that the table fits 80 columns."""
    counts = Counter(gang.outcome for gang in gangs)
    tally = ", ".join(f"{counts[outcome]} {words}" for outcome, words in OUTCOME_WORDS.items()
                      if counts[outcome])
    shown, more = most_telling(gangs, GANG_ROWS)
    table = tenant_table(
        f"gangs ({len(gangs)}): {tally}",
        ("gang", "tenant", "size", "arrived", "released", "wait", "ran", "outcome"),
        caption=(f"... and {more} more (--json lists every gang); " if more else "")
        + "gang: its group, in namespace <tenant>-sim (a preempted or reclaimed gang "
        "restarts as <group>-r1); in virtual seconds: arrived (its first pod created), "
        "released (all its pods; - never), wait (arrival to release, or to the end), ran "
        "(first start to last end, or to the end)",
        names=2)
    table.columns[-1].justify = "left"
    for gang in shown:
        table.add_row(gang.group, gang.tenant, str(gang.size), f"{gang.arrived:,.0f}",
                      "-" if gang.released is None else f"{gang.released:,.0f}",
                      f"{gang.wait:,.0f}", f"{gang.ran:,.0f}", OUTCOME_WORDS[gang.outcome])
    return table


def window_table(window: WindowReport) -> Table:
    """The window measures as a table for humans."""
    table = tenant_table(
        f"window {window.start:g}-{window.end:g} s: GPU-time against integrated entitlement "
        f"(Jain {jain_text(window.jain_index)}, utilisation while pods wait "
        f"{window.utilization:.1%}, held idle for drains {window.held_idle:.1%})",
        ("tenant", "used", *CLASSES, "entitled", "used / entitled", "backlog"),
        caption="in GPU-seconds: used, all and per class, and entitled (the entitlement "
        "integrated over the window); backlog: seconds the tenant had a pod waiting")
    for name, t in window.tenants.items():
        ratio = t.of_entitlement
        table.add_row(name, f"{t.gpu_seconds:,.0f}",
                      *(f"{t.gpu_seconds_by_class[cls]:,.0f}" for cls in CLASSES),
                      f"{t.entitled_gpu_seconds:,.0f}", "-" if ratio is None else f"{ratio:.3f}",
                      f"{t.backlogged_seconds:,.0f}")
    return table


DEFAULT_TIMELINE_EVERY = 60.0


def _output_problem(timeline: Path | None, timeline_every: float | None,
                    plot_path: Path | None) -> str | None:
    """What is wrong with the timeline options, before a long run (None: nothing)."""
    if timeline_every is not None and timeline is None and plot_path is None:
        return "--timeline-every needs --timeline out.csv or --plot out.png"
    if timeline_every is not None and timeline_every <= 0:
        return f"--timeline-every must be > 0 seconds, got {timeline_every:g}"
    for option, target in (("--timeline", timeline), ("--plot", plot_path)):
        if target is not None and not target.parent.is_dir():
            return f"{option} {target}: directory {target.parent} does not exist: create it first"
    if plot_path is not None:
        try:
            require_matplotlib()
        except PlotUnavailableError as error:
            return str(error)
    return None


def simulate_command(
    path: Path, json_out: bool, redis_target: RedisTarget | str | None,
    out: TextIO | None = None, err: TextIO | None = None, timeline: Path | None = None,
    timeline_every: float | None = None, plot_path: Path | None = None,
    window: Window | None = None,
) -> int:
    """``fairgate simulate``: 0 on success, 2 for a bad trace or option (also ``--plot``
    without matplotlib, a ``window`` that starts at or after the horizon or ends after
    it), 1 when Redis fails. With ``timeline`` / ``plot_path`` the run is sampled every
    ``timeline_every`` (default 60) virtual seconds and written there."""
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    problem = _output_problem(timeline, timeline_every, plot_path)
    if problem is not None:
        stderr.write(f"fairgate: error: {problem}\n")
        return 2
    every = None
    if timeline is not None or plot_path is not None:
        every = timeline_every if timeline_every is not None else DEFAULT_TIMELINE_EVERY
    try:
        trace = load_trace(path)
    except ConfigError as error:
        stderr.write(f"fairgate: error: {error}\n")
        return 2
    if window is not None and (window.start >= trace.horizon
                               or (window.end is not None and window.end > trace.horizon)):
        stderr.write(f"fairgate: error: --window {window.start:g}:"
                     f"{'' if window.end is None else f'{window.end:g}'} is not inside the "
                     f"trace's horizon 0:{trace.horizon:g}: give FROM < TO <= {trace.horizon:g}"
                     "\n")
        return 2
    try:
        if json_out:
            report = run_simulation(trace, redis_target, timeline_every=every, window=window)
        else:
            with Progress(console=Console(file=stderr), transient=True) as bar:
                task = bar.add_task("simulating", total=trace.horizon)
                report = run_simulation(
                    trace, redis_target, lambda now: bar.update(task, completed=now), every,
                    window,
                )
    except (redis.RedisError, OSError) as error:
        message = str(error) if redis_target is None else RedisTarget.of(redis_target).scrub(
            str(error))
        stderr.write(f"fairgate: error: Redis failed during the simulation: {message}\n")
        return 1
    if timeline is not None:
        write_csv(report.timeline, timeline)
    if plot_path is not None:
        plot(report.timeline, plot_path, f"{path.name}: allocation (solid) vs entitlement "
             "(dashed)", resources.total_slices(trace.capacity) / resources.SLICES_PER_GPU)
    if json_out:
        stdout.write(json.dumps(report.to_json()) + "\n")
    else:
        render_report(report, Console(file=stdout))
    return 0
