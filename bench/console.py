"""Benchmark: console page render time at 1,000 tenants x 100,000 queued pods, and the
cost of idle event-stream clients.

Fills a private redis-server through the real ``FairQueue.admit`` (the webhook's path,
the tenants and pod mix of ``bench/dispatch.py``), writes ``--audit`` audit records and
6 hours of fairness samples (one a minute), then times each page and API route of the
real Starlette app in-process (``httpx.ASGITransport``: the server's whole handling,
Redis reads included, no network), ``--repeat`` times each, after one warm-up request
(which also runs the audit chain verification that is then cached for 30 s; its cold
time is reported apart; and computes the status report the Tenants page shares until
the next decision: the cold Tenants time is reported apart too). The console's event
producer runs meanwhile, as in ``fairgate console``; its first scan of the namespace index
(what the namespace filter reads instead of every lane) is timed apart. The namespace
filter is timed without a config (the index alone), with one mapping each
``<tenant>-ml`` namespace to its tenant, and without the index (every lane read, as
before the index). The baseline is ``/healthz`` in the same run.

Idle SSE clients: the Redis commands and CPU seconds of the console process over
``--idle`` seconds with 0 and with ``--clients`` subscribed, idle event-stream clients.

Connections at the cap (``--flood N``, instead of the pages): a real ``fairgate console``
(plain HTTP) and a real ``fairgate serve`` (TLS, ``examples/config``), each with its
default ``--max-connections`` and ``--request-timeout``, get ``N`` connections at once:
on the console half send nothing and half a request cut off in its headers; on the
webhook all send nothing (no TLS handshake). The server's RSS and open file descriptors
are read from ``/proc`` before, 3 s after the last connect (at the cap), after the
request timeout, and after the clients close; with how many connections the server
answered ``503``, closed, or left open, and the time of a ``/healthz`` meanwhile.

    python bench/console.py                         # 1,000 tenants, 100,000 queued
    python bench/console.py --tenants 100 --queued 10000 --json out.json
    python bench/console.py --flood 10000 --json flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dispatch import make_config, pod_uid, pods

from audit import STREAM, AuditLog
from certs import write_bundle
from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from tenants.models import TENANT_LABEL, FairgateConfig
from webhook.console.access import TokenAccess, Viewer
from webhook.console.app import create_app
from webhook.console.data import ConsoleData
from webhook.console.events import Broadcaster
from webhook.console.history import FairnessHistory
from webhook.console.namespaces import NamespaceIndex
from webhook.process import ServeProcess, client_context

ROUTES = ["/healthz", "/tenants", "/api/tenants", "/queue", "/api/queue",
          "/queue?page=1000", "/queue?tenant=team-0500", "/queue?namespace=team-0500-ml",
          "/api/queue?namespace=team-0500-ml", "/fairness", "/api/fairness", "/audit",
          "/api/audit", "/audit?q=team-0500", "/cost"]
CONFIGURED = ["/queue?namespace=team-0500-ml", "/api/queue?namespace=team-0500-ml"]


def fill(client: redis.Redis, tenants: int, queued: int, audit: int) -> FairQueue:
    rng = random.Random(tenants * 7 + queued)
    config, capacity, names = make_config(tenants)
    queue = FairQueue(client)
    queue.sync_config(config, capacity)
    count = 0
    for req in pods(names, 10**9, rng):
        answer = queue.admit(req, 1.0)
        queue.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)
        if answer.outcome != "reserved":
            count += 1
            if count == queued:
                break
    log = AuditLog(client, out=io.StringIO())
    log.record_many(
        log_draft(names[i % len(names)], i) for i in range(audit))
    history = FairnessHistory(client, queue, interval=60, keep=6 * 3600)
    now = time.time()
    for slot in range(360):
        history.sample(now - 6 * 3600 + slot * 60)
    return queue


def with_namespaces(tenants: int) -> FairgateConfig:
    """The bench's config plus its namespaces: ``<tenant>-ml`` labelled for its tenant."""
    config, _capacity, names = make_config(tenants)
    return FairgateConfig(platform=config.platform, quotas=config.quotas,
                          namespaces={f"{n}-ml": {TENANT_LABEL: n} for n in names})


def log_draft(tenant: str, i: int) -> Any:
    from audit import AuditRecord

    return AuditRecord(decision="queue", tenant=tenant, namespace=f"{tenant}-ml",
                       name=f"pod-{i:07d}", pod_class="training", demand="gpu=1",
                       reason="waiting for 1.00 GPU-eq of tenant quota")


