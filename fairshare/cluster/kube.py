"""A :class:`~fairshare.cluster.cluster.Cluster` backed by a real Kubernetes API server.

Contract:
- Uses the official ``kubernetes`` client and reads raw JSON (no model round trips).
- Pods: those labelled ``fairgate.io/tenant`` with a ``fairgate.io/ticket`` annotation
  (:func:`pod_from_manifest` turns one into a :class:`GpuPod`, its demand by capacity
  key of its placement class).
- Capacity (:func:`capacity_report`, pure) is, per capacity key (a resource in one
  placement class, :mod:`tenants.placement`: the class of a node is read from its labels
  by the rule the webhook's affinity follows), the sum of ``nvidia.com/*`` allocatable
  over the nodes fairgate's pods can use: of a placement class some pod can have (not a
  ``single``-strategy node of an unknown product), not cordoned, Ready (or not Ready for at most
  ``not_ready_grace`` seconds, judged by the Ready condition's ``lastTransitionTime``) and
  with no ``NoSchedule``/``NoExecute`` taint that fairgate's toleration
  (``nvidia.com/gpu:NoSchedule``, :data:`tenants.models.GPU_TOLERATION`) misses; less, per
  node, the GPUs held by pods fairgate does not manage that are bound there and not
  finished (:func:`foreign_pod`). The report says which nodes were left out and why.
- :meth:`KubeCluster.start` runs daemon threads that list-and-watch fairgate's pods
  (label ``fairgate.io/tenant``), nodes and bound unfinished pods
  (field selector :data:`BOUND_UNFINISHED`), plus a clock that re-checks the capacity
  every ``tick``; they feed :meth:`KubeCluster.changes`: a ``CAPACITY`` change whenever
  the capacity differs from the last one published; an expired pod watch (410) or a
  reconnect after an error yields a ``RESYNC`` change so the caller can rebuild.
- :meth:`KubeCluster.lift_gate` removes the ``fairgate.io/queue`` gate with a JSON Patch
  whose ``test`` ops pin the pod's uid and the gate's index, so two dispatchers (or a
  gate that moved) can never remove the wrong gate; conflicts, 429 and 5xx answers are
  retried with exponential backoff and jitter. Thread-safe.
- :meth:`KubeCluster.post_event` creates a core/v1 Event on the pod.
"""

from __future__ import annotations

import datetime
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from admission.dra import Refuse, ReleaseVerdict, Wait, shared_claim_names
from admission.pods import PodError, PodView, deadline
from fairshare.cluster.cluster import (
    DEFAULT_NOT_READY_GRACE,
    CapacityReport,
    ChangeKind,
    ClusterChange,
    EventType,
    ForeignHold,
    GpuPod,
    LiftOutcome,
    NodeExclusion,
    PodPhase,
    PodRef,
)
from fairshare.cluster.dra import DraWatch
from fairshare.cluster.watching import Backoff, list_all, watch
from fairshare.queue.model import UNKNOWN_GANG_SIZE
from tenants import placement, resources
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    GPU_TOLERATION,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    PREEMPTIBLE_LABEL,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    PriorityBand,
    PriorityClasses,
)

log = logging.getLogger("fairgate.kube")

JSON_PATCH = "application/json-patch+json"
EVENT_COMPONENT = "fairgate-dispatcher"
_PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeeded", "Failed", "Unknown"})
_RETRIABLE = frozenset({409, 422, 429, 500, 502, 503, 504})
BOUND_UNFINISHED = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# The watches whose first list must have arrived before the watched state is trusted.
WATCHED = frozenset({"nodes", "foreign"})
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


def preempted_by_scheduler(status: Mapping[str, Any]) -> bool:
    """Whether a pod's status carries the ``DisruptionTarget`` condition the
    kube-scheduler sets on a victim of preemption (reason ``PreemptionByScheduler``)."""
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        and c.get("reason") == PREEMPTION_BY_SCHEDULER
        for c in status.get("conditions") or [] if isinstance(c, Mapping)
    )
