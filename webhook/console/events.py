"""Live updates: one shared producer, any number of idle Server-Sent-Events clients.

Contract:
- :class:`Broadcaster` runs one thread that blocks on the audit stream (``XREAD BLOCK``)
  and fans each new record out to the subscribed clients whose viewer sees its tenant,
  as an event ``decision`` (``seq``, ``time``, ``decision``, ``tenant``, ``pod``,
  ``class``, ``demand``, ``reason``; the reason redacted by the viewer's
  :class:`~webhook.console.access.Redactor` that ``redactor`` makes from the viewer and
  every tenant's name (``tenants``), for viewers who may not see every tenant). Every ``keepalive``
  seconds it sends every client
  a comment line (so proxies keep the connection). It also takes the fairness samples
  (:class:`~webhook.console.history.FairnessHistory`) when one is due, and keeps the
  :class:`~webhook.console.namespaces.NamespaceIndex` current: a scan when it starts and
  whenever one is due, and every record's tenant and namespace.
- A client costs nothing while idle: it awaits its own asyncio queue; no per-client
  timer or Redis call exists. A client that does not keep up (``max_pending`` events
  waiting) gets one ``resync`` event instead of the rest (its page reloads its data).
- At most ``max_clients`` clients, and ``max_per_viewer`` per viewer (by name): one
  more is refused (:meth:`refusal` says why; :meth:`subscribe` then sends one
  ``refused`` event and ends).
- Records already in the stream when the producer starts are not sent.
- ``generation`` counts the records seen (before their events are sent): data cached
  for an older generation is stale.
- Redis errors are logged and retried after ``retry`` seconds; :meth:`stop` ends the
  thread within one ``block`` interval.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from audit.log import parse_entry
from webhook.console.access import Redactor, Viewer
from webhook.console.history import FairnessHistory
from webhook.console.namespaces import NamespaceIndex

log = logging.getLogger("fairgate.console")


@dataclass(eq=False)
class _Client:
    viewer: Viewer
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[str] = field(default_factory=lambda: asyncio.Queue(maxsize=0))
    pending: int = 0
    stale: bool = False


def sse(event: str, data: dict[str, Any]) -> str:
    """One Server-Sent Event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Broadcaster:
    """The shared producer (see the module contract)."""

    def __init__(self, client: redis.Redis, stream: str, tenants: Callable[[], list[str]],
                 history: FairnessHistory | None = None, block: float = 1.0,
                 keepalive: float = 15.0, max_pending: int = 500, retry: float = 2.0,
                 namespaces: NamespaceIndex | None = None,
                 redactor: Callable[[Viewer, list[str]], Redactor] = Redactor,
                 max_clients: int = 400, max_per_viewer: int = 8) -> None:
        self.client = client
        self.max_clients = max_clients
        self.max_per_viewer = max_per_viewer
        self.redactor = redactor
        self.namespaces = namespaces
        self.stream = stream
        self.tenants = tenants
        self.history = history
        self.block = block
        self.keepalive = keepalive
        self.max_pending = max_pending
        self.retry = retry
        self.sent = 0
        self.generation = 0
        self._clients: set[_Client] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def clients(self) -> int:
        """How many clients are subscribed."""
        with self._lock:
            return len(self._clients)

    def start(self) -> None:
        """Start the producer thread."""
        self._thread = threading.Thread(target=self._run, name="console-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the producer thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.block + 5)

    def refusal(self, viewer: Viewer) -> str | None:
        """Why one more client of ``viewer`` is refused (None: it is not)."""
        with self._lock:
            return self._refusal(viewer)

    def _refusal(self, viewer: Viewer) -> str | None:
        if len(self._clients) >= self.max_clients:
            return (f"the console serves at most {self.max_clients} live-update streams "
                    "at once: retry later")
        mine = sum(1 for c in self._clients if c.viewer.name == viewer.name)
        if mine >= self.max_per_viewer:
            return (f"{viewer.name} has {mine} live-update streams open, the most one user "
                    "may: close a console tab")
        return None

    async def subscribe(self, viewer: Viewer) -> AsyncGenerator[str, None]:
        """The events for ``viewer``, as SSE text, until the caller stops iterating."""
        me = _Client(viewer, asyncio.get_running_loop())
        with self._lock:
            refused = self._refusal(viewer)
            if refused is None:
                self._clients.add(me)
        if refused is not None:
            yield sse("refused", {"reason": refused})
            return
        try:
            yield ": connected\n\n"
            while True:
                text = await me.queue.get()
                me.pending -= 1
                yield text
        finally:
            with self._lock:
                self._clients.discard(me)

    def _deliver(self, me: _Client, text: str) -> None:
        if me.stale:
            return
        if me.pending >= self.max_pending:
            me.stale = True
            text = sse("resync", {"reason": "too many events waiting"})
        me.pending += 1
        me.loop.call_soon_threadsafe(me.queue.put_nowait, text)

    def publish(self, event: str, data: dict[str, Any], tenant: str | None) -> None:
        """Send an event to every client whose viewer sees ``tenant`` (None: everyone);
        a ``reason`` is redacted for viewers who may not see every tenant."""
        text = sse(event, data)
        with self._lock:
            targets = [c for c in self._clients if tenant is None or c.viewer.sees(tenant)]
        known: list[str] | None = None
        for me in targets:
            mine = text
            if not me.viewer.everything and data.get("reason"):
                known = self.tenants() if known is None else known
                mine = sse(event, self.redactor(me.viewer, known).record(data))
            try:
                self._deliver(me, mine)
            except RuntimeError:  # its event loop is closed: it is going away
                continue
        self.sent += 1

    def _run(self) -> None:
        cursor: Any = "$"
        last_ping = time.monotonic()
        while not self._stop.is_set():
            try:
                if cursor == "$":
                    newest: list[Any] = list(self.client.xrevrange(self.stream, count=1) or [])
                    cursor = newest[0][0] if newest else "0-0"
                if self.namespaces is not None and self.namespaces.due():
                    self.namespaces.scan()
                reply: list[Any] = list(self.client.xread(
                    {self.stream: cursor}, block=int(self.block * 1000), count=500) or [])
                for _name, entries in reply:
                    for raw_id, values in entries:
                        cursor = raw_id
                        self.generation += 1
                        self._record(raw_id, values)
                if self.history is not None and self.history.due(time.time()):
                    self.history.sample()
            except (redis.RedisError, OSError) as exc:
                log.warning("console event producer: Redis failed (%s); retrying in %.0fs",
                            exc, self.retry)
                self._stop.wait(self.retry)
            if time.monotonic() - last_ping >= self.keepalive:
                last_ping = time.monotonic()
                self._ping()

    def _ping(self) -> None:
        with self._lock:
            targets = list(self._clients)
        for me in targets:
            if me.pending == 0:
                try:
                    self._deliver(me, ": keepalive\n\n")
                except RuntimeError:
                    continue

    def _record(self, raw_id: bytes | str, values: dict[Any, Any]) -> None:
        record = parse_entry(raw_id, values).record
        if record is None:
            return
        if self.namespaces is not None:
            self.namespaces.learn(record.tenant, record.namespace)
        pod = "/".join(p for p in (record.namespace, record.name) if p)
        self.publish("decision", {
            "seq": record.seq, "time": record.time, "decision": record.decision,
            "tenant": record.tenant, "pod": pod, "class": record.pod_class,
            "demand": record.demand, "reason": record.reason,
        }, record.tenant)
