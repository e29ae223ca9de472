"""Budgets end to end: under the real API server and scheduler, a tenant whose
month-to-date spend (billed by `fairgate dispatch` from the audit stream) reaches its
budget keeps its nominal quota, but its training may no longer borrow: a pod beyond
nominal is stamped `fairgate-training` and stays gated although GPUs are idle."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
import redis
from harness.fairgate import PLATFORM_YAML, pods_api, tenant_namespace
from harness.kubelet import DEFAULT_GPU_NODES
from harness.pods import pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

from audit import RELEASE, START, AuditLog
from audit.chain import format_time
from audit.usage import start_detail

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GATE = "fairgate.io/queue"
# team-a: nominal 4 GPUs, borrowLimit 4; a GPU-second costs 1 USD; the budget is 10 USD
BUDGET_YAML = PLATFORM_YAML.replace(
    "    admins: {groups: [team-a-admins], users: [alice@example.com]}\n",
    "    admins: {groups: [team-a-admins], users: [alice@example.com]}\n"
    "    budget: {monthly: 10}\n",
) + "pricing: {currency: USD, gpuHour: {default: 3600}}\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    """A cluster of its own, its dispatcher billing budgets every second."""
    assert "budget:" in BUDGET_YAML
    with private_cluster(tmp_path_factory.mktemp("budget"), DEFAULT_GPU_NODES,
                         "--budget-every", "1", platform_yaml=BUDGET_YAML) as cluster:
        yield cluster


def _budget(url: str) -> dict[str, Any] | None:
    client = redis.Redis.from_url(url)
    try:
        raw = client.hget("fairgate:budget", "team-a")
        return json.loads(raw) if raw is not None else None
    finally:
        client.close()


def _write_history(url: str, seconds: float) -> None:
    """A pod of team-a that ran one GPU for ``seconds`` just now, as the dispatcher
    records it (through the real audit writer: the chain stays valid)."""
    client = redis.Redis.from_url(url)
    try:
        log = AuditLog(client, out=io.StringIO())
        now = time.time()
        common: dict[str, Any] = {
            "uid": "history-0000", "user": "fairgate-dispatcher", "operation": "DISPATCH",
            "tenant": "team-a", "namespace": tenant_namespace("team-a"), "name": "history",
            "pod_class": "training", "demand": "gpu=1"}
        log.record(START, time=format_time(datetime.fromtimestamp(now - seconds - 1, UTC)),
                   reason="running on node gpu-1",
                   diff=start_detail("training", "gpu-1", None), **common)
        log.record(RELEASE, time=format_time(datetime.fromtimestamp(now - 1, UTC)),
                   reason="pod succeeded", **common)
    finally:
        client.close()


def test_an_exhausted_budget_keeps_nominal_and_stops_borrowing(env: PrivateCluster) -> None:
    controlplane, fairgate = env.cp, env.fairgate
    ns, api = tenant_namespace("team-a"), pods_api(controlplane, "team-a")
    first = wait_for(lambda: _budget(fairgate.redis_url), 30, "the first budget pass")
    assert first["state"] == "ok"
    _write_history(fairgate.redis_url, 20.0)  # 20 GPU-seconds: 20 USD of 10
    spent = wait_for(lambda: (b := _budget(fairgate.redis_url)) and
                     b["state"] == "exhausted" and b, 30, "the budget to be exhausted")
    assert spent["spent"] >= 20.0

    nominal = [f"nominal-{i}" for i in range(4)]
    for name in nominal:
        api.create_namespaced_pod(ns, pod_manifest(name, {"nvidia.com/gpu": 1}))
    for name in nominal:  # nominal is never cut
        wait_for(partial(running_node, api, ns, name), 60, f"{name} to run")
    api.create_namespaced_pod(ns, pod_manifest("beyond", {"nvidia.com/gpu": 1}))
    beyond = api.read_namespaced_pod("beyond", ns)
    # not stamped borrowed: it waits for nominal room although 4 GPUs are idle
    assert beyond.spec.priority_class_name == "fairgate-training"
    assert "fairgate.io/borrowed" not in (beyond.metadata.annotations or {})
    time.sleep(3)  # dispatcher passes (each second) do not release it
    beyond = api.read_namespaced_pod("beyond", ns)
    assert [g.name for g in beyond.spec.scheduling_gates or []] == [GATE]

    api.delete_namespaced_pod(nominal[0], ns, grace_period_seconds=0)
    wait_for(lambda: not api.read_namespaced_pod("beyond", ns).spec.scheduling_gates, 60,
             "beyond to get the freed nominal room")

    status = json.loads(fairgate.run_cli("status", "--json", "--redis-url",
                                         fairgate.redis_url).stdout)
    assert status["budgets"]["team-a"]["state"] == "exhausted"
    assert status["tenants"]["team-a"]["borrow_limit"] == 0
    verify = fairgate.run_cli("audit", "verify", "--redis-url", fairgate.redis_url)
    assert verify.returncode == 0
