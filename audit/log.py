"""Write audit records to stdout and to a hash-chained Redis Stream.

Contract:
- :meth:`AuditLog.record_many` appends records, in order, to the stream (default
  ``fairgate:audit``) as the next links of the chain, and writes the same JSON lines to
  ``out``: one write + flush per batch of up to :data:`BATCH` records, and one script
  call (EVALSHA) per batch, two when another writer appended since this one's last call.
  :meth:`AuditLog.record` is the batch of one. Neither raises for Redis or ``out``
  failures: if Redis is unavailable the records are still written to ``out`` (unchained:
  ``seq``/``prev``/``hash`` null), ``last_error`` and ``failures`` (records) say what
  went wrong, the counter ``fairgate_audit_write_failures_total`` counts the records and
  a warning is logged.
- Chaining is race-free across threads and processes by construction: one Lua script
  (``append.lua``) reads the chain head (kept in ``<stream>:head``), links the records,
  appends them and moves the head, atomically. The writer hashes each record body
  (SHA-256) and, from the head its previous call left, the links too; when that head is
  still current the script stores those links. Otherwise (another writer appended in
  between) the script appends just the first record, its link computed in pure Lua
  (Redis Lua offers SHA-1 alone), and the writer links the rest from the new head. Every
  call appends at least one record, so no writer can starve, and hashes at most one link
  in Lua, so no call holds Redis long.
- A stream entry holds the fields ``seq``, ``prev``, ``hash`` and ``record`` (the body:
  canonical JSON without the three); the stdout line is the complete record.
- Retention is exact: every script call ends by trimming the records appended more
  than ``max_age`` ago (``XTRIM MINID``; stream ids are Redis's clock at the append; None:
  any age), then all but the newest ``maxlen`` (``XTRIM MAXLEN``). The head's ``floor``
  is the lowest seq retention has not removed (moved up by the count the age trim
  removed, and to ``seq - maxlen + 1``), so :meth:`AuditLog.verify` can tell trimming
  from deletion and the chain verifies from the first record kept. :class:`Retention`
  reads the ``--audit-retention`` value; the default keeps 45 days, at most 1,000,000
  records (a month's bill complete up to about 22,000 records a day; 550-630 bytes a
  record in Redis: at most ~630 MB, within the shipped Redis's 1 GiB limit). Needs Redis 6.2 or
  later (``MINID``).
- With ``client=None`` records are chained in-process and only written to ``out``.
- Give the client socket timeouts (``socket_timeout``, ``socket_connect_timeout``): a
  batch waits for Redis at most that long before falling back to stdout only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from operator import itemgetter
from typing import Any, NamedTuple, TextIO

import orjson
import redis
from prometheus_client import Counter
from redis.commands.core import Script

from audit.chain import (
    CHAIN_FIELDS,
    GENESIS,
    MAX_TEXT,
    AuditRecord,
    ChainCheck,
    ChainHead,
    VerifyResult,
    body_keys,
    content_digest,
    is_decision,
    link_hash,
    verify,
)

STREAM = "fairgate:audit"
MAXLEN = 1_000_000
MAX_AGE = timedelta(days=45)
PAGE = 1000
BATCH = 256
"""Most records one script call appends (longer runs are split into batches)."""

Link = tuple[int, str, str]
"""A stored record's chain fields: ``seq``, ``prev``, ``hash``."""

log = logging.getLogger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")

WRITE_FAILURES = Counter(
    "fairgate_audit_write_failures_total",
    "Audit records that could not be appended to the Redis Stream (still written to stdout)",
)


@dataclass(frozen=True)
class StoredRecord:
    """A stream entry: its Redis id and the record, or why it is not a valid record."""

    stream_id: str
    record: AuditRecord | None
    error: str = ""
    digest: str = ""  # SHA-256 hex of the stored body (the record's canonical body)


