"""``fairgate serve``: the webhook over HTTPS (TLS 1.2+) with uvicorn.

Contract:
- Serves :func:`webhook.app.create_app` on ``host:port`` with the TLS context of
  :func:`certs.server_ssl_context` (TLS 1.2 minimum); a :class:`certs.CertReloader`
  swaps a renewed ``tls.crt``/``tls.key`` of ``cert_dir`` into the live context.
- Config comes from ``config_dir`` (local mode, reloaded file by file when the files
  change; each accepted edit of ``platform.yaml`` or a quota file is audited as
  ``quota-change``, once, by the only or the first worker) or,
  without it, from the cluster (in-cluster service account or kubeconfig), where the
  serving certificate is also bootstrapped into ``cert_dir`` (shared Secret, caBundle
  injection; see :mod:`certs.bootstrap`).
- Redis (``redis``: URL, password, CA; see :mod:`fairshare.connection`) is reached with
  short socket timeouts (``redis_timeout``) and one reconnect attempt, so that every
  admission is answered within the app's deadline.
- ``wait_for_rebuild`` (default: on when the config comes from the cluster, off with
  ``config_dir``): admit nothing on the fast path while Redis holds usage the reconciler
  has not rebuilt (a fresh or restarted-empty Redis); pods queue behind the gate
  instead, so quota holds across a Redis loss. ``fairgate dispatch`` rebuilds as soon as
  it sees that marker missing.
- ``workers`` > 1: the parent binds the socket (and, in a cluster, bootstraps and renews
  the certificate), then runs that many worker processes (spawned, each with its own
  config source, Redis pool, audit writer and certificate reloader) accepting on the
  shared socket; a worker that dies is restarted. The decision work is CPU-bound Python
  under one GIL per process, so workers are how one pod uses more than one core.
- Connections are bounded (:mod:`webhook.connections`): ``connections.max_connections``
  open per worker process, a request whole within ``connections.request_seconds`` of
  its first byte.
- ``/metrics`` names no tenant unless ``metrics_tenant_labels`` is ``names``: the port
  must be open to the API server, whose addresses a NetworkPolicy cannot select.
- SIGTERM: stop accepting, finish requests in flight (up to ``graceful_seconds``),
  flush the audit queue, return (``fairgate serve`` exits 0). SIGINT (Ctrl-C) does the
  same and the command exits 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from urllib3.exceptions import HTTPError

from admission.dra import NO_OBJECTS
from audit import AuditLog
from audit.log import DEFAULT_RETENTION, Retention
from certs import CertReloader, server_ssl_context
from fairshare.connection import (
    DEFAULT_REDIS_TIMEOUT,
    RedisTarget,
    connect_redis,
    connect_redis_async,
)
from fairshare.queue.fastpath import REPLICA_ACK_TIMEOUT
from tenants.models import CONTROL_NAMESPACE
from tenants.source import ConfigEdit, ConfigNotReadyError, ConfigSource, start_local_source
from webhook.app import create_app
from webhook.auditing import audit_config_edit
from webhook.connections import (
    DEFAULT_LIMITS,
    ConnectionLimits,
    bounded_http,
    handshake_timeout,
)
from webhook.metrics import WebhookMetrics
from webhook.service import AdmissionService, asks_for_gpu, parsed

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from starlette.types import ASGIApp

    from fairshare.cluster.dra import DraWatch
    from fairshare.cluster.gangs import GangWatch

log = logging.getLogger("fairgate.webhook.server")

WEBHOOK_CONFIGURATION = "fairgate"
CONFIG_POLL_SECONDS = 1.0
# How long an idle client connection stays open. The API server's webhook client (Go's
# http.Transport) keeps idle connections for 90 s and does not retry a POST the server
# closed under it: with uvicorn's default of 5 s, a request racing that close failed the
# pod create with "failed calling webhook ...: EOF" (seen under load in the e2e bench).
# Longer than the client's idle timeout, the client always closes first.
KEEP_ALIVE_SECONDS = 120


class ServeError(RuntimeError):
    """``fairgate serve`` cannot start; the message says what to fix."""


@dataclass(frozen=True)
class ServeOptions:
    """What ``fairgate serve`` was asked to do."""

    cert_dir: Path
    port: int
    redis: RedisTarget
    config_dir: Path | None = None
    host: str = "0.0.0.0"
    redis_timeout: float = DEFAULT_REDIS_TIMEOUT
    deadline_seconds: float = 1.0
    graceful_seconds: float = 10.0
    workers: int = 1
    log_level: str = "info"
    wait_for_rebuild: bool | None = None  # None: on in cluster mode, off with config_dir
    replica_acks: int | None = None  # None: 1 for a Sentinel target, else 0
    replica_ack_timeout: float = REPLICA_ACK_TIMEOUT  # seconds WAIT may block (< redis_timeout)
    audit_retention: Retention = DEFAULT_RETENTION
    connections: ConnectionLimits = DEFAULT_LIMITS
    clock_file: Path | None = None  # fairgate demo's virtual time (see file_clock)
    metrics_tenant_labels: str = "none"  # "names": /metrics counts decisions by tenant name


def file_clock(path: Path) -> Callable[[], float]:
    """A clock that reads the time (epoch seconds) from ``path``, as ``fairgate demo``
    writes its virtual time there before each request, so the webhook queues and audits
    on the demo's clock, as the demo's dispatcher does."""
    def now() -> float:
        return float(path.read_text(encoding="ascii"))

    return now


def _local_source(config_dir: Path,
                  on_edit: Callable[[ConfigEdit], None] | None = None) -> ConfigSource:
    try:
        return start_local_source(config_dir, CONFIG_POLL_SECONDS, on_edit)
    except ConfigNotReadyError as exc:
        raise ServeError(str(exc)) from exc


def _cluster_api() -> ApiClient:
    from kubernetes.config import ConfigException

    from tenants.cluster import api_client_from_environment

    try:
        return api_client_from_environment()
    except ConfigException as exc:
        raise _cluster_error(exc) from exc


def _cluster_error(exc: BaseException) -> ServeError:
    return ServeError(
        f"cannot use the cluster ({type(exc).__name__}: {exc}): run in the cluster or set "
        "KUBECONFIG to a working kubeconfig, or pass --config-dir DIR to run locally"
    )


def _bootstrap_certificates(cert_dir: Path, stop: threading.Event) -> None:
    """Adopt or create the serving certificate in the cluster, then keep renewing it."""
    from certs.bootstrap import (
        BootstrapError,
        WebhookTarget,
        ensure_certificates,
        maintain_certificates,
    )

    target = WebhookTarget(
        namespace=_namespace(),
        mutating_configs=(WEBHOOK_CONFIGURATION,),
        validating_configs=(WEBHOOK_CONFIGURATION,),
    )
    api = _cluster_api()
    try:
        cert_dir.mkdir(parents=True, exist_ok=True)
        ensure_certificates(api, target, cert_dir)
    except (BootstrapError, OSError, HTTPError) as exc:
        raise _cluster_error(exc) from exc
    threading.Thread(
        target=maintain_certificates,
        args=(api, target, cert_dir),
        kwargs={"stop": stop},
        name="fairgate-cert-maintainer",
        daemon=True,
    ).start()


def _namespace() -> str:
    return os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE)


def _config_source(options: ServeOptions,
                   on_edit: Callable[[ConfigEdit], None] | None = None) -> ConfigSource:
    if options.config_dir is not None:
        return _local_source(options.config_dir, on_edit)
    from tenants.cluster import ClusterConfigSource

    source = ClusterConfigSource(_cluster_api(), _namespace())
    source.start()
    return source


def _dra_source(options: ServeOptions) -> DraWatch | None:
    """The cluster's DRA objects, watched (None with a local config dir: no cluster)."""
    if options.config_dir is not None:
        return None
    from fairshare.cluster.dra import DraWatch

    watch = DraWatch(_cluster_api())
    watch.start()
    return watch


