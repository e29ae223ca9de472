"""The dispatcher's Prometheus gauges follow the queue: gone tenants and resources vanish."""

from __future__ import annotations

from fairshare.metrics import DispatcherMetrics
from fairshare.model import TenantStatus


def _status(tenant: str, queued: int, used: dict[str, int]) -> TenantStatus:
    return TenantStatus(
        tenant=tenant, weight=2.0, nominal={"gpu": 2}, nominal_slices=14,
        borrow_limit_slices=7, inference_reserve_slices=0, used=used,
        used_slices=sum(used.values()) * 7, borrowed_slices=7, training_slices=7,
        inference_slices=0, queued={"training": queued}, weighted_share=3.5,
    )


def _lines(metrics: DispatcherMetrics, name: str) -> list[str]:
    return [line for line in metrics.render().decode().splitlines() if line.startswith(name)]


def test_gauges_track_the_latest_snapshot_only() -> None:
    metrics = DispatcherMetrics()
    metrics.observe_tenants([_status("team-a", 1, {"gpu": 1}),
                             _status("team-b", 2, {"gpu": 2, "mig-1g.5gb": 1})])
    assert 'fairgate_tenant_resource_usage{resource="mig-1g.5gb",tenant="team-b"} 1.0' in \
        _lines(metrics, "fairgate_tenant_resource_usage")
    assert 'fairgate_tenant_borrowed{tenant="team-a"} 1.0' in \
        _lines(metrics, "fairgate_tenant_borrowed")
    metrics.observe_tenants([_status("team-b", 3, {"gpu": 2})])
    assert _lines(metrics, "fairgate_pending_workloads{") == [
        'fairgate_pending_workloads{class="inference",tenant="team-b"} 0.0',
        'fairgate_pending_workloads{class="training",tenant="team-b"} 3.0',
    ]
    assert _lines(metrics, "fairgate_tenant_resource_usage{") == [
        'fairgate_tenant_resource_usage{resource="gpu",tenant="team-b"} 2.0'
    ]
    assert _lines(metrics, "fairgate_tenant_weighted_share{") == [
        'fairgate_tenant_weighted_share{tenant="team-b"} 3.5'
    ]


def test_capacity_gauge_drops_resources_that_left() -> None:
    metrics = DispatcherMetrics()
    metrics.observe_capacity({"gpu": 4, "mig-1g.5gb": 7})
    metrics.observe_capacity({"gpu": 5})
    assert _lines(metrics, "fairgate_cluster_capacity{") == [
        'fairgate_cluster_capacity{resource="gpu"} 5.0'
    ]
