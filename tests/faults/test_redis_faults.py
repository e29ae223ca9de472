"""Redis faults under a real ``fairgate serve``: killed during load, restarted empty, slow.

Real processes on loopback only: a ``redis-server`` the test kills (SIGKILL) and
restarts on the same port (empty, as a cache comes back), ``fairgate serve`` over HTTPS,
client threads posting AdmissionReview v1 bodies. Every test is bounded in time.
"""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fault_kit import (
    Answer,
    Load,
    RedisServer,
    ServeFactory,
    live_tickets,
    usage_by_tenant,
    write_config_dir,
)
from test_https import patched
from webhook_helpers import gpu_pod, review

from admission.demand import pod_demand
from fairshare.cluster.cluster import GpuPod
from fairshare.cluster.kube import pod_from_manifest
from fairshare.cluster.reconcile import reconcile
from fairshare.queue.fairqueue import FairQueue
from tenants.localdir import load_config_dir
from tenants.models import FairgateConfig
from webhook.service import FAIL_OPEN_WARNING, REDIS_DOWN_MESSAGE

pytestmark = pytest.mark.slow

PLATFORM = """\
platformAdmins: {groups: [platform-team]}
capacity: {gpu: 64}
tenants:
  team-a: {weight: 1, ceiling: {gpuEquivalents: 8}}
onRedisUnavailable: %s
"""
# 4 GPUs nominal + 2 borrowed: the 7th concurrent one-GPU pod must wait.
QUOTA = "nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 2}\ndefaultClass: training\n"
DEADLINE = 1.0  # the webhook's own answer deadline (webhook.app)
SLACK = 0.5  # scheduling noise on a shared 2-core machine


def config_dir(tmp_path: Path, policy: str = "deny") -> Path:
    """Tenant team-a (namespace team-a-dev) with the given ``onRedisUnavailable``."""
    return write_config_dir(tmp_path / f"config-{policy}", PLATFORM % policy,
                            {"team-a": QUOTA}, {"team-a-dev": "team-a"})


def team_a_pod(client: int, i: int) -> dict[str, Any]:
    """A one-GPU training pod of team-a with a unique name."""
    return gpu_pod("team-a-dev", f"p-{client}-{i}")


def cluster_pod(answer: Answer, created: float, config: FairgateConfig) -> GpuPod:
    """The pod the API server would hold after ``answer`` (its patch applied)."""
    assert answer.response is not None
    obj = patched(answer.pod, answer.response)
    obj["metadata"]["creationTimestamp"] = datetime.datetime.fromtimestamp(
        created, datetime.UTC).isoformat()
    obj["metadata"]["uid"] = answer.uid
    pod = pod_from_manifest(obj, config.platform.priority_classes, pod_demand)
    assert pod is not None, obj
    return pod


@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_redis_killed_during_load(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path, policy: str
) -> None:
    """Kill Redis under 8 clients, bring it back empty: every answer is a 200 within the
    deadline; while Redis is down every GPU pod is denied with the Redis message (or, with
    ``allow``, admitted with the fail-open warning and audited); within 5 s of Redis
    returning, admissions work again; after a reconcile nothing leaks."""
    config = config_dir(tmp_path, policy)
    server = serve(redis_server.url, config)
    with Load(server, team_a_pod, clients=8) as load:
        time.sleep(1.5)
        killed = time.monotonic()
        redis_server.kill()
        time.sleep(2.0)
        restarting = time.monotonic()  # Redis may answer from here on
        redis_server.start()
        back = time.monotonic()
        time.sleep(6.0)
    answers = load.answers
    assert [a for a in answers if a.status != 200] == []
    slowest = max(a.seconds for a in answers)
    assert slowest <= DEADLINE + SLACK, f"slowest answer took {slowest:.3f}s"

    before = [a for a in answers if a.sent + a.seconds < killed]
    down = [a for a in answers if a.sent > killed + 0.05 and a.sent + a.seconds < restarting]
    recovered = [a for a in answers if a.sent > back + 5.0]
    assert before and down and recovered, (len(before), len(down), len(recovered))
    assert all(a.decision in ("admit", "queue") for a in before)
    for a in down:
        assert a.response is not None
        if policy == "deny":
            assert a.response["allowed"] is False
            assert a.response["status"]["message"] == REDIS_DOWN_MESSAGE
            assert a.response["auditAnnotations"]["reason"] == "redis unavailable"
        else:
            assert a.response["allowed"] is True
            assert FAIL_OPEN_WARNING in a.response.get("warnings", []), a.response
            assert a.response["auditAnnotations"]["reason"].startswith("redis unavailable")
    for a in recovered:
        assert a.decision in ("admit", "queue"), a.response
    if policy == "allow":
        log = server.log_path.read_text()
        missing = [a.uid for a in down if f'"uid":"{a.uid}"' not in log]
        assert missing == [], "fail-open admissions without an audit record"

    # The cluster holds every pod the webhook allowed; after a reconcile Redis holds
    # exactly their tickets (no reservation leaked) and their usage.
    loaded = load_config_dir(config)
    allowed = [a for a in answers if a.response is not None and a.response["allowed"]]
    pods = [cluster_pod(a, time.time() - 100 + a.sent - killed, loaded) for a in allowed]
    client = redis_server.client()
    try:
        queue = FairQueue(client)
        queue.sync_config(loaded, {"gpu": 64})
        reconcile(queue, pods)
        tickets = live_tickets(client)
        status = {s.tenant: s for s in queue.tenant_status()}["team-a"]
    finally:
        client.close()
    assert set(tickets) == {p.ticket for p in pods}
    running = sum(p.slices for p in pods if not p.gated)
    assert status.used_slices == usage_by_tenant(tickets)["team-a"][0] == running


