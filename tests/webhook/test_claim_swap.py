"""ResourceClaim and ResourceClaimTemplate CREATE at /validate, with real AdmissionReview v1
JSON and a real redis-server: a claim or template made again under a name that a live
admitted pod uses is refused when it gives that pod more devices than it was priced for.

The in-process tests run :class:`webhook.service.AdmissionService` with the DRA objects a
cluster would show (``fairgate serve`` with a config dir has none, and refuses DRA pods);
one test goes through ``fairgate serve`` itself."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from webhook_helpers import gpu_pod, review, write_config

from admission.dra import DraObject, DraObjects
from audit import AuditLog
from fairshare.connection import connect_redis, connect_redis_async
from fairshare.localredis import free_port
from fairshare.queue.fairqueue import FairQueue
from tenants.source import LocalDirSource
from webhook.process import ServeProcess
from webhook.service import (
    DRA_FAIL_OPEN_WARNING,
    DRA_REDIS_DOWN_MESSAGE,
    OVERDUE_MESSAGE,
    AdmissionService,
    Progress,
)

NS = "team-a-dev"
GPU = "gpu.nvidia.com"
CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"


def claim_spec(count: int = 1, device_class: str = GPU, **exact: Any) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": device_class, "count": count, **exact}}]}}


def every_gpu() -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": GPU, "allocationMode": "All"}}]}}


def claim(name: str, spec: dict[str, Any], namespace: str = NS,
          **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, **metadata}, "spec": spec}


def template(name: str, spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec}}


def create(obj: dict[str, Any], user: str = "alice@example.com") -> dict[str, Any]:
    kind = obj["kind"]
    return review(obj, kind=kind, resource=kind.lower() + "s", group="resource.k8s.io",
                  user=user)


def dra_pod(name: str, claims: dict[str, str] | None = None,
            templates: dict[str, str] | None = None) -> dict[str, Any]:
    entries = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    entries += [{"name": k, "resourceClaimTemplateName": v}
                for k, v in (templates or {}).items()]
    pod = gpu_pod(NS, name, limits={}, spec={"resourceClaims": entries})
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": e["name"]}
                                                           for e in entries]
    return pod


class Objects:
    """The DRA objects the cluster shows (as DraWatch keeps them)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.templates: dict[tuple[str, str], dict[str, Any]] = {}

    def objects(self) -> DraObjects:
        return DraObjects(
            templates={key: DraObject(spec, uid=f"uid-{key[1]}")
                       for key, spec in self.templates.items()},
            claims={key: DraObject(spec, uid=f"uid-{key[1]}") for key, spec in self.claims.items()})

    def objects_for(self, pod: object, namespace: str) -> DraObjects:
        return self.objects()


@pytest.fixture
def objects() -> Objects:
    return Objects()


