"""AuditLog against a real redis-server: chain, retention, concurrency, Redis down."""

from __future__ import annotations

import io
import json
import multiprocessing
import threading

import pytest
import redis

from audit.chain import GENESIS, AuditRecord, chain_hash, content_digest, link_hash
from audit.log import STREAM, AuditLog, parse_entry
from fairshare.localredis import free_port

pytestmark = pytest.mark.timeout(300)


def _write(log: AuditLog, n: int, writer: str = "w") -> list[AuditRecord]:
    return [
        log.record("admit", uid=f"{writer}-{i}", user="bob", groups=["g"], tenant="team-a",
                   namespace="ns", name=f"p{i}", demand="gpu=1", latency_ms=1.5)
        for i in range(n)
    ]


def _stored(client: redis.Redis, stream: str = STREAM) -> list[AuditRecord | None]:
    return [parse_entry(i, v).record for i, v in client.xrange(stream)]


@pytest.mark.slow
def test_ten_thousand_records_chain_and_verify(redis_client: redis.Redis) -> None:
    out = io.StringIO()
    log = AuditLog(redis_client, out=out)
    written = _write(log, 10_000)
    result, entries = log.verify()
    assert result.ok, result.problem
    assert (result.checked, result.first_seq, result.last_seq) == (10_000, 1, 10_000)
    assert [e.record for e in entries] == written
    lines = out.getvalue().splitlines()
    assert lines == [r.to_json() for r in written]


def test_same_record_on_stdout_and_in_the_stream(redis_client: redis.Redis) -> None:
    out = io.StringIO()
    log = AuditLog(redis_client, out=out)
    rec = log.record("quota-change", user="alice", operation="UPDATE", tenant="team-a",
                     name="quota-team-a", diff={"nominal.gpu": {"before": 8, "after": 4}})
    ((_, fields),) = redis_client.xrange(STREAM)
    assert out.getvalue() == rec.to_json() + "\n"
    assert fields[b"record"].decode() == rec.body_json()
    assert (int(fields[b"seq"]), fields[b"prev"].decode(), fields[b"hash"].decode()) == (
        1, GENESIS, rec.hash)
    assert rec.hash == chain_hash(rec.fields())
    assert _stored(redis_client) == [rec]
    assert json.loads(out.getvalue())["diff"] == {"nominal.gpu": {"before": 8, "after": 4}}


def test_redis_link_hash_matches_python(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    local = AuditLog(None, out=io.StringIO())
    for i, reason in enumerate(["", "é" * 300, "x" * 2000, '"quoted" \\ \n']):
        stored = log.record("deny", reason=reason, uid=str(i), time="2026-01-01T00:00:00.000Z")
        mirrored = local.record("deny", reason=reason, uid=str(i),
                                time="2026-01-01T00:00:00.000Z")
        assert stored == mirrored


def test_retention_is_exact_and_what_remains_verifies(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, maxlen=100, out=io.StringIO())
    _write(log, 250)
    assert redis_client.xlen(STREAM) == 100
    result, _ = log.verify()
    assert result.ok, result.problem
    assert (result.first_seq, result.last_seq) == (151, 250)


def test_retention_after_raising_maxlen_still_verifies(redis_client: redis.Redis) -> None:
    _write(AuditLog(redis_client, maxlen=10, out=io.StringIO()), 30)
    log = AuditLog(redis_client, maxlen=1000, out=io.StringIO())
    _write(log, 5)
    result, _ = log.verify()
    assert result.ok, result.problem
    assert (result.first_seq, result.last_seq) == (21, 35)


def test_deleting_a_stream_entry_is_located(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 50)
    ids = [i for i, _ in redis_client.xrange(STREAM)]
    redis_client.xdel(STREAM, ids[20])
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 21 and "missing" in result.problem


def test_deleting_the_oldest_entry_is_not_mistaken_for_retention(
    redis_client: redis.Redis,
) -> None:
    log = AuditLog(redis_client, maxlen=20, out=io.StringIO())
    _write(log, 30)
    oldest = redis_client.xrange(STREAM, count=1)[0][0]
    redis_client.xdel(STREAM, oldest)
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 11


def test_rewritten_stream_with_an_edited_record_is_located(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 30)
    entries = redis_client.xrange(STREAM)
    redis_client.delete(STREAM)
    for n, (_, values) in enumerate(entries):
        if n == 12:
            values[b"record"] = values[b"record"].replace(b'"decision":"admit"',
                                                          b'"decision":"deny"')
        redis_client.xadd(STREAM, values)
    result, checked = log.verify()
    assert not result.ok and result.first_bad == 13 and "edited" in result.problem
    assert result.position == 12 and len(checked) == 30


def test_garbage_entry_is_located(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 5)
    head = {"seq": 6, "prev": "0" * 64, "hash": "1" * 64}
    garbage = redis_client.xadd(STREAM, {**head, "record": "{not json"})
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 6 and "not a valid audit record" in result.problem
    redis_client.xdel(STREAM, garbage)
    redis_client.xadd(STREAM, {"record": "{}"})
    assert "lacks field(s) seq, prev, hash" in log.verify()[0].problem


def _threaded_writer(url: str, name: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    _write(AuditLog(client, out=io.StringIO()), n, name)
    client.close()


@pytest.mark.slow
def test_concurrent_threads_and_processes_keep_one_chain(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    per_writer = 150
    threads = [threading.Thread(target=_threaded_writer, args=(redis_url, f"t{i}", per_writer))
               for i in range(4)]
    shared = AuditLog(redis_client, out=io.StringIO())
    threads += [threading.Thread(target=_write, args=(shared, per_writer, f"s{i}"))
                for i in range(2)]
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=_threaded_writer, args=(redis_url, f"p{i}", per_writer))
             for i in range(3)]
    for worker in [*threads, *procs]:
        worker.start()
    for thread in threads:
        thread.join()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    result, entries = shared.verify()
    assert result.ok, result.problem
    uids = sorted(e.record.uid for e in entries if e.record is not None)
    names = [f"t{i}" for i in range(4)] + [f"s{i}" for i in range(2)] + [f"p{i}" for i in range(3)]
    assert uids == sorted(f"{w}-{i}" for w in names for i in range(per_writer))


def test_redis_down_still_writes_stdout_and_reports(caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    out = io.StringIO()
    log = AuditLog(client, out=out)
    rec = log.record("deny", tenant="team-a", reason="redis unavailable")
    assert rec.seq is None and rec.hash is None
    assert json.loads(out.getvalue())["decision"] == "deny"
    assert log.failures == 1 and log.last_error and "ConnectionError" in log.last_error
    assert "not stored" in caplog.text


def test_redis_flushed_restarts_the_chain(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 3)
    redis_client.flushall()
    (rec,) = _write(log, 1)
    assert rec.seq == 1
    assert log.verify()[0].ok
    assert _stored(redis_client) == [rec]


@pytest.mark.parametrize("seq", [9, 99_999, 10**12, 10**15])
def test_lua_link_hash_for_long_sequence_numbers(redis_client: redis.Redis, seq: int) -> None:
    prev = "ab" * 32
    redis_client.hset(f"{STREAM}:head", mapping={"seq": seq, "hash": prev, "floor": 1})
    rec = AuditLog(redis_client, out=io.StringIO()).record("admit", uid="x")
    assert (rec.seq, rec.prev) == (seq + 1, prev)
    assert rec.hash == link_hash(seq + 1, prev, content_digest(rec.body_json()))
