"""Fixtures of the fuzz tests: one ``fairgate serve`` per module, with a shared HTTPS
client, and the number of examples (``FAIRGATE_FUZZ_EXAMPLES``, set by ``bench/fuzz.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))

from fault_kit import cert_dir, write_config

from webhook.process import ServeProcess

__all__ = ["cert_dir"]


def examples(default: int) -> int:
    """How many examples a fuzz test runs: ``default`` (CI), or the bench's count."""
    return int(os.environ.get("FAIRGATE_FUZZ_EXAMPLES", default))


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@pytest.fixture(scope="module")
def fuzz_server(
    cert_dir: Path, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """One ``fairgate serve`` (the webhook tests' config) on the session's Redis."""
    directory = tmp_path_factory.mktemp("fuzz")
    config = write_config(directory / "config")
    with ServeProcess(cert_dir, redis_server_url, config, directory / "serve.log") as server:
        yield server


@pytest.fixture(scope="module")
def fuzz_client(fuzz_server: ServeProcess) -> Iterator[httpx.Client]:
    """A keep-alive HTTPS client of :func:`fuzz_server`."""
    with fuzz_server.client(timeout=30.0) as client:
        yield client
