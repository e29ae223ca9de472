"""Fixtures: a cert dir, and a real uvicorn HTTPS server on 127.0.0.1 with a live reloader."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from certs_https import App, HttpsServer
from cryptography import x509

from certs import CertReloader, server_ssl_context, write_bundle

# The e2e harness (tests/e2e/harness) is used as a library to start a real API server.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    out = tmp_path / "certs"
    write_bundle(out, extra_sans=["127.0.0.1", "localhost"])
    return out


@pytest.fixture(params=["asyncio", "uvloop"])
def https_server(request: pytest.FixtureRequest, cert_dir: Path) -> Iterator[HttpsServer]:
    """uvicorn on a free loopback port (asyncio and uvloop loops), reloader polling at 50 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server_info = HttpsServer(cert_dir, sock.getsockname()[1], App())

    def on_reload(cert: x509.Certificate) -> None:
        server_info.reloaded.append(cert)
        server_info.reload_seen.set()

    context = server_ssl_context(cert_dir)
    reloader = CertReloader(context, cert_dir, interval=0.05, on_reload=on_reload)
    config = uvicorn.Config(
        server_info.app,
        loop=request.param,
        lifespan="off",
        log_level="warning",
        ssl_context_factory=lambda _config, _default: context,
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        async with reloader.running():
            await server.serve(sockets=[sock])

    def run() -> None:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            runner.run(main())

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        thread.join(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield server_info
    finally:
        server_info.app.release.set()
        server.should_exit = True
        thread.join(10)
        sock.close()
