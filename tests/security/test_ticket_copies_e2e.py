"""A tenant user creating pods with a ticket it chose or copied, at once, through the
real API server and fairgate's webhooks (mutating and validating) and dispatcher.

The mutating webhook refuses a ticket the queue never minted (chosen by hand, or copied
from a pod whose admission has ended). Copies of a minted ticket racing each other are
not stored yet, so the validating webhook claims each ticket for the uid of the first
pod it sees with it, before that pod is stored, and refuses every other pod presenting
it. Whatever the creates, the GPUs of the tenant's live pods never exceed what fairgate
charges it.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from harness.controlplane import ControlPlane
from harness.fairgate import FairgateStack, pods_api, tenant_namespace
from harness.kubelet import FakeKubelet
from harness.pods import pod_manifest
from harness.waiting import wait_for
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GATE = "fairgate.io/queue"
COPIES = 8


def _live_gpus(core: Any, namespace: str) -> int:
    """GPUs the namespace's pods hold or may take at once: ungated and not finished."""
    total = 0
    for pod in core.list_namespaced_pod(namespace).items:
        gated = any(g.name == GATE for g in pod.spec.scheduling_gates or [])
        if gated or pod.status.phase in ("Succeeded", "Failed"):
            continue
        total += int((pod.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu", 0))
    return total


def _create_all(core: Any, namespace: str, manifests: list[dict[str, Any]]) -> list[str]:
    """Create every manifest at once; the names of those the API server stored."""
    def create(manifest: dict[str, Any]) -> str | None:
        try:
            return str(core.create_namespaced_pod(namespace, manifest).metadata.name)
        except ApiException as error:
            assert error.status in (400, 403, 422), error.body
            return None
    with ThreadPoolExecutor(COPIES) as pool:
        return [name for name in pool.map(create, manifests) if name]


def _copy(name: str, ticket: str, gpus: int) -> dict[str, Any]:
    return pod_manifest(
        name, {"nvidia.com/gpu": gpus},
        labels={"fairgate.io/tenant": "team-b", "fairgate.io/class": "training"},
        annotations={"fairgate.io/ticket": ticket, "fairgate.io/demand": f"gpu={gpus}"},
    )


def _charged(fairgate: FairgateStack) -> float:
    return float(fairgate.tenant_state("team-b").get("used") or 0.0)


def test_concurrent_creates_with_one_chosen_ticket_store_no_pod(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    ticket = str(uuid.uuid4())  # the user's choice, never minted by fairgate
    stored = _create_all(core, ns, [_copy(f"copy-{i}", ticket, 2) for i in range(COPIES)])
    assert stored == []
    assert _charged(fairgate) == 0.0 == _live_gpus(core, ns)


def test_a_chosen_ticket_is_refused_saying_what_to_remove(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, _copy("chosen", str(uuid.uuid4()), 1))
    assert refused.value.status == 403
    assert "did not issue" in refused.value.body
    assert "remove them" in refused.value.body
    core.create_namespaced_pod(ns, pod_manifest("plain", {"nvidia.com/gpu": 1}))
    wait_for(lambda: _charged(fairgate) == 1.0 == _live_gpus(core, ns), 30,
             "fairgate to charge the one pod it admitted")


def test_a_ticket_copied_from_a_deleted_pod_is_refused(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    first = core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 2}))
    ticket = first.metadata.annotations["fairgate.io/ticket"]
    core.delete_namespaced_pod("first", ns, grace_period_seconds=0)
    wait_for(lambda: _charged(fairgate) == 0.0, 30, "fairgate to forget the deleted pod")
    stored = _create_all(core, ns, [_copy(f"late-{i}", ticket, 2) for i in range(COPIES)])
    assert stored == []
    assert _live_gpus(core, ns) == 0


def test_copies_of_a_running_pods_stamps_are_refused(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    first = core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 2}))
    ticket = first.metadata.annotations["fairgate.io/ticket"]
    stored = _create_all(core, ns, [_copy(f"twin-{i}", ticket, 2) for i in range(COPIES)])
    assert stored == []
    wait_for(lambda: _charged(fairgate) == 2.0 == _live_gpus(core, ns), 30,
             "fairgate to charge the one pod that runs")
