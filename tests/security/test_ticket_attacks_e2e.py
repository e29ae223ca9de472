"""Quota integrity attacks (invariant 7 in docs/reference.md) on a real kube-apiserver.

The dispatcher (real `Dispatcher` + `KubeCluster` watching a real API server, real Redis,
fake kubelet) must keep usage exact whatever a tenant does to its pods after admission.
No ValidatingAdmissionPolicy is installed here: these tests show that the dispatcher holds
on its own (defence in depth; the policy that refuses the edits is tested in
test_stamp_immutability_e2e.py). Each attack uses the cluster admin's client to play the
tenant, so that the API server accepts the edit.

The control plane and fake kubelet are the session's (tests/security/conftest.py). Pods
are stamped the way the mutating webhook stamps them: the queue decides (`admit`),
then the pod is created with the tenant/class labels, ticket/demand annotations and, when
queued, the `fairgate.io/queue` gate.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from admission.demand import pod_demand
from fairshare.cluster.kube import KubeCluster
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.calls import TicketConflictError
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, PodRequest
from tenants.models import FairgateConfig
from tests.e2e.harness.api import create_namespace
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import FakeKubelet
from tests.e2e.harness.pods import pod_manifest
from tests.fairshare.simkit import make_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GATE = "fairgate.io/queue"
MERGE = "application/merge-patch+json"
CONFIG: FairgateConfig = make_config({
    "team-a": {"nominal": {"gpu": 4}},
    "team-b": {"nominal": {"gpu": 4}},
})


@pytest.fixture
def core(controlplane: ControlPlane) -> Any:
    return client.CoreV1Api(controlplane.admin)


class Rig:
    """The queue, a running dispatcher's steps, and a webhook stand-in."""

    def __init__(self, controlplane: ControlPlane, core: Any, redis_url: str) -> None:
        self.core = core
        self.redis = redis.Redis.from_url(redis_url)
        self.queue = FairQueue(self.redis)
        # demand from the pod's spec, as `fairgate dispatch` wires it (webhook/dispatch.py)
        self.cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
        self.cluster.start()
        self.dispatcher = Dispatcher(
            self.queue, self.cluster, lambda: CONFIG,
            settings=DispatcherSettings(lift_workers=1, reconcile_every=math.inf,
                                        idle_wait=0.1),
        )
        self.namespaces: list[str] = []
        deadline = time.monotonic() + 20
        while not self.cluster.capacity().get("gpu") and time.monotonic() < deadline:
            time.sleep(0.1)  # the node watch has not listed the nodes yet
        self.dispatcher.sync(force=True)
        assert self.cluster.capacity()["gpu"] >= 8

    def namespace(self, tenant: str) -> str:
        name = f"{tenant}-{uuid.uuid4().hex[:6]}"
        create_namespace(self.core, name, {"fairgate.io/tenant": tenant})
        self.namespaces.append(name)
        return name

    def create(self, namespace: str, tenant: str, name: str, gpus: int,
               generate: bool = False, ticket: str | None = None,
               extra: Callable[[dict[str, Any]], None] | None = None
               ) -> tuple[Admission, dict[str, Any], str]:
        """Admit a training pod as the webhook would, then create it; returns the
        admission, the manifest sent and the created pod's name."""
        ticket = ticket or str(uuid.uuid4())
        request = PodRequest(ticket, tenant, namespace, f"{name}*" if generate else name,
                             "training", {"gpu": gpus}, submitted_at=time.time())
        answer = self.queue.admit(request, time.time())
        manifest = pod_manifest(
            name, {"nvidia.com/gpu": gpus},
            labels={"fairgate.io/tenant": tenant, "fairgate.io/class": "training"},
            annotations={"fairgate.io/ticket": ticket, "fairgate.io/demand": f"gpu={gpus}"},
            gates=[GATE] if answer.outcome == "queued" else [],
        )
        if generate:
            del manifest["metadata"]["name"]
            manifest["metadata"]["generateName"] = name
        if extra is not None:
            extra(manifest)
        created = self.core.create_namespaced_pod(namespace, manifest)
        return answer, manifest, created.metadata.name

    def settle(self, until: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        """Run dispatcher steps until ``until()`` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.dispatcher.step(0.2)
            if until():
                return
        raise AssertionError(f"timed out waiting for {what}")

    def steps(self, seconds: float) -> None:
        """Let the dispatcher handle whatever the watch brings for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.dispatcher.step(0.2)

    def used_gpus(self, tenant: str) -> float:
        """The tenant's usage in Redis, in GPU-equivalents (0 when unknown)."""
        for status in self.queue.tenant_status():
            if status.tenant == tenant:
                return status.used_slices / 7
        return 0.0

    def running_gpus(self, tenant: str) -> int:
        """GPUs the tenant's live pods really hold (bound or ungated, not finished), by
        the pods' specs in the cluster's namespaces of that tenant."""
        total = 0
        for namespace in self.namespaces:
            if not namespace.startswith(tenant):
                continue
            for pod in self.core.list_namespaced_pod(namespace).items:
                gated = any(g.name == GATE for g in pod.spec.scheduling_gates or [])
                if gated or pod.status.phase in ("Succeeded", "Failed"):
                    continue
                if pod.metadata.deletion_timestamp and not pod.spec.node_name:
                    continue
                limits = pod.spec.containers[0].resources.limits or {}
                total += int(limits.get("nvidia.com/gpu", 0))
        return total

    def edit(self, namespace: str, name: str, metadata: dict[str, Any]) -> None:
        """The tenant's edit of a pod's metadata (merge patch, as the cluster admin).

        A module before this one may have run fairgate's `fairgate-stamps` policy, which
        refuses exactly these edits; the API server drops a deleted policy from its
        cache a moment after the deletion, so a refusal naming it is retried briefly."""
        deadline = time.monotonic() + 15
        while True:
            try:
                self.core.patch_namespaced_pod(name, namespace, {"metadata": metadata},
                                               _content_type=MERGE)
                return
            except ApiException as error:
                if "fairgate-stamps" not in str(error.body) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def rebuild(self) -> None:
        """Redis is lost (flushed) and the dispatcher rebuilds usage and queue from the
        cluster alone. (With Redis intact, a reconcile keeps tickets admitted within the
        reservation TTL before the listing as they are: FairQueue.rebuild.)"""
        self.redis.flushall()
        self.dispatcher.reconcile()

    def phase(self, namespace: str, name: str) -> str:
        return str(self.core.read_namespaced_pod(name, namespace).status.phase)

    def close(self) -> None:
        self.cluster.stop()
        self.dispatcher.close()
        for namespace in self.namespaces:
            for pod in self.core.list_namespaced_pod(namespace).items:
                if pod.metadata.finalizers:
                    self.core.patch_namespaced_pod(pod.metadata.name, namespace,
                                                   {"metadata": {"finalizers": None}},
                                                   _content_type=MERGE)
            self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        self.redis.close()


@pytest.fixture
def rig(
    controlplane: ControlPlane, kubelet: FakeKubelet, core: Any, redis_url: str
) -> Iterator[Rig]:
    """A Rig on the session's GPU nodes (the fake kubelet registers them and runs pods)."""
    made = Rig(controlplane, core, redis_url)
    try:
        yield made
    finally:
        made.close()


def test_relabelled_finished_pod_with_a_copied_ticket_frees_nothing(
    rig: Rig, kubelet: FakeKubelet
) -> None:
    """The issue's reproduction: team-b (4 GPUs) runs `big` (3 GPUs); `done` (1 GPU)
    finishes; the user stamps `done` with big's ticket and team-a's label. Before the fix
    the dispatcher released big's ticket and team-b ran 6 GPUs on a 4-GPU quota."""
    ns = rig.namespace("team-b")
    big, _, _ = rig.create(ns, "team-b", "big", 3)
    done, _, _ = rig.create(ns, "team-b", "done", 1)
    assert big.outcome == done.outcome == "reserved"
    rig.settle(lambda: rig.phase(ns, "big") == rig.phase(ns, "done") == "Running", "pods run")
    kubelet.finish(ns, "done")
    rig.settle(lambda: rig.used_gpus("team-b") == 3, "done's GPU freed")
    big_ticket = rig.core.read_namespaced_pod("big", ns).metadata.annotations[
        "fairgate.io/ticket"]
    rig.edit(ns, "done", {"annotations": {"fairgate.io/ticket": big_ticket},
                          "labels": {"fairgate.io/tenant": "team-a"}})
    rig.steps(2.0)
    assert rig.used_gpus("team-b") == 3 and rig.used_gpus("team-a") == 0
    outcomes = [rig.create(ns, "team-b", f"more-{i}", 1)[0].outcome for i in range(3)]
    assert outcomes == ["reserved", "queued", "queued"]
    rig.steps(2.0)
    assert rig.used_gpus("team-b") == rig.running_gpus("team-b") == 4
    rig.dispatcher.reconcile()  # a rebuild from the cluster agrees
    assert rig.used_gpus("team-b") == 4 and rig.used_gpus("team-a") == 0


def test_deleted_unscheduled_pod_relabelled_to_another_tenant_charges_nobody(
    rig: Rig,
) -> None:
    """A released pod that was never scheduled is held by a finalizer, deleted, and
    relabelled team-b. Before the fix the reconciler charged its GPUs to team-b (and team-a
    kept paying for a pod that can never run)."""
    ns = rig.namespace("team-a")

    def unschedulable(manifest: dict[str, Any]) -> None:
        manifest["spec"]["nodeSelector"] = {"example.com/nowhere": "true"}
        manifest["metadata"]["finalizers"] = ["example.com/hold"]

    answer, _, _ = rig.create(ns, "team-a", "stuck", 2, extra=unschedulable)
    assert answer.outcome == "reserved"
    rig.steps(1.0)
    assert rig.used_gpus("team-a") == 2
    rig.core.delete_namespaced_pod("stuck", ns)
    rig.edit(ns, "stuck", {"labels": {"fairgate.io/tenant": "team-b"}})
    rig.settle(lambda: rig.used_gpus("team-a") == 0, "the deleted pod's GPUs freed")
    rig.dispatcher.reconcile()
    assert rig.used_gpus("team-a") == 0 and rig.used_gpus("team-b") == 0


def test_ticket_twin_cannot_free_the_running_pods_usage(rig: Rig, kubelet: FakeKubelet) -> None:
    """A second pod with the same generateName and copied stamps was accepted as a
    "duplicate" of a queued ticket; deleting the still-gated twin freed the running
    twin's usage. Now the first pod seen owns the ticket: the twin is never counted,
    never released, and its deletion frees nothing."""
    ns = rig.namespace("team-a")
    filler, _, _ = rig.create(ns, "team-a", "filler", 4)
    assert filler.outcome == "reserved"
    ticket = str(uuid.uuid4())
    original, manifest, original_name = rig.create(ns, "team-a", "x-", 1, generate=True,
                                                   ticket=ticket)
    assert original.outcome == "queued"  # team-a's quota is full
    rig.settle(lambda: rig.phase(ns, "filler") == "Running", "filler runs")
    # the twin: same generateName, copied stamps and gate (before the original was seen
    # the queue takes it for a retry of the same CREATE)
    twin_name = rig.core.create_namespaced_pod(ns, manifest).metadata.name
    rig.steps(2.0)
    events = rig.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={twin_name},reason=TicketConflict").items
    assert events and "belongs to another pod" in events[0].message
    # the webhook now refuses a third copy outright
    with pytest.raises(TicketConflictError):
        rig.queue.admit(PodRequest(ticket, "team-a", ns, "x-*", "training", {"gpu": 1},
                                   submitted_at=time.time()), time.time())
    kubelet.finish(ns, "filler")
    rig.settle(lambda: rig.phase(ns, original_name) == "Running", "the original runs")
    twin = rig.core.read_namespaced_pod(twin_name, ns)
    assert [g.name for g in twin.spec.scheduling_gates] == [GATE]  # never released
    rig.core.delete_namespaced_pod(twin_name, ns, grace_period_seconds=0)
    rig.steps(2.0)
    assert rig.used_gpus("team-a") == rig.running_gpus("team-a") == 1
    rig.dispatcher.reconcile()
    assert rig.used_gpus("team-a") == 1


def test_demand_annotation_lowered_on_a_running_pod_frees_nothing(rig: Rig) -> None:
    """The pod's spec says 2 GPUs; its `fairgate.io/demand` annotation is edited to 1. The
    dispatcher and a rebuild after Redis is lost count what the spec asks for, never the
    annotation."""
    ns = rig.namespace("team-b")
    answer, _, _ = rig.create(ns, "team-b", "runner", 2)
    assert answer.outcome == "reserved"
    rig.settle(lambda: rig.phase(ns, "runner") == "Running", "runner runs")
    rig.edit(ns, "runner", {"annotations": {"fairgate.io/demand": "gpu=1"}})
    rig.steps(1.0)
    assert rig.used_gpus("team-b") == rig.running_gpus("team-b") == 2
    rig.rebuild()
    assert rig.used_gpus("team-b") == 2
    more = [rig.create(ns, "team-b", f"more-{i}", 1)[0].outcome for i in range(3)]
    assert more == ["reserved", "reserved", "queued"]  # 4-GPU quota: 2 + 2, the third waits
    rig.steps(1.0)
    assert rig.used_gpus("team-b") == rig.running_gpus("team-b") == 4


def test_namespace_relabelled_while_pods_run_keeps_usage_with_the_admitting_tenant(
    rig: Rig,
) -> None:
    ns = rig.namespace("team-a")
    answer, _, _ = rig.create(ns, "team-a", "runner", 2)
    assert answer.outcome == "reserved"
    rig.settle(lambda: rig.phase(ns, "runner") == "Running", "runner runs")
    rig.core.patch_namespace(ns, {"metadata": {"labels": {"fairgate.io/tenant": "team-b"}}},
                             _content_type=MERGE)
    rig.steps(1.0)
    assert rig.used_gpus("team-a") == 2 and rig.used_gpus("team-b") == 0
    rig.rebuild()
    assert rig.used_gpus("team-a") == 2 and rig.used_gpus("team-b") == 0


def test_pod_deleted_and_recreated_with_the_same_name_is_counted_once(rig: Rig) -> None:
    """The old pod's record may linger while a new pod of the same name is admitted:
    the old pod's deletion frees only its own ticket, the new one stays counted."""
    ns = rig.namespace("team-b")
    rig.create(ns, "team-b", "same", 2)
    rig.settle(lambda: rig.phase(ns, "same") == "Running", "first pod runs")
    rig.core.delete_namespaced_pod("same", ns, grace_period_seconds=0)
    second, _, _ = rig.create(ns, "team-b", "same", 2)  # the old release not in yet
    assert second.outcome == "reserved" and rig.used_gpus("team-b") == 4
    rig.settle(lambda: rig.used_gpus("team-b") == 2, "the old pod's GPUs freed")
    rig.settle(lambda: rig.phase(ns, "same") == "Running", "the new pod runs")
    rig.steps(1.0)
    assert rig.used_gpus("team-b") == rig.running_gpus("team-b") == 2
    rig.rebuild()
    assert rig.used_gpus("team-b") == 2


def test_an_ungated_twin_that_runs_is_counted_against_its_tenant(
    rig: Rig, kubelet: FakeKubelet
) -> None:
    """A pod that got past the webhooks with another pod's copied stamps and no gate runs
    as soon as the scheduler binds it: it is counted as a pod of its own within a step
    (the tenant may go over quota, so its next pods wait), and freed when it is gone."""
    ns = rig.namespace("team-a")
    _, manifest, owner = rig.create(ns, "team-a", "owner", 2)
    rig.settle(lambda: rig.phase(ns, owner) == "Running", "the owner runs")
    manifest["metadata"]["name"] = "twin"
    rig.core.create_namespaced_pod(ns, manifest)
    rig.settle(lambda: rig.phase(ns, "twin") == "Running"
               and rig.used_gpus("team-a") == rig.running_gpus("team-a") == 4,
               "the twin runs and is counted")
    events = rig.core.list_namespaced_event(
        ns, field_selector="involvedObject.name=twin,reason=TicketConflict").items
    assert events and "counted against team-a" in events[0].message
    # the owner's ticket still frees only the owner; the twin frees its own count
    rig.core.delete_namespaced_pod("twin", ns, grace_period_seconds=0)
    rig.settle(lambda: rig.used_gpus("team-a") == rig.running_gpus("team-a") == 2,
               "the twin's GPUs freed")
    rig.dispatcher.reconcile()
    assert rig.used_gpus("team-a") == 2