class Retention(NamedTuple):
    """How much of the stream the writers keep (``--audit-retention``)."""

    max_records: int = MAXLEN
    max_age: timedelta | None = MAX_AGE

    @classmethod
    def parse(cls, text: str) -> Retention:
        """``45d`` (an age: s, m, h, d or w), ``1000000`` (records) or both,
        comma-separated (``45d,1000000``: whichever keeps fewer); ``none`` for no age
        limit. What is not given keeps its default. Raises ValueError saying how to fix."""
        hint = (f"--audit-retention {text!r}: give an age (45d, 12h, 2w), a record count "
                f"(1000000) or both (45d,1000000); 'none' keeps records of any age")
        age: timedelta | None = MAX_AGE
        records, aged, counted = MAXLEN, False, False
        for part in (p.strip().lower() for p in text.split(",")):
            number, unit = (part, "") if part.isdigit() else (part[:-1], part[-1:])
            if not (part == "none" or (number.isascii() and number.isdigit()
                                       and int(number) > 0 and unit in ("", *_AGE_UNITS))):
                raise ValueError(hint)
            if unit or part == "none":
                if aged:
                    raise ValueError(hint)
                age, aged = (None if part == "none"
                             else timedelta(seconds=int(number) * _AGE_UNITS[unit])), True
            elif counted:
                raise ValueError(hint)
            else:
                records, counted = int(number), True
        return cls(records, age)

    def __str__(self) -> str:
        age = "any age" if self.max_age is None else f"at most {self.max_age} old"
        return f"records {age}, at most {self.max_records:,}"


DEFAULT_RETENTION = Retention()
"""45 days, at most 1,000,000 records (see the module contract)."""
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


