"""A pod's declared run time (``spec.activeDeadlineSeconds``) reaches the queue through
the real ``fairgate serve`` over HTTPS, on a real redis-server: the ticket record keeps
it (its 15th field), where backfill reads it (tests/fairshare/queue/test_backfill.py)."""

from __future__ import annotations

import uuid

import redis
from test_https import mutate
from webhook_helpers import gpu_pod, review

from webhook.process import ServeProcess

NS = "team-a-dev"


def record(client: redis.Redis, ticket: str) -> list[str]:
    raw = client.hget("fairgate:tk", ticket)
    assert raw is not None, "the queue holds no record of the ticket"
    return raw.decode().split("|")


def test_the_declared_run_time_is_kept_with_the_ticket(
    server: ServeProcess, redis_client: redis.Redis,
) -> None:
    uid = str(uuid.uuid4())
    pod = gpu_pod(NS, "bounded", spec={"activeDeadlineSeconds": 1800})
    response = mutate(server, review(pod, uid=uid))
    assert response["allowed"] is True
    assert record(redis_client, uid)[14] == "1800"


def test_a_pod_without_a_deadline_declares_nothing(
    server: ServeProcess, redis_client: redis.Redis,
) -> None:
    uid = str(uuid.uuid4())
    response = mutate(server, review(gpu_pod(NS, "open-ended"), uid=uid))
    assert response["allowed"] is True
    assert len(record(redis_client, uid)) <= 14  # no F_RUN


def test_an_unusable_deadline_is_refused_saying_what_to_write(server: ServeProcess) -> None:
    pod = gpu_pod(NS, "bad", spec={"activeDeadlineSeconds": "1h"})
    response = mutate(server, review(pod))
    assert response["allowed"] is False
    assert "spec.activeDeadlineSeconds must be a whole number of seconds >= 1" in (
        response["status"]["message"])
