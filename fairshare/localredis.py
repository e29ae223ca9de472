"""Run a private ``redis-server`` on a free loopback port.

Contract: :func:`local_redis` starts ``redis-server`` (no persistence, bound to
127.0.0.1, a free port) and yields its URL; the server is stopped when the context
exits. With ``password`` every client must authenticate (``requirepass``, given to the
server on its stdin, never on its command line); with ``tls_dir`` (``tls.crt``,
``tls.key`` as ``fairgate certs generate`` writes them) it serves TLS only and the URL
is ``rediss://``. The URL never holds the password: the caller passes it on (a
:class:`fairshare.connection.RedisTarget`). The server runs in a process group of its own,
so a Ctrl-C at the terminal reaches only its caller, which stops it last, when the
context exits (it does not die under a console or demo still using it). Used by
``fairgate demo``, ``fairgate simulate`` and the tests.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from fairshare.connection import RedisTarget, connect_redis


class RedisServerNotFoundError(RuntimeError):
    """``redis-server`` is not installed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tls_arguments(port: int, tls_dir: Path | None) -> list[str]:
    if tls_dir is None:
        return ["--port", str(port)]
    return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls_dir / "tls.crt"),
            "--tls-key-file", str(tls_dir / "tls.key"), "--tls-auth-clients", "no"]


@contextmanager
def local_redis(
    startup_timeout: float = 10.0, *, password: str | None = None, tls_dir: Path | None = None
) -> Iterator[str]:
    """Start a throwaway redis-server and yield ``redis://127.0.0.1:<port>/0``
    (``rediss://`` with ``tls_dir``); see the module contract."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerNotFoundError(
            "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) "
            "or point --redis-url / REDIS_URL at a running Redis"
        )
    with tempfile.TemporaryDirectory(prefix="fairgate-redis-") as workdir:
        port = free_port()
        process = subprocess.Popen(
            [binary, "-", *_tls_arguments(port, tls_dir), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir, "--protected-mode", "yes"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            process_group=0,  # Ctrl-C is for the caller, which stops it when done
        )
        assert process.stdin is not None
        if password is not None:
            process.stdin.write(f'requirepass "{_config_quoted(password)}"\n'.encode())
        process.stdin.close()
        url = f"{'rediss' if tls_dir else 'redis'}://127.0.0.1:{port}/0"
        ca_file = tls_dir / "ca.crt" if tls_dir else None
        try:
            _wait_ready(RedisTarget(url, password, ca_file), process, startup_timeout)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _config_quoted(text: str) -> str:
    """``text`` escaped for a double-quoted redis.conf argument."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _wait_ready(target: RedisTarget, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    client = connect_redis(target, 0.5)
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                stderr = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {stderr.strip()}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on {target} not ready after {timeout}s")
    finally:
        client.close()
