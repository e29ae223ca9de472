"""Shared fixtures: a real redis-server per test session, flushed per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from fairshare.localredis import local_redis


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
