"""Audit retention by age and count (``--audit-retention``) on a real redis-server: what
is trimmed, that the rest verifies from the first record kept, and that a deletion is
still caught after retention moved on."""

from __future__ import annotations

import io
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest
import redis

from audit.chain import AuditRecord
from audit.log import DEFAULT_RETENTION, MAX_AGE, MAXLEN, STREAM, AuditLog, Retention

pytestmark = pytest.mark.timeout(120)

AGE = timedelta(seconds=2)
PAST_AGE = 2.5  # seconds to sleep so that every record written before is older than AGE


def _drafts(n: int, start: int = 0) -> list[AuditRecord]:
    return [AuditRecord("admit", uid=f"u{i}", tenant="team-a", demand="gpu=1")
            for i in range(start, start + n)]


def _ids(client: redis.Redis) -> list[bytes]:
    return [entry_id for entry_id, _ in cast(list[tuple[bytes, object]], client.xrange(STREAM))]


def _floor(client: redis.Redis) -> int:
    return int(cast(bytes, client.hget(STREAM + ":head", "floor")))


def _verdict(log: AuditLog) -> tuple[bool, int | None, str]:
    result, _ = log.verify()
    scan = log.scan()
    for _body in scan:
        pass
    assert scan.result is not None and scan.result.ok == result.ok, (scan.result, result)
    return result.ok, result.first_seq if result.ok else result.first_bad, result.problem


def test_records_older_than_the_age_are_trimmed_and_the_rest_verifies(
        redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO(), max_age=AGE)
    log.record_many(_drafts(20))
    assert redis_client.xlen(STREAM) == 20  # none old yet
    time.sleep(PAST_AGE)
    log.record_many(_drafts(5, start=20))
    assert redis_client.xlen(STREAM) == 5 and _floor(redis_client) == 21
    assert _verdict(log) == (True, 21, "")
    redis_client.xdel(STREAM, _ids(redis_client)[0])  # the oldest kept: not retention's
    ok, first_bad, problem = _verdict(log)
    assert not ok and first_bad == 21 and "retention only removes records below seq 21" in problem


def test_a_record_deleted_before_the_age_trim_is_still_caught_after_it(
        redis_client: redis.Redis) -> None:
    """The floor moves up by the count the age trim removed, not to the first record left:
    a record deleted by hand does not vanish into retention."""
    log = AuditLog(redis_client, out=io.StringIO(), max_age=AGE)
    log.record_many(_drafts(20))
    redis_client.xdel(STREAM, _ids(redis_client)[9])
    time.sleep(PAST_AGE)
    log.record_many(_drafts(5, start=20))
    assert redis_client.xlen(STREAM) == 5
    ok, first_bad, problem = _verdict(log)
    assert not ok and first_bad == 20 and "missing" in problem


def test_age_and_count_together_keep_whichever_is_fewer(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO(), maxlen=3, max_age=AGE)
    log.record_many(_drafts(10))
    assert redis_client.xlen(STREAM) == 3 and _floor(redis_client) == 8
    assert _verdict(log) == (True, 8, "")
    time.sleep(PAST_AGE)
    log.record("deny", uid="late")
    assert redis_client.xlen(STREAM) == 1 and _floor(redis_client) == 11
    assert _verdict(log) == (True, 11, "")


def test_no_age_limit_keeps_old_records(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO(), max_age=None)
    log.record_many(_drafts(3))
    time.sleep(PAST_AGE)
    log.record_many(_drafts(2, start=3))
    assert redis_client.xlen(STREAM) == 5 and _verdict(log) == (True, 1, "")


@pytest.mark.parametrize(("text", "expected"), [
    ("45d", Retention(MAXLEN, timedelta(days=45))),
    ("2000000", Retention(2_000_000, MAX_AGE)),
    ("1000000", Retention(1_000_000, MAX_AGE)),
    ("12h, 500", Retention(500, timedelta(hours=12))),
    ("500,2w", Retention(500, timedelta(weeks=2))),
    ("none", Retention(MAXLEN, None)),
    ("90S", Retention(MAXLEN, timedelta(seconds=90))),
])
def test_the_retention_flag_is_read(text: str, expected: Retention) -> None:
    assert Retention.parse(text) == expected


@pytest.mark.parametrize("text", ["", "0", "0d", "-5", "45x", "1.5d", "45d,45d", "5,6",
                                  "none,3d", "d", "45 d", "١٢"])
def test_a_bad_retention_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match=r"give an age \(45d, 12h, 2w\), a record count"):
        Retention.parse(text)


def test_the_default_keeps_a_month_and_more() -> None:
    assert DEFAULT_RETENTION.max_age is not None
    assert DEFAULT_RETENTION.max_age >= timedelta(days=31 + 14)
    assert DEFAULT_RETENTION.max_records >= 1_000_000
    with pytest.raises(ValueError, match="max_age must be at least 1 ms"):
        AuditLog(None, max_age=timedelta(0))


def test_the_default_fits_the_shipped_redis_memory_limit() -> None:
    """At the up to ~630 bytes a record measured in Redis (BENCHMARKS.md), a full default
    stream takes at most 60% of manifests/redis.yaml's memory limit (the queue and an
    AOF rewrite need the rest)."""
    manifest = (Path(__file__).resolve().parents[2] / "manifests" / "redis.yaml").read_text()
    limit = re.search(r"limits:\s*\n\s*cpu: \S+\s*\n\s*memory: (\d+)Gi", manifest)
    assert limit is not None, "manifests/redis.yaml states no memory limit in Gi"
    assert DEFAULT_RETENTION.max_records * 630 <= 0.6 * int(limit.group(1)) * 2**30
