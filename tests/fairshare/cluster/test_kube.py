"""Reading pods and nodes as the API server returns them (JSON), capacity from node
lifecycle and foreign pods, and the backoff policy.

The API calls themselves are tested against a real kube-apiserver in test_kube_e2e.py.
"""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

from admission.demand import pod_demand
from fairshare.cluster.cluster import CapacityReport
from fairshare.cluster.kube import (
    Backoff,
    ForeignPod,
    capacity_report,
    foreign_pod,
    node_capacity,
    node_gpus,
    pod_from_manifest,
    tolerates,
)
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
        "containers": [{"name": "main", "image": "pause", "resources": {
            "limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "1"}}}],
    },
    "status": {"phase": "Pending"},
}


def test_a_stamped_pod_is_read_completely() -> None:
    pod = pod_from_manifest(STAMPED, PRIORITY, pod_demand)
    assert pod is not None
    assert str(pod.ref) == "team-a-dev/trainer-0" and pod.uid == "5f1d-uid"
    assert (pod.ticket, pod.tenant, pod.pod_class, pod.band) == (
        "b7e4-ticket", "team-a", "training", "borrowed")
    assert dict(pod.demand) == {"gpu#mixed": 2, "mig-1g.5gb": 1} and pod.slices == 15
    assert (pod.group, pod.group_size) == ("llm", 4)
    assert pod.gated and pod.phase == "Pending" and not pod.finished and not pod.deleting
    created = datetime.datetime(2026, 11, 30, 0, 40, 12, tzinfo=datetime.UTC)
    assert pod.created == created.timestamp()


def test_a_released_running_pod_holds_capacity_until_it_ends() -> None:
    running = copy.deepcopy(STAMPED)
    running["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    running["spec"]["nodeName"] = "gpu-a100-0"
    running["status"]["phase"] = "Running"
    pod = pod_from_manifest(running, PRIORITY, pod_demand)
    assert pod is not None and not pod.gated and pod.node == "gpu-a100-0"
    assert pod.holds_capacity
    running["status"]["phase"] = "Succeeded"
    running["metadata"]["deletionTimestamp"] = "2026-11-30T01:00:00Z"
    ended = pod_from_manifest(running, PRIORITY, pod_demand)
    assert ended is not None and ended.finished and ended.deleting and not ended.holds_capacity


def test_the_band_falls_back_to_the_borrowed_annotation_and_the_class() -> None:
    pod = copy.deepcopy(STAMPED)
    del pod["spec"]["priorityClassName"]
    first = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert first is not None and first.band == "training"
    pod["metadata"]["annotations"]["fairgate.io/borrowed"] = "true"
    second = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert second is not None and second.band == "borrowed"


def test_only_the_label_preemptible_true_marks_a_pod_preemptible() -> None:
    pod = copy.deepcopy(STAMPED)
    unlabelled = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert unlabelled is not None and not unlabelled.preemptible
    for value, expected in (("true", True), ("True", False), ("yes", False)):
        pod["metadata"]["labels"]["fairgate.io/preemptible"] = value
        parsed = pod_from_manifest(pod, PRIORITY, pod_demand)
        assert parsed is not None and parsed.preemptible is expected, value


def test_pods_fairgate_did_not_stamp_are_not_tracked() -> None:
    for broken in (
        ("metadata", "annotations", "fairgate.io/ticket"),
        ("metadata", "labels", "fairgate.io/tenant"),
    ):
        pod = copy.deepcopy(STAMPED)
        del pod[broken[0]][broken[1]][broken[2]]
        assert pod_from_manifest(pod, PRIORITY, pod_demand) is None
    forged = copy.deepcopy(STAMPED)
    forged["metadata"]["annotations"]["fairgate.io/demand"] = "gpu=lots"
    assert pod_from_manifest(forged, PRIORITY, pod_demand) is None
    odd_class = copy.deepcopy(STAMPED)
    odd_class["metadata"]["labels"]["fairgate.io/class"] = "batch"
    assert pod_from_manifest(odd_class, PRIORITY, pod_demand) is None


def _node(ready: str, allocatable: dict[str, str], unschedulable: bool = False,
          labels: dict[str, str] | None = None) -> Any:
    return {
        "metadata": {"name": "n", "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable},
                   "conditions": [{"type": "MemoryPressure", "status": "False"},
                                  {"type": "Ready", "status": ready}]},
    }


def test_node_capacity_counts_gpu_resources_of_ready_schedulable_nodes() -> None:
    mixed = {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "7",
             "nvidia.com/mig-9g.1gb": "1", "example.com/fpga": "3"}
    # MIG resources are capacity on mixed-strategy nodes (where MIG pods' affinity goes),
    # with the mixed node's whole GPUs kept apart from those of nodes without MIG
    on_mixed = _node("True", mixed, labels={"nvidia.com/mig.strategy": "mixed"})
    assert node_capacity(on_mixed) == {"gpu#mixed": 2, "mig-1g.5gb": 7}
    assert node_capacity(_node("True", mixed)) == {"gpu": 2}
    single = _node("True", {"nvidia.com/gpu": "56"}, labels={
        "nvidia.com/mig.strategy": "single", "fairgate.io/node-pool": "p",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"})
    assert node_capacity(single) == {"mig-1g.5gb#single@p": 56}
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
    """The demand annotation is a copy; the pod's spec (immutable after CREATE
    for extended resources) is what it can use. An edited annotation changes nothing."""
    pod = copy.deepcopy(STAMPED)
    pod["metadata"]["annotations"]["fairgate.io/demand"] = "gpu=0"  # edited after admission
    read = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert read is not None and dict(read.demand) == {"gpu#mixed": 2, "mig-1g.5gb": 1}



def test_a_pod_whose_demand_cannot_be_computed_any_more_counts_as_admitted() -> None:
    """A pod's ResourceClaimTemplate deleted after admission: its demand cannot be read
    from the spec any more, and the pod still runs; it counts as the (immutable)
    annotation says, never as nothing."""
    pod = copy.deepcopy(STAMPED)
    pod["metadata"]["annotations"]["fairgate.io/demand"] = "gpu=4"
    pod["spec"]["containers"][0]["resources"] = {}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "gone"}]
    read = pod_from_manifest(pod, PRIORITY, pod_demand)
    assert read is not None and dict(read.demand) == {"gpu": 4}


# -- node lifecycle and foreign pods -------------------------------------------

NOW = datetime.datetime(2026, 12, 1, 9, 0, 0, tzinfo=datetime.UTC).timestamp()


def _iso(seconds_ago: float) -> str:
    moment = datetime.datetime.fromtimestamp(NOW - seconds_ago, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(name: str, gpus: int = 4, *, ready: str = "True", changed_ago: float = 3600,
             taints: list[dict[str, str]] | None = None, unschedulable: bool = False,
             mig: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as `kubectl get node -o json` shows a GPU node (GFD labels, device plugin
    resources, the kubelet's conditions; the GPU taint the operator sets)."""
    allocatable = {"cpu": "95500m", "ephemeral-storage": "1729517568Ki",
                   "hugepages-1Gi": "0", "memory": "1056196360Ki", "pods": "110",
                   "nvidia.com/gpu": str(gpus), **(mig or {})}
    spec: dict[str, Any] = {"podCIDR": "10.244.3.0/24", "providerID": f"aws:///{name}",
                            "taints": [{"key": "nvidia.com/gpu", "value": "present",
                                        "effect": "NoSchedule"}, *(taints or [])]}
    if unschedulable:
        spec["unschedulable"] = True
    pressure = [{"type": kind, "status": "False", "reason": f"KubeletHas{reason}",
                 "message": "ok", "lastHeartbeatTime": _iso(5),
                 "lastTransitionTime": _iso(86400)}
                for kind, reason in (("MemoryPressure", "SufficientMemory"),
                                     ("DiskPressure", "NoDiskPressure"),
                                     ("PIDPressure", "SufficientPID"))]
    ready_reason = {"True": "KubeletReady", "False": "KubeletNotReady",
                    "Unknown": "NodeStatusUnknown"}[ready]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"{name}-uid", "resourceVersion": "81234",
                     "creationTimestamp": _iso(86400 * 3),
                     "labels": {"kubernetes.io/hostname": name,
                                "nvidia.com/gpu.present": "true",
                                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                                "nvidia.com/mig.strategy": "mixed" if mig else "none"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
        "status": {
            "capacity": dict(allocatable), "allocatable": allocatable,
            "conditions": [*pressure, {
                "type": "Ready", "status": ready, "reason": ready_reason, "message": "",
                "lastHeartbeatTime": _iso(5), "lastTransitionTime": _iso(changed_ago)}],
            "nodeInfo": {"kubeletVersion": "v1.31.2", "operatingSystem": "linux"},
        },
    }


def other_pod(name: str, node: str | None, gpus: int, *, namespace: str = "research",
              phase: str = "Running", init_gpus: int = 0) -> dict[str, Any]:
    """A pod fairgate does not manage (no fairgate.io stamps), as the API server returns it."""
    spec: dict[str, Any] = {
        "containers": [{"name": "burn", "image": "nvcr.io/nvidia/cuda:12.4.1-base",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                      "requests": {"nvidia.com/gpu": str(gpus),
                                                   "cpu": "2"}}}],
        "restartPolicy": "Never", "schedulerName": "default-scheduler",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                         "effect": "NoSchedule"}],
    }
    if init_gpus:
        spec["initContainers"] = [{"name": "warm", "image": "busybox", "resources": {
            "limits": {"nvidia.com/gpu": str(init_gpus)}}}]
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"{name}-uid",
                         "creationTimestamp": _iso(600)},
            "spec": spec, "status": {"phase": phase}}


