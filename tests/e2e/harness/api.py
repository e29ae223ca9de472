"""What e2e tests need around API calls: patch content types, refusals, namespaces."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from .waiting import wait_for

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


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