class AuditLog:
    """The audit log of one process; safe to share between threads."""

    def __init__(self, client: redis.Redis | None, stream: str = STREAM,
                 maxlen: int = MAXLEN, out: TextIO | None = None,
                 max_age: timedelta | None = MAX_AGE) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen}")
        if max_age is not None and max_age < timedelta(milliseconds=1):
            raise ValueError(f"max_age must be at least 1 ms (or None: any age), got {max_age}")
        self.max_age_ms = 0 if max_age is None else int(max_age / timedelta(milliseconds=1))
        self.client = client
        self.stream = stream
        self.head_key = f"{stream}:head"
        self.maxlen = maxlen
        self.out = out if out is not None else sys.stdout
        self.failures = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._head = ChainHead(0, GENESIS)
        # The stored head as this writer's last append left it (None: not known).
        self._expected: ChainHead | None = None
        self._script = (
            client.register_script(
                resources.files("audit").joinpath("append.lua").read_text(encoding="utf-8")
            )
            if client is not None else None
        )

    def record(self, decision: str, **fields: Any) -> AuditRecord:
        """Append a record (fields as in :class:`AuditRecord`) and return it as stored.

        Redis and stdout failures are reported, never raised; an unknown field or a
        malformed decision (programming errors) raise TypeError / ValueError.
        """
        (stored,) = self.record_many([AuditRecord(decision=decision, **fields)])
        return stored

    def record_many(self, drafts: Iterable[AuditRecord]) -> list[AuditRecord]:
        """Append ``drafts`` in order and return them as stored (the drafts' own
        ``seq``/``prev``/``hash`` are ignored). ``drafts`` is consumed lazily, one batch of
        up to :data:`BATCH` at a time; Redis and stdout failures are reported, never raised.
        A string that is not Unicode text (a lone surrogate) is stored with U+FFFD in its
        place, and a warning is logged.
        """
        stored: list[AuditRecord] = []
        pending = iter(drafts)
        while batch := list(itertools.islice(pending, BATCH)):
            forms = [draft.wire_form() for draft in batch]
            try:
                bodies = [form.body().encode() for form in forms]
            except UnicodeEncodeError:
                batch = [_as_text(draft) for draft in batch]
                forms = [draft.wire_form() for draft in batch]
                bodies = [form.body().encode() for form in forms]
            links = self._append(bodies)
            chained = [draft.with_chain(*link) for draft, link in zip(batch, links, strict=False)]
            chained += [_unchained(draft) for draft in batch[len(links):]]
            self._write_lines([form.line(rec.seq, rec.prev, rec.hash)
                               for form, rec in zip(forms, chained, strict=True)])
            stored += chained
        return stored

    def _append(self, bodies: list[bytes]) -> list[Link]:
        """Chain records with these bodies; the links of those stored, a first part of
        them when Redis failed."""
        digests = [hashlib.sha256(body).hexdigest() for body in bodies]
        script = self._script
        if script is None:
            return self._chain_locally(digests)
        links: list[Link] = []
        while len(links) < len(bodies):
            done = len(links)
            try:
                links += self._call(script, bodies[done:], digests[done:])
            except (redis.RedisError, OSError) as exc:
                self._fail(exc, len(bodies) - done)
                break
        return links

    def _chain_locally(self, digests: list[str]) -> list[Link]:
        with self._lock:
            links = _links(self._head, digests)
            self._head = ChainHead(links[-1][0], links[-1][2])
        return links

    def _call(self, script: Script, bodies: list[bytes], digests: list[str]) -> list[Link]:
        """One script call: appends all of ``bodies``, or a first part of them when the
        chain head is not the one this writer last left."""
        expected = self._expected
        args: list[str | int | bytes] = [self.maxlen, self.max_age_ms]
        if expected is None:
            args += ["", ""]
            for digest, body in zip(digests, bodies, strict=True):
                args += (digest, body, "")
        else:
            args += [expected.seq, expected.hash]
            for digest, body, (_, _, link) in zip(digests, bodies, _links(expected, digests),
                                                  strict=True):
                args += (digest, body, link)
        reply = script(keys=[self.stream, self.head_key], args=args)
        seq, prev = int(reply[0]), _text(reply[1])
        links = []
        for link in map(_text, reply[2:]):
            links.append((seq, prev, link))
            seq, prev = seq + 1, link
        self._expected = ChainHead(seq - 1, prev)
        return links

    def _fail(self, exc: BaseException, records: int) -> None:
        with self._lock:
            self.failures += records
            self.last_error = f"{type(exc).__name__}: {exc}"
        WRITE_FAILURES.inc(records)
        log.warning("%d audit record(s) not stored in Redis stream %s (written to stdout "
                    "only): %s", records, self.stream, exc)

    def _write_lines(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        try:
            with self._lock:
                self.out.write(text)
                self.out.flush()
        except (OSError, ValueError) as exc:
            log.warning("%d audit record(s) not written to stdout: %s", len(lines), exc)

    def head(self) -> ChainHead | None:
        """The chain head stored beside the stream, or None if the chain is empty."""
        return _head_of(self._require_client().hmget(self.head_key, ["seq", "hash", "floor"]))

    def entries(self, start: str = "-", end: str = "+") -> Iterator[StoredRecord]:
        """Stream entries from ``start`` to ``end`` (Redis ids), oldest first, paged."""
        return self._entries_from(self._page(start, end), end)

    def first_id(self) -> str | None:
        """The Redis id of the oldest entry retention left in the stream (None: empty)."""
        page = self._require_client().xrange(self.stream, count=1)
        return _text(page[0][0]) if page else None

    def _entries_from(self, page: list[Any], end: str = "+") -> Iterator[StoredRecord]:
        while True:
            for raw_id, values in page:
                yield parse_entry(raw_id, values)
            if len(page) < PAGE:
                return
            page = self._page("(" + _text(page[-1][0]), end)

    def _page(self, start: str, end: str) -> list[Any]:
        client = self._require_client()
        return list(client.xrange(self.stream, min=start, max=end, count=PAGE) or [])

    def _head_and_first_page(self) -> tuple[ChainHead | None, list[Any]]:
        # One transaction, so that trimming between the two reads cannot fake a gap.
        pipe = self._require_client().pipeline(transaction=True)
        pipe.hmget(self.head_key, ["seq", "hash", "floor"])
        pipe.xrange(self.stream, min="-", max="+", count=PAGE)
        raw, page = pipe.execute()
        return _head_of(raw), list(page)

    def verify(self) -> tuple[VerifyResult, list[StoredRecord]]:
        """Verify the stored chain against its head; also returns the entries checked.

        The head is read first, so records appended while verifying are not counted.
        An entry that is not a valid record fails verification at its position.
        """
        head, first_page = self._head_and_first_page()
        checked: list[StoredRecord] = []
        for entry in self._entries_from(first_page):
            if entry.record is None:
                return _unreadable(entry, checked), checked
            if head is not None and (entry.record.seq or 0) > head.seq:
                break
            checked.append(entry)
        records = [e.record for e in checked if e.record is not None]
        return verify(records, head, [e.digest for e in checked]), checked

    def scan(self) -> ChainScan:
        """A verifying pass over the stream that hands over the bodies (see
        :class:`ChainScan`): what a reader of every record (``fairgate report``) uses."""
        return ChainScan(self)

    def _raw_pages(self) -> tuple[ChainHead | None, Iterator[list[Any]]]:
        """The chain head and the stream's pages of :data:`PAGE` entries as Redis sends
        them (``[id, [field, value, ...]]``, bytes: no per-entry dict). Head and first
        page are read in one transaction (as :meth:`verify` does); each later page is
        requested as soon as the one before arrives, so Redis reads it while the caller
        checks that one."""
        pool = self._require_client().connection_pool
        conn: Any = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands([
                ("MULTI",), ("HMGET", self.head_key, "seq", "hash", "floor"),
                ("XRANGE", self.stream, "-", "+", "COUNT", PAGE), ("EXEC",)]))
            for _ in range(3):  # OK, QUEUED, QUEUED
                conn.read_response(disable_decoding=True)
            raw_head, first = conn.read_response(disable_decoding=True)
            for reply in (raw_head, first):
                if isinstance(reply, Exception):
                    raise reply
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return _head_of(raw_head), self._pages_from(pool, conn, first)

    def _pages_from(self, pool: redis.ConnectionPool, conn: Any,
                    page: list[Any]) -> Iterator[list[Any]]:
        pending = False
        try:
            while True:
                more = len(page) == PAGE
                if more:
                    conn.send_command("XRANGE", self.stream, b"(" + page[-1][0], "+",
                                      "COUNT", PAGE)
                    pending = True
                yield page
                if not more:
                    return
                page = conn.read_response(disable_decoding=True)
                pending = False
        finally:
            if pending:  # a reply not read: the connection is not reusable
                conn.disconnect()
            pool.release(conn)

    def _require_client(self) -> redis.Redis:
        if self.client is None:
            raise RuntimeError("this audit log has no Redis client: records are on stdout only")
        return self.client