def test_tolerates_follows_the_kubernetes_rule() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     taint)
    assert tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, taint)  # any effect
    assert tolerates({"operator": "Exists"}, taint)  # empty key + Exists: every taint
    assert tolerates({"key": "nvidia.com/gpu", "value": "present"}, taint)  # Equal default
    assert not tolerates({"key": "nvidia.com/gpu", "value": "absent"}, taint)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists",
                          "effect": "NoExecute"}, taint)
    assert not tolerates({"key": "dedicated", "operator": "Exists"}, taint)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Lt", "value": "1"}, taint)


def test_a_ready_gpu_node_with_only_the_gpu_taint_is_capacity() -> None:
    node = node_gpus(gpu_node("gpu-0", mig={"nvidia.com/mig-1g.5gb": "7"}))
    assert node.gpus == {"gpu": 4, "mig-1g.5gb": 7} and node.untolerated == ()
    assert node.excluded(NOW, 40) is None
    assert node_capacity(gpu_node("gpu-0"), NOW) == {"gpu": 4}


def test_a_cordoned_node_is_not_capacity() -> None:
    cordoned = gpu_node("gpu-3", unschedulable=True, taints=[
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
         "timeAdded": _iso(30)}])
    assert node_gpus(cordoned).excluded(NOW, 40) == "cordoned"
    assert node_capacity(cordoned, NOW) == {}


