"""Apply fairgate's kustomize bases to the e2e cluster, without kubectl.

Only what fairgate's bases use is supported: `resources` (files or directories),
`namespace` (set on every namespaced object) and `images` (ignored: no controller runs
Deployments here). Anything else is refused, so a new kustomize feature in the bases
cannot be silently skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic

Manifest = dict[str, Any]
_SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "images"}
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def load_kustomization(directory: Path) -> list[Manifest]:
    """The objects of the base in `directory`, with its `namespace` applied by `apply`."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - _SUPPORTED
    if unsupported:
        raise ValueError(
            f"{directory}/kustomization.yaml uses {sorted(unsupported)}, which the "
            f"e2e harness does not implement (supported: {sorted(_SUPPORTED)})"
        )
    objects: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += load_kustomization(path)
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                objects.append(document)
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            obj.setdefault("metadata", {})["x-kustomize-namespace"] = namespace
    return objects


def with_ca_bundle(objects: Iterable[Manifest], ca_bundle: str) -> list[Manifest]:
    """Copies of `objects` where every webhook's clientConfig carries `ca_bundle` (base64)."""
    result = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        if obj.get("kind") in WEBHOOK_KINDS:
            for webhook in obj["webhooks"]:
                webhook["clientConfig"]["caBundle"] = ca_bundle
        result.append(obj)
    return result


def apply(api: client.ApiClient, objects: Iterable[Manifest]) -> None:
    """Server-side apply every object (field manager `fairgate-e2e`)."""
    dyn = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]
    for obj in objects:
        obj = copy.deepcopy(obj)
        namespace = obj["metadata"].pop("x-kustomize-namespace", None)
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        if resource.namespaced:
            obj["metadata"]["namespace"] = namespace or obj["metadata"].get("namespace", "default")
        resource.server_side_apply(
            body=obj, namespace=obj["metadata"].get("namespace"), field_manager="fairgate-e2e"
        )
