"""Fake GPU nodes and a fake kubelet for them.

Nodes are plain Node objects: capacity and allocatable carry `nvidia.com/gpu` and MIG
`mixed` resources, labels are what GPU Feature Discovery would set, they are Ready and
tainted `nvidia.com/gpu:NoSchedule`. The fake kubelet acts as each node's own identity
(`system:node:<name>`, group `system:nodes`, so the Node authorizer and NodeRestriction
apply): it marks pods bound to its nodes Running, finishes them on request, keeps the
node Lease and Ready condition fresh and completes graceful deletions, which is what the
scheduler's preemption waits for: at once, or, for a pod annotated `HONOUR_GRACE`, when its
grace period has passed.

Node kinds, made by :func:`whole_gpu_node` (optionally in a node pool, label
`fairgate.io/node-pool`, or cordoned from the start) and :func:`single_mig_node` (MIG
`single` strategy: `nvidia.com/gpu` counts MIG devices, `nvidia.com/gpu.product` names
the profile). :meth:`FakeKubelet.add_node` registers one more node on a running kubelet,
:meth:`FakeKubelet.remove_node` deletes one;
:meth:`FakeKubelet.set_ready` makes a node's kubelet report Ready=False (or True again),
as a kubelet whose container runtime is down does; :func:`cordon` cordons or uncordons.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .controlplane import NODE_LIFECYCLE, ControlPlane
from .waiting import wait_for

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
# A pod annotated so keeps running through its termination grace period once deleted or
# evicted, as a real kubelet lets it; other pods are removed at once.
HONOUR_GRACE = "e2e.fairgate.io/honour-grace-period"
_BASE_RESOURCES = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class GpuNode:
    """One fake GPU node: its name, GPU product, MIG strategy and extended resources."""

    name: str
    product: str
    mig_strategy: str  # GFD's value: "none", "single" or "mixed"
    devices: Mapping[str, int]  # e.g. {"nvidia.com/gpu": 4} or {"nvidia.com/mig-1g.5gb": 7}
    gpu_count: int
    gpu_memory_mib: int
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    cordoned: bool = False  # spec.unschedulable from the start

    @property
    def user(self) -> str:
        return f"system:node:{self.name}"

    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.count": str(self.gpu_count),
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            "nvidia.com/mig.capable": "true" if self.mig_strategy != "none" else "false",
            "nvidia.com/mig.strategy": self.mig_strategy,
            **self.extra_labels,
        }

    def manifest(self) -> dict[str, Any]:
        """The Node object, status included (the API server keeps status on create)."""
        resources = {**_BASE_RESOURCES, **{k: str(v) for k, v in self.devices.items()}}
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": {"taints": [GPU_TAINT], "unschedulable": self.cordoned},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [_ready_condition(now, now)],
                "addresses": [{"type": "Hostname", "address": self.name}],
                "nodeInfo": {
                    "machineID": self.name,
                    "systemUUID": self.name,
                    "bootID": self.name,
                    "kernelVersion": "6.1.0",
                    "osImage": "fake",
                    "containerRuntimeVersion": "fake://1",
                    "kubeletVersion": "v0.0.0-fake",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        }


def _ready_condition(heartbeat: str, transition: str, ready: bool = True) -> dict[str, str]:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "fake kubelet is posting ready status" if ready
        else "container runtime is down (fake kubelet)",
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": transition,
    }


NODE_POOL_LABEL = "fairgate.io/node-pool"
WHOLE_GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
SINGLE_MIG_PRODUCT = "A100-SXM4-40GB-MIG-1g.5gb"


def whole_gpu_node(
    name: str, gpus: int = 4, *, pool: str | None = None, cordoned: bool = False,
    product: str = WHOLE_GPU_PRODUCT,
) -> GpuNode:
    """A node of `gpus` whole GPUs (MIG off), in node pool `pool` if given."""
    labels = {NODE_POOL_LABEL: pool} if pool else {}
    return GpuNode(name, product, "none", {"nvidia.com/gpu": gpus}, gpus, 81920,
                   extra_labels=labels, cordoned=cordoned)


def single_mig_node(
    name: str, devices: int = 56, *, product: str = SINGLE_MIG_PRODUCT,
    pool: str | None = None,
) -> GpuNode:
    """A node under the MIG `single` strategy, as the NVIDIA device plugin and GFD show
    it: `devices` MIG devices (8 x A100-40GB as 7 x 1g.5gb each by default) advertised
    as `nvidia.com/gpu`, `nvidia.com/gpu.product` naming the profile, and the slice
    labels of a 1g.5gb device."""
    labels = {"nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1",
              **({NODE_POOL_LABEL: pool} if pool else {})}
    return GpuNode(name, product, "single", {"nvidia.com/gpu": devices}, devices, 4864,
                   extra_labels=labels)


def cordon(core: Any, name: str, cordoned: bool = True) -> None:
    """Cordon (or uncordon) node `name`, as `kubectl cordon` does."""
    core.patch_node(name, {"spec": {"unschedulable": cordoned}})


# Two whole-GPU nodes (4 x A100-80GB each, MIG off) and two MIG `mixed` nodes: one
# A100-40GB split into 7 x 1g.5gb, one A100-80GB split into 2 x 3g.40gb. In slices:
# 8 GPUs = 56, plus 7 + 6 MIG slices.
DEFAULT_GPU_NODES: tuple[GpuNode, ...] = (
    GpuNode("gpu-a100-0", "NVIDIA-A100-SXM4-80GB", "none", {"nvidia.com/gpu": 4}, 4, 81920),
    GpuNode("gpu-a100-1", "NVIDIA-A100-SXM4-80GB", "none", {"nvidia.com/gpu": 4}, 4, 81920),
    GpuNode(
        "gpu-mig-5gb",
        "NVIDIA-A100-SXM4-40GB",
        "mixed",
        {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.5gb": 7},
        1,
        40960,
    ),
    GpuNode(
        "gpu-mig-40gb",
        "NVIDIA-A100-SXM4-80GB",
        "mixed",
        {"nvidia.com/gpu": 0, "nvidia.com/mig-3g.40gb": 2},
        1,
        81920,
    ),
)


def _in_grace(pod: Any) -> bool:
    """A pod annotated `HONOUR_GRACE: "true"` that is being deleted is still within its
    grace period (a real kubelet gives every pod that; the fake one, to keep tests fast,
    only pods that ask)."""
    annotations = pod.metadata.annotations or {}
    if annotations.get(HONOUR_GRACE) != "true":
        return False
    deadline: datetime.datetime = pod.metadata.deletion_timestamp
    return datetime.datetime.now(datetime.UTC) < deadline


@dataclass
class _Finish:
    namespace: str
    name: str
    phase: str
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class FakeKubelet:
    """Runs the nodes' side of the pod lifecycle in one background thread."""

    def __init__(
        self,
        controlplane: ControlPlane,
        nodes: Sequence[GpuNode] = DEFAULT_GPU_NODES,
        interval: float = 0.2,
        heartbeat_seconds: float = 10.0,
    ) -> None:
        self.nodes: tuple[GpuNode, ...] = ()
        self._cp = controlplane
        self._admin: Any = client.CoreV1Api(controlplane.admin)
        self._core: dict[str, Any] = {}
        self._leases: dict[str, Any] = {}
        self._not_ready: dict[str, str] = {}  # node -> when its kubelet began to say so
        self._ready_again: dict[str, str] = {}  # node -> when it became Ready again
        self._nodes_lock = threading.Lock()
        for node in nodes:
            self._add_clients(node)
        self._lifecycle = NODE_LIFECYCLE in controlplane.controllers
        self._interval = interval
        self._heartbeat_seconds = heartbeat_seconds
        self._requests: queue.Queue[_Finish] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        self._ready_since = _now()
        self.errors: list[str] = []

    # -- public ------------------------------------------------------------------------

    def register_nodes(self) -> None:
        """Create the Node objects (as the admin, like a provisioner) and their Leases.

        The API server taints new nodes `node.kubernetes.io/not-ready`; the node
        lifecycle controller lifts it from a Ready node, and this returns once it has.
        When the control plane runs without that controller, this lifts the taint
        itself, as the controller would.
        """
        for node in self.nodes:
            self._create(node)
        for node in self.nodes:
            self._wait_registered(node)

    def add_node(self, node: GpuNode) -> None:
        """Register one more node (as :meth:`register_nodes` does) and serve it from
        now on; returns once the not-ready taint is off it."""
        with self._nodes_lock:
            self._add_clients(node)
        self._create(node)
        self._wait_registered(node)

    def remove_node(self, name: str) -> None:
        """Stop serving node `name` and delete its Node object and Lease (as a node
        autoscaler removes a node it scaled down); pods still bound to it are the
        caller's to delete first."""
        with self._nodes_lock:
            self.nodes = tuple(n for n in self.nodes if n.name != name)
            self._core.pop(name)
            self._leases.pop(name)
            self._not_ready.pop(name, None)
            self._ready_again.pop(name, None)
        self._admin.delete_node(name)
        client.CoordinationV1Api(self._cp.admin).delete_namespaced_lease(
            name, "kube-node-lease")

    def set_ready(self, name: str, ready: bool) -> None:
        """Make node `name`'s kubelet report Ready=`ready` (at once, then on every
        heartbeat); the node lifecycle controller taints a not-Ready node at once."""
        with self._nodes_lock:
            if ready:
                if self._not_ready.pop(name, None) is not None:
                    self._ready_again[name] = _now()
            else:
                self._not_ready.setdefault(name, _now())
            node = next(n for n in self.nodes if n.name == name)
        self._heartbeat(node)

    def _add_clients(self, node: GpuNode) -> None:
        credentials = self._cp.client_for(node.user, ["system:nodes"])
        self._core[node.name] = client.CoreV1Api(credentials)
        self._leases[node.name] = client.CoordinationV1Api(credentials)
        self.nodes = (*self.nodes, node)

    def _create(self, node: GpuNode) -> None:
        self._admin.create_node(node.manifest())
        if not self._lifecycle:
            self._admin.patch_node(
                node.name, {"spec": {"taints": [GPU_TAINT]}}, _content_type=MERGE
            )
        self._leases[node.name].create_namespaced_lease(
            "kube-node-lease",
            {
                "metadata": {"name": node.name},
                "spec": {
                    "holderIdentity": node.name,
                    "leaseDurationSeconds": 40,
                    "renewTime": _now_micro(),
                },
            },
        )

    def _wait_registered(self, node: GpuNode) -> None:
        wait_for(
            lambda: not [
                t for t in self._admin.read_node(node.name).spec.taints or []
                if t.key == NOT_READY_TAINT
            ],
            60,
            f"the node lifecycle controller to lift the not-ready taint of {node.name}",
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def finish(
        self, namespace: str, name: str, phase: str = "Succeeded", timeout: float = 15.0
    ) -> None:
        """Make a pod's containers exit: phase `Succeeded` or `Failed`. Blocks until done."""
        if phase not in ("Succeeded", "Failed"):
            raise ValueError(f"phase must be Succeeded or Failed, not {phase!r}")
        request = _Finish(namespace, name, phase)
        self._requests.put(request)
        if not request.done.wait(timeout):
            raise TimeoutError(f"fake kubelet did not finish {namespace}/{name} in {timeout}s")
        if request.error:
            raise RuntimeError(request.error)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        last_heartbeat = 0.0
        while not self._stop.wait(self._interval):
            try:
                self._serve_finish_requests()
                with self._nodes_lock:
                    nodes = list(self.nodes)
                for node in nodes:
                    self._sync_node(node)
                if time.monotonic() - last_heartbeat >= self._heartbeat_seconds:
                    for node in nodes:
                        self._heartbeat(node)
                    last_heartbeat = time.monotonic()
            except Exception as error:  # keep the kubelet alive; the fixture reports errors
                if not self._stop.is_set():
                    self.errors.append(f"{type(error).__name__}: {error}")

    def _serve_finish_requests(self) -> None:
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                pod = self._admin.read_namespaced_pod(request.name, request.namespace)
                node = pod.spec.node_name
                if node not in self._core:
                    request.error = (
                        f"{request.namespace}/{request.name} is not bound to a fake "
                        f"node (spec.nodeName={node!r})"
                    )
                else:
                    self._set_terminated(node, pod, request.phase)
            except ApiException as error:
                request.error = f"finishing {request.namespace}/{request.name}: {error.reason}"
            request.done.set()

    def _sync_node(self, node: GpuNode) -> None:
        core = self._core.get(node.name)
        if core is None:  # removed since this pass began
            return
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.name}")
        for pod in pods.items:
            meta = pod.metadata
            try:
                if meta.deletion_timestamp is not None:
                    if _in_grace(pod):
                        continue
                    core.delete_namespaced_pod(
                        meta.name,
                        meta.namespace,
                        body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta.uid}},
                    )
                elif pod.status.phase == "Pending":
                    self._set_running(node.name, pod)
            except ApiException as error:
                if error.status not in (404, 409):  # gone or changed meanwhile: next tick
                    raise

    def _set_running(self, node: str, pod: Any) -> None:
        now = _now()
        statuses = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": f"fake://{c.image}",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod.spec.containers
        ]
        conditions = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
        ]
        self._core[node].patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "hostIP": "127.0.0.1",
                    "hostIPs": [{"ip": "127.0.0.1"}],
                    "conditions": conditions,
                    "containerStatuses": statuses,
                },
            },
            _content_type=STRATEGIC,
        )

    def _set_terminated(self, node: str, pod: Any, phase: str) -> None:
        now = _now()
        code = 0 if phase == "Succeeded" else 1
        reason = "Completed" if phase == "Succeeded" else "Error"
        statuses = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": f"fake://{c.image}",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": reason,
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
            for c in pod.spec.containers
        ]
        conditions = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
            for t in ("ContainersReady", "Ready")
        ]
        self._core[node].patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {"phase": phase, "conditions": conditions, "containerStatuses": statuses},
            },
            _content_type=STRATEGIC,
        )

    def _heartbeat(self, node: GpuNode) -> None:
        with self._nodes_lock:
            down_since = self._not_ready.get(node.name)
            up_since = self._ready_again.get(node.name, self._ready_since)
            leases, core = self._leases.get(node.name), self._core.get(node.name)
        if leases is None or core is None:  # removed since this pass began
            return
        leases.patch_namespaced_lease(
            node.name, "kube-node-lease", {"spec": {"renewTime": _now_micro()}}, _content_type=MERGE
        )
        ready = down_since is None
        transition = up_since if down_since is None else down_since
        core.patch_node_status(
            node.name,
            {
                "status": {"conditions": [_ready_condition(_now(), transition, ready)]},
            },
            _content_type=STRATEGIC,
        )