"""Field selector of the pods that may hold GPUs on a node."""


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """An API client: ``kubeconfig`` if given, else in-cluster, else the default kubeconfig."""
    load: Callable[..., Any] = config.new_client_from_config
    if kubeconfig is not None:
        return cast(client.ApiClient, load(config_file=str(kubeconfig)))
    in_cluster: Callable[[], None] = config.load_incluster_config
    try:
        in_cluster()
        return client.ApiClient()
    except config.ConfigException:
        return cast(client.ApiClient, load())


def _claim_names(pod: Mapping[str, Any]) -> set[str]:
    """The ResourceClaims a pod's claims are: those it names, those generated for it."""
    named = {str(entry.get("resourceClaimName"))
             for entry in (pod.get("spec") or {}).get("resourceClaims") or []
             if entry.get("resourceClaimName")}
    generated = {str(status.get("resourceClaimName"))
                 for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                 if status.get("resourceClaimName")}
    return named | generated


def _deadline(value: object) -> int | None:
    """A listed pod's ``spec.activeDeadlineSeconds`` (its declared run time); None when
    unset or unusable (the API server validates it: never expected)."""
    try:
        return deadline(value, "spec.activeDeadlineSeconds")
    except PodError:
        return None


def _timestamp(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _band(
    spec: Mapping[str, Any], annotations: Mapping[str, str], pod_class: str,
    priority_classes: PriorityClasses,
) -> PriorityBand:
    band = priority_classes.band_of(str(spec.get("priorityClassName") or ""))
    if band is not None:
        return band
    if annotations.get(BORROWED_ANNOTATION) == "true":
        return "borrowed"
    return "inference" if pod_class == "inference" else "training"


DemandOf = Callable[[PodView], resources.ResourceCounts]
SharedOf = Callable[[PodView], Mapping[str, resources.ResourceCounts]]
ReleaseCheck = Callable[[Mapping[str, Any]], ReleaseVerdict]


def no_shared(_pod: PodView) -> Mapping[str, resources.ResourceCounts]:
    """A ``shared_of`` for clusters without DRA: no pod names a shared claim."""
    return {}


def pod_from_manifest(
    obj: Mapping[str, Any], priority_classes: PriorityClasses, demand_of: DemandOf,
    shared_of: SharedOf = no_shared,
) -> GpuPod | None:
    """The :class:`GpuPod` of a pod manifest, or None if fairgate did not stamp it.

    A pod without tenant label, ticket or a parsable demand annotation is not tracked.
    The demand is, per resource, the larger of what the pod was admitted for (its
    ``fairgate.io/demand``, immutable after CREATE) and ``demand_of(obj)``, what it holds:
    its containers' GPUs (immutable spec) and the devices its DRA claims were allocated,
    never re-priced from a template or claim that changed since. Holding more than it
    was admitted for is logged and kept in :attr:`GpuPod.overrun`. The demand is keyed
    by the pod's placement class (:func:`tenants.placement.pod_placement` of it, its
    ``fairgate.io/mig-profile`` label and the pool in its ``fairgate.io/node-pool``
    annotation, all immutable after CREATE). ``shared_of(obj)`` are the shared claims it
    names (:func:`admission.dra.shared_claims`), keyed the same way.
    """
    meta = obj.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    tenant = labels.get(TENANT_LABEL)
    ticket = annotations.get(TICKET_ANNOTATION)
    pod_class = labels.get(CLASS_LABEL)
    if not tenant or not ticket or pod_class not in ("inference", "training"):
        return None
    try:
        demand = resources.parse_counts(annotations.get(DEMAND_ANNOTATION, ""))
        # a gang label without a size: fairgate stamped a gang whose size it did not
        # know yet, which waits for it (see admission.mutation)
        group_size = int(annotations.get(POD_GROUP_SIZE_ANNOTATION, "1")
                         if POD_GROUP_LABEL not in labels
                         or POD_GROUP_SIZE_ANNOTATION in annotations else UNKNOWN_GANG_SIZE)
    except ValueError:
        log.warning("pod %s/%s has a malformed fairgate annotation; ignored",
                    meta.get("namespace"), meta.get("name"))
        return None
    try:
        view = PodView.parse(obj)
        held = demand_of(view)
        shared = shared_of(view)
        names = shared_claim_names(view) if shared else {}
    except ValueError as error:  # not expected: the containers passed admission
        log.warning("pod %s/%s: demand from its spec: %s; counted as admitted (%s)",
                    meta.get("namespace"), meta.get("name"), error,
                    resources.format_counts(demand))
        held, shared, names = demand, {}, {}
    overrun = {r: n - demand.get(r, 0) for r, n in held.items() if n > demand.get(r, 0)}
    if overrun:
        log.warning("pod %s/%s holds %s, more than the %r it was admitted for; the larger "
                    "counts", meta.get("namespace"), meta.get("name"),
                    resources.format_counts(held), annotations.get(DEMAND_ANNOTATION, ""))
        demand = {r: max(demand.get(r, 0), held.get(r, 0)) for r in {*demand, *held}}
    where = placement.pod_placement(demand, labels.get(placement.MIG_PROFILE_LABEL),
                                    annotations.get(placement.NODE_POOL_ANNOTATION))
    demand = where.keyed(demand)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    phase = status.get("phase") or "Pending"
    gates = spec.get("schedulingGates") or []
    return GpuPod(
        ref=PodRef(str(meta.get("namespace", "")), str(meta.get("name", ""))),
        uid=str(meta.get("uid", "")),
        ticket=ticket,
        tenant=tenant,
        pod_class=cast(Any, pod_class),
        band=_band(spec, annotations, pod_class, priority_classes),
        demand=demand,
        group=labels.get(POD_GROUP_LABEL) or None,
        group_size=max(group_size, 1),
        phase=cast(PodPhase, phase if phase in _PHASES else "Unknown"),
        gated=any(g.get("name") == QUEUE_GATE for g in gates),
        node=spec.get("nodeName") or None,
        created=_timestamp(meta.get("creationTimestamp")),
        deleting=meta.get("deletionTimestamp") is not None,
        started_at=_timestamp(status["startTime"]) if status.get("startTime") else None,
        unschedulable=unschedulable(status),
        preempted=preempted_by_scheduler(status),
        preemptible=labels.get(PREEMPTIBLE_LABEL) == "true",
        overrun=overrun,
        run_seconds=_deadline(spec.get("activeDeadlineSeconds")),
        shared={uid: where.keyed(counts) for uid, counts in shared.items()},
        claim_names={uid: name for uid, name in names.items() if uid in shared},
    )


def unschedulable(status: Mapping[str, Any]) -> str | None:
    """The scheduler's message if a pod ``status`` says ``PodScheduled=False`` with reason
    ``Unschedulable`` and names no ``nominatedNodeName`` (a pod waiting for preemption
    victims to leave is not stuck); else None. An empty message reads ``Unschedulable``."""
    if status.get("nominatedNodeName"):
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message") or "Unschedulable")
            return None
    return None


NODE_LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready",
                                   "node.kubernetes.io/unreachable"})
