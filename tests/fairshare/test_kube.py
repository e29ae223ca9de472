"""Reading pods and nodes as the API server returns them (JSON), and the backoff policy.

The API calls themselves are tested against a real kube-apiserver in test_kube_e2e.py.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from admission.demand import pod_demand
from fairshare.kube import Backoff, node_capacity, pod_from_manifest
from tenants.models import PriorityClasses

PRIORITY = PriorityClasses()

STAMPED: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "trainer-0", "namespace": "team-a-dev", "uid": "5f1d-uid",
        "creationTimestamp": "2026-11-30T00:40:12Z",
        "labels": {"fairgate.io/tenant": "team-a", "fairgate.io/class": "training",
                   "fairgate.io/pod-group": "llm"},
        "annotations": {"fairgate.io/ticket": "b7e4-ticket", "fairgate.io/demand":
                        "gpu=2,mig-1g.5gb=1", "fairgate.io/pod-group-size": "4"},
    },
    "spec": {
        "priorityClassName": "fairgate-borrowed",
        "schedulingGates": [{"name": "example.com/other"}, {"name": "fairgate.io/queue"}],
        "containers": [{"name": "main", "image": "pause"}],
    },
    "status": {"phase": "Pending"},
}


def test_a_stamped_pod_is_read_completely() -> None:
    pod = pod_from_manifest(STAMPED, PRIORITY)
    assert pod is not None
    assert str(pod.ref) == "team-a-dev/trainer-0" and pod.uid == "5f1d-uid"
    assert (pod.ticket, pod.tenant, pod.pod_class, pod.band) == (
        "b7e4-ticket", "team-a", "training", "borrowed")
    assert dict(pod.demand) == {"gpu": 2, "mig-1g.5gb": 1} and pod.slices == 15
    assert (pod.group, pod.group_size) == ("llm", 4)
    assert pod.gated and pod.phase == "Pending" and not pod.finished and not pod.deleting
    created = datetime.datetime(2026, 11, 30, 0, 40, 12, tzinfo=datetime.UTC)
    assert pod.created == created.timestamp()


def test_a_released_running_pod_holds_capacity_until_it_ends() -> None:
    running = copy.deepcopy(STAMPED)
    running["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    running["spec"]["nodeName"] = "gpu-a100-0"
    running["status"]["phase"] = "Running"
    pod = pod_from_manifest(running, PRIORITY)
    assert pod is not None and not pod.gated and pod.node == "gpu-a100-0"
    assert pod.holds_capacity
    running["status"]["phase"] = "Succeeded"
    running["metadata"]["deletionTimestamp"] = "2026-11-30T01:00:00Z"
    ended = pod_from_manifest(running, PRIORITY)
    assert ended is not None and ended.finished and ended.deleting and not ended.holds_capacity


def test_the_band_falls_back_to_the_borrowed_annotation_and_the_class() -> None:
    pod = copy.deepcopy(STAMPED)
    del pod["spec"]["priorityClassName"]
    first = pod_from_manifest(pod, PRIORITY)
    assert first is not None and first.band == "training"
    pod["metadata"]["annotations"]["fairgate.io/borrowed"] = "true"
    second = pod_from_manifest(pod, PRIORITY)
    assert second is not None and second.band == "borrowed"


def test_pods_fairgate_did_not_stamp_are_not_tracked() -> None:
    for broken in (
        ("metadata", "annotations", "fairgate.io/ticket"),
        ("metadata", "labels", "fairgate.io/tenant"),
    ):
        pod = copy.deepcopy(STAMPED)
        del pod[broken[0]][broken[1]][broken[2]]
        assert pod_from_manifest(pod, PRIORITY) is None
    forged = copy.deepcopy(STAMPED)
    forged["metadata"]["annotations"]["fairgate.io/demand"] = "gpu=lots"
    assert pod_from_manifest(forged, PRIORITY) is None
    odd_class = copy.deepcopy(STAMPED)
    odd_class["metadata"]["labels"]["fairgate.io/class"] = "batch"
    assert pod_from_manifest(odd_class, PRIORITY) is None


def _node(ready: str, allocatable: dict[str, str], unschedulable: bool = False) -> Any:
    return {
        "metadata": {"name": "n"},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable},
                   "conditions": [{"type": "MemoryPressure", "status": "False"},
                                  {"type": "Ready", "status": ready}]},
    }


def test_node_capacity_counts_gpu_resources_of_ready_schedulable_nodes() -> None:
    mixed = {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "7",
             "nvidia.com/mig-9g.1gb": "1", "example.com/fpga": "3"}
    assert node_capacity(_node("True", mixed)) == {"gpu": 2, "mig-1g.5gb": 7}
    assert node_capacity(_node("False", mixed)) == {}
    assert node_capacity(_node("Unknown", mixed)) == {}
    assert node_capacity(_node("True", mixed, unschedulable=True)) == {}


def test_backoff_grows_exponentially_and_stays_bounded() -> None:
    policy = Backoff(initial=0.1, factor=2.0, maximum=0.5, attempts=6)
    for _ in range(50):
        delays = list(policy.delays())
        assert len(delays) == 5
        for delay, cap in zip(delays, (0.1, 0.2, 0.4, 0.5, 0.5), strict=True):
            assert 0 <= delay <= cap


def test_demand_comes_from_the_spec_when_the_annotation_was_edited() -> None:
    """Issue 12: the demand annotation is a copy; the pod's spec (immutable after CREATE
    for extended resources) is what it can use. An edited annotation changes nothing."""
    pod = copy.deepcopy(STAMPED)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "1"}}
    pod["metadata"]["annotations"]["fairgate.io/demand"] = "gpu=0"  # edited after admission
    read = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert read is not None and dict(read.demand) == {"gpu": 2, "mig-1g.5gb": 1}
    without = pod_from_manifest(pod, PRIORITY)  # no spec reader: the annotation (legacy)
    assert without is not None and without.slices == 0
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "half"}}
    assert pod_from_manifest(pod, PRIORITY, pod_demand) is None  # unreadable: not tracked
