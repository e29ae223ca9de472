"""`fairgate audit tail|query|verify` as functions, against a real redis-server."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis

from audit import commands
from audit.chain import format_time
from audit.log import STREAM, AuditLog
from audit.query import AuditFilter, parse_when


def _fill(client: redis.Redis) -> AuditLog:
    log = AuditLog(client, out=io.StringIO())
    old = format_time(datetime.now(UTC) - timedelta(hours=3))
    log.record("admit", time=old, user="alice", tenant="team-a", namespace="a", name="p1",
               pod_class="training", demand="gpu=1")
    log.record("deny", user="bob", tenant="team-b", namespace="b", name="p2",
               reason="namespace has no fairgate.io/tenant label")
    log.record("queue", user="alice", tenant="team-a", namespace="a", name="p3",
               pod_class="inference", demand="mig-1g.5gb=2")
    return log


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_query_filters_as_json(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    out = io.StringIO()
    assert commands.query(redis_client, out, tenant="team-a", as_json=True) == 0
    assert [r["name"] for r in _json_lines(out.getvalue())] == ["p1", "p3"]
    out = io.StringIO()
    commands.query(redis_client, out, user="alice", decision="queue", as_json=True)
    assert [r["name"] for r in _json_lines(out.getvalue())] == ["p3"]
    out = io.StringIO()
    commands.query(redis_client, out, since="1h", as_json=True)
    assert [r["name"] for r in _json_lines(out.getvalue())] == ["p2", "p3"]
    out = io.StringIO()
    commands.query(redis_client, out, until="2h", as_json=True)
    assert [r["name"] for r in _json_lines(out.getvalue())] == ["p1"]


def test_query_table(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    out = io.StringIO()
    assert commands.query(redis_client, out, tenant="team-b") == 0
    text = out.getvalue()
    assert "1 audit records" in text and "b/p2" in text and "deny" in text
    assert "team-a" not in text


def test_query_bad_time_exits_2_with_help(redis_client: redis.Redis) -> None:
    err = io.StringIO()
    assert commands.query(redis_client, io.StringIO(), since="yesterday", err=err) == 2
    assert "RFC 3339" in err.getvalue() and "15m" in err.getvalue()


def test_parse_when_forms() -> None:
    now = datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_when("15m", now) == now - timedelta(minutes=15)
    assert parse_when("2026-01-30", now) == datetime(2026, 1, 30, tzinfo=UTC)
    assert parse_when("2026-01-30T10:00:00+02:00", now) == datetime(2026, 1, 30, 8, tzinfo=UTC)
    window = AuditFilter(since=now - timedelta(hours=1), until=now)
    assert int(window.stream_start()) == int((now - timedelta(minutes=65)).timestamp() * 1000)
    assert AuditFilter(until=now).stream_start() == "-"


def test_verify_ok_and_broken(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    out = io.StringIO()
    assert commands.verify(redis_client, out) == 0
    assert out.getvalue().startswith("OK: 3 records verified (seq 1 to 3)")
    middle = redis_client.xrange(STREAM)[1][0].decode()
    redis_client.xdel(STREAM, middle)
    out = io.StringIO()
    assert commands.verify(redis_client, out) == 1
    assert out.getvalue().startswith("BROKEN at seq 2")


def test_verify_empty_stream(redis_client: redis.Redis) -> None:
    out = io.StringIO()
    assert commands.verify(redis_client, out) == 0
    assert "no audit records" in out.getvalue()


def test_tail_prints_backlog_then_follows(redis_client: redis.Redis) -> None:
    log = _fill(redis_client)
    out = io.StringIO()
    stop = threading.Event()
    follower = threading.Thread(
        target=commands.tail, args=(redis_client, out),
        kwargs={"last": 2, "block_ms": 100, "limit": 2, "stop": stop},
    )
    follower.start()
    deadline = time.monotonic() + 10
    while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    log.record("dispatch", tenant="team-a", name="p3")
    log.record("release", tenant="team-a", name="p1")
    follower.join(20)
    stop.set()
    assert not follower.is_alive()
    assert [r["decision"] for r in _json_lines(out.getvalue())] == [
        "deny", "queue", "dispatch", "release"]


@pytest.mark.parametrize("last", [0, 5])
def test_tail_without_follow(redis_client: redis.Redis, last: int) -> None:
    _fill(redis_client)
    out = io.StringIO()
    assert commands.tail(redis_client, out, last=last, follow=False) == 0
    assert len(out.getvalue().splitlines()) == min(last, 3)
