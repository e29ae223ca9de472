"""Gangs that fit run, on the real control plane: team-a's quota is nominal 4 GPUs,
borrowLimit 2 and inferenceReserve 1, so training may hold 3 GPUs of nominal plus 2
borrowed. On an idle cluster of 12 GPUs a gang of four 1-GPU training pods, created
together as a tenant user would, runs as one borrowed gang (3 GPUs of nominal room and
1 borrowed); once it has ended, a single 4-GPU training pod runs too. Neither is ever
called "never fits", and while the gang runs a 3-GPU training pod waits for quota
(4 + 3 GPUs would be above nominal + borrowLimit = 6).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from harness.fairgate import QUOTA_YAML, pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = tuple(whole_gpu_node(f"gpu-{i}") for i in range(3))  # 12 whole GPUs, idle
QUOTAS = {**QUOTA_YAML, "team-a": """\
nominal: {gpu: 4}
borrowLimit: {gpuEquivalents: 2}
inferenceReserve: {gpuEquivalents: 1}
defaultClass: training
"""}
NS = tenant_namespace("team-a")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("gang-fit"), NODES, quotas=QUOTAS) as cluster:
        yield cluster


def _all_running(core: Any, names: list[str]) -> bool:
    return all(running_node(core, NS, name) for name in names)


def _gone(core: Any, names: list[str]) -> None:
    for name in names:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: no_pods(core, NS), 60, "team-a's pods to be gone")


def test_a_gang_of_four_one_gpu_pods_runs_and_keeps_its_room(env: PrivateCluster) -> None:
    user = pods_api(env.cp, "team-a")
    names = [f"ddp-{i}" for i in range(4)]
    members = [pod_manifest(name, {"nvidia.com/gpu": 1},
                            labels={"fairgate.io/pod-group": "ddp"},
                            annotations={"fairgate.io/pod-group-size": "4"})
               for name in names]
    with ThreadPoolExecutor(len(members)) as pool:  # created together
        list(pool.map(lambda body: user.create_namespaced_pod(NS, body), members))
    wait_for(lambda: _all_running(env.admin, names), 60, "the gang to run")
    for name in names:  # one band for the whole gang: above nominal less the reserve
        pod = env.admin.read_namespaced_pod(name, NS)
        assert pod.spec.priority_class_name == "fairgate-borrowed", name
        assert pod.metadata.annotations.get("fairgate.io/borrowed") == "true", name
    assert float(env.status()["tenants"]["team-a"]["used"]) == 4.0

    # the nominal room the gang stands in stays its own: 3 GPUs more would be 7 > 6
    user.create_namespaced_pod(NS, pod_manifest("wide", {"nvidia.com/gpu": 3}))
    wait_for(lambda: is_gated(env.admin.read_namespaced_pod("wide", NS)), 30,
             "the 3-GPU pod to be gated")
    why = env.why(NS, "wide")
    assert "never fits" not in str(why), why
    assert "tenant quota" in str(why), why
    assert float(env.status()["tenants"]["team-a"]["used"]) == 4.0
    # the gang ends: the 3-GPU pod runs in the room it freed
    for name in names:
        env.admin.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: running_node(env.admin, NS, "wide"), 60, "the 3-GPU pod to run")
    _gone(env.admin, ["wide"])


def test_a_single_four_gpu_pod_runs(env: PrivateCluster) -> None:
    user = pods_api(env.cp, "team-a")
    user.create_namespaced_pod(NS, pod_manifest("four", {"nvidia.com/gpu": 4}))
    wait_for(lambda: running_node(env.admin, NS, "four"), 60, "the 4-GPU pod to run")
    pod = env.admin.read_namespaced_pod("four", NS)
    assert pod.spec.priority_class_name == "fairgate-borrowed"
    assert float(env.status()["tenants"]["team-a"]["used"]) == 4.0
    _gone(env.admin, ["four"])
