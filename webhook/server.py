"""``fairgate serve``: the webhook over HTTPS (TLS 1.2+) with uvicorn.

Contract:
- Serves :func:`webhook.app.create_app` on ``host:port`` with the TLS context of
  :func:`certs.server_ssl_context` (TLS 1.2 minimum); a :class:`certs.CertReloader`
  swaps a renewed ``tls.crt``/``tls.key`` of ``cert_dir`` into the live context.
- Config comes from ``config_dir`` (local mode, reloaded when the files change) or,
  without it, from the cluster (in-cluster service account or kubeconfig), where the
  serving certificate is also bootstrapped into ``cert_dir`` (shared Secret, caBundle
  injection; see :mod:`certs.bootstrap`).
- Redis is reached with short socket timeouts (``redis_timeout``) and one reconnect
  attempt, so that every admission is answered within the app's deadline.
- SIGTERM: stop accepting, finish requests in flight (up to ``graceful_seconds``),
  flush the audit queue, return (``fairgate serve`` exits 0). SIGINT (Ctrl-C) does the
  same and the command exits 130.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import redis
import uvicorn
from redis.backoff import NoBackoff
from redis.retry import Retry
from urllib3.exceptions import HTTPError

from certs import CertReloader, server_ssl_context
from tenants.models import CONTROL_NAMESPACE
from tenants.source import ConfigSource, LocalDirSource
from webhook.app import create_app
from webhook.service import AdmissionService

log = logging.getLogger("fairgate.webhook.server")

DEFAULT_REDIS_TIMEOUT = 0.5
WEBHOOK_CONFIGURATION = "fairgate"
CONFIG_POLL_SECONDS = 1.0


class ServeError(RuntimeError):
    """``fairgate serve`` cannot start; the message says what to fix."""


@dataclass(frozen=True)
class ServeOptions:
    """What ``fairgate serve`` was asked to do."""

    cert_dir: Path
    port: int
    redis_url: str
    config_dir: Path | None = None
    host: str = "0.0.0.0"
    redis_timeout: float = DEFAULT_REDIS_TIMEOUT
    deadline_seconds: float = 1.0
    graceful_seconds: float = 10.0


def connect_redis(url: str, timeout: float = DEFAULT_REDIS_TIMEOUT) -> redis.Redis:
    """A Redis client whose every call fails within about ``timeout`` seconds.

    Socket connect and read timeouts are ``timeout``; a dropped connection is retried
    once at once (a restarted Redis), a timeout is not retried.
    """
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )


def _local_source(config_dir: Path) -> ConfigSource:
    source = LocalDirSource(config_dir, poll_interval=CONFIG_POLL_SECONDS)
    source.start()
    if not source.ready:
        source.close()
        problems = "; ".join(source.last_error.values())
        raise ServeError(f"cannot load the config in {config_dir}: {problems}")
    return source


def _cluster_source(cert_dir: Path, stop: threading.Event) -> ConfigSource:
    """Watch the cluster's config; bootstrap and keep renewing the serving certificate."""
    from kubernetes.config import ConfigException

    from certs.bootstrap import (
        BootstrapError,
        WebhookTarget,
        ensure_certificates,
        maintain_certificates,
    )
    from tenants.cluster import ClusterConfigSource, api_client_from_environment

    namespace = os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE)
    target = WebhookTarget(
        namespace=namespace,
        mutating_configs=(WEBHOOK_CONFIGURATION,),
        validating_configs=(WEBHOOK_CONFIGURATION,),
    )
    try:
        api = api_client_from_environment()
        cert_dir.mkdir(parents=True, exist_ok=True)
        ensure_certificates(api, target, cert_dir)
    except (ConfigException, BootstrapError, OSError, HTTPError) as exc:
        raise ServeError(
            f"cannot use the cluster ({type(exc).__name__}: {exc}): run in the cluster or set "
            "KUBECONFIG to a working kubeconfig, or pass --config-dir DIR to run locally"
        ) from exc
    threading.Thread(
        target=maintain_certificates,
        args=(api, target, cert_dir),
        kwargs={"stop": stop},
        name="fairgate-cert-maintainer",
        daemon=True,
    ).start()
    source = ClusterConfigSource(api, namespace)
    source.start()
    return source


def serve(options: ServeOptions) -> None:
    """Run the webhook until SIGTERM/SIGINT (see the module contract)."""
    stop = threading.Event()
    if options.config_dir is not None:
        source = _local_source(options.config_dir)
    else:
        source = _cluster_source(options.cert_dir, stop)
    client = connect_redis(options.redis_url, options.redis_timeout)
    try:
        service = AdmissionService(source, client)
        app = create_app(service, deadline_seconds=options.deadline_seconds)
        context = server_ssl_context(options.cert_dir)
        reloader = CertReloader(context, options.cert_dir)
        config = uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            ssl_context_factory=lambda _config, _default: context,
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=int(options.graceful_seconds),
            lifespan="on",
        )
        server = uvicorn.Server(config)

        async def main() -> None:
            async with reloader.running():
                await server.serve()

        log.info("serving https://%s:%d (mutate, validate)", options.host, options.port)
        # uvicorn handles SIGTERM gracefully, then re-raises it once done: end with 0.
        signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
        asyncio.run(main())
    finally:
        stop.set()
        source.close()
        client.close()
