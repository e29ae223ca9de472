"""Property: with several pods sharing a ResourceClaim, charged once by its uid to one pod
that holds it (admission.sharing), no sequence of creates, deletes, swaps, releases and
ends lets the devices allocated to a tenant's pods pass what fairgate charges it or its
quota; and two pods holding one allocated claim are charged for it once.

The tenant, the resourceclaim controller and the scheduler are played as in
``test_dra_swap_properties`` (whose state machine this extends). fairgate's side runs
through its real functions: the pricing and swap refusal at admission, the release check,
and the charge the reconciler rebuilds from the pods as the cluster shows them
(:func:`fairshare.cluster.kube.pod_from_manifest` with :func:`admission.demand.held_demand`
and :func:`admission.dra.shared_claims`, then
:func:`fairshare.cluster.reconcile.pod_charges`). A queued pod is released when the
tenant's charges with it released fit the quota.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_dra_swap_properties import CLAIM, COUNTS, QUOTA, Pod, TenantSwaps

from admission.demand import held_demand
from admission.dra import DraKind, priced_record, shared_claims
from admission.pods import PodView
from fairshare.cluster.cluster import GpuPod
from fairshare.cluster.kube import pod_from_manifest
from fairshare.cluster.reconcile import pod_charges
from tenants.models import PRICED_CLAIMS_ANNOTATION, PriorityClasses

PODS = st.sampled_from(["p0", "p1", "p2"])


class SharedClaims(TenantSwaps):
    """:class:`TenantSwaps`, charged as the reconciler charges shared claims; each pod
    carries the record of what it was priced from (``fairgate.io/priced-claims``)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, str] = {}  # pod uid -> its priced-claims stamp

    def create_pod(self, pod: str, kind: DraKind, names: str) -> None:
        before = self.pods.get(pod)
        super().create_pod(pod, kind, names)
        found = self.pods.get(pod)
        if found is not None and found is not before:  # admitted, priced with the watch's
            view = PodView.parse(super()._manifest(pod, found))
            self.records[found.uid] = priced_record(view, self.seen)

    def _manifest(self, name: str, pod: Pod) -> dict[str, Any]:
        manifest = super()._manifest(name, pod)
        manifest["metadata"]["annotations"][PRICED_CLAIMS_ANNOTATION] = self.records[pod.uid]
        return manifest

    def _pod(self, name: str) -> GpuPod:
        context = self._context()
        found = pod_from_manifest(self._manifest(name, self.pods[name]), PriorityClasses(),
                                  lambda view: held_demand(view, context),
                                  lambda view: shared_claims(view, context))
        assert found is not None
        record = self.records[found.uid]  # the claim's name, for people, comes from it
        assert found.claim_names == {uid: "x" for uid in found.shared
                                     if f"ResourceClaim/x/{uid}/" in record}, found
        return found

    def _held(self) -> set[str]:
        return {n for n, p in self.pods.items() if p.state == "released"}

    def charged(self, names: set[str]) -> int:
        """What the tenant is charged with ``names`` the pods holding capacity."""
        return sum(sum(c.values()) for c in pod_charges([self._pod(n) for n in names]).values())

    def _fits(self, found: Pod) -> bool:
        found.state = "released"  # what the tenant would be charged with it released
        fits = self.charged(self._held()) <= QUOTA
        found.state = "queued"
        return fits

    def allocated_within_quota_and_charge(self) -> None:
        held = self._held()
        allocated = {n: o.count for n, o in self.claims.items() if o.allocated and any(
            self._claim_of(self.pods[p]) == n for p in held)}
        charged = self.charged(held)
        assert sum(allocated.values()) <= charged <= QUOTA, (allocated, charged, self.pods)
        # a claim held by several pods is charged once: with only claim x held, by pods
        # priced for this x (not one it replaced: that is another demand), the charge is
        # x's devices
        sharing = [p for p in held if self._claim_of(self.pods[p]) == "x"]
        if len(sharing) == len(held) > 1 and "x" in allocated and all(
                f"/x/{self.claims['x'].uid}/" in self.records[self.pods[p].uid]
                for p in sharing):
            assert charged == allocated["x"], (charged, allocated, self.pods)


ACTIONS = st.one_of(
    st.tuples(st.just("swap"), st.just(CLAIM), COUNTS),
    st.tuples(st.just("create_pod"), PODS, st.just(CLAIM), st.just("x")),
    st.tuples(st.just("finish"), PODS),
    st.tuples(st.just("watch_catches_up")),
    st.tuples(st.just("dispatch")),
    st.tuples(st.just("schedule")),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 2, 3, 4]), st.lists(ACTIONS, max_size=20))
def test_a_shared_claim_is_charged_once_and_never_below_what_is_allocated(
        count: int, actions: list[tuple[Any, ...]]) -> None:
    """Three pods naming claim x (``count`` GPUs) come, run and end in any order, amid
    swaps of x; after every action: allocated <= charged <= quota, and x held by several
    pods is charged once."""
    cluster = SharedClaims()
    cluster.objects_first(count, 1)
    steps: list[tuple[Any, ...]] = [("create_pod", "p0", CLAIM, "x"),
                                    ("create_pod", "p1", CLAIM, "x"), *actions,
                                    ("dispatch",), ("schedule",)]
    for name, *arguments in steps:
        getattr(cluster, name)(*arguments)
        cluster.allocated_within_quota_and_charge()


def test_two_pods_holding_one_claim_within_quota_both_run_charged_once() -> None:
    cluster = SharedClaims()
    cluster.objects_first(3, 1)
    for step in (("create_pod", "p0", CLAIM, "x"), ("create_pod", "p1", CLAIM, "x"),
                 ("dispatch",), ("schedule",), ("dispatch",)):
        getattr(cluster, step[0])(*step[1:])
    assert cluster._held() == {"p0", "p1"}
    assert cluster.charged({"p0", "p1"}) == 3
    cluster.finish("p0")  # the other still holds x: still charged for it
    assert cluster.charged(cluster._held()) == 3
