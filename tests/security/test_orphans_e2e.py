"""Attack ("orphans"): pods that fairgate queued but a later admission step
refused push a tenant's legitimate pods into the permanent, preemptible borrowed band.

A private control plane with fairgate installed from manifests/ (harness.private): the
real API server calls fairgate's mutating webhook, then its ResourceQuota admission
plugin (which runs after every webhook) refuses the pod, so the pod never exists while
its queue entry does. Before the fix such entries counted as "training queued ahead"
until the 300 s reconcile.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import refusal
from harness.fairgate import pods_api, tenant_namespace
from harness.kubelet import DEFAULT_GPU_NODES
from harness.pods import is_gated, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# e2e quotas (harness.fairgate): team-a 4 GPUs nominal + 4 GPU-eq borrowed, team-b 4 GPUs.
TEAM_A_NOMINAL = 4.0
LIMIT = {"team-a": 8.0, "team-b": 4.0}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("orphans"), DEFAULT_GPU_NODES) as cluster:
        yield cluster


def running_gpus(core: Any, namespace: str) -> int:
    """GPUs that the namespace's Running, ungated pods hold, by their specs."""
    total = 0
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase == "Running" and not is_gated(pod):
            limits = pod.spec.containers[0].resources.limits or {}
            total += int(limits.get("nvidia.com/gpu", 0))
    return total


def test_pods_refused_by_a_resource_quota_after_fairgate_queued_them_push_nobody_into_borrowing(
    env: PrivateCluster,
) -> None:
    """Three gang members (a gang always queues until whole) are queued by fairgate, then
    refused by a real ResourceQuota. A legitimate 2-GPU pod of the same tenant must be
    stamped `fairgate-training`, not borrowed; the orphans' entries expire after the
    reservation TTL; `fairgate status` then shows exactly the 2 GPUs that run."""
    fairgate = env.fairgate
    ns = tenant_namespace("team-a")
    core = pods_api(env.cp, "team-a")
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    env.admin.create_namespaced_resource_quota(ns, quota)
    # No resourcequota controller runs: write the status it would, so the plugin enforces.
    env.admin.patch_namespaced_resource_quota_status("gpus", ns, {"status": {
        "hard": {"requests.nvidia.com/gpu": "0"}, "used": {"requests.nvidia.com/gpu": "0"}}})
    try:
        for i in range(3):
            member = pod_manifest(
                f"member-{i}", {"nvidia.com/gpu": 1},
                labels={"fairgate.io/pod-group": "orphans"},
                annotations={"fairgate.io/pod-group-size": "4"},
            )
            status, message = refusal(lambda m=member: core.create_namespaced_pod(ns, m))
            assert status == 403 and "exceeded quota" in message, message
    finally:
        env.admin.delete_namespaced_resource_quota("gpus", ns)
    assert not core.list_namespaced_pod(ns).items  # the orphans never existed
    assert fairgate.tenant_state("team-a")["queued"]["training"] == 3  # but were queued

    legit = core.create_namespaced_pod(ns, pod_manifest("legit", {"nvidia.com/gpu": 2}))
    assert legit.spec.priority_class_name == "fairgate-training"
    assert "fairgate.io/borrowed" not in (legit.metadata.annotations or {})
    wait_for(partial(running_node, core, ns, "legit"), 60, "legit to run")
    wait_for(
        lambda: fairgate.tenant_state("team-a")["queued"]["training"] == 0 or None,
        90, "the orphans' queue entries to expire",
    )
    state = fairgate.tenant_state("team-a")
    assert state["used"] == running_gpus(core, ns) == 2
    assert state["used"] <= TEAM_A_NOMINAL  # nothing of it borrowed
    for tenant, row in fairgate.status()["tenants"].items():
        assert row.get("used", 0) <= LIMIT[tenant], (tenant, row)
