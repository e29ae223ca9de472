"""The Redis password Secret against a real kube-apiserver, and Redis started from it.

``fairgate redis-secret`` (the webhook's init container) must create one Secret even when
every replica races, keep it across runs, re-derive ``users.acl`` after an operator sets
their own password, and the ``users.acl`` it writes must make a real redis-server demand
exactly that password.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from harness.controlplane import ControlPlane, build_controlplane
from kubernetes import client, config

from certs.redis_secret import ACL_KEY, PASSWORD_KEY, acl_file, ensure_redis_secret
from fairshare.connection import RedisTarget, connect_redis
from fairshare.localredis import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPLICAS = 4


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(build_controlplane(), tmp_path_factory.mktemp("redis-secret-cp"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def _api(plane: ControlPlane) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(plane.admin_kubeconfig), persist_config=False
    )
    return api


@pytest.fixture
def namespace(apiserver: ControlPlane) -> Iterator[str]:
    name = f"redis-auth-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(_api(apiserver))
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _data(plane: ControlPlane, namespace: str) -> dict[str, str]:
    secret = client.CoreV1Api(_api(plane)).read_namespaced_secret("fairgate-redis-auth", namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def test_racing_replicas_create_one_password_that_later_runs_keep(
    apiserver: ControlPlane, namespace: str
) -> None:
    outcomes: list[str] = []
    barrier = threading.Barrier(REPLICAS)

    def replica() -> None:
        api = _api(apiserver)
        barrier.wait()
        outcomes.append(ensure_redis_secret(api, namespace))

    threads = [threading.Thread(target=replica) for _ in range(REPLICAS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["created"] + ["unchanged"] * (REPLICAS - 1)
    data = _data(apiserver, namespace)
    assert len(data[PASSWORD_KEY]) >= 40
    assert data[ACL_KEY] == acl_file(data[PASSWORD_KEY])
    assert data[PASSWORD_KEY] not in data[ACL_KEY]  # only its hash
    assert ensure_redis_secret(_api(apiserver), namespace) == "unchanged"
    assert _data(apiserver, namespace) == data


def test_an_operators_own_password_gets_a_matching_acl_file(
    apiserver: ControlPlane, namespace: str
) -> None:
    core = client.CoreV1Api(_api(apiserver))
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": "fairgate-redis-auth"},
        "stringData": {PASSWORD_KEY: "operator-chosen-password"},
    })
    assert ensure_redis_secret(_api(apiserver), namespace) == "updated"
    data = _data(apiserver, namespace)
    assert data == {PASSWORD_KEY: "operator-chosen-password",
                    ACL_KEY: acl_file("operator-chosen-password")}


def test_the_command_reports_without_printing_the_password(
    apiserver: ControlPlane, namespace: str
) -> None:
    import os

    env = {**os.environ, "KUBECONFIG": str(apiserver.admin_kubeconfig)}
    run = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "redis-secret", "--namespace", namespace],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )
    assert run.returncode == 0, run.stderr
    assert f"Secret {namespace}/fairgate-redis-auth: created" in run.stdout
    password = _data(apiserver, namespace)[PASSWORD_KEY]
    assert password not in run.stdout + run.stderr


def test_redis_started_with_the_acl_file_wants_exactly_that_password(
    apiserver: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """As the StatefulSet runs it: --aclfile pointing at the Secret's users.acl."""
    ensure_redis_secret(_api(apiserver), namespace)
    data = _data(apiserver, namespace)
    (tmp_path / "users.acl").write_text(data[ACL_KEY])
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--protected-mode", "yes",
         "--aclfile", str(tmp_path / "users.acl")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        owner = connect_redis(RedisTarget(url, data[PASSWORD_KEY]), timeout=2.0)
        for _ in range(100):
            try:
                owner.ping()
                break
            except redis.AuthenticationError:
                raise
            except redis.ConnectionError:
                time.sleep(0.05)
        assert owner.set("fairgate:k", "v")
        owner.close()
        stranger = connect_redis(RedisTarget(url), timeout=2.0)
        with pytest.raises(redis.AuthenticationError):
            stranger.get("fairgate:k")
        stranger.close()
    finally:
        server.terminate()
        server.wait(10)
