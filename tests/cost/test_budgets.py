"""Budgets: the real queue in a real redis-server, the real dispatcher on the
simulated cluster, and month-to-date spend billed from the real audit stream holding a
synthetic priced history. Prices: 1 USD per GPU-hour, so one GPU for an hour spends 1."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from audit import BUDGET, RELEASE, START, AuditLog, AuditRecord
from audit.chain import format_time
from audit.usage import start_detail
from cost.budget import AuditSpend
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.budget import BudgetStatus, budget_warning, classify, percent
from fairshare.queue.fairqueue import FairQueue
from fairshare.sim.simcluster import SimulatedCluster, VirtualClock
from fairshare.status import budget_lines, status_report, why_report
from tenants.models import FairgateConfig, PlatformConfig, PricingSpec, QuotaSpec
from tenants.schema import ConfigError, parse_platform
from tests.fairshare.simkit import Rig, admit_hook

HOUR = 3600.0
T0 = 1_000.0  # the rig's clock starts here: 1970-01-01 00:16:40 UTC, in January 1970
FEB = 31 * 24 * HOUR  # 1970-02-01 00:00:00 UTC


def config(monthly: float | None = 100.0, borrow: int = 2) -> FairgateConfig:
    """team-a: nominal 1 GPU, may borrow ``borrow``, budget ``monthly`` USD; team-b: 1 GPU."""
    team_a: dict[str, Any] = {"weight": 1, "ceiling": {"gpuEquivalents": 100}}
    if monthly is not None:
        team_a["budget"] = {"monthly": monthly}
    platform = PlatformConfig.model_validate({
        "tenants": {"team-a": team_a,
                    "team-b": {"weight": 1, "ceiling": {"gpuEquivalents": 100}}},
        "pricing": {"currency": "USD", "gpuHour": {"default": 1.0}},
    })
    quotas = {
        "team-a": QuotaSpec.model_validate({"nominal": {"gpu": 1},
                                            "borrowLimit": {"gpuEquivalents": borrow}}),
        "team-b": QuotaSpec.model_validate({"nominal": {"gpu": 1}}),
    }
    return FairgateConfig(platform=platform, quotas=quotas)


class BudgetRig(Rig):
    """The simkit rig with an audit log and the dispatcher's spend source on it."""

    audit: AuditLog
    current: FairgateConfig
    spend: AuditSpend

    def history(self, uid: str, start: float, hours: float, tenant: str = "team-a") -> None:
        """A pod of one GPU that ran ``hours`` from ``start`` (seconds), as the dispatcher
        records it (``start``, then ``release``)."""
        common: dict[str, Any] = {
            "uid": uid, "user": "fairgate-dispatcher", "operation": "DISPATCH",
            "tenant": tenant, "namespace": f"{tenant}-ns", "name": uid,
            "pod_class": "training", "demand": "gpu=1"}
        self.audit.record(START, time=_at(start), reason="running on node n1",
                          diff=start_detail("training", "n1", None), **common)
        self.audit.record(RELEASE, time=_at(start + hours * HOUR), reason="pod succeeded",
                          **common)

    def set_config(self, new: FairgateConfig) -> None:
        self.current = new

    def records(self, decision: str) -> list[AuditRecord]:
        return [e.record for e in self.audit.entries()
                if e.record is not None and e.record.decision == decision]

    def state(self, tenant: str = "team-a") -> BudgetStatus:
        return self.queue.budgets()[tenant]


def _at(seconds: float) -> str:
    return format_time(datetime.fromtimestamp(seconds, UTC))


def budget_rig(redis_url: str, capacity: dict[str, int], monthly: float = 100.0) -> BudgetRig:
    client = redis.Redis.from_url(redis_url)
    queue = FairQueue(client)
    clock = VirtualClock(T0)
    audit = AuditLog(client, out=io.StringIO())
    first = config(monthly)
    spend = AuditSpend(audit)
    cluster = SimulatedCluster(dict(capacity), admit_hook(queue, clock, first), clock)
    rig = BudgetRig(client, queue, clock, cluster, Dispatcher(
        queue, cluster, lambda: rig.current, clock=clock, audit=audit,
        settings=DispatcherSettings(budget_every=0.0), spend=spend), first)
    rig.audit, rig.current, rig.spend = audit, first, spend
    rig.dispatcher.sync(force=True)
    return rig


