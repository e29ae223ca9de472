"""Delete a ProvisioningRequest and the PodTemplates fairgate made for it (by label)."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fairshare.cluster.provreq_create import GROUP, PLURAL, VERSION


def delete(api: client.ApiClient, name: str, namespace: str, label: str) -> None:
    """Delete request ``name`` and the templates labelled ``label=name`` (gone: fine)."""
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as error:
        if error.status != 404:
            raise
    client.CoreV1Api(api).delete_collection_namespaced_pod_template(
        namespace, label_selector=f"{label}={name}")
