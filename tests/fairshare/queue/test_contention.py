"""The contention traces (examples/contention/) meet their expected
outcomes, through the real queue, dispatcher and simulated cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairshare.sim.simulate import SimulationReport, run_simulation
from fairshare.sim.trace import load_trace

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "contention"


def simulate(name: str, redis_url: str) -> SimulationReport:
    return run_simulation(load_trace(EXAMPLES / name), redis_url)


def shares(report: SimulationReport) -> dict[str, float]:
    return {name: t.share for name, t in report.tenants.items()}


def assert_near(got: float, want: float, relative: float) -> None:
    assert abs(got - want) <= relative * want, (got, want)


@pytest.mark.slow
def test_equal_weight_tenants_with_whole_cluster_pods_alternate(redis_url: str) -> None:
    report = simulate("1-equal-weights-8gpu-pods.yaml", redis_url)
    for share in shares(report).values():
        assert_near(share, 0.5, 0.05)
    admitted = [t.admitted for t in report.tenants.values()]
    assert min(admitted) >= 6 and max(admitted) - min(admitted) <= 1
    assert report.jain_index >= 0.99
    assert report.utilization >= 0.99


@pytest.mark.slow
def test_the_one_gpu_tenant_gets_its_half(redis_url: str) -> None:
    report = simulate("2-big-and-small-pods.yaml", redis_url)
    for share in shares(report).values():
        assert_near(share, 0.5, 0.05)
    assert report.jain_index >= 0.99
    assert report.utilization >= 0.95


@pytest.mark.slow
def test_three_pod_sizes_share_by_thirds_with_usage_history(redis_url: str) -> None:
    report = simulate("3-three-pod-sizes.yaml", redis_url)
    for share in shares(report).values():
        assert_near(share, 1 / 3, 0.15)
    assert report.tenants["team-c"].share >= 0.28  # the 1-GPU tenant (was 0.012)
    assert report.jain_index >= 0.98
    assert report.utilization >= 0.90


@pytest.mark.slow
def test_weights_1_2_3_hold_with_uneven_durations(redis_url: str) -> None:
    report = simulate("4-weights-1-2-3-uneven-durations.yaml", redis_url)
    got = shares(report)
    for name, weight in (("team-a", 1), ("team-b", 2), ("team-c", 3)):
        assert_near(got[name], weight / 6, 0.05)
    assert report.jain_index >= 0.99
    assert report.utilization >= 0.95
