"""What each console page shows, as JSON-ready data (the ``/api/`` answers).

Contract:
- Every method takes the :class:`~webhook.console.access.Viewer` and returns only data
  of tenants it :meth:`~webhook.console.access.Viewer.sees`; nothing else about other
  tenants (not their names, counts or records) is in the answer.
- :meth:`ConsoleData.tenants`: the rows of ``fairgate status`` (``fairshare.status``,
  the same computation, shared between requests by :meth:`ConsoleData.status`) plus
  ``ceiling`` (from the config, null when unknown) and ``used_nominal`` (used -
  borrowed), filtered by ``q`` (substring of the name) and paginated by name; and
  ``reclaim``, the reclaim lines of ``fairgate status``
  (:func:`fairshare.status.reclaim_lines`) without the reclaims that name a tenant the
  viewer does not see.
- :meth:`ConsoleData.queue`: every waiting queue entry of the visible tenants, grouped by
  tenant (by name), then by lane (shape), FIFO within a lane, paginated; each pod row says
  what ``fairgate why`` says (:func:`fairshare.status.status_why`), with ``position`` /
  ``queue_length`` among its tenant's pods of its class and ``waited_seconds``; every row
  has its lane's ``shape`` and ``shape_text``, that in words (``1 GPU training + 3 GPUs
  borrowed``). A complete
  gang waiting as one entry is one row (``gang``, ``members``, ``source``: where it was
  declared, e.g. ``Indexed Job trainer``, null when the queue was not told; its
  ``class`` and ``waited_seconds`` since its first member was created), its ``why``
  naming it with the queue's counts (``gang of Indexed Job trainer: 4 of 4 pods
  created, released together (<shape_text>), waiting for ...``). Gang members still waiting for
  their gang to be complete are not listed (``fairgate why`` and ``fairgate status``
  explain them). Filters:
  ``tenant``, ``namespace``: exactly the entries whose pods are in the namespace, read
  from the lanes of the tenants the :class:`~webhook.console.namespaces.NamespaceIndex`
  names for it (every lane while it has not scanned yet, or without one).
- :meth:`ConsoleData.fairness`: per visible tenant (paginated) its used and entitlement
  over the last ``hours`` from :class:`~webhook.console.history.FairnessHistory`, and
  Jain's index over time (everything-viewers only: it is about all tenants).
- :meth:`ConsoleData.audit`: the newest records (newest first) of visible tenants
  matching ``q`` (substring of the record's JSON as shown to the viewer, after
  :class:`~webhook.console.access.Redactor` hid what it may not read, ASCII letters
  case-insensitive: decision, tenant, namespace, name, user, groups, reason, class,
  demand, request uid, time, diff) and
  ``decision``; at most ``limit``, scanning at most
  ``scan`` stream entries; with the chain's verification status (:meth:`verify`, cached
  for ``verify_ttl`` seconds; the detail of a broken chain only for everything-viewers).
- :meth:`ConsoleData.cost`: this month's bill from ``fairgate report``'s engine
  (:func:`cost.billing.bill` over the verified audit log), the viewer's tenants only.
- Redis errors propagate (the app answers 503 saying which Redis failed).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis

from audit import AuditLog, VerifyResult
from audit.chain import CHAIN_FIELDS, canonical_json
from audit.log import parse_entry
from cost.billing import Bill, bill_bodies
from cost.report import month_start
from fairshare.queue.calls import shape_in_words
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GangRecord, TicketStatus, gang_name
from fairshare.status import reclaim_lines, status_report, status_why
from tenants.models import FairgateConfig
from tenants.resources import SLICES_PER_GPU, format_counts
from webhook.console.access import Redactor, Viewer
from webhook.console.history import FairnessHistory
from webhook.console.namespaces import NamespaceIndex

TENANTS_PER_PAGE = 100
QUEUE_PER_PAGE = 50
CHARTS_PER_PAGE = 10
AUDIT_LIMIT = 100
AUDIT_SCAN = 20_000


def pages(total: int, per_page: int) -> int:
    """How many pages ``total`` items fill (at least 1)."""
    return max(1, math.ceil(total / per_page))


class ConsoleData:
    """The console's queries over one Redis (thread-safe)."""

    def __init__(self, client: redis.Redis, queue: FairQueue, history: FairnessHistory,
                 config: Callable[[], FairgateConfig | None] = lambda: None,
                 audit: AuditLog | None = None, verify_ttl: float = 30.0,
                 generation: Callable[[], int] | None = None,
                 status_ttl: float = 5.0, namespaces: NamespaceIndex | None = None) -> None:
        self.client = client
        self.namespaces = namespaces
        self.queue = queue
        self.history = history
        self.config = config
        self.audit_log = audit or AuditLog(client)
        self.verify_ttl = verify_ttl
        self._verify_lock = threading.Lock()
        self._verified: tuple[float, dict[str, Any]] | None = None
        self._cost_lock = threading.Lock()
        self._billed: tuple[float, Bill | str] | None = None
        self.generation = generation
        self.status_ttl = status_ttl
        self._status_lock = threading.Lock()
        self._status: tuple[int, float, dict[str, Any]] | None = None

    # -- tenants -------------------------------------------------------------------

    def tenants(self, viewer: Viewer, q: str = "", page: int = 1,
                per_page: int = TENANTS_PER_PAGE) -> dict[str, Any]:
        """The Tenants page (see the module contract)."""
        report = self.status()
        config = self.config()
        names = [n for n in sorted(viewer.visible(report["tenants"])) if q in n]
        shown = names[(page - 1) * per_page: page * per_page]
        rows = []
        for name in shown:
            row = dict(report["tenants"][name])
            tenant = config.tenant(name) if config is not None else None
            row["name"] = name
            row["ceiling"] = (round(tenant.ceiling_slices / SLICES_PER_GPU, 2)
                              if tenant is not None else None)
            row["used_nominal"] = round(row["used"] - row["borrowed"], 2)
            row["nominal_demand"] = format_counts(row["nominal"])
            rows.append(row)
        answer: dict[str, Any] = {
            "capacity": report["capacity"],
            "jain_index": report["jain_index"],
            "held": [h for h in report["held"] if viewer.sees(h["tenant"])],
            "reclaim": reclaim_lines(report["reclaim"],
                                     None if viewer.everything else viewer.sees),
            "tenants": rows,
            "total": len(names),
            "page": page,
            "pages": pages(len(names), per_page),
        }
        if viewer.everything:
            answer["capacity_notes"] = report["capacity_notes"]
        return answer

    def status(self) -> dict[str, Any]:
        """The ``fairgate status`` report, shared by every request until the next audit
        record (``generation`` changes: every queue change is audited) and at most
        ``status_ttl`` seconds (capacity changes are not audited); without
        ``generation``, computed per call."""
        if self.generation is None:
            return status_report(self.queue)
        with self._status_lock:
            generation, now = self.generation(), time.monotonic()
            cached = self._status
            if cached is not None and cached[0] == generation and \
                    now - cached[1] < self.status_ttl:
                return cached[2]
            report = status_report(self.queue)
            self._status = (generation, now, report)
            return report

    # -- queue ---------------------------------------------------------------------

    def queue_page(self, viewer: Viewer, tenant: str | None = None,
                   namespace: str | None = None, page: int = 1,
                   per_page: int = QUEUE_PER_PAGE, now: float | None = None) -> dict[str, Any]:
        """The Queue page (see the module contract)."""
        at = time.time() if now is None else now
        known = self.queue.tenant_names()
        scope = viewer.visible(known)
        if tenant:
            scope = [t for t in scope if t == tenant]
        if namespace and (owners := self._owners(namespace)) is not None:
            scope = [t for t in scope if t in owners]
        lanes = self.queue.lanes(scope)
        start = (page - 1) * per_page
        if namespace:
            entries = self._entries_in(lanes, namespace)
            total = len(entries)
            chosen = entries[start: start + per_page]
        else:
            total = sum(n for _t, _s, n in lanes)
            chosen = self._slice(lanes, start, per_page)
        gangs = [entry[1:] for _t, _s, entry in chosen if entry.startswith("@")]
        members = dict(zip(gangs, self.queue.gang_members(gangs), strict=True))
        records = dict(zip(gangs, self.queue.gangs(gangs), strict=True))
        tickets = [entry for _t, _s, entry in chosen if not entry.startswith("@")]
        tickets += [m for gang in gangs for m in members[gang]]
        statuses = dict(zip(tickets, self.queue.ticket_statuses(tickets, at), strict=True))
        rows = [self._gang_row(t, shape, entry[1:],
                               [statuses.get(m) for m in members[entry[1:]]], at,
                               records.get(entry[1:]))
                if entry.startswith("@") else self._row(statuses.get(entry), shape, at)
                for t, shape, entry in chosen]
        redactor = self.redactor(viewer, known)
        for row in rows:
            if row is not None:
                row["why"] = redactor.text(row["why"])
                if row.get("waiting_for"):
                    row["waiting_for"] = redactor.text(row["waiting_for"])
        return {"total": total, "page": page, "pages": pages(total, per_page),
                "rows": [r for r in rows if r is not None]}

    def _owners(self, namespace: str) -> frozenset[str] | None:
        """The tenants whose lanes may hold entries of ``namespace``: those the index
        names, plus its owner in the config (its pods queue there before their audit
        records reach the index); None (every tenant) before the index has scanned."""
        if self.namespaces is None or self.namespaces.tenants(namespace) is None:
            return None
        return self.namespace_tenants(namespace)

    def namespace_tenants(self, namespace: str) -> frozenset[str] | None:
        """The tenants ``namespace`` belongs to, as far as the index and the config's
        namespace labels know (None: neither knows it)."""
        known = self.namespaces.tenants(namespace) if self.namespaces is not None else None
        config = self.config()
        owner = config.tenant_of_namespace(namespace) if config is not None else None
        if owner:
            return (known or frozenset()) | {owner}
        return known

    def redactor(self, viewer: Viewer, tenants: list[str] | None = None) -> Redactor:
        """What ``viewer`` may read of free text (``tenants``: every tenant's name,
        default the queue's)."""
        if viewer.everything:
            return Redactor(viewer, ())
        known = self.queue.tenant_names() if tenants is None else tenants
        return Redactor(viewer, known, self.namespace_tenants)

    def _slice(self, lanes: list[tuple[str, str, int]], start: int,
               count: int) -> list[tuple[str, str, str]]:
        chosen: list[tuple[str, str, str]] = []
        offset = 0
        for tenant, shape, length in lanes:
            if offset + length <= start:
                offset += length
                continue
            first = max(0, start - offset)
            last = min(length, first + count - len(chosen)) - 1
            chosen += [(tenant, shape, e)
                       for e in self.queue.lane_entries(tenant, shape, first, last)]
            offset += length
            if len(chosen) >= count:
                break
        return chosen

    def _entries_in(self, lanes: list[tuple[str, str, int]],
                    namespace: str) -> list[tuple[str, str, str]]:
        everything = [(t, s, e) for t, s, _n in lanes
                      for e in self.queue.lane_entries(t, s, 0, -1)]
        tickets = [e for _t, _s, e in everything if not e.startswith("@")]
        spaces = dict(zip(tickets, self.queue.ticket_namespaces(tickets), strict=True))
        return [(t, s, e) for t, s, e in everything
                if (e[1:].split("/", 1)[0] if e.startswith("@") else spaces[e]) == namespace]

    @staticmethod
    def _gang_row(tenant: str, shape: str, gang: str, members: list[TicketStatus | None],
                  now: float, record: GangRecord | None = None) -> dict[str, Any]:
        """A complete gang's row: its class is its members' (one class per gang), it has
        waited since its first member was created; it is named by where it was declared
        with the queue's counts (``record``)."""
        known = [m for m in members if m is not None]
        said = record.describe() if record is not None else gang_name(gang, "")
        words = shape_in_words(shape)
        return {"pod": gang, "gang": gang, "tenant": tenant, "shape": shape,
                "shape_text": words,
                "class": known[0].pod_class if known else None,
                "members": len(members),
                "source": record.source or None if record is not None else None,
                "waited_seconds": round(max(0.0, now - min(m.submitted_at for m in known)), 1)
                if known else None,
                "why": f"{said}, released together ({words}), waiting for "
                       + next((m.waiting_for for m in known if m.waiting_for),
                              "its release as one entry")}

    @staticmethod
    def _row(status: TicketStatus | None, shape: str, now: float) -> dict[str, Any] | None:
        if status is None:  # released or forgotten since the lanes were read
            return None
        report = status_why(status, f"{status.namespace}/{status.name}")
        return {
            "pod": report.pod, "tenant": status.tenant, "class": status.pod_class,
            "band": status.band, "demand": report.demand, "shape": shape,
            "shape_text": shape_in_words(shape), "position": report.position,
            "queue_length": report.queue_length, "waiting_for": report.waiting_for,
            "waited_seconds": round(max(0.0, now - status.submitted_at), 1),
            "why": report.summary, "verdict": report.verdict, "gang": status.group,
        }

    # -- fairness ------------------------------------------------------------------

    def fairness(self, viewer: Viewer, hours: float = 6.0, tenant: str | None = None,
                 page: int = 1, per_page: int = CHARTS_PER_PAGE,
                 now: float | None = None) -> dict[str, Any]:
        """The Fairness page (see the module contract)."""
        at = time.time() if now is None else now
        since = at - hours * 3600
        names = viewer.visible(self.queue.tenant_names())
        if tenant:
            names = [n for n in names if n == tenant]
        shown = names[(page - 1) * per_page: page * per_page]
        answer: dict[str, Any] = {
            "since": since, "until": at, "hours": hours,
            "interval_seconds": self.history.interval,
            "series": self.history.series(shown, since),
            "total": len(names), "page": page, "pages": pages(len(names), per_page),
        }
        if viewer.everything:
            answer["jain_index"] = self.history.jain(since)
        return answer

    # -- audit ---------------------------------------------------------------------

    def audit(self, viewer: Viewer, q: str = "", decision: str | None = None,
              limit: int = AUDIT_LIMIT, scan: int = AUDIT_SCAN) -> dict[str, Any]:
        """The Audit page (see the module contract). ``q`` is matched against the record
        as shown (redacted), so that a search tells nothing the shown records do not."""
        needle = q.lower().encode()
        redactor = self.redactor(viewer)
        found: list[dict[str, Any]] = []
        scanned = 0
        cursor = "+"
        while len(found) < limit and scanned < scan:
            page: list[Any] = list(
                self.client.xrevrange(self.audit_log.stream, max=cursor, count=1000) or [])
            if not page:
                break
            for raw_id, values in page:
                scanned += 1
                # Nothing is redacted for an everything-viewer: the stored body is what
                # is shown, so the needle can be looked for before parsing.
                if not _candidate(values.get(b"record"), viewer,
                                  needle if viewer.everything else b"", decision):
                    continue
                record = parse_entry(raw_id, values).record
                if record is None or not viewer.sees(record.tenant):
                    continue
                if decision and record.decision != decision:
                    continue
                fields = redactor.record(record.fields())
                if needle and not viewer.everything and needle not in search_text(fields):
                    continue
                found.append(fields)
                if len(found) >= limit:
                    break
            last = page[-1][0]
            cursor = "(" + (last.decode() if isinstance(last, bytes) else str(last))
            if len(page) < 1000:
                break
        return {"records": found, "scanned": scanned, "chain": self.chain_status(viewer)}

    def chain_status(self, viewer: Viewer) -> dict[str, Any]:
        """The last verification of the audit chain (run now when none is fresh)."""
        status = self.verify()
        if viewer.everything or status["ok"]:
            return status
        return {"ok": False, "checked_at": status["checked_at"],
                "summary": "the audit chain does not verify: a platform admin can see where "
                           "(fairgate audit verify)"}

    def verify(self, force: bool = False) -> dict[str, Any]:
        """Verify the chain at most once per ``verify_ttl`` seconds (``force``: now)."""
        with self._verify_lock:
            now = time.time()
            if not force and self._verified is not None and \
                    now - self._verified[0] < self.verify_ttl:
                return self._verified[1]
            result, _entries = self.audit_log.verify()
            status = _chain_json(result, now)
            self._verified = (now, status)
            return status

    # -- cost ----------------------------------------------------------------------

    def cost(self, viewer: Viewer, now: datetime | None = None) -> dict[str, Any]:
        """The Cost page: this calendar month (UTC) so far, billed by ``fairgate report``'s
        engine from the verified audit log at the config's prices (computed at most once
        per ``verify_ttl`` seconds). A tenant viewer gets its tenants' rows only; totals
        and the cluster's idle hours go to everything-viewers. A chain that does not
        verify is not billed (``available`` false, saying why)."""
        with self._cost_lock:
            moment = now or datetime.now(UTC)
            if now is not None or self._billed is None or \
                    time.time() - self._billed[0] >= self.verify_ttl:
                self._billed = (time.time(), self._bill(moment))
            billed = self._billed[1]
        if isinstance(billed, str):
            return {"available": False, "message": billed}
        answer: dict[str, Any] = {
            "available": True, "since": billed.to_json()["since"],
            "until": billed.to_json()["until"], "currency": billed.currency,
            "rows": [row.to_json() for row in billed.rows if viewer.sees(row.tenant)],
        }
        if viewer.everything:
            answer.update(totals=billed.totals().to_json(),
                          idle_gpu_hours=billed.idle_gpu_hours, idle_cost=billed.idle_cost)
        return answer

    def _bill(self, now: datetime) -> Bill | str:
        """This month's bill, or why there is none."""
        start = month_start(now)
        if now <= start:
            return "no bill yet: this month has just begun"
        config = self.config()
        pricing = config.platform.pricing if config is not None else None
        scan = self.audit_log.scan()
        billed = bill_bodies(scan, start, now, pricing)
        if scan.result is None or not scan.result.ok:
            problem = scan.result.problem if scan.result is not None else "not read"
            return (f"no bill: the audit log does not verify ({problem}); "
                    "`fairgate audit verify` shows where")
        return billed


