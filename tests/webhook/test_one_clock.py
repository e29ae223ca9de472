"""Every record of one pod is on one clock: the webhook's queue record, the time the
queue holds for it and the dispatcher's records. In a normal run that clock is the wall
clock for both processes; given another clock (``fairgate demo``'s virtual time), the
webhook's audit records follow it too, not the wall clock."""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import redis
from webhook_helpers import gpu_pod, review, write_config

from audit import QUEUE, AuditLog
from audit.chain import parse_time
from fairshare.connection import connect_redis, connect_redis_async
from fairshare.dispatcher import Dispatcher
from fairshare.queue.fairqueue import FairQueue
from tenants.source import LocalDirSource
from webhook.service import AdmissionService, Progress


def _queued_pod(tmp_path: Path, redis_url: str, client: redis.Redis,
                clock: Callable[[], float] | None) -> tuple[float, float]:
    """Queue a pod through the webhook (``clock``: None for its default); the audit
    record's time and the queue's submitted time of it, in epoch seconds."""
    source = LocalDirSource(write_config(tmp_path / "config"))
    source.start()
    sync = connect_redis(redis_url)
    audit = AuditLog(sync, out=io.StringIO())
    kwargs = {} if clock is None else {"clock": clock}
    service = AdmissionService(source, connect_redis_async(redis_url), audit, **kwargs)
    service.start()

    async def two() -> None:  # team-b's nominal is 1 GPU: the second pod is queued
        for name in ("first", "second"):
            body = json.dumps(review(gpu_pod("team-b-dev", name))).encode()
            await service.review("mutate", body, Progress(time.perf_counter()))

    try:
        asyncio.run(two())
    finally:
        service.stop()
    records = [e.record for e in audit.entries()
               if e.record is not None and e.record.decision == QUEUE]
    sync.close()
    (record,) = records
    queue = FairQueue(client)
    ticket = queue.find("team-b-dev", "second")
    assert ticket is not None
    status = queue.ticket_status(ticket, time.time())
    assert status is not None
    return parse_time(record.time).timestamp(), status.submitted_at


def test_a_normal_run_records_on_the_wall_clock_in_every_process(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    for process in (AdmissionService.__init__, Dispatcher.__init__):
        assert inspect.signature(process).parameters["clock"].default is time.time
    before = time.time()
    recorded, submitted = _queued_pod(tmp_path, redis_url, redis_client, None)
    after = time.time()
    assert before - 0.001 <= submitted <= recorded + 0.001 <= after + 0.002
    assert recorded - submitted < 1.0


def test_another_clock_times_the_webhooks_records_too(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    virtual = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC).timestamp()
    recorded, submitted = _queued_pod(tmp_path, redis_url, redis_client, lambda: virtual)
    assert recorded == submitted == virtual
