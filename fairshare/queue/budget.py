"""Tenant budgets: the state a month's spend puts a tenant in, and what it means.

Contract (pure: no I/O):
- A tenant with ``budget: {monthly: M}`` in ``platform.yaml`` is, for the calendar month
  (UTC) so far, ``ok`` while it has spent less than 80% of M, ``warning`` from 80% and
  ``exhausted`` from 100% (:func:`classify`; exact comparisons, no rounding: 79.99% is
  ``ok``). Spend is what ``fairgate report`` bills for this month so far (the dispatcher
  computes it on its pass: :class:`SpendSource`).
- Exhausted: the tenant's training may no longer borrow. The queue gets an effective
  borrow limit of 0 for it (``sync.lua`` reads the state :class:`BudgetStatus` stored in
  the hash ``<prefix>budget``), so a new training pod beyond nominal is stamped
  ``fairgate-training`` and waits for nominal room, and queued borrowed pods are not
  released. Nominal quota, the inference reserve and running pods are never touched.
- :func:`held_note` says what a queued borrowed pod of an exhausted tenant waits for.
- :func:`budget_warning` is the one-line admission warning of a tenant in ``warning`` or
  ``exhausted`` (within a warning's 120 characters for tenant names up to 20 characters
  and amounts below ten million).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from tenants.models import PricingSpec

BudgetState = Literal["ok", "warning", "exhausted"]
DEFAULT_BUDGET_EVERY = 60.0
"""Seconds between two budget passes of the dispatcher (``fairgate dispatch --budget-every``)."""
WARN_AT = 0.8
"""The fraction of the monthly budget from which admissions carry a warning."""
AT_100 = "at 100% training may not borrow"
EXHAUSTED = "training may not borrow"


class SpendSource(Protocol):
    """Month-to-date spend per tenant, as ``fairgate report`` bills it."""

    def spent(self, since: datetime, until: datetime,
              pricing: PricingSpec | None) -> tuple[dict[str, float], str]:
        """Cost per tenant over ``[since, until)`` and the currency it is in."""
        ...


@dataclass(frozen=True)
class BudgetStatus:
    """A tenant's budget for ``month`` (``YYYY-MM``) as of ``at`` (Unix seconds)."""

    tenant: str
    monthly: float
    spent: float
    currency: str
    month: str
    at: float

    @property
    def ratio(self) -> float:
        """Spent / monthly budget."""
        return self.spent / self.monthly

    @property
    def state(self) -> BudgetState:
        """``ok``, ``warning`` or ``exhausted`` (:func:`classify`)."""
        return classify(self.spent, self.monthly)

    def to_json(self) -> dict[str, Any]:
        """Plain data: the fields plus ``ratio`` and ``state``."""
        return {**asdict(self), "ratio": self.ratio, "state": self.state}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BudgetStatus:
        """The status :meth:`to_json` wrote (raises KeyError/TypeError/ValueError if not)."""
        return cls(tenant=str(data["tenant"]), monthly=float(data["monthly"]),
                   spent=float(data["spent"]), currency=str(data["currency"]),
                   month=str(data["month"]), at=float(data["at"]))

    def dumps(self) -> str:
        """:meth:`to_json` as compact JSON (what Redis stores)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def classify(spent: float, monthly: float) -> BudgetState:
    """The state of ``spent`` against a ``monthly`` budget (> 0)."""
    if spent >= monthly:
        return "exhausted"
    if spent >= monthly * WARN_AT:
        return "warning"
    return "ok"


def percent(ratio: float) -> str:
    """A ratio as a percentage for people: one decimal, never rounded up across 80 or
    100 (79.96% reads 79.9%, not 80.0%)."""
    return f"{math.floor(ratio * 1000) / 10:.1f}%"


def money(amount: float) -> str:
    """An amount for people: whole units from 100 on (``16,000``), else cents (``12.34``)."""
    return f"{amount:,.0f}" if abs(amount) >= 100 else f"{amount:,.2f}"


def budget_line(status: BudgetStatus) -> str:
    """``team-a spent 16,000 of 20,000 USD this month``."""
    return (f"{status.tenant} spent {money(status.spent)} of {money(status.monthly)} "
            f"{status.currency} this month")


def budget_warning(status: BudgetStatus) -> str | None:
    """The admission warning for ``status`` (spent, budget, percent, and what happens at
    100%); None while it is ``ok``."""
    if status.state == "ok":
        return None
    if status.state == "warning":
        return f"budget {percent(status.ratio)} used: {budget_line(status)}; {AT_100}"
    return f"budget exhausted ({percent(status.ratio)}): {budget_line(status)}; {EXHAUSTED}"


def held_note(status: BudgetStatus | None) -> str | None:
    """What a queued borrowed pod of an exhausted tenant waits for (``fairgate why``, the
    Queued Event: it replaces the queue's reason, which reads as a borrow limit of 0);
    None when the tenant's budget is not exhausted."""
    if status is None or status.state != "exhausted":
        return None
    return (f"borrowing to be allowed again: {budget_line(status)} "
            f"({percent(status.ratio)} of its budget); the month's end or a raised budget "
            f"allows it")


def read_budgets(raw: Mapping[Any, Any]) -> dict[str, BudgetStatus]:
    """The hash ``<prefix>budget`` as read from Redis: statuses by tenant (an entry that
    is not a stored :class:`BudgetStatus` is left out)."""
    found: dict[str, BudgetStatus] = {}
    for value in raw.values():
        try:
            status = BudgetStatus.from_json(json.loads(value))
        except (KeyError, TypeError, ValueError):
            continue
        found[status.tenant] = status
    return found
