"""The dispatcher's Prometheus gauges follow the queue: gone tenants and resources vanish,
and the fairness gauges show each tenant's share against its entitlement."""

from __future__ import annotations

import pytest
import redis

from fairshare.metrics import DispatcherMetrics
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest, QueueSnapshot, TenantStatus
from tests.fairshare.simkit import make_config
from tests.fairshare.tickets import pod_uid


def _status(tenant: str, queued: int, used: dict[str, int]) -> TenantStatus:
    return TenantStatus(
        tenant=tenant, weight=2.0, nominal={"gpu": 2}, nominal_slices=14,
        borrow_limit_slices=7, inference_reserve_slices=0, used=used,
        used_slices=sum(used.values()) * 7, borrowed_slices=7, training_slices=7,
        inference_slices=0, running_by_key=used, running_inference_by_key={},
        queued={"training": queued}, weighted_share=3.5,
    )


def _snapshot(*statuses: TenantStatus) -> QueueSnapshot:
    return QueueSnapshot(statuses, {s.tenant: 14 for s in statuses}, {"gpu": 8},
                         {}, {s.tenant: {"gpu": 2} for s in statuses}, {})


def _lines(metrics: DispatcherMetrics, name: str) -> list[str]:
    return [line for line in metrics.render().decode().splitlines() if line.startswith(name)]


def test_gauges_track_the_latest_snapshot_only() -> None:
    metrics = DispatcherMetrics()
    metrics.observe_tenants(_snapshot(_status("team-a", 1, {"gpu": 1}),
                                      _status("team-b", 2, {"gpu": 2, "mig-1g.5gb": 1})))
    assert 'fairgate_tenant_resource_usage{resource="mig-1g.5gb",tenant="team-b"} 1.0' in \
        _lines(metrics, "fairgate_tenant_resource_usage")
    assert 'fairgate_tenant_borrowed{tenant="team-a"} 1.0' in \
        _lines(metrics, "fairgate_tenant_borrowed")
    metrics.observe_tenants(_snapshot(_status("team-b", 3, {"gpu": 2})))
    assert _lines(metrics, "fairgate_pending_workloads{") == [
        'fairgate_pending_workloads{class="inference",tenant="team-b"} 0.0',
        'fairgate_pending_workloads{class="training",tenant="team-b"} 3.0',
    ]
    assert _lines(metrics, "fairgate_tenant_resource_usage{") == [
        'fairgate_tenant_resource_usage{resource="gpu",tenant="team-b"} 2.0'
    ]
    assert _lines(metrics, "fairgate_tenant_weighted_share{") == [
        'fairgate_tenant_weighted_share{tenant="team-b"} 1.0'  # 2 GPUs / weight 2
    ]
    assert _lines(metrics, "fairgate_tenant_fair_share{") == [
        'fairgate_tenant_fair_share{tenant="team-b"} 3.0'  # alone; demand 4 > quota 2 + 1
    ]


def test_capacity_gauge_drops_resources_that_left() -> None:
    metrics = DispatcherMetrics()
    metrics.observe_capacity({"gpu": 4, "mig-1g.5gb": 7})
    metrics.observe_capacity({"gpu": 5})
    assert _lines(metrics, "fairgate_cluster_capacity{") == [
        'fairgate_cluster_capacity{resource="gpu"} 5.0'
    ]


def _gauge(metrics: DispatcherMetrics, name: str, tenant: str | None = None) -> float:
    labels = {"tenant": tenant} if tenant is not None else {}
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name} {labels} not exported"
    return value


def test_fairness_gauges_from_a_real_queue(redis_client: redis.Redis) -> None:
    """8 GPUs, weights 1:3, quotas wide open. team-a runs 6 GPUs, team-b runs 2 and has
    4 more queued, team-c (weight 4) has no demand: the 8 GPUs are water-filled 1:3
    between a and b (2 and 6), c is entitled to nothing; Jain's index is that of
    used / entitlement = 6/2 and 2/6."""
    queue = FairQueue(redis_client)
    queue.sync_config(make_config({
        "team-a": {"weight": 1, "nominal": {"gpu": 8}},
        "team-b": {"weight": 3, "nominal": {"gpu": 8}},
        "team-c": {"weight": 4, "nominal": {"gpu": 8}},
    }), {"gpu": 8})
    def admit(ticket: str, tenant: str, at: float) -> str:
        """Admit a pod, and let the dispatcher see it (its queued demand counts then)."""
        outcome = queue.admit(PodRequest(ticket=ticket, tenant=tenant, namespace=f"{tenant}-ns",
                                         name=ticket, pod_class="training", demand={"gpu": 1},
                                         submitted_at=at), at).outcome
        assert queue.confirm(ticket, pod_uid(ticket), f"{tenant}-ns", ticket) == "confirmed"
        return outcome
    assert [admit(f"a{i}", "team-a", i) for i in range(6)] == ["reserved"] * 6
    assert [admit(f"b{i}", "team-b", 10 + i) for i in range(6)] == ["reserved"] * 2 + \
        ["queued"] * 4
    metrics = DispatcherMetrics()
    metrics.observe_tenants(queue.snapshot())

    assert _gauge(metrics, "fairgate_tenant_weighted_share", "team-a") == 6.0
    assert _gauge(metrics, "fairgate_tenant_weighted_share", "team-b") == pytest.approx(2 / 3)
    assert _gauge(metrics, "fairgate_tenant_weighted_share", "team-c") == 0.0
    assert _gauge(metrics, "fairgate_tenant_fair_share", "team-a") == pytest.approx(2.0)
    assert _gauge(metrics, "fairgate_tenant_fair_share", "team-b") == pytest.approx(6.0)
    assert _gauge(metrics, "fairgate_tenant_fair_share", "team-c") == 0.0
    ratios = (6 / 2, 2 / 6)
    jain = sum(ratios) ** 2 / (2 * sum(r * r for r in ratios))
    assert _gauge(metrics, "fairgate_fairness_jain_index") == pytest.approx(jain)

    for i in range(4):  # a's pods end, b's queued ones run: b holds 6, a 2
        assert queue.release(f"a{i}", pod_uid(f"a{i}"))
    assert len(queue.dispatch(100.0, limit=10)) == 4
    metrics.observe_tenants(queue.snapshot())
    assert _gauge(metrics, "fairgate_tenant_fair_share", "team-a") == pytest.approx(2.0)
    assert _gauge(metrics, "fairgate_tenant_fair_share", "team-b") == pytest.approx(6.0)
    assert _gauge(metrics, "fairgate_fairness_jain_index") == pytest.approx(1.0)
