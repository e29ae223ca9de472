"""The canonical JSON of records is byte for byte what ``json.dumps`` gives, so chains
written before (and by any other implementation of the documented form) still verify."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.chain import (
    CHAIN_FIELDS,
    DECISIONS,
    AuditRecord,
    chain_hash,
    parse_time,
    utc_now,
    verify,
)
from audit.log import AuditLog


def reference(data: dict[str, Any]) -> str:
    """The documented canonical form: sorted keys, no whitespace, non-ASCII as UTF-8."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# Any code point, lone surrogates and control characters included.
text = st.text(st.characters(exclude_categories=()), max_size=12)
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e16, 1e-7, -0.0, 1e17, 123456789.123456789, 5e-324, 1.7976931348623157e308])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | floats | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
# Mostly strings; sometimes a value of another type (the record does not refuse one).
field_value = st.one_of(text, text, text, json_values)
record_fields = st.fixed_dictionaries(
    {"decision": st.sampled_from(DECISIONS) | st.from_regex(r"\A[a-z][a-z-]{0,8}\Z"),
     "time": field_value, "uid": field_value, "user": field_value,
     "groups": st.lists(field_value, max_size=3).map(tuple),
     "operation": field_value, "tenant": field_value, "namespace": field_value,
     "name": field_value, "pod_class": field_value, "demand": field_value,
     "reason": st.text(st.characters(exclude_categories=()), max_size=1100),
     "latency_ms": floats | st.integers(-10**6, 10**6),
     "diff": st.none() | st.dictionaries(
         text, st.dictionaries(st.sampled_from(["before", "after"]), json_values), max_size=3)},
)
chain_value = st.one_of(st.none(), st.integers(0, 2**63), text, json_values)


@settings(max_examples=300, deadline=None)
@given(fields=record_fields, seq=chain_value, prev=chain_value, hash_=chain_value)
def test_body_and_wire_form_are_json_dumps_byte_for_byte(
    fields: dict[str, Any], seq: Any, prev: Any, hash_: Any,
) -> None:
    record = AuditRecord(**fields)
    wire = record.fields()
    body = {k: v for k, v in wire.items() if k not in CHAIN_FIELDS}
    assert record.body_json() == reference(body)
    assert record.to_json() == reference(wire)
    form = record.wire_form()
    assert form.body() == reference(body)
    assert form.line(seq, prev, hash_) == reference({**body, "seq": seq, "prev": prev,
                                                     "hash": hash_})


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(record_fields, min_size=1, max_size=5))
def test_stdout_lines_are_the_canonical_records(batch: list[dict[str, Any]]) -> None:
    out = io.StringIO()
    stored = AuditLog(None, out=out).record_many(AuditRecord(**f) for f in batch)
    assert out.getvalue() == "".join(reference(r.fields()) + "\n" for r in stored)
    assert [r.hash for r in stored] == [chain_hash(json.loads(reference(r.fields())))
                                        for r in stored]


@settings(max_examples=50, deadline=None)
@given(fields=record_fields, seq=chain_value, prev=chain_value, hash_=chain_value)
def test_with_chain_is_replace_without_validating_again(
    fields: dict[str, Any], seq: Any, prev: Any, hash_: Any,
) -> None:
    record = AuditRecord(**fields)
    linked = record.with_chain(seq, prev, hash_)
    replaced = dataclasses.replace(record, seq=seq, prev=prev, hash=hash_)
    assert type(linked) is AuditRecord
    assert linked.to_json() == replaced.to_json()
    assert (linked.seq, linked.prev, linked.hash) == (seq, prev, hash_)
    with pytest.raises(dataclasses.FrozenInstanceError):
        linked.seq = 1  # type: ignore[misc]


# Wire lines written by the previous implementation (json.dumps per record): they must
# parse, keep their exact bytes and verify.
EARLIER_LINES = [
    '{"class":"training","decision":"admit","demand":"gpu=1","groups":["s'
    'ystem:authenticated","\xe9quipe-a"],"hash":"c8f7d04da56a364805e9fcf7416'
    '0a95f69d10d66d7dd36582f0dca5155e7d0b7","latency_ms":1.235,"name":"tr'
    'ain-\xe9\u2028","namespace":"team-a-dev","operation":"CREATE","prev":"000000'
    '0000000000000000000000000000000000000000000000000000000000","reason"'
    ':"fits nominal quota \\"quoted\\"\\n\\ttab \\u0001 \U0001f600","seq":1,"tenant":"t'
    'eam-a","time":"2026-11-30T03:30:00.123Z","uid":"5f0c-\xfc","user":"j\xfcrg'
    'en@example.com"}',
    '{"class":"","decision":"quota-change","demand":"","diff":{"borrow.li'
    'mit":{"after":[1e+16,1e-07,-0.0,true],"before":null},"nominal.gpu":{'
    '"after":4.5,"before":8},"\xfcn\xefcode":{"after":{"a":2,"z":1},"before":"a'
    '\\"b"}},"groups":[],"hash":"a9e471c42dc7d51c6ffa4618d52ee46248039c50a'
    '2e05672442eb2fc8b25ac4a","latency_ms":0.0,"name":"","namespace":"","'
    'operation":"","prev":"c8f7d04da56a364805e9fcf74160a95f69d10d66d7dd36'
    '582f0dca5155e7d0b7","reason":"","seq":2,"tenant":"","time":"2026-11-'
    '30T03:30:01.000Z","uid":"","user":"admin"}',
    '{"class":"","decision":"deny","demand":"","groups":[],"hash":"345a99'
    '887ea900ef79103f288834efacdb8c9bdf118d7de000f1e624e341dc98","latency'
    '_ms":1e+17,"name":"","namespace":"","operation":"","prev":"a9e471c42'
    'dc7d51c6ffa4618d52ee46248039c50a2e05672442eb2fc8b25ac4a","reason":"x'
    'xxxx","seq":3,"tenant":"","time":"2026-11-30T03:30:02.999Z","uid":""'
    ',"user":""}',
]


def test_records_written_earlier_keep_their_bytes_and_verify() -> None:
    records = [AuditRecord.from_json(line) for line in EARLIER_LINES]
    assert [r.to_json() for r in records] == EARLIER_LINES
    result = verify(records)
    assert result.ok and result.checked == 3, result.problem


def test_utc_now_is_the_current_time_in_the_record_form() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamps = [utc_now() for _ in range(2000)]
    after = datetime.now(UTC)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps)
    times = [parse_time(s) for s in stamps]
    assert times == sorted(times)
    assert before <= times[0] and times[-1] <= after + timedelta(milliseconds=1)
