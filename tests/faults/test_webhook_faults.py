"""Webhook replica faults and a concurrency storm, against real processes on loopback.

- A replica is SIGKILLed while clients are mid-request; another replica serves on the same
  Redis. A request retried with the same uid reserves once; a reservation whose answer
  was lost (the pod was never created) is freed by ``FairQueue.expire`` after the TTL.
- Concurrency storm: 64 clients post pods of 8 tenants over HTTPS while a dispatcher-like
  thread releases and dispatches; a monitor reads every ticket in Redis atomically, again
  and again, and checks each tenant's quota against the sum of its live tickets.
  ``FAIRGATE_STORM_ADMISSIONS`` sets the size (CI default 1,000; the full run is
  ``FAIRGATE_STORM_ADMISSIONS=5000 python -m pytest tests/faults -k storm``).
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fault_kit import (
    Answer,
    Load,
    RedisServer,
    ServeFactory,
    Ticket,
    live_tickets,
    usage_by_tenant,
    write_config_dir,
)
from webhook_helpers import gpu_pod, review

from fairshare.queue.fairqueue import FairQueue
from tenants.resources import parse_counts
from tests.fairshare.tickets import pod_uid

pytestmark = pytest.mark.slow

ROOMY_PLATFORM = """\
platformAdmins: {groups: [platform-team]}
capacity: {gpu: 100000}
tenants:
  team-a: {weight: 1, ceiling: {gpuEquivalents: 100000}}
onRedisUnavailable: deny
"""


def test_replica_killed_mid_request_reserves_once_and_strands_nothing(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path
) -> None:
    config = write_config_dir(tmp_path / "config", ROOMY_PLATFORM,
                              {"team-a": "nominal: {gpu: 100000}\n"}, {"team-a-dev": "team-a"})
    doomed = serve(redis_server.url, config)
    survivor = serve(redis_server.url, config)
    with Load(doomed, lambda c, i: gpu_pod("team-a-dev", f"a-{c}-{i}"), clients=16,
              timeout=5.0) as load:
        time.sleep(1.5)
        assert doomed.process is not None
        doomed.process.kill()
        doomed.process.wait()
    lost = [a for a in load.answers if a.status != 200]
    answered = [a for a in load.answers if a.status == 200]
    assert lost, "the replica died between requests: no request was cut off"
    assert all(a.status == 0 for a in lost)  # cut off, never a 5xx
    assert all(a.decision == "admit" for a in answered)

    client = redis_server.client()
    queue = FairQueue(client)
    # The API server retries a cut-off call with the same uid on the other replica:
    # the reservation (if the dead replica made it) is reused, never doubled.
    retried = lost[: len(lost) // 2]
    stranded = lost[len(lost) // 2:]  # never retried: their pods are never created
    with survivor.client() as http:
        for answer in retried:
            again = http.post("/mutate", json=review(answer.pod, uid=answer.uid))
            assert again.status_code == 200
            assert again.json()["response"]["auditAnnotations"]["decision"] == "admit"
    tickets = live_tickets(client)
    for answer in retried:
        assert answer.uid in tickets
    assert len(tickets) == len(answered) + len(retried) + sum(
        a.uid in tickets for a in stranded)
    # Each of these tickets holds exactly one GPU: none was reserved twice.
    assert usage_by_tenant(tickets)["team-a"][0] == 7 * len(tickets)

    # The pods that were created (answered or retried) are confirmed by the dispatcher;
    # after the TTL every other reservation is freed.
    created = {a.uid for a in answered} | {a.uid for a in retried}
    for answer in answered + retried:
        meta = answer.pod["metadata"]
        assert queue.confirm(answer.uid, pod_uid(answer.uid), meta["namespace"],
                             meta["name"]) == "confirmed"
    expired = queue.expire(time.time() + queue.reservation_ttl + 1)
    assert set(expired) == {a.uid for a in stranded if a.uid in tickets}
    after = live_tickets(client)
    assert set(after) == created
    status = {s.tenant: s for s in queue.tenant_status()}["team-a"]
    assert status.used_slices == 7 * len(created)
    client.close()


# -- concurrency storm ------------------------------------------------------------------

TENANTS = [f"t{i}" for i in range(8)]
# tenant -> (nominal GPUs, borrow GPU-eq, inference reserve GPU-eq)
LIMITS = {t: (1 + i % 4, i % 3, 1 if i % 2 else 0) for i, t in enumerate(TENANTS)}
CAPACITY_GPUS = 20  # less than the sum of nominal + borrow: capacity binds too


def _storm_config(directory: Path) -> Path:
    tenants = "".join(f"  {t}: {{weight: {1 + i % 3}, ceiling: {{gpuEquivalents: 8}}}}\n"
                      for i, t in enumerate(TENANTS))
    platform = ("platformAdmins: {groups: [platform-team]}\n"
                f"capacity: {{gpu: {CAPACITY_GPUS}, mig-1g.5gb: 14}}\n"
                f"tenants:\n{tenants}onRedisUnavailable: deny\n")
    quotas = {t: f"nominal: {{gpu: {n}, mig-1g.5gb: 7}}\nborrowLimit: {{gpuEquivalents: {b}}}\n"
                 f"inferenceReserve: {{gpuEquivalents: {r}}}\ndefaultClass: training\n"
              for t, (n, b, r) in LIMITS.items()}
    return write_config_dir(directory, platform, quotas, {f"{t}-dev": t for t in TENANTS})


def _violations(tickets: dict[str, Ticket]) -> list[str]:
    """Quota breaches in one atomic snapshot of the live tickets (invariant 1 and the
    queue's rules: per resource, non-borrowed <= nominal; training <= nominal minus the
    inference reserve; training + borrowed <= nominal minus the reserve plus the borrow
    limit; everything <= nominal + borrow limit; inference <= cluster capacity). A
    borrowed pod may stand in nominal room training leaves unused, so the borrowed band
    alone may hold more than the borrow limit; the tenant's total never does."""
    problems = []
    held: dict[tuple[str, str, str], int] = {}  # (tenant, band, resource) -> count
    for ticket in tickets.values():
        if ticket.holds_quota:
            for resource, count in parse_counts(ticket.demand).items():
                key = (ticket.tenant, ticket.band, resource)
                held[key] = held.get(key, 0) + count
    for tenant, (nominal, borrow, reserve) in LIMITS.items():
        for resource, limit in (("gpu", nominal), ("mig-1g.5gb", 7)):
            own = sum(held.get((tenant, band, resource), 0) for band in "it")
            if own > limit:
                problems.append(f"{tenant}: {own} x {resource} > nominal {limit}")
        slices = usage_by_tenant({k: v for k, v in tickets.items() if v.tenant == tenant})
        borrowed = slices.get(tenant, (0, 0))[1]
        training = sum(t.slices for t in tickets.values()
                       if t.tenant == tenant and t.holds_quota and t.band == "t")
        if training > 7 * nominal + 7 - 7 * reserve:
            problems.append(f"{tenant}: {training} training slices eat the inference reserve")
        nominal_slices = 7 * nominal + 7
        if training + borrowed > nominal_slices - 7 * reserve + 7 * borrow:
            problems.append(f"{tenant}: {training} training + {borrowed} borrowed slices > "
                            f"nominal - reserve + borrow limit")
        total = sum(t.slices for t in tickets.values() if t.tenant == tenant and t.holds_quota)
        if total > nominal_slices + 7 * borrow:
            problems.append(f"{tenant}: {total} slices > nominal + borrow limit "
                            f"{nominal_slices + 7 * borrow}")
    inference = sum(n for (_, band, res), n in held.items() if band == "i" and res == "gpu")
    if inference > CAPACITY_GPUS:
        problems.append(f"cluster: {inference} inference GPUs > capacity {CAPACITY_GPUS}")
    return problems


