"""Hostile YAML in quota ConfigMaps: the parser in-process and the validator over HTTPS.

Oracles: :func:`tenants.schema.parse_quota` either returns a quota or raises
:class:`~tenants.schema.ConfigError` (a message saying what is wrong), whatever the text
(alias bombs, tags, deep nesting, huge numbers, oversized documents); ``/validate`` answers
every edit with a valid AdmissionReview, and a refused edit carries that message, never
fairgate's internal-error denial.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import examples, rss_bytes
from hostile import YAML_BUG_SEEDS, YAML_SEEDS, quota_yaml
from hypothesis import HealthCheck, given, settings
from test_webhook_fuzz import RSS_LIMIT, assert_valid_answer
from webhook_helpers import review, write_config

from tenants.schema import ConfigError, parse_platform, parse_quota
from tenants.source import LocalDirSource
from webhook.process import ServeProcess

pytestmark = pytest.mark.slow

PLATFORM = parse_platform(
    "platformAdmins: {groups: [platform-team]}\n"
    "tenants:\n  team-a: {weight: 2, ceiling: {gpuEquivalents: 8}}\n"
)
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]


def _quota_configmap(text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "quota-team-a", "namespace": "fairgate-system",
                         "labels": {"fairgate.io/quota": "team-a"}},
            "data": {"quota.yaml": text}}


SEEDS = [pytest.param(text, id=f"seed-{i}") for i, text in enumerate(YAML_SEEDS)] + [
    pytest.param(text, id=name) for name, text in YAML_BUG_SEEDS.items()]


@pytest.mark.parametrize("text", SEEDS)
def test_parse_quota_refuses_hostile_yaml_with_a_config_error(text: str) -> None:
    try:
        parse_quota(text, "team-a", PLATFORM)
    except ConfigError as error:
        assert str(error)


@settings(max_examples=examples(200), deadline=None, database=None, suppress_health_check=SLOW)
@given(text=quota_yaml)
def test_parse_quota_never_raises_anything_but_a_config_error(text: str) -> None:
    try:
        parse_quota(text, "team-a", PLATFORM)
    except ConfigError as error:
        assert str(error)


def _edit(text: str) -> dict[str, Any]:
    """team-a's admin bob changes quota-team-a to ``text``."""
    return review(_quota_configmap(text), operation="UPDATE",
                  old=_quota_configmap("nominal: {gpu: 2}\n"), kind="ConfigMap",
                  resource="configmaps", user="bob", groups=("team-a-admins",))


@pytest.mark.parametrize("name", sorted(YAML_BUG_SEEDS))
def test_unparseable_quota_is_refused_with_a_clear_message(
    fuzz_client: httpx.Client, name: str
) -> None:
    body = _edit(YAML_BUG_SEEDS[name])
    reply = fuzz_client.post("/validate", json=body)
    assert_valid_answer(reply, body["request"]["uid"], "/validate")


@settings(max_examples=examples(60), deadline=None, database=None, suppress_health_check=SLOW)
@given(text=quota_yaml)
def test_hostile_quota_edits_get_a_valid_answer(
    fuzz_server: ServeProcess, fuzz_client: httpx.Client, text: str
) -> None:
    assert fuzz_server.process is not None
    body = _edit(text)
    reply = fuzz_client.post("/validate", json=body)
    assert_valid_answer(reply, body["request"]["uid"], "/validate")
    assert rss_bytes(fuzz_server.process.pid) <= RSS_LIMIT


def test_a_hostile_quota_file_does_not_stop_config_reload(tmp_path: Path) -> None:
    """A --config-dir quota file that breaks the YAML parser is reported and skipped; a
    later good edit is still picked up (the poll thread survives)."""
    write_config(tmp_path)
    quota = tmp_path / "quota-team-a.yaml"
    source = LocalDirSource(tmp_path, poll_interval=0.1)
    source.start()
    try:
        generation = source.generation
        quota.write_text(YAML_BUG_SEEDS["5000 nested flow lists"])
        _wait(lambda: bool(source.last_error))
        quota.write_text("nominal: {gpu: 3}\n")
        _wait(lambda: source.generation > generation)
        assert source.config.tenant("team-a").nominal == {"gpu": 3}  # type: ignore[union-attr]
    finally:
        source.close()


def _wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
