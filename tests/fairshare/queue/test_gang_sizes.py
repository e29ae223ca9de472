"""Gangs queued before the object declaring their size was seen, against a real
redis-server: they wait with UNKNOWN_GANG_SIZE (never released in part, whatever comes),
learn their size from a later member or from ``resize``, and a known size is never
replaced by an unknown one."""

from __future__ import annotations

import redis

from fairshare.queue.model import UNKNOWN_GANG_SIZE
from tests.fairshare.queue.test_queue import Pods, admit_all, pods, queue_with, released

__all__ = ["pods"]  # the fixture


def test_unknown_size_waits_until_resized(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 8}})
    first = admit_all(q, [pods("a", group="job.x.1", size=UNKNOWN_GANG_SIZE)
                          for _ in range(3)])
    assert all(a.outcome == "queued" for a in first)
    assert first[-1].waiting_for == ("the size of gang ns-a/job.x.1 (3 pods created; the "
                                     "object that declares it has not been seen)")
    assert released(q) == []  # three members and room for them: still nothing alone
    assert q.unsized() == ["ns-a/job.x.1"]
    assert q.resize({"ns-a/other.gang": 2}) == 0  # unknown gang ids change nothing
    assert q.resize({"ns-a/job.x.1": 3}) == 1
    assert q.unsized() == []
    assert sorted(released(q)) == ["t1", "t2", "t3"]


def test_resize_to_more_than_queued_keeps_waiting(redis_client: redis.Redis,
                                                  pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 8}})
    admit_all(q, [pods("a", group="g", size=UNKNOWN_GANG_SIZE) for _ in range(2)])
    assert q.resize({"ns-a/g": 3}) == 1
    assert released(q) == []
    last = q.admit(pods("a", group="g", size=UNKNOWN_GANG_SIZE), 0.0)  # a lagging replica
    assert last.outcome == "queued"
    assert sorted(released(q)) == ["t1", "t2", "t3"]


def test_a_later_member_with_a_known_size_completes_the_gang(redis_client: redis.Redis,
                                                             pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 8}})
    admit_all(q, [pods("a", group="g", size=UNKNOWN_GANG_SIZE)])
    q.admit(pods("a", group="g", size=2), 0.0)
    assert sorted(released(q)) == ["t1", "t2"]


def test_a_known_size_is_never_replaced_by_an_unknown_one(redis_client: redis.Redis,
                                                          pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 8}})
    admit_all(q, [pods("a", group="g", size=2)])
    q.admit(pods("a", group="g", size=UNKNOWN_GANG_SIZE), 0.0)
    assert sorted(released(q)) == ["t1", "t2"]
    assert q.resize({"ns-a/g": 5}) == 0  # a known size is not the resizer's to change


def test_why_says_the_gang_waits_for_its_size(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 8}})
    admit_all(q, [pods("a", group="job.trainer.0123456789", size=UNKNOWN_GANG_SIZE)
                  for _ in range(2)])
    status = q.ticket_status("t1", 1.0)
    assert status is not None and status.state == "gang-waiting"
    assert status.waiting_for == ("the size of gang ns-a/job.trainer.0123456789 (2 pods "
                                  "created; the object that declares it has not been seen)")
