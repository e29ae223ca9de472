"""Capacity follows the nodes' lifecycle and the pods fairgate does not manage, on a real
kube-apiserver (and scheduler) with the fake kubelet's GPU nodes.

One extra GPU node, ``gpu-spare`` (4 GPUs, no kubelet behind it: nothing rewrites its
status), is cordoned, tainted and made NotReady; foreign GPU pods run on a kubelet node.
``KubeCluster.capacity()`` (watches running) must follow within seconds, a CAPACITY change
must reach the dispatcher, and ``fairgate status`` must say what was left out and why.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kubernetes import client

from admission.demand import pod_demand
from fairshare.cluster.cluster import ChangeKind, ClusterChange
from fairshare.cluster.kube import KubeCluster
from fairshare.dispatcher import Dispatcher
from fairshare.queue.fairqueue import FairQueue
from fairshare.status import capacity_lines, status_report
from tenants.resources import SLICES_PER_GPU, total_slices
from tests.e2e.harness.api import create_namespace
from tests.e2e.harness.controlplane import (
    CONTROLLERS,
    NODE_LIFECYCLE,
    ControlPlane,
    build_controlplane,
)
from tests.e2e.harness.kubelet import GPU_TAINT, MERGE, STRATEGIC, FakeKubelet, GpuNode
from tests.e2e.harness.pods import pod_manifest
from tests.fairshare.simkit import make_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GRACE = 3.0
SPARE = GpuNode("gpu-spare", "NVIDIA-A100-SXM4-80GB", "none", {"nvidia.com/gpu": 4}, 4, 81920)
# The fake kubelet's default nodes: 8 GPUs, 7 x 1g.5gb, 2 x 3g.40gb; plus the spare's 4.
ALL = {"gpu": 12, "mig-1g.5gb": 7, "mig-3g.40gb": 2}
WITHOUT_SPARE = {**ALL, "gpu": 8}


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, FakeKubelet]]:
    # The tests play the node lifecycle controller themselves (its taints, on their
    # schedule), and gpu-spare has no kubelet to renew a Lease: the controller is left out.
    controllers = [c for c in CONTROLLERS if c != NODE_LIFECYCLE]
    cp = ControlPlane(build_controlplane(), tmp_path_factory.mktemp("capacity-e2e"),
                      controllers)
    cp.start()
    kubelet = FakeKubelet(cp)
    kubelet.register_nodes()
    kubelet.start()
    core = client.CoreV1Api(cp.admin)
    core.create_node(SPARE.manifest())
    core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT]}}, _content_type=MERGE)
    try:
        yield cp, kubelet
    finally:
        kubelet.stop()
        cp.stop()


@pytest.fixture
def core(cluster_env: tuple[ControlPlane, FakeKubelet]) -> Any:
    return client.CoreV1Api(cluster_env[0].admin)


@pytest.fixture
def watched(cluster_env: tuple[ControlPlane, FakeKubelet]) -> Iterator[KubeCluster]:
    cluster = KubeCluster(cluster_env[0].admin, demand_of=pod_demand, not_ready_grace=GRACE,
                          tick=0.2)
    cluster.start()
    try:
        _wait(lambda: cluster.capacity() == ALL, "the watches to list the cluster")
        yield cluster
    finally:
        cluster.stop()


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 8.0) -> float:
    """Poll until ``predicate()``; the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _excluded(cluster: KubeCluster) -> dict[str, str]:
    return {e.node: e.reason for e in cluster.capacity_report().excluded}


