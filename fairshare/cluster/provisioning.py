"""What the dispatcher needs to ask cluster-autoscaler for nodes: ProvisioningRequests.

Contract: a :class:`Provisioner` creates a head's request (with one PodTemplate per
distinct pod of the head, as the ``autoscaling.x-k8s.io/v1`` API requires: a request
names templates, never pods), reads its ``status.conditions`` (None: there is no such
request) and marks pods to consume it (the annotations cluster-autoscaler reads). It
deletes nothing: the pods own the request and its templates, and the garbage collector
deletes them once the pods are gone. ``fairshare.cluster.provreq_create`` and
``provreq_get`` are the Kubernetes calls, one verb each; :class:`KubeProvisioner` puts
them together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fairshare.autoscale import CLASS_ANNOTATION, CONSUME_ANNOTATION
from fairshare.cluster import provreq_create, provreq_get
from fairshare.cluster.cluster import GpuPod
from tenants.models import PROVISIONING_CLASS


class Provisioner(Protocol):
    """ProvisioningRequests of one cluster."""

    def create(self, name: str, namespace: str, pods: Sequence[GpuPod],
               labels: Mapping[str, str]) -> None:
        """Create request ``name`` for ``pods``, owned by them (an existing one is kept);
        ValueError when cluster-autoscaler would refuse its shape (the message says why)."""
        ...

    def conditions(self, name: str, namespace: str) -> list[dict[str, Any]] | None:
        """The request's ``status.conditions``; None when it does not exist."""
        ...

    def consume(self, pod: GpuPod, name: str) -> bool:
        """Annotate ``pod`` to consume request ``name``; False when the pod is gone."""
        ...


class KubeProvisioner:
    """:class:`Provisioner` on a Kubernetes API server (one verb per module)."""

    def __init__(self, api: client.ApiClient) -> None:
        """Talk through ``api`` (a ``kubernetes.client.ApiClient``)."""
        self._api = api

    def create(self, name: str, namespace: str, pods: Sequence[GpuPod],
               labels: Mapping[str, str]) -> None:
        core = client.CoreV1Api(self._api)
        manifests = [json.loads(cast(Any, core.read_namespaced_pod(
            p.ref.name, p.ref.namespace, _preload_content=False)).data) for p in pods]
        provreq_create.create(self._api, name, namespace, manifests, labels)

    def conditions(self, name: str, namespace: str) -> list[dict[str, Any]] | None:
        return provreq_get.conditions(self._api, name, namespace)

    def consume(self, pod: GpuPod, name: str) -> bool:
        patch = {"metadata": {"annotations": {CONSUME_ANNOTATION: name,
                                              CLASS_ANNOTATION: PROVISIONING_CLASS}}}
        try:
            client.CoreV1Api(self._api).patch_namespaced_pod(
                pod.ref.name, pod.ref.namespace, patch, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True
