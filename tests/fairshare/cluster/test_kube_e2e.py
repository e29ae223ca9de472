"""KubeCluster against a real kube-apiserver (built from Go modules, see tests/e2e/):
gate lifting guarded by JSON Patch `test` ops under races, the uid guard, Events, the
pod and node watches and node capacity."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from admission.demand import pod_demand
from fairshare.cluster.cluster import ChangeKind, ClusterChange, GpuPod, LiftOutcome
from fairshare.cluster.kube import JSON_PATCH, KubeCluster
from tests.e2e.harness.api import create_namespace
from tests.e2e.harness.controlplane import ControlPlane, build_controlplane
from tests.e2e.harness.kubelet import DEFAULT_GPU_NODES, FakeKubelet
from tests.e2e.harness.pods import pod_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUEUE_GATE = "fairgate.io/queue"


@pytest.fixture(scope="module")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A private etcd + kube-apiserver + kube-scheduler, with the default fake GPU nodes."""
    cp = ControlPlane(build_controlplane(), tmp_path_factory.mktemp("kube-e2e"))
    cp.start()
    kubelet = FakeKubelet(cp)
    kubelet.register_nodes()
    kubelet.start()
    try:
        yield cp
    finally:
        kubelet.stop()
        cp.stop()


@pytest.fixture
def core(controlplane: ControlPlane) -> Any:
    return client.CoreV1Api(controlplane.admin)


@pytest.fixture
def namespace(core: Any) -> Iterator[str]:
    name = f"kube-{uuid.uuid4().hex[:6]}"
    create_namespace(core, name)
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)


def _stamped(name: str, gates: list[str], ticket: str | None = None) -> dict[str, Any]:
    return pod_manifest(
        name, {"nvidia.com/gpu": 1},
        labels={"fairgate.io/tenant": "team-a", "fairgate.io/class": "training"},
        annotations={"fairgate.io/ticket": ticket or f"t-{uuid.uuid4().hex}",
                     "fairgate.io/demand": "gpu=1"},
        gates=gates,
    )


def _pod(cluster: KubeCluster, namespace: str, name: str) -> GpuPod:
    found = [p for p in cluster.list_pods() if p.ref.namespace == namespace and p.ref.name == name]
    assert len(found) == 1, found
    return found[0]


def _gates(core: Any, namespace: str, name: str) -> list[str]:
    pod = core.read_namespaced_pod(name, namespace)
    return [g.name for g in pod.spec.scheduling_gates or []]


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_lift_removes_only_the_fairgate_gate_once(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, _stamped("p", ["example.com/a", QUEUE_GATE,
                                                         "example.com/b"]))
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    pod = _pod(cluster, namespace, "p")
    assert pod.gated and pod.phase == "Pending" and dict(pod.demand) == {"gpu": 1}
    assert cluster.lift_gate(pod) is LiftOutcome.LIFTED
    assert _gates(core, namespace, "p") == ["example.com/a", "example.com/b"]
    assert cluster.lift_gate(pod) is LiftOutcome.NOT_GATED
    assert _gates(core, namespace, "p") == ["example.com/a", "example.com/b"]


