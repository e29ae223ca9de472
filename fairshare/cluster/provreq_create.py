"""Create a ProvisioningRequest (``autoscaling.x-k8s.io/v1``) with its PodTemplates.

Contract: :func:`pod_sets` turns pod manifests into PodTemplate bodies, one per pod
shape, with the count of pods of that shape. A shape is the pod's spec without what
names one pod: scheduling gates, node name, ``hostname`` (an Indexed Job's pods differ
there and in their labels and annotations), and the API token volume the ServiceAccount
admission plugin adds to every pod under a random name (``kube-api-access-<random>``,
projected) with its mounts, which the pods of a template get again when created; a
template carries the labels and annotations all its pods share. More shapes than
cluster-autoscaler accepts (:data:`MAX_POD_SETS`) is a :class:`ValueError` saying so.
:func:`request_body` names the templates with class
:data:`~tenants.models.PROVISIONING_CLASS`. Templates and request are owned by the pods
(``ownerReferences``): Kubernetes' garbage collector deletes them once every pod they
were made for is gone, so fairgate needs no delete grant. :func:`create` creates the
templates, then the request; an object that exists already is kept (409 is success: a
restarted dispatcher finds its own request).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tenants.models import PROVISIONING_CLASS

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
MAX_POD_SETS = 32
"""``spec.podSets`` maxItems in cluster-autoscaler's ProvisioningRequest CRD."""
_DROPPED_SPEC = ("schedulingGates", "nodeName", "hostname")
_TOKEN_VOLUME = "kube-api-access-"
_CONTAINER_LISTS = ("containers", "initContainers")


def _owners(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One reference per pod (no ``blockOwnerDeletion``: deleting a pod never waits)."""
    return [{"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"],
             "uid": p["metadata"]["uid"]} for p in pods]


def _shared(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The entries every one of ``maps`` has, with the same value."""
    return {k: v for k, v in maps[0].items() if all(m.get(k) == v for m in maps[1:])}


def _shape(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's spec without what names one pod (see the module docstring)."""
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _DROPPED_SPEC}
    tokens = {v["name"] for v in spec.get("volumes") or []
              if v["name"].startswith(_TOKEN_VOLUME) and "projected" in v}
    if not tokens:
        return spec
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in tokens]
    for field in _CONTAINER_LISTS:
        if field in spec:
            spec[field] = [{**c, "volumeMounts": [m for m in c.get("volumeMounts") or []
                                                  if m["name"] not in tokens]}
                           for c in spec[field]]
    return spec


def pod_sets(name: str, pods: Sequence[Mapping[str, Any]],
             labels: Mapping[str, str]) -> list[tuple[dict[str, Any], int]]:
    """PodTemplate bodies for ``pods`` (named ``<name>-<i>``), each with its count."""
    shapes: dict[str, tuple[dict[str, Any], list[Mapping[str, Any]]]] = {}
    for pod in pods:
        spec = _shape(pod)
        shapes.setdefault(json.dumps(spec, sort_keys=True), (spec, []))[1].append(
            pod.get("metadata") or {})
    if len(shapes) > MAX_POD_SETS:
        raise ValueError(
            f"{len(pods)} pods of {len(shapes)} shapes (specs that differ in more than "
            f"their hostname): a ProvisioningRequest holds at most {MAX_POD_SETS} pod sets; "
            "give the pods of one gang fewer distinct specs")
    owners = _owners(pods)
    return [({"apiVersion": "v1", "kind": "PodTemplate",
              "metadata": {"name": f"{name}-{i}", "labels": dict(labels),
                           "ownerReferences": owners},
              "template": {"metadata": {
                  "labels": _shared([m.get("labels") or {} for m in metas]),
                  "annotations": _shared([m.get("annotations") or {} for m in metas])},
                  "spec": spec}}, len(metas))
            for i, (spec, metas) in enumerate(shapes.values())]


def request_body(name: str, sets: Sequence[tuple[Mapping[str, Any], int]],
                 labels: Mapping[str, str]) -> dict[str, Any]:
    """The ProvisioningRequest naming the templates of ``sets`` (and owned as they are)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ProvisioningRequest",
            "metadata": {"name": name, "labels": dict(labels),
                         "ownerReferences": list(sets[0][0]["metadata"]["ownerReferences"])},
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
