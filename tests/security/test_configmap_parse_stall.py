"""Attack: a tenant admin stalls every GPU admission with quota UPDATEs that are slow to
parse (a 215 KiB one once held the event loop for 6.6 s; a pod CREATE that arrived 10 ms
later was answered 6.6 s late)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from configmap_attacks import answer, gpu_pod_create, hostile_quota, quota_update, quota_webhook

from webhook.process import ServeProcess

POD_BOUND_SECONDS = 1.0  # behavioural bound; the latency target is in bench/configmap_flood.py


@pytest.fixture(scope="module")
def quota_server(
    tmp_path_factory: pytest.TempPathFactory, redis_server_url: str
) -> Iterator[ServeProcess]:
    with quota_webhook(tmp_path_factory.mktemp("stall"), redis_server_url) as server:
        yield server


def test_hostile_quota_update_does_not_stall_pod_admission(quota_server: ServeProcess) -> None:
    updates = [quota_update(hostile_quota(215 * 1024)), quota_update(hostile_quota(64 * 1024))]
    assert len(updates[1]["request"]["object"]["data"]["quota.yaml"]) <= 64 * 1024
    with quota_server.client() as client:  # warm: worker process up, config in Redis
        assert answer(client, "/validate", quota_update("nominal: {gpu: 4}\n"))["allowed"]
        assert answer(client, "/mutate", gpu_pod_create("warm"))["allowed"]
    hostile: list[tuple[float, dict[str, object]]] = []
    stop = threading.Event()

    def attack() -> None:
        with quota_server.client() as attacker:
            while not stop.is_set():
                for update in updates:
                    started = time.perf_counter()
                    response = answer(attacker, "/validate", update)
                    hostile.append((time.perf_counter() - started, response))

    thread = threading.Thread(target=attack)
    thread.start()
    pods: list[float] = []
    try:
        with quota_server.client() as client:
            time.sleep(0.01)
            for n in range(40):
                started = time.perf_counter()
                assert answer(client, "/mutate", gpu_pod_create(f"pod-{n}"))["allowed"]
                pods.append(time.perf_counter() - started)
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
    assert len(hostile) >= 4, "the attack ran alongside the pod CREATEs"
    assert max(pods) < POD_BOUND_SECONDS, sorted(pods)[-5:]
    for seconds, response in hostile:
        assert response["allowed"] is False
        assert seconds < 1.5, "the hostile update itself is answered in time"
    messages = [str(response["status"]["message"]) for _, response in hostile]  # type: ignore[index]
    size = len(updates[0]["request"]["object"]["data"]["quota.yaml"])
    assert any(f"document is {size:,} bytes, over the 65,536-byte (64 KiB) cap" in m
               for m in messages), messages[:2]
    assert all("over the 65,536-byte" in m or "more than 1000 YAML values" in m
               or "not checked within fairgate's 0.5 s budget" in m for m in messages), messages
