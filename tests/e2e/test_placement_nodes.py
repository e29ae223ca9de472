"""Placement classes against the real scheduler, with the harness's node kinds:
a node pool node (`fairgate.io/node-pool=pool-a`, team-b's `nodePool`) and a `single`
strategy MIG node (56 x 1g.5gb as `nvidia.com/gpu`) beside the default nodes; fairgate
installed from manifests/ (`fairgate dispatch --not-ready-grace 10`); the MIG node joins
the running cluster (`FakeKubelet.add_node`).

`fairgate status` shows per class what the scheduler can place; a pool tenant counts
only its pool (a fitting pod waits gated while the pool is full or cordoned, whatever
the shared nodes have free) and other tenants never run there; single-MIG pods run on
the single node and are gated while it is NotReady past its grace; every pod runs where
its affinity says.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.fairgate import GATE, PLATFORM_YAML, pods_api, tenant_namespace
from harness.kubelet import DEFAULT_GPU_NODES, cordon, single_mig_node, whole_gpu_node
from harness.pods import pod_manifest, required_affinity_admits, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POOL = "pool-a"
POOL_NODE = whole_gpu_node("gpu-pool-a", gpus=2, pool=POOL)
SINGLE = single_mig_node("gpu-mig-single")
NODES = (*DEFAULT_GPU_NODES, POOL_NODE)  # SINGLE joins later (fixture `single`)
LABELS = {n.name: n.labels() for n in (*NODES, SINGLE)}
SHARED_GPU_NODES = {n.name for n in DEFAULT_GPU_NODES if n.mig_strategy == "none"}
NOT_READY_GRACE = 10.0
TEAM_B_IN_POOL = PLATFORM_YAML.replace("  team-b:\n    weight: 1\n",
                                       f"  team-b:\n    weight: 1\n    nodePool: {POOL}\n")
SINGLE_LABELS = {"fairgate.io/mig-profile": "1g.5gb"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    assert TEAM_B_IN_POOL != PLATFORM_YAML
    with private_cluster(tmp_path_factory.mktemp("placement"), NODES,
                         "--not-ready-grace", f"{NOT_READY_GRACE:g}",
                         platform_yaml=TEAM_B_IN_POOL) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def single(env: PrivateCluster) -> str:
    """The single-strategy node, joining the running cluster; its class counts within
    seconds."""
    env.kubelet.add_node(SINGLE)
    wait_for(lambda: env.class_capacity().get("mig-1g.5gb#single") == 56, 30,
             "the joining single-strategy node to count as its own class")
    return SINGLE.name


@pytest.fixture
def clean(env: PrivateCluster) -> Iterator[None]:
    yield
    for tenant in ("team-a", "team-b"):
        env.admin.delete_collection_namespaced_pod(tenant_namespace(tenant),
                                                   grace_period_seconds=0)
    env.fairgate.wait_idle(60)


def _placed_by_affinity(core: Any) -> None:
    """Every bound pod sits on a node its required affinity admits."""
    for tenant in ("team-a", "team-b"):
        for pod in core.list_namespaced_pod(tenant_namespace(tenant)).items:
            node = pod.spec.node_name
            if node is not None:
                assert required_affinity_admits(pod, LABELS[node]), (pod.metadata.name, node)


def _gates(core: Any, namespace: str, name: str) -> list[str]:
    return [g.name for g in core.read_namespaced_pod(name, namespace).spec.scheduling_gates
            or []]


def test_status_shows_the_capacity_of_every_class(env: PrivateCluster, single: str) -> None:
    capacity = env.class_capacity()
    assert capacity["gpu"] == 8  # the shared whole-GPU nodes only
    assert capacity[f"gpu@{POOL}"] == 2
    assert capacity["mig-1g.5gb#single"] == 56  # not 56 more whole GPUs
    assert capacity["mig-1g.5gb"] == 7 and capacity["mig-3g.40gb"] == 2


def test_a_pool_tenant_counts_only_its_pool_and_others_never_run_there(
    env: PrivateCluster, clean: None
) -> None:
    core = env.admin
    b_ns, a_ns = tenant_namespace("team-b"), tenant_namespace("team-a")
    team_b, team_a = pods_api(env.cp, "team-b"), pods_api(env.cp, "team-a")
    for i in range(3):  # quota allows 4; the pool has 2 GPUs
        team_b.create_namespaced_pod(b_ns, pod_manifest(f"p{i}", {"nvidia.com/gpu": 1}))
    for i in range(2):
        node = wait_for(partial(running_node, core, b_ns, f"p{i}"), 60, f"p{i} to run")
        assert node == POOL_NODE.name
    assert _gates(core, b_ns, "p2") == [GATE]  # the shared nodes' 8 free GPUs are not its
    why = env.why(b_ns, "p2")
    assert why["verdict"] == "queued" and "capacity" in why["waiting_for"], why
    for i in range(4):  # team-a fills the shared nodes, never the pool
        team_a.create_namespaced_pod(a_ns, pod_manifest(f"s{i}", {"nvidia.com/gpu": 1}))
        node = wait_for(partial(running_node, core, a_ns, f"s{i}"), 60, f"s{i} to run")
        assert node in SHARED_GPU_NODES

    cordon(core, POOL_NODE.name)  # the pool node leaves capacity: p2 stays gated
    try:
        wait_for(lambda: env.class_capacity().get(f"gpu@{POOL}", 0) == 0, 30,
                 "the cordoned pool node to leave its class")
        core.delete_namespaced_pod("p0", b_ns, grace_period_seconds=0)
        wait_for(lambda: env.status()["tenants"]["team-b"]["used"] == 1, 30,
                 "p0's GPU to be freed")
        assert _gates(core, b_ns, "p2") == [GATE]
        assert f"node {POOL_NODE.name} cordoned" in env.status_text()
    finally:
        cordon(core, POOL_NODE.name, False)
    node = wait_for(partial(running_node, core, b_ns, "p2"), 60, "p2 to run once uncordoned")
    assert node == POOL_NODE.name
    _placed_by_affinity(core)


def test_single_mig_pods_run_on_the_single_node_and_wait_while_it_is_not_ready(
    env: PrivateCluster, single: str, clean: None
) -> None:
    core = env.admin
    ns, team_a = tenant_namespace("team-a"), pods_api(env.cp, "team-a")
    team_a.create_namespaced_pod(ns, pod_manifest("one", {"nvidia.com/gpu": 1},
                                                  labels=SINGLE_LABELS))
    node = wait_for(partial(running_node, core, ns, "one"), 60, "the single-MIG pod to run")
    assert node == SINGLE.name
    env.kubelet.set_ready(SINGLE.name, False)
    try:
        wait_for(lambda: env.class_capacity().get("mig-1g.5gb#single", 0) == 0,
                 NOT_READY_GRACE + 30, "the NotReady single node to leave its class")
        team_a.create_namespaced_pod(ns, pod_manifest("two", {"nvidia.com/gpu": 1},
                                                      labels=SINGLE_LABELS))
        assert _gates(core, ns, "two") == [GATE]
        assert f"node {SINGLE.name} NotReady since" in env.status_text()
    finally:
        env.kubelet.set_ready(SINGLE.name, True)
    node = wait_for(partial(running_node, core, ns, "two"), 60, "two to run once Ready")
    assert node == SINGLE.name
    whole = team_a.create_namespaced_pod(ns, pod_manifest("whole", {"nvidia.com/gpu": 1}))
    assert not required_affinity_admits(whole, LABELS[SINGLE.name])
    node = wait_for(partial(running_node, core, ns, "whole"), 60, "the whole-GPU pod to run")
    assert node in SHARED_GPU_NODES
    _placed_by_affinity(core)
