"""AdmissionService in-process (real Redis, real config dir): the fallback answers the app
gives when a decision misses its deadline."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from webhook_helpers import gpu_pod, review, write_config

from audit import AuditLog
from fairshare.connection import connect_redis, connect_redis_async
from fairshare.localredis import free_port
from tenants.source import LocalDirSource
from webhook.service import (
    OVERDUE_MESSAGE,
    REDIS_DOWN_MESSAGE,
    AdmissionService,
    Progress,
)


@pytest.fixture
def service(tmp_path: Path, redis_url: str) -> Iterator[AdmissionService]:
    source = LocalDirSource(write_config(tmp_path / "config"))
    source.start()
    client = connect_redis(redis_url)
    admission = AdmissionService(source, connect_redis_async(redis_url),
                                 AuditLog(client, out=io.StringIO()))
    admission.start()
    yield admission
    admission.stop()
    client.close()


def _overdue(service: AdmissionService, webhook: str, body: dict[str, object]) -> dict[str, object]:
    answer = service.overdue(webhook, json.dumps(body).encode(),  # type: ignore[arg-type]
                             Progress(time.perf_counter()), 1.0)
    response: dict[str, object] = answer.to_json()["response"]
    return response


def test_an_overdue_validation_of_a_gpu_pod_is_refused_as_overloaded(
    service: AdmissionService,
) -> None:
    response = _overdue(service, "validate", review(gpu_pod("team-a-dev", "slow")))
    assert response["allowed"] is False
    assert response["status"] == {"code": 503, "reason": "ServiceUnavailable",
                                  "message": OVERDUE_MESSAGE.format(seconds=1.0)}
    assert "internal error" not in str(response)
    assert service.metrics.overdue.labels("validate")._value.get() == 1


def test_an_overdue_pod_create_follows_the_redis_policy(service: AdmissionService) -> None:
    response = _overdue(service, "mutate", review(gpu_pod("team-a-dev", "slow")))
    assert response["allowed"] is False
    assert response["status"]["message"] == REDIS_DOWN_MESSAGE  # type: ignore[index]


def test_an_overdue_request_fairgate_does_not_own_is_allowed(service: AdmissionService) -> None:
    cpu_only = gpu_pod("team-a-dev", "web", limits={"cpu": "1"})
    for webhook in ("mutate", "validate"):
        response = _overdue(service, webhook, review(cpu_only))
        assert response == {"uid": response["uid"], "allowed": True}
    other = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "x"}}
    response = _overdue(service, "validate", review(other, kind="Secret", resource="secrets"))
    assert response["allowed"] is True


def test_a_decision_past_its_deadline_answer_is_not_a_second_redis_denial(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, redis_url: str
) -> None:
    # The deadline fallback answers; the decision still running then finds Redis down.
    # Its answer is discarded: one denial counted and logged, not two (the fault tests
    # read the log's cause per uid).
    source = LocalDirSource(write_config(tmp_path / "config"))
    source.start()
    down = connect_redis_async(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    client = connect_redis(redis_url)
    service = AdmissionService(source, down, AuditLog(client, out=io.StringIO()))
    service.start()
    try:
        body = json.dumps(review(gpu_pod("team-a-dev", "late"))).encode()
        progress = Progress(time.perf_counter())
        with caplog.at_level(logging.INFO, logger="fairgate.webhook"):
            answered = service.overdue("mutate", body, progress, 1.0).to_json()["response"]
            asyncio.run(service.review("mutate", body, progress))
    finally:
        service.stop()
        client.close()
    assert answered["status"]["message"] == REDIS_DOWN_MESSAGE
    assert service.metrics.redis_unavailable.labels("deny")._value.get() == 1
    denials = [r for r in caplog.records if "Redis unavailable for uid=" in r.getMessage()]
    assert [r.getMessage() for r in denials] == [
        f"Redis unavailable for uid={json.loads(body)['request']['uid']} (deadline): "
        "policy deny"]
    assert any("late decision" in r.getMessage() for r in caplog.records)
