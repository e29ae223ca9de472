"""Run a private ``redis-server`` on a free loopback port.

Contract: :func:`local_redis` starts ``redis-server`` (no persistence, bound to
127.0.0.1, a free port) and yields its URL; the server is stopped when the context
exits. Used by ``fairgate demo``, ``fairgate simulate`` and the tests.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis


class RedisServerNotFoundError(RuntimeError):
    """``redis-server`` is not installed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def local_redis(startup_timeout: float = 10.0) -> Iterator[str]:
    """Start a throwaway redis-server and yield ``redis://127.0.0.1:<port>/0``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerNotFoundError(
            "redis-server not found: install it (Debian/Ubuntu: apt-get install redis-server) "
            "or point --redis-url / REDIS_URL at a running Redis"
        )
    with tempfile.TemporaryDirectory(prefix="fairgate-redis-") as workdir:
        port = free_port()
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            _wait_ready(url, process, startup_timeout)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url, socket_timeout=0.5)
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
        raise TimeoutError(f"redis-server on {url} not ready after {timeout}s")
    finally:
        client.close()
