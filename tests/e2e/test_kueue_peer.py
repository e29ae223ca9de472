"""bench/peer_kueue.py's setup, on the e2e control plane: Kueue v0.17.0 (built from Go
modules) comes up with the plain-pod integration and fair sharing, gates a tenant's pod
at create and admits it (ungated, bound, Running) within its ClusterQueue's quota,
keeps a pod that no quota can hold gated, and a short trace runs through both systems
with the bench's own measurement.

Marked `peer`: left out of `python -m pytest` (Kueue's cold build takes about 18 min);
run with `python -m pytest -m peer`. test_peer_harness.py checks the harness's manifests
and the bench's arithmetic without building Kueue."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from harness.fairgate import pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.kueue import COHORT, GATE, GROUP, VERSION, Tenant
from harness.pods import is_gated
from harness.waiting import wait_for
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peer_kueue

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.peer]

TENANTS = (Tenant("team-a", 1, 2), Tenant("team-b", 1, 2))


def test_kueue_gates_and_admits_a_tenant_pod(kueue_home: Path, tmp_path: Path) -> None:
    nodes = (whole_gpu_node("gpu-0", 4),)
    with peer_kueue.cluster("kueue", nodes, TENANTS, tmp_path) as (cp, _, peer, _log):
        peer.install()
        assert peer.kueue is not None and peer.kueue.home == kueue_home
        custom: Any = client.CustomObjectsApi(cp.admin)
        queue = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "team-a")
        assert queue["spec"]["cohortName"] == COHORT
        assert queue["spec"]["fairSharing"]["weight"] == "1"

        core = pods_api(cp, "team-a")
        namespace = tenant_namespace("team-a")
        created = core.create_namespaced_pod(namespace, peer.manifest("one", 1, None, False))
        assert GATE in [g.name for g in created.spec.scheduling_gates or []]
        wait_for(lambda: core.read_namespaced_pod("one", namespace).status.phase == "Running",
                 60, "Kueue to admit the pod and the fake kubelet to run it")
        workloads = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")
        admitted = [w for w in workloads["items"]
                    if any(c["type"] == "Admitted" and c["status"] == "True"
                           for c in w.get("status", {}).get("conditions", []))]
        assert [w["status"]["admission"]["clusterQueue"] for w in admitted] == ["team-a"]

        # 5 GPUs: more than the cohort's 4 in all; Kueue never ungates it
        core.create_namespaced_pod(namespace, peer.manifest("too-big", 5, None, False))
        wait_for(lambda: any(
            w["metadata"]["name"].startswith("pod-too-big") for w in
            custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
        ), 30, "Kueue to create the big pod's Workload")
        assert is_gated(core.read_namespaced_pod("too-big", namespace))


@pytest.mark.parametrize("system", peer_kueue.SYSTEMS)
def test_a_short_trace_runs_through_each_system(
    system: str, kueue_home: Path, tmp_path: Path
) -> None:
    """Two equal tenants, 4 GPUs, every pod needs all 4 for 2 s, team-b's backlog 1 s
    after team-a's: the bench measures the shares over the window in which both have a
    backlog (they add up to 1) and utilisation within (0, 1]: GPU-time never exceeds the
    capacity. (Whether team-b gets its half, and how busy each system keeps the cluster
    between 2-s pods, is what the bench reports, not what this test checks.)"""
    scenario = peer_kueue.Scenario(
        "tiny", (whole_gpu_node("gpu-0", 4),), TENANTS,
        (peer_kueue.Stream("team-a", 0, 10, 4, 2), peer_kueue.Stream("team-b", 1, 10, 4, 2)),
        horizon=16,
    )
    result = peer_kueue.run_trace(system, scenario, tmp_path)
    assert set(result["shares"]) == {"team-a", "team-b"}
    assert abs(sum(result["shares"].values()) - 1) < 1e-3, result
    assert result["entitled"] == {"team-a": 0.5, "team-b": 0.5}
    assert 0.2 < result["utilisation"] <= 1.0, result
    assert result["pods_run"] >= 4, result
