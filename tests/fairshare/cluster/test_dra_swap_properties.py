"""Property: no sequence of creates, deletes and re-creates of pods, claims and templates
by a tenant lets the devices allocated to its pods pass its quota, or what fairgate
charges it fall below what they hold.

A state machine plays the tenant (claims, templates and pods in one namespace), the
resourceclaim controller (a template's claim, made from the template as it is at that
moment, remade when deleted), the scheduler (allocates what a released pod's claims ask
for now) and fairgate, through its real functions: the webhook's pricing and its refusal
of a replacement object (:mod:`admission.claimguard`), the dispatcher's check before a
release (:func:`admission.dra.release_check`) and the charge of a pod as the cluster
shows it (:func:`fairshare.cluster.kube.pod_from_manifest` over
:func:`admission.demand.held_demand`). The queue is modelled: a pod is released when its
admitted price fits the quota beside the charges of the released pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from admission import claimguard
from admission.demand import held_demand
from admission.dra import (
    CLAIM,
    TEMPLATE,
    AllocatedDevice,
    DraContext,
    DraError,
    DraKind,
    DraObject,
    DraObjects,
    Refuse,
    Release,
    claims_demand,
    release_check,
)
from fairshare.cluster.kube import pod_from_manifest
from tenants.models import PriorityClasses
from tenants.resources import ResourceCounts, format_counts

NS = "team-a-dev"
QUOTA = 4
NAMES = st.sampled_from(["x", "y"])
PODS = st.sampled_from(["p0", "p1"])
COUNTS = st.sampled_from([0, 1, 2, 4, 8])
KINDS = st.sampled_from([CLAIM, TEMPLATE])


def _spec(count: int) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "r", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": count}}]}}


@dataclass
class Obj:
    uid: str
    count: int
    owner: str = ""
    allocated: bool = False


@dataclass
class Pod:
    uid: str
    kind: DraKind
    names: str  # the claim or template its one entry names
    admitted: ResourceCounts
    priced: dict[claimguard.DraObjectRef, ResourceCounts]
    state: str = "queued"  # queued, released, refused, done
    generated: str | None = None
    ticket: str = field(default="")

    @property
    def live(self) -> bool:
        """Its admission is live: queued or released (the queue holds its ticket)."""
        return self.state in ("queued", "released")


@dataclass(frozen=True)
class Admission:
    """A live admission as the index gives it to the webhook."""

    devices: ResourceCounts
    state: str
    namespace: str
    name: str


class TenantSwaps(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[str, Obj] = {}
        self.templates: dict[str, Obj] = {}
        self.pods: dict[str, Pod] = {}
        self.serial = 0

    # -- what fairgate and the cluster see ---------------------------------------------

    def _uid(self) -> str:
        self.serial += 1
        return f"uid-{self.serial}"

    def _context(self) -> DraContext:
        def claim(obj: Obj) -> DraObject:
            allocation = tuple(AllocatedDevice("r", "gpu.nvidia.com", "pool", f"gpu-{i}")
                               for i in range(obj.count)) if obj.allocated else None
            return DraObject(_spec(obj.count), obj.uid, obj.owner, allocation)

        return DraContext(NS, objects=DraObjects(
            templates={(NS, n): DraObject(_spec(o.count), o.uid)
                       for n, o in self.templates.items()},
            claims={(NS, n): claim(o) for n, o in self.claims.items()},
        ))

    def _manifest(self, name: str, pod: Pod) -> dict[str, Any]:
        source = ("resourceClaimName" if pod.kind == CLAIM else "resourceClaimTemplateName")
        status: dict[str, Any] = {"phase": "Running" if pod.state == "released" else "Pending"}
        if pod.generated is not None:
            status["resourceClaimStatuses"] = [{"name": "gpus",
                                                "resourceClaimName": pod.generated}]
        return {
            "metadata": {"name": name, "namespace": NS, "uid": pod.uid,
                         "labels": {"fairgate.io/tenant": "team-a",
                                    "fairgate.io/class": "training"},
                         "annotations": {"fairgate.io/ticket": pod.ticket or pod.uid,
                                         "fairgate.io/demand": format_counts(pod.admitted)}},
            "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", source: pod.names}],
                     "schedulingGates": ([{"name": "fairgate.io/queue"}]
                                         if pod.state != "released" else [])},
            "status": status,
        }

    def _claim_of(self, pod: Pod) -> str | None:
        return pod.names if pod.kind == CLAIM else pod.generated

    def _charged(self, name: str, pod: Pod) -> int:
        context = self._context()
        found = pod_from_manifest(self._manifest(name, pod), PriorityClasses(),
                                  lambda obj: held_demand(obj, context))
        assert found is not None
        return sum(found.demand.values())

    def _guard(self, kind: DraKind, name: str, count: int) -> bool:
        """The webhook's /validate of a CREATE by the tenant: True if allowed."""
        ref = claimguard.DraObjectRef(NS, kind, name)
        created = claimguard.CreatedObject(ref, _spec(count), {"name": name})
        admitted = [Admission(p.priced[ref], p.state, NS, n)
                    for n, p in self.pods.items() if p.live and ref in p.priced]
        return claimguard.swap_refusal(
            ref, claimguard.asked(created, self._context()), admitted) is None

    # -- the tenant --------------------------------------------------------------------

    @rule(kind=KINDS, name=NAMES, count=COUNTS)
    def create_object(self, kind: DraKind, name: str, count: int) -> None:
        store = self.claims if kind == CLAIM else self.templates
        if name in store or not self._guard(kind, name, count):
            return
        store[name] = Obj(self._uid(), count)

    @rule(kind=KINDS, name=NAMES)
    def delete_object(self, kind: DraKind, name: str) -> None:
        store = self.claims if kind == CLAIM else self.templates
        found = store.get(name)
        if found is not None and not found.allocated:  # in use: deletion waits
            del store[name]

    @rule(pod=PODS, kind=KINDS, names=NAMES)
    def create_pod(self, pod: str, kind: DraKind, names: str) -> None:
        if pod in self.pods and self.pods[pod].state != "done":
            return
        source = "resourceClaimName" if kind == CLAIM else "resourceClaimTemplateName"
        manifest = {"metadata": {"name": pod, "namespace": NS},
                    "spec": {"containers": [{"name": "c"}],
                             "resourceClaims": [{"name": "gpus", source: names}]}}
        context = self._context()
        try:
            admitted = claims_demand(manifest, context)
        except DraError:
            return  # refused at CREATE
        self.pods[pod] = Pod(self._uid(), kind, names, admitted,
                             claimguard.priced_objects(manifest, context))

    @rule(pod=PODS)
    def delete_generated_claim(self, pod: str) -> None:
        found = self.pods.get(pod)
        if found is not None and found.generated is not None:
            claim = self.claims.get(found.generated)
            if claim is not None and not claim.allocated:
                del self.claims[found.generated]
                found.generated = None

    @rule(pod=PODS)
    def finish(self, pod: str) -> None:
        found = self.pods.get(pod)
        if found is None or found.state == "done":
            return
        found.state = "done"
        if found.generated is not None:
            self.claims.pop(found.generated, None)
        elif found.kind == CLAIM and found.names in self.claims:
            users = [p for p in self.pods.values()
                     if p.state == "released" and p.kind == CLAIM and p.names == found.names]
            if not users:
                self.claims[found.names].allocated = False

    # -- the resourceclaim controller, fairgate's dispatcher, the scheduler ----------------

    @rule()
    def controller_makes_claims(self) -> None:
        for pod in list(self.pods):
            self._make_claim(pod)

    def _make_claim(self, pod: str) -> None:
        found = self.pods.get(pod)
        if (found is None or found.kind != TEMPLATE or found.generated is not None
                or found.state in ("done", "refused") or found.names not in self.templates):
            return
        name = f"{pod}-gpus-{self.serial}"
        self.claims[name] = Obj(self._uid(), self.templates[found.names].count, found.uid)
        found.generated = name

    @rule()
    def dispatch(self) -> None:
        for pod in list(self.pods):
            self._release(pod)

    def _release(self, pod: str) -> None:
        found = self.pods.get(pod)
        if found is None or found.state != "queued":
            return
        used = sum(self._charged(n, p) for n, p in self.pods.items() if p.state == "released")
        if used + sum(found.admitted.values()) > QUOTA:
            return
        verdict = release_check(self._manifest(pod, found), found.admitted, self._context())
        if isinstance(verdict, Release):
            found.state = "released"
        elif isinstance(verdict, Refuse):
            found.state = "refused"

    @rule()
    def schedule(self) -> None:
        for pod in list(self.pods):
            self._allocate(pod)

    def _allocate(self, pod: str) -> None:
        found = self.pods.get(pod)
        name = self._claim_of(found) if found is not None else None
        if found is None or found.state != "released" or name not in self.claims:
            return
        assert name is not None
        self.claims[name].allocated = True

    # -- what must hold after every step -------------------------------------------------

    @invariant()
    def allocated_within_quota_and_charge(self) -> None:
        held = {n for n, p in self.pods.items() if p.state == "released"}
        allocated = sum(o.count for n, o in self.claims.items() if o.allocated and any(
            self._claim_of(self.pods[p]) == n for p in held))
        charged = sum(self._charged(n, self.pods[n]) for n in held)
        assert allocated <= charged <= QUOTA, (allocated, charged, self.claims, self.pods)


TestTenantSwaps = TenantSwaps.TestCase
TestTenantSwaps.settings = settings(max_examples=400, stateful_step_count=25, deadline=None)
