"""Fairness over time: samples of each tenant's usage and entitlement in Redis.

Contract:
- :meth:`FairnessHistory.sample` takes one :func:`~fairshare.queue.entitlement.snapshot_fairness`
  of the queue and appends, per tenant with usage or an entitlement, ``used`` and
  ``entitlement`` (GPU-equivalents) to the stream ``<prefix>fh:<tenant>``, and Jain's
  index (:func:`~fairshare.queue.entitlement.entitled_jain`, ``n/a`` when not defined) to
  ``<prefix>fh``; a tenant this replica sampled last time that now has neither
  gets one sample of zeros (its line ends at 0, not at its last use). Each stream keeps
  about ``keep`` seconds of samples (``XADD MAXLEN ~ keep / interval``), so memory is
  bounded: about 40 bytes per sample per tenant (1,000 tenants, 6 h every 60 s: about
  15 MB).
- At most one sample per ``interval`` is written per Redis, whatever the number of
  console replicas: a replica takes the slot with ``SET NX`` first. :meth:`due` says
  whether this replica should try.
- :meth:`series` reads a tenant's samples since a time: ``[[unix seconds, used,
  entitlement], ...]`` oldest first; :meth:`jain` the cluster's ``[[t, index], ...]``.
- Samples are written by ``fairgate console`` while it runs: history starts when the
  first console starts (documented in docs/console.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from fairshare.queue.entitlement import jain_text, snapshot_fairness
from fairshare.queue.fairqueue import FairQueue

DEFAULT_INTERVAL = 60.0
DEFAULT_KEEP = 6 * 3600.0


class FairnessHistory:
    """Bounded fairness samples in Redis streams."""

    def __init__(self, client: redis.Redis, queue: FairQueue, prefix: str = "fairgate:",
                 interval: float = DEFAULT_INTERVAL, keep: float = DEFAULT_KEEP) -> None:
        if interval <= 0 or keep < interval:
            raise ValueError(f"need interval > 0 and keep >= interval, got {interval}, {keep}")
        self.client = client
        self.queue = queue
        self.prefix = prefix
        self.interval = interval
        self.keep = keep
        self._last_slot = -1
        self._active: set[str] = set()

    @property
    def maxlen(self) -> int:
        """Samples kept per stream."""
        return int(self.keep // self.interval) + 1

    def due(self, now: float) -> bool:
        """Whether ``now`` is in a slot this replica has not sampled yet."""
        return int(now // self.interval) != self._last_slot

    def sample(self, now: float | None = None) -> bool:
        """Write one sample for the slot of ``now`` unless another replica did; True
        when this call wrote it."""
        at = time.time() if now is None else now
        slot = int(at // self.interval)
        self._last_slot = slot
        ttl = max(1, int(self.interval * 2))
        if not self.client.set(f"{self.prefix}fh-slot:{slot}", 1, nx=True, ex=ttl):
            return False
        fair = snapshot_fairness(self.queue.snapshot())
        stamp = f"{int(at * 1000)}-*"
        rows = {tenant: (row.used, row.entitlement) for tenant, row in fair.tenants.items()
                if row.used != 0 or row.entitlement != 0}
        ended = self._active - rows.keys()
        self._active = set(rows)
        rows.update({tenant: (0.0, 0.0) for tenant in ended})
        with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(f"{self.prefix}fh", {"j": jain_text(fair.jain_index)}, id=stamp,
                      maxlen=self.maxlen, approximate=True)
            for tenant, (used, entitlement) in rows.items():
                pipe.xadd(f"{self.prefix}fh:{tenant}",
                          {"u": f"{used:.2f}", "e": f"{entitlement:.2f}"},
                          id=stamp, maxlen=self.maxlen, approximate=True)
            pipe.execute()
        return True

    def series(self, tenants: Sequence[str], since: float) -> dict[str, list[list[float]]]:
        """Each tenant's ``[[t, used, entitlement], ...]`` since ``since``, oldest first."""
        start = str(int(since * 1000))
        with self.client.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.xrange(f"{self.prefix}fh:{tenant}", min=start)
            replies: list[Any] = pipe.execute()
        return {
            tenant: [[_seconds(sid), float(v[b"u"]), float(v[b"e"])] for sid, v in entries]
            for tenant, entries in zip(tenants, replies, strict=True)
        }

    def jain(self, since: float) -> list[list[float]]:
        """Jain's index of used / entitlement over time: ``[[t, index], ...]``; the
        samples where it was not defined (n/a) are left out."""
        entries: list[Any] = list(
            self.client.xrange(f"{self.prefix}fh", min=str(int(since * 1000))) or [])
        return [[_seconds(sid), float(v[b"j"])] for sid, v in entries if v[b"j"] != b"n/a"]


def _seconds(stream_id: bytes | str) -> float:
    raw = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(raw.split("-", 1)[0]) / 1000
