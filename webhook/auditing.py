"""Hand admission decisions to the audit log without making admission wait for it.

Contract: :meth:`AuditWriter.submit` never blocks and never raises: it builds the record
(timed now) and queues it for one background thread that appends records to the
:class:`~audit.AuditLog` in the order they were submitted (so the hash chain follows
decision order). When the queue is full (the log cannot keep up, e.g. Redis hangs) the
record is dropped, counted in ``dropped`` and logged as an error; so is a record the
audit log refuses to build (a programming error). :meth:`AuditWriter.stop` writes what
is queued (bounded by a timeout) before returning.

A record waits at most ``linger`` seconds (default 10 ms) plus two appends before it is
written: the writer, once woken, lets a batch gather for ``linger``, then appends the
records queued by then with :meth:`audit.AuditLog.record_many` (one Redis call and one
stdout write per :data:`APPEND_RECORDS` records); those queued during that append
gather for the next batch (not appended at once as a small batch: a Redis call costs
far more than a record). The queue is a lock-free ``deque``, and a request thread wakes
the writer only when it is idle (waiting for a first record), so under load a decision
costs the request thread one record build and one append, and the writer one wake-up
per batch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from audit import QUOTA_CHANGE, AuditLog, AuditRecord
from tenants.source import ConfigEdit

log = logging.getLogger("fairgate.webhook.audit")

DEFAULT_LINGER_SECONDS = 0.01


def audit_config_edit(audit_log: AuditLog, edit: ConfigEdit) -> None:
    """Record an accepted edit of a ``--config-dir`` file as a ConfigMap edit is recorded:
    ``quota-change`` of the ConfigMap it stands for (no namespace: a local file), its
    changed fields in ``diff``; no user (the file system does not say who wrote it)."""
    audit_log.record(QUOTA_CHANGE, operation=edit.operation, tenant=edit.tenant,
                     name=edit.obj, reason=f"{edit.operation.lower()} accepted (file "
                     f"{edit.file})", diff=edit.diff)
APPEND_RECORDS = 64


class AuditWriter:
    """A bounded queue of audit records drained by one thread into an AuditLog."""

    def __init__(
        self,
        audit_log: AuditLog,
        capacity: int = 10_000,
        linger: float = DEFAULT_LINGER_SECONDS,
    ) -> None:
        """Write into ``audit_log``; hold at most ``capacity`` records not yet written;
        let a batch gather for ``linger`` seconds before each append."""
        self.audit_log = audit_log
        self.capacity = capacity
        self.linger = linger
        self.dropped = 0
        self._items: deque[AuditRecord] = deque()
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._idle = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is None:
            self._stop_requested.clear()
            self._thread = threading.Thread(
                target=self._run, name="fairgate-audit-writer", daemon=True
            )
            self._thread.start()

    def submit(self, decision: str, **fields: Any) -> None:
        """Queue one record (arguments as :meth:`audit.AuditLog.record`)."""
        if len(self._items) >= self.capacity:
            self.dropped += 1
            log.error(
                "audit queue full: record dropped (decision=%s uid=%s); the audit log "
                "cannot keep up", decision, fields.get("uid", ""),
            )
            return
        try:
            record = AuditRecord(decision=decision, **fields)
        except (TypeError, ValueError):
            self.dropped += 1
            log.exception("audit record could not be built (decision=%s)", decision)
            return
        self._items.append(record)
        if self._idle:  # read after the append: see _wait_for_records
            self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Write the queued records (for at most ``timeout`` seconds) and stop the thread."""
        thread = self._thread
        if thread is None:
            return
        self._stop_requested.set()
        self._wake.set()
        thread.join(timeout)
        if thread.is_alive():
            log.error("audit writer still busy after %.0fs at shutdown: %d records lost",
                      timeout, len(self._items))
        self._thread = None

    def _run(self) -> None:
        while not self._stop_requested.is_set():
            self._wait_for_records()
            self._stop_requested.wait(self.linger)  # a batch gathers; ends early at stop
            self._append_queued()
        while self._items:
            self._append_queued()

    def _wait_for_records(self) -> None:
        """Return once a record is queued or stop was requested."""
        while not self._items and not self._stop_requested.is_set():
            self._idle = True
            # A submit that read _idle as False appended before this point: seen here.
            if not self._items:
                self._wake.wait()
            self._wake.clear()
            self._idle = False

    def _append_queued(self) -> None:
        """Append the records queued now, at most :data:`APPEND_RECORDS` per call (so
        the writer never holds the GIL long while request threads wait for it)."""
        pending = len(self._items)
        while pending > 0:
            batch = [self._items.popleft() for _ in range(min(pending, APPEND_RECORDS))]
            pending -= len(batch)
            try:
                self.audit_log.record_many(batch)
            except Exception:  # the writer thread must survive anything
                log.exception("%d audit records could not be written", len(batch))
