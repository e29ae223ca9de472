"""Audit records and their hash chain.

Contract:
- An :class:`AuditRecord` is one decision: who asked (request uid, user, groups), what
  (operation, tenant, namespace/name, class, demand), the outcome (decision, reason,
  latency) and, for quota changes, a field-level ``diff``. It carries no pod spec, no
  environment values and no secrets: only the fields listed here exist.
- Records are chained: ``seq`` counts from 1 and ``prev`` is the previous record's
  ``hash`` (:data:`GENESIS` for seq 1). ``hash`` is SHA-256 (hex) over
  ``b"<seq>:" + bytes.fromhex(prev) + bytes.fromhex(content)`` where ``content`` is the
  SHA-256 (hex) of the record's *body*: its canonical JSON without ``seq``, ``prev`` and
  ``hash`` (keys sorted, no spaces, UTF-8). So every field is covered and each record
  commits to the one before it; the two-step form lets Redis compute the link inside
  one Lua script (see :mod:`audit.log`) while the body is hashed by the writer.
- The wire form is the canonical JSON of all fields including ``hash``: the stdout line.
  Canonical JSON is, byte for byte, what ``json.dumps(..., sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)`` gives (floats as ``repr``, ``1e+16``,
  ``NaN``), so chains written by any implementation of that form verify.
- :func:`verify` checks a run of records, oldest first, and names the first broken or
  missing one. The record with the lowest seq present is the *anchor*: its ``prev`` is
  trusted, because retention trims the oldest records (so a record removed from the
  start is indistinguishable from one trimmed, unless the head says otherwise). A
  :class:`ChainHead` (kept beside the stream by the writer) additionally reveals records
  removed from the end, and records removed from the start that retention did not
  remove (``floor``). The chain detects edits and removals by anyone who cannot rewrite
  every later record and the head; keep the stdout copies elsewhere to pin the hashes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from json.encoder import encode_basestring
from time import time_ns
from typing import Any, NamedTuple

GENESIS = "0" * 64
"""``prev`` of the very first record of a chain."""

ADMIT = "admit"
QUEUE = "queue"
DENY = "deny"
DISPATCH = "dispatch"
RELEASE = "release"
QUOTA_CHANGE = "quota-change"
START = "start"
PREEMPT = "preempt"
CAPACITY = "capacity"
PRICING = "pricing"
BUDGET = "budget"
OVERRUN = "overrun"
RECLAIM = "reclaim"
CHARGE = "charge"
DECISIONS: tuple[str, ...] = (ADMIT, QUEUE, DENY, DISPATCH, RELEASE, QUOTA_CHANGE, START,
                              PREEMPT, RECLAIM, CAPACITY, PRICING, BUDGET, OVERRUN, CHARGE)
"""The decisions fairgate records; others are allowed if they are lower-case words."""

_DECISION = re.compile(r"^[a-z][a-z-]*$")
_KNOWN_DECISIONS = frozenset(DECISIONS)
MAX_TEXT = 1024
"""The longest ``reason`` kept (longer ones are cut)."""



def is_decision(text: str) -> bool:
    """Whether ``text`` is an allowed ``decision``: one of :data:`DECISIONS` or another
    lower-case word."""
    return text in _KNOWN_DECISIONS or _DECISION.match(text) is not None


# The second utc_now() last formatted, and its text up to the seconds.
_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """The current time in RFC 3339 UTC with milliseconds, e.g. ``2026-01-02T03:04:05.678Z``."""
    global _second
    ms = time_ns() // 1_000_000
    second, prefix = _second
    if ms // 1000 != second:
        second = ms // 1000
        prefix = format_time(datetime.fromtimestamp(second, UTC))[:-5]
        _second = (second, prefix)
    return f"{prefix}.{ms % 1000:03d}Z"


def format_time(when: datetime) -> str:
    """``when`` (timezone-aware) in the record's RFC 3339 UTC form."""
    if when.tzinfo is None:
        raise ValueError("audit times must be timezone-aware (use datetime.now(UTC))")
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """Inverse of :func:`format_time` (any RFC 3339 offset is accepted)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(fields: Mapping[str, Any]) -> str:
    """Canonical JSON: sorted keys, no whitespace, non-ASCII kept as UTF-8."""
    return _ENCODER.encode(fields)


CHAIN_FIELDS = ("seq", "prev", "hash")


def content_digest(body_json: str) -> str:
    """SHA-256 hex of a record body's canonical JSON."""
    return hashlib.sha256(body_json.encode("utf-8")).hexdigest()


