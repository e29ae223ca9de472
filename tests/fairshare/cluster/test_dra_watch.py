"""The GPUs DRA ResourceSlices publish, and how they add to a node's capacity."""

from __future__ import annotations

from typing import Any

from fairshare.cluster.dra import published_gpus
from fairshare.cluster.kube import capacity_report, node_gpus
from tests.fairshare.cluster.test_kube import NOW, gpu_node


def gpu_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1,
              driver: str = "gpu.nvidia.com", pool: str | None = None) -> dict[str, Any]:
    """A ResourceSlice as the NVIDIA DRA driver for GPUs publishes one per node."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{generation}"},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool or node, "generation": generation,
                          "resourceSliceCount": 1},
                 "devices": devices},
    }


def gpu(index: int) -> dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {
        "type": {"string": "gpu"}, "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "uuid": {"string": f"GPU-{index:04d}"}}, "capacity": {"memory": {"value": "40Gi"}}}


def mig(index: int, profile: str) -> dict[str, Any]:
    return {"name": f"gpu-0-mig-{index}", "attributes": {
        "type": {"string": "mig"}, "profile": {"string": profile},
        "parentUUID": {"string": "GPU-0000"}}}


def test_whole_gpus_and_mig_devices_are_counted_per_node() -> None:
    slices = [gpu_slice("n1", [gpu(i) for i in range(8)]),
              gpu_slice("n2", [mig(i, "1g.5gb") for i in range(7)] + [gpu(1)])]
    assert published_gpus(slices) == {"n1": {"gpu": 8}, "n2": {"mig-1g.5gb": 7, "gpu": 1}}


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    """A driver republishing a pool (generation 2) leaves the old slices behind for a
    while: counting both would count the node's GPUs twice."""
    slices = [gpu_slice("n1", [gpu(i) for i in range(8)], generation=1),
              gpu_slice("n1", [gpu(i) for i in range(4)], generation=2)]
    assert published_gpus(slices) == {"n1": {"gpu": 4}}


def test_what_is_not_a_node_local_nvidia_gpu_is_not_counted() -> None:
    network = gpu_slice("n1", [gpu(0)])
    del network["spec"]["nodeName"]
    network["spec"]["allNodes"] = True
    other_driver = gpu_slice("n2", [gpu(0)], driver="dra.example.com")
    odd = [{"name": "x", "attributes": {"type": {"string": "vgpu"}}},
           mig(1, "9g.999gb"),  # a profile fairgate does not know
           {"name": "y", "attributes": {"type": {"int": 3}}}]
    assert published_gpus([network, other_driver, gpu_slice("n3", odd)]) == {}


def test_qualified_attribute_names_are_read_too() -> None:
    device = {"name": "g", "attributes": {"gpu.nvidia.com/type": {"string": "gpu"}}}
    assert published_gpus([gpu_slice("n1", [device])]) == {"n1": {"gpu": 1}}


def test_a_node_whose_gpus_come_only_from_dra_is_capacity() -> None:
    """No device plugin: allocatable has no nvidia.com/gpu, the slices have 8."""
    bare = gpu_node("n1", gpus=0)
    report = capacity_report([node_gpus(bare)], [], NOW, 40, {"n1": {"gpu": 8}})
    assert dict(report.total) == {"gpu": 8}
    assert dict(capacity_report([node_gpus(bare)], [], NOW, 40).total) == {}


def test_the_same_gpus_in_allocatable_and_slices_count_once() -> None:
    """A DeviceClass's extendedResourceName can show the slices' GPUs in allocatable."""
    report = capacity_report([node_gpus(gpu_node("n1", gpus=8))], [], NOW, 40,
                             {"n1": {"gpu": 8, "mig-1g.5gb": 7}})
    assert dict(report.total) == {"gpu": 8}  # MIG on a node of strategy none: not placed
    mixed = gpu_node("n2", gpus=1, mig={"nvidia.com/mig-1g.5gb": "7"})
    mixed["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    report = capacity_report([node_gpus(mixed)], [], NOW, 40, {"n2": {"mig-1g.5gb": 7}})
    assert dict(report.total) == {"gpu#mixed": 1, "mig-1g.5gb": 7}


def test_an_excluded_node_leaves_out_its_dra_gpus_too() -> None:
    cordoned = gpu_node("n1", gpus=0, unschedulable=True)
    report = capacity_report([node_gpus(cordoned)], [], NOW, 40, {"n1": {"gpu": 8}})
    assert dict(report.total) == {}
    assert [(e.node, e.reason, dict(e.resources)) for e in report.excluded] == [
        ("n1", "cordoned", {"gpu": 8})]
