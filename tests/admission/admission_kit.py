"""Shared test material for tests/admission: a realistic config and pod builders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tenants.models import TENANT_LABEL, FairgateConfig
from tenants.schema import parse_platform, parse_quota

FIXTURES = Path(__file__).parent / "fixtures"

PLATFORM_YAML = """
platformAdmins: {groups: [platform-team]}
tenants:
  team-a:
    weight: 2
    ceiling: {gpuEquivalents: 24}
    admins: {groups: [team-a-admins]}
  team-b:
    weight: 1
    ceiling: {gpuEquivalents: 4}
    classes: [training]
    nodePool: a100-pool
  team-c:
    weight: 1
    ceiling: {gpuEquivalents: 4}
"""
QUOTA_A = """
nominal: {gpu: 8, mig-1g.5gb: 14}
borrowLimit: {gpuEquivalents: 4}
inferenceReserve: {gpuEquivalents: 2}
"""
QUOTA_B = """
nominal: {gpu: 2}
defaultClass: training
"""
NAMESPACES = {
    "team-a-serving": {TENANT_LABEL: "team-a"},
    "team-a-train": {TENANT_LABEL: "team-a"},
    "team-b-dev": {TENANT_LABEL: "team-b"},
    "team-c-lab": {TENANT_LABEL: "team-c"},
    "orphan-ns": {TENANT_LABEL: "ghost"},
    "plain-ns": {"kubernetes.io/metadata.name": "plain-ns"},
}


def make_config(quota_a: str = QUOTA_A) -> FairgateConfig:
    """team-a (both classes, borrows), team-b (training only, node pool, no borrowing),
    team-c (no quota ConfigMap); namespaces as in NAMESPACES."""
    platform = parse_platform(PLATFORM_YAML)
    return FairgateConfig(
        platform=platform,
        quotas={
            "team-a": parse_quota(quota_a, "team-a", platform),
            "team-b": parse_quota(QUOTA_B, "team-b", platform),
        },
        namespaces=NAMESPACES,
    )


CONFIG = make_config()


def load_review(name: str) -> dict[str, Any]:
    """A fixture AdmissionReview (tests/admission/fixtures/<name>.json)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def container(
    name: str = "main", limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """A container with the given limits."""
    body: dict[str, Any] = {"name": name, "image": "nvidia/cuda:12.4.1-base-ubuntu22.04"}
    if limits is not None:
        body["resources"] = {"limits": limits}
    body.update(extra)
    return body


def gpu_pod(
    gpu: int | str = 1,
    *,
    resource: str = "nvidia.com/gpu",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: str | None = None,
    namespace: str = "team-a-train",
    **spec: Any,
) -> dict[str, Any]:
    """A pod with one container asking for ``gpu`` of ``resource``."""
    metadata: dict[str, Any] = {"name": "p", "namespace": namespace}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "x/v1", "kind": owner, "name": "o", "uid": "u", "controller": True}
        ]
    body: dict[str, Any] = {"containers": [container(limits={resource: gpu})]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}
