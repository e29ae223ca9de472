"""Create a ProvisioningRequest (``autoscaling.x-k8s.io/v1``) with its PodTemplates.

Contract: :func:`pod_sets` turns pod manifests into PodTemplate bodies, one per distinct
pod spec (gates, node name, status and identity removed) with the count of pods of that
spec; :func:`create` creates the templates, then the request naming them with class
:data:`~tenants.models.PROVISIONING_CLASS`. An object that exists already is kept (409
is success: a restarted dispatcher finds its own request).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tenants.models import PROVISIONING_CLASS

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
_DROPPED_SPEC = ("schedulingGates", "nodeName")


def pod_sets(name: str, pods: Sequence[Mapping[str, Any]],
             labels: Mapping[str, str]) -> list[tuple[dict[str, Any], int]]:
    """PodTemplate bodies for ``pods`` (named ``<name>-<i>``), each with its count."""
    specs: dict[str, tuple[dict[str, Any], int]] = {}
    for pod in pods:
        spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _DROPPED_SPEC}
        meta = pod.get("metadata") or {}
        template = {"metadata": {"labels": dict(meta.get("labels") or {}),
                                 "annotations": dict(meta.get("annotations") or {})},
                    "spec": spec}
        text = json.dumps(template, sort_keys=True)
        found = specs.get(text)
        specs[text] = (template, (found[1] if found else 0) + 1)
    return [({"apiVersion": "v1", "kind": "PodTemplate",
              "metadata": {"name": f"{name}-{i}", "labels": dict(labels)},
              "template": template}, count)
            for i, (template, count) in enumerate(specs.values())]


def request_body(name: str, sets: Sequence[tuple[Mapping[str, Any], int]],
                 labels: Mapping[str, str]) -> dict[str, Any]:
    """The ProvisioningRequest naming the templates of ``sets``."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"provisioningClassName": PROVISIONING_CLASS,
                     "podSets": [{"podTemplateRef": {"name": t["metadata"]["name"]},
                                  "count": count} for t, count in sets]}}


def create(api: client.ApiClient, name: str, namespace: str,
           pods: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> None:
    """Create the templates and the request (existing ones are kept)."""
    sets = pod_sets(name, pods, labels)
    core = client.CoreV1Api(api)
    for template, _ in sets:
        _kept(lambda t=template: core.create_namespaced_pod_template(
            namespace, t, _preload_content=False))
    custom = client.CustomObjectsApi(api)
    _kept(lambda: custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, request_body(name, sets, labels)))


def _kept(call: Any) -> None:
    try:
        call()
    except ApiException as error:
        if error.status != 409:
            raise