"""Taints the node lifecycle controller sets from the Ready condition: judged by the
Ready rule (with its grace), not as taints."""
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
FAIRGATE_TOLERATIONS: tuple[Mapping[str, str], ...] = (GPU_TOLERATION,)


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether ``toleration`` tolerates ``taint``: Kubernetes' rule (an empty effect or
    key matches any; ``Exists`` ignores the value, ``Equal`` (the default) needs it)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class NodeGpus:
    """What one node offers fairgate's pods, as read from its manifest (:func:`node_gpus`)."""

    name: str
    gpus: Mapping[str, int]  # nvidia.com/* allocatable by short name
    placement: placement.Placement | str  # its placement class (str: why it has none)
    cordoned: bool  # spec.unschedulable
    ready: bool  # the Ready condition is True
    ready_changed: float | None  # its lastTransitionTime (None: no Ready condition)
    untolerated: tuple[str, ...]  # NoSchedule/NoExecute taints the tolerations miss
    product: str | None = None  # label nvidia.com/gpu.product

    def excluded(self, now: float, grace: float) -> str | None:
        """Why the node is not capacity at ``now`` (None: it is): cordoned, not Ready for
        more than ``grace`` seconds, tainted with a taint fairgate does not tolerate, or
        of no placement class a pod can have."""
        if isinstance(self.placement, str):
            return self.placement
        if self.cordoned:
            return "cordoned"
        if not self.ready:
            if self.ready_changed is None:
                return "has no Ready condition"
            if now - self.ready_changed > grace:
                return f"NotReady since {_iso(self.ready_changed)} (more than {grace:g}s)"
        if self.untolerated:
            return f"tainted {', '.join(self.untolerated)} (not tolerated by fairgate's pods)"
        return None