def _set_ready(core: Any, status: str) -> None:
    reason = "KubeletReady" if status == "True" else "KubeletNotReady"
    core.patch_node_status(SPARE.name, {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": "",
        "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}},
        _content_type=STRATEGIC)


def test_a_cordoned_node_leaves_capacity_and_status_says_so(
    core: Any, watched: KubeCluster, redis_url: str
) -> None:
    queue = FairQueue(redis.Redis.from_url(redis_url))
    dispatcher = Dispatcher(queue, watched, lambda: make_config({"team-a": {
        "nominal": {"gpu": 4}}}))
    assert dispatcher.sync(force=True)
    watched.changes(0)  # what the start queued
    core.patch_node(SPARE.name, {"spec": {"unschedulable": True}})
    try:
        took = _wait(lambda: watched.capacity() == WITHOUT_SPARE, "the cordon to count")
        assert took < 3.0
        assert _excluded(watched) == {SPARE.name: "cordoned"}
        changes: list[ClusterChange] = []
        _wait(lambda: bool(changes.extend(watched.changes(0.1)))
              or any(c.kind is ChangeKind.CAPACITY for c in changes), "a CAPACITY change")
        dispatcher.handle(changes)  # what the dispatcher's step does with it
        report = status_report(queue)
        assert report["capacity"] == round(total_slices(WITHOUT_SPARE) / SLICES_PER_GPU, 2)
        assert "  node gpu-spare cordoned (gpu=4 not counted)" in capacity_lines(
            report["capacity_notes"])
    finally:
        core.patch_node(SPARE.name, {"spec": {"unschedulable": False}})
    _wait(lambda: watched.capacity() == ALL, "the uncordon to count")


def test_untolerated_taints_leave_capacity_the_gpu_taint_does_not(
    core: Any, watched: KubeCluster
) -> None:
    for taint in ({"key": "dedicated", "value": "team-x", "effect": "NoSchedule"},
                  {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"}):
        core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT, taint]}},
                        _content_type=MERGE)
        _wait(lambda: watched.capacity() == WITHOUT_SPARE, f"taint {taint} to count")
        reason = _excluded(watched)[SPARE.name]
        assert reason.startswith(f"tainted {taint['key']}={taint['value']}:{taint['effect']}")
        core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT]}}, _content_type=MERGE)
        _wait(lambda: watched.capacity() == ALL, "the taint's removal to count")
    core.patch_node(SPARE.name, {"spec": {"taints": [
        GPU_TAINT, {"key": "dedicated", "value": "x", "effect": "PreferNoSchedule"}]}},
        _content_type=MERGE)
    time.sleep(1.0)
    assert watched.capacity() == ALL  # a preference keeps no pod off
    core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT]}}, _content_type=MERGE)


def test_a_not_ready_node_counts_for_the_grace_then_leaves_without_another_event(
    core: Any, watched: KubeCluster
) -> None:
    lifecycle = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    down_at = time.monotonic()
    _set_ready(core, "False")
    core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT, lifecycle]}},
                    _content_type=MERGE)  # what the node lifecycle controller adds at once
    try:
        time.sleep(1.0)
        assert watched.capacity() == ALL  # a blip shorter than the grace keeps the node
        _wait(lambda: watched.capacity() == WITHOUT_SPARE, "the grace to end")
        gone_after = time.monotonic() - down_at
        # lastTransitionTime has whole seconds: the grace may end up to 1s early
        assert GRACE - 1.0 <= gone_after <= GRACE + 3.0, gone_after
        assert _excluded(watched)[SPARE.name].startswith("NotReady since ")
    finally:
        _set_ready(core, "True")
        core.patch_node(SPARE.name, {"spec": {"taints": [GPU_TAINT]}}, _content_type=MERGE)
    _wait(lambda: watched.capacity() == ALL, "Ready again to count at once", timeout=3.0)


def test_gpus_of_pods_fairgate_does_not_manage_are_subtracted_until_they_end(
    cluster_env: tuple[ControlPlane, FakeKubelet], core: Any, watched: KubeCluster
) -> None:
    kubelet = cluster_env[1]
    namespace = f"research-{uuid.uuid4().hex[:6]}"  # outside any fairgate selector
    create_namespace(core, namespace)
    burn = pod_manifest("burn", {"nvidia.com/gpu": 3})
    burn["spec"]["nodeName"] = "gpu-a100-0"
    core.create_namespaced_pod(namespace, burn)
    mig = pod_manifest("mig-probe", {"nvidia.com/mig-1g.5gb": 2})  # the scheduler binds it
    core.create_namespaced_pod(namespace, mig)
    core.create_namespaced_pod(namespace, pod_manifest("queued-elsewhere",
                                                       {"nvidia.com/gpu": 64}))  # unbound
    try:
        held = {**ALL, "gpu": 9, "mig-1g.5gb": 5}
        took = _wait(lambda: watched.capacity() == held, "the foreign pods to be subtracted")
        assert took < 5.0
        holds = {h.node: (dict(h.resources), h.pods) for h in watched.capacity_report().held}
        assert holds == {"gpu-a100-0": ({"gpu": 3}, (f"{namespace}/burn",)),
                         "gpu-mig-5gb": ({"mig-1g.5gb": 2}, (f"{namespace}/mig-probe",))}
        kubelet.finish(namespace, "burn")  # Succeeded: it holds nothing any more
        _wait(lambda: watched.capacity() == {**held, "gpu": 12}, "the finished pod to count")
        core.delete_namespaced_pod("mig-probe", namespace, grace_period_seconds=0)
        _wait(lambda: watched.capacity() == ALL, "the deleted pod to count")
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
