"""Hand admission decisions to the audit log without making admission wait for it.

Contract: :meth:`AuditWriter.submit` never blocks and never raises: it queues the record
for one background thread that appends records to the :class:`~audit.AuditLog` in the
order they were submitted (so the hash chain follows decision order). When the queue is
full (the log cannot keep up, e.g. Redis hangs) the record is dropped, counted in
``dropped`` and logged as an error. :meth:`AuditWriter.stop` writes what is queued
(bounded by a timeout) before returning.

The queue is a lock-free ``deque``; the writer is woken at most once per batch it
drains (not once per record), which keeps the request threads' cost per decision to an
append.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from audit import AuditLog

log = logging.getLogger("fairgate.webhook.audit")

_Item = tuple[str, dict[str, Any]]


class AuditWriter:
    """A bounded queue of audit records drained by one thread into an AuditLog."""

    def __init__(self, audit_log: AuditLog, capacity: int = 10_000) -> None:
        """Write into ``audit_log``; hold at most ``capacity`` records not yet written."""
        self.audit_log = audit_log
        self.capacity = capacity
        self.dropped = 0
        self._items: deque[_Item] = deque()
        self._pending = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is None:
            self._stopping = False
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
        self._items.append((decision, fields))
        if not self._pending.is_set():
            self._pending.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Write the queued records (for at most ``timeout`` seconds) and stop the thread."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._pending.set()
        thread.join(timeout)
        if thread.is_alive():
            log.error("audit writer still busy after %.0fs at shutdown: %d records lost",
                      timeout, len(self._items))
        self._thread = None

    def _run(self) -> None:
        while True:
            self._pending.wait()
            self._pending.clear()
            while self._items:
                decision, fields = self._items.popleft()
                try:
                    self.audit_log.record(decision, **fields)
                except Exception:  # the writer thread must survive a bad record
                    log.exception("audit record could not be written (decision=%s)", decision)
            if self._stopping:
                return