def link_hash(seq: int, prev: str, content: str) -> str:
    """The chain hash of record ``seq`` whose body digest is ``content``, after ``prev``.

    Returns "" when ``prev`` or ``content`` is not 64 hex digits (a tampered record).
    """
    try:
        raw = f"{seq}:".encode() + bytes.fromhex(prev) + bytes.fromhex(content)
    except (ValueError, TypeError):
        return ""
    if len(raw) != len(f"{seq}:") + 64:
        return ""
    return hashlib.sha256(raw).hexdigest()


def chain_hash(fields: Mapping[str, Any]) -> str:
    """The ``hash`` a record with these wire ``fields`` must carry ("" if unchainable)."""
    body = {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
    seq, prev = fields.get("seq"), fields.get("prev")
    if not isinstance(seq, int) or not isinstance(prev, str):
        return ""
    return link_hash(seq, prev, content_digest(canonical_json(body)))


@dataclass(frozen=True)
class AuditRecord:
    """One audited decision. ``pod_class`` is ``class`` on the wire.

    ``seq``/``prev``/``hash`` are ``None`` only for a record that could not be stored in
    the chain (Redis unavailable): it is still written to stdout, unchained.
    """

    decision: str
    time: str = field(default_factory=utc_now)
    uid: str = ""
    user: str = ""
    groups: tuple[str, ...] = ()
    operation: str = ""
    tenant: str = ""
    namespace: str = ""
    name: str = ""
    pod_class: str = ""
    demand: str = ""
    reason: str = ""
    latency_ms: float = 0.0
    diff: Mapping[str, Mapping[str, Any]] | None = None
    seq: int | None = None
    prev: str | None = None
    hash: str | None = None

    def __post_init__(self) -> None:
        if not is_decision(self.decision):
            raise ValueError(
                f"audit decision {self.decision!r} must be a lower-case word such as "
                f"{', '.join(DECISIONS)}"
            )
        if type(self.groups) is not tuple:
            object.__setattr__(self, "groups", tuple(self.groups))
        reason = self.reason[:MAX_TEXT]
        if reason is not self.reason:
            object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "latency_ms", round(float(self.latency_ms), 3))
        if self.diff is not None:
            # Plain JSON values only (YAML may hold dates): never fail when serialised.
            object.__setattr__(self, "diff", json.loads(json.dumps(self.diff, default=str)))

    def fields(self) -> dict[str, Any]:
        """The record as its wire mapping (``class`` for ``pod_class``, no ``diff`` if None)."""
        data = {_WIRE_NAMES.get(name, name): getattr(self, name) for name in _FIELD_NAMES}
        data["groups"] = list(self.groups)
        if self.diff is None:
            del data["diff"]
        return data

    def to_json(self) -> str:
        """The record's wire form: canonical JSON including ``hash``."""
        return self.wire_form().line(self.seq, self.prev, self.hash)

    def body_json(self) -> str:
        """The canonical JSON of the record without ``seq``, ``prev`` and ``hash``."""
        return self.wire_form().body()

    def wire_form(self) -> WireForm:
        """This record's canonical JSON, cut where the chain fields go: ``body()`` is
        :meth:`body_json`, ``line(seq, prev, hash)`` the wire form with those chain fields."""
        try:
            return self._usual_wire_form()
        except TypeError:  # a field not of its declared type: the general encoder
            body = {k: v for k, v in self.fields().items() if k not in CHAIN_FIELDS}
            return WireForm(*(_ENCODER.encode({k: body[k] for k in run if k in body})[1:-1]
                              for run in _WIRE_RUNS))

    def _usual_wire_form(self) -> WireForm:
        # Strings, a tuple of strings and a float, encoded as json.dumps does (the same
        # string encoder, float repr); raises TypeError for a value of another type.
        # Every body field, in key order (tests/audit/test_canonical.py checks it).
        q = encode_basestring
        latency = self.latency_ms
        diff = "" if self.diff is None else f',"diff":{_ENCODER.encode(self.diff)}'
        return WireForm(
            f'"class":{q(self.pod_class)},"decision":{q(self.decision)},'
            f'"demand":{q(self.demand)}{diff},"groups":[{",".join(map(q, self.groups))}]',
            f'"latency_ms":'
            f'{float.__repr__(latency) if latency - latency == 0 else _ENCODER.encode(latency)},'
            f'"name":{q(self.name)},"namespace":{q(self.namespace)},'
            f'"operation":{q(self.operation)}',
            f'"reason":{q(self.reason)}',
            f'"tenant":{q(self.tenant)},"time":{q(self.time)},"uid":{q(self.uid)},'
            f'"user":{q(self.user)}',
        )

    def chained(self, seq: int, prev: str) -> AuditRecord:
        """This record as number ``seq`` of a chain after a record whose hash is ``prev``."""
        digest = content_digest(self.body_json())
        return self.with_chain(seq, prev, link_hash(seq, prev, digest))

    def with_chain(self, seq: int | None, prev: str | None, hash: str | None) -> AuditRecord:
        """This record with these chain fields (like ``dataclasses.replace``, without
        validating again the fields it keeps)."""
        record = object.__new__(type(self))
        record.__dict__.update(self.__dict__, seq=seq, prev=prev, hash=hash)
        return record

    @classmethod
    def from_json(cls, text: str | bytes) -> AuditRecord:
        """Parse a wire record; raises ValueError if it is not one (unknown or missing keys)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return cls.from_fields(data)

    @classmethod
    def from_fields(cls, data: Mapping[str, Any], *, check: bool = True) -> AuditRecord:
        """A record from its wire mapping, which must be exactly what :meth:`fields` gives.

        ``check=False`` skips the final comparison of the record's wire form with
        ``data`` (values of the wrong JSON type): for a caller that compares the record's
        :meth:`body_json` with the very text it parsed, which implies it.
        """
        unknown = data.keys() - _KNOWN_KEYS
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        if "decision" not in data:
            raise ValueError("missing key 'decision'")
        values = dict(data)
        values["pod_class"] = values.pop("class", "")
        values["groups"] = tuple(values.get("groups", ()))
        try:
            record = cls(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from exc
        if check and record.to_json() != canonical_json(data):
            raise ValueError("fields have the wrong types")
        return record


_FIELD_NAMES = tuple(f.name for f in fields(AuditRecord))
_KNOWN_KEYS = frozenset(name for name in _FIELD_NAMES if name != "pod_class") | {"class"}
_WIRE_NAMES = {"pod_class": "class"}
_BODY_KEYS = sorted(_WIRE_NAMES.get(name, name) for name in _FIELD_NAMES
                    if name not in CHAIN_FIELDS)
# The body's keys before hash, between hash and prev, prev and seq, and after seq.
_WIRE_RUNS = tuple(
    [key for key in _BODY_KEYS if low < key < high]
    for low, high in itertools.pairwise(("", *sorted(CHAIN_FIELDS), "~"))
)


def body_keys(with_diff: bool) -> frozenset[str]:
    """The keys of a record body (wire names, no chain fields), with or without ``diff``."""
    return frozenset(key for key in _BODY_KEYS if with_diff or key != "diff")


class WireForm(NamedTuple):
    """A record's canonical JSON members, in key order, cut where ``hash``, ``prev`` and
    ``seq`` go (each run without its outer comma)."""

    before_hash: str
    before_prev: str
    before_seq: str
    after_seq: str

    def body(self) -> str:
        """The canonical JSON of the record without its chain fields."""
        return f"{{{self.before_hash},{self.before_prev},{self.before_seq},{self.after_seq}}}"

    def line(self, seq: int | None, prev: str | None, hash: str | None) -> str:
        """The canonical JSON of the record with these chain fields (its wire form)."""
        return (f'{{{self.before_hash},"hash":{_json_value(hash)},{self.before_prev},'
                f'"prev":{_json_value(prev)},{self.before_seq},"seq":{_json_value(seq)},'
                f"{self.after_seq}}}")


def _json_value(value: object) -> str:
    if value is None:
        return "null"
    if type(value) is str:
        return encode_basestring(value)
    if type(value) is int:
        return int.__repr__(value)
    return _ENCODER.encode(value)


@dataclass(frozen=True)
class ChainHead:
    """The writer's view of the chain: last ``seq`` and ``hash``, and the retention ``floor``.

    ``floor`` is the lowest seq that must still be present: retention may have trimmed
    every record below it, never one at or above it.
    """

    seq: int
    hash: str
    floor: int = 1


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`. ``first_bad`` is the seq of the first broken or missing
    record, ``position`` its index in the checked run (None when it is missing from the end)."""

    ok: bool
    checked: int
    first_seq: int | None = None
    last_seq: int | None = None
    first_bad: int | None = None
    position: int | None = None
    problem: str = ""


