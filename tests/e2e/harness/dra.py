"""Dynamic Resource Allocation in the e2e cluster, as the NVIDIA DRA driver for GPUs sets
it up: the DeviceClasses `gpu.nvidia.com` and `mig.nvidia.com`, and per node one
`resource.k8s.io/v1` ResourceSlice per pool publishing its GPUs (`type: gpu`) or MIG
devices (`type: mig`, `profile`, `parentUUID`), created by the admin as the driver's
kubelet plugin would. The real scheduler allocates claims from these slices; the fake
kubelet runs the pods without preparing anything, which is all the tests need.

A DRA node (:func:`dra_gpu_node`) has no `nvidia.com/gpu` in its allocatable: its GPUs
exist only in its slice. Tenant users create claims and templates through
:class:`ClaimsApi` (their Role grants it, as a platform team grants DRA users).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .controlplane import ControlPlane
from .fairgate import tenant_user
from .kubelet import WHOLE_GPU_PRODUCT, GpuNode
from .manifests import Manifest, apply

GROUP = "resource.k8s.io"
VERSION = "v1"
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
IMPLICIT_GPU = f"deviceclass.resource.kubernetes.io/{GPU_CLASS}"
"""The implicit extended resource of the GPU class (KEP-5004): the scheduler makes the claim."""


def _device_class(name: str, kind: str) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        )}}]},
    }


DEVICE_CLASSES: tuple[Manifest, ...] = (_device_class(GPU_CLASS, "gpu"),
                                        _device_class(MIG_CLASS, "mig"))


def dra_gpu_node(name: str, gpus: int = 8, *, product: str = WHOLE_GPU_PRODUCT) -> GpuNode:
    """A node whose `gpus` whole GPUs come only from DRA (none in allocatable)."""
    return GpuNode(name, product, "none", {}, gpus, 81920)


def _attributes(values: Mapping[str, str]) -> dict[str, Any]:
    return {key: {"string": value} for key, value in values.items()}


def gpu_slice(node: str, gpus: int, *, product: str = WHOLE_GPU_PRODUCT,
              generation: int = 1) -> Manifest:
    """The ResourceSlice publishing `gpus` whole GPUs of `node`."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": _attributes({"type": "gpu", "productName": product,
                                       "uuid": f"GPU-{node}-{i}"}),
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(gpus)
    ]
    return _slice(node, devices, generation)


def mig_slice(node: str, profiles: Mapping[str, int], *, generation: int = 1) -> Manifest:
    """The ResourceSlice publishing MIG devices of `node`: `profiles` maps a profile
    (e.g. ``1g.5gb``) to how many devices of it."""
    devices = [
        {
            "name": f"mig-{profile.replace('.', '-')}-{i}",
            "attributes": _attributes({"type": "mig", "profile": profile,
                                       "uuid": f"MIG-{node}-{profile}-{i}",
                                       "parentUUID": f"GPU-{node}-0"}),
        }
        for profile, count in profiles.items()
        for i in range(count)
    ]
    return _slice(node, devices, generation)


def _slice(node: str, devices: Sequence[Mapping[str, Any]], generation: int) -> Manifest:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


def publish(controlplane: ControlPlane, slices: Sequence[Manifest]) -> None:
    """The DeviceClasses and `slices`, applied as the admin."""
    apply(controlplane.admin, [*DEVICE_CLASSES, *slices])


def exactly(device_class: str, count: int, *, selector: str | None = None,
            mode: str = "ExactCount") -> dict[str, Any]:
    """A claim spec with one request `gpus` for `count` devices of `device_class`."""
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": mode}
    if mode == "ExactCount":
        request["count"] = count
    if selector is not None:
        request["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpus", "exactly": request}]}}


def template_manifest(name: str, spec: Mapping[str, Any]) -> Manifest:
    """A ResourceClaimTemplate whose claims have `spec`."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": dict(spec)}}


def claim_manifest(name: str, spec: Mapping[str, Any]) -> Manifest:
    """A ResourceClaim (one allocation, shareable by pods of its namespace)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": dict(spec)}


class ClaimsApi:
    """Create and delete ResourceClaims and ResourceClaimTemplates as a tenant's user."""

    def __init__(self, controlplane: ControlPlane, tenant: str, namespace: str) -> None:
        user, groups = tenant_user(tenant)
        self._api = client.CustomObjectsApi(controlplane.client_for(user, groups))
        self._admin = client.CustomObjectsApi(controlplane.admin)
        self.namespace = namespace

    def create(self, obj: Manifest) -> None:
        plural = {"ResourceClaim": "resourceclaims",
                  "ResourceClaimTemplate": "resourceclaimtemplates"}[obj["kind"]]
        self._api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, obj)

    def delete(self, kind: str, name: str) -> None:
        """Delete one ResourceClaim or ResourceClaimTemplate, as the tenant's user."""
        plural = {"ResourceClaim": "resourceclaims",
                  "ResourceClaimTemplate": "resourceclaimtemplates"}[kind]
        self._api.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)

    def delete_all(self) -> None:
        """Delete every claim and template of the namespace (as the admin: cleanup). A
        claim generated for a pod may be gone by then: the resourceclaim-controller
        deletes it with its pod."""
        for plural in ("resourceclaimtemplates", "resourceclaims"):
            found = self._admin.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                              plural)
            for item in found.get("items", []):
                try:
                    self._admin.delete_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, plural, item["metadata"]["name"])
                except ApiException as error:
                    if error.status != 404:
                        raise
