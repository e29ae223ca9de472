"""Attack: a quota ConfigMap created with ``generateName`` (no name yet) or a look-alike
carrying the quota label, to slip past the checks that key on ``quota-<tenant>``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from configmap_attacks import answer, configmap_review, quota_webhook

from webhook.process import ServeProcess

GREEDY = {"quota.yaml": "nominal: {gpu: 1000}\nborrowLimit: {gpuEquivalents: 1000}\n"}


@pytest.fixture(scope="module")
def quota_server(
    tmp_path_factory: pytest.TempPathFactory, redis_server_url: str
) -> Iterator[ServeProcess]:
    with quota_webhook(tmp_path_factory.mktemp("generate-name"), redis_server_url) as server:
        yield server


@pytest.mark.parametrize("metadata", [
    {"generateName": "quota-"},
    {"generateName": "quota-team-a-", "labels": {"fairgate.io/quota": "team-a"}},
    {"generateName": "settings-", "labels": {"fairgate.io/quota": "team-a"}},
], ids=["quota-prefix", "quota-prefix-labelled", "labelled"])
def test_configmap_generate_name_cannot_dodge_validation(
    quota_server: ServeProcess, metadata: dict[str, object],
) -> None:
    with quota_server.client() as client:
        refused = answer(client, "/validate", configmap_review("CREATE", metadata, GREEDY))
    assert refused["allowed"] is False
    assert "quota ConfigMaps must be created with an explicit name: set metadata.name to " \
           "quota-" in refused["status"]["message"]


def test_configmap_quota_label_on_a_look_alike_is_refused(quota_server: ServeProcess) -> None:
    with quota_server.client() as client:
        refused = answer(client, "/validate", configmap_review(
            "CREATE", {"name": "team-a-quota", "labels": {"fairgate.io/quota": "team-a"}},
            GREEDY))
        other = answer(client, "/validate", configmap_review(
            "CREATE", {"generateName": "settings-"}, {"k": "v"}))
    assert refused["allowed"] is False
    assert "the label fairgate.io/quota is reserved" in refused["status"]["message"]
    assert other["allowed"] is True