def exhausted_rig(redis_url: str) -> BudgetRig:
    """A rig on 4 GPUs whose team-a ran 100 GPU-hours this month: its budget is spent."""
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 100.0)
    rig.at(200 * HOUR)
    assert rig.state().state == "exhausted"
    return rig


def _borrow_limit(rig: BudgetRig, tenant: str = "team-a") -> int:
    return next(s.borrow_limit_slices for s in rig.queue.tenant_status() if s.tenant == tenant)


def test_thresholds_are_exact_and_every_transition_is_audited(redis_url: str) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    # 79.9 GPU-hours of history (79.9% of 100 USD), all in January
    rig.history("h1", T0 + 10, 79.9)
    rig.at(200 * HOUR)
    status = rig.state()
    assert status.spent == pytest.approx(79.9) and status.state == "ok"
    assert budget_warning(status) is None
    assert _borrow_limit(rig) == 14  # 2 GPU-eq
    assert rig.records(BUDGET) == []  # a budget first seen ok is no transition

    rig.history("h2", T0 + 100 * HOUR, 0.1)  # 80.0 exactly
    rig.at(201 * HOUR)
    status = rig.state()
    assert status.spent == 80.0 and status.state == "warning"
    assert budget_warning(status) == (
        "budget 80.0% used: team-a spent 80.00 of 100 USD this month; "
        "at 100% training may not borrow")
    assert _borrow_limit(rig) == 14  # a warning changes nothing else

    rig.history("h3", T0 + 120 * HOUR, 19.9)  # 99.9
    rig.at(202 * HOUR)
    assert rig.state().state == "warning"
    rig.history("h4", T0 + 150 * HOUR, 0.1)  # 100.0
    rig.at(203 * HOUR)
    status = rig.state()
    assert status.spent == pytest.approx(100.0) and status.state == "exhausted"
    assert budget_warning(status) == (
        "budget exhausted (100.0%): team-a spent 100 of 100 USD this month; "
        "training may not borrow")
    assert _borrow_limit(rig) == 0
    assert "team-b" not in rig.queue.budgets()  # no budget, no entry

    records = rig.records(BUDGET)
    assert [(r.tenant, r.diff["budget"]["before"], r.diff["budget"]["after"])
            for r in records if r.diff] == [("team-a", "ok", "warning"),
                                            ("team-a", "warning", "exhausted")]
    assert records[0].diff is not None and records[0].diff["budget"] == {
        "before": "ok", "after": "warning", "spent": 80.0, "monthly": 100.0,
        "currency": "USD", "month": "1970-01"}
    assert records[1].reason == "budget exhausted: team-a spent 100 of 100 USD this month"
    result, _ = rig.audit.verify()
    assert result.ok, result.problem

    metrics = rig.dispatcher.metrics.render().decode()
    assert 'fairgate_tenant_budget_spent_ratio{tenant="team-a"} 1.0' in metrics
    assert 'fairgate_tenant_budget{currency="USD",tenant="team-a"} 100.0' in metrics
    assert 'tenant="team-b"' not in "".join(
        line for line in metrics.splitlines() if line.startswith("fairgate_tenant_budget"))
    report = status_report(rig.queue, rig.clock())
    assert report["budgets"]["team-a"]["state"] == "exhausted"
    assert report["budgets"]["team-a"]["spent"] == pytest.approx(100.0)
    assert budget_lines(report["budgets"]) == [
        "budget team-a: 100 / 100 USD in 1970-01 (100.0%), exhausted: training may "
        "not borrow"]


def test_classify_and_percent_never_round_across_a_threshold() -> None:
    assert classify(79.99, 100) == "ok"
    assert classify(16_000, 20_000) == "warning"
    assert classify(15_999.99, 20_000) == "ok"
    assert classify(19_999.99, 20_000) == "warning"
    assert classify(20_000, 20_000) == "exhausted"
    assert percent(0.7999) == "79.9%"
    assert percent(0.99999) == "99.9%"
    assert percent(1.0) == "100.0%"


