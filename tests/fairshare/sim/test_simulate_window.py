"""``fairgate simulate``'s window measures (GPU-time against integrated entitlement, by
class, backlogged time), the count of pods that waited, the timeline's class split and
its time column, through the real queue and dispatcher in a real Redis."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
import tablefit
import yaml

from fairshare.sim.simulate import (
    Simulation,
    SimulationReport,
    Window,
    report_tables,
    run_simulation,
    simulate_command,
)
from fairshare.sim.trace import parse_trace
from tests.fairshare.simkit import JOIN_TRACE
from webhook.cli import main


def run(text: str, redis_url: str, window: Window | None = None,
        timeline_every: float | None = None) -> SimulationReport:
    return run_simulation(parse_trace(yaml.safe_load(text)), redis_url,
                          timeline_every=timeline_every, window=window)


def measures(report: SimulationReport) -> dict[str, tuple[float, float, float | None, float]]:
    """Per tenant: GPU-seconds, entitled GPU-seconds, their ratio, backlogged seconds."""
    assert report.window is not None
    return {name: (t.gpu_seconds, t.entitled_gpu_seconds, t.of_entitlement,
                   t.backlogged_seconds)
            for name, t in report.window.tenants.items()}


def test_the_entitlement_integrates_the_fair_share_over_the_window(redis_url: str) -> None:
    whole = run(JOIN_TRACE, redis_url)
    assert whole.window is not None and (whole.window.start, whole.window.end) == (0.0, 620.0)
    got = measures(whole)
    # team-a is entitled to all 4 GPUs while alone (0-200), then to 1 of 4 (1:3)
    assert got["team-a"][1] == pytest.approx(4 * 200 + 1 * 420)
    assert got["team-b"][1] == pytest.approx(3 * 420)
    assert got["team-c"] == (0.0, 0.0, None, 0.0)  # no demand: entitled to nothing
    assert got["team-a"][3] == 620.0 and got["team-b"][3] == 420.0  # backlogged from arrival
    # GPU-seconds are the report's GPU-hours, and the cluster was full throughout
    for name, tenant in whole.tenants.items():
        assert got[name][0] == pytest.approx(tenant.gpu_hours * 3600)
    assert sum(v[0] for v in got.values()) == pytest.approx(4 * 620)
    assert whole.window.utilization == pytest.approx(1.0)

    late = run(JOIN_TRACE, redis_url, Window(300.0))  # both active: entitlement 1:3 of 4 GPUs
    got_late = measures(late)
    assert late.window is not None and (late.window.start, late.window.end) == (300.0, 620.0)
    assert got_late["team-a"][1] == pytest.approx(320)
    assert got_late["team-b"][1] == pytest.approx(960)
    assert got_late["team-a"][3] == got_late["team-b"][3] == 320.0
    early = measures(run(JOIN_TRACE, redis_url, Window(0.0, 300.0)))
    for name in ("team-a", "team-b"):  # the windows split the run exactly
        assert early[name][0] + got_late[name][0] == pytest.approx(got[name][0])
        assert early[name][1] + got_late[name][1] == pytest.approx(got[name][1])


def test_of_entitlement_and_jain_show_a_tenant_behind_its_share(redis_url: str) -> None:
    # 2 GPUs, equal weights; team-a's 2-GPU pods hold the cluster until t=100, team-b
    # arrives at t=0 too but after them: over 0-100 team-b got nothing of its 1 GPU
    text = (
        "capacity: {gpu: 2}\n"
        "tenants:\n  team-a: {weight: 1, nominal: {gpu: 2}}\n"
        "  team-b: {weight: 1, nominal: {gpu: 2}}\n"
        "arrivals:\n"
        "  - {at: 0, tenant: team-a, class: training, demand: {gpu: 2}, duration: 100}\n"
        "  - {at: 0, tenant: team-b, class: training, demand: {gpu: 1}, duration: 100, count: 4}\n"
        "horizon: 100\n"
    )
    report = run(text, redis_url)
    got = measures(report)
    assert got["team-a"][:3] == (pytest.approx(200.0), pytest.approx(100.0), pytest.approx(2.0))
    assert got["team-b"][:3] == (0.0, pytest.approx(100.0), 0.0)
    assert report.window is not None
    assert report.window.jain_index == pytest.approx(0.5)  # (2 + 0)^2 / (2 * (4 + 0))


def test_pods_that_waited_are_counted_by_class(redis_url: str) -> None:
    # 1 GPU: two inference pods of team-a at once, the second waits for the first;
    # team-b's training pod running when team-a's third inference pod arrives is
    # preempted for it (no wait) and re-created (it waits for the GPU)
    text = (
        "capacity: {gpu: 1}\n"
        "tenants:\n  team-a: {weight: 1, nominal: {gpu: 1}}\n"
        "  team-b: {weight: 1, nominal: {gpu: 1}}\n"
        "arrivals:\n"
        "  - {at: 0, tenant: team-a, class: inference, demand: {gpu: 1}, duration: 10, count: 2}\n"
        "  - {at: 20, tenant: team-b, class: training, demand: {gpu: 1}, duration: 100}\n"
        "  - {at: 30, tenant: team-a, class: inference, demand: {gpu: 1}, duration: 10}\n"
        "horizon: 200\n"
    )
    report = run(text, redis_url, timeline_every=5)
    assert report.preemptions == 1
    assert report.waited == {"inference": 1, "training": 1}
    assert report.to_json()["waited"] == {"inference": 1, "training": 1}
    assert report.window is not None
    tenants = report.window.tenants
    assert tenants["team-a"].gpu_seconds_by_class == {"inference": pytest.approx(30.0),
                                                      "training": 0.0}
    # 10 s before the preemption, then the re-created pod's 100 s from t=40
    assert tenants["team-b"].gpu_seconds_by_class == {"inference": 0.0,
                                                      "training": pytest.approx(110.0)}
    at = {(row.time, row.tenant): row for row in report.timeline}
    assert at[5.0, "team-a"].by_class == {"inference": 1.0, "training": 0.0}
    assert at[25.0, "team-b"].by_class == {"inference": 0.0, "training": 1.0}
    assert at[35.0, "team-b"].by_class == {"inference": 0.0, "training": 0.0}
    for row in report.timeline:
        assert sum(row.by_class.values()) == pytest.approx(row.allocated)


def _simulate_json(path: Path, redis_url: str, **options: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = simulate_command(path, True, redis_url, out=out, err=err, **options)
    return code, out.getvalue(), err.getvalue()


def test_the_window_option_reaches_the_json(redis_url: str, tmp_path: Path) -> None:
    path = tmp_path / "join.yaml"
    path.write_text(JOIN_TRACE)
    code, out, err = _simulate_json(path, redis_url, window=Window(200.0, 620.0))
    assert code == 0, err
    window = json.loads(out)["window"]
    assert (window["from"], window["to"]) == (200.0, 620.0)
    assert window["tenants"]["team-b"]["entitled_gpu_seconds"] == pytest.approx(1260.0)
    assert window["tenants"]["team-c"]["of_entitlement"] is None
    code, out, err = _simulate_json(path, redis_url, window=Window(100.0, 700.0))
    assert code == 2 and out == ""
    assert "--window 100:700 is not inside the trace's horizon 0:620" in err
    code, _, err = _simulate_json(path, redis_url, window=Window(620.0))
    assert code == 2 and "give FROM < TO <= 620" in err


@pytest.mark.parametrize(("text", "message"), [
    ("300", "'300' is not FROM:TO"),
    ("300:100", "give 0 <= FROM < TO"),
    ("-5:100", "give 0 <= FROM < TO"),
    ("a:100", "FROM and TO must be seconds"),
    ("0:inf", "in finite seconds"),
])
def test_a_bad_window_is_refused_before_the_run(text: str, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "t.yaml", f"--window={text}"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_simulate_help_teaches_the_window_and_the_waited_count(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("--window FROM:TO", "entitlement integrated over the window",
                     "backlogged_seconds", "waited.inference", "split by class",
                     "--window 3600:"):
        assert fragment in text


def test_timeline_times_stay_distinct_past_a_million_seconds(redis_url: str,
                                                            tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(
        "capacity: {gpu: 1}\ntenants:\n  team-a: {weight: 1, nominal: {gpu: 1}}\n"
        "arrivals:\n"
        "  - {at: 0, tenant: team-a, class: training, demand: {gpu: 1}, duration: 10}\n"
        "horizon: 1000030.5\n"
    )
    out = tmp_path / "t.csv"
    code, _, err = _simulate_json(path, redis_url, timeline=out, timeline_every=1_000_000)
    assert code == 0, err
    with out.open(newline="") as handle:
        times = [row[0] for row in list(csv.reader(handle))[1:]]
    assert times == ["0", "1000000", "1000030.5"]  # %g wrote 1e+06 twice


def test_the_text_report_has_the_window_table(redis_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: no header wrapped in its cell
    path = tmp_path / "join.yaml"
    path.write_text(JOIN_TRACE)
    out = io.StringIO()
    assert simulate_command(path, False, redis_url, out=out, err=io.StringIO(),
                            window=Window(300.0)) == 0
    text = out.getvalue()
    assert "window 300-620 s: GPU-time against integrated entitlement" in text
    for column in ("entitled", "used / entitled", "backlog", "inference", "training"):
        assert f" {column} ┃" in text
    assert "in GPU-seconds: used, all and per class, and entitled" in text


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("example", ["preemption-cost.yaml", "placement.yaml"])
def test_the_text_report_fits_the_terminal(redis_url: str, width: int, example: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``fairgate simulate`` of the examples (costs, preemptions, three tenants, a window)
    in a terminal of 80 columns cuts no header or name and prints no table line wider;
    at 120 no header or row wraps either."""
    monkeypatch.setenv("COLUMNS", str(width))
    path = Path(__file__).parents[3] / "examples" / example
    out = io.StringIO()
    assert simulate_command(path, False, redis_url, out=out, err=io.StringIO(),
                            window=Window(0.0)) == 0
    text = out.getvalue()
    trace = parse_trace(yaml.safe_load(path.read_text()))
    tables = report_tables(run_simulation(trace, redis_url, window=Window(0.0)))
    assert len(tables) == 4  # summary, waits, tenants, window
    headers = [str(c.header) for t in tables for c in t.columns if c.header]
    assert tablefit.problems(text, width, headers, unwrapped=width >= 120) == []
    for name in trace.tenants:
        assert sum(line.startswith(f"│ {name} ") for line in text.splitlines()) == 2


