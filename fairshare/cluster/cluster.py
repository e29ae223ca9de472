"""The one small interface between the queue logic and a cluster.

Contract:
- A :class:`GpuPod` is what fairgate needs to know about a pod the webhook stamped
  (label ``fairgate.io/tenant`` and annotation ``fairgate.io/ticket``): its ticket, tenant,
  class, priority band, demand, gang, phase, whether it still carries the
  ``fairgate.io/queue`` gate, node, creation time, whether it is being deleted, its
  node's GPU product (label ``nvidia.com/gpu.product``), whether the scheduler reports it
  unschedulable (``PodScheduled=False``, reason ``Unschedulable``, and no node nominated
  for it by preemption), whether the scheduler preempted it (and for whom, when the
  cluster can tell) and the shared ResourceClaims it names, by uid
  (:mod:`admission.sharing`: its demand counts each in full; the reconciler charges each
  to one pod of the tenant).
- A :class:`Cluster` lists and watches such pods, reports the GPU capacity that fairgate's
  pods can use (short resource names) and why the rest is not counted
  (:class:`CapacityReport`), lifts the gate of one pod and posts Events on pods.
  ``kube.KubeCluster`` talks to a real API server; ``simcluster.SimulatedCluster`` is an
  in-memory cluster for the demo and the simulator. The dispatcher and the reconciler
  only ever see this interface.
- :meth:`Cluster.lift_gate` removes exactly the ``fairgate.io/queue`` gate and nothing
  else, and only if it is still there (several dispatchers may race: at most one lifts).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from admission.sharing import Sharer
from tenants import resources
from tenants.models import PodClass, PriorityBand

DEFAULT_NOT_READY_GRACE = 40.0
"""Seconds a node may be not Ready and still count as capacity (``--not-ready-grace``)."""
DEFAULT_UNSCHEDULABLE_GRACE = 60.0
"""Seconds a released pod may be reported ``Unschedulable`` before the dispatcher catches it
(``--unschedulable-grace``): longer than the default ``--not-ready-grace`` and than the
scheduler takes to retry a pod after a cluster change."""
PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class PodRef:
    """A pod by namespace and name (what ``fairgate why`` takes as ``<ns>/<name>``)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> PodRef:
        """Parse ``<namespace>/<name>``; raises ValueError saying what is expected."""
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(
                f"bad pod reference {text!r}: expected <namespace>/<pod>, e.g. team-a-dev/train-0"
            )
        return cls(namespace, name)


@dataclass(frozen=True)
class GpuPod:
    """A pod fairgate stamped, as the cluster sees it now."""

    ref: PodRef
    uid: str
    ticket: str
    tenant: str
    pod_class: PodClass
    band: PriorityBand
    demand: Mapping[str, int]
    group: str | None
    group_size: int
    phase: PodPhase
    gated: bool
    node: str | None
    created: float
    deleting: bool = False
    started_at: float | None = None
    """Its ``status.startTime`` (whole seconds, as the API serves it and the kube-scheduler
    compares it when it picks preemption victims); None until the kubelet starts it."""
    unschedulable: str | None = None
    """The scheduler's message while it reports the pod ``PodScheduled=False`` with reason
    ``Unschedulable`` and has nominated no node for it (a nominated node means preemption
    victims are on their way out: the capacity is there); None otherwise."""
    gpu_product: str | None = None  # its node's nvidia.com/gpu.product, when known
    preempted: bool = False  # DisruptionTarget condition, reason PreemptionByScheduler
    preemptor: str | None = None  # ``namespace/name`` of the pod it made room for, if known
    preemptible: bool = False  # labelled fairgate.io/preemptible: "true" (reclaim may evict it)
    overrun: Mapping[str, int] = field(default_factory=dict)
    """What its DRA claims were allocated beyond what it was admitted for, by resource
    (counted in :attr:`demand`); empty when within."""
    run_seconds: int | None = None  # its own spec.activeDeadlineSeconds (declared run time)
    shared: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """The ResourceClaims it names by name, by uid: the devices each gives, keyed as
    :attr:`demand` (which counts each in full)."""
    claim_names: Mapping[str, str] = field(default_factory=dict)
    """The names of the ResourceClaims it was priced from at admission, by uid (for
    people: accounting goes by :attr:`shared`'s uids)."""

    @property
    def finished(self) -> bool:
        """Whether the pod ended (it holds no GPUs any more)."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def ended(self) -> bool:
        """Whether the pod will never hold a GPU again: it finished, or it is being
        deleted without ever having been bound to a node (the scheduler never binds a
        deleting pod, whatever finalizer keeps it)."""
        return self.finished or (self.deleting and self.node is None)

    @property
    def slices(self) -> int:
        """The pod's demand in compute slices."""
        return resources.total_slices(self.demand)

    @property
    def holds_capacity(self) -> bool:
        """Whether the pod counts against usage: released (no gate) and not finished."""
        return not self.gated and not self.finished

    @property
    def sharer(self) -> Sharer:
        """The pod as the accounting of shared claims sees it."""
        return Sharer(self.uid, self.tenant, self.created, self.holds_capacity, self.shared)