def test_exhausted_budget_keeps_nominal_and_training_beyond_it_waits_unborrowed(
    redis_url: str,
) -> None:
    rig = exhausted_rig(redis_url)

    nominal = rig.pod("nominal", duration=HOUR)
    beyond = rig.pod("beyond", duration=HOUR)
    rig.settle()
    # nominal is admitted at once; the second pod is not stamped borrowed although
    # 3 GPUs are idle: it waits for nominal room like a tenant that may not borrow
    assert rig.cluster.history[nominal.uid].band == "training"
    assert rig.cluster.history[nominal.uid].released is not None
    assert rig.cluster.history[beyond.uid].band == "training"
    assert rig.cluster.history[beyond.uid].released is None
    rig.at(200 * HOUR + HOUR)  # the nominal pod ends: the next one gets its room
    assert rig.cluster.history[beyond.uid].released == pytest.approx(201 * HOUR)
    infer = rig.pod("infer", pod_class="inference", duration=60)
    rig.settle()
    assert rig.cluster.history[infer.uid].band == "inference"


def test_queued_borrowed_pods_are_held_while_exhausted_and_released_on_a_raise(
    redis_url: str,
) -> None:
    rig = budget_rig(redis_url, {"gpu": 3})
    rig.at(110 * HOUR)
    rig.pod("nominal", duration=100 * HOUR)
    running = rig.pod("borrowed-running", duration=100 * HOUR)
    other = rig.pod("team-b", tenant="team-b", duration=HOUR)
    queued = rig.pod("borrowed-queued", duration=HOUR)
    rig.settle()
    assert rig.cluster.history[running.uid].band == "borrowed"
    assert rig.cluster.history[running.uid].released is not None
    assert rig.cluster.history[other.uid].released is not None
    assert rig.cluster.history[queued.uid].band == "borrowed"
    assert rig.cluster.history[queued.uid].released is None  # no capacity yet

    rig.history("h1", T0 + 10, 100.0)  # the month's spend reaches the budget
    rig.settle()
    assert rig.state().state == "exhausted"
    rig.at(111 * HOUR + 1)  # team-b's pod ends: a GPU is free
    assert rig.cluster.history[queued.uid].released is None  # held: no borrowing
    held = "waiting for borrowing to be allowed again: team-a spent 102 of 100 USD this month"
    why = why_report(queued.ref, rig.queue, (e.record for e in rig.audit.entries()
                                             if e.record is not None), rig.clock())
    assert why.verdict == "queued" and held in why.summary, why.summary
    assert why.summary.endswith("(102.0% of its budget); the month's end or a raised budget "
                                "allows it")
    rig.at(111 * HOUR + 120)  # the next Queued event says why it waits
    told = [e.message for e in rig.cluster.events
            if e.pod == queued.ref and e.reason == "Queued"]
    assert told and held in told[-1]
    assert rig.cluster.history[running.uid].ended is None  # a running pod is never touched
    assert not rig.cluster.history[running.uid].preempted

    rig.set_config(config(monthly=1_000.0))  # the platform team raises the budget
    rig.settle()
    assert rig.state().state == "ok"
    assert rig.cluster.history[queued.uid].released == pytest.approx(111 * HOUR + 120)
    records = rig.records(BUDGET)
    assert [(r.diff or {})["budget"]["after"] for r in records] == ["exhausted", "ok"]
    assert (records[1].diff or {})["budget"]["monthly"] == 1_000.0
    assert rig.audit.verify()[0].ok


def test_a_pod_larger_than_nominal_waits_as_borrowed_until_borrowing_is_allowed(
    redis_url: str,
) -> None:
    rig = exhausted_rig(redis_url)
    big = rig.pod("big", demand={"gpu": 2}, duration=HOUR)  # nominal is 1 GPU
    rig.settle()
    # stamped training it could never run; borrowed, it runs once borrowing is back
    assert rig.cluster.history[big.uid].band == "borrowed"
    assert rig.cluster.history[big.uid].released is None
    rig.at(201 * HOUR)
    assert rig.cluster.history[big.uid].released is None
    rig.set_config(config(monthly=500.0))
    rig.settle()
    assert rig.cluster.history[big.uid].released == pytest.approx(201 * HOUR)


def test_the_month_rollover_resets_the_spend_and_lifts_the_block(redis_url: str) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 150.0)
    rig.at(FEB - HOUR)
    assert rig.state().state == "exhausted" and _borrow_limit(rig) == 0
    assert rig.spend.kept() == 3  # the dispatcher's pricing record, h1's start and release
    rig.at(FEB + 60)
    assert rig.spend.kept() == 1  # h1 ended in January: only the prices are kept
    status = rig.state()
    assert status.month == "1970-02" and status.spent == 0.0 and status.state == "ok"
    assert _borrow_limit(rig) == 14
    last = rig.records(BUDGET)[-1]
    assert last.diff == {"budget": {"before": "exhausted", "after": "ok", "spent": 0.0,
                                    "monthly": 100.0, "currency": "USD", "month": "1970-02"}}
    # a pod that spans the month's start counts in February only from midnight
    rig.history("h2", FEB - HOUR, 81.0)
    rig.at(FEB + 100 * HOUR)
    assert rig.state().spent == pytest.approx(80.0)
    assert rig.state().state == "warning"


