"""Kit of the fault and fuzz tests: a Redis that can be killed and brought back, webhook
processes, a load of real AdmissionReviews recorded request by request, and the queue's
live tickets.

The certificate fixture and the review builders are the webhook tests' own
(``tests/webhook/conftest.py`` and ``webhook_helpers``), imported, not copied; importing
this module puts ``tests/webhook`` on ``sys.path`` for that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "webhook"))

from webhook_helpers import review, write_config

from fairshare.localredis import free_port
from tenants import localdir
from webhook.process import ServeProcess

_spec = importlib.util.spec_from_file_location(
    "webhook_tests_conftest", Path(__file__).resolve().parent.parent / "webhook" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_webhook_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_webhook_conftest)
cert_dir = _webhook_conftest.cert_dir  # the webhook tests' CA + serving cert (127.0.0.1)
__all__ = ["cert_dir", "write_config"]


class RedisServer:
    """A ``redis-server`` on a fixed loopback port that a test may kill and restart.

    No persistence: a restarted server is empty, as after a crash of a cache.
    """

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client (short timeouts)."""
        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=1)

    def start(self) -> None:
        """Start (or restart, empty) on the same port and wait until it answers."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir),
             "--enable-debug-command", "local"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = self.client()
        try:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.02)
        finally:
            client.close()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: Redis vanishes without a goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Terminate if running."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A killable redis-server of this test only."""
    with tempfile.TemporaryDirectory(prefix="fairgate-faults-redis-") as workdir:
        server = RedisServer(Path(workdir))
        server.start()
        yield server
        server.stop()


def write_config_dir(directory: Path, platform: str, quotas: dict[str, str],
                     namespaces: dict[str, str]) -> Path:
    """A ``--config-dir`` with ``platform.yaml``, ``quota-<t>.yaml``, ``namespaces.yaml``."""
    return localdir.write_config_dir(
        directory, platform, quotas,
        "".join(f"{ns}: {{fairgate.io/tenant: {tenant}}}\n" for ns, tenant in namespaces.items()),
    )


ServeFactory = Callable[..., ServeProcess]


@pytest.fixture
def serve(cert_dir: Path, tmp_path: Path) -> Iterator[ServeFactory]:
    """``serve(redis_url, config_dir, wait_for_rebuild=False)`` starts a ``fairgate serve``;
    all are stopped at the end."""
    started: list[ServeProcess] = []

    def start(redis_url: str, config_dir: Path, wait_for_rebuild: bool = False) -> ServeProcess:
        process = ServeProcess(cert_dir, redis_url, config_dir,
                               tmp_path / f"serve-{len(started)}.log",
                               wait_for_rebuild=wait_for_rebuild)
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


@dataclass(frozen=True)
class Answer:
    """One request of a load: when it was sent, how long it took, what came back."""

    sent: float  # time.monotonic()
    seconds: float
    status: int  # HTTP status, 0 for a transport error
    pod: dict[str, Any]
    uid: str
    response: dict[str, Any] | None  # the AdmissionReview's response
    error: str = ""

    @property
    def decision(self) -> str:
        """``auditAnnotations.decision`` (empty when absent)."""
        if self.response is None:
            return ""
        return str(self.response.get("auditAnnotations", {}).get("decision", ""))


@dataclass
class Load:
    """Client threads posting GPU pod CREATEs to ``/mutate`` until stopped.

    Each client first opens its keep-alive HTTPS connection (a ``/healthz``, not
    recorded) and entering returns once all have, so the recorded answers are reviews on
    open connections, as an API server's mostly are: 64 TLS handshakes at one instant
    on a loaded machine took several seconds before the first review was read, and that
    is the harness starting, not what a fault test measures."""

    server: ServeProcess
    make_pod: Callable[[int, int], dict[str, Any]]  # (client, i) -> pod
    clients: int = 8
    timeout: float = 10.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _connected: threading.Barrier | None = None

    def _client(self, index: int) -> None:
        i = 0
        with self.server.client(timeout=self.timeout) as client:
            with contextlib.suppress(httpx.HTTPError):  # the first review reconnects
                client.get("/healthz")
            assert self._connected is not None
            self._connected.wait()
            while not self._stop.is_set():
                pod = self.make_pod(index, i)
                i += 1
                self.post(client, pod)

    def post(self, client: httpx.Client, pod: dict[str, Any]) -> Answer:
        """POST one review of ``pod`` and record the answer."""
        body = review(pod)
        uid = body["request"]["uid"]
        sent = time.monotonic()
        try:
            reply = client.post("/mutate", content=json.dumps(body),
                                headers={"content-type": "application/json"})
            status = reply.status_code
            response = reply.json().get("response") if status == 200 else None
            error = "" if status == 200 else reply.text[:200]
        except httpx.HTTPError as exc:
            status, response, error = 0, None, repr(exc)
        answer = Answer(sent, time.monotonic() - sent, status, pod, uid, response, error)
        with self._lock:
            self.answers.append(answer)
        return answer

    def __enter__(self) -> Load:
        self._connected = threading.Barrier(self.clients + 1)
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        self._connected.wait(self.timeout * 3)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
        assert not any(t.is_alive() for t in self._threads), "a client hung"


@dataclass(frozen=True)
class Ticket:
    """A ticket as the queue stores it (``fairgate:tk``; layout in
    fairshare/queue/scripts/lib_base.lua: ``state|tenant|class|band|demand|...``)."""

    state: str  # Q queued, G gang-waiting, R reserved, A running
    tenant: str
    band: str  # i, t, b
    demand: str

    @property
    def holds_quota(self) -> bool:
        """Reserved or running: counted in the tenant's usage."""
        return self.state in ("R", "A")

    @property
    def slices(self) -> int:
        """Compute slices of the demand (a GPU is 7, ``mig-<n>g.*`` is n)."""
        from tenants.resources import parse_counts, total_slices

        return total_slices(parse_counts(self.demand))


def live_tickets(client: redis.Redis) -> dict[str, Ticket]:
    """Every ticket in the queue, read atomically (one HGETALL)."""
    raw: dict[bytes | str, bytes | str] = client.hgetall("fairgate:tk")
    tickets = {}
    for key, value in raw.items():
        text = value.decode() if isinstance(value, bytes) else value
        state, tenant, _cls, band, demand, *_ = text.split("|")
        tickets[key.decode() if isinstance(key, bytes) else key] = Ticket(
            state, tenant, band, demand)
    return tickets


def usage_by_tenant(tickets: dict[str, Ticket]) -> dict[str, tuple[int, int]]:
    """Per tenant: (slices held by reserved/running tickets, of which borrowed)."""
    usage: dict[str, tuple[int, int]] = {}
    for ticket in tickets.values():
        if ticket.holds_quota:
            total, borrowed = usage.get(ticket.tenant, (0, 0))
            usage[ticket.tenant] = (total + ticket.slices,
                                    borrowed + (ticket.slices if ticket.band == "b" else 0))
    return usage
