"""Which tenants have queue entries in a namespace, known without reading the queue.

The Queue page's namespace filter reads only the lanes of the tenants this index names,
then keeps the entries whose ticket is in the namespace: exact as long as the index names
every tenant with an entry there (a superset is fine; extra tenants cost a read).

Contract:
- :meth:`NamespaceIndex.tenants`: the tenants that may have entries in ``namespace``
  (every tenant of a ticket record in it: queued, reserved or running; a complete gang
  waits in its members' namespace and tenant), or None until the first :meth:`scan`
  has finished (the caller reads every lane then).
- :meth:`scan` reads every ticket record
  (:meth:`fairshare.queue.fairqueue.FairQueue.namespace_tenants`, ``HSCAN`` in chunks),
  then the audit records appended while it read (a record written during the read may
  be missing from it, but its admission's audit record is appended after it), and
  replaces the index with that: namespaces whose records are all gone drop out.
- :meth:`learn` adds one audit record's tenant and namespace: every admission is audited
  right after its ticket record is written (the webhook's audit writer waits at most
  10 ms plus an append), so the console's event producer, which calls it for every
  record, keeps the index current between scans.
- The producer scans at start and every ``rescan`` seconds (default 300 s, the
  dispatcher's reconcile period): entries no new audit record announced (re-created by
  the dispatcher's rebuild from the cluster, e.g. after Redis lost its data, or whose
  audit record was dropped because the log could not keep up) are found by then.
- Thread-safe: the producer writes, request threads read.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from audit.log import parse_entry
from fairshare.queue.fairqueue import FairQueue

DEFAULT_RESCAN = 300.0


class NamespaceIndex:
    """namespace -> tenants with ticket records there (see the module contract)."""

    def __init__(self, client: redis.Redis, queue: FairQueue, stream: str,
                 rescan: float = DEFAULT_RESCAN) -> None:
        self.client = client
        self.queue = queue
        self.stream = stream
        self.rescan = rescan
        self._lock = threading.Lock()
        self._tenants: dict[str, set[str]] | None = None
        self._scanned_at: float | None = None

    def tenants(self, namespace: str) -> frozenset[str] | None:
        """The tenants that may have entries in ``namespace``; None before the first scan."""
        with self._lock:
            if self._tenants is None:
                return None
            return frozenset(self._tenants.get(namespace, ()))

    def learn(self, tenant: str, namespace: str) -> None:
        """Note that ``tenant`` has (had) a pod in ``namespace`` (from an audit record)."""
        if not tenant or not namespace:
            return
        with self._lock:
            if self._tenants is not None:
                self._tenants.setdefault(namespace, set()).add(tenant)

    def due(self, now: float | None = None) -> bool:
        """Whether a scan is due: none yet, or the last began ``rescan`` seconds ago."""
        at = time.monotonic() if now is None else now
        return self._scanned_at is None or at - self._scanned_at >= self.rescan

    def scan(self) -> None:
        """Read every ticket record and the audit records appended meanwhile, and replace
        the index with what they name (see the module contract)."""
        began = time.monotonic()
        newest: list[Any] = list(self.client.xrevrange(self.stream, count=1) or [])
        cursor = newest[0][0] if newest else b"0-0"
        found = self.queue.namespace_tenants()
        while True:
            page: list[Any] = list(self.client.xrange(
                self.stream, min=b"(" + _bytes(cursor), count=1000) or [])
            for raw_id, values in page:
                record = parse_entry(raw_id, values).record
                if record is not None and record.tenant and record.namespace:
                    found.setdefault(record.namespace, set()).add(record.tenant)
            if len(page) < 1000:
                break
            cursor = page[-1][0]
        with self._lock:
            self._tenants = found
            self._scanned_at = began


def _bytes(stream_id: bytes | str) -> bytes:
    return stream_id if isinstance(stream_id, bytes) else stream_id.encode()