def test_spend_survives_a_restart_and_a_redis_state_loss(redis_url: str) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 90.0)
    rig.at(200 * HOUR)
    assert rig.state().state == "warning"
    rig.client.delete("fairgate:budget")  # the stored states are lost, the stream is not
    restarted = Dispatcher(rig.queue, rig.cluster, lambda: rig.current, clock=rig.clock,
                           audit=rig.audit, settings=DispatcherSettings(budget_every=0.0),
                           spend=AuditSpend(rig.audit))
    restarted.step()
    assert rig.state().spent == pytest.approx(90.0) and rig.state().state == "warning"


def test_a_queue_state_loss_restores_the_budget_block_in_the_same_step(
    redis_url: str,
) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 120.0)
    rig.at(200 * HOUR)
    assert _borrow_limit(rig) == 0
    rig.dispatcher.settings = DispatcherSettings(budget_every=HOUR)  # no pass is due
    # Redis loses the queue's keys (the audit stream is kept elsewhere or survived)
    lost = [k for k in rig.client.keys("fairgate:*") if not k.startswith(b"fairgate:audit")]
    rig.client.delete(*lost)
    rig.dispatcher.step()  # it notices (not rebuilt), reconciles, and recomputes budgets
    assert rig.state().state == "exhausted"
    assert _borrow_limit(rig) == 0


def test_removing_a_budget_drops_its_state_and_audits_it(redis_url: str) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 120.0)
    rig.at(200 * HOUR)
    assert _borrow_limit(rig) == 0
    rig.set_config(config(monthly=None))
    rig.settle()
    assert rig.queue.budgets() == {}
    assert _borrow_limit(rig) == 14
    last = rig.records(BUDGET)[-1]
    assert (last.diff or {})["budget"]["before"] == "exhausted"
    assert (last.diff or {})["budget"]["after"] == ""
    assert "budget removed" in last.reason


class _BrokenSpend:
    """A spend source whose billing fails (say, a record it cannot bill)."""

    def spent(self, since: datetime, until: datetime,
              pricing: PricingSpec | None) -> tuple[dict[str, float], str]:
        raise ValueError("cannot bill")


def test_a_failing_spend_source_never_stops_dispatching(redis_url: str) -> None:
    rig = budget_rig(redis_url, {"gpu": 4})
    rig.history("h1", T0 + 10, 120.0)
    rig.at(200 * HOUR)
    assert rig.state().state == "exhausted"
    rig.dispatcher.spend = _BrokenSpend()
    rig.set_config(config(monthly=1_000.0))  # a pass is due at once, and fails
    pod = rig.pod("nominal", duration=HOUR)
    rig.settle()
    assert rig.cluster.history[pod.uid].released is not None
    assert rig.state().state == "exhausted"  # the last stored state stays


@pytest.mark.parametrize("value", ["0", "-5", "abc", "true", ".nan", "[1]"])
def test_a_bad_budget_is_refused_naming_the_tenant(value: str) -> None:
    text = ("tenants:\n  team-a: {weight: 1, ceiling: {gpuEquivalents: 4}, "
            f"budget: {{monthly: {value}}}}}\n")
    with pytest.raises(ConfigError) as caught:
        parse_platform(text)
    message = str(caught.value)
    assert "tenants.team-a.budget.monthly" in message
    assert "greater than 0" in message and "budget: {monthly: 20000}" in message


def test_a_budget_needs_monthly_and_nothing_else() -> None:
    base = "tenants:\n  team-a: {weight: 1, ceiling: {gpuEquivalents: 4}, budget: %s}\n"
    with pytest.raises(ConfigError, match=r"tenants\.team-a\.budget\.monthly"):
        parse_platform(base % "{}")
    with pytest.raises(ConfigError, match=r"tenants\.team-a\.budget\.weekly: unknown key"):
        parse_platform(base % "{monthly: 5, weekly: 1}")
    parsed = parse_platform(base % "{monthly: 20000}")
    assert parsed.tenants["team-a"].budget is not None
    assert parsed.tenants["team-a"].budget.monthly == 20000.0
