"""An in-memory :class:`~fairshare.cluster.cluster.Cluster` for the demo and the simulator.

Contract:
- Capacity is one pool per resource (no nodes). Time comes from a clock callable, virtual
  (:class:`VirtualClock`, moved by the caller) or real (``time.time``).
- :meth:`SimulatedCluster.create_pod` plays the API server plus the webhook: it calls the
  ``admit`` hook it was given (which asks the real queue) and creates the pod gated or
  not. A spec named ``<generateName>*`` is admitted under that name and the pod is named
  ``<generateName>`` plus a suffix afterwards, as the API server names a controller's pod
  after admission. A released pod is scheduled when its demand fits; it runs for its duration and
  then ``Succeeded`` (on :meth:`advance`).
- The kube-scheduler's preemption is modelled: a pending released pod whose
  PriorityClass may preempt (``fairgate-inference``, ``fairgate-training``; never
  ``fairgate-borrowed``) and that does not fit evicts lower-priority running pods that hold
  a resource it needs, lowest priority first, then the newest, until it fits; if even all
  of them would not make room, nobody is evicted and it stays pending. Evicted pods end
  ``Failed`` and are deleted; their controller re-creates them (a new pod, a new admission)
  from scratch (as a Job's controller does).
- It is an :class:`~fairshare.cluster.pod_evict.Evictor` (reclaim): :meth:`evict` ends a
  running pod at once (``Failed``, deleted, no grace period) and its controller
  re-creates it, a new pod queued like any other, for its whole duration again; a gang
  member's replacement joins the gang its controller restarts (the same new group
  name for every member evicted). :attr:`SimulatedCluster.reclaims` counts them.
- A pod with a declared run time (``run_seconds``, its ``activeDeadlineSeconds``) runs
  at most that long: one whose duration is longer is stopped then and ends ``Failed``,
  as the kubelet stops it.
- Every change is reported through :meth:`changes` like a watch would, in order.
- Safe to share between threads (one re-entrant lock around every public method), so the
  demo can run the dispatcher loop beside the code that creates pods.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from fairshare.cluster.cluster import (
    CapacityReport,
    ChangeKind,
    ClusterChange,
    EventType,
    GpuPod,
    LiftOutcome,
    PodRef,
)
from fairshare.cluster.pod_evict import EVICTED, EvictOutcome
from tenants.models import GENERATED_SUFFIX, PodClass, PriorityBand, PriorityClasses
from tenants.resources import slices_of

Clock = Callable[[], float]
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _locked(method: _Method) -> _Method:
    """Run ``method`` holding the cluster's lock (re-entrant: methods call each other)."""

    @functools.wraps(method)
    def wrapper(self: SimulatedCluster, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_Method, wrapper)


class VirtualClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 0.0) -> None:
        """Start at ``start`` seconds."""
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, when: float) -> None:
        """Move forward to ``when`` (never backwards)."""
        self.now = max(self.now, when)


@dataclass(frozen=True)
class PodSpec:
    """What a controller asks for: a GPU pod that runs for ``duration`` seconds."""

    namespace: str
    name: str
    tenant: str
    pod_class: PodClass
    demand: dict[str, int]
    duration: float
    group: str | None = None
    group_size: int = 1
    preemptible: bool = False  # labelled fairgate.io/preemptible: "true"
    run_seconds: int | None = None  # spec.activeDeadlineSeconds: it runs at most this long
    shared: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    claim_names: Mapping[str, str] = field(default_factory=dict)  # claim uid -> its name
    """Shared ResourceClaims it names (claim uid -> devices, counted in ``demand``)."""

    @property
    def runs_for(self) -> float:
        """How long it runs once started: its duration, cut at its declared run time."""
        return self.duration if self.run_seconds is None else min(self.duration,
                                                                  self.run_seconds)


@dataclass(frozen=True)
class Placement:
    """The webhook's answer for a new pod: its ticket, priority band and whether it waits."""

    ticket: str
    band: PriorityBand
    gated: bool


AdmitHook = Callable[[PodSpec, str], Placement]  # (spec, request uid) -> placement


@dataclass(frozen=True)
class PostedEvent:
    """An Event posted on a pod."""

    at: float
    pod: PodRef
    reason: str
    message: str
    type_: EventType


