"""``fairgate serve`` as a child process on loopback, for the demo, tests and benchmarks.

Contract: :class:`ServeProcess` starts ``python -P -m webhook.cli serve``
(:func:`webhook.child.module_command`: the working directory is not on its import path)
on 127.0.0.1 and a free port with the given cert dir, config dir and Redis (a URL or a
:class:`fairshare.connection.RedisTarget`: its password reaches the child in
``$REDIS_PASSWORD``, never on the command line), waits until ``/healthz``
answers over HTTPS verified against the cert dir's ``ca.crt`` (raising
:class:`ServeStartError` with the child's log when it does not), and stops it with
SIGTERM (then SIGKILL after ``stop_timeout``) when the context exits. The child's
stdout and stderr go to ``log_path``.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from fairshare.connection import PASSWORD_ENV, RedisTarget
from fairshare.localredis import free_port
from webhook.child import module_command

HOST = "127.0.0.1"


class ServeStartError(RuntimeError):
    """``fairgate serve`` did not come up; the message holds the end of its log."""


def client_context(ca_file: Path) -> ssl.SSLContext:
    """A TLS client context that trusts only ``ca_file`` and checks the host name."""
    return ssl.create_default_context(cafile=str(ca_file))


class ServeProcess:
    """A running ``fairgate serve`` child (use as a context manager)."""

    def __init__(
        self,
        cert_dir: Path,
        redis_target: RedisTarget | str,
        config_dir: Path,
        log_path: Path,
        *,
        port: int | None = None,
        workers: int = 1,
        wait_for_rebuild: bool = False,
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
        extra: tuple[str, ...] = (),
        clock_file: Path | None = None,
    ) -> None:
        """Prepare to serve on 127.0.0.1:``port`` (a free port by default) with
        ``workers`` processes (``wait_for_rebuild``: see ``fairgate serve --help``;
        ``extra``: more ``fairgate serve`` arguments), on the time written in
        ``clock_file`` if given (:func:`webhook.server.file_clock`)."""
        self.cert_dir = cert_dir
        self.redis = RedisTarget.of(redis_target)
        self.config_dir = config_dir
        self.log_path = log_path
        self.port = port if port is not None else free_port()
        self.workers = workers
        self.wait_for_rebuild = wait_for_rebuild
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra = extra
        self.clock_file = clock_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{HOST}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The CA bundle clients must trust."""
        return self.cert_dir / "ca.crt"

    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An HTTPS client that verifies the server against :attr:`ca_file`."""
        return httpx.Client(
            base_url=self.base_url, verify=client_context(self.ca_file), timeout=timeout
        )

    def start(self) -> None:
        """Start the child and wait until it answers ``/healthz``."""
        url, password = self.redis.apart()
        command = module_command(
            "webhook.cli", "serve",
            "--cert-dir", str(self.cert_dir), "--port", str(self.port), "--host", HOST,
            "--redis-url", url, "--config-dir", str(self.config_dir),
            "--workers", str(self.workers),
            "--wait-for-rebuild" if self.wait_for_rebuild else "--no-wait-for-rebuild",
            *self.extra,
        )
        if self.redis.ca_file is not None:
            command += ["--redis-ca-file", str(self.redis.ca_file)]
        if self.clock_file is not None:
            command += ["--clock-file", str(self.clock_file)]
        env = {k: v for k, v in os.environ.items()
               if k not in (PASSWORD_ENV, "REDIS_PASSWORD_FILE", "REDIS_CA_FILE")}
        if password is not None:
            env[PASSWORD_ENV] = password
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + self.startup_timeout
        with self.client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServeStartError(
                        f"fairgate serve exited with code {self.process.returncode}:\n"
                        + self.log_tail()
                    )
                try:
                    if client.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise ServeStartError(
            f"fairgate serve did not answer on {self.base_url} within "
            f"{self.startup_timeout}s:\n" + self.log_tail()
        )

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; the exit code (None if never run)."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the child's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> ServeProcess:
        """Start; see :meth:`start`."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop; see :meth:`stop`."""
        self.stop()