@dataclass(frozen=True)
class NodeExclusion:
    """A node whose GPUs are not capacity, and why (e.g. ``cordoned``)."""

    node: str
    reason: str
    resources: Mapping[str, int]  # what it would offer otherwise


@dataclass(frozen=True)
class ForeignHold:
    """GPUs of a counted node held by pods fairgate does not manage (subtracted)."""

    node: str
    resources: Mapping[str, int]
    pods: tuple[str, ...]  # ``namespace/name`` of the pods holding them


_NAMED_PODS = 3  # pods named per node in a note; the rest are counted


@dataclass(frozen=True)
class CapacityReport:
    """The capacity fairgate's pods can use (``total``), the nodes left out and the GPUs
    other pods hold. JSON-ready through :meth:`to_json` / :meth:`from_json`."""

    total: Mapping[str, int]
    excluded: tuple[NodeExclusion, ...] = ()
    held: tuple[ForeignHold, ...] = ()

    def notes(self) -> list[str]:
        """One line per excluded node and per node with foreign-held GPUs, e.g.
        ``node gpu-3 cordoned (gpu=4 not counted)``."""
        lines = [f"node {e.node} {e.reason} ({resources.format_counts(e.resources)} not "
                 f"counted)" for e in self.excluded]
        for hold in self.held:
            named = ", ".join(hold.pods[:_NAMED_PODS])
            more = len(hold.pods) - _NAMED_PODS
            who = f"{named} and {more} more" if more > 0 else named
            count = len(hold.pods)
            lines.append(f"node {hold.node}: {resources.format_counts(hold.resources)} held by "
                         f"{count} pod{'s' if count != 1 else ''} fairgate does not manage "
                         f"({who})")
        return lines

    def to_json(self) -> dict[str, Any]:
        """Plain data: ``total``, ``excluded`` and ``held`` (lists of objects)."""
        return {
            "total": dict(self.total),
            "excluded": [{"node": e.node, "reason": e.reason, "resources": dict(e.resources)}
                         for e in self.excluded],
            "held": [{"node": h.node, "resources": dict(h.resources), "pods": list(h.pods)}
                     for h in self.held],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapacityReport:
        """The report :meth:`to_json` wrote; raises KeyError/TypeError on other data."""
        return cls(
            total={str(k): int(v) for k, v in data["total"].items()},
            excluded=tuple(NodeExclusion(str(e["node"]), str(e["reason"]),
                                         {str(k): int(v) for k, v in e["resources"].items()})
                           for e in data["excluded"]),
            held=tuple(ForeignHold(str(h["node"]),
                                   {str(k): int(v) for k, v in h["resources"].items()},
                                   tuple(str(p) for p in h["pods"]))
                       for h in data["held"]),
        )


class ChangeKind(enum.Enum):
    """What happened to a watched object."""

    POD = "pod"  # added or modified: the pod as it is now
    POD_GONE = "pod_gone"  # deleted from the API server
    CAPACITY = "capacity"  # the capacity fairgate's pods can use changed
    RESYNC = "resync"  # the watch restarted: the caller should reconcile from a full list


@dataclass(frozen=True)
class ClusterChange:
    """One change seen by :meth:`Cluster.changes`; ``pod`` is set for pod changes."""

    kind: ChangeKind
    pod: GpuPod | None = None


class LiftOutcome(enum.Enum):
    """The result of :meth:`Cluster.lift_gate`."""

    LIFTED = "lifted"  # this call removed the gate
    NOT_GATED = "not_gated"  # the gate was already gone (someone else lifted it)
    GONE = "gone"  # the pod no longer exists
    FAILED = "failed"  # the API kept failing; the pod is still gated
    WAITING = "waiting"  # what its release is checked against (a claim) is not there yet
    REFUSED = "refused"  # its claims now ask for more than it was admitted for: never lifted


class Cluster(Protocol):
    """What the dispatcher and reconciler need from a cluster."""

    def list_pods(self) -> list[GpuPod]:
        """Every fairgate pod that exists now (gated, pending, running or finished)."""
        ...

    def changes(self, timeout: float) -> list[ClusterChange]:
        """Changes since the last call, waiting up to ``timeout`` seconds for the first."""
        ...

    def capacity(self) -> dict[str, int]:
        """The GPU resources fairgate's pods can use, by short resource name."""
        ...

    def capacity_report(self) -> CapacityReport:
        """:meth:`capacity` (as ``total``) with what was left out and why."""
        ...

    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        """Remove the ``fairgate.io/queue`` gate from ``pod`` if it is still there."""
        ...

    def post_event(self, pod: GpuPod, reason: str, message: str, type_: EventType) -> None:
        """Record an Event on ``pod`` (best effort: failures are logged, not raised)."""
        ...
