"""The dispatcher's usage records (start, preempt, capacity) and cost metrics, on the
real queue in a real redis-server with the simulated cluster's scheduler preempting;
then the bill computed from exactly that audit stream."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest
import redis

from audit import PREEMPT, RELEASE, START, AuditLog
from cost.billing import bill
from fairshare.dispatcher import Dispatcher
from tenants.models import FairgateConfig, PricingSpec
from tests.fairshare.simkit import make_rig

TENANTS = {
    "team-a": {"weight": 1, "nominal": {"gpu": 1}, "borrowLimit": {"gpuEquivalents": 1}},
    "team-b": {"weight": 1, "nominal": {"gpu": 1}},
}
PRICING = PricingSpec.model_validate({"currency": "EUR", "gpuHour": {"default": 3.6}})


def _sample(rig_metrics: bytes, name: str, **labels: str) -> float:
    text = rig_metrics.decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in:\n{text}")


def test_a_preempted_borrower_is_recorded_with_its_preemptor_and_lost_work(
    redis_url: str,
) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = make_rig(redis_url, TENANTS, {"gpu": 2}, audit=audit)
    priced = FairgateConfig(platform=rig.config.platform.model_copy(update={"pricing": PRICING}),
                            quotas=rig.config.quotas)
    rig.dispatcher.config = lambda: priced
    rig.pod("nominal", duration=1000)
    borrower = rig.pod("borrower", duration=1000)
    rig.settle()
    assert rig.cluster.history[borrower.uid].band == "borrowed"
    rig.at(1_360.0)  # the borrower has run 360 s
    rig.pod("infer", tenant="team-b", pod_class="inference", duration=100)
    rig.settle()
    assert rig.cluster.history[borrower.uid].preempted

    records = [e.record for e in audit.entries() if e.record is not None]
    mine = [(r.decision, r.name) for r in records if r.uid == borrower.ticket]
    assert mine == [("start", "borrower"), ("preempt", "borrower"), ("release", "borrower")]
    preempt = next(r for r in records if r.decision == PREEMPT)
    assert preempt.diff == {"preemption": {"band": "borrowed", "ranSeconds": 360.0,
                                           "preemptor": "team-b-ns/infer"}}
    assert "preempted by team-b-ns/infer after 360.0s" in preempt.reason
    assert [r.decision for r in records if r.name == "nominal"] == [START]

    rig.dispatcher.step()  # a status pass meters the pods still running
    metrics = rig.dispatcher.metrics.render()
    assert _sample(metrics, "fairgate_preemptions_total", tenant="team-a") == 1
    assert _sample(metrics, "fairgate_preempted_gpu_seconds_total", tenant="team-a") == 360
    assert _sample(metrics, "fairgate_tenant_gpu_seconds_total", tenant="team-a",
                   band="borrowed", resource="gpu") == 360
    assert _sample(metrics, "fairgate_tenant_gpu_seconds_total", tenant="team-a",
                   band="training", resource="gpu") == 360
    # 720 GPU-seconds at 3.60 EUR per GPU-hour
    assert _sample(metrics, "fairgate_tenant_cost_total", tenant="team-a",
                   currency="EUR") == pytest.approx(0.72)

    rig.at(1_460.0)  # the inference pod ends after its 100 s
    records = [e.record for e in audit.entries() if e.record is not None]
    assert any(r.decision == RELEASE and r.name == "infer" for r in records)
    since, until = (datetime.fromtimestamp(t, UTC) for t in (1_000.0, 1_460.0))
    result = bill(records, since, until, PRICING)
    rows = {(r.tenant, r.pod_class): r for r in result.rows}
    a, b = rows[("team-a", "training")], rows[("team-b", "inference")]
    # nominal: 460 s; borrower: 360 s; its replacement waits while team-b holds a GPU
    assert a.gpu_hours * 3600 == pytest.approx(460 + 360)
    assert a.borrowed_gpu_hours * 3600 == pytest.approx(360)
    assert a.preempted_pods == 1 and a.preempted_gpu_hours * 3600 == pytest.approx(360)
    assert b.gpu_hours * 3600 == pytest.approx(100)
    assert result.currency == "EUR"
    assert result.totals().cost == pytest.approx((460 + 360 + 100) / 3600 * 3.6)
    # 2 GPUs for 460 s, all of it used: nothing idle
    assert result.capacity_gpu_hours is not None and result.idle_gpu_hours is not None
    assert result.capacity_gpu_hours * 3600 == pytest.approx(2 * 460)
    assert result.idle_gpu_hours == pytest.approx(0)


def test_a_restarted_dispatcher_records_start_again_and_billing_keeps_the_first(
    redis_url: str,
) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = make_rig(redis_url, TENANTS, {"gpu": 2}, audit=audit)
    rig.pod("long", duration=1000)
    rig.settle()
    rig.clock.advance_to(1_500.0)
    rig.dispatcher = Dispatcher(rig.queue, rig.cluster, lambda: rig.config, clock=rig.clock,
                                audit=audit)  # a restart: it knows nothing
    rig.settle()
    rig.at(2_000.0)
    records = [e.record for e in audit.entries() if e.record is not None]
    assert [(r.decision, r.time[11:19]) for r in records if r.name == "long"] == [
        ("start", "00:16:40"), ("start", "00:25:00"), ("release", "00:33:20")]
    (row,) = bill(records, datetime.fromtimestamp(0, UTC),
                  datetime.fromtimestamp(3_000, UTC)).rows
    assert row.gpu_hours * 3600 == pytest.approx(1000)
    assert row.cost == 0  # no pricing anywhere
