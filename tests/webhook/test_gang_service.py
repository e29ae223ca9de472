"""The webhook with a gang source: plans read gang sizes from the watch, and gangs queued
before their size object was seen get their size once it is (a real redis-server; the
GangWatch fed as its watch threads feed it)."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from pathlib import Path

import redis
from kubernetes import client as kube
from webhook_helpers import review, write_config

from admission.gangs import gang_key
from audit import AuditLog
from fairshare.cluster.gangs import GangWatch
from fairshare.connection import connect_redis, connect_redis_async
from fairshare.queue.fairqueue import FairQueue
from tenants.source import LocalDirSource
from webhook.service import AdmissionService, Progress

sys.path.insert(0, str(Path(__file__).parents[1] / "admission"))
from gang_pods import JOB_UID, indexed_job_pod, job

NS = "team-a-dev"


def named(i: int) -> dict[str, object]:
    pod = indexed_job_pod("trainer", i, namespace=NS)
    pod["metadata"].pop("generateName")
    pod["metadata"]["name"] = f"trainer-{i}"
    return pod


def test_a_gang_queued_before_its_job_was_seen_gets_its_size(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis,
) -> None:
    source = LocalDirSource(write_config(tmp_path / "config"))
    source.start()
    sync = connect_redis(redis_url)
    watch = GangWatch(kube.ApiClient(kube.Configuration()))
    service = AdmissionService(source, connect_redis_async(redis_url),
                               AuditLog(sync, out=io.StringIO()), gangs=watch)
    service.start()
    gid = f"{NS}/{gang_key('job', 'trainer', JOB_UID)}"

    async def scenario() -> tuple[list[str], list[str], int, int, list[str]]:
        reasons = []
        for i in range(2):  # both pods arrive before the watch has seen their Job
            body = json.dumps(review(named(i))).encode()
            answer = (await service.review("mutate", body, Progress(time.perf_counter()))
                      ).to_json()["response"]
            reasons.append(answer["auditAnnotations"]["reason"])
        waiting = await service.queue.unsized()
        nothing = await service.size_gangs()  # the Job is still unseen
        watch.on_list("jobs", [job("trainer", 2, 2, namespace=NS)])
        sized = await service.size_gangs()
        return reasons, waiting, nothing, sized, await service.queue.unsized()

    try:
        reasons, waiting, nothing, sized, left = asyncio.run(scenario())
    finally:
        service.stop()
        sync.close()
    # the audit names the gang, where it comes from and what its size waits for
    assert reasons == [
        f"waiting for the size of gang of Indexed Job trainer ({n} created; known once Job "
        "trainer is seen)" for n in ("1 pod", "2 pods")]
    assert (waiting, nothing, sized, left) == ([gid], 0, 1, [])
    # the gang is whole now: one queue entry, released together
    released = FairQueue(redis_client).dispatch(time.time(), 10)
    assert sorted(r.name for r in released) == ["trainer-0", "trainer-1"]


def test_a_pod_whose_job_was_seen_is_sized_at_once(
    tmp_path: Path, redis_url: str,
) -> None:
    source = LocalDirSource(write_config(tmp_path / "config"))
    source.start()
    sync = connect_redis(redis_url)
    watch = GangWatch(kube.ApiClient(kube.Configuration()))
    watch.on_list("jobs", [job("trainer", 3, 3, namespace=NS)])
    service = AdmissionService(source, connect_redis_async(redis_url),
                               AuditLog(sync, out=io.StringIO()), gangs=watch)
    service.start()

    async def one() -> dict[str, str]:
        body = json.dumps(review(named(0))).encode()
        answer = await service.review("mutate", body, Progress(time.perf_counter()))
        reason: dict[str, str] = answer.to_json()["response"]["auditAnnotations"]
        return reason

    try:
        audit = asyncio.run(one())
    finally:
        service.stop()
        sync.close()
    assert audit["decision"] == "queue"
    assert audit["reason"] == ("waiting for 2 more pods of gang of Indexed Job trainer (1 of 3 "
                               "pods created)")