async def time_routes(app: Any, token: str, repeat: int, routes: list[str], label: str = "",
                      cold: bool = True) -> dict[str, dict[str, float]]:
    transport = httpx.ASGITransport(app=app)
    results: dict[str, dict[str, float]] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://console",
                                 headers=headers, timeout=120) as client:
        for route, what in (("/api/audit", "chain verification"),
                            ("/api/tenants", "status report")) if cold else ():
            began = time.perf_counter()
            assert (await client.get(route)).status_code == 200
            results[f"cold {route} ({what})"] = {
                "p50_ms": round((time.perf_counter() - began) * 1000, 1)}
        for route in routes:
            assert (await client.get(route)).status_code == 200, route
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                answer = await client.get(route)
                times.append(time.perf_counter() - start)
                assert answer.status_code == 200, route
            times.sort()
            results[route + label] = {"p50_ms": round(statistics.median(times) * 1000, 2),
                              "max_ms": round(times[-1] * 1000, 2)}
    return results


async def idle_cost(client: redis.Redis, events: Broadcaster, clients: int,
                    seconds: float) -> dict[str, float]:
    streams = [events.subscribe(Viewer(f"v{i}", everything=True)) for i in range(clients)]
    for stream in streams:
        await anext(stream)
    before = int(client.info("stats")["total_commands_processed"])
    cpu = time.process_time()
    await asyncio.sleep(seconds)
    used_cpu = time.process_time() - cpu
    commands = int(client.info("stats")["total_commands_processed"]) - before
    for stream in streams:
        await stream.aclose()
    return {"clients": clients, "redis_commands_per_s": round(commands / seconds, 1),
            "cpu_s_per_s": round(used_cpu / seconds, 4)}