@dataclass
class _SimPod:
    pod: GpuPod
    spec: PodSpec
    seq: int  # creation order (ties of creationTimestamp go to the later pod)
    started: float | None = None
    ends: float | None = None


@dataclass
class PodHistory:
    """What happened to one pod, for reports: creation, release, start and end times."""

    spec: PodSpec
    ticket: str
    band: PriorityBand
    created: float
    released: float | None = None
    started: float | None = None
    ended: float | None = None
    preempted: bool = False
    reclaimed: bool = False


@dataclass
class SimulatedCluster:
    """A cluster in memory; see the module docstring.

    Pods are indexed by state (waiting: gated or released but not placed; running), with
    usage and backlog counted as they change, so a step costs time in proportion to what
    changes, not to how many pods exist.
    """

    capacity_counts: dict[str, int]
    admit: AdmitHook
    clock: Clock
    priority_classes: PriorityClasses = field(default_factory=PriorityClasses)
    keep_events: int = 1000

    def __post_init__(self) -> None:
        self._pods: dict[str, _SimPod] = {}
        self._waiting: dict[str, _SimPod] = {}  # gated, or released and not placed yet
        self._unscheduled: dict[str, _SimPod] = {}  # released and not placed yet
        self._running: dict[str, _SimPod] = {}
        self._used: Counter[str] = Counter()  # units of each resource held by running pods
        self._tenant_slices: Counter[str] = Counter()  # slices held by running pods
        self._class_slices: Counter[tuple[str, PodClass]] = Counter()  # same, by class
        self._waiting_tenants: Counter[str] = Counter()
        self._waiting_slices: Counter[str] = Counter()  # slices asked by waiting pods
        self._waiting_class_slices: Counter[tuple[str, PodClass]] = Counter()  # same, by class
        self._waiting_resources: Counter[str] = Counter()
        # slices held or asked for by running and waiting pods, per (tenant, capacity
        # key, class)
        self._key_slices: Counter[tuple[str, str, PodClass]] = Counter()
        self._ends: list[tuple[float, int, str]] = []  # heap of running pods' end times
        self._changes: list[ClusterChange] = []
        self._uids = itertools.count(1)
        self.events: deque[PostedEvent] = deque(maxlen=self.keep_events)
        self.history: dict[str, PodHistory] = {}
        self.preemptions = 0
        self.reclaims = 0
        self._scheduling = False
        self._lock = threading.RLock()

    # -- the Cluster protocol -----------------------------------------------------------

    @_locked
    def list_pods(self) -> list[GpuPod]:
        """Every pod that exists now (finished pods stay until deleted, like Job pods)."""
        return [sim.pod for sim in self._pods.values()]

    @_locked
    def changes(self, timeout: float) -> list[ClusterChange]:
        """Every change since the last call (never waits: the caller drives time)."""
        batch, self._changes = self._changes, []
        return batch

    @_locked
    def capacity(self) -> dict[str, int]:
        """The pool's capacity."""
        return dict(self.capacity_counts)

    def capacity_report(self) -> CapacityReport:
        """The pool's capacity; a simulated pool has no nodes to leave out."""
        return CapacityReport(self.capacity())

    @_locked
    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        """Ungate ``pod`` and try to schedule it."""
        sim = self._pods.get(pod.uid)
        if sim is None:
            return LiftOutcome.GONE
        if not sim.pod.gated:
            return LiftOutcome.NOT_GATED
        self.history[pod.uid].released = self.clock()
        self._set(sim, replace(sim.pod, gated=False))
        self._unscheduled[pod.uid] = sim
        self.schedule()
        return LiftOutcome.LIFTED

    @_locked
    def post_event(self, pod: GpuPod, reason: str, message: str, type_: EventType) -> None:
        """Keep the Event (the newest ``keep_events``)."""
        self.events.append(PostedEvent(self.clock(), pod.ref, reason, message, type_))

    # -- driving it -----------------------------------------------------------------------

    @_locked
    def grow(self, counts: Mapping[str, int]) -> None:
        """Nodes arrive (an autoscaler's): add ``counts`` to the pool, report the new
        capacity as a watch would, and place what now fits."""
        for name, n in counts.items():
            self.capacity_counts[name] = self.capacity_counts.get(name, 0) + n
        self._changes.append(ClusterChange(ChangeKind.CAPACITY))
        self.schedule()


    @_locked
    def create_pod(self, spec: PodSpec) -> GpuPod:
        """Admit ``spec`` through the hook and create the pod (released ones get scheduled)."""
        seq = next(self._uids)
        uid = f"uid-{seq:07d}"
        placement = self.admit(spec, uid)
        now = self.clock()
        pod = GpuPod(
            ref=PodRef(spec.namespace, _pod_name(spec.name, seq)), uid=uid,
            ticket=placement.ticket,
            tenant=spec.tenant, pod_class=spec.pod_class, band=placement.band,
            demand=dict(spec.demand), group=spec.group, group_size=spec.group_size,
            preemptible=spec.preemptible, phase="Pending", gated=placement.gated, node=None,
            created=now, run_seconds=spec.run_seconds, shared=spec.shared,
            claim_names=spec.claim_names,
        )
        sim = _SimPod(pod, spec, seq)
        self._pods[uid] = sim
        self._wait(sim, True)
        if not placement.gated:
            self._unscheduled[uid] = sim
        self.history[uid] = PodHistory(
            spec, placement.ticket, placement.band, now, None if placement.gated else now
        )
        self._changes.append(ClusterChange(ChangeKind.POD, pod))
        if not placement.gated:
            self.schedule()
        return pod

    @_locked
    def delete_pod(self, uid: str) -> None:
        """Delete a pod now (a user's ``kubectl delete``)."""
        sim = self._pods.get(uid)
        if sim is None:
            return
        self._remove(sim)
        history = self.history[uid]
        if history.ended is None:
            history.ended = self.clock()
        self._changes.append(ClusterChange(ChangeKind.POD_GONE, sim.pod))
        self.schedule()

    @_locked
    def next_completion(self) -> float | None:
        """When the next running pod finishes, if any runs."""
        while self._ends and self._ends[0][2] not in self._running:
            heapq.heappop(self._ends)  # ended early (preempted, deleted)
        return self._ends[0][0] if self._ends else None

    @_locked
    def advance(self) -> None:
        """Finish every running pod whose end time has come, then schedule."""
        now = self.clock()
        while (when := self.next_completion()) is not None and when <= now:
            sim = self._running[heapq.heappop(self._ends)[2]]
            self._stop_running(sim)
            self.history[sim.pod.uid].ended = now
            cut = sim.spec.runs_for < sim.spec.duration  # stopped at its deadline
            self._set(sim, replace(sim.pod, phase="Failed" if cut else "Succeeded"))
        self.schedule()

    @_locked
    def evict(self, pod: GpuPod) -> EvictOutcome:
        """Evict ``pod`` (reclaim): it ends now and its controller re-creates it (see the
        module docstring); a pod already gone, or not this uid, counts as evicted."""
        sim = self._pods.get(pod.uid)
        if sim is None:
            return EVICTED
        now = self.clock()
        self.reclaims += 1
        history = self.history[pod.uid]
        history.ended, history.reclaimed = now, True
        self._remove(sim)
        sim.ends = None
        self._set(sim, replace(sim.pod, phase="Failed"))
        self._changes.append(ClusterChange(ChangeKind.POD_GONE, sim.pod))
        self._recreate(sim)
        self.schedule()
        return EVICTED

    @_locked
    def forget_finished(self) -> None:
        """Delete finished pods (what TTL-after-finished does), reporting their deletion."""
        for uid, sim in list(self._pods.items()):
            if sim.pod.finished:
                del self._pods[uid]
                self._changes.append(ClusterChange(ChangeKind.POD_GONE, sim.pod))

    @_locked
    def used(self) -> dict[str, int]:
        """Resources held by running pods."""
        return {name: n for name, n in self._used.items() if n}

    @_locked
    def running_slices(self) -> dict[str, int]:
        """Slices held by running pods, per tenant."""
        return {name: n for name, n in self._tenant_slices.items() if n}

    @_locked
    def running_slices_by_class(self) -> dict[tuple[str, PodClass], int]:
        """Slices held by running pods, per (tenant, class)."""
        return {key: n for key, n in self._class_slices.items() if n}

    @_locked
    def waiting_tenants(self) -> set[str]:
        """Tenants with a pod that is not running yet (gated, or released and pending)."""
        return {name for name, n in self._waiting_tenants.items() if n}

    @_locked
    def waiting_slices(self) -> dict[str, int]:
        """Slices asked for by pods not running yet, per tenant."""
        return {name: n for name, n in self._waiting_slices.items() if n}

    @_locked
    def inference_slices(self) -> dict[str, int]:
        """Slices held or asked for by inference pods, per tenant."""
        held = Counter({t: n for (t, c), n in self._class_slices.items() if c == "inference"})
        held.update({t: n for (t, c), n in self._waiting_class_slices.items()
                     if c == "inference"})
        return {name: n for name, n in held.items() if n}

    @_locked
    def demand_by_key(self) -> dict[tuple[str, str, PodClass], int]:
        """Slices held or asked for by running and waiting pods, per (tenant, capacity
        key, class)."""
        return {key: n for key, n in self._key_slices.items() if n}

    def _key_counts(self, sim: _SimPod, sign: int) -> None:
        for name, units in sim.pod.demand.items():
            self._key_slices[sim.pod.tenant, name, sim.pod.pod_class] += \
                sign * units * slices_of(name)

    @_locked
    def wanted_resources(self) -> set[str]:
        """Resources that waiting pods ask for."""
        return {name for name, n in self._waiting_resources.items() if n}

    @_locked
    def holding_pods(self) -> list[GpuPod]:
        """Pods holding quota: released and not ended (running or pending placement)."""
        return [s.pod for s in (*self._running.values(), *self._unscheduled.values())]

    @_locked
    def has_changes(self) -> bool:
        """Whether changes are waiting to be read by :meth:`changes`."""
        return bool(self._changes)

    @_locked
    def pending_released(self) -> list[GpuPod]:
        """Released pods the scheduler has not placed yet."""
        return [s.pod for s in self._unscheduled.values()]

    # -- state bookkeeping ----------------------------------------------------------------

    def _wait(self, sim: _SimPod, waiting: bool) -> None:
        sign = 1 if waiting else -1
        if waiting:
            self._waiting[sim.pod.uid] = sim
        else:
            del self._waiting[sim.pod.uid]
            self._unscheduled.pop(sim.pod.uid, None)
        self._waiting_tenants[sim.pod.tenant] += sign
        self._waiting_slices[sim.pod.tenant] += sign * sim.pod.slices
        self._waiting_class_slices[sim.pod.tenant, sim.pod.pod_class] += sign * sim.pod.slices
        for name, units in sim.pod.demand.items():
            self._waiting_resources[name] += sign
            self._key_slices[sim.pod.tenant, name, sim.pod.pod_class] += \
                sign * units * slices_of(name)

    def _stop_running(self, sim: _SimPod) -> None:
        del self._running[sim.pod.uid]
        self._used.subtract(sim.pod.demand)
        self._key_counts(sim, -1)
        self._tenant_slices[sim.pod.tenant] -= sim.pod.slices
        self._class_slices[sim.pod.tenant, sim.pod.pod_class] -= sim.pod.slices

    def _remove(self, sim: _SimPod) -> None:
        """Take ``sim`` out of the cluster, whatever its state."""
        if sim.pod.uid in self._waiting:
            self._wait(sim, False)
        elif sim.pod.uid in self._running:
            self._stop_running(sim)
        del self._pods[sim.pod.uid]

    # -- the scheduler --------------------------------------------------------------------

    def _priority(self, pod: GpuPod) -> int:
        return self.priority_classes.for_band(pod.band).value

    def _free(self) -> dict[str, int]:
        return {name: n - self._used[name] for name, n in self.capacity_counts.items()}

    @_locked
    def schedule(self) -> None:
        """Place pending released pods, highest priority first, then oldest; preempt."""
        if self._scheduling:
            return  # re-entered from a re-created pod: the running pass places it
        self._scheduling = True
        try:
            tried: set[str] = set()
            while self._schedule_pass(tried):
                pass  # pods re-created by preemption may be placeable: go again
        finally:
            self._scheduling = False

    def _schedule_pass(self, tried: set[str]) -> bool:
        """One pass over pods not tried yet; True if it found any."""
        waiting = sorted(
            (s for uid, s in self._unscheduled.items() if uid not in tried),
            key=lambda s: (-self._priority(s.pod), s.pod.created, s.pod.uid),
        )
        for sim in waiting:
            tried.add(sim.pod.uid)
            if sim.pod.uid not in self._unscheduled:
                continue
            if not _fits(sim.pod.demand, self._free()) and not self._preempt_for(sim.pod):
                continue
            self._start(sim)
        return bool(waiting)

    def _start(self, sim: _SimPod) -> None:
        now = self.clock()
        sim.started = now
        sim.ends = now + sim.spec.runs_for
        self._wait(sim, False)
        self._running[sim.pod.uid] = sim
        self._used.update(sim.pod.demand)
        self._key_counts(sim, 1)
        self._tenant_slices[sim.pod.tenant] += sim.pod.slices
        self._class_slices[sim.pod.tenant, sim.pod.pod_class] += sim.pod.slices
        heapq.heappush(self._ends, (sim.ends, sim.seq, sim.pod.uid))
        self.history[sim.pod.uid].started = now
        self._set(sim, replace(sim.pod, phase="Running", node="sim-node",
                               started_at=float(int(now))))

    def _preempt_for(self, pod: GpuPod) -> bool:
        spec = self.priority_classes.for_band(pod.band)
        if spec.preemption_policy == "Never":
            return False
        mine = self._priority(pod)
        candidates = sorted(
            (
                s for s in self._running.values()
                if self._priority(s.pod) < mine
                and any(name in pod.demand for name in s.pod.demand)
            ),
            key=lambda s: (self._priority(s.pod), -s.pod.created, -s.seq),
        )
        free = self._free()
        victims: list[_SimPod] = []
        for victim in candidates:
            if _fits(pod.demand, free):
                break
            victims.append(victim)
            for name, n in victim.pod.demand.items():
                free[name] = free.get(name, 0) + n
        if not _fits(pod.demand, free):
            return False
        for victim in victims:
            if victim.pod.uid in self._pods:
                self._evict(victim, pod)
        return True

    def _evict(self, victim: _SimPod, preemptor: GpuPod) -> None:
        """Preempt ``victim`` for ``preemptor``; a gang member takes its whole gang down
        (its controller restarts the gang as a new one, like JobSet or PyTorchJob do)."""
        gang = [victim]
        if victim.pod.group is not None:
            gang = [
                s for s in (*self._running.values(), *self._waiting.values())
                if s.pod.group == victim.pod.group
                and s.pod.ref.namespace == victim.pod.ref.namespace
            ]
        now = self.clock()
        for member in gang:
            self.preemptions += 1
            history = self.history[member.pod.uid]
            history.ended = now
            history.preempted = True
            self._remove(member)
            member.ends = None
            self._set(member, replace(member.pod, phase="Failed", preempted=True,
                                      preemptor=str(preemptor.ref)))
            self._changes.append(ClusterChange(ChangeKind.POD_GONE, member.pod))
            self.events.append(PostedEvent(
                now, member.pod.ref, "Preempted", "Preempted by a higher-priority pod", "Normal"
            ))
        for member in gang:
            self._recreate(member)

    def _recreate(self, sim: _SimPod) -> None:
        """Its controller creates the pod again (a gang member: in the gang restarted
        under the next name)."""
        group = sim.spec.group
        self.create_pod(replace(
            sim.spec, name=_next_name(sim.spec.name),
            group=_next_name(group) if group is not None else None,
        ))

    def _set(self, sim: _SimPod, pod: GpuPod) -> None:
        sim.pod = pod
        self._changes.append(ClusterChange(ChangeKind.POD, pod))


def _fits(demand: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return all(free.get(name, 0) >= n for name, n in demand.items())


def _pod_name(name: str, seq: int) -> str:
    """The name of the pod created from a spec named ``name`` (``<generateName>*``: the
    prefix plus 5 characters unique per pod, as the API server generates them)."""
    if not name.endswith("*"):
        return name
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    suffix = "".join(digits[seq // 36**i % 36] for i in reversed(range(GENERATED_SUFFIX)))
    return name[:-1] + suffix


def _next_name(name: str) -> str:
    if name.endswith("*"):  # a controller's pod: the re-created one gets a fresh name
        return name
    base, sep, attempt = name.rpartition("-r")
    if sep and attempt.isdigit():
        return f"{base}-r{int(attempt) + 1}"
    return f"{name}-r1"
