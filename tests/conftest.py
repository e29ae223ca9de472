"""Shared fixtures: a real redis-server per test session, flushed per test; the `peer`
tests left out unless asked for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fairshare.localredis import local_redis


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the tests marked `peer` unless the `-m` expression names `peer`
    (`python -m pytest -m peer`): they need Kueue built from Go modules, about 18 min cold
    on 2 cores, for the peer comparison (bench/peer_kueue.py), not for fairgate. A hook
    rather than `-m "not peer"` in addopts, which any `-m` given on the command line
    (`-m e2e`, `-m "not slow"`) would replace."""
    if "peer" in (config.getoption("markexpr") or ""):
        return
    peer = [item for item in items if item.get_closest_marker("peer") is not None]
    if peer:
        config.hook.pytest_deselected(items=peer)
        items[:] = [item for item in items if item.get_closest_marker("peer") is None]


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """URL of a real redis-server started for this test session."""
    with local_redis() as url:
        yield url


@pytest.fixture
def redis_url(redis_server_url: str) -> Iterator[str]:
    """URL of the session's redis-server, emptied before each test."""
    client = redis.Redis.from_url(redis_server_url)
    client.flushall()
    client.close()
    yield redis_server_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the emptied session redis-server."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
