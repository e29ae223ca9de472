"""The dispatcher: keeps the Redis queue in step with a cluster and lifts gates.

Contract:
- One :meth:`Dispatcher.step` applies the cluster's changes, pushes config and capacity
  into the queue when they changed, releases what the queue says may run now (lifting
  gates; a failed lift is requeued, a vanished pod forgotten) and does the timed chores:
  ``expire`` unconfirmed reservations, reconcile from the cluster, refresh metrics and
  post ``Queued`` Events. :meth:`Dispatcher.run` repeats it until stopped.
- Pod changes: a pod first seen with a ticket is confirmed (the ticket is bound to its
  uid); a pod that ended (``Succeeded``/``Failed``) or was deleted frees its usage
  (``release``); a gated pod that was deleted leaves the queue (``remove``). A pod
  presenting a ticket another pod owns (copied stamps) is a twin: never its ticket's
  owner, never released, told so with a ``TicketConflict`` Warning Event; one that is
  not gated is counted as a pod of its own (reconcile's ``twin_ticket``) from the step
  that found it until it ends, whatever that does to its tenant's quota. A pod
  that is deleted before it ever ran frees what it held at once. A pod the queue does
  not know (Redis lost data, or a reservation expired before the pod appeared), or a queue that
  holds less usage or fewer queued pods than the pods seen (checked every status pass),
  triggers a reconcile, so usage and queue always converge on the cluster's truth.
- Shared ResourceClaims (:mod:`admission.sharing`): a pod naming a claim that another
  live pod of its tenant names, appearing, being released, or ending while it held
  capacity, triggers a reconcile, which charges each such claim to one pod that holds
  capacity; when it ends, that reconcile is made before its ``release``, so the charge
  moves to a pod still holding the claim and usage never drops while its devices are
  held. A pod charged nothing
  (a *rider*: all its GPUs are such a claim, paid by another pod that holds capacity)
  has no ticket in the queue: its gate is lifted at once (``dispatch`` audit record,
  ``Admitted`` Event naming the shared claim). What such pods are charged is audited as
  it changes, for billing and ``fairgate why``: a rider's ``dispatch`` carries its charge
  (``diff.charge``, :func:`audit.usage.charge_detail`: nothing, and the claims it rides
  on with the pod that pays each), and each reconcile writes a ``charge`` record for
  every pod holding capacity that it charges other than last recorded (its full demand
  unless recorded otherwise): when the charge of a shared claim moves to it or away
  from it. What is recorded is what the queue's usage was rebuilt with.
- Reclaim (``fairShare.reclaim``, off unless set, and only with an ``evictor``): every
  ``reclaim_every`` seconds, once a training pod first seen queued has waited
  ``after`` (no sooner than ``reclaim_arrival_gap`` after the last check), at the first
  step after every pod the last check evicted is gone (its head is then released, and
  the next one may be owed: a newcomer owed many pods is not held to one a check), and
  at the first step after the moment
  a check that evicted nothing found time alone would change that
  (:func:`fairshare.reclaim.due`: the head reaches ``after``, a candidate
  ``minRuntime``), the first training hold (the head owed
  the next capacity) is checked; :func:`fairshare.reclaim.choose` picks what to evict
  for it from the pods
  running (their start as this dispatcher saw it), each victim pod is evicted through
  the Eviction API, gets a ``Reclaimed`` Warning Event and a ``reclaim`` audit record
  naming the head, and counts in ``fairgate_reclaims_total``. No new reclaim is made
  while a pod evicted by the last one is still there; the hour's count (``perHour``) is
  kept by this dispatcher, in memory. Every check stores the reclaim notes for
  ``fairgate status``, ``fairgate why`` and the console
  (:meth:`FairQueue.write_reclaim_notes`): ``on`` (false when ``fairShare.reclaim`` is
  unset or no evictor was given), ``after``, ``min_runtime`` (seconds), ``per_hour``,
  ``at`` (the check's time), ``last_hour`` (pods reclaimed in the last hour) and
  ``recent`` (the last ten of them: ``at``, ``pod``, ``tenant``, ``for`` (the head's
  ``namespace/name``), ``for_tenant``, ``ran_seconds``, ``gpu_equivalents``).
- Borrowed capacity given back to inference (only with an ``evictor``; reclaim need
  not be on): when an inference pod first seen in a batch of changes is, once the batch
  is applied, admitted and still not bound, and the
  capacity pushed into the queue cannot hold it besides the pods holding capacity, the
  borrowed pods :func:`fairshare.reclaim.for_inference` picks (the youngest first, a
  gang whole) are evicted at once through the Eviction API, before the kube-scheduler
  has tried the pod: each gets a ``Preempted`` Warning Event and a ``preempt`` audit
  record naming the inference pod, and counts in ``fairgate_preemptions_total``. An
  eviction a PodDisruptionBudget refuses is left to the scheduler's preemption.
  What a pod evicted by fairgate frees (here or by reclaim) is not handed over to its
  tenant's next pod, and its cut run is not learnt as a run time.
- Fencing epoch: every step first asks who the Redis primary is
  (:meth:`FairQueue.primary_epoch`); a new one (a Sentinel failover, a restart) is
  reconciled from the cluster in that same step, before anything is dispatched, since a
  failover may have lost the old primary's last writes. Reconcile replaces usage and
  queue by ticket, so a pod is counted once whatever the old primary held.
- Capacity is the platform's ``capacity`` override if set, else the cluster's; config and
  capacity are pushed again on every status pass and reconcile (a flush, or another
  writer, may have changed them). Whenever it reads the cluster's capacity it stores the
  cluster's :class:`~fairshare.cluster.cluster.CapacityReport` (nodes left out and why, GPUs held
  by pods fairgate does not manage) for ``fairgate status``
  (:meth:`FairQueue.write_capacity_notes`).
- Unschedulable releases: a released pod that is not bound and that the
  scheduler reports ``Unschedulable`` (:attr:`GpuPod.unschedulable`) for longer than
  ``unschedulable_grace`` seconds (timed from when this dispatcher first saw it so) is
  *caught*: it gets a ``Unschedulable`` Warning Event saying why and what fairgate does,
  ``fairgate_unschedulable_releases_total`` counts it, and its demand is withheld from the
  capacity pushed into the queue (never below 0) until it is bound, ends or is deleted,
  so no other pod is released into capacity that is evidently not there and the stuck
  pod gets the next capacity that frees. It stays counted against its tenant's quota
  (a pod that may be bound at any moment must be: invariant 1). Gates cannot be put back
  on an existing pod and fairgate never deletes a pod; the Event tells its owner to fix or
  delete it. The capacity notes (``fairgate status``, ``fairgate why``) list the caught pods
  (``unschedulable``) and what is withheld (``withheld``).
- Gates of one dispatch round are lifted by ``lift_workers`` threads (the cluster must be
  thread-safe then); everything else (Redis, metrics, audit) happens in the caller.
- Several dispatchers may run on one queue: ``dispatch`` hands each queue unit to exactly
  one caller (one Lua script), and the gate patch's ``test`` op guards the pod.
- Events: ``Admitted`` ("Admitted after 12.4s in queue") on every lift; ``Queued``
  ("Queued: position 3 of 12 for team-a/training, waiting for ...") when a gated pod is
  first seen and again only when its position has at least halved or what it waits for
  changed, at most once per ``queued_event_interval`` per pod (a borrowed pod of a tenant
  whose budget is exhausted: with :func:`fairshare.queue.budget.held_note`).
- Audit (when an :class:`audit.AuditLog` is given), each record stamped with the
  dispatcher's clock: ``dispatch`` for every lifted gate; ``start`` when a pod is first
  seen Running (``diff.pod``: band, node, GPU product), again after a restart for pods
  already running (billing keeps a ticket's first); ``preempt`` before the ``release`` of
  a pod that ran and that the scheduler preempted (DisruptionTarget condition, reason
  PreemptionByScheduler; ``diff.preemption``: band, ``ranSeconds`` since its start as
  this dispatcher saw it, preemptor if known); ``release`` for every pod whose usage was
  freed, and for a rider that ended (it held no ticket); ``charge`` (above) for pods
  sharing a ResourceClaim; ``capacity`` whenever the capacity pushed into the queue
  differs from the one this dispatcher last recorded (``diff``: per resource
  before/after); ``pricing`` when the config's ``pricing`` differs from what it last
  recorded (at start, too). These are what
  :mod:`cost.billing` bills from. Logs are JSON-ready (``extra.fields``).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import redis

from admission.sharing import shares_held_claim
from audit import (
    BUDGET,
    CAPACITY,
    CHARGE,
    DISPATCH,
    OVERRUN,
    PREEMPT,
    PRICING,
    RECLAIM,
    RELEASE,
    START,
    AuditLog,
)
from audit.chain import format_time
from audit.usage import (
    Riding,
    budget_detail,
    capacity_detail,
    charge_detail,
    preempt_detail,
    pricing_detail,
    start_detail,
)
from fairshare import reclaim
from fairshare.autoscale import (
    HEAD_LABEL,
    Head,
    backoff,
    free_slots,
    grown_capacity,
    verdict,
)
from fairshare.cluster.cluster import (
    DEFAULT_UNSCHEDULABLE_GRACE,
    CapacityReport,
    ChangeKind,
    Cluster,
    ClusterChange,
    GpuPod,
    LiftOutcome,
)
from fairshare.cluster.pod_evict import EVICTED, Evictor
from fairshare.cluster.provisioning import Provisioner
from fairshare.cluster.reconcile import pod_charges, reconcile, riding, twin_ticket
from fairshare.metrics import DispatcherMetrics
from fairshare.queue.budget import (
    DEFAULT_BUDGET_EVERY,
    BudgetStatus,
    SpendSource,
    budget_line,
    held_note,
)
from fairshare.queue.calls import UnknownTenantError
from fairshare.queue.entitlement import snapshot_fairness
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import (
    Hold,
    QueueSnapshot,
    Release,
    ServiceSnapshot,
    TenantStatus,
    gang_id,
)
from tenants.models import (
    PROVISIONING_CLASS,
    AutoscalingSpec,
    FairgateConfig,
    PodClass,
    ReclaimSpec,
)
from tenants.resources import SLICES_PER_GPU, format_counts, total_slices

log = logging.getLogger("fairgate.dispatcher")

ConfigSource = Callable[[], FairgateConfig | None]
Clock = Callable[[], float]
_DIGITS = re.compile(r"[\d.]+")


@dataclass(frozen=True)
class DispatcherSettings:
    """Timers (seconds) and batch sizes of the dispatcher."""

    batch: int = 32  # queue units asked for per dispatch call
    max_rounds: int = 1000  # dispatch calls per step, at most
    expire_every: float = 5.0
    reconcile_every: float = 300.0
    status_every: float = 10.0
    queued_event_interval: float = 60.0
    queued_events_per_pass: int = 100  # 0 disables Queued events
    idle_wait: float = 1.0  # how long run() waits for cluster changes
    unseen_grace: float = 30.0  # a released ticket whose pod never shows up: reconcile
    lift_workers: int = 8  # gates lifted in parallel (1: in order, in the caller's thread)
    unschedulable_grace: float = DEFAULT_UNSCHEDULABLE_GRACE  # released, Unschedulable: caught
    budget_every: float = DEFAULT_BUDGET_EVERY  # month-to-date spend billed again (with spend)
    service_every: float = 5.0  # service counters kept to restore after a Redis loss
    reclaim_every: float = 10.0  # with fairShare.reclaim: how often the owed head is checked
    # with fairShare.reclaim: the least time between a check and one a training pod's
    # arrival brings forward (to when it will have waited `after`)
    reclaim_arrival_gap: float = 1.0


@dataclass
class StepResult:
    """What one step did."""

    released: list[Release] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    reconciled: bool = False


@dataclass
class _Stuck:
    """A released, unbound pod the scheduler reports Unschedulable, seen so since ``since``;
    ``caught`` once it was so for longer than the grace."""

    pod: GpuPod
    since: float
    caught: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"pod": str(self.pod.ref), "ticket": self.pod.ticket,
                "tenant": self.pod.tenant, "demand": dict(self.pod.demand),
                "since": self.since, "message": self.pod.unschedulable or ""}


@dataclass
class _Posted:
    position: int
    reason: str
    at: float


def _gang_id(pod: GpuPod) -> str | None:
    """The queue's id of ``pod``'s gang (None: no gang)."""
    return gang_id(pod.ref.namespace, pod.group, pod.group_size)


def _fields(pod: GpuPod, **more: Any) -> dict[str, Any]:
    return {
        "ticket": pod.ticket, "tenant": pod.tenant, "namespace": pod.ref.namespace,
        "pod": pod.ref.name, "class": pod.pod_class, "band": pod.band,
        "demand": format_counts(pod.demand), **more,
    }


class Dispatcher:
    """Releases gated pods from a :class:`FairQueue` into a :class:`Cluster`."""

    def __init__(
        self,
        queue: FairQueue,
        cluster: Cluster,
        config: ConfigSource,
        *,
        clock: Clock = time.time,
        metrics: DispatcherMetrics | None = None,
        audit: AuditLog | None = None,
        settings: DispatcherSettings | None = None,
        spend: SpendSource | None = None,
        provisioner: Provisioner | None = None,
        evictor: Evictor | None = None,
    ) -> None:
        """Dispatch ``queue`` into ``cluster`` with the config ``config()`` returns;
        with ``spend``, enforce the tenants' budgets; with ``provisioner``, ask for nodes
        with ProvisioningRequests (``autoscaling.mode: provisioningRequest``; see the
        module contract)."""
        self.queue = queue
        self.cluster = cluster
        self.config = config
        self.clock = clock
        self.metrics = metrics or DispatcherMetrics()
        self.audit = audit
        self.settings = settings or DispatcherSettings()
        self.spend = spend
        self.provisioner = provisioner
        self.evictor = evictor
        self._reclaim_due = float("-inf")  # when the next reclaim check is due
        self._reclaim_checked = float("-inf")  # when the last reclaim check was made
        self._reclaimed: list[dict[str, Any]] = []  # the pods reclaimed in the last hour
        self._evicting: set[str] = set()  # tickets fairgate evicted, not released yet
        self._arrivals: list[str] = []  # tickets of inference pods first seen this batch
        self._recheck = False  # the last check evicted: check again once they are gone
        self._heads: dict[str, Head] = {}  # key -> an entry released towards new nodes
        self._held: dict[str, str] = {}  # ticket -> its head, released but kept gated
        self._noted_heads: list[dict[str, Any]] | None = None
        self._last_budget = float("-inf")
        self._budgeted: FairgateConfig | None = None  # the config of the last budget pass
        self._borrowing_changed = False  # a budget pass of this step synced the queue
        self._budgets: dict[str, BudgetStatus] = {}  # as the last budget pass stored them
        self.pods: dict[str, GpuPod] = {}  # ticket -> the pod as last seen
        self._refused: set[str] = set()  # uids refused at release (DRA claims replaced)
        self._synced: tuple[FairgateConfig, dict[str, int]] | None = None
        self._capacity: dict[str, int] | None = None
        self._need_reconcile = True
        self._epoch: str | None = None  # the Redis primary last reconciled against
        self._last_expire = float("-inf")
        self._last_reconcile = float("-inf")
        self._last_status = float("-inf")
        self._last_service = float("-inf")
        self._service: ServiceSnapshot | None = None  # as last read, for a Redis loss
        self._posted: dict[str, _Posted] = {}
        self._twins: set[str] = set()  # uids of pods told that their ticket is another's
        # tickets of pods a shared claim's payer covers -> the claims they ride on
        self._riders: dict[str, dict[str, Riding]] = {}
        self._charged: dict[str, str] = {}  # ticket -> charge last audited, if not its demand
        self._unseen: dict[str, tuple[Release, float]] = {}  # released, pod not seen yet
        self._gang_words: dict[str, str] = {}  # gang id -> its name, for this round's records
        self._stuck: dict[str, _Stuck] = {}  # ticket -> released pod reported Unschedulable
        self._report: CapacityReport | None = None  # the cluster's, as last read
        self._noted: list[dict[str, Any]] | None = None  # caught pods as last written
        self._pool = (
            ThreadPoolExecutor(self.settings.lift_workers, thread_name_prefix="lift-gate")
            if self.settings.lift_workers > 1 else None
        )
        self._event_cursor = 0
        self._started: dict[str, float] = {}  # ticket -> when this dispatcher saw it running
        self._released: dict[str, float] = {}  # ticket -> when this dispatcher released it
        self._metered: dict[str, float] = {}  # ticket -> GPU-time counted in metrics up to
        self._recorded_capacity: dict[str, int] | None = None
        self._recorded_prices: dict[str, Any] | None = None

    # -- config and capacity ----------------------------------------------------------

    def sync(self, force: bool = False) -> bool:
        """Push config and capacity into the queue if they changed; False without config."""
        config = self.config()
        if config is None:
            return False
        read = force or self._capacity is None
        if read:
            self._report = self.cluster.capacity_report()
            self._capacity = dict(self._report.total)
        assert self._capacity is not None
        withheld = self.withheld()
        capacity = _less(dict(config.platform.capacity) or self._capacity, withheld)
        if force or self._synced is None or self._synced[0] is not config \
                or self._synced[1] != capacity:
            self.queue.sync_config(config, capacity)
            self._synced = (config, capacity)
            self.metrics.observe_capacity(capacity)
            self._record_capacity(dict(config.platform.capacity) or self._capacity)
            self._record_pricing(config)
        caught = [s.to_json() for s in self._stuck.values() if s.caught]
        heads = [head.to_json(self.clock()) for head in self._heads.values()]
        if self._report is not None and (read or caught != self._noted
                                         or heads != self._noted_heads):
            self.queue.write_capacity_notes({
                **self._report.to_json(), "at": self.clock(),
                "override": bool(config.platform.capacity),
                "withheld": withheld, "unschedulable": caught, "autoscaling": heads,
            })
            self._noted, self._noted_heads = caught, heads
        return True

    def withheld(self) -> dict[str, int]:
        """The capacity withheld for caught unschedulable releases: their demand, summed."""
        total: dict[str, int] = {}
        for stuck in self._stuck.values():
            if stuck.caught:
                for name, n in stuck.pod.demand.items():
                    total[name] = total.get(name, 0) + n
        return total

    # -- one step ---------------------------------------------------------------------

    def step(self, timeout: float = 0.0) -> StepResult:
        """Apply changes, sync, reconcile if needed, dispatch, and do the timed chores."""
        result = StepResult()
        changes = self.cluster.changes(timeout)
        if not self.sync():
            self._need_reconcile = True  # no config yet: decide nothing, rebuild later
            return result
        try:
            self._check_epoch()
            self.handle(changes)
            self._reconcile_if_due(result)
            self._dispatch(result)
            self._autoscale(result)
            self._chores(self.clock())
            if self._need_reconcile:  # the chores found the queue short of the cluster
                self._reconcile_if_due(result)
                self._dispatch(result)
            elif self._borrowing_changed:  # a budget switched borrowing on (or off)
                self._dispatch(result)
            self._borrowing_changed = False
            self._keep_service()
        except UnknownTenantError as error:
            log.warning("queue lost its config (%s): syncing and reconciling", error)
            self._synced = None
            self._need_reconcile = True
        return result

    def run(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set. A failed step (Redis or the API server down) is
        logged and retried after ``idle_wait``, starting with a reconcile."""
        while not stop.is_set():
            try:
                self.step(self.settings.idle_wait)
            except (redis.RedisError, OSError) as error:
                log.error("dispatcher step failed: %s; retrying", error)
                self._after_failure(stop)
            except Exception:  # the loop must outlive any one bad step
                log.exception("dispatcher step failed unexpectedly; retrying")
                self._after_failure(stop)

    def close(self) -> None:
        """Stop the gate-lifting threads (after the last step)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _after_failure(self, stop: threading.Event) -> None:
        self._synced = None
        self._capacity = None
        self._need_reconcile = True
        stop.wait(self.settings.idle_wait)

    def _check_epoch(self) -> None:
        """Reconcile now if another Redis primary answers than at the last step."""
        epoch = self.queue.primary_epoch()
        if epoch != self._epoch:
            if self._epoch is not None:
                log.warning("a new Redis primary answers (%s, was %s): reconciling from "
                            "the cluster", epoch, self._epoch)
                self.metrics.primary_changes.inc()
            self._epoch = epoch
            self._need_reconcile = True

    def _reconcile_if_due(self, result: StepResult) -> None:
        if self._need_reconcile or not self.queue.is_rebuilt() or \
                self.clock() - self._last_reconcile >= self.settings.reconcile_every:
            self.reconcile()
            result.reconciled = True

    def _keep_service(self) -> None:
        """Read the queue's service counters every ``service_every`` seconds, while
        Redis holds a rebuilt queue (never the empty state a loss leaves)."""
        now = self.clock()
        if now - self._last_service < self.settings.service_every or \
                self._need_reconcile or not self.queue.is_rebuilt():
            return
        self._service = self.queue.service()
        self._last_service = now

    def reconcile(self) -> None:
        """Rebuild usage and queue from the cluster (after syncing config); when Redis
        lost its data, the service counters last read are given back first, so the
        order resumes where it was. The budget states are computed again in this step's
        chores (Redis may have lost them)."""
        self.sync(force=True)
        if self._service is not None:
            restored = self.queue.restore_service(self._service)
            if restored:
                log.warning("Redis lost the queue's service counters: restored those of "
                            "%d tenants as read at most %.0f s before", restored,
                            self.settings.service_every)
        self._last_budget = float("-inf")
        listed_at = self.clock()  # before listing: what is reserved after it is kept
        pods = self.cluster.list_pods()
        self._refused &= {pod.uid for pod in pods if not pod.ended}
        pods = [replace(pod, gated=False) if pod.ticket in self._held else pod
                for pod in pods if pod.uid not in self._refused]
        summary = reconcile(self.queue, pods, listed_at=listed_at,
                            bound={t: p.uid for t, p in self.pods.items()},
                            started=self._started)
        self.pods = summary.owners
        owners = list(summary.owners.values())
        rides = riding(owners)
        self._riders = {rider.ticket: rides.get(rider.uid, {}) for rider in summary.riders}
        self._twins &= {twin.uid for twin in summary.twins}  # the others own their tickets
        for twin in summary.twins:
            self._twin(twin)
        for ticket, stuck in list(self._stuck.items()):
            known = self.pods.get(ticket)
            if known is None or known.uid != stuck.pod.uid:
                self._unstick(ticket, "gone")
        for ticket in set(self._started) - set(self.pods):  # ended while not watched
            self._started.pop(ticket)
            self._metered.pop(ticket, None)
        for ticket in set(self._released) - set(self.pods):
            self._released.pop(ticket)
        for pod in self.pods.values():
            self._track(pod)
            self._check_started(pod)
        self._unseen.clear()
        self._need_reconcile = False
        for rider in summary.riders:
            self._lift_rider(rider)
        self._record_charges(owners)
        self._last_reconcile = self.clock()
        self.metrics.reconciles.labels("ok").inc()
        log.info("reconciled queue from the cluster", extra={"fields": {
            "running": summary.running, "gated": summary.gated, "skipped": summary.skipped}})

    # -- pod changes ----------------------------------------------------------------------

    def handle(self, changes: Iterable[ClusterChange]) -> None:
        """Bring the queue in line with each change; then make room for the inference
        pods that arrived and are still not bound once all of them are applied."""
        self._arrivals = []
        for change in changes:
            if change.kind is ChangeKind.RESYNC:
                self._need_reconcile = True
            elif change.kind is ChangeKind.CAPACITY:
                self._capacity = None
                self.sync()
            elif change.pod is not None:
                if change.kind is ChangeKind.POD_GONE:
                    self._gone(change.pod)
                else:
                    self._seen(change.pod)
        for ticket in self._arrivals:
            pod = self.pods.get(ticket)
            if pod is not None and not pod.gated and pod.node is None and not pod.deleting \
                    and not pod.ended:
                self._make_room(pod)

    def _seen(self, pod: GpuPod) -> None:
        if pod.uid in self._refused:
            if pod.ended:
                self._refused.discard(pod.uid)
            return
        known = self.pods.get(pod.ticket)
        if pod.uid in self._twins or (known is not None and known.uid != pod.uid):
            if pod.ended:  # also once its ticket's owner is gone: it was counted as a twin
                self._twin_gone(pod, f"pod {pod.phase}" if pod.finished else "pod deleted")
            else:
                self._twin(pod)
            return
        if pod.ended:
            self._free(pod, f"pod {pod.phase}" if pod.finished else "pod deleted before it ran")
            return
        if known is None:
            found = self.queue.confirm(pod.ticket, pod.uid, pod.ref.namespace, pod.ref.name)
            if found == "conflict":
                self._twin(pod)
                return
            if found == "unknown":
                log.info("pod not in the queue: reconciling", extra={"fields": _fields(pod)})
                self._need_reconcile = True
        self._check_overrun(pod, known)
        if (known is None or known.gated != pod.gated) and self._shares(pod):
            self._need_reconcile = True  # who pays for a shared claim may change
        self.pods[pod.ticket] = pod
        if known is None and pod.band == "inference":
            self._arrivals.append(pod.ticket)
        if known is None and pod.gated and pod.band != "inference":
            self._reclaim_once_waited(pod)
        if pod.gated and pod.ticket in self._riders:
            self._lift_rider(pod)
        self._track(pod)
        self._check_started(pod)
        unseen = self._unseen.pop(pod.ticket, None)
        if unseen is not None:
            release = unseen[0]
            self._lifted(release, pod, self._lift(release, pod), StepResult())

    def _check_overrun(self, pod: GpuPod, known: GpuPod | None) -> None:
        """Report, once per excess, a pod whose DRA claims were allocated more than it
        was admitted for; the queue's usage is rebuilt to count it, which holds its
        tenant's next pods."""
        if not pod.overrun or (known is not None and known.overrun == pod.overrun):
            return
        excess = format_counts(pod.overrun)
        log.warning("pod holds more than it was admitted for",
                    extra={"fields": _fields(pod, excess=excess)})
        self.metrics.overruns.labels(pod.tenant).inc()
        self.cluster.post_event(
            pod, "AllocatedAboveAdmission",
            f"its DRA claims were allocated {excess} more than it was admitted for: "
            f"{pod.tenant} is charged for what it holds, and its next pods wait", "Warning")
        self._record(OVERRUN, pod, reason=f"allocated {excess} above admission; charged")
        self._need_reconcile = True

    def _twin(self, pod: GpuPod) -> None:
        """``pod`` presents a ticket another pod owns (copied ``fairgate.io/*`` stamps):
        it is not accounted, never released, and told so once."""
        if pod.uid in self._twins:
            return
        self._twins.add(pod.uid)
        if pod.holds_capacity:  # it may run: counted as its own pod from this step on
            self._need_reconcile = True
            self.metrics.twins.labels(pod.tenant).inc()
            told = (f"this pod is counted against {pod.tenant} as a pod of its own, which "
                    f"may put {pod.tenant} over quota: its next pods wait until it is back "
                    f"under")
        else:
            told = "this pod is not counted and will never be released"
        log.warning("pod presents a ticket another pod owns", extra={"fields": _fields(pod)})
        self.cluster.post_event(
            pod, "TicketConflict",
            f"fairgate ticket {pod.ticket} belongs to another pod (its fairgate.io/* stamps "
            f"were copied): {told}; delete it and create it without fairgate.io/* labels "
            f"and annotations",
            "Warning",
        )

    def _twin_gone(self, pod: GpuPod, why: str) -> None:
        """A twin ended or was deleted: free what it was counted for, if anything."""
        if pod.uid in self._twins:
            self._twins.discard(pod.uid)
            self._free(replace(pod, ticket=twin_ticket(pod)), why)

    def _shares(self, pod: GpuPod) -> bool:
        """Whether another live pod of ``pod``'s tenant names a shared claim it names."""
        return bool(pod.shared) and shares_held_claim(
            pod.sharer, (p.sharer for p in self.pods.values() if p.shared))

    def _record_charges(self, owners: list[GpuPod]) -> None:
        """Audit a ``charge`` for every pod sharing a claim that holds capacity and is
        charged other than last recorded (its demand when nothing was), as a reconcile
        charged ``owners`` (its tickets' owners: what the queue's usage was rebuilt
        from, not the watch's view since, which may lag)."""
        live = [pod for pod in owners if pod.shared]
        charges = pod_charges(live)
        rides = riding(live)
        for pod in live:
            after = format_counts(charges[pod.uid])
            before = self._charged.get(pod.ticket, format_counts(pod.demand))
            if not pod.holds_capacity or after == before:
                continue
            self._charged[pod.ticket] = after
            claims = rides.get(pod.uid, {})
            told = "; ".join(f"runs on shared ResourceClaim {ride.words(uid)}"
                             for uid, ride in claims.items())
            self._record(CHARGE, pod, reason=f"charged {after or 'nothing'} (was "
                         f"{before or 'nothing'}): " + (
                             f"{told}; charged only its own demand" if claims else
                             "pays for the shared ResourceClaims it holds"),
                         diff=charge_detail(before, after, claims))

    def _lift_rider(self, pod: GpuPod) -> None:
        """Lift the gate of a rider (its GPUs are a shared claim another pod that holds
        capacity is charged for); a claim check that waits is tried again when the pod
        or its claims change."""
        claims = self._riders.get(pod.ticket, {})
        outcome = self.cluster.lift_gate(pod)
        self.metrics.lifts.labels(outcome.value).inc()
        if outcome is LiftOutcome.REFUSED:
            self._refused.add(pod.uid)
        if outcome is not LiftOutcome.LIFTED:
            return
        self.pods[pod.ticket] = replace(pod, gated=False)
        self.cluster.post_event(
            pod, "Admitted", "Admitted: its GPUs are a shared ResourceClaim that another "
            f"pod of {pod.tenant} holds and is charged for", "Normal")
        log.info("lifted gate of a pod sharing a charged ResourceClaim",
                 extra={"fields": _fields(pod)})
        self._charged[pod.ticket] = ""  # charged nothing: a rider's claims are paid
        paid = "; ".join(ride.words(uid) for uid, ride in claims.items())
        self._record(DISPATCH, pod, reason="released: its GPUs are a shared ResourceClaim "
                                           f"another pod holds and is charged for ({paid}); "
                                           "charged only its own demand",
                     diff=charge_detail(format_counts(pod.demand), "", claims))

    def _gone(self, pod: GpuPod) -> None:
        if pod.uid in self._refused:
            self._refused.discard(pod.uid)
            return
        if pod.uid in self._twins:
            self._twin_gone(pod, "pod deleted")
            return
        if pod.gated and self.queue.remove(pod.ticket, pod.uid, self.clock()):
            self._forget_pod(pod)
            return
        self._free(pod, "pod deleted")  # whatever it still held (a reservation, usage)

    def _forget_pod(self, pod: GpuPod) -> None:
        known = self.pods.get(pod.ticket)
        if known is not None and known.uid == pod.uid:
            del self.pods[pod.ticket]
            self._posted.pop(pod.ticket, None)
        stuck = self._stuck.get(pod.ticket)
        if stuck is not None and stuck.pod.uid == pod.uid:
            self._unstick(pod.ticket, "gone")

    # -- unschedulable releases -------------------------------------------------------------

    def _track(self, pod: GpuPod) -> None:
        """Start, keep or stop the unschedulable clock of ``pod`` as it is now."""
        stuck = self._stuck.get(pod.ticket)
        if pod.unschedulable is not None and not pod.gated and pod.node is None \
                and not pod.ended:
            if stuck is None or stuck.pod.uid != pod.uid:
                self._stuck[pod.ticket] = _Stuck(pod, self.clock())
            else:
                stuck.pod = pod
        elif stuck is not None and stuck.pod.uid == pod.uid:
            self._unstick(pod.ticket, f"bound to {pod.node}" if pod.node else "schedulable")

    def _unstick(self, ticket: str, why: str) -> None:
        stuck = self._stuck.pop(ticket)
        if stuck.caught:
            log.info("unschedulable release no longer stuck: its capacity is no longer "
                     "withheld", extra={"fields": _fields(
                         stuck.pod, reason=why,
                         stuck_seconds=round(self.clock() - stuck.since, 1))})
            self._observe_stuck()
            self.sync()

    def _catch_unschedulable(self, now: float) -> None:
        """Catch the releases reported Unschedulable for longer than the grace."""
        grace = self.settings.unschedulable_grace
        waiting = {t for head in self._heads.values() for t in head.tickets}  # for nodes
        caught = [s for s in self._stuck.values()
                  if not s.caught and now - s.since > grace and s.pod.ticket not in waiting]
        for stuck in caught:
            stuck.caught = True
            pod = stuck.pod
            self.metrics.unschedulable.labels(pod.pod_class, pod.tenant).inc()
            log.warning("released pod unschedulable past the grace: its capacity is withheld",
                        extra={"fields": _fields(pod, message=pod.unschedulable,
                                                 stuck_seconds=round(now - stuck.since, 1))})
            self.cluster.post_event(pod, "Unschedulable", _caught_message(stuck, now),
                                    "Warning")
        if caught:
            self._observe_stuck()
            self.sync()

    def _observe_stuck(self) -> None:
        self.metrics.observe_unschedulable(
            sum(1 for s in self._stuck.values() if s.caught), self.withheld())

    def _free(self, pod: GpuPod, why: str) -> None:
        known = self.pods.get(pod.ticket)
        held = known is not None and known.uid == pod.uid and known.holds_capacity
        self._forget_pod(pod)
        self._meter(pod, self.clock())
        self._metered.pop(pod.ticket, None)
        started = self._started.pop(pod.ticket, None)
        self._released.pop(pod.ticket, None)
        evicted = pod.ticket in self._evicting
        self._evicting.discard(pod.ticket)
        self._riders.pop(pod.ticket, None)
        rode = self._charged.pop(pod.ticket, None) is not None  # a rider has no ticket
        moved = held and self._shares(pod)
        if moved:
            # the pods still holding its shared claims are charged for them first (one
            # rebuild), then its ticket goes: usage never drops while the devices are held
            log.info("pod sharing a ResourceClaim ended: reconciling",
                     extra={"fields": _fields(pod, reason=why)})
            self.reconcile()
        if (self.queue.release(pod.ticket, pod.uid, self.clock(), hand_over=not evicted)
                or moved or rode):
            log.info("released usage", extra={"fields": _fields(pod, reason=why)})
            if started is not None and pod.preempted and not evicted:  # else recorded
                self._preempted(pod, started)
            self._record(RELEASE, pod, reason=why)

    def _check_started(self, pod: GpuPod) -> None:
        """Record ``start`` the first time this dispatcher sees ``pod`` running."""
        if pod.phase != "Running" or pod.gated or pod.ticket in self._started:
            return
        self._started[pod.ticket] = self._metered[pod.ticket] = self.clock()
        self._record(START, pod, reason=f"running on node {pod.node or 'unknown'}",
                     diff=start_detail(pod.band, pod.node, pod.gpu_product))

    def _preempted(self, pod: GpuPod, started: float) -> None:
        ran = max(0.0, self.clock() - started)
        self.metrics.observe_preemption(pod.tenant, ran * pod.slices / SLICES_PER_GPU)
        by = pod.preemptor or "a higher-priority pod (not named by the cluster)"
        log.info("pod preempted by the scheduler",
                 extra={"fields": _fields(pod, preemptor=pod.preemptor, ran_seconds=ran)})
        self._record(PREEMPT, pod, reason=f"preempted by {by} after {ran:.1f}s running",
                     diff=preempt_detail(pod.band, ran, pod.preemptor))

    def _meter(self, pod: GpuPod, now: float) -> None:
        """Count ``pod``'s GPU-time since it was last metered (if running) in metrics."""
        since = self._metered.get(pod.ticket)
        if since is None:
            return
        self._metered[pod.ticket] = now
        config = self._synced[0] if self._synced is not None else None
        pricing = config.platform.pricing if config is not None else None
        self.metrics.observe_gpu_time(
            pod.tenant, pod.pod_class, pod.band, pod.demand, now - since,
            pricing.price(pod.gpu_product) if pricing is not None else 0.0,
            pricing.currency if pricing is not None else "USD")

    def _record_capacity(self, capacity: dict[str, int]) -> None:
        before = self._recorded_capacity
        if self.audit is None or before == capacity:
            return
        self._recorded_capacity = dict(capacity)
        self.audit.record(
            CAPACITY, time=self._now_text(), user="fairgate-dispatcher", operation="CAPACITY",
            reason="capacity fairgate's pods can use: " + (format_counts(capacity) or "none"),
            diff=capacity_detail(before, capacity))

    def _record_pricing(self, config: FairgateConfig) -> None:
        pricing = config.platform.pricing
        prices = pricing.paths() if pricing is not None else {}
        before = self._recorded_prices
        if self.audit is None or before == prices or (before is None and not prices):
            return
        self._recorded_prices = prices
        self.audit.record(
            PRICING, time=self._now_text(), user="fairgate-dispatcher", operation="PRICING",
            reason="prices in effect from now on (platform.yaml pricing)",
            diff=pricing_detail(before, prices))

    def _record(self, decision: str, pod: GpuPod, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.record(decision, time=self._now_text(), **self._audit_fields(pod),
                              **fields)

    def _now_text(self) -> str:
        return format_time(datetime.fromtimestamp(self.clock(), UTC))

    # -- dispatching ----------------------------------------------------------------------

    def _dispatch(self, result: StepResult) -> None:
        started = time.perf_counter()
        for _ in range(self.settings.max_rounds):
            releases = self.queue.dispatch(self.clock(), self.settings.batch)
            if not releases:
                break
            seen: list[tuple[Release, GpuPod]] = []
            for release in releases:
                pod = self.pods.get(release.ticket)
                if pod is None:
                    # Released before its pod was seen (watch lag): lift it when it shows up.
                    self._unseen[release.ticket] = (release, self.clock())
                    self.metrics.lifts.labels("unseen").inc()
                else:
                    seen.append((release, pod))
            outcomes = self._lift_all(seen)
            self._gang_words = self._name_gangs(pod for _release, pod in seen)
            requeued = [
                release.ticket for (release, pod), outcome in zip(seen, outcomes, strict=True)
                if not self._lifted(release, pod, outcome, result)
            ]
            result.requeued += requeued
            if requeued:
                break  # let the cluster catch up before trying again
        self.metrics.attempt.observe(time.perf_counter() - started)

    def _lift_all(self, batch: list[tuple[Release, GpuPod]]) -> list[LiftOutcome]:
        """Lift the gates of ``batch`` (in parallel with ``lift_workers`` > 1)."""
        if self._pool is None or len(batch) < 2:
            return [self._lift(release, pod) for release, pod in batch]
        return list(self._pool.map(lambda item: self._lift(*item), batch))

    def _lift(self, release: Release, pod: GpuPod) -> LiftOutcome:
        """The cluster I/O of one release: lift the gate, then say so on the pod."""
        outcome = self.cluster.lift_gate(pod)
        if outcome is LiftOutcome.LIFTED:
            self.cluster.post_event(
                pod, "Admitted", f"Admitted after {release.waited_seconds:.1f}s in queue",
                "Normal",
            )
        return outcome

    def _lifted(
        self, release: Release, pod: GpuPod, outcome: LiftOutcome, result: StepResult
    ) -> bool:
        """Book one lift's outcome; False if the pod had to go back into the queue."""
        self.metrics.lifts.labels(outcome.value).inc()
        if outcome is LiftOutcome.FAILED:
            self.queue.requeue(release.ticket, self.clock())
            return False
        if outcome is LiftOutcome.GONE:
            self._free(pod, "pod gone before its gate was lifted")
            return True
        if outcome is LiftOutcome.WAITING:  # lifted when its pod or claims change
            self._unseen[release.ticket] = (release, self.clock())
            return True
        if outcome is LiftOutcome.REFUSED:  # it stays gated, and out of the queue
            self._refused.add(pod.uid)
            self._free(pod, "refused at release: its DRA claims now ask for more than it "
                            "was admitted for")
            return True
        self._posted.pop(pod.ticket, None)
        self.pods[pod.ticket] = replace(pod, gated=False)
        if outcome is LiftOutcome.LIFTED:
            result.released.append(release)
            self._admitted(pod, release)
            if self._shares(pod):
                self._need_reconcile = True  # the pods sharing its claims may ride now
        return True

    def _name_gangs(self, pods: Iterable[GpuPod]) -> dict[str, str]:
        """Gang id -> ``gang of Indexed Job trainer (4 pods)`` for the gangs of ``pods``,
        as the queue names them (one read; none for pods without a gang)."""
        ids = sorted({g for g in (_gang_id(p) for p in pods) if g is not None})
        if not ids:
            return {}
        return {gid: f"{record.name} ({record.created} pods)"
                for gid, record in zip(ids, self.queue.gangs(ids), strict=True)
                if record is not None}

    def _admitted(self, pod: GpuPod, release: Release) -> None:
        self._released[pod.ticket] = self.clock()
        waited = release.waited_seconds
        self.metrics.wait.labels(pod.pod_class, pod.tenant).observe(waited)
        self.metrics.admitted.labels(pod.pod_class, pod.tenant).inc()
        log.info("lifted gate", extra={"fields": _fields(pod, waited_seconds=round(waited, 3))})
        gid = _gang_id(pod)
        gang = self._gang_words.get(gid, "") if gid is not None else ""
        self._record(DISPATCH, pod, reason=f"released as {release.band} after {waited:.1f}s"
                     + (f" with its {gang}" if gang else ""))

    @staticmethod
    def _audit_fields(pod: GpuPod) -> dict[str, Any]:
        return {
            "uid": pod.ticket, "user": "fairgate-dispatcher", "operation": "DISPATCH",
            "tenant": pod.tenant, "namespace": pod.ref.namespace, "name": pod.ref.name,
            "pod_class": pod.pod_class, "demand": format_counts(pod.demand),
        }

    # -- autoscaled pools ---------------------------------------------------------------

    def _autoscale(self, result: StepResult) -> None:
        """Follow the heads waiting for nodes, then release the next ones in queue order
        against the pools' maximum (``autoscaling``), at most ``inFlight`` at once."""
        if self._synced is None:
            return
        config, capacity = self._synced
        spec = config.platform.autoscaling
        now = self.clock()
        for head in list(self._heads.values()):
            self._follow(head, spec, now, result)
        slots = free_slots(spec, len(self._heads))
        releases = self.queue.dispatch(now, slots, grown_capacity(capacity, spec)) \
            if slots and not result.requeued else []
        for head in self._heads_of(releases, now):
            if spec.mode == "provisioningRequest" and self.provisioner is not None:
                self._heads[head.key] = head
                self._held.update({t: head.key for t in head.tickets})
                self._request(head)
            else:
                self._heads[head.key] = head
                self._release_head(head, result, "its gate is lifted so that the "
                                   "autoscaler sees it pending (autoscaling mode pending)")
        self.sync()  # the notes fairgate status and why read say where each head stands

    def _heads_of(self, releases: list[Release], now: float) -> list[Head]:
        """The queue's releases as heads: a gang's members (released together) are one.
        The gang is the queue's (a member's pod may not have reached the watch yet)."""
        heads: list[Head] = []
        statuses = self.queue.ticket_statuses([r.ticket for r in releases], now) \
            if releases else []
        for release, status in zip(releases, statuses, strict=True):
            gang = status.group if status is not None else None  # namespace/group
            key = gang or release.ticket
            if heads and heads[-1].key == key:
                last = heads[-1]
                last.tickets += (release.ticket,)
                last.demand = {r: last.demand.get(r, 0) + release.demand.get(r, 0)
                               for r in set(last.demand) | set(release.demand)}
                last.releases.append(release)
            else:
                heads.append(Head(key, (release.ticket,), release.tenant, dict(release.demand),
                                  now, "requesting", releases=[release]))
        return heads

    def _unseen_pods(self, head: Head, now: float) -> bool:
        """Whether some pods of a new head have not reached the watch yet (the queue
        released them as their admission ended): wait, at most ``unseen_grace``. A pod
        seen once and gone since is gone, not unseen."""
        head.seen.update(t for t in head.tickets if t in self.pods)
        return len(head.seen) < len(head.tickets) and \
            now - head.since < self.settings.unseen_grace

    def _head_pods(self, head: Head) -> list[GpuPod]:
        return [p for t in head.tickets if (p := self.pods.get(t)) is not None and not p.ended]

    def _follow(self, head: Head, spec: AutoscalingSpec, now: float,
                result: StepResult) -> None:
        """One head: done once its pods are bound or gone (the pods own its requests); else
        released when its request is Provisioned, retried with backoff when it failed.
        Not before the watch has shown all its pods (at most ``unseen_grace``)."""
        if self._unseen_pods(head, now):
            return
        pods = self._head_pods(head)
        if not pods or all(p.node is not None for p in pods):
            self._end_head(head, "its pods are bound to nodes" if pods else "its pods are gone")
            return
        if head.state == "released":
            return
        if not spec.enabled or spec.mode != "provisioningRequest" or self.provisioner is None:
            self._release_head(head, result, "autoscaling is no longer provisioningRequest")
            return
        namespace = pods[0].ref.namespace
        if head.state == "retrying":
            if now >= head.retry_at:
                self._request(head)
            return
        conditions = self.provisioner.conditions(head.request, namespace)
        if conditions is None:  # deleted by someone else: ask again
            self._request(head)
            return
        said, message = verdict(conditions)
        if said == "provisioned":
            head.message = message
            for pod in pods:
                self.provisioner.consume(pod, head.request)
            self._release_head(head, result, f"ProvisioningRequest {head.request} is "
                               f"Provisioned ({message})")
        elif said == "failed":
            self._retry(head, pods, now, f"ProvisioningRequest {head.request} failed ({message})")
        else:
            head.message = message or f"ProvisioningRequest {head.request} not provisioned yet"

    def _retry(self, head: Head, pods: list[GpuPod], now: float, failure: str) -> None:
        """Ask again after a backoff, with a new request (the failed one stays, owned by
        the pods, until they are gone), and say so on the pods."""
        wait = backoff(head.attempts)
        head.state, head.retry_at, head.attempts = "retrying", now + wait, head.attempts + 1
        head.message = f"{failure}: asking again in {wait:.0f}s (attempt {head.attempts})"
        for pod in pods:
            self.cluster.post_event(pod, "ProvisioningFailed", head.message, "Warning")
        log.warning("provisioning request failed", extra={"fields": {
            "head": head.key, "message": head.message}})

    def _request(self, head: Head) -> None:
        """Create the head's ProvisioningRequest and say so on its pods."""
        assert self.provisioner is not None
        pods = self._head_pods(head)
        if not pods or self._unseen_pods(head, self.clock()):  # _follow asks when seen
            return
        try:
            self.provisioner.create(head.request, pods[0].ref.namespace, pods,
                                    {HEAD_LABEL: head.request})
        except ValueError as refused:  # a shape cluster-autoscaler would refuse
            self._retry(head, pods, self.clock(), f"ProvisioningRequest {head.request} "
                        f"not made: {refused}")
            return
        head.state = "requesting"
        head.message = (f"waiting for nodes: ProvisioningRequest {head.request} "
                        f"({PROVISIONING_CLASS}, attempt {head.attempts}) for "
                        f"{format_counts(head.demand)}")
        for pod in pods:
            self.cluster.post_event(pod, "Provisioning", head.message, "Normal")
        log.info("provisioning request made", extra={"fields": {
            "request": head.request, "head": head.key, "attempt": head.attempts,
            "demand": format_counts(head.demand)}})

    def _release_head(self, head: Head, result: StepResult, why: str) -> None:
        """Lift the gates of a head's pods (as any release)."""
        for ticket in head.tickets:
            self._held.pop(ticket, None)
        head.state, head.message = "released", why
        seen = [(r, p) for r in head.releases if (p := self.pods.get(r.ticket)) is not None]
        for release in head.releases:
            if release.ticket not in self.pods:  # lifted when its pod shows up
                self._unseen[release.ticket] = (release, self.clock())
        outcomes = self._lift_all(seen)
        for (release, pod), outcome in zip(seen, outcomes, strict=True):
            if not self._lifted(release, pod, outcome, result):
                result.requeued.append(release.ticket)
        for _, pod in seen:
            self.cluster.post_event(pod, "WaitingForNodes", f"released for new nodes: {why}",
                                    "Normal")

    def _end_head(self, head: Head, why: str) -> None:
        """Forget a head (its pods bound or gone); its requests are the pods' to clean up
        (they own them: the garbage collector deletes them with the last pod)."""
        self._heads.pop(head.key, None)
        for ticket in head.tickets:  # a held pod that is gone was freed as it went
            self._held.pop(ticket, None)
        log.info("head no longer waits for nodes", extra={"fields": {
            "head": head.key, "why": why, "waited": round(self.clock() - head.since, 3)}})

    # -- timed chores ---------------------------------------------------------------------

    def _chores(self, now: float) -> None:
        self._catch_unschedulable(now)
        if self.spend is not None and self._synced is not None and (
                now - self._last_budget >= self.settings.budget_every
                or self._synced[0] is not self._budgeted):
            self._budget_pass(now, self._synced[0], self.spend)
        if any(now - since > self.settings.unseen_grace for _, since in self._unseen.values()):
            log.warning("released tickets whose pods never appeared: reconciling",
                        extra={"fields": {"tickets": sorted(self._unseen)}})
            self._need_reconcile = True
        if now - self._last_expire >= self.settings.expire_every:
            self._last_expire = now
            expired = self.queue.expire(now)
            if expired:
                self.metrics.expired.inc(len(expired))
                log.info("expired unconfirmed reservations",
                         extra={"fields": {"tickets": expired}})
        snapshot: QueueSnapshot | None = None  # the status pass's, shared with reclaim
        if now - self._last_status >= self.settings.status_every:
            self._last_status = now
            self.sync(force=True)  # heals a capacity another writer (or a flush) changed
            snapshot = self.queue.snapshot()
            self.metrics.observe_tenants(snapshot)
            for ticket in list(self._metered):
                pod = self.pods.get(ticket)
                if pod is not None:
                    self._meter(pod, now)
            self._check_drift(snapshot.tenants)
            self._queued_events(now)
        if now >= self._reclaim_due or (
                self._recheck and not self._evicting & self.pods.keys()):
            self._reclaim_due = now + self.settings.reclaim_every
            self._reclaim_checked = now
            self._recheck = False
            self._reclaim(now, snapshot)

    # -- reclaim (fairShare.reclaim) ----------------------------------------------------

    def _reclaim_spec(self) -> ReclaimSpec | None:
        """``fairShare.reclaim`` of the config in force; None when it is off or there is
        no ``evictor`` to carry it out."""
        if self.evictor is None or self._synced is None:
            return None
        return self._synced[0].platform.fair_share.reclaim

    def _reclaim(self, now: float, snapshot: QueueSnapshot | None) -> None:
        """With ``fairShare.reclaim`` on, evict for the owed training head, and its
        tenant's next heads in turn, what :func:`fairshare.reclaim.choose_in_turn`
        picks; one check's reclaims at a time (none while the pods of the last are still
        terminating; once they are gone, the next step checks again)."""
        spec = self._reclaim_spec()
        self._reclaimed = [r for r in self._reclaimed if now - r["at"] < reclaim.HOUR]
        if spec is not None:
            self._reclaim_for(spec, now, snapshot)
        self.queue.write_reclaim_notes(reclaim.notes(spec, self._reclaimed, now))

    def _reclaim_for(self, spec: ReclaimSpec, now: float,
                     snapshot: QueueSnapshot | None) -> None:
        """The reclaim check of :meth:`_reclaim`, reclaim being on; ``snapshot``: the
        queue's, when this step took one."""
        self._evicting &= set(self.pods)
        if self._evicting:
            return
        reclaims, due = reclaim_check(self.queue, self.pods, self._started,
                                      self._released, spec, now,
                                      [r["at"] for r in self._reclaimed], snapshot)
        if due is not None:
            self._reclaim_due = min(self._reclaim_due, due)
        for hold, chosen in reclaims:
            for victim in chosen:
                for ticket in victim.tickets:
                    self._evict(self.pods[ticket], hold, now)

    def _reclaim_once_waited(self, pod: GpuPod) -> None:
        """With reclaim on, a training pod first seen queued brings the next reclaim
        check forward to when it will have waited ``after`` (a newcomer is not left a
        period longer), but no sooner than ``reclaim_arrival_gap`` after the last check."""
        spec = self._reclaim_spec()
        if spec is None:
            return
        at = max(pod.created + spec.after,
                 self._reclaim_checked + self.settings.reclaim_arrival_gap)
        self._reclaim_due = min(self._reclaim_due, at)

    def _evict(self, pod: GpuPod, hold: Hold, now: float) -> None:
        assert self.evictor is not None
        for_whom = f"{hold.namespace}/{hold.name} of tenant {hold.tenant}"
        outcome = self.evictor.evict(pod)
        if outcome != EVICTED:
            log.info("reclaim: eviction not made",
                     extra={"fields": _fields(pod, outcome=outcome, owed=for_whom)})
            return
        self._evicting.add(pod.ticket)
        self._recheck = True
        ran = max(0.0, now - self._started.get(pod.ticket, now))
        self._reclaimed.append({
            "at": now, "pod": str(pod.ref), "tenant": pod.tenant,
            "for": f"{hold.namespace}/{hold.name}", "for_tenant": hold.tenant,
            "ran_seconds": round(ran, 3), "gpu_equivalents": round(pod.slices / SLICES_PER_GPU, 3)})
        reason = (f"reclaimed for {for_whom} (owed its fair share) after {ran:.1f}s "
                  "running")
        log.info("reclaimed", extra={"fields": _fields(pod, owed=for_whom, ran_seconds=ran)})
        self.metrics.observe_reclaim(pod.tenant, ran * pod.slices / SLICES_PER_GPU)
        self.cluster.post_event(pod, "Reclaimed", f"Evicted: {reason}", "Warning")
        self._record(RECLAIM, pod, reason=reason,
                     diff=preempt_detail(pod.band, ran, f"{hold.namespace}/{hold.name}"))

    # -- borrowed capacity returned to inference ---------------------------------------

    def _make_room(self, arrival: GpuPod) -> None:
        """Evict the borrowed pods :func:`fairshare.reclaim.for_inference` picks for the
        inference pod ``arrival``, just admitted and not bound, when the capacity pushed
        into the queue cannot hold it besides the pods holding capacity (those being
        deleted, evicted or riding on a shared claim left out: they free or hold nothing
        more), and the kube-scheduler, which preempts for it too, would take the same
        pod (:func:`fairshare.reclaim.as_the_scheduler_would`); else the scheduler makes
        the room alone."""
        if self.evictor is None or self._synced is None:
            return
        capacity = self._synced[1]
        used: dict[str, int] = {}
        for ticket, pod in self.pods.items():
            if pod.holds_capacity and not pod.deleting and ticket not in self._evicting \
                    and ticket not in self._riders:
                for key, n in pod.demand.items():
                    used[key] = used.get(key, 0) + n
        short = {key: min(n, used.get(key, 0) - capacity.get(key, 0))
                 for key, n in arrival.demand.items() if n > 0}
        if all(n <= 0 for n in short.values()):
            return
        now = self.clock()
        holding = {ticket: pod for ticket, pod in self.pods.items()
                   if pod.band == "borrowed" and pod.node is not None and pod.holds_capacity}
        lent = {ticket: pod for ticket, pod in holding.items()
                if not pod.deleting and ticket not in self._evicting}
        started = {ticket: self._started.get(ticket, now) for ticket in lent}
        chosen = reclaim.for_inference(short, reclaim.victims(lent, started))
        if not reclaim.as_the_scheduler_would(arrival.demand, chosen, holding):
            log.info("room for inference left to the scheduler's preemption: its choice of "
                     "victim is not certain", extra={"fields": _fields(arrival)})
            return
        for victim in chosen:
            for ticket in victim.tickets:
                self._return_borrowed(lent[ticket], arrival, now)

    def _return_borrowed(self, pod: GpuPod, arrival: GpuPod, now: float) -> None:
        assert self.evictor is not None
        outcome = self.evictor.evict(pod)
        if outcome != EVICTED:  # a disruption budget, or gone: the scheduler decides
            log.info("borrowed pod not evicted for inference",
                     extra={"fields": _fields(pod, outcome=outcome, inference=str(arrival.ref))})
            return
        self._evicting.add(pod.ticket)
        ran = max(0.0, now - self._started.get(pod.ticket, now))
        reason = (f"evicted for inference pod {arrival.ref} of tenant {arrival.tenant} after "
                  f"{ran:.1f}s running: borrowed capacity is given back as soon as inference "
                  "needs it")
        log.info("borrowed pod evicted for inference",
                 extra={"fields": _fields(pod, inference=str(arrival.ref), ran_seconds=ran)})
        self.metrics.observe_preemption(pod.tenant, ran * pod.slices / SLICES_PER_GPU)
        self.cluster.post_event(pod, "Preempted", f"Evicted: {reason}", "Warning")
        self._record(PREEMPT, pod, reason=reason,
                     diff=preempt_detail(pod.band, ran, str(arrival.ref)))

    def _budget_pass(self, now: float, config: FairgateConfig, spend: SpendSource) -> None:
        """Compute month-to-date spend, store and audit the budget states, and sync the
        queue again when a tenant's borrowing is switched off or on."""
        self._last_budget, self._budgeted = now, config
        until = datetime.fromtimestamp(now, UTC)
        since = until.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        try:
            spent, currency = spend.spent(since, until, config.platform.pricing)
        except (redis.RedisError, OSError):
            raise  # the step fails and is retried, like any Redis failure
        except Exception:  # a budget must never stop dispatching: keep the stored states
            log.exception("month-to-date spend not computed: budget states left as they are")
            return
        month = until.strftime("%Y-%m")
        statuses = {t.name: BudgetStatus(t.name, t.monthly_budget, spent.get(t.name, 0.0),
                                         currency, month, now)
                    for t in config.tenants() if t.monthly_budget is not None}
        changes = self.queue.write_budgets(statuses.values())
        self._budgets = statuses
        self.metrics.observe_budgets(statuses.values())
        for tenant, before, after in changes:
            if before == "" and after == "ok":
                continue  # a new budget, not yet near its end: no transition
            status = statuses.get(tenant)
            what = f"budget {after}: {budget_line(status)}" if status is not None else \
                f"budget removed from {tenant} (was {before})"
            log.info("budget state changed", extra={"fields": {
                "tenant": tenant, "before": before, "after": after,
                "spent": status.spent if status is not None else None}})
            if self.audit is not None:
                self.audit.record(
                    BUDGET, time=self._now_text(), user="fairgate-dispatcher",
                    operation="BUDGET", tenant=tenant, reason=what, diff=budget_detail(
                        before, after, status.spent if status is not None else 0.0,
                        status.monthly if status is not None else None,
                        status.currency if status is not None else currency, month))
        if any("exhausted" in (before, after) for _, before, after in changes):
            self.sync(force=True)
            self._borrowing_changed = True

    def _check_drift(self, statuses: Iterable[TenantStatus]) -> None:
        """Reconcile when Redis holds less than the pods seen: it lost data (a flush)."""
        used: dict[str, int] = {}
        queued: dict[tuple[str, PodClass], int] = {}
        held = [pod if pod.ticket not in self._held else replace(pod, gated=False)
                for pod in self.pods.values()]
        charges = pod_charges(held)
        for pod in held:
            if not charges[pod.uid]:
                continue  # a rider: no ticket of its own
            if pod.gated:
                key = (pod.tenant, pod.pod_class)
                queued[key] = queued.get(key, 0) + 1
            else:
                used[pod.tenant] = used.get(pod.tenant, 0) + total_slices(charges[pod.uid])
        known = {s.tenant: s for s in statuses}
        for tenant in {t for t, _ in queued} | set(used):
            status = known.get(tenant)
            lost = status is None or status.used_slices < used.get(tenant, 0) or any(
                status.queued.get(cls, 0) < n for (t, cls), n in queued.items() if t == tenant
            )
            if lost:
                log.warning("queue holds less than the cluster: reconciling",
                            extra={"fields": {"tenant": tenant}})
                self._need_reconcile = True
                return

    def _queued_events(self, now: float) -> None:
        """Check up to ``queued_events_per_pass`` gated pods: those never told first,
        then the others in turn."""
        budget = self.settings.queued_events_per_pass
        gated = [pod for pod in self.pods.values() if pod.gated]
        if not budget or not gated:
            return
        fresh = [pod for pod in gated if pod.ticket not in self._posted][:budget]
        start = self._event_cursor % len(gated)
        rotation = [p for p in gated[start:] + gated[:start] if p.ticket in self._posted]
        batch = fresh + rotation[:budget - len(fresh)]
        self._event_cursor = start + len(batch) - len(fresh)
        for pod in batch:
            status = self.queue.ticket_status(pod.ticket, now)
            if status is None or status.state not in ("queued", "gang-waiting"):
                continue
            note = held_note(self._budgets.get(pod.tenant)) if pod.band == "borrowed" else None
            reason = note or status.waiting_for or "its turn"
            position = status.position or 0  # 0: an incomplete gang has no place yet
            last = self._posted.get(pod.ticket)
            if last is not None and (
                now - last.at < self.settings.queued_event_interval
                or (position > last.position // 2
                    and _DIGITS.sub("#", reason) == _DIGITS.sub("#", last.reason))
            ):
                continue
            self._posted[pod.ticket] = _Posted(position, reason, now)
            where = f": position {position} of {status.queue_length}" if position else ""
            self.cluster.post_event(
                pod, "Queued",
                f"Queued{where} for {pod.tenant}/{pod.pod_class}, waiting for {reason}",
                "Normal",
            )


def reclaim_check(queue: FairQueue, pods: Mapping[str, GpuPod], started: Mapping[str, float],
                  released: Mapping[str, float], spec: ReclaimSpec, now: float,
                  reclaimed_at: Sequence[float], snapshot: QueueSnapshot | None = None
                  ) -> tuple[list[tuple[Hold, list[reclaim.Victim]]], float | None]:
    """One reclaim check at ``now``: for the owed training head (the first training hold)
    and, once it gets some, for its tenant's next queued pods of its shape in turn
    (:func:`fairshare.reclaim.choose_in_turn`; a gang's head alone), each head's hold
    with the victims picked for it among the running ``pods`` (empty: none); and, when
    none is picked, when a check could first pick some (:func:`fairshare.reclaim.due`;
    None: not before something changes). ``started``/``released``: when each pod was
    seen running / released by the queue (only pods in ``started`` are read, so a check
    costs the running pods, not the queued, until a reclaim is made); ``reclaimed_at``:
    when the pods reclaimed in the last hour were; ``snapshot``: the queue's, taken in
    this same step (else one is taken, and only when some running pod could be
    reclaimed: the tenants' standings need it)."""
    hold = next((h for h in queue.holds(now) if h.band != "inference"), None)
    head = pods.get(queue.find(hold.namespace, hold.name) or "") if hold else None
    if hold is None or head is None:
        return [], None
    owed = reclaim.Owed(
        hold.tenant, {k: n - hold.held.get(k, 0) for k, n in hold.demand.items()},
        hold.demand, head.created)
    running = {ticket: pod for ticket in started if (pod := pods.get(ticket)) is not None
               and pod.phase == "Running" and not pod.gated and not pod.deleting}
    candidates = reclaim.victims(running, started, released)
    reclaims: list[tuple[Hold, list[reclaim.Victim]]] = []
    if reclaim.contenders(owed, candidates, spec, now, reclaimed_at):
        fair = snapshot_fairness(snapshot or queue.snapshot())
        standings = {name: reclaim.Standing(t.used, t.entitlement)
                     for name, t in fair.tenants.items()}
        first = [(hold, owed)]
        heads = first if hold.group else itertools.chain(first, _next_heads(pods, head, hold))
        reclaims = reclaim.choose_in_turn(heads, standings, candidates, spec, now,
                                          reclaimed_at)
    return reclaims, None if reclaims else reclaim.due(owed, candidates, spec, now)


def _next_heads(pods: Mapping[str, GpuPod], head: GpuPod, hold: Hold
                ) -> Iterator[tuple[Hold, reclaim.Owed]]:
    """The pods of ``head``'s tenant queued after it with its band and demand, outside
    any gang, in the order they were created, each as the hold it will be and as owed
    its whole demand (read only when iterated)."""
    queued = sorted((p for p in pods.values()
                     if p.gated and p.tenant == head.tenant and p.group is None
                     and p.band == head.band and p.ticket != head.ticket
                     and p.demand == head.demand and not p.deleting and not p.ended),
                    key=lambda p: (p.created, p.ticket))
    for pod in queued:
        yield (replace(hold, namespace=pod.ref.namespace, name=pod.ref.name, held={}),
               reclaim.Owed(pod.tenant, dict(pod.demand), dict(pod.demand), pod.created))


def _less(capacity: dict[str, int], withheld: dict[str, int]) -> dict[str, int]:
    """``capacity`` less ``withheld``, never below 0 (a resource keeps its key)."""
    if not withheld:
        return capacity
    return {name: max(0, n - withheld.get(name, 0)) for name, n in capacity.items()}


def _caught_message(stuck: _Stuck, now: float) -> str:
    pod = stuck.pod
    demand = format_counts(pod.demand)
    return (
        f"released by fairgate but the scheduler has reported it Unschedulable for "
        f"{now - stuck.since:.0f}s ({pod.unschedulable}). fairgate keeps its {demand} "
        f"counted against {pod.tenant}'s quota (it may still be bound at any moment) and "
        f"releases no other pod into that much capacity until this pod is bound or gone. "
        f"Fix what keeps it off the nodes (see the scheduler's message), or delete it to "
        f"return the quota: a controller's replacement queues again"
    )
