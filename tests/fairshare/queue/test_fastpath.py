"""AsyncFairQueue (the webhook's asyncio face of the queue) against a real redis-server:
it answers exactly as FairQueue does for the same requests, and raises the same errors."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal

import pytest
import redis
import redis.asyncio
from test_queue import Pods, config

from fairshare.queue.calls import TicketConflictError, UnknownTenantError
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.fastpath import AsyncFairQueue, NotReplicatedError
from fairshare.queue.model import Admission, InvalidRequestError, PodRequest

TENANTS = config(
    a={"nominal": {"gpu": 3}, "borrow": 1, "reserve": 1, "weight": 2},
    b={"nominal": {"gpu": 1, "mig-1g.5gb": 2}},
)
CAPACITY = {"gpu": 6, "mig-1g.5gb": 4}


@pytest.fixture
def pods() -> Pods:
    return Pods()


def _requests(pods: Pods) -> list[PodRequest]:
    return [
        *(pods("a") for _ in range(5)),
        pods("a", "inference"),
        pods("b", demand={"mig-1g.5gb": 1}),
        pods("b", demand={"mig-1g.5gb": 2}),
        pods("b", group="g1", size=2),
        pods("b", group="g1", size=2),
        pods("b", "inference", demand={"gpu": 2}),
    ]


def test_answers_as_the_sync_queue_does(redis_url: str, redis_client: redis.Redis,
                                        pods: Pods) -> None:
    requests = _requests(pods)
    sync_queue = FairQueue(redis_client, prefix="sync:")
    sync_queue.sync_config(TENANTS, CAPACITY)
    expected = [sync_queue.admit(r, 10.0) for r in requests]
    expected += [sync_queue.admit(requests[0], 11.0)]  # the same admission again

    async def run() -> tuple[list[Admission], list[tuple[str, int]]]:
        client = redis.asyncio.Redis.from_url(redis_url)
        queue = AsyncFairQueue(client, prefix="async:")
        await queue.sync_config(TENANTS, CAPACITY)
        got = [await queue.admit(r, 10.0) for r in requests]
        got.append(await queue.admit(requests[0], 11.0))
        status = [(t.tenant, t.used_slices) for t in await queue.tenant_status()]
        await client.aclose()
        return got, status

    got, status = asyncio.run(run())
    assert got == expected
    assert {a.outcome for a in got} == {"reserved", "queued"}  # both paths were taken
    assert got[-1].duplicate
    assert status == [(t.tenant, t.used_slices) for t in sync_queue.tenant_status()]


def test_raises_the_queue_errors(redis_url: str, pods: Pods) -> None:
    async def run() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        queue = AsyncFairQueue(client)
        with pytest.raises(UnknownTenantError) as unknown:
            await queue.admit(pods("a"), 1.0)
        assert unknown.value.tenant == "a"
        await queue.sync_config(TENANTS, CAPACITY)
        first = pods("a")
        await queue.admit(first, 1.0)
        copied = dataclasses.replace(first, name="other-pod")
        with pytest.raises(TicketConflictError) as conflict:
            await queue.admit(copied, 2.0)
        assert (conflict.value.namespace, conflict.value.name) == (first.namespace, first.name)
        await queue.admit(pods("b", group="g2", size=2), 3.0)
        with pytest.raises(InvalidRequestError, match="mixes classes"):
            await queue.admit(pods("b", "inference", group="g2", size=2), 3.0)
        await client.aclose()

    asyncio.run(run())


# -- acknowledged means replicated (WAIT) ------------------------------------------------


def _admit(url: str, request: PodRequest, replicas: int, dry_run: bool = False,
           replica_timeout: float = 0.2) -> Admission:
    async def run() -> Admission:
        client = redis.asyncio.Redis.from_url(url)
        try:
            queue = AsyncFairQueue(client, replicas=replicas, replica_timeout=replica_timeout)
            await queue.sync_config(TENANTS, CAPACITY)
            return await queue.admit(request, 10.0, dry_run=dry_run)
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_an_admission_is_answered_once_a_replica_holds_it(
    primary_and_replica: tuple[str, redis.Redis], pods: Pods
) -> None:
    primary, replica = primary_and_replica
    request = pods("a")
    # The replica also compiles the function library the first admission loads: on a busy
    # machine that may take longer than the 0.2 s the refusing tests wait.
    assert _admit(primary, request, replicas=1, replica_timeout=5.0).outcome == "reserved"
    # WAIT returned on the admitting connection: the replica has the ticket already.
    assert replica.hexists("fairgate:tk", request.ticket)


def test_a_replica_that_does_not_acknowledge_makes_the_admission_unacknowledged(
    primary_and_replica: tuple[str, redis.Redis], pods: Pods
) -> None:
    primary, replica = primary_and_replica
    pid = int(replica.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)  # linked, but acknowledges nothing
    try:
        with pytest.raises(NotReplicatedError, match="0 of 1 replicas"):
            _admit(primary, pods("a"), replicas=1)
        # A dry run writes nothing, so it waits for nothing; without replicas asked, no WAIT.
        assert _admit(primary, pods("a"), replicas=1, dry_run=True).outcome == "reserved"
        assert _admit(primary, pods("a"), replicas=0).outcome == "reserved"
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_primary_refusing_writes_for_lack_of_replicas_is_not_replicated(
    redis_url: str, redis_client: redis.Redis, pods: Pods
) -> None:
    redis_client.config_set("min-replicas-to-write", 1)
    try:
        with pytest.raises(NotReplicatedError, match="NOREPLICAS"):
            _admit(redis_url, pods("a"), replicas=1)
    finally:
        redis_client.config_set("min-replicas-to-write", 0)