def test_not_ready_counts_until_the_grace_is_over() -> None:
    """A blip shorter than the grace keeps the node, with the lifecycle taints the node
    controller adds at once; past the grace the node is out, NotReady or Unknown."""
    lifecycle = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule",
                  "timeAdded": _iso(10)},
                 {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute",
                  "timeAdded": _iso(10)}]
    blip = gpu_node("gpu-2", ready="False", changed_ago=10, taints=lifecycle)
    assert node_capacity(blip, NOW, grace=40) == {"gpu": 4}
    assert node_capacity(blip, NOW + 30, grace=40) == {"gpu": 4}
    assert node_capacity(blip, NOW + 31, grace=40) == {}
    reason = node_gpus(blip).excluded(NOW + 31, 40)
    assert reason == f"NotReady since {_iso(10)} (more than 40s)"
    unreachable = gpu_node("gpu-2", ready="Unknown", changed_ago=120, taints=[
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    assert node_capacity(unreachable, NOW, grace=40) == {}
    assert node_capacity(unreachable, NOW, grace=300) == {"gpu": 4}
    no_condition = gpu_node("gpu-2")
    no_condition["status"]["conditions"] = no_condition["status"]["conditions"][:3]
    assert node_gpus(no_condition).excluded(NOW, 40) == "has no Ready condition"
    back = gpu_node("gpu-2", ready="True", changed_ago=1)  # Ready again: counts at once
    assert node_capacity(back, NOW, grace=40) == {"gpu": 4}


def test_taints_fairgate_does_not_tolerate_leave_the_node_out() -> None:
    cases = {
        ("dedicated", "team-x", "NoSchedule"): "tainted dedicated=team-x:NoSchedule",
        ("nvidia.com/gpu", "present", "NoExecute"): "tainted nvidia.com/gpu=present:NoExecute",
        ("node.kubernetes.io/memory-pressure", "", "NoSchedule"):
            "tainted node.kubernetes.io/memory-pressure:NoSchedule",
    }
    for (key, value, effect), reason in cases.items():
        taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
        node = node_gpus(gpu_node("gpu-1", taints=[taint]))
        assert node.excluded(NOW, 40) == f"{reason} (not tolerated by fairgate's pods)"
    soft = gpu_node("gpu-1", taints=[{"key": "dedicated", "value": "x",
                                      "effect": "PreferNoSchedule"}])
    assert node_capacity(soft, NOW) == {"gpu": 4}  # a preference does not keep pods off
    other_value = gpu_node("gpu-1")
    other_value["spec"]["taints"][0]["value"] = "anything"  # fairgate tolerates any value
    assert node_capacity(other_value, NOW) == {"gpu": 4}


def test_foreign_pods_are_bound_unfinished_pods_fairgate_does_not_manage() -> None:
    held = foreign_pod(other_pod("burn", "gpu-0", 2), pod_demand, PRIORITY)
    assert held == ForeignPod("research/burn", "gpu-0", {"gpu": 2})
    peak = foreign_pod(other_pod("warm", "gpu-0", 1, init_gpus=3), pod_demand, PRIORITY)
    assert peak is not None and dict(peak.gpus) == {"gpu": 3}  # the init container's peak
    assert foreign_pod(other_pod("p", None, 2, phase="Pending"), pod_demand, PRIORITY) is None
    for phase in ("Succeeded", "Failed"):
        assert foreign_pod(other_pod("p", "gpu-0", 2, phase=phase), pod_demand, PRIORITY) is None
    assert foreign_pod(other_pod("cpu", "gpu-0", 0), pod_demand, PRIORITY) is None
    ours = copy.deepcopy(STAMPED)
    ours["spec"]["nodeName"] = "gpu-0"
    ours["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.5gb": "1"}}
    assert foreign_pod(ours, pod_demand, PRIORITY) is None  # fairgate accounts for it
    unstamped = copy.deepcopy(ours)  # a tenant label alone does not make it fairgate's
    del unstamped["metadata"]["annotations"]["fairgate.io/ticket"]
    sneaky = foreign_pod(unstamped, pod_demand, PRIORITY)
    assert sneaky is not None and dict(sneaky.gpus) == {"gpu": 2, "mig-1g.5gb": 1}
    pending_bound = other_pod("starting", "gpu-0", 1, phase="Pending")
    assert foreign_pod(pending_bound, pod_demand, PRIORITY) is not None  # bound: held


def test_capacity_report_leaves_out_nodes_and_subtracts_foreign_pods() -> None:
    nodes = [node_gpus(n) for n in (
        gpu_node("gpu-0"), gpu_node("gpu-1"), gpu_node("gpu-3", unschedulable=True),
        gpu_node("gpu-mig", gpus=0, mig={"nvidia.com/mig-1g.5gb": "7"}),
        {"metadata": {"name": "cpu-0"}, "spec": {}, "status": {
            "allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}},
    )]
    foreign = [ForeignPod("research/a", "gpu-0", {"gpu": 1}),
               ForeignPod("kube-system/b", "gpu-0", {"gpu": 2}),
               ForeignPod("research/c", "gpu-1", {"gpu": 9}),  # more than the node has
               ForeignPod("research/d", "gpu-3", {"gpu": 1}),  # on a node left out
               ForeignPod("research/e", "gpu-mig", {"mig-1g.5gb": 2})]
    report = capacity_report(nodes, foreign, NOW, 40)
    assert dict(report.total) == {"gpu": 1, "mig-1g.5gb": 5}
    assert report.notes() == [
        "node gpu-3 cordoned (gpu=4 not counted)",
        "node gpu-0: gpu=3 held by 2 pods fairgate does not manage "
        "(kube-system/b, research/a)",
        "node gpu-1: gpu=4 held by 1 pod fairgate does not manage (research/c)",
        "node gpu-mig: mig-1g.5gb=2 held by 1 pod fairgate does not manage (research/e)",
    ]
    assert CapacityReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    crowd = [ForeignPod(f"ns/p{i}", "gpu-1", {"gpu": 1}) for i in range(5)]
    assert capacity_report(nodes[1:2], crowd, NOW, 40).notes() == [
        "node gpu-1: gpu=4 held by 5 pods fairgate does not manage (ns/p0, ns/p1, ns/p2 "
        "and 2 more)"]


def _labelled(node: dict[str, Any], **labels: str) -> dict[str, Any]:
    node["metadata"]["labels"].update({k.replace("__", "/").replace("_", "."): v
                                       for k, v in labels.items()})
    return node


def test_capacity_is_per_placement_class_in_a_mixed_cluster() -> None:
    """Plain, mixed, single-strategy and pool nodes side by side: each node's GPUs count
    in its own class only; foreign pods are subtracted in the node's devices."""
    single = _labelled(gpu_node("mig-single", gpus=56),
                       nvidia_com__mig_strategy="single",
                       nvidia_com__gpu_product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    pool = gpu_node("pool-0")
    pool["metadata"]["labels"]["fairgate.io/node-pool"] = "a100"
    unknown = _labelled(gpu_node("mig-odd", gpus=7), nvidia_com__mig_strategy="single",
                        nvidia_com__gpu_product="Mystery-MIG-1g.5gb")
    nodes = [node_gpus(n) for n in (
        gpu_node("gpu-0"), gpu_node("gpu-1"), single, pool, unknown,
        gpu_node("gpu-mig", gpus=1, mig={"nvidia.com/mig-1g.5gb": "7"}),
    )]
    single_pod = other_pod("slice", "mig-single", 2)
    single_pod["metadata"]["labels"] = {"fairgate.io/mig-profile": "1g.5gb"}
    held = foreign_pod(single_pod, pod_demand, PRIORITY)
    assert held == ForeignPod("research/slice", "mig-single", {"gpu": 2})
    report = capacity_report(nodes, [held], NOW, 40)
    assert dict(report.total) == {"gpu": 8, "mig-1g.5gb#single": 54, "gpu@a100": 4,
                                  "gpu#mixed": 1, "mig-1g.5gb": 7}
    assert [e.node for e in report.excluded] == ["mig-odd"]
    assert "Mystery-MIG-1g.5gb" in report.excluded[0].reason
