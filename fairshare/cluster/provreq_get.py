"""Read a ProvisioningRequest's ``status.conditions`` (None: there is no such request)."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fairshare.cluster.provreq_create import GROUP, PLURAL, VERSION


def conditions(api: client.ApiClient, name: str, namespace: str) -> list[dict[str, Any]] | None:
    """The request's conditions (an empty list before the autoscaler wrote any)."""
    try:
        found = cast(dict[str, Any], client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return list(((found or {}).get("status") or {}).get("conditions") or [])
