"""The contention traces of staggered joins, bursts, idle and return, big pods and
the two head-start situations (examples/contention/5-10) meet their expected
outcomes over the window in which every tenant is active: each tenant's GPU-time
within 5% of its integrated entitlement (``fairgate simulate --window``), Jain's index
of GPU-time / entitlement >= 0.99, utilisation while pods wait >= 0.95; through the
real queue, dispatcher and simulated cluster. Each trace keeps every tenant
backlogged throughout the window whatever the order, and each test checks that first.

Traces 9 and 10 are the two situations the order by current usage got wrong (a tie
between a tenant whose pod just ended and one that has waited went to the older head
pod, and what a tenant took of an idle cluster was never repaid); virtual time meets
them. Trace 8 is shared by weight among what runs, but draining the cluster for each
whole-cluster pod leaves GPUs idle, so each tenant's GPU-time is short of an entitlement
that assumes every GPU is used (strict xfail: it needs backfill)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairshare.sim.simulate import Window, WindowReport, run_simulation
from fairshare.sim.trace import load_trace

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "contention"

DRAINS = ("draining the cluster for each whole-cluster pod leaves GPUs idle (utilisation "
          "0.89): every tenant gets 0.86-0.91 of its entitlement; it needs backfill")


def window_of(name: str, start: float, redis_url: str) -> WindowReport:
    report = run_simulation(load_trace(EXAMPLES / name), redis_url, window=Window(start))
    window = report.window
    assert window is not None
    length = window.end - window.start
    for tenant, measured in window.tenants.items():  # the trace's precondition
        assert measured.backlogged_seconds == pytest.approx(length), tenant
    return window


def assert_fair(window: WindowReport, utilization: bool = True) -> None:
    for tenant, measured in window.tenants.items():
        ratio = measured.of_entitlement
        assert ratio is not None and abs(ratio - 1) <= 0.05, (tenant, ratio)
    assert window.jain_index >= 0.99
    if utilization:
        assert window.utilization >= 0.95


@pytest.mark.slow
def test_staggered_joins_share_by_weight_once_all_are_active(redis_url: str) -> None:
    assert_fair(window_of("5-staggered-join.yaml", 3600, redis_url))


@pytest.mark.slow
def test_a_burst_into_a_busy_cluster_gets_its_share(redis_url: str) -> None:
    assert_fair(window_of("6-burst-into-busy.yaml", 1800, redis_url))


@pytest.mark.slow
def test_a_tenant_back_from_idle_gets_its_share_and_no_credit(redis_url: str) -> None:
    assert_fair(window_of("7-idle-return.yaml", 7200, redis_url))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=DRAINS)
def test_whole_cluster_pods_run_half_of_the_time_beside_small_ones(redis_url: str) -> None:
    # draining the cluster for each whole-cluster pod costs utilisation: not a target here
    assert_fair(window_of("8-big-pods.yaml", 0, redis_url), utilization=False)


@pytest.mark.slow
def test_whole_cluster_pods_beside_small_ones_share_what_runs_by_weight(
    redis_url: str,
) -> None:
    window = window_of("8-big-pods.yaml", 0, redis_url)
    assert window.jain_index >= 0.99
    ran = sum(t.gpu_seconds for t in window.tenants.values())
    for tenant, weight in (("team-a", 0.5), ("team-b", 0.25), ("team-c", 0.25)):
        assert window.tenants[tenant].gpu_seconds / ran == pytest.approx(weight, rel=0.05)


@pytest.mark.slow
def test_whole_cluster_pods_alternate_despite_a_30_s_head_start(redis_url: str) -> None:
    assert_fair(window_of("9-whole-cluster-pods-30s-apart.yaml", 30, redis_url))


@pytest.mark.slow
def test_the_first_of_a_simultaneous_burst_repays_the_idle_cluster(redis_url: str) -> None:
    assert_fair(window_of("10-weights-1-2-3-burst-at-once.yaml", 0, redis_url))
