"""``fairgate serve`` as a real process over real TLS, called with real AdmissionReview v1.

Every request goes through an httpx client that verifies the server against the CA the
test generated; Redis is a real ``redis-server``.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import redis
from webhook_helpers import ServerFactory, gpu_pod, review

from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from webhook.auditing import DEFAULT_LINGER_SECONDS
from webhook.process import ServeProcess, client_context
from webhook.service import REDIS_DOWN_MESSAGE

QUEUE_GATE = {"name": "fairgate.io/queue"}


def mutate(server: ServeProcess, body: dict[str, Any]) -> dict[str, Any]:
    """POST to /mutate; the answer must be a valid AdmissionReview echoing the uid."""
    with server.client() as client:
        reply = client.post("/mutate", json=body)
    assert reply.status_code == 200, reply.text
    return checked_response(reply.json(), body["request"]["uid"])


def validate(server: ServeProcess, body: dict[str, Any]) -> dict[str, Any]:
    """POST to /validate; the answer must be a valid AdmissionReview without a patch."""
    with server.client() as client:
        reply = client.post("/validate", json=body)
    assert reply.status_code == 200, reply.text
    response = checked_response(reply.json(), body["request"]["uid"])
    assert "patch" not in response and "patchType" not in response
    return response


def checked_response(answer: dict[str, Any], uid: str) -> dict[str, Any]:
    """The ``response`` of an answer, after checking the AdmissionReview v1 envelope."""
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == uid
    for warning in response.get("warnings", []):
        assert len(warning) <= 120 and "\n" not in warning
    for key in response.get("auditAnnotations", {}):
        assert "/" not in key
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
    else:
        assert "patchType" not in response
    return response


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the response's JSON Patch applied (as the API server would)."""
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return result


def _contents(client: redis.Redis, key: bytes) -> Any:
    """A key's type, data and whether it expires (not DUMP bytes: those change with
    Redis' incremental rehashing while the data stays the same)."""
    kind = client.type(key).decode()
    read = {
        "string": lambda: client.get(key),
        "hash": lambda: sorted(client.hgetall(key).items()),
        "list": lambda: client.lrange(key, 0, -1),
        "set": lambda: sorted(client.smembers(key)),
        "zset": lambda: client.zrange(key, 0, -1, withscores=True),
        "stream": lambda: client.xrange(key),
    }[kind]
    return kind, read(), client.pttl(key) > 0


def redis_snapshot(url: str) -> dict[bytes, Any]:
    """Every key of the Redis database with its contents (to prove nothing changed)."""
    client = redis.Redis.from_url(url)
    try:
        return {key: _contents(client, key) for key in sorted(client.keys("*"))}
    finally:
        client.close()


def settled_redis_snapshot(url: str, timeout: float = 10.0) -> dict[bytes, Any]:
    """:func:`redis_snapshot` once the server's audit writer is done (two snapshots
    further apart than its batching delay agree), so earlier requests' records and this
    request's own late ones are all in."""
    deadline = time.monotonic() + timeout
    previous = redis_snapshot(url)
    while True:
        time.sleep(5 * DEFAULT_LINGER_SECONDS)
        current = redis_snapshot(url)
        if current == previous or time.monotonic() > deadline:
            return current
        previous = current


# -- TLS -----------------------------------------------------------------------------------


def test_serves_tls_verified_against_the_generated_ca(server: ServeProcess) -> None:
    context = client_context(server.ca_file)
    with httpx.Client(verify=context) as client:
        reply = client.get(f"{server.base_url}/healthz")
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok"}


def test_a_client_trusting_another_ca_is_refused(
    server: ServeProcess, tmp_path: Path
) -> None:
    from certs import write_bundle

    write_bundle(tmp_path / "other", extra_sans=("127.0.0.1",))
    with httpx.Client(verify=client_context(tmp_path / "other" / "ca.crt")) as client, \
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(f"{server.base_url}/healthz")


