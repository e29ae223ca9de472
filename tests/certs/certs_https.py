"""Test support: a tiny ASGI app and a handle on a running HTTPS server."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

SERVICE_DNS = "fairgate-webhook.fairgate-system.svc"
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class App:
    """ASGI app: ``GET /`` answers ``ok``; ``GET /hold`` answers once ``release`` is set.

    ``held`` counts /hold requests the server is in the middle of.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":
            self.held += 1
            try:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            finally:
                self.held -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class HttpsServer:
    """A running uvicorn server whose SSLContext is kept current by a CertReloader."""

    cert_dir: Path
    port: int
    app: App
    reloaded: list[x509.Certificate] = field(default_factory=list)
    reload_seen: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts the cert dir's CA."""
        return ssl.create_default_context(cafile=self.cert_dir / "ca.crt")

    def peer_serial(self, server_hostname: str = "127.0.0.1") -> int:
        """Serial of the certificate a new verified connection is served."""
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            self.client_context().wrap_socket(raw, server_hostname=server_hostname) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number