def search_text(fields: dict[str, Any]) -> bytes:
    """What ``q`` is looked for in: the shown record's body as canonical JSON (as the
    stream stores it), ASCII letters lower-cased."""
    body = {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
    return canonical_json(body).encode().lower()


def _candidate(raw: bytes | None, viewer: Viewer, needle: bytes,
               decision: str | None) -> bool:
    """Whether a stream entry's record body may match, read without validating it (the
    few that may are then parsed and checked in full): ``needle`` in its JSON text, its
    ``decision`` and, for a tenant viewer, its ``tenant``."""
    if raw is None:
        return True  # not a valid record: parse_entry says so
    if needle and needle not in raw.lower():  # ASCII letters fold; UTF-8 stays as typed
        return False
    if decision is None and viewer.everything:
        return True
    try:
        body = json.loads(raw)
    except ValueError:
        return True
    if not isinstance(body, dict):
        return True
    if decision and body.get("decision") != decision:
        return False
    return viewer.everything or viewer.sees(str(body.get("tenant", "")))


def _chain_json(result: VerifyResult, now: float) -> dict[str, Any]:
    if result.ok:
        summary = (f"verified: {result.checked} records (seq {result.first_seq} to "
                   f"{result.last_seq})" if result.checked else "verified: no records yet")
    else:
        summary = f"BROKEN at seq {result.first_bad}: {result.problem}"
    return {"ok": result.ok, "checked": result.checked, "first_seq": result.first_seq,
            "last_seq": result.last_seq, "first_bad": result.first_bad,
            "summary": summary, "checked_at": now}
