"""AuditLog against a real redis-server: chain, retention, concurrency, Redis down."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import multiprocessing
import threading
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import cast

import pytest
import redis
from redis.typing import EncodableT, FieldT

from audit.chain import (
    GENESIS,
    AuditRecord,
    chain_hash,
    content_digest,
    link_hash,
    verify,
)
from audit.log import STREAM, AuditLog, parse_entry
from fairshare.localredis import free_port, local_redis

pytestmark = pytest.mark.timeout(300)


def _write(log: AuditLog, n: int, writer: str = "w") -> list[AuditRecord]:
    return [
        log.record("admit", uid=f"{writer}-{i}", user="bob", groups=["g"], tenant="team-a",
                   namespace="ns", name=f"p{i}", demand="gpu=1", latency_ms=1.5)
        for i in range(n)
    ]


Entry = tuple[bytes, dict[bytes, bytes]]


def _xrange(client: redis.Redis, count: int | None = None) -> list[Entry]:
    """The stream's raw entries, oldest first."""
    return cast(list[Entry], client.xrange(STREAM, count=count))


def _stored(client: redis.Redis) -> list[AuditRecord | None]:
    return [parse_entry(i, v).record for i, v in _xrange(client)]


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
    ((_, fields),) = _xrange(redis_client)
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
    ids = [i for i, _ in _xrange(redis_client)]
    redis_client.xdel(STREAM, ids[20])
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 21 and "missing" in result.problem


def test_deleting_the_oldest_entry_is_not_mistaken_for_retention(
    redis_client: redis.Redis,
) -> None:
    log = AuditLog(redis_client, maxlen=20, out=io.StringIO())
    _write(log, 30)
    oldest = _xrange(redis_client, count=1)[0][0]
    redis_client.xdel(STREAM, oldest)
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 11


def test_rewritten_stream_with_an_edited_record_is_located(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 30)
    entries = _xrange(redis_client)
    redis_client.delete(STREAM)
    for n, (_, values) in enumerate(entries):
        if n == 12:
            values[b"record"] = values[b"record"].replace(b'"decision":"admit"',
                                                          b'"decision":"deny"')
        fields: dict[FieldT, EncodableT] = {k: v for k, v in values.items()}
        redis_client.xadd(STREAM, fields)
    result, checked = log.verify()
    assert not result.ok and result.first_bad == 13 and "edited" in result.problem
    assert result.position == 12 and len(checked) == 30


