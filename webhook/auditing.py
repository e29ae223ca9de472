"""Hand admission decisions to the audit log without making admission wait for it.

Contract: :meth:`AuditWriter.submit` never blocks and never raises: it queues the record
for one background thread that appends records to the :class:`~audit.AuditLog` in the
order they were submitted (so the hash chain follows decision order). When the queue is
full (the log cannot keep up, e.g. Redis hangs) the record is dropped, counted in
``dropped`` and logged as an error. :meth:`AuditWriter.stop` writes what is queued
(bounded by a timeout) before returning.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from audit import AuditLog

log = logging.getLogger("fairgate.webhook.audit")

_Item = tuple[str, dict[str, Any]]
_STOP = None


class AuditWriter:
    """A bounded queue of audit records drained by one thread into an AuditLog."""

    def __init__(self, audit_log: AuditLog, capacity: int = 10_000) -> None:
        """Write into ``audit_log``; hold at most ``capacity`` records not yet written."""
        self.audit_log = audit_log
        self.dropped = 0
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="fairgate-audit-writer", daemon=True
            )
            self._thread.start()

    def submit(self, decision: str, **fields: Any) -> None:
        """Queue one record (arguments as :meth:`audit.AuditLog.record`)."""
        try:
            self._queue.put_nowait((decision, fields))
        except queue.Full:
            self.dropped += 1
            log.error(
                "audit queue full: record dropped (decision=%s uid=%s); the audit log "
                "cannot keep up", decision, fields.get("uid", ""),
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Write the queued records (for at most ``timeout`` seconds) and stop the thread."""
        thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.error("audit queue still full at shutdown: queued records are lost")
            return
        thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            decision, fields = item
            try:
                self.audit_log.record(decision, **fields)
            except Exception:  # the writer thread must survive a bad record
                log.exception("audit record could not be written (decision=%s)", decision)
