"""Helpers of the quota ConfigMap attack tests: a real ``fairgate serve`` over HTTPS and
real AdmissionReview v1 requests for ConfigMaps and GPU pods, as the API server sends them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from certs import write_bundle
from tenants.localdir import write_config_dir
from webhook.process import ServeProcess

PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team]}
capacity: {gpu: 64}
tenants:
  team-a:
    weight: 1
    ceiling: {gpuEquivalents: 24}
    admins: {groups: [team-a-admins]}
onRedisUnavailable: deny
"""
QUOTA_A = "nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 4}\ndefaultClass: training\n"
NAMESPACES_YAML = "team-a-dev: {fairgate.io/tenant: team-a}\n"
TENANT_ADMIN = ("mallory@example.com", ("team-a-admins", "system:authenticated"))


@contextmanager
def quota_webhook(directory: Path, redis_url: str) -> Iterator[ServeProcess]:
    """``fairgate serve`` (certificates for 127.0.0.1) with tenant ``team-a``: ceiling 24
    GPU-eq, quota 8 + borrowLimit 4, admins group ``team-a-admins``."""
    certs = directory / "certs"
    write_bundle(certs, extra_sans=("127.0.0.1",))
    config = write_config_dir(directory / "config", PLATFORM_YAML, {"team-a": QUOTA_A},
                              NAMESPACES_YAML)
    with ServeProcess(certs, redis_url, config, directory / "serve.log") as server:
        yield server


def configmap_review(
    operation: str,
    metadata: Mapping[str, Any],
    data: Mapping[str, str] | None,
    *,
    old_data: Mapping[str, str] | None = None,
    who: tuple[str, tuple[str, ...]] = TENANT_ADMIN,
) -> dict[str, Any]:
    """An AdmissionReview v1 for a ConfigMap in ``fairgate-system``. ``request.name`` is
    ``metadata.name`` or empty, as the API server sends a ``generateName`` CREATE."""
    user, groups = who
    meta = {"namespace": "fairgate-system", **metadata}
    new = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data or {})}
    old = ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": dict(old_data)} if old_data is not None else None)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": meta.get("name", ""),
            "namespace": "fairgate-system",
            "operation": operation,
            "userInfo": {"username": user, "groups": list(groups)},
            "object": new,
            "oldObject": old,
            "dryRun": False,
        },
    }


def quota_update(text: str) -> dict[str, Any]:
    """A tenant admin's UPDATE of ``quota-team-a`` to ``text``."""
    return configmap_review(
        "UPDATE", {"name": "quota-team-a", "labels": {"fairgate.io/quota": "team-a"}},
        {"quota.yaml": text}, old_data={"quota.yaml": QUOTA_A},
    )


def gpu_pod_create(name: str) -> dict[str, Any]:
    """An AdmissionReview v1 for the CREATE of a one-GPU pod of ``team-a``."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a-dev"},
        "spec": {"containers": [{"name": "main", "image": "pytorch:2",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": "team-a-dev",
            "operation": "CREATE",
            "userInfo": {"username": "ci@example.com", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
        },
    }


def answer(client: httpx.Client, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """POST ``body`` to ``path``; the ``response`` of the AdmissionReview (HTTP 200)."""
    reply = client.post(path, json=body)
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()["response"]
    assert response["uid"] == body["request"]["uid"]
    return response


def hostile_quota(size: int) -> str:
    """A quota of ``size`` bytes that is slow to parse: a flow list of tiny integers."""
    head = "nominal: {gpu: 1}\nx: ["
    count = (size - len(head) - 2) // 2
    return head + ",".join(["1"] * count) + "]\n"