def test_entitlements_are_water_filled_per_placement_class(redis_url: str) -> None:
    """examples/placement.yaml: team-a's whole-GPU backlog can only use the 8 whole GPUs
    (the MIG devices and the pool's GPUs are other classes), so it is never entitled to
    more than 8, and the run that gives every class to whom it may reads fair."""
    trace = parse_trace(yaml.safe_load(
        (Path(__file__).parents[3] / "examples" / "placement.yaml").read_text()))
    report = run_simulation(trace, redis_url, timeline_every=60)
    entitled = [row.entitlement for row in report.timeline if row.tenant == "team-a"]
    assert max(entitled) == pytest.approx(8)
    pool = [row.entitlement for row in report.timeline if row.tenant == "team-pool"]
    assert max(pool) <= 4 + 1e-9
    assert report.window is not None
    for name, tenant in report.window.tenants.items():
        assert tenant.of_entitlement == pytest.approx(1.0, abs=0.01), name
    assert report.jain_index == pytest.approx(1.0, abs=0.001)
    assert report.window.jain_index == pytest.approx(1.0, abs=0.001)


def test_a_lone_backlogged_tenant_holding_nothing_does_not_read_fair(redis_url: str) -> None:
    """Only one tenant is ever entitled to something: the headline is n/a, not 1.0."""
    report = run("""
capacity: {gpu: 4}
tenants:
  team-a: {weight: 1, nominal: {gpu: 4}}
  team-b: {weight: 1, nominal: {gpu: 4}}
arrivals:
  - {at: 0, tenant: team-a, class: training, demand: {gpu: 4}, duration: 100, count: 1}
horizon: 50
""", redis_url)
    assert report.jain_index is None
    assert report.to_json()["jain_index"] is None


