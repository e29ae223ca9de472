"""Redis authentication, attacked: without the password nothing can be read or written,
and ``fairgate serve`` with it works end to end over HTTPS without ever showing it.

A real redis-server that requires a password (as the manifests' Redis does), a real
``fairgate serve`` child process with certificates from ``certs``, real AdmissionReview
v1 requests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from certs import write_bundle
from fairshare.connection import RedisTarget, connect_redis
from fairshare.localredis import local_redis
from webhook.demo import DemoPod, admission_review, write_demo_config
from webhook.process import ServeProcess

PASSWORD = "fg-" + uuid.uuid4().hex  # unique, so finding it anywhere is a real leak


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[str]:
    """A redis-server requiring PASSWORD, holding one precious key; its URL."""
    with local_redis(password=PASSWORD) as url:
        owner = connect_redis(RedisTarget(url, PASSWORD))
        owner.set("fairgate:precious", "quota")
        owner.close()
        yield url


# What an attacker on the network would try: read, write, script, wipe, reconfigure.
ATTACKS: list[tuple[str, ...]] = [
    ("GET", "fairgate:precious"),
    ("SET", "fairgate:precious", "stolen"),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("EVAL", "return redis.call('SET', KEYS[1], 'stolen')", "1", "fairgate:precious"),
    ("XADD", "fairgate:audit", "*", "forged", "1"),
    ("DEL", "fairgate:precious"),
    ("FLUSHALL",),
    ("CONFIG", "SET", "requirepass", ""),
    ("ACL", "SETUSER", "default", "nopass"),
    ("SELECT", "1"),
]


@pytest.mark.parametrize("password", [None, "wrong", PASSWORD.upper()],
                         ids=["no password", "wrong password", "case-changed password"])
@pytest.mark.parametrize("command", ATTACKS, ids=lambda c: c[0])
def test_a_client_without_the_password_can_read_or_write_nothing(
    locked_redis: str, password: str | None, command: tuple[str, ...]
) -> None:
    # A raw client without fairgate's helpers: the attacker has no reason to use them.
    stranger = redis.Redis.from_url(locked_redis, password=password, protocol=2)
    # redis-py raises AuthenticationError for the server's NOAUTH and WRONGPASS replies.
    with pytest.raises(redis.AuthenticationError):
        stranger.execute_command(*command)
    stranger.close()
    owner = connect_redis(RedisTarget(locked_redis, PASSWORD))
    assert owner.get("fairgate:precious") == b"quota"
    assert owner.exists("fairgate:audit") == 0
    owner.close()


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    write_bundle(directory, extra_sans=("127.0.0.1", "localhost"))
    return directory


def _mutate(server: ServeProcess, pod: DemoPod) -> dict[str, Any]:
    with server.client() as http:
        reply = http.post("/mutate", json=admission_review(pod.manifest(), str(uuid.uuid4())))
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()["response"]
    return response


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_serve_with_the_password_works_end_to_end_and_never_shows_it(
    locked_redis: str, cert_dir: Path, tmp_path: Path
) -> None:
    write_demo_config(tmp_path / "config")
    log_path = tmp_path / "serve.log"
    target = RedisTarget(locked_redis, PASSWORD)
    with ServeProcess(cert_dir, target, tmp_path / "config", log_path) as server:
        assert server.process is not None
        assert PASSWORD not in _cmdline(server.process.pid)
        with server.client() as http:
            ready = http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert PASSWORD not in ready.text
        pod = DemoPod("team-a-prod", "trainer-0", {"gpu": 1})
        response = _mutate(server, pod)
        assert response["allowed"] is True
        assert response["auditAnnotations"]["decision"] == "admit"
    owner = connect_redis(target)
    try:
        # The decision reached Redis (a reservation and a chained audit record) ...
        entries = owner.xrange("fairgate:audit")
        assert entries, "no audit record was stored"
        records = [json.loads(fields[b"record"]) if b"record" in fields else fields
                   for _, fields in entries]
        assert any("trainer-0" in json.dumps(r, default=str) for r in records)
        assert owner.dbsize() > 2
        # ... and nothing stored there holds the password.
        for key in owner.scan_iter(count=1000):
            assert PASSWORD.encode() not in owner.dump(key)
    finally:
        owner.close()
    assert PASSWORD not in log_path.read_text()


def test_serve_with_a_wrong_password_is_not_ready_and_does_not_echo_it(
    locked_redis: str, cert_dir: Path, tmp_path: Path
) -> None:
    write_demo_config(tmp_path / "config")
    wrong = "fg-wrong-" + uuid.uuid4().hex
    log_path = tmp_path / "serve.log"
    with ServeProcess(cert_dir, RedisTarget(locked_redis, wrong), tmp_path / "config",
                      log_path) as server:
        with server.client() as http:
            ready = http.get("/readyz")
        assert ready.status_code == 503
        assert "redis" in ready.text.lower()
        assert wrong not in ready.text and PASSWORD not in ready.text
        response = _mutate(server, DemoPod("team-a-prod", "trainer-1", {"gpu": 1}))
        assert response["allowed"] is False  # the demo config denies when Redis is down
        assert wrong not in json.dumps(response)
    assert wrong not in log_path.read_text()
    owner = connect_redis(RedisTarget(locked_redis, PASSWORD))
    assert owner.get("fairgate:precious") == b"quota"
    owner.close()
