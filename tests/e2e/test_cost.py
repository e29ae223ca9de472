"""Chargeback end to end: pods run on the fake kubelet's GPU nodes under the real API
server and scheduler, `fairgate dispatch` audits what runs and what the scheduler
preempts, and `fairgate report` bills it from the verified audit stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import redis
from harness.fairgate import FairgateStack, pods_api, tenant_namespace
from harness.kubelet import DEFAULT_GPU_NODES
from harness.pods import pod_manifest, running_node, start_one_gpu_pods
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLUSTER_GPUS = sum(n.devices.get("nvidia.com/gpu", 0) for n in DEFAULT_GPU_NODES)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    """A cluster of its own (the shared `fairgate` fixture has fixed nodes and namespaces)."""
    with private_cluster(tmp_path_factory.mktemp("cost"), DEFAULT_GPU_NODES) as cluster:
        yield cluster


def _records(url: str, decision: str, name: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        found = []
        for _id, fields in client.xrange("fairgate:audit"):
            body = json.loads(fields[b"record"])
            if body["decision"] == decision and body["name"] == name:
                found.append(body)
        return found
    finally:
        client.close()


def _report(fairgate: FairgateStack, since: float) -> dict[str, Any]:
    start = datetime.fromtimestamp(since, UTC) - timedelta(seconds=60)
    result = fairgate.run_cli("report", "--json", "--since",
                              start.isoformat().replace("+00:00", "Z"),
                              "--redis-url", fairgate.redis_url)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_a_pod_running_a_measured_interval_is_billed_within_a_second(
    env: PrivateCluster,
) -> None:
    controlplane, kubelet, fairgate = env.cp, env.kubelet, env.fairgate
    ns, api = tenant_namespace("team-a"), pods_api(controlplane, "team-a")
    began = time.time()
    api.create_namespaced_pod(ns, pod_manifest("billed", {"nvidia.com/gpu": 2}))
    wait_for(partial(running_node, api, ns, "billed"), 60, "billed to run", interval=0.05)
    started = time.time()
    time.sleep(6)
    kubelet.finish(ns, "billed")
    ended = time.time()
    wait_for(lambda: _records(fairgate.redis_url, "release", "billed"), 30,
             "the dispatcher to release billed")
    (start_record,) = _records(fairgate.redis_url, "start", "billed")
    product = start_record["diff"]["pod"]["gpuProduct"]
    assert product == "NVIDIA-A100-SXM4-80GB"  # the node's nvidia.com/gpu.product

    data = _report(fairgate, began)
    rows = [r for r in data["rows"] if r["tenant"] == "team-a"]
    assert len(rows) == 1
    seconds = rows[0]["gpu_hours"] * 3600 / 2  # two whole GPUs
    assert abs(seconds - (ended - started)) <= 1.0, (seconds, ended - started)
    assert {u["gpu_product"] for u in rows[0]["usage"]} == {product}
    assert data["idle_gpu_hours"] is not None  # the dispatcher recorded the capacity


def test_a_borrower_evicted_for_inference_is_recorded_and_billed_as_preempted(
    env: PrivateCluster,
) -> None:
    controlplane, fairgate = env.cp, env.fairgate
    ns_a, ns_b = tenant_namespace("team-a"), tenant_namespace("team-b")
    team_a, team_b = pods_api(controlplane, "team-a"), pods_api(controlplane, "team-b")
    began = time.time()
    trainers = [f"trainer-{i}" for i in range(CLUSTER_GPUS)]
    # the youngest alone in its second: fairgate evicts it (else the scheduler would)
    start_one_gpu_pods(team_a, ns_a, trainers, last_alone=True)
    for name in trainers:  # the dispatcher has seen each running
        wait_for(lambda n=name: _records(fairgate.redis_url, "start", n), 30, f"{name} start")
    server = pod_manifest("server", {"nvidia.com/gpu": 1},
                          labels={"fairgate.io/class": "inference"})
    team_b.create_namespaced_pod(ns_b, server)
    wait_for(partial(running_node, team_b, ns_b, "server"), 60, "the preemption")
    survivors = {p.metadata.name for p in team_a.list_namespaced_pod(ns_a).items}
    (evicted,) = set(trainers) - survivors

    (record,) = wait_for(lambda: _records(fairgate.redis_url, "preempt", evicted), 30,
                         f"a preempt record for {evicted}")
    assert record["tenant"] == "team-a" and record["diff"]["preemption"]["band"] == "borrowed"
    assert record["diff"]["preemption"]["preemptor"] == f"{ns_b}/server", record
    assert "evicted for inference pod" in record["reason"], record
    assert record["diff"]["preemption"]["ranSeconds"] > 0
    data = _report(fairgate, began)
    (row,) = [r for r in data["rows"] if r["tenant"] == "team-a"]
    assert row["preempted_pods"] == 1
    assert row["preempted_gpu_hours"] * 3600 == pytest.approx(
        record["diff"]["preemption"]["ranSeconds"], abs=0.01)