def test_racing_dispatchers_lift_each_gate_exactly_once(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    names = [f"race-{i}" for i in range(12)]
    for name in names:
        core.create_namespaced_pod(namespace, _stamped(name, [QUEUE_GATE]))
    clusters = [KubeCluster(controlplane.admin, demand_of=pod_demand) for _ in range(4)]
    pods = {name: _pod(clusters[0], namespace, name) for name in names}
    outcomes: list[tuple[str, LiftOutcome]] = []
    lock = threading.Lock()
    start = threading.Barrier(len(clusters))

    def lift_all(cluster: KubeCluster) -> None:
        start.wait()
        for name in names:
            outcome = cluster.lift_gate(pods[name])
            with lock:
                outcomes.append((name, outcome))

    threads = [threading.Thread(target=lift_all, args=(c,)) for c in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name in names:
        mine = sorted(o.value for n, o in outcomes if n == name)
        assert mine == ["lifted", "not_gated", "not_gated", "not_gated"], (name, mine)
        assert _gates(core, namespace, name) == []


def test_a_gate_moving_under_the_patch_is_never_confused(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    """Another controller removes the gate before ours while we lift: the `test` op
    makes a patch aimed at a stale index fail (422) and the lift retries on fresh data."""
    names = [f"shift-{i}" for i in range(10)]
    for name in names:
        core.create_namespaced_pod(namespace, _stamped(name, ["example.com/first", QUEUE_GATE,
                                                              "example.com/last"]))
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    pods = {name: _pod(cluster, namespace, name) for name in names}
    start = threading.Barrier(2)
    outcomes: dict[str, LiftOutcome] = {}
    other_conflicts = 0

    def other_controller() -> None:
        nonlocal other_conflicts
        start.wait()
        for name in names:
            patch = [{"op": "test", "path": "/spec/schedulingGates/0/name",
                      "value": "example.com/first"},
                     {"op": "remove", "path": "/spec/schedulingGates/0"}]
            try:
                core.patch_namespaced_pod(name, namespace, patch, _content_type=JSON_PATCH)
            except ApiException as error:
                assert error.status == 422
                other_conflicts += 1

    def dispatcher() -> None:
        start.wait()
        for name in names:
            outcomes[name] = cluster.lift_gate(pods[name])

    threads = [threading.Thread(target=other_controller), threading.Thread(target=dispatcher)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(o is LiftOutcome.LIFTED for o in outcomes.values()) and len(outcomes) == 10
    for name in names:
        gates = _gates(core, namespace, name)
        assert QUEUE_GATE not in gates and "example.com/last" in gates, (name, gates)


def test_a_stale_gate_index_from_the_watch_falls_back_to_a_fresh_read(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, _stamped("stale", ["example.com/first", QUEUE_GATE,
                                                             "example.com/last"]))
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    pod = _pod(cluster, namespace, "stale")  # remembers our gate at index 1
    core.patch_namespaced_pod(
        "stale", namespace, [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        _content_type=JSON_PATCH,
    )  # now index 1 is example.com/last: a blind remove would take the wrong gate
    assert cluster.lift_gate(pod) is LiftOutcome.LIFTED
    assert _gates(core, namespace, "stale") == ["example.com/last"]


def test_a_recreated_pod_of_the_same_name_is_not_lifted(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, _stamped("same", [QUEUE_GATE]))
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    old = _pod(cluster, namespace, "same")
    core.delete_namespaced_pod("same", namespace, grace_period_seconds=0)
    _wait(lambda: not [p for p in core.list_namespaced_pod(namespace).items
                       if p.metadata.name == "same"], "the pod to be deleted")
    core.create_namespaced_pod(namespace, _stamped("same", [QUEUE_GATE]))
    assert cluster.lift_gate(old) is LiftOutcome.GONE
    assert _gates(core, namespace, "same") == [QUEUE_GATE]
    core.delete_namespaced_pod("same", namespace, grace_period_seconds=0)
    _wait(lambda: not core.list_namespaced_pod(namespace).items, "the pod to be deleted")
    assert cluster.lift_gate(old) is LiftOutcome.GONE


def test_events_are_posted_on_the_pod(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, _stamped("told", [QUEUE_GATE]))
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    pod = _pod(cluster, namespace, "told")
    message = "Queued: position 3 of 12 for team-a/training, waiting for 1.00 GPU-eq of " \
              "tenant quota"
    cluster.post_event(pod, "Queued", message, "Normal")
    cluster.post_event(pod, "Admitted", "Admitted after 12.4s in queue", "Normal")
    events = core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=told").items
    assert sorted((e.reason, e.message, e.type, e.involved_object.uid) for e in events) == [
        ("Admitted", "Admitted after 12.4s in queue", "Normal", pod.uid),
        ("Queued", message, "Normal", pod.uid),
    ]


def test_watch_reports_pods_and_capacity(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    expected: dict[str, int] = {}
    for node in DEFAULT_GPU_NODES:
        for resource, count in node.devices.items():
            short = resource.removeprefix("nvidia.com/")
            expected[short] = expected.get(short, 0) + count
    expected = {k: v for k, v in expected.items() if v}
    assert cluster.capacity() == expected  # listed
    cluster.start()
    try:
        seen: list[ClusterChange] = []

        def saw(kind: ChangeKind, name: str) -> bool:
            seen.extend(cluster.changes(0.2))
            return any(c.kind is kind and c.pod is not None and c.pod.ref.name == name
                       for c in seen)

        _wait(lambda: any(c.kind is ChangeKind.RESYNC for c in seen + cluster.changes(0.2)),
              "the first list")
        core.create_namespaced_pod(namespace, _stamped("watched", [QUEUE_GATE]))
        _wait(lambda: saw(ChangeKind.POD, "watched"), "the pod to be seen")
        core.create_namespaced_pod(namespace, pod_manifest("not-ours", {"nvidia.com/gpu": 1}))
        core.delete_namespaced_pod("watched", namespace, grace_period_seconds=0)
        _wait(lambda: saw(ChangeKind.POD_GONE, "watched"), "the deletion to be seen")
        assert not any(c.pod is not None and c.pod.ref.name == "not-ours" for c in seen)
        # not-ours is not fairgate's, but once bound its GPU is not free for fairgate
        _wait(lambda: bool(core.read_namespaced_pod("not-ours", namespace).spec.node_name),
              "the scheduler to bind not-ours")
        less_one = {**expected, "gpu": expected["gpu"] - 1}
        _wait(lambda: cluster.capacity() == less_one,
              "the node and pod watches to sum capacity less not-ours' GPU")
    finally:
        cluster.stop()



def test_the_pod_watch_carries_the_schedulers_unschedulable_verdict(
    controlplane: ControlPlane, core: Any, namespace: str
) -> None:
    """A released pod no node can take gets ``PodScheduled=False, Unschedulable`` from the
    real scheduler: the watch hands the dispatcher its message; a gated pod has none."""
    huge = pod_manifest(
        "huge", {"nvidia.com/gpu": 64},
        labels={"fairgate.io/tenant": "team-a", "fairgate.io/class": "training"},
        annotations={"fairgate.io/ticket": f"t-{uuid.uuid4().hex}",
                     "fairgate.io/demand": "gpu=64"},
    )
    cluster = KubeCluster(controlplane.admin, demand_of=pod_demand)
    cluster.start()
    try:
        seen: list[ClusterChange] = []
        _wait(lambda: any(c.kind is ChangeKind.RESYNC for c in seen + cluster.changes(0.2)),
              "the first list")
        core.create_namespaced_pod(namespace, huge)
        core.create_namespaced_pod(namespace, _stamped("waiting", [QUEUE_GATE]))

        def verdict() -> bool:
            seen.extend(cluster.changes(0.2))
            return any(c.pod is not None and c.pod.ref.name == "huge"
                       and c.pod.unschedulable is not None for c in seen)

        _wait(verdict, "the scheduler's verdict on huge to be watched")
        message = _pod(cluster, namespace, "huge").unschedulable
        assert message is not None and "Insufficient nvidia.com/gpu" in message, message
        assert _pod(cluster, namespace, "waiting").unschedulable is None  # gated, not judged
    finally:
        cluster.stop()
