"""Fixtures of the fair queue tests that start their own redis-servers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from fairshare.localredis import local_redis


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[str, redis.Redis]]:
    """A fresh primary's URL and a client on its one linked replica."""
    with local_redis() as primary, local_redis() as replica_url:
        replica = redis.Redis.from_url(replica_url, socket_timeout=5)
        port = int(primary.rsplit(":", 1)[1].split("/")[0])
        with redis.Redis.from_url(primary) as source:
            source.config_set("repl-diskless-sync-delay", 0)  # Redis 7 waits 5 s by default
        replica.replicaof("127.0.0.1", port)
        deadline = time.monotonic() + 30  # a setup wait: a loaded machine forks slowly
        while replica.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not link"
            time.sleep(0.05)
        yield primary, replica
        os.kill(int(replica.info("server")["process_id"]), signal.SIGCONT)
        replica.close()
