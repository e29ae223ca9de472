"""What e2e tests need around API calls: patch content types, refusals, namespaces, CRDs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .waiting import wait_for

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
CRDS = Path(__file__).parent.parent / "crds"
"""The CRDs of other projects the e2e control plane serves (each file says its source)."""


def refusal(call: Callable[[], Any]) -> tuple[int, str]:
    """HTTP status and Status message of the ApiException `call()` raises (must raise)."""
    with pytest.raises(ApiException) as refused:
        call()
    return refused.value.status, message_of(refused.value)


def message_of(error: ApiException) -> str:
    """The `message` of the API server's Status body."""
    message: str = json.loads(error.body or "{}").get("message", "")
    return message


def create_namespace(core: Any, name: str, labels: Mapping[str, str] | None = None) -> None:
    """Create namespace `name` and return once the serviceaccount controller has given it
    its `default` ServiceAccount (the ServiceAccount admission plugin refuses pods until
    then)."""
    core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
    wait_for_default_account(core, name)


def wait_for_default_account(core: Any, name: str) -> None:
    """Return once namespace `name` has its `default` ServiceAccount."""

    def has_default() -> bool:
        accounts = core.list_namespaced_service_account(
            name, field_selector="metadata.name=default"
        )
        return bool(accounts.items)

    wait_for(has_default, 30, f"the default ServiceAccount of namespace {name}")


def serve_crd(api: client.ApiClient, path: Path, timeout: float = 30.0) -> str:
    """Create the CRD in `path` (one that exists already is kept) and return its name once
    the API server serves it (condition Established)."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(path.read_text())
    name: str = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as error:
        if error.status != 409:
            raise

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout, f"the CRD {name} to be served")
    return name