def _record_hash(record: AuditRecord, digest: str | None = None) -> str:
    """:func:`chain_hash` of ``record``'s fields, from its own canonical body form (or
    that body's known ``digest``)."""
    if not isinstance(record.seq, int) or not isinstance(record.prev, str):
        return ""
    return link_hash(record.seq, record.prev, digest or content_digest(record.body_json()))


class ChainCheck:
    """The rules of :func:`verify` for an intact chain, one record at a time, oldest
    first, in constant memory (a reader need not hold the records it checked).

    :meth:`add` takes a record's chain fields and body digest and returns False at the
    first record that breaks the chain; :meth:`done` (after the last record) whether the
    run ends where ``head`` says. A run this accepts, :func:`verify` accepts; when it
    refuses, :func:`verify` over the same records says which record and why.
    """

    def __init__(self, head: ChainHead | None) -> None:
        self.head = head
        self.checked = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self._last_hash = ""

    def add(self, seq: int, prev: str, hash: str, digest: str) -> bool:
        """Check the next record (``digest``: SHA-256 hex of its canonical body)."""
        if self.first_seq is None:
            floor = max(self.head.floor, 1) if self.head is not None else seq
            if seq > floor or (seq == 1 and prev != GENESIS):
                return False
            self.first_seq = seq
        elif seq != self.first_seq + self.checked or prev != self._last_hash:
            return False
        if hash != link_hash(seq, prev, digest):
            return False
        self.checked += 1
        self.last_seq, self._last_hash = seq, hash
        return True

    def done(self) -> bool:
        """Whether the records added end the chain the head describes (no head: any)."""
        head = self.head
        if head is None:
            return True
        if self.last_seq is None:
            return head.seq <= 0
        return self.last_seq > head.seq or (
            self.last_seq == head.seq and self._last_hash == head.hash)

    def result(self) -> VerifyResult:
        """The outcome of an intact run (call after :meth:`done` returned True)."""
        return VerifyResult(ok=True, checked=self.checked, first_seq=self.first_seq,
                            last_seq=self.last_seq)


