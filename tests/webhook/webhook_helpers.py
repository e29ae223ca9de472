"""Helpers of the webhook tests: the test config dir and builders of real AdmissionReview v1
JSON."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tenants.localdir import write_config_dir
from webhook.process import ServeProcess

PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team]}
%(capacity)s
tenants:
  team-a:
    weight: 2
    ceiling: {gpuEquivalents: 8}
    admins: {groups: [team-a-admins]}
  team-b:
    weight: 1
    ceiling: {gpuEquivalents: 4}
  race:
    weight: 1
    ceiling: {gpuEquivalents: 8}
onRedisUnavailable: %(policy)s
"""

QUOTAS = {
    # 2 whole GPUs + 7 MIG slices; may borrow one GPU-eq for training.
    "team-a": "nominal: {gpu: 2, mig-1g.5gb: 7}\nborrowLimit: {gpuEquivalents: 1}\n"
              "defaultClass: training\n",
    # 1 GPU, no borrowing: the second concurrent GPU pod must wait.
    "team-b": "nominal: {gpu: 1}\ndefaultClass: training\n",
    # The concurrency race: never more than 4 + 2 GPUs at once.
    "race": "nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 2}\ndefaultClass: training\n",
}

NAMESPACES_YAML = """\
team-a-dev: {fairgate.io/tenant: team-a}
team-b-dev: {fairgate.io/tenant: team-b}
race-dev: {fairgate.io/tenant: race}
sandbox: {}
"""


def write_config(directory: Path, policy: str = "deny", capacity: bool = True) -> Path:
    """The tests' config dir (tenants team-a, team-b, race; ``sandbox`` unlabeled).

    Without ``capacity`` the platform sets no capacity override (as in a cluster, where
    the dispatcher stores the capacity of the nodes).
    """
    override = "capacity: {gpu: 64, mig-1g.5gb: 28}" if capacity else "capacity: {}"
    platform = PLATFORM_YAML % {"policy": policy, "capacity": override}
    return write_config_dir(directory, platform, QUOTAS, NAMESPACES_YAML)


def gpu_pod(
    namespace: str,
    name: str,
    limits: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the API server sends it; ``limits`` default to one whole GPU."""
    resources = {"limits": {"cpu": "1", **(limits if limits is not None else
                                           {"nvidia.com/gpu": "1"})}}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "main", "image": "pytorch:2", "resources": resources}],
                 **(spec or {})},
    }


def review(
    obj: Mapping[str, Any] | None,
    *,
    uid: str | None = None,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    kind: str = "Pod",
    resource: str = "pods",
    namespace: str | None = None,
    user: str = "alice@example.com",
    groups: tuple[str, ...] = ("system:authenticated",),
    dry_run: bool = False,
    group: str = "",
) -> dict[str, Any]:
    """A complete AdmissionReview v1 request (``group``: the API group of ``kind``)."""
    source = obj if obj is not None else old
    metadata = (source or {}).get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "requestKind": {"group": group, "version": "v1", "kind": kind},
            "requestResource": {"group": group, "version": "v1", "resource": resource},
            "name": metadata.get("name", ""),
            "namespace": namespace if namespace is not None else metadata.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": user, "groups": list(groups)},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
        },
    }


ServerFactory = Callable[..., ServeProcess]
"""``start_server(redis_url, policy="deny", cert_dir=..., capacity=True, extra=())`` of the
``start_server`` fixture."""