def _gang_source(options: ServeOptions, dra: DraWatch | None) -> GangWatch | None:
    """The objects giving gangs their size, watched (None with a local config dir)."""
    if options.config_dir is None:
        from fairshare.cluster.gangs import GangWatch

        objects = dra.objects if dra is not None else (lambda: NO_OBJECTS)
        watch = GangWatch(
            _cluster_api(),
            asks_for_gpu=lambda template: asks_for_gpu(parsed(template), "", objects()))
        watch.start()
        return watch
    return None


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (IPv6 when ``host`` has a colon; port 0: a
    free one); raises OSError, with nothing left open, when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(backlog)
    return sock


def _listen(host: str, port: int) -> socket.socket:
    """The webhook's socket, shared by its worker processes."""
    try:
        sock = listen(host, port, 2048)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


def https_server(app: ASGIApp, cert_dir: Path, **settings: Any
                 ) -> tuple[uvicorn.Server, CertReloader]:
    """A uvicorn server for ``app`` over TLS 1.2+ with ``cert_dir``'s tls.crt/tls.key
    (:func:`certs.server_ssl_context`; raises :class:`certs.CertError` saying what is
    wrong with them), ``settings`` for the rest of its ``uvicorn.Config``, and the
    :class:`certs.CertReloader` that swaps a renewed pair into its live context: serve
    with :func:`serve_https`."""
    context = server_ssl_context(cert_dir)
    config = uvicorn.Config(app, ssl_context_factory=lambda _config, _default: context,
                            **settings)
    return uvicorn.Server(config), CertReloader(context, cert_dir)


