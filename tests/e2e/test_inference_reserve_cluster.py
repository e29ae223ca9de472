"""An inference reserve kept free of borrowed pods, on the real control plane.

8 whole GPUs (two nodes of 4), two tenants of weight 1: team-a (nominal 4, borrowLimit
4) trains, team-b (nominal 4, inferenceReserve 1) serves, and `fairShare:
{lendInferenceReserve: false}`. team-a's backlog may borrow team-b's idle GPUs but not
the one of its reserve: the eighth trainer stays gated and `fairgate why` says so.
team-b's inference pod then starts in that GPU without any pod being preempted, and once
it is gone the GPU is kept free again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.fairgate import EVEN_PLATFORM_YAML, pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import is_gated, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = tuple(whole_gpu_node(f"gpu-{i}") for i in range(2))  # 8 whole GPUs
PLATFORM = EVEN_PLATFORM_YAML + "fairShare: {lendInferenceReserve: false}\n"
QUOTAS = {
    "team-a": "nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 4}\n"
              "inferenceReserve: {gpuEquivalents: 0}\ndefaultClass: training\n",
    "team-b": "nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 0}\n"
              "inferenceReserve: {gpuEquivalents: 1}\ndefaultClass: training\n",
}
A, B = tenant_namespace("team-a"), tenant_namespace("team-b")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("reserve"), NODES, platform_yaml=PLATFORM,
                         quotas=QUOTAS) as cluster:
        yield cluster


def _alive(core: Any, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items
            if p.metadata.deletion_timestamp is None}


def test_inference_starts_in_its_kept_reserve_and_nothing_is_preempted(
        env: PrivateCluster) -> None:
    team_a, team_b = pods_api(env.cp, "team-a"), pods_api(env.cp, "team-b")
    trainers = [f"trainer-{i}" for i in range(8)]
    for name in trainers:
        team_a.create_namespaced_pod(A, pod_manifest(name, {"nvidia.com/gpu": 1}))
    for name in trainers[:7]:
        wait_for(partial(running_node, team_a, A, name), 60, f"{name} to run")
    time.sleep(3)  # dispatch passes that would release the eighth
    last = team_a.read_namespaced_pod(trainers[7], A)
    assert is_gated(last), "the eighth trainer took team-b's kept inference reserve"
    why = env.why(A, trainers[7])
    assert "unused inferenceReserve free" in str(why), why

    team_b.create_namespaced_pod(B, pod_manifest(
        "server", {"nvidia.com/gpu": 1}, labels={"fairgate.io/class": "inference"}))
    wait_for(partial(running_node, team_b, B, "server"), 30, "the inference pod to run")
    assert _alive(team_a, A) == set(trainers), "a trainer was preempted for inference"
    assert is_gated(team_a.read_namespaced_pod(trainers[7], A))

    team_b.delete_namespaced_pod("server", B, grace_period_seconds=0)
    wait_for(lambda: "server" not in _alive(team_b, B), 30, "the inference pod to go")
    time.sleep(3)
    assert is_gated(team_a.read_namespaced_pod(trainers[7], A)), \
        "the freed reserve was lent to a borrowed trainer"