class ChainScan:
    """One pass over the stream that verifies the chain as :meth:`AuditLog.verify` does
    and hands over each record's body without keeping the records (constant memory).

    Iterating yields the body of each record (its wire mapping without ``seq``, ``prev``
    and ``hash``: ``class``, ``decision``, ``time``, ``diff``, ...; a fresh dict, the
    caller's), oldest first, once its link is checked, up to the chain head read at the
    start. It ends early at the first record that breaks the chain. Afterwards
    :attr:`result` is :meth:`AuditLog.verify`'s verdict, :attr:`oldest` the ``time`` of
    the first record checked ("" when none). On a broken chain the stream is read again
    by :meth:`AuditLog.verify`, which names the record and why: :attr:`result` and
    :attr:`entries` are its answer (a chain that verifies on that second read was
    changed while it was read, e.g. trimmed past the reader: reported as not verified).
    So a caller must not use the bodies unless :attr:`result` is ok.

    Every record is checked in full: its link (two SHA-256s), its place in the chain,
    and its body (a valid record in canonical form). The body is parsed once, with
    orjson, and its canonical form checked by re-encoding it with orjson and comparing
    bytes; orjson's output equals the canonical form (Python's ``json``) except for
    floats Python writes with an exponent, so a body holding anything that may be such
    a float (or any other entry this fast path does not accept) is checked by
    :func:`parse_entry`, the reference, instead.
    """

    def __init__(self, log: AuditLog) -> None:
        self._log = log
        self.result: VerifyResult | None = None
        self.entries: list[StoredRecord] = []
        self.oldest = ""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        head, pages = self._log._raw_pages()
        check = ChainCheck(head)
        intact = True
        try:
            for page in pages:
                for raw_id, values in page:
                    entry = _fast_entry(values) or _slow_entry(raw_id, values)
                    if entry is None:
                        intact = False
                        break
                    seq, prev, link, digest, body = entry
                    if head is not None and seq > head.seq:
                        break  # appended after the head was read
                    if not check.add(seq, prev, link, digest):
                        intact = False
                        break
                    if not self.oldest:
                        self.oldest = body["time"]
                    yield body
                else:
                    continue
                break
        finally:
            pages.close()  # type: ignore[attr-defined]
        if intact and check.done():
            self.result = check.result()
            return
        self.result, self.entries = self._log.verify()
        if self.result.ok:
            self.result = VerifyResult(
                ok=False, checked=self.result.checked, first_seq=self.result.first_seq,
                last_seq=self.result.last_seq,
                problem="the stream changed while it was read (retention trimmed records "
                        "not yet read?): run again")