def verify(records: Sequence[AuditRecord], head: ChainHead | None = None,
           digests: Sequence[str] | None = None) -> VerifyResult:
    """Check that ``records`` (oldest first) form one unbroken chain; see the module doc.

    ``digests[i]``, when given, is the SHA-256 of ``records[i]``'s canonical body (its
    :meth:`~AuditRecord.body_json`), already computed by the caller (the stored text it
    parsed the record from and checked against that form); "" computes it here.
    """
    check = ChainCheck(head)
    for i, rec in enumerate(records):
        if rec.seq is None or rec.prev is None or rec.hash is None or not check.add(
                rec.seq, rec.prev, rec.hash,
                (digests[i] if digests is not None else "") or content_digest(rec.body_json())):
            return _diagnose(records, head, digests)
    if check.done():
        return check.result()
    return _diagnose(records, head, digests)


def _diagnose(records: Sequence[AuditRecord], head: ChainHead | None,
              digests: Sequence[str] | None) -> VerifyResult:
    """The first broken or missing record of a run :class:`ChainCheck` refused."""
    if not records:
        if head is not None and head.seq > 0:
            return _bad(0, None, None, head.seq, None, f"the chain head is seq {head.seq} "
                        "but no records are present: they were removed")
        return VerifyResult(ok=True, checked=0)
    positions: dict[int, int] = {}
    for i, rec in enumerate(records):
        if rec.seq is not None:
            positions.setdefault(rec.seq, i)
    if not positions:
        return _bad(0, None, None, None, 0, "the records are unchained (no seq)")
    first = min(positions)
    last = records[-1].seq
    if head is not None and first > max(head.floor, 1):
        floor = max(head.floor, 1)
        return _bad(0, first, last, floor, 0,
                    f"{_span(floor, first - 1)} missing: retention only removes records "
                    f"below seq {floor}")
    previous: AuditRecord | None = None
    for i, rec in enumerate(records):
        expected = first + i
        if rec.seq != expected:
            return _misplaced(records, i, expected, positions, first, last)
        if rec.hash != _record_hash(rec, digests[i] if digests is not None else None):
            return _bad(i, first, last, expected, i,
                        f"seq {expected} was edited: its hash does not match its content")
        if previous is None:
            if expected == 1 and rec.prev != GENESIS:
                return _bad(i, first, last, 1, i, "seq 1 does not start from the genesis hash")
        elif rec.prev != previous.hash:
            return _bad(i, first, last, expected - 1, i - 1,
                        f"seq {expected - 1} was replaced: seq {expected} chains to a "
                        f"different hash (or its own prev was rewritten)")
        previous = rec
    if head is not None:
        assert previous is not None and previous.seq is not None
        if previous.seq < head.seq:
            return _bad(len(records), first, last, previous.seq + 1, None,
                        f"{_span(previous.seq + 1, head.seq)} missing from the end: the "
                        f"chain head is seq {head.seq}")
        if previous.seq == head.seq and previous.hash != head.hash:
            return _bad(len(records) - 1, first, last, head.seq, len(records) - 1,
                        f"seq {head.seq} does not match the chain head's hash: it was replaced")
    return VerifyResult(ok=True, checked=len(records), first_seq=first, last_seq=last)


def _misplaced(records: Sequence[AuditRecord], i: int, expected: int,
               positions: Mapping[int, int], first: int, last: int | None) -> VerifyResult:
    found = records[i].seq
    where = positions.get(expected)
    if found is None:
        what = f"an unchained record stands where seq {expected} belongs"
    elif positions[found] < i:
        what = f"seq {found} appears twice (again where seq {expected} belongs)"
    elif where is None:
        what = f"seq {expected} is missing (found seq {found} in its place)"
    else:
        what = f"seq {expected} is out of order (found seq {found} in its place)"
    return _bad(i, first, last, expected, i, what)


def _span(low: int, high: int) -> str:
    return f"seq {low} is" if low == high else f"seqs {low} to {high} are"


def _bad(checked: int, first: int | None, last: int | None, seq: int | None,
         position: int | None, problem: str) -> VerifyResult:
    return VerifyResult(ok=False, checked=checked, first_seq=first, last_seq=last,
                        first_bad=seq, position=position, problem=problem)
