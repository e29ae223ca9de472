"""Helpers of the console tests: ``fairgate console`` as a child process, a real browser
(Debian's Chromium through selenium), and what a server did with raw sockets opened to
it."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


class ConsoleProcess:
    """``python -m webhook.cli console`` on 127.0.0.1 and a free port (context manager).

    ``url`` is the URL from its first stdout line (``console: <url>``); ``base`` is
    ``http(s)://127.0.0.1:<port>`` and ``token`` the access token in it. ``ca``: the CA
    file its HTTPS certificate is checked against (with ``--cert-dir``).
    """

    def __init__(self, redis_url: str, config_dir: Path | None, log_path: Path,
                 *extra: str, ca: Path | None = None) -> None:
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca)) if ca is not None else True)
        self.command = [sys.executable, "-m", "webhook.cli", "console", "--redis-url",
                        redis_url, "--port", "0", *extra]
        if config_dir is not None:
            self.command += ["--config-dir", str(config_dir)]
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self.first_line = ""
        self.url = ""

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def token(self) -> str:
        return urlsplit(self.url).query.removeprefix("token=")

    def start(self, timeout: float = 30.0) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = self.log_path.open("a")
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log,
                                        text=True, env=env)
        assert self.process.stdout is not None
        self.first_line = self.process.stdout.readline().rstrip("\n")
        assert self.first_line.startswith("console: "), (
            f"first stdout line {self.first_line!r}; log:\n{self.log_path.read_text()}")
        self.url = self.first_line.removeprefix("console: ")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/healthz", timeout=1,
                             verify=self.verify).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"console did not answer /healthz:\n{self.log_path.read_text()}")

    def client(self) -> httpx.Client:
        """A client presenting the access token as a bearer token."""
        return httpx.Client(base_url=self.base, timeout=10, verify=self.verify,
                            headers={"Authorization": f"Bearer {self.token}"})

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ConsoleProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def browser(size: str = "1400,900") -> WebDriver:
    """Headless Debian Chromium driven by Debian's chromedriver (selenium); its console
    messages (JavaScript errors, refused loads) are kept for ``get_log("browser")``."""
    assert CHROMIUM is not None and CHROMEDRIVER is not None, (
        "install Debian's chromium and chromium-driver (see .ci/run)")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", f"--window-size={size}"):
        options.add_argument(argument)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def closed_within(socks: list[socket.socket] | list[ssl.SSLSocket], seconds: float
                   ) -> tuple[int, list[bytes]]:
    """How many of ``socks`` the server closed within ``seconds``, and what it sent."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed, answers = 0, []
    deadline = time.monotonic() + seconds
    while closed < len(socks) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            except OSError:
                data = b""
            if data:
                answers.append(data)
                continue
            selector.unregister(sock)
            closed += 1
    selector.close()
    return closed, answers
