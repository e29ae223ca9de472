"""The accounting engine on synthetic audit logs with known intervals: exact figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from audit.chain import AuditRecord, format_time
from audit.usage import capacity_detail, preempt_detail, pricing_detail, start_detail
from cost.billing import bill
from tenants.models import PricingSpec

T0 = datetime(2026, 3, 1, tzinfo=UTC)  # the window starts here
A100 = "NVIDIA-A100-SXM4-80GB"
PRICING = PricingSpec.model_validate({"currency": "USD",
                                      "gpuHour": {"default": 2.0, A100: 3.5}})


def at(hours: float) -> str:
    return format_time(T0 + timedelta(hours=hours))


def rec(decision: str, hours: float, ticket: str = "", **fields: Any) -> AuditRecord:
    return AuditRecord(decision=decision, time=at(hours), uid=ticket, **fields)


def run(ticket: str, tenant: str, pod_class: str, demand: str, start: float,
        end: float | None, band: str = "training", product: str | None = None,
        reason: str = "pod Succeeded") -> list[AuditRecord]:
    """A pod dispatched just before it starts, running from ``start`` to ``end``."""
    common = {"tenant": tenant, "pod_class": pod_class, "demand": demand,
              "namespace": f"{tenant}-dev", "name": ticket}
    out = [rec("dispatch", start - 0.01, ticket, reason=f"released as {band} after 1.0s",
               **common),
           rec("start", start, ticket, diff=start_detail(band, "n1", product), **common)]
    if end is not None:
        out.append(rec("release", end, ticket, reason=reason, **common))
    return out


def window(hours: float) -> tuple[datetime, datetime]:
    return T0, T0 + timedelta(hours=hours)


def test_whole_gpus_are_billed_per_product_and_default() -> None:
    records = [*run("a1", "team-a", "training", "gpu=2", 1, 3, product=A100),
               *run("b1", "team-b", "inference", "gpu=1", 2, 6)]
    result = bill(records, *window(10), PRICING)
    rows = {(r.tenant, r.pod_class): r for r in result.rows}
    a = rows[("team-a", "training")]
    assert a.gpu_hours == 4.0 and a.cost == pytest.approx(4 * 3.5)
    b = rows[("team-b", "inference")]
    assert b.gpu_hours == 4.0 and b.cost == pytest.approx(4 * 2.0)
    assert result.totals().gpu_hours == 8.0
    assert result.totals().cost == pytest.approx(22.0)
    assert result.currency == "USD"


def test_pods_spanning_the_window_edges_are_clipped_exactly() -> None:
    since, until = T0 + timedelta(hours=2), T0 + timedelta(hours=5)
    records = [*run("early", "t", "training", "gpu=1", 1, 3),     # 1 h inside
               *run("late", "t", "training", "gpu=1", 4.5, 9),    # 0.5 h inside
               *run("across", "t", "training", "gpu=1", 0, 10),   # 3 h inside
               *run("before", "t", "training", "gpu=1", 0, 1.5),  # outside
               *run("open", "t", "training", "gpu=1", 4, None)]   # running: 1 h
    (row,) = bill(records, since, until, PRICING).rows
    assert row.gpu_hours == pytest.approx(1 + 0.5 + 3 + 1, abs=1e-12)
    assert row.cost == pytest.approx(5.5 * 2.0)


def test_mig_slices_cost_slices_over_seven_of_their_parent() -> None:
    records = run("m", "t", "inference", "mig-1g.10gb=2,mig-3g.40gb=1", 0, 7, product=A100)
    (row,) = bill(records, *window(7), PRICING).rows
    # 2 x 1 slice + 3 slices = 5 slices for 7 h = 5 GPU-eq hours
    assert row.gpu_hours == pytest.approx(5.0)
    assert row.cost == pytest.approx(5.0 * 3.5)
    resources = {u.resource: u.gpu_hours for u in row.usage.values()}
    assert resources == pytest.approx({"mig-1g.10gb": 2.0, "mig-3g.40gb": 3.0})


def test_price_change_applies_from_its_audit_time_on() -> None:
    change = rec("quota-change", 3, "req", name="fairgate-platform",
                 namespace="fairgate-system", operation="UPDATE",
                 diff={"pricing.gpuHour.default": {"before": 2.0, "after": 4.0}})
    later = rec("quota-change", 20, "req2", name="fairgate-platform",
                namespace="fairgate-system", operation="UPDATE",
                diff={"pricing.gpuHour.default": {"before": 4.0, "after": 1.0}})
    records = [*run("p", "t", "training", "gpu=1", 1, 5), change, later]
    # the current config says 1.0 (the last change): before 3 h the log says 2.0
    current = PricingSpec.model_validate({"gpuHour": {"default": 1.0}})
    (row,) = bill(records, *window(10), current).rows
    assert row.cost == pytest.approx(2 * 2.0 + 2 * 4.0)


def test_borrowed_band_and_preemption_with_lost_work() -> None:
    records = run("b", "team-a", "training", "gpu=4", 0, 2, band="borrowed",
                  reason="pod Failed")
    records.insert(2, rec("preempt", 2, "b", tenant="team-a", pod_class="training",
                          demand="gpu=4",
                          diff=preempt_detail("borrowed", 7200.0, "team-b-dev/infer-0")))
    records += run("n", "team-a", "training", "gpu=1", 0, 1)
    (row,) = bill(records, *window(3), PRICING).rows
    assert row.gpu_hours == pytest.approx(9.0)
    assert row.borrowed_gpu_hours == pytest.approx(8.0)
    assert row.preempted_pods == 1
    assert row.preempted_gpu_hours == pytest.approx(8.0)


def test_pods_that_never_ran_are_not_billed_and_unobserved_starts_fall_back() -> None:
    common = {"tenant": "t", "pod_class": "training", "demand": "gpu=1"}
    records = [
        rec("dispatch", 1, "never", reason="released as training after 2.0s", **common),
        rec("release", 2, "never", reason="pod deleted before it ran", **common),
        # ran and ended between two looks: billed from its gate lift
        rec("dispatch", 1, "quick", reason="released as training after 2.0s", **common),
        rec("release", 1.5, "quick", reason="pod Succeeded", **common),
        # fast path: billed from admission
        rec("admit", 2, "fast", reason="reserved as borrowed", **common),
        rec("release", 4, "fast", reason="pod Succeeded", **common),
        # lifted, still pending (never seen running, not released): nothing yet
        rec("dispatch", 1, "pending", reason="released as training after 2.0s", **common),
    ]
    (row,) = bill(records, *window(5), PRICING).rows
    assert row.gpu_hours == pytest.approx(0.5 + 2.0)
    assert row.borrowed_gpu_hours == pytest.approx(2.0)


def test_a_repeated_start_record_does_not_move_the_start() -> None:
    records = run("p", "t", "training", "gpu=1", 1, 4)
    records.insert(2, rec("start", 3, "p", tenant="t", pod_class="training", demand="gpu=1",
                          diff=start_detail("training", "n1", None)))
    (row,) = bill(records, *window(5), PRICING).rows
    assert row.gpu_hours == pytest.approx(3.0)


def test_idle_capacity_and_proportional_sharing() -> None:
    records = [rec("capacity", 0, diff=capacity_detail(None, {"gpu": 4})),
               *run("a", "team-a", "training", "gpu=1", 0, 10),
               *run("b", "team-b", "training", "gpu=3", 0, 5),
               rec("capacity", 5, diff=capacity_detail({"gpu": 4}, {"gpu": 2}))]
    result = bill(records, *window(10), PRICING, share_idle=True)
    assert result.capacity_gpu_hours == pytest.approx(4 * 5 + 2 * 5)
    assert result.idle_gpu_hours == pytest.approx(30 - 10 - 15)
    assert result.idle_cost == pytest.approx(5 * 2.0)
    rows = {r.tenant: r for r in result.rows}
    assert rows["team-a"].idle_gpu_hours == pytest.approx(5 * 10 / 25)
    assert rows["team-b"].idle_cost == pytest.approx(10.0 * 15 / 25)


def test_idle_is_unknown_without_capacity_records() -> None:
    result = bill(run("a", "t", "training", "gpu=1", 0, 1), *window(2), PRICING)
    assert result.idle_gpu_hours is None and result.capacity_gpu_hours is None


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window is empty"):
        bill([], T0, T0)


def test_the_dispatchers_pricing_record_applies_from_its_time_and_states_no_past() -> None:
    records = [*run("p", "t", "training", "gpu=1", 0, 4),
               rec("pricing", 1, diff=pricing_detail(None, {"pricing.gpuHour.default": 6.0})),
               rec("pricing", 3, diff=pricing_detail({"pricing.gpuHour.default": 6.0},
                                                     {"pricing.gpuHour.default": 5.0}))]
    (unpriced,) = bill(records, *window(4)).rows
    assert unpriced.cost == pytest.approx(0 + 2 * 6.0 + 1 * 5.0)
    (priced,) = bill(records, *window(4), PRICING).rows  # the config's default: 2.0
    assert priced.cost == pytest.approx(1 * 2.0 + 2 * 6.0 + 1 * 5.0)


def test_records_slightly_out_of_time_order_are_billed_by_their_times() -> None:
    """Writers' clocks interleave: a record can follow one stamped a little later."""
    later = rec("pricing", 2, diff=pricing_detail({"pricing.gpuHour.default": 1.0},
                                                  {"pricing.gpuHour.default": 3.0}))
    earlier = rec("pricing", 1, diff=pricing_detail(None, {"pricing.gpuHour.default": 1.0}))
    records = [rec("capacity", 1, diff=capacity_detail(None, {"gpu": 2})),
               rec("capacity", 0, diff=capacity_detail(None, {"gpu": 4})),
               *run("p", "t", "training", "gpu=1", 0, 3), later, earlier]
    result = bill(records, *window(3))
    (row,) = result.rows
    assert row.cost == pytest.approx(0 + 1 * 1.0 + 1 * 3.0)
    assert result.capacity_gpu_hours == pytest.approx(4 * 1 + 2 * 2)


