"""Connections are bounded: half-sent requests are closed within the request timeout,
connections beyond the cap are refused with a 503 saying why, and the server still
answers. Real sockets against a real ``fairgate console`` (HTTP) and ``fairgate serve``
(HTTPS with certificates the tests generate)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from console_helpers import ConsoleProcess, closed_within, open_fds
from webhook_helpers import write_config

from webhook.process import ServeProcess, client_context

HALF_SENT = b"GET /api/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def test_the_console_closes_half_sent_requests_and_caps_connections(
        tmp_path: Path, redis_server_url: str) -> None:
    cap, timeout, tried = 40, 4.0, 120
    with ConsoleProcess(redis_server_url, None, tmp_path / "console.log",
                        "--max-connections", str(cap), "--request-timeout",
                        str(timeout)) as console:
        assert console.process is not None
        pid = console.process.pid
        before = open_fds(pid)
        parts = urlsplit(console.base)
        socks = []
        for _ in range(tried):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
            sock.sendall(HALF_SENT)
            socks.append(sock)
        time.sleep(2)  # refused ones are read for a second, so that the 503 arrives
        assert open_fds(pid) <= before + cap + 5  # at the cap: the rest were closed
        started = time.monotonic()
        closed, answers = closed_within(socks, timeout + 5)
        elapsed = time.monotonic() - started
        assert closed == tried, (closed, elapsed)
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= tried - cap
        assert all(b"too many connections" in a for a in refused)
        assert elapsed < timeout + 3
        for sock in socks:
            sock.close()
        assert open_fds(pid) <= before + 5
        with console.client() as client:  # still serving, and to a real request at once
            assert client.get("/api/tenants").status_code == 200


def test_an_idle_connection_is_closed_and_a_slow_request_body_too(
        tmp_path: Path, redis_server_url: str) -> None:
    with ConsoleProcess(redis_server_url, None, tmp_path / "console.log",
                        "--request-timeout", "1.5") as console:
        parts = urlsplit(console.base)
        silent = socket.create_connection((parts.hostname, parts.port), timeout=5)
        slow = socket.create_connection((parts.hostname, parts.port), timeout=5)
        slow.sendall(b"POST /api/tenants HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n12")
        closed, _ = closed_within([silent, slow], 5)
        assert closed == 2
        silent.close()
        slow.close()


def test_the_webhook_closes_half_sent_tls_requests_and_caps_connections(
        tmp_path: Path, redis_url: str, cert_dir: Path) -> None:
    cap, timeout, tried = 30, 2.0, 80
    config = write_config(tmp_path / "config")
    with ServeProcess(cert_dir, redis_url, config, tmp_path / "serve.log",
                      extra=("--max-connections", str(cap), "--request-timeout",
                             str(timeout))) as server:
        assert server.process is not None
        context = client_context(server.ca_file)
        socks = []
        for _ in range(tried):
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
            socks.append(sock)
        started = time.monotonic()
        closed, answers = closed_within(socks, timeout + 6)
        assert closed == tried
        assert time.monotonic() - started < timeout + 4
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= tried - cap - 1
        for sock in socks:
            sock.close()
        with httpx.Client(base_url=server.base_url, verify=context, timeout=5) as client:
            assert client.get("/healthz").status_code == 200


def test_the_webhook_ends_a_tls_handshake_that_never_starts(
        tmp_path: Path, redis_url: str, cert_dir: Path) -> None:
    """A TCP connection that never sends a ClientHello is closed within the request
    timeout, not the event loop's 60 s handshake timeout."""
    timeout = 2.0
    config = write_config(tmp_path / "config")
    with ServeProcess(cert_dir, redis_url, config, tmp_path / "serve.log",
                      extra=("--request-timeout", str(timeout))) as server:
        assert server.process is not None
        pid = server.process.pid
        before = open_fds(pid)
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
                 for _ in range(50)]
        time.sleep(0.5)
        assert open_fds(pid) >= before + 40  # accepted, waiting for a ClientHello
        started = time.monotonic()
        closed, answers = closed_within(socks, timeout + 6)
        assert closed == 50 and not answers
        assert time.monotonic() - started < timeout + 4
        for sock in socks:
            sock.close()
        assert open_fds(pid) <= before + 5