DRAIN_TRACE = """
capacity: {gpu: 4}
tenants:
  big: {weight: 1, nominal: {gpu: 4}}
  small: {weight: 1, nominal: {gpu: 4}}
arrivals:
  - {at: 0, tenant: big, class: training, demand: {gpu: 4}, duration: 100, count: 40}
  - {at: 0, every: 2, tenant: small, class: training, demand: {gpu: 1}, duration: 300,
     activeDeadlineSeconds: 300, count: 30}
  - {at: 1, every: 2, tenant: small, class: training, demand: {gpu: 1}, duration: 370,
     activeDeadlineSeconds: 370, count: 30}
horizon: 4000
"""


def test_capacity_held_idle_for_a_drain_is_measured_apart(redis_url: str) -> None:
    """``big`` needs the whole cluster, ``small``'s 1-GPU pods run 300 and 370 s in
    turn (declared), so they end at different times: while the cluster drains for
    ``big``, the GPUs that free are held for it and nothing that waits ends in time to
    be backfilled. All the idle time while pods wait is that held capacity; with 1-GPU
    pods only nothing is ever held."""
    drained = run(DRAIN_TRACE, redis_url).window
    assert drained is not None
    assert drained.held_idle > 0.05
    assert drained.utilization + drained.held_idle == pytest.approx(1.0, abs=1e-6)
    even = run(DRAIN_TRACE.replace("demand: {gpu: 4}", "demand: {gpu: 1}"), redis_url).window
    assert even is not None and (even.utilization, even.held_idle) == (1.0, 0.0)


def test_marks_integrate_from_their_instant_and_change_nothing(redis_url: str) -> None:
    """A mark at the start and one between events (1,234.5 s): from the first each
    tenant's GPU-seconds are the whole run's; from the second, what ran after it; the run
    is the same as one without marks."""
    client = redis.Redis.from_url(redis_url)
    plain = Simulation(parse_trace(yaml.safe_load(DRAIN_TRACE)), client, "fairgate:p:").run()
    sim = Simulation(parse_trace(yaml.safe_load(DRAIN_TRACE)), client, "fairgate:m:")
    sim.mark_at([0.0, 1_234.5])
    marked = sim.run()
    assert marked.window == plain.window
    whole, later = sim.meter.since(0.0), sim.meter.since(1_234.5)
    for name, tenant in marked.tenants.items():
        assert whole[name][0] == pytest.approx(tenant.gpu_hours * 3600)
        assert 0 < later[name][0] < whole[name][0]
    assert sum(used for used, _ in later.values()) <= 4 * (4000 - 1_234.5)
