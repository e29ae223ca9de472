"""What the dispatcher needs to ask cluster-autoscaler for nodes: ProvisioningRequests.

Contract: a :class:`Provisioner` creates a head's request (with one PodTemplate per
distinct pod of the head, as the ``autoscaling.x-k8s.io/v1`` API requires: a request
names templates, never pods), reads its ``status.conditions`` (None: there is no such
request), deletes it with its templates, and marks pods to consume it (the annotations
cluster-autoscaler reads). ``fairshare.cluster.provreq_create``, ``provreq_get`` and
``provreq_delete`` are the Kubernetes calls, one verb each; :class:`KubeProvisioner`
puts them together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fairshare.cluster.cluster import GpuPod


class Provisioner(Protocol):
    """ProvisioningRequests of one cluster."""

    def create(self, name: str, namespace: str, pods: Sequence[GpuPod],
               labels: Mapping[str, str]) -> None:
        """Create request ``name`` for ``pods`` (an existing one is kept)."""
        ...

    def conditions(self, name: str, namespace: str) -> list[dict[str, Any]] | None:
        """The request's ``status.conditions``; None when it does not exist."""
        ...

    def delete(self, name: str, namespace: str) -> None:
        """Delete the request and its PodTemplates (gone already: nothing to do)."""
        ...

    def consume(self, pod: GpuPod, name: str) -> bool:
        """Annotate ``pod`` to consume request ``name``; False when the pod is gone."""
        ...
