"""Fixtures for the webhook tests: certificates and ``fairgate serve`` processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from webhook_helpers import ServerFactory, write_config

from certs import write_bundle
from webhook.process import ServeProcess


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and a serving certificate that also names 127.0.0.1."""
    directory = tmp_path_factory.mktemp("certs")
    write_bundle(directory, extra_sans=("127.0.0.1", "localhost"))
    return directory



@pytest.fixture
def start_server(
    cert_dir: Path, tmp_path: Path
) -> Iterator[ServerFactory]:
    """Start ``fairgate serve`` processes; all are stopped at the end of the test."""
    started: list[ServeProcess] = []

    def start(redis_url: str, policy: str = "deny", cert_dir: Path = cert_dir,
              capacity: bool = True, extra: tuple[str, ...] = ()) -> ServeProcess:
        n = len(started)
        config = write_config(tmp_path / f"config-{n}", policy, capacity)
        server = ServeProcess(cert_dir, redis_url, config, tmp_path / f"serve-{n}.log",
                              extra=extra)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def shared_server(
    cert_dir: Path, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """One ``fairgate serve`` per test module, on the session's Redis."""
    directory = tmp_path_factory.mktemp("serve")
    config = write_config(directory / "config")
    with ServeProcess(cert_dir, redis_server_url, config, directory / "serve.log") as server:
        yield server


@pytest.fixture
def server(shared_server: ServeProcess, redis_url: str) -> ServeProcess:
    """The module's ``fairgate serve``, its Redis emptied before the test (the webhook
    re-syncs its config into an empty Redis by itself)."""
    return shared_server
