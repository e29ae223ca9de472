"""What e2e tests need around API calls: patch content types and refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

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