_FIELD_ORDER = (b"seq", b"prev", b"hash", b"record")
_TEXT_VALUES = itemgetter("class", "decision", "demand", "name", "namespace", "operation",
                          "reason", "tenant", "time", "uid", "user")
_PLAIN_BODY, _DIFF_BODY = body_keys(with_diff=False), body_keys(with_diff=True)
# Where orjson and Python's json may write a number differently: an exponent, or a
# float below 1e-4 (orjson writes 0.00001, Python 1e-05); they agree on every other
# number. Also matches such text inside strings, which only sends that record to
# parse_entry.
_MAYBE_EXPONENT = re.compile(rb"[:,\[]-?(?:\d+(?:\.\d+)?[eE]|0\.0000)")

Entry = tuple[int, str, str, str, dict[str, Any]]
"""A checked stream entry: ``seq``, ``prev``, ``hash``, the body's digest, the body."""


def _fast_entry(values: list[bytes]) -> Entry | None:
    """The entry as written by :class:`AuditLog`, or None when it is not plainly one
    (then :func:`parse_entry` decides); see :class:`ChainScan`."""
    if len(values) != 8 or values[::2] != list(_FIELD_ORDER):
        return None
    raw = values[7]
    try:
        seq, prev, link = int(values[1]), values[3].decode("ascii"), values[5].decode("ascii")
        body = orjson.loads(raw)
    except (ValueError, UnicodeDecodeError):  # orjson.JSONDecodeError is a ValueError
        return None
    if not _plain_body(body) or orjson.dumps(body, option=orjson.OPT_SORT_KEYS) != raw:
        return None
    latency = body["latency_ms"]
    if latency and not 1e-4 <= abs(latency) < 1e16:
        return None  # Python writes it with an exponent
    # the other numbers are in the diff, which comes before "groups" (keys are sorted)
    if "diff" in body and _MAYBE_EXPONENT.search(raw, 0, raw.rfind(b',"groups":[')):
        return None
    return seq, prev, link, hashlib.sha256(raw).hexdigest(), body


def _plain_body(body: Any) -> bool:
    """Whether ``body`` holds every record field with its declared type and a value the
    record keeps as it is (so its canonical form is its record's body)."""
    if type(body) is not dict:
        return False
    keys = body.keys()
    if keys != _PLAIN_BODY and (keys != _DIFF_BODY or type(body["diff"]) is not dict):
        return False
    groups, latency = body["groups"], body["latency_ms"]
    try:  # str.join takes only strings: a type check of each in C
        "".join(_TEXT_VALUES(body))
        "".join(groups)
    except TypeError:
        return False
    return (type(groups) is list and type(latency) is float and round(latency, 3) == latency
            and len(body["reason"]) <= MAX_TEXT and is_decision(body["decision"]))