class Webhook:
    """An AdmissionService deciding on one event loop (its Redis connections live there)."""

    def __init__(self, tmp_path: Path, redis_url: str, objects: Objects,
                 policy: str = "deny", timeout: float | None = None) -> None:
        source = LocalDirSource(write_config(tmp_path / f"config-{policy}", policy))
        source.start()
        self.out = io.StringIO()
        client = (connect_redis_async(redis_url) if timeout is None
                  else connect_redis_async(redis_url, timeout=timeout))
        self.service = AdmissionService(source, client, AuditLog(None, out=self.out),
                                        dra=objects)
        self.runner = asyncio.Runner()
        self.service.start()

    def close(self) -> None:
        self.service.stop()
        self.runner.close()

    def decide(self, webhook: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.runner.run(self.service.review(
            webhook, json.dumps(body).encode(), Progress(time.perf_counter())))  # type: ignore[arg-type]
        response: dict[str, Any] = answer.to_json()["response"]
        return response

    def validate(self, obj: dict[str, Any], user: str = "alice@example.com") -> dict[str, Any]:
        return self.decide("validate", create(obj, user))

    def admitted(self, pod: dict[str, Any], dry_run: bool = False) -> str:
        response = self.decide("mutate", review(pod, dry_run=dry_run))
        assert response["allowed"] is True, response
        return str(response["auditAnnotations"]["decision"])


@pytest.fixture
def webhook(tmp_path: Path, redis_url: str, objects: Objects) -> Iterator[Webhook]:
    hook = Webhook(tmp_path, redis_url, objects)
    yield hook
    hook.close()


def test_a_claim_made_again_with_more_gpus_is_refused_while_its_pod_is_admitted(
    webhook: Webhook, objects: Objects,
) -> None:
    objects.claims[(NS, "c")] = claim_spec(1)
    # a pod with claims always waits for the dispatcher to check them
    assert webhook.admitted(dra_pod("p", claims={"gpu": "c"})) == "queue"
    # the user deletes c and makes it again: more GPUs, or every GPU, is refused
    for spec, asks in ((claim_spec(8), "asks for gpu=8"),
                       (every_gpu(), "cannot be priced")):
        response = webhook.validate(claim("c", spec))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        message = response["status"]["message"]
        for part in (f"{NS}/p (queued) for gpu=1", asks, "Delete those pods first",
                     "new name"):
            assert part in message, (part, message)
        assert response["auditAnnotations"] == {"decision": "deny", "tenant": "team-a",
                                                "reason": "replaced-object"}
    # the same price (or less) passes, and so does another name
    assert webhook.validate(claim("c", claim_spec(1)))["allowed"]
    assert webhook.validate(claim("c", claim_spec(0)))["allowed"]
    assert webhook.validate(claim("d", claim_spec(8)))["allowed"]
    webhook.service.stop()
    denials = [json.loads(line) for line in webhook.out.getvalue().splitlines()
               if '"replaced-object' in line]
    assert len(denials) == 2 and denials[0]["decision"] == "deny"


def test_a_template_made_again_with_more_gpus_is_refused_while_its_pod_is_queued(
    webhook: Webhook, objects: Objects,
) -> None:
    objects.templates[(NS, "tpl")] = claim_spec(2)
    assert webhook.admitted(dra_pod("first", templates={"gpu": "tpl"})) == "queue"
    assert webhook.admitted(dra_pod("second", templates={"gpu": "tpl"})) == "queue"
    response = webhook.validate(template("tpl", claim_spec(8)))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "ResourceClaimTemplate" in message
    assert f"{NS}/first (queued) for gpu=2" in message
    assert f"{NS}/second (queued) for gpu=2" in message
    assert webhook.validate(template("tpl", claim_spec(2)))["allowed"]


def test_no_entry_for_a_dry_run_a_dead_ticket_or_another_namespace(
    webhook: Webhook, objects: Objects, redis_url: str,
) -> None:
    objects.claims[(NS, "c")] = claim_spec(1)
    webhook.admitted(dra_pod("p", claims={"gpu": "c"}), dry_run=True)
    assert webhook.validate(claim("c", claim_spec(8)))["allowed"]
    webhook.admitted(dra_pod("p", claims={"gpu": "c"}))
    assert not webhook.validate(claim("c", claim_spec(8)))["allowed"]
    # not a tenant namespace: not fairgate's business
    assert webhook.validate(claim("c", every_gpu(), "sandbox"))["allowed"]
    # the pod's admission ended (its reservation expired unseen): the entry is ignored
    client = redis.Redis.from_url(redis_url)
    assert FairQueue(client).expire(time.time() + 3600)
    assert webhook.validate(claim("c", claim_spec(8)))["allowed"]
    assert client.keys("fairgate:po:*") == []  # and pruned
    client.close()


def test_claims_the_controller_makes_for_pods_and_non_gpu_claims_are_not_judged(
    webhook: Webhook, objects: Objects,
) -> None:
    objects.claims[(NS, "c")] = claim_spec(1)
    webhook.admitted(dra_pod("p", claims={"gpu": "c"}))
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]
    forged = claim("c", claim_spec(8), ownerReferences=owner)
    assert not webhook.validate(forged)["allowed"]
    assert webhook.validate(forged, user=CONTROLLER)["allowed"]
    nic = webhook.validate(claim("c", claim_spec(8, "nic.example.com")))
    assert nic == {"uid": nic["uid"], "allowed": True}  # no GPUs: not even audited


