"""The Eviction API call: one create on pods/eviction, its outcomes by status."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fairshare.cluster import pod_evict


class _Core:
    def __init__(self, status: int | None) -> None:
        self.status = status
        self.calls: list[tuple[str, str, Any]] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any) -> None:
        self.calls.append((name, namespace, body))
        if self.status is not None:
            raise ApiException(status=self.status)


@pytest.mark.parametrize(("status", "expected"), [
    (None, pod_evict.EVICTED), (404, pod_evict.EVICTED), (429, pod_evict.REFUSED),
    (409, pod_evict.REPLACED),
])
def test_eviction_outcomes(monkeypatch: pytest.MonkeyPatch, status: int | None,
                           expected: str) -> None:
    core = _Core(status)
    monkeypatch.setattr(client, "CoreV1Api", lambda api: core)
    assert pod_evict.evict(client.ApiClient(), "team-a", "p", "uid-1") == expected
    [(name, namespace, body)] = core.calls
    assert (name, namespace) == ("p", "team-a")
    assert body.metadata.name == "p" and body.delete_options.preconditions.uid == "uid-1"


def test_other_errors_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "CoreV1Api", lambda api: _Core(500))
    with pytest.raises(ApiException):
        pod_evict.evict(client.ApiClient(), "team-a", "p", "uid-1")