def _slow_entry(raw_id: bytes, values: list[bytes]) -> Entry | None:
    """The entry checked by :func:`parse_entry` (None: not a valid record)."""
    stored = parse_entry(raw_id, dict(zip(values[::2], values[1::2], strict=False)))
    record = stored.record
    if record is None or record.seq is None or record.prev is None or record.hash is None:
        return None
    body = record.fields()
    for name in CHAIN_FIELDS:
        del body[name]
    return record.seq, record.prev, record.hash, stored.digest, body


def parse_entry(raw_id: bytes | str, values: Mapping[Any, Any] | None) -> StoredRecord:
    """A stream entry (chain fields + body) as a :class:`StoredRecord`."""
    stream_id = _text(raw_id)
    try:
        fields = {(k.decode() if isinstance(k, bytes) else str(k)):
                  (v.decode() if isinstance(v, bytes) else str(v))
                  for k, v in (values or {}).items()}  # _text, inlined: once per field
    except UnicodeDecodeError:
        return StoredRecord(stream_id, None, "entry is not UTF-8 text")
    missing = [f for f in (*CHAIN_FIELDS, "record") if f not in fields]
    if missing:
        return StoredRecord(stream_id, None, f"entry lacks field(s) {', '.join(missing)}")
    try:
        body = json.loads(fields["record"])
        if not isinstance(body, dict) or set(body) & set(CHAIN_FIELDS):
            raise ValueError("the body must be a JSON object without seq/prev/hash")
        seq = int(fields["seq"])
        record = AuditRecord.from_fields(  # the body comparison below checks types
            {**body, "seq": seq, "prev": fields["prev"], "hash": fields["hash"]}, check=False)
    except ValueError as exc:
        return StoredRecord(stream_id, None, f"not a valid audit record: {exc}")
    if record.body_json() != fields["record"]:
        return StoredRecord(stream_id, None, "not a valid audit record: body is not canonical")
    return StoredRecord(stream_id, record, digest=content_digest(fields["record"]))


def _links(head: ChainHead, digests: list[str]) -> list[Link]:
    """The chain fields of records with these body digests appended after ``head``."""
    links = []
    seq, prev = head.seq, head.hash
    for digest in digests:
        seq += 1
        link = link_hash(seq, prev, digest)
        links.append((seq, prev, link))
        prev = link
    return links


def _as_text(draft: AuditRecord) -> AuditRecord:
    """``draft`` with U+FFFD for the lone surrogates its strings hold (none: itself)."""
    line = draft.to_json()
    try:
        line.encode()
    except UnicodeEncodeError:
        log.warning("audit record %s holds lone surrogates: stored with U+FFFD in their "
                    "place", ascii(line[:200]))
        return AuditRecord.from_json(_SURROGATE.sub("\ufffd", line))
    return draft


def _unchained(draft: AuditRecord) -> AuditRecord:
    if draft.seq is None and draft.prev is None and draft.hash is None:
        return draft
    return draft.with_chain(None, None, None)


def _head_of(raw: list[Any]) -> ChainHead | None:
    if raw[0] is None:
        return None
    return ChainHead(int(raw[0]), _text(raw[1]), int(raw[2] or 1))


def _unreadable(entry: StoredRecord, before: list[StoredRecord]) -> VerifyResult:
    last = before[-1].record if before else None
    seq = (last.seq or 0) + 1 if last is not None else None
    return VerifyResult(
        ok=False, checked=len(before), first_bad=seq, position=len(before),
        problem=f"stream entry {entry.stream_id} ({'seq ' + str(seq) if seq else 'first'})"
                f" is broken: {entry.error}",
    )


def _text(value: bytes | str | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)
