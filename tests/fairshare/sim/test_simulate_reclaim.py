"""The simulator plays reclaim (``fairShare.reclaim``) with the real dispatcher's rule,
and declared run times (``activeDeadlineSeconds``), on the real queue in a real Redis.

The trace: 8 GPUs; team-a fills them at t=0 with eight 1-GPU training pods of 4 hours;
team-b's 4-GPU pod arrives at 1 h. With reclaim (after 5m, minRuntime 30m) team-b's head
is owed 4 GPUs; team-a, at 8 against an entitlement of 4, may lose 4 preemptible pods."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fairshare.sim.simulate import (
    Simulation,
    SimulationReport,
    run_simulation,
    simulate_command,
)
from fairshare.sim.trace import load_trace, parse_trace
from tenants.schema import ConfigError

RECLAIM = {"after": "5m", "minRuntime": "30m", "perHour": 12}


def trace(reclaim: dict[str, Any] | None = RECLAIM, preemptible: bool = True,
          **more: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "capacity": {"gpu": 8},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 8}},
                    "team-b": {"weight": 1, "nominal": {"gpu": 8}}},
        "arrivals": [
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 14_400, "count": 8, "preemptible": preemptible},
            {"at": 3600, "tenant": "team-b", "class": "training", "demand": {"gpu": 4},
             "duration": 600},
        ],
        "horizon": 7200,
        **more,
    }
    if reclaim is not None:
        data["fairShare"] = {"reclaim": reclaim}
    return data


def simulate(data: dict[str, Any], redis_url: str) -> SimulationReport:
    return run_simulation(parse_trace(data), redis_url)


def test_reclaim_frees_what_the_owed_head_lacks_and_no_more(redis_url: str) -> None:
    """At the first check after team-b's head waited 5 minutes (3,900 s) four of team-a's
    pods, 3,900 s into their run, are reclaimed; team-b runs at once; their replacements
    (whole duration again) wait for team-b's pod to end."""
    report = simulate(trace(), redis_url)
    assert report.to_json()["reclaim"] == {
        "pods": 4, "gpu_hours_lost": round(4 * 3900 / 3600, 4), "min_run_seconds": 3900.0}
    b = report.tenants["team-b"]
    assert (b.admitted, b.waiting) == (1, 0)
    assert b.gpu_hours == pytest.approx(4 * 600 / 3600)
    a = report.tenants["team-a"]
    assert (a.admitted, a.waiting) == (8, 0)  # each pod once: 4 kept + 4 replacements
    assert report.preemptions == 0  # reclaim is not the scheduler's preemption
    assert report.quota_violations == []


@pytest.mark.parametrize(("reclaim", "preemptible"), [
    (None, True),  # reclaim off: no training pod is evicted for training
    (RECLAIM, False),  # nothing labelled preemptible
    ({**RECLAIM, "minRuntime": "3h"}, True),  # none has run minRuntime by the horizon
    ({**RECLAIM, "perHour": 3}, True),  # four pods needed, three allowed an hour
])
def test_without_a_victim_the_owed_head_waits_for_the_drain(
        redis_url: str, reclaim: dict[str, Any] | None, preemptible: bool) -> None:
    report = simulate(trace(reclaim, preemptible), redis_url)
    assert report.to_json()["reclaim"] == {"pods": 0, "gpu_hours_lost": 0.0,
                                           "min_run_seconds": 0.0}
    b = report.tenants["team-b"]
    assert (b.admitted, b.waiting) == (0, 1)
    assert report.tenants["team-a"].gpu_hours == pytest.approx(16.0)


def test_reclaim_waits_for_min_runtime(redis_url: str) -> None:
    """With minRuntime 70m, team-a's pods become victims at 4,200 s: no pod is reclaimed
    before it has run that long."""
    report = simulate(trace({**RECLAIM, "minRuntime": "70m"}), redis_url)
    assert report.reclaims == 4
    assert report.reclaim_min_run >= 70 * 60


