"""Concurrency and fairness of the fair queue against a real redis-server: racing
webhooks, two dispatchers over one queue, weighted shares of a backlogged cluster."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, PodRequest
from tests.fairshare.queue.test_queue import config, dump_all
from tests.fairshare.tickets import pod_uid

THREADS = 32


def race(url: str, work: Callable[[FairQueue, int], Admission], count: int) -> list[Admission]:
    """Run ``work(queue, i)`` for i in range(count) on THREADS threads, each with its own
    connection and FairQueue, all released at once by a barrier."""
    barrier = threading.Barrier(THREADS)
    local = threading.local()

    def run(i: int) -> Admission:
        if not hasattr(local, "queue"):
            local.queue = FairQueue(redis.Redis.from_url(url))
            barrier.wait()
        queue: FairQueue = local.queue
        return work(queue, i)

    with ThreadPoolExecutor(THREADS) as pool:
        # the first THREADS tasks meet at the barrier, one per thread
        return list(pool.map(run, range(count)))


def request(i: int, ticket: str | None = None) -> PodRequest:
    return PodRequest(ticket or f"r{i}", "a", "ns-a", f"p{i}", "training", {"gpu": 1},
                      submitted_at=float(i))


@pytest.fixture
def tenant_a(redis_client: redis.Redis) -> FairQueue:
    queue = FairQueue(redis_client)
    queue.sync_config(config(a={"nominal": {"gpu": 4}, "borrow": 2}), {"gpu": 100})
    return queue


@pytest.mark.slow
def test_racing_admissions_never_exceed_nominal_plus_borrow(
        redis_url: str, tenant_a: FairQueue) -> None:
    answers = race(redis_url, lambda q, i: q.admit(request(i), float(i)), 4 * THREADS)
    reserved = Counter(a.band for a in answers if a.outcome == "reserved")
    assert reserved == {"training": 4, "borrowed": 2}
    (status,) = tenant_a.tenant_status()
    assert status.used == {"gpu": 4} and status.borrowed_slices == 14
    assert status.queued["training"] == 4 * THREADS - 6


@pytest.mark.slow
def test_racing_duplicates_reserve_once(redis_url: str, tenant_a: FairQueue) -> None:
    # the API server retrying/reinvoking the webhook for one pod CREATE: identical requests
    answers = race(redis_url, lambda q, i: q.admit(request(0, "same"), 1.0), 2 * THREADS)
    assert [a.duplicate for a in answers].count(False) == 1
    assert {(a.outcome, a.band) for a in answers} == {("reserved", "training")}
    (status,) = tenant_a.tenant_status()
    assert status.used == {"gpu": 1}


@pytest.mark.slow
def test_racing_dry_runs_reserve_nothing(redis_url: str, redis_client: redis.Redis,
                                         tenant_a: FairQueue) -> None:
    before = dump_all(redis_client)
    answers = race(redis_url, lambda q, i: q.admit(request(i), 1.0, dry_run=True), 2 * THREADS)
    assert {a.outcome for a in answers} == {"reserved"}
    assert dump_all(redis_client) == before


@pytest.mark.slow
def test_two_dispatchers_release_each_ticket_exactly_once(redis_url: str,
                                                          redis_client: redis.Redis) -> None:
    setup = FairQueue(redis_client)
    setup.sync_config(config(a={"nominal": {"gpu": 50}, "weight": 1},
                             b={"nominal": {"gpu": 50}, "weight": 2}), {"gpu": 6})
    queued: list[str] = []
    started: list[str] = []
    for i in range(300):
        tenant = "ab"[i % 2]
        req = PodRequest(f"q{i}", tenant, f"ns-{tenant}", f"p{i}", "training",
                         {"gpu": 1 + i % 3}, submitted_at=float(i))
        answer = setup.admit(req, float(i))
        (queued if answer.outcome == "queued" else started).append(req.ticket)
    for ticket in started:  # the fast-path pods end
        setup.release(ticket, pod_uid(ticket))
    assert len(queued) > 250
    seen: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def dispatcher(seed: int) -> None:
        queue = FairQueue(redis.Redis.from_url(redis_url))
        rng = random.Random(seed)
        barrier.wait()
        while any(s.queued["training"] for s in queue.tenant_status()):
            got = [r.ticket for r in queue.dispatch(1000.0, rng.choice([1, 2, 5]))]
            with lock:
                seen.extend(got)
            for ticket in got:  # the pods run and end
                queue.release(ticket, pod_uid(ticket))

    threads = [threading.Thread(target=dispatcher, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(seen).most_common(1)[0][1] == 1
    assert sorted(seen) == sorted(queued)
    assert all(s.used_slices == 0 for s in setup.tenant_status())


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


@pytest.mark.slow
def test_backlogged_tenants_share_by_weight(redis_client: redis.Redis) -> None:
    weights = {"w1": 1, "w2": 2, "w3": 3, "w4": 4}
    queue = FairQueue(redis_client)
    queue.sync_config(
        config(**{t: {"weight": w, "nominal": {"gpu": 40}} for t, w in weights.items()}),
        {"gpu": 20},
    )
    n = 0
    for _round in range(60):
        for tenant in (t for t, w in weights.items() for _ in range(w)):
            n += 1
            queue.admit(PodRequest(f"j{n}", tenant, f"ns-{tenant}", f"p{n}", "training",
                                   {"gpu": 1}, submitted_at=float(n)), float(n))
    rng = random.Random(7)
    running = [s for s in (queue.ticket_status(f"j{i}", 0.0) for i in range(1, n + 1))
               if s is not None and s.state != "queued"]
    active = [s.ticket for s in running]
    totals = Counter[str]()
    for step in range(120):
        for ticket in rng.sample(active, 3):  # three pods finish (now, as the dispatcher says)
            queue.release(ticket, pod_uid(ticket), 2000.0 + step)
            active.remove(ticket)
        active += [r.ticket for r in queue.dispatch(2000.0 + step, 100)]
        for status in queue.tenant_status():
            totals[status.tenant] += status.used_slices
    assert all(s.queued["training"] > 0 for s in queue.tenant_status())  # still backlogged
    index = jain([totals[t] / w for t, w in weights.items()])
    assert index >= 0.99, (index, totals)
