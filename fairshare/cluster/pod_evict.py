"""Evict a pod through the Eviction API (``pods/eviction`` create).

Contract: :func:`evict` asks the API server to evict ``namespace/name`` (its uid given
as a precondition, so a replacement of the same name is never evicted). The API server
honours PodDisruptionBudgets and the pod's termination grace period. The outcome is
:data:`EVICTED` (accepted, or the pod is gone already), :data:`REFUSED` (429: a
PodDisruptionBudget forbids it now) or :data:`REPLACED` (409: the uid no longer
matches); anything else raises. :class:`KubeEvictor` is the :class:`Evictor` the
dispatcher is given.
"""

from __future__ import annotations

from typing import Literal, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fairshare.cluster.cluster import GpuPod

EvictOutcome = Literal["evicted", "refused", "replaced"]
EVICTED: EvictOutcome = "evicted"
REFUSED: EvictOutcome = "refused"
REPLACED: EvictOutcome = "replaced"


def evict(api: client.ApiClient, namespace: str, name: str, uid: str) -> EvictOutcome:
    """Create the Eviction of pod ``namespace/name`` whose uid is ``uid``."""
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        delete_options=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid)),
    )
    try:
        client.CoreV1Api(api).create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as error:
        if error.status == 404:
            return EVICTED
        if error.status == 429:
            return REFUSED
        if error.status == 409:
            return REPLACED
        raise
    return EVICTED


class Evictor(Protocol):
    """Evicts pods of one cluster (reclaim)."""

    def evict(self, pod: GpuPod) -> EvictOutcome:
        """Ask for ``pod``'s eviction (see :func:`evict`)."""
        ...


class KubeEvictor:
    """:class:`Evictor` on a Kubernetes API server."""

    def __init__(self, api: client.ApiClient) -> None:
        """Talk through ``api`` (a ``kubernetes.client.ApiClient``)."""
        self._api = api

    def evict(self, pod: GpuPod) -> EvictOutcome:
        return evict(self._api, pod.ref.namespace, pod.ref.name, pod.uid)
