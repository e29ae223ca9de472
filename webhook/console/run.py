"""``fairgate console``: wire Redis, config, access and events into the app and serve it.

Contract:
- :func:`run_console` binds ``host:port`` first (port 0: any free port), then prints
  ``console: <url>`` as the first line on stdout (local token mode: the URL carries
  ``?token=<random token>``; Kubernetes mode: the plain URL) and serves until SIGINT or
  SIGTERM. Returns 0; raises :class:`ConsoleError` (the message says what to fix) when
  the config cannot be loaded, the address is taken, the certificate cannot be used or
  the cluster cannot be used, and Redis's own error when Redis cannot be reached.
- With ``cert_dir`` it serves HTTPS (TLS 1.2+, ``tls.crt``/``tls.key`` of that directory,
  a renewed pair taken up without a restart: :func:`webhook.server.https_server`) and the
  URL is ``https://``. Without it, plain HTTP, which it serves only on a loopback address
  (bearer tokens must not cross a network in clear text) unless ``plain_http`` says a
  TLS-terminating proxy is in front.
- The access-token cookie is ``Secure`` (browsers return it over https, and to
  http://localhost or 127.0.0.1, never over plain http elsewhere) unless
  ``insecure_cookie`` says browsers reach the console over plain http on purpose; a line
  on stderr at start-up says which. ``forwarded_allow_ips``: the proxies whose
  ``X-Forwarded-Proto`` / ``X-Forwarded-For`` are trusted (uvicorn's setting; default
  ``$FORWARDED_ALLOW_IPS``, else 127.0.0.1 only).
- Connections are bounded (:mod:`webhook.connections`, ``connections``: 512 open by
  default, a request whole within 10 s) and so are event-stream clients
  (:class:`~webhook.console.events.Broadcaster`).
- Auth ``auto`` is ``kubernetes`` when running in a cluster (``KUBERNETES_SERVICE_HOST``
  set), else ``token``. The control namespace (quota ConfigMaps, for the access checks)
  is ``$POD_NAMESPACE``, default ``fairgate-system``. In Kubernetes mode without
  ``--config-dir`` the tenant config (ceilings) is watched from the cluster; in token mode
  without it, ceilings show as unknown.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Literal

import uvicorn
from kubernetes.client import ApiClient

from audit import STREAM
from certs import CertError
from fairshare.connection import COMMAND_TIMEOUT, RedisTarget, connect_redis
from fairshare.queue.fairqueue import FairQueue
from tenants.models import CONTROL_NAMESPACE, FairgateConfig
from tenants.source import ConfigNotReadyError, ConfigSource, start_local_source
from webhook.connections import CONSOLE_LIMITS, ConnectionLimits, bounded_http
from webhook.console.access import Access, KubernetesAccess, TokenAccess
from webhook.console.app import create_app
from webhook.console.data import ConsoleData
from webhook.console.events import Broadcaster
from webhook.console.history import DEFAULT_INTERVAL, DEFAULT_KEEP, FairnessHistory
from webhook.console.namespaces import NamespaceIndex
from webhook.server import https_server, listen, serve_https

AuthMode = Literal["auto", "token", "kubernetes"]


class ConsoleError(RuntimeError):
    """The console cannot start; the message says what to fix."""


@dataclass(frozen=True)
class ConsoleOptions:
    """What ``fairgate console`` was asked to do."""

    redis: RedisTarget
    config_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    auth: AuthMode = "auto"
    token: str | None = None
    sample_interval: float = DEFAULT_INTERVAL
    keep_hours: float = DEFAULT_KEEP / 3600
    cert_dir: Path | None = None
    plain_http: bool = False
    insecure_cookie: bool = False
    forwarded_allow_ips: str | None = None
    connections: ConnectionLimits = CONSOLE_LIMITS


def resolve_auth(mode: AuthMode) -> Literal["token", "kubernetes"]:
    """``auto`` resolved: kubernetes inside a cluster, else token."""
    if mode != "auto":
        return mode
    return "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "token"


def _listen(host: str, port: int) -> socket.socket:
    try:
        return listen(host, port, 512)
    except OSError as exc:
        raise ConsoleError(f"cannot listen on {host}:{port} ({exc}): pick another --port "
                           "or stop what uses it") from exc


def _url(scheme: str, host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1"
    return f"{scheme}://{shown}:{port}/" + (f"?token={token}" if token else "")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_transport(options: ConsoleOptions) -> None:
    if options.cert_dir is None and not options.plain_http and not _loopback(options.host):
        raise ConsoleError(
            f"refusing to serve plain HTTP on {options.host}: bearer tokens would cross the "
            "network in clear text. Give --cert-dir DIR holding tls.crt and tls.key (e.g. "
            "`fairgate certs generate --service fairgate-console --out DIR`), or "
            "--plain-http if a TLS-terminating proxy in front of the console is the only "
            "way in")


def cookie_notice(options: ConsoleOptions) -> str:
    """The start-up line saying how the access-token cookie travels (printed when it
    matters: an insecure cookie, or plain http reachable from other hosts)."""
    if options.insecure_cookie:
        return ("console: WARNING: --insecure-cookie: the access-token cookie is not Secure; "
                "browsers send the token over plain http wherever this console is reached")
    return ("console: the access-token cookie is Secure: browsers send it over https and "
            "to http://localhost or 127.0.0.1 only (--insecure-cookie if browsers must "
            "reach this console over plain http from elsewhere)")


def _config_source(options: ConsoleOptions, auth: str) -> ConfigSource | None:
    if options.config_dir is not None:
        try:
            return start_local_source(options.config_dir, 1.0)
        except ConfigNotReadyError as exc:
            raise ConsoleError(str(exc)) from exc
    if auth != "kubernetes":
        return None
    from tenants.cluster import ClusterConfigSource

    source = ClusterConfigSource(_cluster_api(), _control_namespace())
    source.start()
    return source


def _control_namespace() -> str:
    return os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE)


def _cluster_api() -> ApiClient:
    from kubernetes.config import ConfigException

    from tenants.cluster import api_client_from_environment

    try:
        return api_client_from_environment()
    except (ConfigException, OSError) as exc:
        raise ConsoleError(f"cannot use the cluster ({type(exc).__name__}: {exc}): run in "
                           "the cluster, set KUBECONFIG, or use --auth token") from exc


def _current(source: ConfigSource | None) -> Callable[[], FairgateConfig | None]:
    def config() -> FairgateConfig | None:
        if source is None:
            return None
        try:
            return source.config
        except ConfigNotReadyError:
            return None
    return config


def run_console(options: ConsoleOptions, out: IO[str] | None = None) -> int:
    """Serve the console until interrupted (see the module contract)."""
    stdout = out or sys.stdout
    auth = resolve_auth(options.auth)
    _check_transport(options)
    with ExitStack() as stack:
        client = connect_redis(options.redis, COMMAND_TIMEOUT)
        stack.callback(client.close)
        client.ping()  # redis.RedisError: fairgate console says what to check, exit 1
        blocking = connect_redis(options.redis, None)  # XREAD BLOCK outlives any timeout
        stack.callback(blocking.close)
        queue = FairQueue(client)
        source = _config_source(options, auth)
        if source is not None:
            stack.callback(source.close)
        history = FairnessHistory(client, queue, interval=options.sample_interval,
                                  keep=options.keep_hours * 3600)
        namespaces = NamespaceIndex(client, queue, STREAM)
        data = ConsoleData(client, queue, history, _current(source),
                           generation=lambda: events.generation, namespaces=namespaces)
        events = Broadcaster(blocking, STREAM, queue.tenant_names, history,
                             namespaces=namespaces, redactor=data.redactor)
        access: Access
        token: str | None = None
        if auth == "kubernetes":
            access = KubernetesAccess(_cluster_api(), queue.tenant_names, _control_namespace())
        else:
            local = TokenAccess(options.token)
            access, token = local, local.token
        app = create_app(data, access, events, redis_name=f"Redis at {options.redis}",
                         auth_mode=auth, secure_cookie=not options.insecure_cookie)
        settings: dict[str, Any] = {"log_level": "warning", "access_log": False,
                                    "timeout_graceful_shutdown": 2, "proxy_headers": True,
                                    "forwarded_allow_ips": options.forwarded_allow_ips,
                                    "http": bounded_http(options.connections)}
        if options.cert_dir is not None:
            try:
                server, reloader = https_server(app, options.cert_dir, **settings)
            except CertError as exc:
                raise ConsoleError(f"cannot serve HTTPS: {exc}") from exc
        else:
            server, reloader = uvicorn.Server(uvicorn.Config(app, **settings)), None
        sock = _listen(options.host, options.port)
        stack.callback(sock.close)
        port = sock.getsockname()[1]
        scheme = "http" if reloader is None else "https"
        stdout.write(f"console: {_url(scheme, options.host, port, token)}\n")
        stdout.flush()
        if options.insecure_cookie or (reloader is None and not _loopback(options.host)):
            print(cookie_notice(options), file=sys.stderr, flush=True)
        events.start()
        stack.callback(events.stop)
        if reloader is None:
            _until_signal(server, lambda: server.run(sockets=[sock]))
        else:
            def run_https() -> None:
                with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
                    runner.run(serve_https(server, reloader, [sock]))
            _until_signal(server, run_https)
    return 0


def _until_signal(server: uvicorn.Server, run: Callable[[], None]) -> None:
    """``run()`` (serving with ``server``) until SIGTERM or SIGINT; after a SIGINT,
    raise KeyboardInterrupt (Ctrl-C: ``fairgate`` exits 130). uvicorn shuts down on
    either and then re-raises the signal through the handler it found, which without
    this one is asyncio's: that one cancels its task, and a task that completes anyway
    (the shutdown's last awaits) returned normally, so Ctrl-C sometimes exited 0."""
    if threading.current_thread() is not threading.main_thread():
        run()  # signals reach only the main thread
        return
    interrupted = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        server.should_exit = True  # also before uvicorn listens for signals itself

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        run()
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
