"""What admitted pods were priced for, per DRA object they name (note_priced.lua,
priced_for.lua), on a real redis-server: only live tickets are noted and answered, the
entries of tickets the queue no longer holds are dropped, and every key has a lifetime."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairshare.queue.calls import PRICED_LIFETIME
from fairshare.queue.fastpath import AsyncFairQueue
from fairshare.queue.model import PricedTicket
from tenants.resources import ResourceCounts
from tests.fairshare.queue.test_queue import Pods, admit_all, queue_with

CLAIM = "ns-a/c/c"
TEMPLATE = "ns-a/t/tpl"


@pytest.fixture
def pods() -> Pods:
    return Pods()


def test_a_live_ticket_is_noted_per_object_and_answered_with_its_pod(
    redis_client: redis.Redis, pods: Pods,
) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 1}})
    reserved, queued = pods("a"), pods("a")
    admit_all(q, [reserved, queued])
    assert q.note_priced(reserved.ticket, {CLAIM: {"gpu": 1}, TEMPLATE: {}}) == 2
    assert q.note_priced(queued.ticket, {CLAIM: {"gpu": 1}}) == 1
    assert sorted(q.priced_for(CLAIM), key=lambda p: p.ticket) == [
        PricedTicket("t1", {"gpu": 1}, "reserved", "ns-a", "p1"),
        PricedTicket("t2", {"gpu": 1}, "queued", "ns-a", "p2"),
    ]
    assert q.priced_for(TEMPLATE) == [PricedTicket("t1", {}, "reserved", "ns-a", "p1")]
    assert q.priced_for("ns-a/c/other") == []
    ttl = redis_client.ttl(f"fairgate:po:{CLAIM}")
    assert 0 < ttl <= PRICED_LIFETIME


def test_a_ticket_the_queue_does_not_hold_is_not_noted(
    redis_client: redis.Redis, pods: Pods,
) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 1}})
    assert q.note_priced("never-admitted", {CLAIM: {"gpu": 8}}) == 0
    assert redis_client.keys("fairgate:po:*") == []


def test_entries_of_tickets_no_longer_live_are_ignored_and_pruned(
    redis_client: redis.Redis, pods: Pods,
) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 2}})
    gone, kept = pods("a"), pods("a")
    admit_all(q, [gone, kept], now=10.0)
    q.note_priced(gone.ticket, {CLAIM: {"gpu": 1}, TEMPLATE: {"gpu": 1}})
    q.note_priced(kept.ticket, {CLAIM: {"gpu": 2}})
    assert q.expire(40.0) == ["t1", "t2"]  # neither pod was ever seen
    readmitted = pods("a")
    admit_all(q, [readmitted], now=41.0)
    assert q.priced_for(TEMPLATE) == []
    assert not redis_client.exists(f"fairgate:po:{TEMPLATE}")  # its last field went
    q.note_priced(readmitted.ticket, {CLAIM: {"gpu": 1}})  # prunes as it writes
    assert redis_client.hkeys(f"fairgate:po:{CLAIM}") == [b"t3"]


def test_the_webhook_queue_notes_and_reads_in_one_call_each(
    redis_url: str, redis_client: redis.Redis, pods: Pods,
) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 1}})
    req = pods("a")
    admit_all(q, [req])

    async def run() -> list[PricedTicket]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            fast = AsyncFairQueue(client)
            assert await fast.note_priced(req.ticket, {CLAIM: {"gpu": 1}}) == 1
            return await fast.priced_for(CLAIM)
        finally:
            await client.aclose()

    redis_client.config_resetstat()
    assert asyncio.run(run()) == [PricedTicket("t1", {"gpu": 1}, "reserved", "ns-a", "p1")]
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] == 2


OBJECTS = [f"ns-a/{kind}/{name}" for kind in "ct" for name in ("x", "y")]
STEPS = st.lists(st.one_of(
    st.tuples(st.just("admit")),
    st.tuples(st.just("note"), st.integers(0, 6),
              st.dictionaries(st.sampled_from(OBJECTS),
                              st.dictionaries(st.sampled_from(["gpu", "mig-1g.5gb"]),
                                              st.integers(0, 8), max_size=2),
                              min_size=1, max_size=3)),
    st.tuples(st.just("release"), st.integers(0, 6)),
), max_size=25)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_priced_for_answers_exactly_the_live_tickets_last_noted(
    redis_client: redis.Redis, steps: list[tuple[Any, ...]],
) -> None:
    """Random admissions, notes (of live and ended tickets) and releases: after every
    step each object answers the last note of each ticket the queue still holds."""
    redis_client.flushall()
    q = queue_with(redis_client, {"gpu": 100}, a={"nominal": {"gpu": 100}})
    pods, tickets, live = Pods(), [], set()
    noted: dict[str, dict[str, ResourceCounts]] = {key: {} for key in OBJECTS}
    for step in steps:
        if step[0] == "admit":
            req = pods("a")
            q.admit(req, 0.0)
            tickets.append(req.ticket)
            live.add(req.ticket)
        elif step[0] == "note" and tickets:
            ticket = tickets[step[1] % len(tickets)]
            assert q.note_priced(ticket, step[2]) == (len(step[2]) if ticket in live else 0)
            if ticket in live:
                for key, devices in step[2].items():
                    noted[key][ticket] = {k: v for k, v in devices.items() if v}
        elif step[0] == "release" and tickets:
            ticket = tickets[step[1] % len(tickets)]
            q.release(ticket, "any-uid")
            live.discard(ticket)
        for key in OBJECTS:
            got = {p.ticket: p.devices for p in q.priced_for(key)}
            assert got == {t: d for t, d in noted[key].items() if t in live}
        assert all(redis_client.ttl(k) > 0 for k in redis_client.keys("fairgate:po:*"))
