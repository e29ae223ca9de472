"""fairgate's Sentinel client against a real Sentinel deployment (3 redis-server + 3
sentinels on loopback): it finds the primary, follows a promotion, and its Lua survives
the promotion: scripts (the audit log's; the script cache is not replicated: redis-py
reloads on NOSCRIPT) and the queue's function library (replicated: nothing to reload).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import redis
from sentinel_kit import PASSWORD, SentinelCluster

from fairshare.connection import RedisTarget, connect_redis, connect_redis_async
from fairshare.queue.calls import library
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tests.fairshare.queue.test_queue import config

pytestmark = pytest.mark.slow


def test_sentinel_url_reaches_the_primary_and_follows_a_promotion(
    sentinel_cluster: SentinelCluster,
) -> None:
    target = RedisTarget.resolve(sentinel_cluster.url, environ={"REDIS_PASSWORD": PASSWORD})
    client = connect_redis(target, timeout=1.0)
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    try:
        assert script(keys=["n"]) == 1
        old = sentinel_cluster.primary()
        assert client.connection_pool.get_master_address()[1] == old.port  # type: ignore[attr-defined]
        assert client.wait(1, 1000) >= 1  # replicated before the primary dies
        old.kill()
        sentinel_cluster.wait_failover(old.port)
        new = sentinel_cluster.primary()
        direct = new.client()
        try:
            # The new primary never saw the script: EVALSHA answers NOSCRIPT there.
            assert direct.script_exists(script.sha) == [False]
            deadline = time.monotonic() + 5
            while True:  # the first call may still meet the dead primary's connection
                try:
                    value = script(keys=["n"])
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline
            assert value == 2  # the acknowledged write survived; the script reloaded
            assert direct.script_exists(script.sha) == [True]
            assert direct.get("n") == b"2"
        finally:
            direct.close()
    finally:
        client.close()


def test_async_sentinel_client_follows_a_promotion(sentinel_cluster: SentinelCluster) -> None:
    target = RedisTarget.resolve(sentinel_cluster.url, environ={"REDIS_PASSWORD": PASSWORD})

    async def scenario() -> tuple[int, int, int]:
        client = connect_redis_async(target, timeout=1.0)
        script = client.register_script("return redis.call('INCR', KEYS[1])")
        try:
            first = int(await script(keys=["n"]))
            await client.wait(1, 1000)
            old = sentinel_cluster.primary()
            old.kill()
            await asyncio.to_thread(sentinel_cluster.wait_failover, old.port)
            deadline = time.monotonic() + 5
            while True:
                try:
                    second = int(await script(keys=["n"]))
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline
            return first, second, sentinel_cluster.primary_port()
        finally:
            await client.aclose()

    first, second, port = asyncio.run(scenario())
    assert (first, second) == (1, 2)
    assert port in {s.port for s in sentinel_cluster.servers}


def test_the_queue_library_is_on_a_promoted_replica(sentinel_cluster: SentinelCluster) -> None:
    """Functions replicate: the new primary has the queue's library, so the first
    admission after the failover loads nothing, and the acknowledged one survived."""
    target = RedisTarget.resolve(sentinel_cluster.url, environ={"REDIS_PASSWORD": PASSWORD})
    client = connect_redis(target, timeout=1.0)

    def pod(n: int) -> PodRequest:
        return PodRequest(ticket=f"t{n}", tenant="a", namespace="ns", name=f"p{n}",
                          pod_class="training", demand={"gpu": 1}, submitted_at=float(n))

    try:
        queue = FairQueue(client)
        queue.sync_config(config(a={"nominal": {"gpu": 4}}), {"gpu": 4})
        assert queue.admit(pod(1), 1.0).outcome == "reserved"
        assert client.wait(2, 1000) >= 1  # replicated before the primary dies
        old = sentinel_cluster.primary()
        old.kill()
        sentinel_cluster.wait_failover(old.port)
        direct = sentinel_cluster.primary().client()
        try:
            assert [entry[1] for entry in direct.function_list()] == [library().name.encode()]
            direct.config_resetstat()
            deadline = time.monotonic() + 5
            while True:  # the first call may still meet the dead primary's connection
                try:
                    admitted = queue.admit(pod(2), 2.0)
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline
            assert admitted.outcome == "reserved"
            assert "cmdstat_function|load" not in direct.info("commandstats")
            assert [s.used for s in queue.tenant_status()] == [{"gpu": 2}]
        finally:
            direct.close()
    finally:
        client.close()


def test_wrong_password_is_refused_by_sentinels_and_servers(
    sentinel_cluster: SentinelCluster,
) -> None:
    client = connect_redis(RedisTarget(sentinel_cluster.url, "not-the-password"), timeout=1.0)
    try:
        with pytest.raises(redis.ConnectionError):  # no sentinel lets it ask
            client.ping()
    finally:
        client.close()


@pytest.mark.parametrize("command", [["status"], ["audit", "verify"]])
def test_commands_take_a_sentinel_url(
    sentinel_cluster: SentinelCluster, command: list[str]
) -> None:
    env = {**os.environ, "REDIS_PASSWORD": PASSWORD}
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *command, "--redis-url", sentinel_cluster.url],
        capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr


def test_a_malformed_sentinel_url_is_refused_with_the_form_to_use() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "status", "--redis-url",
         "redis+sentinel://:hunter2@s1:26379"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "the master name" in done.stderr and "redis+sentinel://" in done.stderr
    assert "hunter2" not in done.stderr