def test_placement_classes_bill_as_their_resource() -> None:
    """The dispatcher's records name demand and capacity by placement class (``gpu@pool``,
    ``mig-1g.5gb#single``): each bills as its resource, and a pool's capacity is capacity."""
    records = [rec("capacity", 0, diff=capacity_detail(
                   None, {"gpu": 2, "gpu@a100": 4, "mig-1g.5gb#single": 56})),
               *run("p", "team-p", "training", "gpu@a100=2", 0, 2, product=A100),
               *run("s", "team-s", "inference", "mig-1g.5gb#single=7", 0, 1),
               *run("w", "team-w", "training", "gpu=1", 0, 1)]
    result = bill(records, *window(2), PRICING)
    rows = {r.tenant: r for r in result.rows}
    assert rows["team-p"].gpu_hours == pytest.approx(4.0)
    assert rows["team-p"].cost == pytest.approx(4 * 3.5)
    assert {u.resource for u in rows["team-s"].usage.values()} == {"mig-1g.5gb"}
    assert rows["team-s"].gpu_hours == pytest.approx(1.0)
    assert rows["team-w"].gpu_hours == pytest.approx(1.0)
    assert result.capacity_gpu_hours == pytest.approx((2 + 4 + 8) * 2)
    assert result.idle_gpu_hours == pytest.approx(28 - 6)
