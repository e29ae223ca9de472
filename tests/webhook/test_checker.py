"""webhook.checker: ConfigMap checks in a real worker process, under a time budget."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tenants.configmaps import review_configmap
from tenants.models import FairgateConfig
from tenants.schema import parse_platform, parse_quota
from webhook.checker import CheckerError, CheckOverBudget, ConfigMapChecker

PLATFORM = parse_platform(
    "tenants:\n  team-a: {weight: 1, ceiling: {gpuEquivalents: 24}, "
    "admins: {groups: [team-a-admins]}}\n"
)
CONFIG = FairgateConfig(platform=PLATFORM,
                        quotas={"team-a": parse_quota("nominal: {gpu: 8}", "team-a", PLATFORM)})


def _platform_of(tenants: int) -> str:
    """A platform.yaml of ``tenants`` tenants: platform admins' documents have no node cap."""
    return "tenants:\n" + "".join(
        f"  t{i}: {{weight: 1, ceiling: {{gpuEquivalents: 1}}, admins: {{groups: [g{i}]}}}}\n"
        for i in range(tenants))


def _arguments(text: str) -> dict[str, Any]:
    return {
        "operation": "UPDATE", "name": "quota-team-a", "namespace": "fairgate-system",
        "new_data": {"quota.yaml": text}, "old_data": {"quota.yaml": "nominal: {gpu: 8}"},
        "username": "alice", "groups": ("team-a-admins",),
        "labels": {"fairgate.io/quota": "team-a"}, "current": CONFIG,
    }


@pytest.fixture
def checker() -> Iterator[ConfigMapChecker]:
    started = ConfigMapChecker(budget_seconds=0.3, margin_seconds=0.2)
    started.start()
    yield started
    started.stop()


def _child_pid(checker: ConfigMapChecker) -> int:
    child = checker._child
    assert child is not None and child.poll() is None
    return child.pid


def test_the_worker_gives_the_in_process_verdict(checker: ConfigMapChecker) -> None:
    for text in ("nominal: {gpu: 12}\nborrowLimit: {gpuEquivalents: 4}\n",
                 "nominal: {gpu: 12}\nborrowLimit: {gpuEquivalents: 20}\n", "x: [1"):
        verdict = asyncio.run(checker.review(**_arguments(text)))
        assert verdict == review_configmap(**_arguments(text))


def test_a_check_over_budget_is_stopped_by_the_worker_which_stays_up() -> None:
    """The budget is a quarter of what the largest platform.yaml under the size cap costs
    this machine in process (CI machines differ several-fold in speed)."""
    platform_edit = {**_arguments(""), "name": "fairgate-platform",
                     "new_data": {"platform.yaml": _platform_of(3300)}, "old_data": None,
                     "groups": ("system:masters",)}
    started = time.monotonic()
    in_process = review_configmap(**platform_edit)
    budget = round(max(0.02, (time.monotonic() - started) / 4), 3)
    assert "cap" not in in_process.message, "the document must be under the size cap"
    checker = ConfigMapChecker(budget_seconds=budget, margin_seconds=0.2)
    checker.start()
    try:
        pid = _child_pid(checker)
        started = time.monotonic()
        with pytest.raises(CheckOverBudget,
                           match=rf"not checked within fairgate's {budget:g} s budget"):
            asyncio.run(checker.review(**platform_edit))
        assert time.monotonic() - started < budget + 0.2
        assert _child_pid(checker) == pid, "the child stopped the check itself"
        assert asyncio.run(checker.review(**_arguments("nominal: {gpu: 2}"))).allowed
    finally:
        checker.stop()


def test_a_silent_worker_is_killed_at_budget_plus_margin_and_replaced(
    checker: ConfigMapChecker,
) -> None:
    pid = _child_pid(checker)
    os.kill(pid, signal.SIGSTOP)  # alive but answering nothing, not even its alarm
    started = time.monotonic()
    with pytest.raises(CheckOverBudget):
        asyncio.run(checker.review(**_arguments("nominal: {gpu: 2}")))
    assert 0.3 + 0.2 <= time.monotonic() - started < 0.3 + 0.2 + 0.2
    assert checker._child is None or checker._child.pid != pid
    checker.start()  # what a later check does when it finds no child (with a warm-up)
    assert _child_pid(checker) != pid
    assert asyncio.run(checker.review(**_arguments("nominal: {gpu: 2}"))).allowed


def test_a_dead_worker_is_replaced_by_the_next_check(checker: ConfigMapChecker) -> None:
    """The check that meets the dead child fails (CheckerError), or, when the death was
    already seen, waits for a new child (about a second of imports) and is refused over
    budget, or (on a fast machine) is checked by the new child within the budget; a later
    check is checked by the new child."""
    pid = _child_pid(checker)
    os.kill(pid, signal.SIGKILL)
    try:
        assert asyncio.run(checker.review(**_arguments("nominal: {gpu: 2}"))).allowed
        assert _child_pid(checker) != pid
    except (CheckerError, CheckOverBudget):
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            assert asyncio.run(checker.review(**_arguments("nominal: {gpu: 2}"))).allowed
            break
        except CheckOverBudget:
            time.sleep(0.2)  # the new child is still importing
    assert _child_pid(checker) != pid
