"""Select audit records: by tenant, decision, user and time.

Contract: :class:`AuditFilter` is pure; :func:`parse_when` reads the CLI's ``--since`` /
``--until`` values (RFC 3339, a date, or an age such as ``15m``, ``2h``, ``7d``) and
raises ValueError saying what it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from audit.chain import AuditRecord, parse_time

_AGE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
CLOCK_SKEW = timedelta(minutes=5)
"""How far the writer's clock may run ahead of the Redis server's."""


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """A point in time from RFC 3339, ``YYYY-MM-DD`` (UTC midnight) or an age before ``now``."""
    value = text.strip()
    age = _AGE.match(value)
    if age:
        delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
        return (now or datetime.now(UTC)) - delta
    try:
        when = parse_time(value) if "T" in value or "t" in value else None
        if when is None:
            when = datetime.fromisoformat(value).replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(
            f"cannot read time {text!r}: use RFC 3339 (2026-01-31T12:00:00Z), a date "
            f"(2026-01-31, UTC) or an age such as 30s, 15m, 2h, 7d, 1w"
        ) from None
    return when


@dataclass(frozen=True)
class AuditFilter:
    """Which records to keep; every given criterion must match (None matches anything)."""

    tenant: str | None = None
    decision: str | None = None
    user: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, record: AuditRecord) -> bool:
        """Whether ``record`` meets every criterion (times inclusive)."""
        if self.tenant is not None and record.tenant != self.tenant:
            return False
        if self.decision is not None and record.decision != self.decision:
            return False
        if self.user is not None and record.user != self.user:
            return False
        if self.since is None and self.until is None:
            return True
        when = parse_time(record.time)
        if self.since is not None and when < self.since:
            return False
        return self.until is None or when <= self.until

    def select(self, records: Iterable[AuditRecord]) -> Iterator[AuditRecord]:
        """The matching records, in order."""
        return (r for r in records if self.matches(r))

    def stream_start(self) -> str:
        """The Redis stream id from which candidates can appear: a record is stored after
        its decision, so ``since`` (less :data:`CLOCK_SKEW`) bounds it; ``until`` cannot."""
        return "-" if self.since is None else _ms_id(self.since - CLOCK_SKEW)


def _ms_id(when: datetime) -> str:
    return str(max(0, int(when.timestamp() * 1000)))
