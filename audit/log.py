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
- Retention is exact: every script call ends with ``XTRIM MAXLEN <maxlen>``, keeping the
  newest ``maxlen`` records; the head's ``floor`` is the lowest seq retention has not
  removed, so :meth:`AuditLog.verify` can tell trimming from deletion.
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
from importlib import resources
from typing import Any, TextIO

import redis
from prometheus_client import Counter
from redis.commands.core import Script

from audit.chain import (
    CHAIN_FIELDS,
    GENESIS,
    AuditRecord,
    ChainHead,
    VerifyResult,
    content_digest,
    link_hash,
    verify,
)

STREAM = "fairgate:audit"
MAXLEN = 100_000
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


class AuditLog:
    """The audit log of one process; safe to share between threads."""

    def __init__(self, client: redis.Redis | None, stream: str = STREAM,
                 maxlen: int = MAXLEN, out: TextIO | None = None) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be at least 1, got {maxlen}")
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
        args: list[str | int | bytes] = [self.maxlen]
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

    def _require_client(self) -> redis.Redis:
        if self.client is None:
            raise RuntimeError("this audit log has no Redis client: records are on stdout only")
        return self.client


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
