"""Gangs declared with other tools, through the real ``fairgate serve`` over HTTPS with
AdmissionReview v1 JSON, on a real redis-server. The server reads a local config dir
(no cluster): the sources that need no object (Kueue, LeaderWorkerSet) are sized from
the pod; the others wait for their size, which is what a pod arriving before its Job
or PodGroup is seen does in a cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import redis
from test_https import mutate, patched, validate
from webhook_helpers import review

from admission.gangs import gang_key
from fairshare.queue.fairqueue import FairQueue
from webhook.process import ServeProcess

sys.path.insert(0, str(Path(__file__).parents[1] / "admission"))
from gang_pods import JOB_UID, indexed_job_pod, kueue_pod, lws_worker

NS = "team-a-dev"


def named(pod: dict[str, Any], name: str) -> dict[str, Any]:
    pod["metadata"].pop("generateName", None)
    pod["metadata"]["name"] = name
    return pod


def test_kueue_members_are_stamped_with_their_gang_and_wait_for_it(
    server: ServeProcess,
) -> None:
    key = gang_key("kueue", "sweep", f"{NS}/sweep")
    first_pod = named(kueue_pod("sweep", "2", NS), "sweep-0")
    first = mutate(server, review(first_pod))
    assert first["allowed"] is True
    assert first["auditAnnotations"]["decision"] == "queue"
    reason = first["auditAnnotations"]["reason"]
    assert reason == ("waiting for the 2nd pod of gang of Kueue pod group sweep (1 of 2 pods "
                      "created)")
    stamped = patched(first_pod, first)
    assert stamped["metadata"]["labels"]["fairgate.io/pod-group"] == key
    assert stamped["metadata"]["annotations"]["fairgate.io/pod-group-size"] == "2"
    assert validate(server, review(stamped))["allowed"] is True
    # the API server calls the webhook again on the stamped pod: the same gang, the same
    # ticket, nothing new queued
    again = mutate(server, review(stamped))
    assert again["allowed"] is True and again["auditAnnotations"]["decision"] == "queue"
    second = mutate(server, review(named(kueue_pod("sweep", "2", NS), "sweep-1")))
    assert second["allowed"] is True
    assert "1 of 2" not in second["auditAnnotations"]["reason"]


def test_a_kueue_group_without_its_count_is_refused(server: ServeProcess) -> None:
    response = mutate(server, review(named(kueue_pod("sweep", None, NS), "bad-0")))
    assert response["allowed"] is False
    assert "kueue.x-k8s.io/pod-group-total-count" in response["status"]["message"]
    assert response["auditAnnotations"]["reason"] == "invalid-pod-group"


def test_lws_group_waits_for_all_its_pods(server: ServeProcess) -> None:
    pod = lws_worker("vllm", group=0, worker=1, size=2, namespace=NS)
    response = mutate(server, review(pod))
    assert response["allowed"] is True
    assert response["auditAnnotations"]["decision"] == "queue"
    assert response["auditAnnotations"]["reason"] == (
        "waiting for the 2nd pod of gang of LeaderWorkerSet vllm group 0 (1 of 2 pods created)")


def test_an_indexed_job_pod_whose_job_is_not_seen_waits_for_its_size(
    server: ServeProcess, redis_client: redis.Redis,
) -> None:
    key = gang_key("job", "trainer", JOB_UID)
    pods = [named(indexed_job_pod("trainer", i, namespace=NS), f"trainer-{i}")
            for i in range(3)]
    for pod in pods:
        response = mutate(server, review(pod))
        assert response["allowed"] is True
        assert response["auditAnnotations"]["decision"] == "queue"  # never alone
        assert response["auditAnnotations"]["reason"].startswith(
            "waiting for the size of gang of Indexed Job trainer (")
        assert response["auditAnnotations"]["reason"].endswith(
            " created; known once Job trainer is seen)")
        stamped = patched(pod, response)
        assert stamped["metadata"]["labels"]["fairgate.io/pod-group"] == key
        assert "fairgate.io/pod-group-size" not in stamped["metadata"]["annotations"]
        assert validate(server, review(stamped))["allowed"] is True
    queue = FairQueue(redis_client)
    assert queue.unsized() == [f"{NS}/{key}"]
    assert queue.resize({f"{NS}/{key}": 3}) == 1
    assert queue.unsized() == []


def test_a_gang_label_without_size_that_no_source_declares_is_refused(
    server: ServeProcess,
) -> None:
    pod = named(indexed_job_pod("trainer", 0, namespace=NS), "forged-0")
    pod["metadata"]["labels"]["fairgate.io/pod-group"] = "job.trainer.0123456789"
    response = mutate(server, review(pod))
    assert response["allowed"] is False
    assert "fairgate.io/pod-group-size" in response["status"]["message"]
