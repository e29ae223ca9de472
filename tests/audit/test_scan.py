"""ChainScan (the fast verifying pass of ``fairgate report``) against a real redis-server:
it must reach AuditLog.verify's verdict on every stream, intact or tampered."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

from audit.chain import GENESIS, AuditRecord, link_hash
from audit.log import PAGE, STREAM, AuditLog, ChainScan

pytestmark = pytest.mark.timeout(300)

RECORDS = 2 * PAGE + 57  # three pages: the scan requests each page before checking the last


def _drafts(n: int, start: int = 0) -> list[AuditRecord]:
    return [AuditRecord("start" if i % 3 else "admit", time=f"2026-03-01T00:00:{i % 60:02d}.00"
                        f"{i % 10}Z", uid=f"u{i}", user="bob", groups=("g",), tenant="team-a",
                        namespace="ns", name=f"p{i}", pod_class="training", demand="gpu=1",
                        latency_ms=1.5, diff={"pod": {"band": "training", "node": "n1",
                                                      "gpuProduct": None}} if i % 3 else None)
            for i in range(start, start + n)]


def _consume(scan: ChainScan) -> list[dict[str, Any]]:
    return list(scan)


def _body(record: AuditRecord) -> dict[str, Any]:
    return {k: v for k, v in record.fields().items() if k not in ("seq", "prev", "hash")}


def _entries(client: redis.Redis) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(STREAM))


def _forge(client: redis.Redis, bodies: list[bytes]) -> None:
    """A stream whose every link is right, holding exactly these bodies (as someone
    who can write the whole stream and its head would store them)."""
    client.delete(STREAM, STREAM + ":head")
    prev = GENESIS
    for seq, body in enumerate(bodies, start=1):
        link = link_hash(seq, prev, hashlib.sha256(body).hexdigest())
        client.xadd(STREAM, {"seq": seq, "prev": prev, "hash": link, "record": body})
        prev = link
    client.hset(STREAM + ":head", mapping={"seq": len(bodies), "hash": prev, "floor": 1})


def test_an_intact_stream_yields_every_body_in_order(redis_client: redis.Redis) -> None:
    written = AuditLog(redis_client, out=io.StringIO()).record_many(_drafts(RECORDS))
    scan = AuditLog(redis_client).scan()
    assert _consume(scan) == [_body(r) for r in written]
    assert scan.result is not None and scan.result.ok
    assert (scan.result.checked, scan.result.first_seq, scan.result.last_seq) == (
        RECORDS, 1, RECORDS)
    assert scan.oldest == written[0].time and scan.entries == []


def _delete(n: int) -> Callable[[redis.Redis], None]:
    def tamper(client: redis.Redis) -> None:
        client.xdel(STREAM, _entries(client)[n][0])
    return tamper


def _rewrite(n: int, field: bytes, value: Callable[[bytes], bytes]) -> Callable[
        [redis.Redis], None]:
    def tamper(client: redis.Redis) -> None:
        entries = _entries(client)
        client.delete(STREAM)
        for i, (_, fields) in enumerate(entries):
            if i == n:
                fields = {**fields, field: value(fields[field])}
            client.xadd(STREAM, dict(fields))  # type: ignore[arg-type]
    return tamper


def _swap(n: int) -> Callable[[redis.Redis], None]:
    def tamper(client: redis.Redis) -> None:
        entries = _entries(client)
        entries[n], entries[n + 1] = entries[n + 1], entries[n]
        client.delete(STREAM)
        for _, fields in entries:
            client.xadd(STREAM, dict(fields))  # type: ignore[arg-type]
    return tamper


def _append_raw(fields: dict[str, Any]) -> Callable[[redis.Redis], None]:
    def tamper(client: redis.Redis) -> None:
        client.xadd(STREAM, fields)
    return tamper


TAMPERINGS: dict[str, Callable[[redis.Redis], None]] = {
    "first record deleted": _delete(0),
    "record on the second page deleted": _delete(PAGE + 3),
    "last record deleted": _delete(RECORDS - 1),
    "body edited": _rewrite(PAGE, b"record", lambda b: b.replace(b'"team-a"', b'"team-b"')),
    "body made non-canonical": _rewrite(5, b"record", lambda b: b.replace(b",", b", ", 1)),
    "prev rewritten": _rewrite(7, b"prev", lambda _: b"1" * 64),
    "hash rewritten": _rewrite(RECORDS - 1, b"hash", lambda _: b"2" * 64),
    "seq rewritten": _rewrite(9, b"seq", lambda _: b"99"),
    "seq not a number": _rewrite(9, b"seq", lambda _: b"nine"),
    "body not JSON": _rewrite(3, b"record", lambda _: b"{not json"),
    "body not UTF-8": _rewrite(3, b"record", lambda b: b.replace(b"bob", b"b\xffb")),
    "two records swapped": _swap(PAGE - 1),
    "garbage appended past the head": _append_raw({"record": "{}"}),
    "chain head moved on": lambda c: c.hset(STREAM + ":head", "seq", RECORDS + 3),
}


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_a_tampered_stream_gets_verifys_verdict(redis_client: redis.Redis,
                                                  tampering: str) -> None:
    log = AuditLog(redis_client, maxlen=RECORDS + 10, out=io.StringIO())
    log.record_many(_drafts(RECORDS))
    TAMPERINGS[tampering](redis_client)
    expected, entries = log.verify()
    assert not expected.ok, "the tampering must break the chain"
    scan = log.scan()
    _consume(scan)
    assert scan.result == expected
    assert [e.stream_id for e in scan.entries] == [e.stream_id for e in entries]


def test_retention_trims_the_head_and_the_rest_verifies(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, maxlen=PAGE + 1, out=io.StringIO())
    written = log.record_many(_drafts(RECORDS))
    scan = log.scan()
    assert _consume(scan) == [_body(r) for r in written[-(PAGE + 1):]]
    assert scan.result is not None and scan.result.ok
    assert scan.result.first_seq == RECORDS - PAGE and scan.oldest == written[-PAGE - 1].time


@pytest.mark.parametrize("number", [b"1e16", b"-2.5e-7", b"0.00001", b"1E+16"])
def test_a_number_in_another_encoders_form_is_not_canonical(redis_client: redis.Redis,
                                                            number: bytes) -> None:
    """orjson writes these; Python's json (the canonical form) writes 1e+16, -2.5e-07,
    1e-05: a body so stored does not verify, even with every link right."""
    good = [r.body_json().encode() for r in _drafts(3)]
    bad = good[1].replace(b'"gpuProduct":null', b'"gpuProduct":' + number)
    assert bad != good[1]
    _forge(redis_client, [good[0], bad, good[2]])
    expected, _ = AuditLog(redis_client).verify()
    assert not expected.ok and "not canonical" in expected.problem
    scan = AuditLog(redis_client).scan()
    _consume(scan)
    assert scan.result == expected


def test_numbers_of_every_form_verify_and_come_back_exactly(redis_client: redis.Redis) -> None:
    values = [1e16, -2.5e-07, 1e-05, 0.0001, 123.456, 9999999999999998.0, 2**63, 10**30,
              float("nan"), -0.0, True, None, "1e16", ":0.00001"]
    drafts = [AuditRecord("pricing", time="2026-03-01T00:00:00.000Z", latency_ms=latency,
                          diff={"pricing.gpuHour.default": {"before": None, "after": value}})
              for value in values for latency in (0.0, 1e-05, 2e16)]
    written = AuditLog(redis_client, out=io.StringIO()).record_many(drafts)
    scan = AuditLog(redis_client).scan()
    bodies = _consume(scan)
    assert scan.result is not None and scan.result.ok, scan.result
    assert json.dumps(bodies, sort_keys=True) == json.dumps([_body(r) for r in written],
                                                           sort_keys=True)


def test_records_appended_during_the_scan_are_left_for_the_next(
        redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    log.record_many(_drafts(RECORDS))
    scan = log.scan()
    bodies = iter(scan)
    next(bodies)  # the head is read with the first page
    log.record_many(_drafts(5, start=RECORDS))
    assert 1 + sum(1 for _ in bodies) == RECORDS
    assert scan.result is not None and scan.result.ok and scan.result.last_seq == RECORDS


def test_a_scan_left_early_leaves_the_client_usable(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO())
    log.record_many(_drafts(RECORDS))
    bodies = iter(log.scan())
    for _ in range(PAGE + 1):  # the third page is requested, not read
        next(bodies)
    del bodies
    assert redis_client.ping()
    again = log.scan()
    assert len(_consume(again)) == RECORDS and again.result is not None and again.result.ok


@pytest.mark.parametrize("change", [
    (b'"uid":"u1"', b'"uid":5'), (b'"latency_ms":1.5', b'"latency_ms":2'),
    (b'"latency_ms":1.5', b'"latency_ms":1.2345'), (b'"groups":["g"]', b'"groups":"g"'),
    (b'"groups":["g"]', b'"groups":[7]'), (b'"reason":""', b'"reason":"' + b"x" * 1025 + b'"'),
    (b'"decision":"start"', b'"decision":"Start"'), (b'"uid":"u1",', b""),
    (b'"uid":"u1"', b'"uid":"u1","zzz":1'), (b'"diff":{', b'"diff":null,"x":{'),
    (b'"diff":{"pod":{"band":"training","gpuProduct":null,"node":"n1"}}', b'"diff":[1]'),
    (b'"tenant":"team-a"', b'"tenant":"team-\\u00e9"'),
])
def test_a_body_unlike_what_the_writer_stores_gets_verifys_verdict(
        redis_client: redis.Redis, change: tuple[bytes, bytes]) -> None:
    """Bodies the fast path does not take (wrong types, values a record would change,
    missing or unknown keys, escapes): parse_entry decides, so the scan's verdict and
    bodies are verify's, whatever that is."""
    good = [r.body_json().encode() for r in _drafts(3)]
    assert change[0] in good[1]
    _forge(redis_client, [good[0], good[1].replace(*change), good[2]])
    expected, entries = AuditLog(redis_client).verify()
    scan = AuditLog(redis_client).scan()
    bodies = _consume(scan)
    assert scan.result == expected
    if expected.ok:
        assert bodies == [_body(e.record) for e in entries if e.record is not None]