def test_tls_1_1_is_refused_and_1_2_accepted(server: ServeProcess) -> None:
    result = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-tls1_1",
         "-cipher", "DEFAULT:@SECLEVEL=0", "-CAfile", str(server.ca_file)],
        input=b"", capture_output=True, timeout=30, check=False,
    )
    assert result.returncode != 0
    assert b"no peer certificate available" in result.stdout  # no handshake completed
    assert b"Cipher is (NONE)" in result.stdout
    old = ssl.create_default_context(cafile=str(server.ca_file))
    old.minimum_version = ssl.TLSVersion.TLSv1_2
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with httpx.Client(verify=old) as client:
        assert client.get(f"{server.base_url}/healthz").status_code == 200


# -- health, readiness, metrics ------------------------------------------------------------


def test_readyz_reports_redis_and_config(server: ServeProcess) -> None:
    with server.client() as client:
        reply = client.get("/readyz")
    assert reply.status_code == 200
    body = reply.json()
    assert body["ready"] is True
    assert body["redis"] == "ok"
    assert body["config"] == "loaded"


def _metric(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def test_metrics_count_decisions_and_latency(server: ServeProcess) -> None:
    count = 'fairgate_admission_duration_seconds_count{operation="CREATE",webhook="mutate"}'
    denied = 'fairgate_admission_decisions_total{verdict="deny"}'
    with server.client() as client:
        before = client.get("/metrics").text
        mutate(server, review(gpu_pod("sandbox", "nb-0")))
        after = client.get("/metrics").text
    assert _metric(after, count) == _metric(before, count) + 1
    assert _metric(after, denied) == _metric(before, denied) + 1
    assert "process_resident_memory_bytes" in after


# -- /mutate -------------------------------------------------------------------------------


def test_fast_path_admits_with_a_patch_and_no_gate(server: ServeProcess) -> None:
    pod = gpu_pod("team-a-dev", "train-0")
    body = review(pod)
    response = mutate(server, body)
    assert response["allowed"] is True
    result = patched(pod, response)
    labels = result["metadata"]["labels"]
    annotations = result["metadata"]["annotations"]
    assert labels["fairgate.io/tenant"] == "team-a"
    assert labels["fairgate.io/class"] == "training"
    assert annotations["fairgate.io/ticket"] == body["request"]["uid"]
    assert annotations["fairgate.io/demand"] == "gpu=1"
    assert result["spec"]["priorityClassName"] == "fairgate-training"
    assert result["spec"]["priority"] == 10000
    assert QUEUE_GATE not in result["spec"].get("schedulingGates", [])
    assert result["spec"]["containers"] == pod["spec"]["containers"]
    assert response["auditAnnotations"]["decision"] == "admit"
    assert response["auditAnnotations"]["tenant"] == "team-a"


def test_pod_over_free_quota_is_gated_with_a_warning(server: ServeProcess) -> None:
    first = mutate(server, review(gpu_pod("team-b-dev", "a")))
    assert first["auditAnnotations"]["decision"] == "admit"
    pod = gpu_pod("team-b-dev", "b")
    response = mutate(server, review(pod))
    assert response["allowed"] is True
    result = patched(pod, response)
    assert QUEUE_GATE in result["spec"]["schedulingGates"]
    assert response["auditAnnotations"]["decision"] == "queue"
    assert "Queued as training, 1st of 1 training pods of team-b, waiting for 1.00 GPU-eq " \
        "of tenant quota." in response["warnings"]


def test_unlabeled_namespace_is_denied_naming_the_label(server: ServeProcess) -> None:
    response = mutate(server, review(gpu_pod("sandbox", "nb")))
    assert response["allowed"] is False
    assert "fairgate.io/tenant" in response["status"]["message"]
    assert response["auditAnnotations"] == {
        "decision": "deny", "tenant": "", "reason": "no-tenant",
    }


def test_pod_without_gpu_is_allowed_untouched(server: ServeProcess, redis_url: str) -> None:
    before = settled_redis_snapshot(redis_url)
    response = mutate(server, review(gpu_pod("team-a-dev", "web", limits={"memory": "1Gi"})))
    assert response == {"uid": response["uid"], "allowed": True}
    assert settled_redis_snapshot(redis_url) == before


def test_mig_pod_is_admitted_against_its_mig_quota(server: ServeProcess) -> None:
    pod = gpu_pod("team-a-dev", "mig", limits={"nvidia.com/mig-1g.5gb": "2"},
                  labels={"fairgate.io/class": "inference"})
    response = mutate(server, review(pod))
    result = patched(pod, response)
    assert result["metadata"]["annotations"]["fairgate.io/demand"] == "mig-1g.5gb=2"
    assert result["spec"]["priorityClassName"] == "fairgate-inference"


def _queue_state(url: str) -> dict[bytes, Any]:
    """Every key but the audit stream's, with its DUMP."""
    return {k: v for k, v in redis_snapshot(url).items() if not k.startswith(b"fairgate:audit")}


def _audited(url: str) -> bytes:
    client = redis.Redis.from_url(url)
    try:
        return b"".join(v for _id, entry in client.xrange("fairgate:audit")
                        for v in entry.values())
    finally:
        client.close()


def test_dry_run_reserves_nothing(server: ServeProcess, redis_url: str) -> None:
    mutate(server, review(gpu_pod("team-b-dev", "warm-up")))  # config synced into Redis
    before = _queue_state(redis_url)
    body = review(gpu_pod("team-b-dev", "dry"), dry_run=True)
    response = mutate(server, body)
    assert response["allowed"] is True
    assert _queue_state(redis_url) == before
    mutate(server, review(gpu_pod("sandbox", "marker")))  # audited after the dry run
    deadline = time.monotonic() + 5
    while b"marker" not in _audited(redis_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    audited = _audited(redis_url)
    assert b"warm-up" in audited and b"marker" in audited
    assert body["request"]["uid"].encode() not in audited


def test_the_same_uid_twice_reserves_once(server: ServeProcess) -> None:
    body = review(gpu_pod("team-b-dev", "twice"))
    first = mutate(server, body)
    second = mutate(server, body)
    assert first["auditAnnotations"]["decision"] == "admit"
    assert second["allowed"] is True
    assert patched(body["request"]["object"], second)["metadata"]["annotations"][
        "fairgate.io/ticket"] == body["request"]["uid"]
    # team-b's nominal quota is one GPU: held once, so another pod must wait.
    other = mutate(server, review(gpu_pod("team-b-dev", "other")))
    assert other["auditAnnotations"]["decision"] == "queue"


def test_a_reinvocation_on_the_mutated_pod_keeps_its_ticket_and_reserves_once(
    server: ServeProcess,
) -> None:
    """The API server calls the webhook again (reinvocationPolicy IfNeeded) with a new
    request uid and the pod as the first call patched it."""
    first_body = review(gpu_pod("team-b-dev", "again"))
    first = mutate(server, first_body)
    stamped = patched(first_body["request"]["object"], first)
    second = mutate(server, review(stamped))
    assert second["allowed"] is True, second
    assert "patch" not in second  # the pod already holds everything fairgate sets
    assert stamped["metadata"]["annotations"]["fairgate.io/ticket"] == \
        first_body["request"]["uid"]
    other = mutate(server, review(gpu_pod("team-b-dev", "other")))  # nominal: one GPU
    assert other["auditAnnotations"]["decision"] == "queue"


def test_a_ticket_fairgate_did_not_issue_is_refused(server: ServeProcess) -> None:
    """Every field a reinvocation carries, but a ticket chosen by the user."""
    body = review(gpu_pod("team-b-dev", "mine"))
    stamped = patched(body["request"]["object"], mutate(server, review(
        gpu_pod("team-b-dev", "mine"), dry_run=True)))
    chosen = str(uuid.uuid4())
    stamped["metadata"]["annotations"]["fairgate.io/ticket"] = chosen
    response = mutate(server, review(stamped))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert chosen in response["status"]["message"]
    assert "did not issue" in response["status"]["message"]
    assert response["auditAnnotations"]["reason"] == "unminted-ticket"
    plain = mutate(server, review(gpu_pod("team-b-dev", "plain")))  # nothing was reserved
    assert plain["auditAnnotations"]["decision"] == "admit"


def test_anything_but_a_pod_create_passes_mutate_untouched(server: ServeProcess) -> None:
    pod = gpu_pod("team-a-dev", "p")
    response = mutate(server, review(pod, operation="UPDATE", old=pod))
    assert response == {"uid": response["uid"], "allowed": True}


# -- malformed and hostile bodies ----------------------------------------------------------


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


HOSTILE_BODIES: dict[str, bytes] = {
    "empty": b"",
    "not json": b"hello",
    "non-utf8": b'{"apiVersion":"admission.k8s.io/v1","kind":"\xff\xfe"}',
    "json list": b"[]",
    "no request": b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
    "v1beta1": json.dumps({**review(gpu_pod("team-a-dev", "x")),
                           "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
    "uid not a string": json.dumps(
        {**review(gpu_pod("team-a-dev", "x")),
         "request": {**review(gpu_pod("team-a-dev", "x"))["request"], "uid": 7}}).encode(),
    "object not an object": json.dumps(
        {**review(gpu_pod("team-a-dev", "x")),
         "request": {**review(gpu_pod("team-a-dev", "x"))["request"], "object": "pod"}}
    ).encode(),
    "deeply nested": _nested(100_000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_unparseable_body_gets_400_with_a_json_error(
    server: ServeProcess, name: str, path: str
) -> None:
    with server.client() as client:
        reply = client.post(path, content=HOSTILE_BODIES[name],
                            headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["error"]


def test_body_over_the_limit_gets_413(server: ServeProcess) -> None:
    with server.client() as client:
        reply = client.post("/mutate", content=b" " * (4 * 1024 * 1024))
    assert reply.status_code == 413
    assert "limit" in reply.json()["error"]


def _hostile_pods() -> dict[str, dict[str, Any]]:
    base = gpu_pod("team-a-dev", "h")
    many = gpu_pod("team-a-dev", "many")
    many["spec"]["containers"] = [
        {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        for i in range(10_000)
    ]
    return {
        "containers not a list": {**base, "spec": {"containers": "all of them"}},
        "limits not a map": {**base, "spec": {"containers": [
            {"name": "c", "resources": {"limits": ["nvidia.com/gpu"]}}]}},
        "milli gpu": gpu_pod("team-a-dev", "m", limits={"nvidia.com/gpu": "1500m"}),
        "exponent gpu": gpu_pod("team-a-dev", "e", limits={"nvidia.com/gpu": "1e3"}),
        "negative gpu": gpu_pod("team-a-dev", "n", limits={"nvidia.com/gpu": "-1"}),
        "gpu as number": gpu_pod("team-a-dev", "f", limits={"nvidia.com/gpu": 1.5}),  # type: ignore[dict-item]
        "unknown mig profile": gpu_pod("team-a-dev", "u", limits={"nvidia.com/mig-9g.1gb": "1"}),
        "labels not strings": {**base, "metadata": {**base["metadata"], "labels": {"a": 1}}},
        "forged ticket": gpu_pod("team-a-dev", "t", annotations={"fairgate.io/ticket": "x y"}),
        "huge label map": {**base, "metadata": {**base["metadata"], "labels": {
            f"k{i}": "v" for i in range(20_000)}}},
        "ten thousand containers": many,
        "metadata null": {**base, "metadata": None},
    }


@pytest.mark.parametrize("name", sorted(_hostile_pods()))
def test_hostile_pods_get_a_valid_answer_never_500(server: ServeProcess, name: str) -> None:
    pod = _hostile_pods()[name]
    for path in ("/mutate", "/validate"):
        body = review(pod, namespace="team-a-dev")
        with server.client() as client:
            reply = client.post(path, json=body)
        assert reply.status_code == 200, reply.text
        response = checked_response(reply.json(), body["request"]["uid"])
        if not response["allowed"]:
            assert response["status"]["message"]
            assert response["status"]["code"] != 500, response


def test_hostile_uid_is_denied_clearly(server: ServeProcess) -> None:
    body = review(gpu_pod("team-a-dev", "u"), uid="not a|uid")
    response = mutate(server, body)
    assert response["allowed"] is False
    assert "ticket" in response["status"]["message"]


# -- /validate -----------------------------------------------------------------------------


def _gated(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], "schedulingGates": [QUEUE_GATE]}}


def test_only_the_dispatcher_may_lift_the_gate(server: ServeProcess) -> None:
    stamped = mutate(server, review(gpu_pod("team-b-dev", "held")))
    old = _gated(patched(gpu_pod("team-b-dev", "held"), stamped))
    new = {**old, "spec": {**old["spec"], "schedulingGates": []}}
    by_user = validate(server, review(new, operation="UPDATE", old=old, user="mallory"))
    assert by_user["allowed"] is False
    assert "fairgate.io/queue" in by_user["status"]["message"]
    by_dispatcher = validate(server, review(
        new, operation="UPDATE", old=old,
        user="system:serviceaccount:fairgate-system:fairgate-dispatcher"))
    assert by_dispatcher["allowed"] is True


def test_validate_denies_a_gpu_pod_in_an_unlabeled_namespace(server: ServeProcess) -> None:
    response = validate(server, review(gpu_pod("sandbox", "nb")))
    assert response["allowed"] is False
    assert "fairgate.io/tenant" in response["status"]["message"]


def test_validate_allows_a_pod_fairgate_stamped(server: ServeProcess) -> None:
    pod = gpu_pod("team-a-dev", "ok")
    stamped = patched(pod, mutate(server, review(pod)))
    assert validate(server, review(stamped))["allowed"] is True


# -- Redis failures ------------------------------------------------------------------------


def test_redis_down_gives_a_clear_denial_within_a_second(start_server: ServerFactory) -> None:
    with local_redis() as url:
        server = start_server(url)
        mutate(server, review(gpu_pod("team-a-dev", "before")))
    # redis-server is stopped now.
    started = time.monotonic()
    response = mutate(server, review(gpu_pod("team-a-dev", "after")))
    elapsed = time.monotonic() - started
    assert response["allowed"] is False
    assert response["status"]["message"] == REDIS_DOWN_MESSAGE
    assert response["auditAnnotations"]["reason"] == "redis unavailable"
    assert elapsed < 2.0  # answered by the 1 s deadline at worst (room for a loaded machine)
    with server.client() as client:
        ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["redis"].startswith("unreachable")


def test_hanging_redis_is_answered_within_the_deadline(start_server: ServerFactory) -> None:
    with local_redis() as url:
        server = start_server(url)
        mutate(server, review(gpu_pod("team-a-dev", "before")))
        blocker = redis.Redis.from_url(url)
        blocker.execute_command("CLIENT", "PAUSE", "3000", "ALL")  # Redis stops answering
        started = time.monotonic()
        response = mutate(server, review(gpu_pod("team-a-dev", "during")))
        elapsed = time.monotonic() - started
        blocker.execute_command("CLIENT", "UNPAUSE")
        blocker.close()
    assert response["allowed"] is False
    assert response["status"]["message"] == REDIS_DOWN_MESSAGE
    assert elapsed < 2.0  # the 1 s deadline plus a loaded machine; Redis itself stalls 3 s


def test_fail_open_policy_admits_and_audits(start_server: ServerFactory) -> None:
    with local_redis() as url:
        server = start_server(url, policy="allow")
    pod = gpu_pod("team-a-dev", "open")
    body = review(pod)
    response = mutate(server, body)
    assert response["allowed"] is True
    assert response["auditAnnotations"]["decision"] == "admit"
    assert "fail open" in response["auditAnnotations"]["reason"]
    assert any("onRedisUnavailable: allow" in w for w in response["warnings"])
    result = patched(pod, response)
    assert result["metadata"]["labels"]["fairgate.io/tenant"] == "team-a"
    assert QUEUE_GATE not in result["spec"].get("schedulingGates", [])
    uid = body["request"]["uid"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        audited = [json.loads(line) for line in server.log_path.read_text().splitlines()
                   if uid in line and '"decision"' in line]
        if audited:
            break
        time.sleep(0.1)
    assert audited and audited[0]["decision"] == "admit"
    assert audited[0]["reason"].startswith("redis unavailable")


# -- concurrency ---------------------------------------------------------------------------


def test_32_racing_admissions_never_exceed_nominal_plus_borrow(
    server: ServeProcess, redis_client: redis.Redis
) -> None:
    """Tenant ``race``: nominal 4 GPUs + borrowLimit 2 GPU-eq; 32 pods race over HTTPS."""

    def admit(i: int) -> dict[str, Any]:
        body = review(gpu_pod("race-dev", f"racer-{i}"))
        with server.client() as client:
            reply = client.post("/mutate", json=body)
        assert reply.status_code == 200
        return checked_response(reply.json(), body["request"]["uid"])

    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(admit, range(32)))
    decisions = [r["auditAnnotations"]["decision"] for r in responses]
    assert all(r["allowed"] for r in responses)
    assert decisions.count("admit") <= 6
    assert decisions.count("admit") + decisions.count("queue") == 32
    borrowed = [r for r in responses if r["auditAnnotations"]["decision"] == "admit"
                and "borrowed" in r["auditAnnotations"]["reason"]]
    assert len(borrowed) <= 2
    status = {t.tenant: t for t in FairQueue(redis_client).tenant_status()}["race"]
    assert status.used_slices == 7 * decisions.count("admit") <= 7 * (4 + 2)
    assert status.borrowed_slices == 7 * len(borrowed) <= 7 * 2
    assert status.used["gpu"] - len(borrowed) <= 4


def test_uid_in_request_is_echoed_even_for_denials(server: ServeProcess) -> None:
    uid = str(uuid.uuid4())
    response = mutate(server, review(gpu_pod("sandbox", "x"), uid=uid))
    assert response["uid"] == uid


# -- quota ConfigMaps ----------------------------------------------------------------------


def _quota_configmap(tenant: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"quota-{tenant}", "namespace": "fairgate-system",
                     "labels": {"fairgate.io/quota": tenant}},
        "data": {"quota.yaml": text},
    }


def _configmap_review(new: dict[str, Any], old: dict[str, Any], user: str,
                      groups: tuple[str, ...]) -> dict[str, Any]:
    return review(new, operation="UPDATE", old=old, kind="ConfigMap", resource="configmaps",
                  user=user, groups=groups)


def test_tenant_admin_may_raise_own_quota_within_the_ceiling(server: ServeProcess) -> None:
    old = _quota_configmap("team-a", "nominal: {gpu: 2}\n")
    new = _quota_configmap("team-a", "nominal: {gpu: 4}\n")
    response = validate(server, _configmap_review(new, old, "bob", ("team-a-admins",)))
    assert response["allowed"] is True
    assert response["auditAnnotations"]["decision"] == "quota-change"
    assert response["auditAnnotations"]["tenant"] == "team-a"


def test_another_tenants_admin_may_not_edit_the_quota(server: ServeProcess) -> None:
    old = _quota_configmap("team-b", "nominal: {gpu: 1}\n")
    new = _quota_configmap("team-b", "nominal: {gpu: 2}\n")
    response = validate(server, _configmap_review(new, old, "bob", ("team-a-admins",)))
    assert response["allowed"] is False
    assert response["auditAnnotations"]["decision"] == "deny"


def test_malformed_quota_yaml_is_denied_with_its_line(server: ServeProcess) -> None:
    old = _quota_configmap("team-a", "nominal: {gpu: 2}\n")
    new = _quota_configmap("team-a", "nominal:\n  gpu: [1\n")
    response = validate(server, _configmap_review(new, old, "bob", ("team-a-admins",)))
    assert response["allowed"] is False
    assert "line" in response["status"]["message"]


def test_other_configmaps_pass_untouched(server: ServeProcess) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "app-settings", "namespace": "team-a-dev"}, "data": {"a": "b"}}
    response = validate(server, review(cm, kind="ConfigMap", resource="configmaps"))
    assert response == {"uid": response["uid"], "allowed": True}


def test_a_gang_member_waits_for_its_gang_with_a_readable_warning(server: ServeProcess) -> None:
    def member(i: int) -> dict[str, Any]:
        pod = gpu_pod("team-a-dev", f"ddp-{i}", labels={"fairgate.io/pod-group": "ddp"},
                      annotations={"fairgate.io/pod-group-size": "2"})
        return mutate(server, review(pod))

    first = member(0)
    assert first["allowed"] is True
    assert first["auditAnnotations"]["decision"] == "queue"  # alone, a gang cannot run
    assert first["warnings"][-1] == ("Queued as training, waiting for the 2nd pod of gang of "
                                     "pod group ddp (1 of 2 pods created).")
    assert "None" not in " ".join(first["warnings"])
    second = member(1)
    assert second["allowed"] is True


def test_a_gang_member_of_another_class_is_refused_with_the_queue_s_reason(
    server: ServeProcess,
) -> None:
    def member(i: int, pod_class: str) -> dict[str, Any]:
        pod = gpu_pod("team-a-dev", f"mixed-{i}",
                      labels={"fairgate.io/pod-group": "mixed", "fairgate.io/class": pod_class},
                      annotations={"fairgate.io/pod-group-size": "2"})
        return mutate(server, review(pod))

    assert member(0, "training")["allowed"] is True
    refused = member(1, "inference")
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 403
    assert refused["status"]["message"].startswith(
        "fairgate cannot queue this pod: pod group team-a-dev/mixed mixes classes")
    assert refused["auditAnnotations"]["reason"] == "invalid-request"


def test_redis_out_of_memory_is_handled_as_unavailable(
    server: ServeProcess, redis_client: redis.Redis
) -> None:
    mutate(server, review(gpu_pod("team-a-dev", "before")))
    redis_client.config_set("maxmemory", "1")  # noeviction: every write is refused
    try:
        response = mutate(server, review(gpu_pod("team-a-dev", "oom")))
        cpu_only = mutate(server, review(gpu_pod("team-a-dev", "web", limits={"cpu": "1"})))
    finally:
        redis_client.config_set("maxmemory", "0")
    assert response["allowed"] is False
    assert response["status"]["message"] == REDIS_DOWN_MESSAGE
    assert cpu_only["allowed"] is True


def test_an_internal_error_denies_the_gpu_pod_and_logs_a_traceback(
    server: ServeProcess, redis_client: redis.Redis
) -> None:
    first = mutate(server, review(gpu_pod("team-a-dev", "before")))
    assert first["auditAnnotations"]["decision"] == "admit"
    # Corrupt the queue's state behind the webhook's back: its Lua script now fails.
    for key in redis_client.keys("fairgate:tc:*"):
        redis_client.delete(key)
        redis_client.set(key, "not a hash")
    body = review(gpu_pod("team-a-dev", "broken"))
    response = mutate(server, body)
    assert response["allowed"] is False
    assert response["status"]["reason"] == "InternalError"
    assert body["request"]["uid"] in response["status"]["message"]
    assert "refused rather than admitted unchecked" in response["status"]["message"]
    log = server.log_path.read_text()
    errors = [json.loads(line) for line in log.splitlines()
              if body["request"]["uid"] in line and '"level":"error"' in line]
    assert errors and "Traceback" in errors[0]["traceback"]


def test_a_pod_copying_another_pods_ticket_is_refused(server: ServeProcess) -> None:
    original = gpu_pod("team-a-dev", "original")
    stamped = patched(original, mutate(server, review(original)))
    copy = gpu_pod("team-a-dev", "copy", labels=stamped["metadata"]["labels"],
                   annotations=stamped["metadata"]["annotations"])
    response = mutate(server, review(copy))
    assert response["allowed"] is False
    assert "copied" in response["status"]["message"]
    assert response["auditAnnotations"]["reason"] == "copied-ticket"


@pytest.mark.slow
def test_an_idle_connection_stays_open_for_the_api_servers_next_request(
    server: ServeProcess,
) -> None:
    """The API server reuses an idle webhook connection for up to 90 s and does not retry
    a POST the server closed under it (the pod create then fails: "failed calling webhook
    ...: EOF"). So the server must not close idle connections first: one idle for longer
    than uvicorn's default keep-alive (5 s) still answers the next request."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(server.ca_file), timeout=10
    )
    try:
        connection.request("GET", "/healthz")
        first = connection.getresponse()
        first.read()
        assert first.status == 200
        connection.auto_open = 0  # never reconnect: the next request needs the same socket
        time.sleep(7)
        connection.request("GET", "/healthz")
        second = connection.getresponse()
        second.read()
        assert second.status == 200
    finally:
        connection.close()
