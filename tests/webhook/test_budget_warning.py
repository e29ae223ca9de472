"""Budget warnings through ``fairgate serve`` over real TLS with real
AdmissionReview v1 JSON: the dispatcher's budget states in the real redis-server reach
the admissions of the tenant as ``warnings`` (what kubectl prints)."""

from __future__ import annotations

import time
from typing import Any

import redis
from test_https import mutate
from webhook_helpers import gpu_pod, review

from fairshare.queue.budget import BudgetStatus
from fairshare.queue.fairqueue import FairQueue
from webhook.process import ServeProcess
from webhook.service import BUDGET_REFRESH_SECONDS

WAIT = BUDGET_REFRESH_SECONDS * 4  # the webhook reads the states every 5 s


def _budget_warnings(server: ServeProcess, namespace: str = "team-a-dev") -> list[str]:
    body = review(gpu_pod(namespace, "trainer"), dry_run=True)
    response: dict[str, Any] = mutate(server, body)
    assert response["allowed"] is True
    return [w for w in response.get("warnings", []) if w.startswith("budget")]


def _until(server: ServeProcess, expected: list[str], namespace: str = "team-a-dev") -> None:
    deadline = time.monotonic() + WAIT
    seen = _budget_warnings(server, namespace)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = _budget_warnings(server, namespace)
    assert seen == expected


def _store(redis_url: str, *spent: tuple[str, float]) -> None:
    queue = FairQueue(redis.Redis.from_url(redis_url))
    queue.write_budgets([BudgetStatus(tenant, 20_000.0, amount, "USD", "2026-12", 0.0)
                         for tenant, amount in spent])


def test_admissions_carry_the_budget_warning_from_80_percent(
    server: ServeProcess, redis_url: str,
) -> None:
    _store(redis_url, ("team-a", 16_000.0))  # 80.0%
    _until(server, ["budget 80.0% used: team-a spent 16,000 of 20,000 USD this month; "
                    "at 100% training may not borrow"])
    _until(server, [], namespace="team-b-dev")  # another tenant's admissions: no warning

    _store(redis_url, ("team-a", 15_980.0))  # 79.9%: no warning
    _until(server, [])

    _store(redis_url, ("team-a", 20_000.0))  # 100%
    _until(server, ["budget exhausted (100.0%): team-a spent 20,000 of 20,000 USD this "
                    "month; training may not borrow"])

    _store(redis_url)  # the budget was removed
    _until(server, [])