HALF_SENT = b"GET /api/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def server_state(pid: int) -> dict[str, float]:
    """RSS (MiB) and open file descriptors of process ``pid``."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return {"rss_mib": round(rss, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Flood:
    """``count`` client sockets to ``port``, connected without waiting; ``payload(i)``
    is sent on socket ``i`` once connected (nothing when empty)."""

    def __init__(self, port: int, count: int, payload: Any) -> None:
        self.selector = selectors.DefaultSelector()
        self.open: dict[socket.socket, bytes] = {}
        self.refused = self.closed = self.failed = 0
        for i in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            if sock.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
                self.failed += 1
                sock.close()
                continue
            self.open[sock] = payload(i)
            self.selector.register(sock, selectors.EVENT_WRITE)

    def pump(self, seconds: float) -> None:
        """Send payloads as sockets connect; read answers and closes for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for key, events in self.selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if events & selectors.EVENT_WRITE:
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self._drop(sock)
                        self.failed += 1
                        continue
                    with contextlib.suppress(OSError):
                        sock.send(self.open[sock])
                    self.selector.modify(sock, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data.startswith(b"HTTP/1.1 503"):
                    self.refused += 1
                    self._drop(sock)
                elif not data:
                    self.closed += 1
                    self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        del self.open[sock]
        sock.close()

    def counts(self) -> dict[str, int]:
        return {"open": len(self.open), "refused_503": self.refused,
                "closed_by_server": self.closed, "connect_failed": self.failed}

    def close(self) -> None:
        for sock in list(self.open):
            self._drop(sock)
        self.selector.close()


def healthz_ms(url: str, verify: Any) -> float | None:
    start = time.perf_counter()
    try:
        ok = httpx.get(url + "/healthz", timeout=10, verify=verify).status_code == 200
    except httpx.HTTPError:
        ok = False
    return round((time.perf_counter() - start) * 1000, 1) if ok else None


def flood_server(name: str, pid: int, port: int, url: str, verify: Any, count: int,
                 payload: Any, phases: list[tuple[str, float]]) -> dict[str, Any]:
    """``count`` connections to the server ``pid``; its state after each phase."""
    rows: dict[str, Any] = {"before": server_state(pid)}
    started = time.monotonic()
    flood = Flood(port, count, payload)
    rows["connect_seconds"] = round(time.monotonic() - started, 1)
    for label, seconds in phases:
        flood.pump(seconds)
        rows[label] = {**server_state(pid), **flood.counts(),
                       "healthz_ms": healthz_ms(url, verify)}
        print(f"{name} {label}: {rows[label]}", flush=True)
    flood.close()
    time.sleep(2)
    rows["after_close"] = {**server_state(pid), "healthz_ms": healthz_ms(url, verify)}
    print(f"{name} after close: {rows['after_close']}", flush=True)
    return rows


def flood(count: int) -> dict[str, Any]:
    """The connection flood against a real console and a real webhook."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 1000)), hard))
    result: dict[str, Any] = {"attempted": count}
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with local_redis() as url, tempfile.TemporaryDirectory() as tmp:
        console = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "console", "--redis-url", url, "--port",
             "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            assert console.stdout is not None
            line = console.stdout.readline().strip().removeprefix("console: ")
            base = line.split("/?")[0].rstrip("/")
            port = int(base.rsplit(":", 1)[1])
            while healthz_ms(base, True) is None:
                time.sleep(0.1)
            result["console"] = flood_server(
                "console", console.pid, port, base, True, count,
                lambda i: HALF_SENT if i % 2 else b"",
                [("at_cap", 3.0), ("after_request_timeout", 10.0)])
        finally:
            console.send_signal(signal.SIGINT)
            console.wait(15)
        certs = Path(tmp) / "certs"
        write_bundle(certs, extra_sans=["127.0.0.1"])
        with ServeProcess(certs, url, root / "examples" / "config",
                          Path(tmp) / "serve.log") as server:
            assert server.process is not None
            verify = client_context(server.ca_file)
            result["serve"] = flood_server(
                "serve", server.process.pid, server.port, server.base_url, verify, count,
                lambda i: b"", [("at_cap", 3.0), ("after_request_timeout", 10.0),
                                 ("after_60s", 50.0)])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--audit", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--flood", type=int, metavar="N",
                        help="only the connection flood, with N connections a server")
    args = parser.parse_args(argv)
    if args.flood:
        result = flood(args.flood)
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    with local_redis() as url:
        client = redis.Redis.from_url(url, socket_timeout=120)  # a loaded machine
        start = time.perf_counter()
        queue = fill(client, args.tenants, args.queued, args.audit)
        filled = time.perf_counter() - start
        history = FairnessHistory(client, queue)
        access = TokenAccess()
        blocking = redis.Redis.from_url(url, socket_timeout=120)
        namespaces = NamespaceIndex(client, queue, STREAM)
        began = time.perf_counter()
        namespaces.scan()
        scanned = time.perf_counter() - began
        events = Broadcaster(blocking, STREAM, queue.tenant_names, namespaces=namespaces)
        events.start()
        data = ConsoleData(client, queue, history, generation=lambda: events.generation,
                           namespaces=namespaces)
        app = create_app(data, access, events)
        pages = {"namespace index scan (the producer's, at start and every 300 s)": {
            "p50_ms": round(scanned * 1000, 1)}}
        pages.update(asyncio.run(time_routes(app, access.token, args.repeat, ROUTES)))
        config = with_namespaces(args.tenants)
        configured = ConsoleData(client, queue, history, lambda: config,
                                 generation=lambda: events.generation, namespaces=namespaces)
        pages.update(asyncio.run(time_routes(create_app(configured, access, events),
                                             access.token, args.repeat, CONFIGURED,
                                             " (with a config)", cold=False)))
        unindexed = ConsoleData(client, queue, history, generation=lambda: events.generation)
        pages.update(asyncio.run(time_routes(create_app(unindexed, access, events),
                                             access.token, args.repeat, CONFIGURED[:1],
                                             " (no index: every lane, as before)",
                                             cold=False)))
        idle = [asyncio.run(idle_cost(client, events, n, args.idle))
                for n in (0, args.clients)]
        events.stop()
        total = data.queue_page(Viewer("b", everything=True))["total"]
        client.close()
        blocking.close()
    result = {"tenants": args.tenants, "queued": total, "audit_records": args.audit,
              "fill_seconds": round(filled, 1), "pages": pages, "idle_sse": idle}
    base = pages["/healthz"]["p50_ms"]
    print(f"{args.tenants} tenants, {total} queued entries, {args.audit} audit records "
          f"(filled in {filled:.0f} s)")
    print(f"{'route':52} {'p50 ms':>8} {'max ms':>8} {'x /healthz':>11}")
    for route, row in pages.items():
        ratio = f"{row['p50_ms'] / base:.0f}x" if "max_ms" in row else ""
        print(f"{route:52} {row['p50_ms']:8.2f} {row.get('max_ms', 0):8.2f} {ratio:>11}")
    for row in idle:
        print(f"idle SSE clients {row['clients']:5}: {row['redis_commands_per_s']} Redis "
              f"commands/s, {row['cpu_s_per_s']} CPU s/s")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
