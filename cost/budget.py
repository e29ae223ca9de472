"""Month-to-date spend per tenant from the audit stream, for budgets (the dispatcher's).

Contract: :class:`AuditSpend` is a :class:`fairshare.queue.budget.SpendSource`. Each call of
:meth:`AuditSpend.spent` reads the records appended to the stream since its last call
(so a pass costs the new records, not the whole stream), keeps those billing reads, and
bills the window with :func:`cost.billing.bill`: the same computation, on the same
records, as ``fairgate report``. Records retention trimmed from the stream are dropped
here too, and so are those of pods released before the window (they bill nothing in
it): memory holds about a month of pods, whatever the retention. The stream is not
verified on every pass (``fairgate report`` and ``fairgate audit verify`` do that); a
record that does not parse is skipped. Nothing is kept but the stream: a restarted
dispatcher reads it again and arrives at the same spend.
"""

from __future__ import annotations

from datetime import datetime

from audit import ADMIT, CHARGE, DISPATCH, PREEMPT, PRICING, QUOTA_CHANGE, RELEASE, START
from audit.chain import AuditRecord, parse_time
from audit.log import AuditLog
from cost.billing import bill
from tenants.models import PricingSpec

BILLED = frozenset({ADMIT, DISPATCH, START, RELEASE, PREEMPT, PRICING, QUOTA_CHANGE, CHARGE})
"""The decisions :func:`cost.billing.bill` reads for cost (capacity only feeds idle)."""


class AuditSpend:
    """Month-to-date spend per tenant from an :class:`AuditLog`'s stream, read
    incrementally."""

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self._records: list[tuple[str, AuditRecord]] = []  # (stream id, record)
        self._last = "-"

    def spent(self, since: datetime, until: datetime,
              pricing: PricingSpec | None) -> tuple[dict[str, float], str]:
        """Cost per tenant of ``[since, until)`` (empty when the window is) and the
        currency in effect at its end."""
        self._read()
        self._forget_before(since)
        if until <= since:
            return {}, pricing.currency if pricing is not None else "USD"
        billed = bill((record for _, record in self._records), since, until, pricing)
        cost: dict[str, float] = {}
        for row in billed.rows:
            cost[row.tenant] = cost.get(row.tenant, 0.0) + row.cost
        return cost, billed.currency

    def kept(self) -> int:
        """How many records it holds (those billing reads, still in the stream)."""
        return len(self._records)

    def _read(self) -> None:
        start = "-" if self._last == "-" else "(" + self._last
        for entry in self.log.entries(start):
            self._last = entry.stream_id
            record = entry.record
            if record is not None and record.decision in BILLED:
                self._records.append((entry.stream_id, record))
        self._forget_trimmed()

    def _forget_before(self, since: datetime) -> None:
        """Drop the records of pods released before ``since``: they bill nothing from
        then on (so memory holds about a month of pods, whatever the retention)."""
        ended = {record.uid for _, record in self._records
                 if record.decision == RELEASE and parse_time(record.time) < since}
        if ended:
            self._records = [(i, r) for i, r in self._records
                             if r.decision in (PRICING, QUOTA_CHANGE) or r.uid not in ended]

    def _forget_trimmed(self) -> None:
        """Drop the records retention removed from the stream (the report has none)."""
        if not self._records:
            return
        first = self.log.first_id()
        if first is None:
            self._records.clear()
            return
        keep = 0
        while keep < len(self._records) and _older(self._records[keep][0], first):
            keep += 1
        if keep:
            del self._records[:keep]


def _older(stream_id: str, than: str) -> bool:
    """Whether the Redis stream id ``stream_id`` comes before ``than``."""
    ms, _, seq = stream_id.partition("-")
    other_ms, _, other_seq = than.partition("-")
    return (int(ms), int(seq or 0)) < (int(other_ms), int(other_seq or 0))
