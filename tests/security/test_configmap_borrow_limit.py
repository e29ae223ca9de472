"""Attack: a tenant admin grants itself unlimited borrowing through its quota ConfigMap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from configmap_attacks import answer, quota_update, quota_webhook

from webhook.process import ServeProcess


@pytest.fixture(scope="module")
def quota_server(
    tmp_path_factory: pytest.TempPathFactory, redis_server_url: str
) -> Iterator[ServeProcess]:
    with quota_webhook(tmp_path_factory.mktemp("borrow"), redis_server_url) as server:
        yield server


def test_tenant_admin_cannot_raise_borrow_limit_above_ceiling(quota_server: ServeProcess) -> None:
    with quota_server.client() as client:
        refused = answer(client, "/validate", quota_update(
            "nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 20}\n"))
        assert refused["allowed"] is False
        assert ("nominal 8.00 + borrowLimit 20.00 GPU-eq = 28.00 exceeds team-a's ceiling "
                "24.00: lower borrowLimit to at most 16.00") in refused["status"]["message"]
        at_ceiling = answer(client, "/validate", quota_update(
            "nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 16}\n"))
        assert at_ceiling["allowed"] is True, at_ceiling
