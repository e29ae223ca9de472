"""``fairgate simulate --timeline/--plot``: allocation against entitlement over virtual
time, from the real queue and dispatcher in a real Redis."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from fairshare.sim.simulate import run_simulation, simulate_command
from fairshare.sim.trace import load_trace
from tests.fairshare.simkit import JOIN_TRACE


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    path = tmp_path / "arrive.yaml"
    path.write_text(JOIN_TRACE)
    return path


def test_timeline_samples_allocation_and_entitlement(redis_url: str, trace_path: Path) -> None:
    report = run_simulation(load_trace(trace_path), redis_url, timeline_every=50)
    times = sorted({row.time for row in report.timeline})
    assert times == [50.0 * k for k in range(13)] + [620.0]  # every 50 s, and the horizon
    at = {(row.time, row.tenant): (row.allocated, row.entitlement) for row in report.timeline}
    for t in (0.0, 50.0, 100.0, 150.0):  # team-a alone: all 4 GPUs, and entitled to them
        assert at[(t, "team-a")] == (4.0, 4.0)
        assert at[(t, "team-b")] == (0.0, 0.0)
    for t in times:
        assert at[(t, "team-c")] == (0.0, 0.0)  # no demand, no entitlement
    for t in times[4:]:  # from t=200 both have demand: 4 GPUs split 1:3
        assert at[(t, "team-a")][1] == pytest.approx(1.0)
        assert at[(t, "team-b")][1] == pytest.approx(3.0)
    for t in times[6:]:  # after one pod duration, the allocation follows
        assert at[(t, "team-a")][0] == pytest.approx(1.0)
        assert at[(t, "team-b")][0] == pytest.approx(3.0)
    # the documented keys only: the timeline stays out of the report
    assert report.to_json().keys() == {"jain_index", "utilization", "wait_seconds", "tenants",
                                       "preemption", "reclaim", "waited", "window",
                                       "autoscaling", "gangs"}
    for row in report.timeline:  # all training: the class split is the allocation
        assert row.by_class == {"inference": 0.0, "training": row.allocated}


def test_timeline_command_writes_the_csv(redis_url: str, trace_path: Path,
                                         tmp_path: Path) -> None:
    out = tmp_path / "timeline.csv"
    assert simulate_command(trace_path, True, redis_url, out=io.StringIO(), timeline=out,
                            timeline_every=200) == 0
    with out.open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["time", "tenant", "allocated_gpu_eq", "entitlement_gpu_eq",
                       "inference_gpu_eq", "training_gpu_eq"]
    assert [r[:2] for r in rows[1:]] == [
        [t, tenant] for t in ("0", "200", "400", "600", "620")
        for tenant in ("team-a", "team-b", "team-c")
    ]
    assert rows[1] == ["0", "team-a", "4.0000", "4.0000", "0.0000", "4.0000"]
    assert rows[11][2:] == ["3.0000", "3.0000", "0.0000", "3.0000"]  # t=600, team-b


@pytest.mark.parametrize(("options", "message"), [
    ({"timeline_every": 30.0}, "--timeline-every needs --timeline out.csv or --plot out.png"),
    ({"timeline": Path("/no/such/dir/t.csv")}, "directory /no/such/dir does not exist"),
    ({"timeline": Path("t.csv"), "timeline_every": 0.0}, "must be > 0 seconds"),
])
def test_bad_timeline_options_are_refused_before_the_run(
    trace_path: Path, options: dict[str, object], message: str
) -> None:
    err = io.StringIO()
    # no Redis URL that works: the options are checked before anything runs
    assert simulate_command(trace_path, True, "redis://127.0.0.1:1/0", out=io.StringIO(),
                            err=err, **options) == 2  # type: ignore[arg-type]
    assert message in err.getvalue()
