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

from hypothesis import given, settings
from hypothesis import strategies as st

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
from admission.pods import PodView
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


class TenantSwaps:
    """The tenant, the controllers and fairgate, one action at a time."""

    def __init__(self) -> None:
        self.claims: dict[str, Obj] = {}
        self.templates: dict[str, Obj] = {}
        self.pods: dict[str, Pod] = {}
        self.serial = 0
        self.seen = self._context()

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

    def objects_first(self, claim: int, template: int) -> None:
        """A claim and a template named x exist before the first pod."""
        self.claims["x"] = Obj(self._uid(), claim)
        self.templates["x"] = Obj(self._uid(), template)
        self.watch_catches_up()

    def swap(self, kind: DraKind, count: int) -> None:
        """Delete x and create it again asking for ``count`` (the guard may refuse)."""
        self.delete_object(kind, "x")
        self.create_object(kind, "x", count)

    def create_object(self, kind: DraKind, name: str, count: int) -> None:
        store = self.claims if kind == CLAIM else self.templates
        if name in store or not self._guard(kind, name, count):
            return
        store[name] = Obj(self._uid(), count)

    def delete_object(self, kind: DraKind, name: str) -> None:
        store = self.claims if kind == CLAIM else self.templates
        found = store.get(name)
        if found is not None and not found.allocated:  # in use: deletion waits
            del store[name]

    def watch_catches_up(self) -> None:
        """The webhook's watch delivers every change made so far."""
        self.seen = self._context()

    def create_pod(self, pod: str, kind: DraKind, names: str) -> None:
        """The pod is priced from what the webhook's watch has delivered, which may be
        older than the objects are now (the watch lags)."""
        if pod in self.pods and self.pods[pod].state != "done":
            return
        source = "resourceClaimName" if kind == CLAIM else "resourceClaimTemplateName"
        view = PodView.parse({"metadata": {"name": pod, "namespace": NS},
                              "spec": {"containers": [{"name": "c"}],
                                       "resourceClaims": [{"name": "gpus", source: names}]}})
        context = self.seen
        try:
            admitted = claims_demand(view, context)
        except DraError:
            return  # refused at CREATE
        self.pods[pod] = Pod(self._uid(), kind, names, admitted,
                             claimguard.priced_objects(view, context))

    def delete_generated_claim(self, pod: str) -> None:
        found = self.pods.get(pod)
        if found is not None and found.generated is not None:
            claim = self.claims.get(found.generated)
            if claim is not None and not claim.allocated:
                del self.claims[found.generated]
                found.generated = None

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

    def dispatch(self) -> None:
        for pod in list(self.pods):
            self._release(pod)

    def _fits(self, found: Pod) -> bool:
        """Whether the queue would release ``found``: its price beside the charges of the
        released pods fits the quota."""
        used = sum(self._charged(n, p) for n, p in self.pods.items() if p.state == "released")
        return used + sum(found.admitted.values()) <= QUOTA

    def _release(self, pod: str) -> None:
        found = self.pods.get(pod)
        if found is None or found.state != "queued" or not self._fits(found):
            return
        verdict = release_check(PodView.parse(self._manifest(pod, found)), found.admitted,
                                self._context())
        if isinstance(verdict, Release):
            found.state = "released"
        elif isinstance(verdict, Refuse):
            found.state = "refused"

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

    def allocated_within_quota_and_charge(self) -> None:
        held = {n for n, p in self.pods.items() if p.state == "released"}
        allocated = sum(o.count for n, o in self.claims.items() if o.allocated and any(
            self._claim_of(self.pods[p]) == n for p in held))
        charged = sum(self._charged(n, self.pods[n]) for n in held)
        assert allocated <= charged <= QUOTA, (allocated, charged, self.claims, self.pods)


ACTIONS = st.one_of(
    st.tuples(st.just("create_object"), KINDS, NAMES, COUNTS),
    st.tuples(st.just("delete_object"), KINDS, NAMES),
    st.tuples(st.just("create_pod"), PODS, KINDS, NAMES),
    st.tuples(st.just("delete_generated_claim"), PODS),
    st.tuples(st.just("finish"), PODS),
    st.tuples(st.just("watch_catches_up")),
    st.tuples(st.just("controller_makes_claims")),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("schedule")),
)
MOMENTS = ("before the pod", "while the webhook's watch lags", "while its pod is gated",
           "after its claim is made", "after its release", "while it runs")
LIFE = ("create_pod", "controller_makes_claims", "dispatch", "schedule")


@settings(max_examples=500, deadline=None)
@given(KINDS, COUNTS, COUNTS, st.sampled_from(MOMENTS), st.booleans(),
       st.lists(ACTIONS, max_size=12), st.lists(ACTIONS, max_size=12))
def test_swaps_never_let_allocated_pass_charged_or_quota(
        kind: DraKind, first: int, then: int, moment: str, regenerate: bool,
        before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]) -> None:
    """One pod's life (priced, gated, its claim made, released, allocated, running) with
    x swapped for one asking ``then`` at ``moment`` (a template's claim also deleted and
    made again from the new template with ``regenerate``), amid random other actions.
    After every action: allocated <= charged <= quota (see the module doc)."""
    cluster = TenantSwaps()
    cluster.objects_first(first, first)
    steps: list[tuple[Any, ...]] = [*before]
    swap: list[tuple[Any, ...]] = [("swap", kind, then)]
    if regenerate and kind == TEMPLATE:
        swap += [("delete_generated_claim", "p0"), ("controller_makes_claims",)]
    life: list[tuple[Any, ...]] = [("create_pod", "p0", kind, "x"), ("watch_catches_up",),
                                   ("controller_makes_claims",), ("dispatch",), ("schedule",)]
    at = MOMENTS.index(moment)
    if at == 1:  # the swap lands after the watch's last delivery, before the pod
        steps += [*swap, *life]
    else:
        steps += [*life[:at], *swap, *life[at:]]
    steps += [*after, ("controller_makes_claims",), ("dispatch",), ("schedule",)]
    for name, *arguments in steps:
        getattr(cluster, name)(*arguments)
        cluster.allocated_within_quota_and_charge()