def test_redis_restarted_empty_is_rebuilt_exactly_by_the_reconciler(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path
) -> None:
    """Fill team-a (6 running incl. 2 borrowed, 6 queued), lose Redis, reconcile from the
    cluster: usage, borrowed, queue lengths and every queued pod's position are as before,
    and the next pod waits (nothing admitted against the lost usage)."""
    config = config_dir(tmp_path)
    loaded = load_config_dir(config)
    server = serve(redis_server.url, config)
    load = Load(server, team_a_pod)
    answers = []
    with server.client() as http:
        for i in range(12):
            answers.append(load.post(http, team_a_pod(0, i)))
            time.sleep(0.01)  # distinct creation times: queue order = creation order
    assert [a.decision for a in answers] == ["admit"] * 6 + ["queue"] * 6
    pods = [cluster_pod(a, time.time() - 100 + i, loaded) for i, a in enumerate(answers)]
    client = redis_server.client()
    queue = FairQueue(client)
    for pod in pods:
        if not pod.gated:
            # the pod exists
            assert queue.confirm(pod.ticket, pod.uid, pod.ref.namespace,
                                 pod.ref.name) == "confirmed"

    def snapshot() -> tuple[Any, ...]:
        status = {s.tenant: s for s in queue.tenant_status()}["team-a"]
        positions = {p.ticket: getattr(queue.ticket_status(p.ticket, time.time()),
                                       "position", None) for p in pods}
        states = {t: (v.state, v.band) for t, v in live_tickets(client).items()}
        return (status.used, status.used_slices, status.borrowed_slices, status.queued,
                positions, states)

    # Reconciling from the same cluster changes nothing; the order is creation time.
    reconcile(queue, pods)
    before = snapshot()
    assert before[4] == {p.ticket: (None if not p.gated else i - 5)
                         for i, p in enumerate(pods)}
    client.close()

    redis_server.kill()
    redis_server.start()
    client = redis_server.client()
    queue = FairQueue(client)
    assert live_tickets(client) == {}
    queue.sync_config(loaded, {"gpu": 64})
    summary = reconcile(queue, pods)
    assert (summary.running, summary.gated, summary.skipped) == (6, 6, 0)
    assert snapshot() == before
    with server.client() as http:
        after = load.post(http, team_a_pod(1, 0))
    assert after.decision == "queue"
    client.close()


def test_no_admission_beyond_quota_between_redis_restart_and_reconcile(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path
) -> None:
    """Invariant 1 at every instant: team-a runs 6 pods (its nominal 4 + borrow 2); Redis
    restarts empty; before any reconcile, a new pod must not be admitted without a gate
    (``--wait-for-rebuild``, the default when the config comes from a cluster)."""
    config = config_dir(tmp_path)
    server = serve(redis_server.url, config, wait_for_rebuild=True)
    load = Load(server, team_a_pod)
    client = redis_server.client()
    reconcile(FairQueue(client), [])  # the dispatcher's first reconcile: an empty cluster
    client.close()
    with server.client() as http:
        full = [load.post(http, team_a_pod(0, i)) for i in range(6)]
        assert [a.decision for a in full] == ["admit"] * 6
        redis_server.kill()
        redis_server.start()
        after = load.post(http, team_a_pod(1, 0))
    # The cluster still runs 6 GPUs of team-a: a 7th must wait (or be refused).
    assert after.decision != "admit", after.response


def test_slow_redis_is_answered_within_the_deadline(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path
) -> None:
    """``DEBUG SLEEP 3`` freezes Redis: a GPU pod gets the Redis denial within the webhook's
    deadline (far under the API server's 10 s), a pod without GPUs and /validate are
    answered at once, and admissions work again after Redis wakes up."""
    server = serve(redis_server.url, config_dir(tmp_path))
    load = Load(server, team_a_pod)
    with server.client() as http:
        assert load.post(http, team_a_pod(0, 0)).decision == "admit"
        blocker = redis_server.client()
        sleeper = threading.Thread(target=blocker.execute_command, args=("DEBUG", "SLEEP", "3"))
        sleeper.start()
        time.sleep(0.2)
        slow = load.post(http, team_a_pod(0, 1))
        no_gpu = load.post(http, gpu_pod("team-a-dev", "web", limits={"memory": "1Gi"}))
        started = time.monotonic()
        validated = http.post("/validate", json=review(team_a_pod(0, 2)))
        validate_seconds = time.monotonic() - started
        sleeper.join(10)
        blocker.close()
        woke = load.post(http, team_a_pod(0, 3))
    assert slow.response is not None and slow.response["allowed"] is False
    assert slow.response["status"]["message"] == REDIS_DOWN_MESSAGE
    assert slow.seconds <= DEADLINE + SLACK
    assert no_gpu.response == {"uid": no_gpu.uid, "allowed": True}
    assert no_gpu.seconds <= SLACK
    assert validated.status_code == 200 and validate_seconds <= DEADLINE + SLACK
    assert woke.decision == "admit"