async def serve_https(server: uvicorn.Server, reloader: CertReloader,
                      sockets: list[socket.socket] | None = None) -> None:
    """Serve until uvicorn stops, with the reloader watching the certificate on the
    serving loop (where no handshake can fall between its two steps); with a bounded
    ``http`` protocol (:func:`webhook.connections.bounded_http`), a TLS handshake must
    finish within its ``request_seconds``."""
    limits = getattr(server.config.http, "limits", None)
    with handshake_timeout(asyncio.get_running_loop(), limits.request_seconds) if isinstance(
            limits, ConnectionLimits) else contextlib.nullcontext():
        async with reloader.running():
            await server.serve(sockets=sockets)


def _run_uvicorn(options: ServeOptions, sock: socket.socket | None,
                 audit_edits: bool = True) -> None:
    """Serve in this process until SIGTERM/SIGINT (on ``sock`` if given); with
    ``audit_edits``, audit each accepted edit of a ``config_dir`` file as ``quota-change``
    (one process of a group does)."""
    client = connect_redis(options.redis, options.redis_timeout)
    audit_log = AuditLog(client, maxlen=options.audit_retention.max_records,
                         max_age=options.audit_retention.max_age)
    source = _config_source(options, partial(audit_config_edit, audit_log)
                            if audit_edits else None)
    dra = _dra_source(options)
    gangs = _gang_source(options, dra)
    decisions_client = connect_redis_async(options.redis, options.redis_timeout)
    try:
        service = AdmissionService(
            source, decisions_client, audit_log,
            clock=file_clock(options.clock_file) if options.clock_file else time.time,
            wait_for_rebuild=(options.wait_for_rebuild if options.wait_for_rebuild is not None
                              else options.config_dir is None),
            replicas=(options.replica_acks if options.replica_acks is not None
                      else int(options.redis.replicated)),
            replica_timeout=options.replica_ack_timeout,
            dra=dra,
            gangs=gangs,
            metrics=WebhookMetrics(tenant_labels=options.metrics_tenant_labels),
        )
        app = create_app(service, deadline_seconds=options.deadline_seconds)
        server, reloader = https_server(
            app,
            options.cert_dir,
            host=options.host,
            port=options.port,
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=int(options.graceful_seconds),
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            http=bounded_http(options.connections),
            lifespan="on",
        )

        if sock is None:  # one process; a supervisor of workers says it serves itself
            log.info("serving https://%s:%d (mutate, validate)", options.host, options.port)

        async def main() -> None:
            try:
                await serve_https(server, reloader, [sock] if sock is not None else None)
            finally:
                await decisions_client.aclose()

        # uvicorn handles SIGTERM gracefully, then re-raises it once done: end with 0.
        signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:  # uvloop
            runner.run(main())
    finally:
        source.close()
        client.close()


def _worker(options: ServeOptions, sock: socket.socket, index: int) -> None:
    """Entry point of worker ``index`` (spawned: configure logging afresh); worker 0
    audits the config dir's edits, so each is recorded once."""
    from webhook.logs import configure_logging

    configure_logging(options.log_level)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole group
        _run_uvicorn(options, sock, audit_edits=index == 0)


def _supervise(options: ServeOptions, sock: socket.socket) -> None:
    """Keep ``options.workers`` worker processes serving ``sock`` until SIGTERM/SIGINT."""
    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start(index: int) -> multiprocessing.process.BaseProcess:
        process = spawn.Process(target=_worker, args=(options, sock, index),
                                name=f"fairgate-serve-{index}", daemon=False)
        process.start()
        return process

    workers = [start(i) for i in range(options.workers)]
    log.info("serving https://%s:%d with %d workers (pids %s)", options.host, options.port,
             options.workers, ", ".join(str(w.pid) for w in workers))
    while not stop.wait(0.5):
        for index, worker in enumerate(workers):
            if not worker.is_alive() and not stop.is_set():
                log.error("worker %d (pid %s) exited with %s; starting a new one",
                          index, worker.pid, worker.exitcode)
                time.sleep(0.5)
                workers[index] = start(index)
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            os.kill(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.join(options.graceful_seconds + 5)
        if worker.is_alive():
            worker.kill()
            worker.join()


def serve(options: ServeOptions) -> None:
    """Run the webhook until SIGTERM/SIGINT (see the module contract)."""
    if options.workers < 1:
        raise ServeError(f"--workers must be 1 or more, got {options.workers}")
    if not 0 < options.replica_ack_timeout < options.redis_timeout:
        raise ServeError(
            f"--replica-ack-timeout must be above 0 and below the Redis timeout "
            f"({options.redis_timeout:g} s), got {options.replica_ack_timeout:g}")
    stop = threading.Event()
    try:
        if options.config_dir is None:
            _bootstrap_certificates(options.cert_dir, stop)
        if options.workers == 1:
            _run_uvicorn(options, None)
            return
        if options.config_dir is not None:
            _local_source(options.config_dir).close()  # fail here, not in every worker
        server_ssl_context(options.cert_dir)
        sock = _listen(options.host, options.port)
        try:
            _supervise(options, sock)
        finally:
            sock.close()
    finally:
        stop.set()