def node_gpus(
    node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]] = FAIRGATE_TOLERATIONS,
) -> NodeGpus:
    """Read a Node manifest: its ``nvidia.com/*`` allocatable (known resources, positive
    counts), placement class (from its labels), cordon, Ready condition and the
    ``NoSchedule``/``NoExecute`` taints that none of ``tolerations`` tolerates
    (lifecycle taints, see :data:`NODE_LIFECYCLE_TAINTS`, left to the Ready rule)."""
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    counts: dict[str, int] = {}
    for name, quantity in (status.get("allocatable") or {}).items():
        short = resources.short_name(name)
        if short is None or not resources.is_known(short):
            continue
        try:
            count = int(str(quantity))
        except ValueError:
            continue
        if count > 0:
            counts[short] = count
    untolerated = tuple(
        _taint_text(taint) for taint in spec.get("taints") or []
        if taint.get("effect") in _BLOCKING_EFFECTS
        and taint.get("key") not in NODE_LIFECYCLE_TAINTS
        and not any(tolerates(t, taint) for t in tolerations)
    )
    meta = node.get("metadata") or {}
    return NodeGpus(
        name=str(meta.get("name", "")),
        gpus=counts,
        placement=placement.node_placement(meta.get("labels") or {}),
        cordoned=bool(spec.get("unschedulable")),
        ready=ready is not None and ready.get("status") == "True",
        ready_changed=None if ready is None else _timestamp(ready.get("lastTransitionTime")),
        untolerated=untolerated,
        product=((node.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL),
    )


def node_capacity(
    node: Mapping[str, Any], now: float | None = None, grace: float = DEFAULT_NOT_READY_GRACE,
) -> dict[str, int]:
    """GPU capacity a node offers fairgate's pods at ``now`` (default: the time now), by
    capacity key: its ``nvidia.com/*`` allocatable in its placement class
    (:func:`tenants.placement.node_capacity`), or nothing when :meth:`NodeGpus.excluded`."""
    gpus = node_gpus(node)
    when = time.time() if now is None else now
    if gpus.excluded(when, grace) is not None or isinstance(gpus.placement, str):
        return {}
    return placement.node_capacity(gpus.placement, gpus.gpus)


@dataclass(frozen=True)
class ForeignPod:
    """A pod fairgate does not manage, bound to a node and not finished, holding GPUs."""

    ref: str  # namespace/name
    node: str
    gpus: Mapping[str, int]  # nvidia.com/* devices by short name


def foreign_pod(
    obj: Mapping[str, Any], demand_of: DemandOf, priority_classes: PriorityClasses,
) -> ForeignPod | None:
    """The GPUs ``obj`` holds if fairgate does not manage it (:func:`pod_from_manifest`
    would not track it), it is bound to a node and has not finished; else None."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    phase = (obj.get("status") or {}).get("phase")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    if pod_from_manifest(obj, priority_classes, demand_of) is not None:
        return None
    meta = obj.get("metadata") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    try:
        demand = demand_of(PodView.parse(obj))
    except ValueError as error:
        log.warning("pod %s on node %s: its GPU demand is unreadable (%s); not subtracted "
                    "from capacity", ref, node, error)
        return None
    labels = meta.get("labels") or {}
    where = placement.pod_placement(demand, labels.get(placement.MIG_PROFILE_LABEL), None)
    gpus = placement.device_counts(where, demand)
    return ForeignPod(ref, str(node), gpus) if gpus else None


def capacity_report(
    nodes: Iterable[NodeGpus], foreign: Iterable[ForeignPod], now: float, grace: float,
    published: Mapping[str, Mapping[str, int]] | None = None,
) -> CapacityReport:
    """What fairgate's pods can use at ``now``, by capacity key: every node's GPUs in its
    placement class unless :meth:`NodeGpus.excluded`, less what foreign pods bound to it
    hold (never below 0). A node's GPUs are, per resource, the larger of its allocatable
    and what its DRA ResourceSlices publish (``published``, by node: the same GPUs may
    show in both, through a DeviceClass's ``extendedResourceName``)."""
    on_node: dict[str, list[ForeignPod]] = {}
    for pod in foreign:
        on_node.setdefault(pod.node, []).append(pod)
    counted: list[dict[str, int]] = []
    excluded: list[NodeExclusion] = []
    held: list[ForeignHold] = []
    for node in sorted(nodes, key=lambda n: n.name):
        slices = (published or {}).get(node.name) or {}
        if slices:
            node = replace(node, gpus={name: max(node.gpus.get(name, 0), slices.get(name, 0))
                                       for name in {*node.gpus, *slices}})
        if not node.gpus:
            continue
        reason = node.excluded(now, grace)
        if reason is not None:
            excluded.append(NodeExclusion(node.name, reason, dict(node.gpus)))
            continue
        pods = sorted(on_node.get(node.name, []), key=lambda p: p.ref)
        holding = _sum_counts(p.gpus for p in pods)
        taken = {name: min(n, holding[name]) for name, n in node.gpus.items() if name in holding}
        if taken:
            held.append(ForeignHold(node.name, taken,
                                    tuple(p.ref for p in pods if set(p.gpus) & set(taken))))
        assert not isinstance(node.placement, str)  # excluded above
        left = {name: n - taken.get(name, 0) for name, n in node.gpus.items()}
        counted.append(placement.node_capacity(node.placement, left))
    return CapacityReport(_sum_counts(counted), tuple(excluded), tuple(held))


def _sum_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for name, n in part.items():
            total[name] = total.get(name, 0) + n
    return {name: n for name, n in total.items() if n}


class KubeCluster:
    """The cluster behind an API server; see the module docstring for the contract."""

    def __init__(
        self,
        api: client.ApiClient,
        priority_classes: PriorityClasses | None = None,
        *,
        demand_of: DemandOf,
        backoff: Backoff | None = None,
        instance: str | None = None,
        not_ready_grace: float = DEFAULT_NOT_READY_GRACE,
        clock: Callable[[], float] = time.time,
        tick: float = 1.0,
        dra: DraWatch | None = None,
        release_check: ReleaseCheck | None = None,
        shared_of: SharedOf = no_shared,
    ) -> None:
        """Talk to the API server through ``api``; nothing happens until a call.

        ``demand_of``: a pod's GPU demand from its spec (see :func:`pod_from_manifest`),
        for fairgate's pods and for the GPUs held by pods fairgate does not manage.
        ``not_ready_grace``: seconds a node may be not Ready and still count;
        ``tick``: how often the watch re-checks the capacity for expired graces;
        ``dra``: the DRA objects (with slices), whose published GPUs add to capacity;
        ``release_check``: whether a pod with DRA claims may be released now
        (:func:`admission.dra.release_check` with the platform's rules and ``dra``'s
        objects), asked before its gate is lifted; ``shared_of``: the shared claims a
        pod names (:func:`admission.dra.shared_claims` with ``dra``'s objects).
        """
        if not_ready_grace < 0 or tick <= 0:
            raise ValueError("not_ready_grace must be >= 0 and tick > 0 (seconds)")
        self._core = client.CoreV1Api(api)
        self._priority_classes = priority_classes or PriorityClasses()
        self._demand_of = demand_of
        self._shared_of = shared_of
        self._backoff = backoff or Backoff()
        self._instance = instance or socket.gethostname()
        self._grace = not_ready_grace
        self._clock = clock
        self._tick = tick
        self._dra = dra
        self._release_check = release_check
        self._claim_pods: dict[str, Mapping[str, Any]] = {}  # uid -> a pod with claims
        if dra is not None:
            dra.on_change = self._publish
            dra.on_claim = self._claim_changed
        self._changes: queue.Queue[ClusterChange] = queue.Queue()
        self._nodes: dict[str, NodeGpus] = {}
        self._foreign: dict[str, ForeignPod] = {}  # pod uid -> the GPUs it holds
        self._listed: set[str] = set()  # watches ("nodes", "foreign") that listed once
        self._published: Mapping[str, int] = {}
        self._gate_index: dict[str, int] = {}  # pod uid -> index of our gate, as last seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- reads ---------------------------------------------------------------------------

    def list_pods(self) -> list[GpuPod]:
        """Every pod labelled ``fairgate.io/tenant`` that carries a ticket."""
        items, _ = list_all(self._core.list_pod_for_all_namespaces, label_selector=TENANT_LABEL)
        found = (self._remember(item) for item in items)
        return [pod for pod in found if pod is not None]

    def capacity(self) -> dict[str, int]:
        """The GPU resources fairgate's pods can use (see :meth:`capacity_report`)."""
        return dict(self.capacity_report().total)

    def capacity_report(self) -> CapacityReport:
        """:func:`capacity_report` of the nodes and foreign pods: as the watches see
        them once they have listed, else listed now."""
        with self._lock:
            if self._threads and self._watched():
                return self._report()
        nodes, _ = list_all(self._core.list_node)
        pods, _ = list_all(self._core.list_pod_for_all_namespaces,
                             field_selector=BOUND_UNFINISHED)
        foreign = [p for p in (self._foreign_pod(obj) for obj in pods) if p is not None]
        return capacity_report((node_gpus(n) for n in nodes), foreign, self._clock(),
                               self._grace, self._published_gpus())

    def _report(self) -> CapacityReport:
        """The report from the watches' state (caller holds the lock)."""
        return capacity_report(self._nodes.values(), self._foreign.values(), self._clock(),
                               self._grace, self._published_gpus())

    def _published_gpus(self) -> Mapping[str, Mapping[str, int]]:
        return {} if self._dra is None else self._dra.node_gpus()

    def _watched(self) -> bool:
        """Whether every watch the capacity depends on has listed (caller holds the lock)."""
        return self._listed >= WATCHED and (self._dra is None or self._dra.ready)

    def _foreign_pod(self, obj: Mapping[str, Any]) -> ForeignPod | None:
        return foreign_pod(obj, self._demand_of, self._priority_classes)

    def changes(self, timeout: float) -> list[ClusterChange]:
        """Changes queued by the watch threads; waits up to ``timeout`` for the first."""
        try:
            batch = [self._changes.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                batch.append(self._changes.get_nowait())
            except queue.Empty:
                return batch

    # -- watches -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch threads (idempotent): fairgate's pods, nodes, the bound pods of
        others, and a clock that re-checks the capacity every ``tick``
        (a not-Ready node's grace ends without any event)."""
        with self._lock:
            if self._threads:
                return
            self._stop.clear()
            self._listed = set()
            self._threads = [
                threading.Thread(target=self._watch_pods, name="watch-pods", daemon=True),
                threading.Thread(target=self._watch_nodes, name="watch-nodes", daemon=True),
                threading.Thread(target=self._capacity_clock, name="capacity-clock",
                                 daemon=True),
                threading.Thread(target=self._watch_foreign, name="watch-foreign-pods",
                                 daemon=True),
            ]
            threads = list(self._threads)
        if self._dra is not None:
            self._dra.start()
        for thread in threads:
            thread.start()

    def stop(self) -> None:
        """Ask the watch threads to stop; they end at their next event or timeout."""
        self._stop.set()
        if self._dra is not None:
            self._dra.stop()
        with self._lock:
            self._threads = []

    def _watch(self, lister: Callable[..., Any], on_list: Callable[[list[Any]], None],
               on_event: Callable[[str, dict[str, Any]], None], **kwargs: Any) -> None:
        watch(lister, on_list, on_event, self._stop, self._backoff, **kwargs)

    def _watch_pods(self) -> None:
        def on_list(_: list[Any]) -> None:
            self._changes.put(ClusterChange(ChangeKind.RESYNC))

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            pod = self._remember(obj, deleted=kind == "DELETED")
            if pod is not None:
                gone = ChangeKind.POD_GONE if kind == "DELETED" else ChangeKind.POD
                self._changes.put(ClusterChange(gone, pod))

        self._watch(self._core.list_pod_for_all_namespaces, on_list, on_event,
                    label_selector=TENANT_LABEL)

    def _publish(self) -> None:
        """Queue a CAPACITY change when the capacity differs from the last one published
        (only once every watch has listed: a half-known cluster is not reported)."""
        with self._lock:
            if not self._watched():
                return
            total = self._report().total
            if total == self._published:
                return
            self._published = total
        self._changes.put(ClusterChange(ChangeKind.CAPACITY))

    def _capacity_clock(self) -> None:
        while not self._stop.wait(self._tick):
            with self._lock:
                waiting = any(not node.ready for node in self._nodes.values())
            if waiting:  # only a not-Ready node's grace can end without an event
                self._publish()

    def _watch_nodes(self) -> None:
        def on_list(items: list[Any]) -> None:
            with self._lock:
                self._nodes = {str(item["metadata"]["name"]): node_gpus(item) for item in items}
                self._listed.add("nodes")
            self._publish()

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            name = str((obj.get("metadata") or {}).get("name", ""))
            node = None if kind == "DELETED" else node_gpus(obj)
            with self._lock:
                if self._nodes.get(name) == node:
                    return  # a heartbeat: nothing capacity depends on changed
                if node is None:
                    del self._nodes[name]
                else:
                    self._nodes[name] = node
            self._publish()

        self._watch(self._core.list_node, on_list, on_event)

    def _watch_foreign(self) -> None:
        """Bound, unfinished pods (server-side field selector); fairgate's own are
        skipped here (its pod watch accounts for them), the rest hold GPUs or not."""
        def on_list(items: list[Any]) -> None:
            found = {str(item["metadata"]["uid"]): self._foreign_pod(item) for item in items}
            with self._lock:
                self._foreign = {uid: pod for uid, pod in found.items() if pod is not None}
                self._listed.add("foreign")
            self._publish()

        def on_event(kind: str, obj: dict[str, Any]) -> None:
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            pod = None if kind == "DELETED" else self._foreign_pod(obj)
            with self._lock:
                if self._foreign.get(uid) == pod:
                    return  # not holding GPUs before or after, or holding the same
                if pod is None:
                    del self._foreign[uid]
                else:
                    self._foreign[uid] = pod
            self._publish()

        self._watch(self._core.list_pod_for_all_namespaces, on_list, on_event,
                    field_selector=BOUND_UNFINISHED)

    # -- writes --------------------------------------------------------------------------

    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        """Remove ``fairgate.io/queue`` from ``pod`` (the same uid) if it is still there.

        First with the gate's index as last seen by the watch (one request); if that is
        stale the ``test`` ops fail (422) and it reads the pod and retries with backoff.
        A pod with DRA claims is first checked (``release_check``): WAITING while a claim
        it will be allocated is not there yet; REFUSED, with a Warning Event saying why
        and what to do, when its claims now ask for more than it was admitted for (the
        gate stays).
        """
        verdict = self._check_claims(pod)
        if verdict is not None:
            return verdict
        index = self._gate_index.pop(pod.uid, None)
        if index is not None:
            try:
                self._patch_gate(pod, index)
                return LiftOutcome.LIFTED
            except ApiException as error:
                if error.status == 404:
                    return LiftOutcome.GONE
            except OSError:
                pass  # retried below with a fresh read
        delays = self._backoff.delays()
        while True:
            try:
                return self._try_lift(pod)
            except ApiException as error:
                if error.status == 404:
                    return LiftOutcome.GONE
                delay = next(delays, None)
                if error.status not in _RETRIABLE or delay is None:
                    log.error("lifting the gate of %s failed: HTTP %s %s",
                              pod.ref, error.status, (error.body or error.reason or "")[:300])
                    return LiftOutcome.FAILED
                time.sleep(delay)
            except OSError as error:
                delay = next(delays, None)
                if delay is None:
                    log.error("lifting the gate of %s failed: %s", pod.ref, error)
                    return LiftOutcome.FAILED
                time.sleep(delay)

    def _check_claims(self, pod: GpuPod) -> LiftOutcome | None:
        """None when ``pod`` may be lifted as far as its DRA claims go."""
        with self._lock:
            manifest = self._claim_pods.get(pod.uid)
        if manifest is None or self._release_check is None:
            return None
        verdict = self._release_check(manifest)
        if isinstance(verdict, Wait):
            log.info("release of %s waits for %s", pod.ref, verdict.reason)
            return LiftOutcome.WAITING
        if isinstance(verdict, Refuse):
            self._refuse(pod, verdict.reason)
            return LiftOutcome.REFUSED
        return None

    def _refuse(self, pod: GpuPod, reason: str) -> None:
        """Say on ``pod`` why it is never released as it is, and what to do."""
        message = (f"fairgate will not release this pod: {reason}. Delete the pod and create "
                   "it again to have it priced for the objects it names now")
        log.warning("refusing %s at release: %s", pod.ref, reason)
        self.post_event(pod, "ClaimsReplaced", message[:1024], "Warning")

    def _claim_changed(self, namespace: str, name: str) -> None:
        """A ResourceClaim changed: the pods whose claims it is are seen again (their
        allocation, or a release waiting for the claim)."""
        with self._lock:
            named = [obj for obj in self._claim_pods.values()
                     if (obj.get("metadata") or {}).get("namespace") == namespace
                     and name in _claim_names(obj)]
        for obj in named:
            pod = self._remember(obj)
            if pod is not None:
                self._changes.put(ClusterChange(ChangeKind.POD, pod))

    def _try_lift(self, pod: GpuPod) -> LiftOutcome:
        reader: Callable[..., Any] = self._core.read_namespaced_pod
        current = json.loads(reader(pod.ref.name, pod.ref.namespace, _preload_content=False).data)
        if str((current.get("metadata") or {}).get("uid")) != pod.uid:
            return LiftOutcome.GONE  # a different pod of the same name
        gates = (current.get("spec") or {}).get("schedulingGates") or []
        index = next((i for i, g in enumerate(gates) if g.get("name") == QUEUE_GATE), None)
        if index is None:
            return LiftOutcome.NOT_GATED
        self._patch_gate(pod, index)
        return LiftOutcome.LIFTED

    def _patch_gate(self, pod: GpuPod, index: int) -> None:
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": pod.uid},
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": QUEUE_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
        self._core.patch_namespaced_pod(
            pod.ref.name, pod.ref.namespace, patch, _content_type=JSON_PATCH,
            _preload_content=False,
        )

    def _remember(self, obj: Mapping[str, Any], deleted: bool = False) -> GpuPod | None:
        """Parse a pod and remember where its gate is (for a one-request lift)."""
        pod = pod_from_manifest(obj, self._priority_classes, self._demand_of,
                                self._shared_of)
        if pod is None:
            return None
        if pod.node is not None:
            with self._lock:
                node = self._nodes.get(pod.node)
            if node is not None and node.product:
                pod = replace(pod, gpu_product=node.product)
        gates = (obj.get("spec") or {}).get("schedulingGates") or []
        index = next((i for i, g in enumerate(gates) if g.get("name") == QUEUE_GATE), None)
        if index is None or deleted:
            self._gate_index.pop(pod.uid, None)
        else:
            self._gate_index[pod.uid] = index
        with self._lock:
            if deleted or pod.ended or not (obj.get("spec") or {}).get("resourceClaims"):
                self._claim_pods.pop(pod.uid, None)
            else:
                self._claim_pods[pod.uid] = obj
        return pod

    def post_event(self, pod: GpuPod, reason: str, message: str, type_: EventType) -> None:
        """Create a core/v1 Event about ``pod``; failures are logged and swallowed."""
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.ref.name}.", "namespace": pod.ref.namespace},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "namespace": pod.ref.namespace,
                "name": pod.ref.name, "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": {"component": EVENT_COMPONENT},
            "reportingComponent": f"fairgate.io/{EVENT_COMPONENT}",
            "reportingInstance": self._instance,
        }
        try:
            event = client.CoreV1Event.from_dict(body)
            assert event is not None
            self._core.create_namespaced_event(pod.ref.namespace, event, _preload_content=False)
        except (ApiException, OSError) as error:
            log.warning("could not post event %s on %s: %s", reason, pod.ref, error)
