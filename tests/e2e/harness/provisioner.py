"""A stand-in for cluster-autoscaler's ProvisioningRequest support, class
`best-effort-atomic-scale-up.autoscaling.x-k8s.io`, on the e2e control plane.

`FakeAutoscaler` follows ProvisioningRequests in every namespace (a list every
`interval`, as the cluster admin), as cluster-autoscaler does: a request of that class
gets `Accepted=True` when first seen; `delay` seconds later its podSets' PodTemplates are
read and fake GPU nodes are added through the fake kubelet (`FakeKubelet.add_node`),
enough for every pod of every set at once (whole-GPU nodes of `node_gpus` GPUs, or of a
pod's GPUs when it asks for more), and then `Provisioned=True` is set. All or nothing:
a request whose pods ask for what it cannot make (MIG devices, DRA claims) gets
`Failed=True` (reason `NotSupported`) and no node. The knob `fail_next` makes the next
requests fail instead (`Failed=True`, reason `OutOfStock`), as a cloud out of GPUs does.
Requests of other classes are left alone. With `pending_pods` set it also plays
cluster-autoscaler without ProvisioningRequests (fairgate's `pending` mode): a pod that
the scheduler reports unschedulable gets a node for its GPUs `delay` seconds after it is
first seen so (tracked in `seen` as `pod:<namespace>/<name>`).

What it does not do, unlike cluster-autoscaler: book the new nodes for the request's
pods (any pod may land there), expire bookings (`BookingExpired`), scale idle nodes
down (`reset` does, when a test asks), or retry a scale-up itself.
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .controlplane import ControlPlane
from .kubelet import FakeKubelet, whole_gpu_node

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
GPU = "nvidia.com/gpu"
MERGE = "application/merge-patch+json"


@dataclass
class Seen:
    """One request as the fake autoscaler handled it (times: `time.monotonic()`)."""

    namespace: str
    name: str
    first_seen: float
    pods: int = 0
    outcome: str = ""  # "", "Provisioned", "Failed"
    done_at: float = 0.0
    nodes: tuple[str, ...] = ()


def _condition(kind: str, reason: str, message: str) -> dict[str, str]:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now}


def _pod_gpus(spec: Any) -> tuple[int, list[str]]:
    """Whole GPUs a pod of `spec` asks for (the larger of its app containers' sum and its
    largest init container), and what else it asks for that only cluster-autoscaler's
    real node groups could give."""
    other = [f"resourceClaims {[c.name for c in spec.resource_claims]}"] \
        if spec.resource_claims else []

    def gpus(container: Any) -> int:
        limits = (container.resources.limits if container.resources else None) or {}
        other.extend(k for k in limits if k.startswith("nvidia.com/") and k != GPU)
        return int(limits.get(GPU, 0))

    apps = sum(gpus(c) for c in spec.containers)
    inits = max((gpus(c) for c in spec.init_containers or []), default=0)
    return max(apps, inits), other


class FakeAutoscaler:
    """See the module docstring. `seen`: every request handled, by `namespace/name`."""

    def __init__(self, controlplane: ControlPlane, kubelet: FakeKubelet, delay: float = 2.0,
                 node_gpus: int = 2, interval: float = 0.2) -> None:
        self.delay = delay
        self.node_gpus = node_gpus
        self.fail_next = 0
        self.pending_pods = False
        self.seen: dict[str, Seen] = {}
        self.errors: list[str] = []
        self._kubelet = kubelet
        self._custom = client.CustomObjectsApi(controlplane.admin)
        self._core: Any = client.CoreV1Api(controlplane.admin)
        self._interval = interval
        self._made = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-autoscaler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def nodes(self) -> list[str]:
        """The nodes it added and has not removed."""
        return [n for s in self.seen.values() for n in s.nodes]

    def reset(self, delay: float) -> None:
        """Delete every node it added (their pods and requests must be gone), as a
        scale-down would, forget the requests it saw, and take `delay` and no failures."""
        for seen in self.seen.values():
            for node in seen.nodes:
                self._kubelet.remove_node(node)
        self.seen.clear()
        self.delay, self.fail_next, self.pending_pods = delay, 0, False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._pass()
            except Exception as error:  # keep following; the fixture reports errors
                if not self._stop.is_set():
                    self.errors.append(f"{type(error).__name__}: {error}")

    def _pass(self) -> None:
        found = self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        for request in found.get("items", []):
            meta, spec = request["metadata"], request["spec"]
            if spec.get("provisioningClassName") != CLASS:
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            seen = self.seen.get(key)
            if seen is None:
                seen = self.seen[key] = Seen(meta["namespace"], meta["name"], time.monotonic())
                self._set(seen, [_condition("Accepted", "Accepted", "accepted by the "
                                            "e2e harness's fake autoscaler")])
            elif not seen.outcome and time.monotonic() - seen.first_seen >= self.delay:
                self._provision(seen, spec["podSets"])
        if self.pending_pods:
            self._pending_pass()

    def _pending_pass(self) -> None:
        for pod in self._core.list_pod_for_all_namespaces(
                field_selector="spec.nodeName=,status.phase=Pending").items:
            scheduled = next((c for c in pod.status.conditions or []
                              if c.type == "PodScheduled"), None)
            if scheduled is None or scheduled.reason != "Unschedulable":
                continue
            key = f"pod:{pod.metadata.namespace}/{pod.metadata.name}"
            seen = self.seen.setdefault(key, Seen(pod.metadata.namespace, pod.metadata.name,
                                                  time.monotonic(), pods=1))
            gpus, other = _pod_gpus(pod.spec)
            if seen.outcome or other or not gpus or \
                    time.monotonic() - seen.first_seen < self.delay:
                continue
            self._made += 1
            seen.nodes = (f"autoscaled-{self._made}",)
            self._kubelet.add_node(whole_gpu_node(seen.nodes[0],
                                                  gpus=max(self.node_gpus, gpus)))
            seen.outcome, seen.done_at = "Provisioned", time.monotonic()

    def _provision(self, seen: Seen, pod_sets: list[Mapping[str, Any]]) -> None:
        accepted = _condition("Accepted", "Accepted", "accepted")
        if self.fail_next > 0:
            self.fail_next -= 1
            self._finish(seen, [accepted, _condition(
                "Failed", "OutOfStock", "the e2e harness's fake autoscaler was told to fail")])
            return
        wanted: list[tuple[int, int]] = []  # (GPUs per pod, pods)
        for pod_set in pod_sets:
            template = self._core.read_namespaced_pod_template(
                pod_set["podTemplateRef"]["name"], seen.namespace)
            gpus, other = _pod_gpus(template.template.spec)
            if other or gpus == 0:
                self._finish(seen, [accepted, _condition(
                    "Failed", "NotSupported", f"the fake autoscaler makes whole-GPU nodes "
                    f"only; template {template.metadata.name} asks for "
                    f"{', '.join(other) or 'no GPU'}")])
                return
            wanted.append((gpus, int(pod_set["count"])))
        nodes: list[str] = []
        for gpus, pods in wanted:
            size = max(self.node_gpus, gpus)
            for _ in range(math.ceil(pods / (size // gpus))):
                self._made += 1
                name = f"autoscaled-{self._made}"
                self._kubelet.add_node(whole_gpu_node(name, gpus=size))
                nodes.append(name)
        seen.pods, seen.nodes = sum(p for _, p in wanted), tuple(nodes)
        self._finish(seen, [accepted, _condition(
            "Provisioned", "Provisioned", f"nodes {', '.join(nodes)} added")])

    def _finish(self, seen: Seen, conditions: list[dict[str, str]]) -> None:
        self._set(seen, conditions)
        seen.outcome, seen.done_at = conditions[-1]["type"], time.monotonic()

    def _set(self, seen: Seen, conditions: list[dict[str, str]]) -> None:
        try:
            self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, seen.namespace, PLURAL, seen.name,
                {"status": {"conditions": conditions}}, _content_type=MERGE)
        except ApiException as error:
            if error.status != 404:  # deleted meanwhile (its pods went): nothing to do
                raise


def requests_in(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """The ProvisioningRequests in `namespace`, as the API server returns them."""
    found = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL)
    items: list[dict[str, Any]] = found["items"]
    return items


@contextmanager
def fake_autoscaler(controlplane: ControlPlane, kubelet: FakeKubelet,
                    **settings: Any) -> Iterator[FakeAutoscaler]:
    """A running :class:`FakeAutoscaler` (`settings` as its constructor's); fails if it
    reported errors."""
    autoscaler = FakeAutoscaler(controlplane, kubelet, **settings)
    autoscaler.start()
    try:
        yield autoscaler
    finally:
        autoscaler.stop()
    assert not autoscaler.errors, f"fake autoscaler errors: {autoscaler.errors}"