def test_a_pod_runs_at_most_its_declared_run_time(redis_url: str) -> None:
    """activeDeadlineSeconds 1,800 on 4-hour pods: each is stopped at 30 minutes."""
    data = trace(None)
    data["arrivals"][0]["activeDeadlineSeconds"] = 1800
    report = simulate(data, redis_url)
    assert report.tenants["team-a"].gpu_hours == pytest.approx(8 * 0.5)
    assert report.tenants["team-b"].gpu_hours == pytest.approx(4 * 600 / 3600)


def test_the_json_reports_reclaim(redis_url: str, tmp_path: Any) -> None:
    path = tmp_path / "reclaim.yaml"
    path.write_text(yaml.safe_dump(trace()))
    out = io.StringIO()
    assert simulate_command(path, True, redis_url, out=out) == 0
    assert json.loads(out.getvalue())["reclaim"] == {
        "pods": 4, "gpu_hours_lost": round(4 * 3900 / 3600, 4), "min_run_seconds": 3900.0}


@pytest.mark.parametrize(("change", "fragment"), [
    ({"preemptible": "maybe"}, "arrivals.0.preemptible"),
    ({"activeDeadlineSeconds": 0}, "arrivals.0.activeDeadlineSeconds"),
])
def test_bad_arrival_keys_name_the_field(change: dict[str, Any], fragment: str) -> None:
    data = trace()
    data["arrivals"][0].update(change)
    with pytest.raises(ConfigError) as caught:
        parse_trace(data)
    assert fragment in str(caught.value)


def test_what_reclaim_frees_goes_to_the_owed_heads(redis_url: str) -> None:
    """examples/reclaim.yaml: team-b's two 4-GPU jobs (at 1 h and 1 h + 60 s) each get
    the 4 GPUs reclaimed for them once they waited 5 minutes: 8 pods in all. The evicted
    pods' replacements never take back what was freed for team-b (no handover of the
    block to the tenant that lost it), so nothing more is evicted."""
    trace = load_trace(Path(__file__).resolve().parents[3] / "examples" / "reclaim.yaml")
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:test:reclaim:")
    report = sim.run()
    assert report.reclaims == 8
    starts = sorted(h.started - h.created for h in sim.cluster.history.values()
                    if h.spec.tenant == "team-b" and h.started is not None)
    assert starts == [300.0, 300.0]  # each at its first check after waiting 5 minutes
    assert report.tenants["team-b"].gpu_hours == pytest.approx(8.0)


def test_two_backlogged_tenants_reclaim_nothing_from_each_other(redis_url: str) -> None:
    """16 GPUs, two tenants of weight 1 (each may use them all) backlogged from the
    start (creates alternate, 8 each run at once), preemptible pods of 90 s (team-a) and
    120 s (team-b). As their pods end out of step the queue, sharing GPU-time, lets one
    run above its share for a while (up to 12 against 4), and the other's head has
    waited far longer than `after`: reclaiming what the queue just gave would have it
    given back at the next turn (9 to 16 pods reclaimed in 10 minutes before the rule
    passed over a tenant the queue released a pod to while the head waited). None is
    reclaimed; GPU-time stays shared."""
    data = trace(
        {"after": "5s", "minRuntime": "30s", "perHour": 720}, capacity={"gpu": 16},
        tenants={name: {"weight": 1, "nominal": {"gpu": 16}} for name in ("team-a", "team-b")},
        arrivals=[{"at": at, "tenant": tenant, "class": "training", "demand": {"gpu": 1},
                   "duration": duration, "count": count, "every": 0.2, "preemptible": True}
                  for at, tenant, duration, count in ((0, "team-a", 90, 120),
                                                      (0.1, "team-b", 120, 100))],
        horizon=600)
    report = simulate(data, redis_url)
    assert report.reclaims == 0
    assert report.tenants["team-a"].share == pytest.approx(0.5, abs=0.01)


def test_the_table_says_what_was_reclaimed(redis_url: str, tmp_path: Any) -> None:
    path = tmp_path / "reclaim.yaml"
    path.write_text(yaml.safe_dump(trace()))
    out = io.StringIO()
    assert simulate_command(path, False, redis_url, out=out) == 0
    assert "reclaimed pods (GPU-h they had run; shortest run)" in out.getvalue()
    assert "4 (4.33; 3900s)" in out.getvalue()