def test_a_pod_that_names_claims_costs_one_more_redis_call_and_others_none(
    webhook: Webhook, objects: Objects, redis_url: str,
) -> None:
    objects.claims[(NS, "c")] = claim_spec(1)
    webhook.admitted(gpu_pod(NS, "warm"))  # config synced, budgets read
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()
    webhook.admitted(gpu_pod(NS, "plain"))
    assert client.info("commandstats")["cmdstat_fcall"]["calls"] == 1
    client.config_resetstat()
    webhook.admitted(dra_pod("dra", claims={"gpu": "c"}))
    assert client.info("commandstats")["cmdstat_fcall"]["calls"] == 2
    client.close()


def test_with_redis_down_a_gpu_claim_follows_on_redis_unavailable(
    tmp_path: Path, objects: Objects,
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    for policy in ("deny", "allow"):
        hook = Webhook(tmp_path, down, objects, policy, timeout=0.2)
        try:
            gpu = hook.validate(claim("c", claim_spec(8)))
            nic = hook.validate(claim("n", claim_spec(8, "nic.example.com")))
        finally:
            hook.close()
        assert nic["allowed"] is True
        if policy == "deny":
            assert gpu["allowed"] is False
            assert gpu["status"] == {"code": 503, "reason": "ServiceUnavailable",
                                     "message": DRA_REDIS_DOWN_MESSAGE.format(
                                         kind="ResourceClaim")}
        else:
            assert gpu["allowed"] is True
            assert gpu["warnings"] == [DRA_FAIL_OPEN_WARNING]
            assert len(DRA_FAIL_OPEN_WARNING) <= 120  # the API server's advice, whole
            assert "fail open" in hook.out.getvalue()


def test_an_overdue_gpu_claim_is_refused_and_any_other_allowed(
    webhook: Webhook,
) -> None:

    def overdue(obj: dict[str, Any], path: str = "validate") -> dict[str, Any]:
        answer = webhook.service.overdue(path, json.dumps(create(obj)).encode(),  # type: ignore[arg-type]
                                         Progress(time.perf_counter()), 1.0)
        response: dict[str, Any] = answer.to_json()["response"]
        return response

    late = overdue(template("tpl", claim_spec(1)))
    assert late["allowed"] is False
    assert late["status"]["message"] == OVERDUE_MESSAGE.format(seconds=1.0)
    assert overdue(claim("n", claim_spec(2, "nic.example.com")))["allowed"] is True
    assert overdue(claim("c", claim_spec(1)), "mutate")["allowed"] is True


def test_fairgate_serve_refuses_the_swap(
    cert_dir: Path, redis_url: str, tmp_path: Path,
) -> None:
    """Through the real server: a pod's admission is live (its ticket in the queue) and
    noted for claim c at 1 GPU, as /mutate notes it in a cluster."""
    config = write_config(tmp_path / "config")
    with ServeProcess(cert_dir, redis_url, config, tmp_path / "serve.log") as server, \
            server.client() as http:
        pod = review(gpu_pod(NS, "p"))
        reply = http.post("/mutate", json=pod)
        assert reply.json()["response"]["auditAnnotations"]["decision"] == "admit"
        client = connect_redis(redis_url)
        FairQueue(client).note_priced(pod["request"]["uid"], {f"{NS}/c/c": {"gpu": 1}})
        client.close()
        refused = http.post("/validate", json=create(claim("c", claim_spec(8)))).json()
        other = http.post("/validate", json=create(claim("d", claim_spec(8)))).json()
    assert reply.status_code == 200
    assert refused["response"]["allowed"] is False
    assert f"{NS}/p (reserved) for gpu=1" in refused["response"]["status"]["message"]
    assert other["response"]["allowed"] is True