def test_garbage_entry_is_located(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    _write(log, 5)
    head: dict[FieldT, EncodableT] = {"seq": 6, "prev": "0" * 64, "hash": "1" * 64}
    garbage = redis_client.xadd(STREAM, {**head, "record": "{not json"})
    result, _ = log.verify()
    assert not result.ok and result.first_bad == 6 and "not a valid audit record" in result.problem
    redis_client.xdel(STREAM, garbage)
    redis_client.xadd(STREAM, {"record": "{}"})
    assert "lacks field(s) seq, prev, hash" in log.verify()[0].problem


def _run_all(threads: Sequence[threading.Thread],
             procs: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Start every thread and process, wait for all; each process must exit with 0."""
    for thread in threads:
        thread.start()
    for proc in procs:
        proc.start()
    for thread in threads:
        thread.join()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0


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
    _run_all(threads, procs)
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


# --- batches ------------------------------------------------------------------------------


class CountingOut(io.StringIO):
    """A text sink that counts writes and flushes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def _drafts(n: int, writer: str = "b") -> list[AuditRecord]:
    return [AuditRecord("queue", uid=f"{writer}-{i}", tenant="team-a", namespace="ns",
                        name=f"p{i}", demand="gpu=1", reason="no room") for i in range(n)]


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_batch_of_one_is_a_record(redis_client: redis.Redis) -> None:
    out = io.StringIO()
    log = AuditLog(redis_client, out=out)
    (rec,) = log.record_many(_drafts(1))
    assert (rec.seq, rec.prev, rec.uid) == (1, GENESIS, "b-0")
    assert rec.hash == chain_hash(rec.fields())
    assert out.getvalue() == rec.to_json() + "\n"
    assert _stored(redis_client) == [rec]
    assert log.verify()[0].ok
    assert log.record_many([]) == []


def test_chain_fields_of_drafts_are_ignored(redis_client: redis.Redis) -> None:
    forged = [dataclasses.replace(d, seq=7, prev="ab" * 32, hash="cd" * 32) for d in _drafts(2)]
    stored = AuditLog(redis_client, out=io.StringIO()).record_many(forged)
    assert [(r.seq, r.hash) for r in stored] == [(1, chain_hash(stored[0].fields())),
                                                 (2, chain_hash(stored[1].fields()))]
    down = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    unstored = AuditLog(down, out=io.StringIO()).record_many(forged)
    assert [(r.seq, r.prev, r.hash) for r in unstored] == [(None, None, None)] * 2
    assert [r.uid for r in unstored] == ["b-0", "b-1"]


@pytest.mark.parametrize("size", [256, 600])
def test_a_batch_is_one_script_call_and_one_flush_per_256(
    redis_client: redis.Redis, size: int,
) -> None:
    out = CountingOut()
    log = AuditLog(redis_client, out=out)
    _write(log, 1)  # loads the script
    redis_client.config_resetstat()
    out.writes = out.flushes = 0
    stored = log.record_many(_drafts(size))
    calls = -(-size // 256)
    assert _evalsha_calls(redis_client) == calls
    assert (out.writes, out.flushes) == (calls, calls)
    assert [r.seq for r in stored] == list(range(2, size + 2))
    assert [r.uid for r in stored] == [f"b-{i}" for i in range(size)]
    assert out.getvalue().splitlines()[1:] == [r.to_json() for r in stored]
    assert _stored(redis_client)[1:] == stored
    result, _ = log.verify()
    assert result.ok, result.problem
    assert (result.first_seq, result.last_seq) == (1, size + 1)


def test_after_another_writer_a_batch_takes_one_more_call(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    # The script links only the first record itself (Lua SHA-256), then the writer links
    # the rest from the head it returned: two calls, never one Lua hash per record.
    other_client = redis.Redis.from_url(redis_url)
    log = AuditLog(redis_client, out=io.StringIO())
    other = AuditLog(other_client, out=io.StringIO())
    _write(log, 1)
    _write(other, 1)
    redis_client.config_resetstat()
    stored = log.record_many(_drafts(256))
    other_client.close()
    assert _evalsha_calls(redis_client) == 2
    assert [r.seq for r in stored] == list(range(3, 259))
    assert log.verify()[0].ok


def test_batch_keeps_retention_exact(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, maxlen=100, out=io.StringIO())
    log.record_many(_drafts(250))
    assert redis_client.xlen(STREAM) == 100
    assert redis_client.hget(f"{STREAM}:head", "floor") == b"151"
    result, _ = log.verify()
    assert result.ok, result.problem
    assert (result.first_seq, result.last_seq) == (151, 250)


def test_batches_interleaved_with_other_writers_keep_one_chain(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    # Each writer's remembered head is stale after another writer's batch: the links of
    # its next batch must then be computed from the real head.
    other_client = redis.Redis.from_url(redis_url)
    writers = [AuditLog(redis_client, out=io.StringIO()),
               AuditLog(other_client, out=io.StringIO()),
               AuditLog(redis_client, out=io.StringIO())]
    sizes = [1, 3, 256, 2, 1, 1, 40, 7, 1, 300, 5]
    batches = [writers[n % 3].record_many(_drafts(size, f"w{n}"))
               for n, size in enumerate(sizes)]
    # every batch is a run of consecutive links, in the order the batches were written
    assert [r.seq for batch in batches for r in batch] == list(range(1, sum(sizes) + 1))
    result, entries = writers[1].verify()
    assert result.ok, result.problem
    assert [e.record for e in entries] == [r for batch in batches for r in batch]
    redis_client.flushall()  # a reset chain restarts from seq 1 whatever a writer remembers
    again = [writers[n % 3].record_many(_drafts(size, f"x{n}"))
             for n, size in enumerate([2, 1, 3])]
    other_client.close()
    assert [r.seq for batch in again for r in batch] == list(range(1, 7))
    result, entries = writers[0].verify()
    assert result.ok, result.problem
    assert [e.record for e in entries] == [r for batch in again for r in batch]


def test_a_batch_with_a_malformed_record_writes_nothing(redis_client: redis.Redis) -> None:
    script = redis_client.register_script(
        resources.files("audit").joinpath("append.lua").read_text(encoding="utf-8"))
    body = _drafts(1)[0].body_json()
    good = [content_digest(body), body, ""]
    with pytest.raises(redis.ResponseError, match="64 hex digits"):
        script(keys=[STREAM, f"{STREAM}:head"],
               args=[100, 0, "", "", *good, "not-a-digest", body, "", *good])
    assert redis_client.xlen(STREAM) == 0 and not redis_client.exists(f"{STREAM}:head")


def test_redis_down_mid_batch_still_writes_every_record_to_stdout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with local_redis() as url:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=0.5)
        out = io.StringIO()
        log = AuditLog(client, out=out)
        killer = redis.Redis.from_url(url)

        def drafts() -> Iterator[AuditRecord]:
            for i, draft in enumerate(_drafts(700)):
                if i == 300:  # the first batch (256) is stored; Redis dies in the second
                    with contextlib.suppress(redis.ConnectionError):
                        killer.shutdown(nosave=True)
                yield draft

        stored = log.record_many(drafts())
    lines = [AuditRecord.from_json(line) for line in out.getvalue().splitlines()]
    assert lines == stored
    assert [r.uid for r in lines] == [f"b-{i}" for i in range(700)]
    assert [r.seq for r in lines[:256]] == list(range(1, 257))
    assert verify(lines[:256]).ok
    assert all(r.seq is None and r.prev is None and r.hash is None for r in lines[256:])
    assert log.failures == 700 - 256 and log.last_error and "ConnectionError" in log.last_error
    assert "not stored" in caplog.text


def _batch_writer(url: str, name: str, rounds: int) -> None:
    client = redis.Redis.from_url(url)
    log = AuditLog(client, out=io.StringIO())
    for n in range(rounds):
        stored = log.record_many(_drafts([1, 7, 256, 40][n % 4], f"{name}.{n}"))
        seqs = [r.seq or 0 for r in stored]
        assert 0 not in seqs and seqs == sorted(seqs)  # all chained, in order
    client.close()


@pytest.mark.slow
def test_concurrent_batches_from_threads_and_processes_keep_one_chain(
    redis_client: redis.Redis, redis_url: str,
) -> None:
    rounds = 8
    spawn = multiprocessing.get_context("spawn")
    errors: list[BaseException] = []

    def thread_writer(name: str) -> None:
        try:
            _batch_writer(redis_url, name, rounds)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=thread_writer, args=(f"t{i}",)) for i in range(2)]
    procs = [spawn.Process(target=_batch_writer, args=(redis_url, f"p{i}", rounds))
             for i in range(3)]
    _run_all(threads, procs)
    assert not errors
    result, entries = AuditLog(redis_client, out=io.StringIO()).verify()
    assert result.ok, result.problem
    per_writer = sum([1, 7, 256, 40][n % 4] for n in range(rounds))
    assert result.checked == 5 * per_writer
    uids = {e.record.uid for e in entries if e.record is not None}
    assert len(uids) == 5 * per_writer


def test_a_lone_surrogate_is_stored_as_replacement_character_not_lost(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    out = io.StringIO()
    log = AuditLog(redis_client, out=out)
    drafts = _drafts(3)
    drafts[1] = dataclasses.replace(drafts[1], name="p\ud800", groups=("g\udfff",))
    stored = log.record_many(drafts)
    assert [r.seq for r in stored] == [1, 2, 3]
    assert (stored[1].name, stored[1].groups) == ("p\ufffd", ("g\ufffd",))
    assert out.getvalue() == "".join(r.to_json() + "\n" for r in stored)
    out.getvalue().encode()  # UTF-8 text throughout
    assert _stored(redis_client) == stored
    assert log.verify()[0].ok
    assert "lone surrogates" in caplog.text