def _storm_pod(rng: random.Random, n: int) -> dict[str, Any]:
    tenant = rng.choice(TENANTS)
    kind = rng.random()
    limits = ({"nvidia.com/gpu": str(rng.choice([1, 1, 2]))} if kind < 0.7
              else {"nvidia.com/mig-1g.5gb": str(rng.choice([1, 2]))})
    labels = {"fairgate.io/class": "inference"} if rng.random() < 0.3 else None
    return gpu_pod(f"{tenant}-dev", f"s-{n}", limits=limits, labels=labels)


def test_concurrency_storm_never_exceeds_any_quota(
    redis_server: RedisServer, serve: ServeFactory, tmp_path: Path
) -> None:
    total = int(os.environ.get("FAIRGATE_STORM_ADMISSIONS", "1000"))
    server = serve(redis_server.url, _storm_config(tmp_path / "config"))
    stop = threading.Event()
    snapshots: list[int] = [0]
    problems: list[str] = []

    def monitor() -> None:
        client = redis_server.client()
        while not stop.is_set():
            found = _violations(live_tickets(client))
            snapshots[0] += 1
            if found:
                problems.extend(found)
                break
        client.close()

    def churn() -> None:
        """The dispatcher's part: pods end (release) and queued pods are released."""
        rng = random.Random(7)
        client = redis.Redis.from_url(redis_server.url)
        queue = FairQueue(client)
        while not stop.is_set():
            held = [k for k, v in live_tickets(client).items() if v.holds_quota]
            for ticket in rng.sample(held, min(len(held), 3)):
                queue.release(ticket, pod_uid(ticket))
            queue.dispatch(time.time(), limit=4)
            time.sleep(0.01)
        client.close()

    threads = [threading.Thread(target=monitor), threading.Thread(target=churn)]
    for thread in threads:
        thread.start()
    rng = random.Random(2026)
    pods = [_storm_pod(rng, n) for n in range(total)]
    load = Load(server, lambda c, i: {}, clients=64)
    local = threading.local()
    opened: list[httpx.Client] = []

    def admit(pod: dict[str, Any]) -> Answer:
        if not hasattr(local, "http"):
            local.http = server.client(timeout=30)
            opened.append(local.http)
        return load.post(local.http, pod)

    try:
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(admit, pods))
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for http in opened:
            http.close()
    assert problems == [], problems
    assert snapshots[0] > 10
    assert [a for a in answers if a.status != 200] == []
    decisions = {d: sum(a.decision == d for a in answers) for d in ("admit", "queue")}
    assert decisions["admit"] > 0 and decisions["queue"] > 0, decisions
    # The only refusals: pods larger than their tenant's nominal + borrow limit.
    others = [a.response for a in answers if a.decision not in decisions]
    assert all(r is not None and r["auditAnnotations"]["reason"] == "never-fits"
               for r in others), others[:3]
    client = redis_server.client()
    final = live_tickets(client)
    assert _violations(final) == []
    status = {s.tenant: s for s in FairQueue(client).tenant_status()}
    for tenant, (used, borrowed) in usage_by_tenant(final).items():
        assert (status[tenant].used_slices, status[tenant].borrowed_slices) == (used, borrowed)
    client.close()
