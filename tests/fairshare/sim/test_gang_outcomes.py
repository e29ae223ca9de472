"""``fairgate simulate`` answers "did my gang run, when, and whole?": the gang table and
``gangs`` in ``--json``, from traces run through the real queue and dispatcher in a real
Redis, and the outcomes no healthy run produces from the pods' history records."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import tablefit
import yaml
from rich.console import Console

from fairshare.sim.gangs import OUTCOME_WORDS, gang_reports, gang_violations
from fairshare.sim.simcluster import PodHistory, PodSpec
from fairshare.sim.simulate import (
    GANG_ROWS,
    SimulationReport,
    render_report,
    report_tables,
    run_simulation,
    simulate_command,
)
from fairshare.sim.trace import parse_trace

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

# 4 GPUs, one tenant: gang "first" (2 x 2 GPUs, 30 s) runs at once; gang "second"
# (4 x 1 GPU, 100 s) waits for it and still runs at the end; gang "third" (3 x 1 GPU)
# never fits beside it.
THREE_GANGS = {
    "capacity": {"gpu": 4},
    "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 4}}},
    "arrivals": [
        {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 2},
         "duration": 30, "group": "first", "groupSize": 2},
        {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
         "duration": 100, "group": "second", "groupSize": 4},
        {"at": 10, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
         "duration": 50, "group": "third", "groupSize": 3},
        {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
         "duration": 5},  # a pod of no gang: no row
    ],
    "horizon": 100,
}

GANG_KEYS = {"namespace", "group", "tenant", "size", "arrived_at", "released_at",
             "wait_seconds", "ran_seconds", "outcome"}


def simulate(data: dict[str, Any], redis_url: str, tmp_path: Path, *, as_json: bool,
             monkeypatch: pytest.MonkeyPatch, columns: int = 200) -> str:
    """``fairgate simulate`` of ``data`` (its output)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(data))
    out, err = io.StringIO(), io.StringIO()
    assert simulate_command(path, as_json, redis_url, out=out, err=err) == 0, err.getvalue()
    return out.getvalue()


def rows(text: str) -> dict[str, list[str]]:
    """The gang table's rows (in a terminal wide enough for one line each) by gang: the
    cells after the gang's name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("gangs ("))
    found = {}
    for line in lines[start:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            found[cells[0]] = cells[1:]
    return found


def test_json_says_which_gang_ran_whole_which_runs_and_which_still_waits(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(simulate(THREE_GANGS, redis_url, tmp_path, as_json=True,
                               monkeypatch=monkeypatch))
    assert data["gangs"] == [
        {"namespace": "team-a-sim", "group": "first", "tenant": "team-a", "size": 2,
         "arrived_at": 0.0, "released_at": 0.0, "wait_seconds": 0.0, "ran_seconds": 30.0,
         "outcome": "ran_whole"},
        {"namespace": "team-a-sim", "group": "second", "tenant": "team-a", "size": 4,
         "arrived_at": 0.0, "released_at": 30.0, "wait_seconds": 30.0,
         "ran_seconds": 70.0, "outcome": "running_at_end"},
        {"namespace": "team-a-sim", "group": "third", "tenant": "team-a", "size": 3,
         "arrived_at": 10.0, "released_at": None, "wait_seconds": 90.0,
         "ran_seconds": 0.0, "outcome": "waiting_at_end"},
    ]


def test_the_table_says_it_in_words_longest_wait_first(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = simulate(THREE_GANGS, redis_url, tmp_path, as_json=False, monkeypatch=monkeypatch)
    assert ("gangs (3): 1 still waiting at the end, 1 running whole at the end, 1 ran whole"
            in text)
    assert rows(text) == {
        "third": ["team-a", "3", "10", "-", "90", "0", "still waiting at the end"],
        "second": ["team-a", "4", "0", "30", "30", "70", "running whole at the end"],
        "first": ["team-a", "2", "0", "0", "0", "30", "ran whole"],
    }
    assert list(rows(text)) == ["third", "second", "first"]
    assert "more (--json lists every gang)" not in text


def test_a_trace_without_gangs_has_no_gang_table_and_an_empty_list(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = {**THREE_GANGS, "arrivals": THREE_GANGS["arrivals"][-1:]}
    assert "gangs (" not in simulate(alone, redis_url, tmp_path, as_json=False,
                                     monkeypatch=monkeypatch)
    data = json.loads(simulate(alone, redis_url, tmp_path, as_json=True,
                               monkeypatch=monkeypatch))
    assert data["gangs"] == []


def test_a_gang_the_scheduler_preempts_says_so_and_its_restart_has_a_row(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """team-a's gang of 4 borrows 2 GPUs from team-b's nominal; team-b's inference pod
    at 10 s preempts it whole. Its controller restarts it as g-r1, which runs once the
    inference pod ends at 30 s."""
    data = {
        "capacity": {"gpu": 4},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 2},
                               "borrowLimit": {"gpuEquivalents": 2}},
                    "team-b": {"weight": 1, "nominal": {"gpu": 2}}},
        "arrivals": [
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 100, "group": "g", "groupSize": 4},
            {"at": 10, "tenant": "team-b", "class": "inference", "demand": {"gpu": 1},
             "duration": 20},
        ],
        "horizon": 200,
    }
    gangs = json.loads(simulate(data, redis_url, tmp_path, as_json=True,
                                monkeypatch=monkeypatch))["gangs"]
    assert [(g["group"], g["arrived_at"], g["released_at"], g["ran_seconds"], g["outcome"])
            for g in gangs] == [("g", 0.0, 0.0, 10.0, "preempted"),
                                ("g-r1", 10.0, 30.0, 100.0, "ran_whole")]
    text = simulate(data, redis_url, tmp_path, as_json=False, monkeypatch=monkeypatch)
    assert rows(text)["g"][-1] == "preempted"


def test_a_gang_reclaim_evicts_says_so(redis_url: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """team-a's two preemptible gangs of 4 fill 8 GPUs; team-b's 4-GPU pod at 1 h is
    owed 4 of them, and after 5 minutes reclaim evicts one gang whole (the pods have run
    3,900 s). Its restart waits for team-b's pod to end (10 minutes), then runs."""
    data = {
        "capacity": {"gpu": 8},
        "tenants": {"team-a": {"weight": 1, "nominal": {"gpu": 8}},
                    "team-b": {"weight": 1, "nominal": {"gpu": 8}}},
        "arrivals": [
            {"at": 0, "tenant": "team-a", "class": "training", "demand": {"gpu": 1},
             "duration": 14_400, "group": "g", "groupSize": 4, "count": 2,
             "preemptible": True},
            {"at": 3600, "tenant": "team-b", "class": "training", "demand": {"gpu": 4},
             "duration": 600},
        ],
        "horizon": 7200,
        "fairShare": {"reclaim": {"after": "5m", "minRuntime": "30m", "perHour": 12}},
    }
    gangs = json.loads(simulate(data, redis_url, tmp_path, as_json=True,
                                monkeypatch=monkeypatch))["gangs"]
    outcomes = {g["group"]: (g["ran_seconds"], g["outcome"]) for g in gangs}
    reclaimed = [name for name, (_, outcome) in outcomes.items() if outcome == "reclaimed"]
    assert len(reclaimed) == 1
    assert outcomes[reclaimed[0]] == (3900.0, "reclaimed")
    restart = next(g for g in gangs if g["group"] == f"{reclaimed[0]}-r1")
    assert (restart["arrived_at"], restart["released_at"], restart["outcome"]) == (
        3900.0, 4500.0, "running_at_end")
    assert sorted(o for _, o in outcomes.values()) == [
        "reclaimed", "running_at_end", "running_at_end"]
    text = simulate(data, redis_url, tmp_path, as_json=False, monkeypatch=monkeypatch)
    assert rows(text)[reclaimed[0]][-1] == "reclaimed"


def test_every_gang_key_is_snake_case_and_every_gang_is_listed(redis_url: str) -> None:
    """examples/gangs.yaml: more gangs than the table shows; --json lists each."""
    trace = parse_trace(yaml.safe_load((EXAMPLES / "gangs.yaml").read_text()))
    data = run_simulation(trace, redis_url).to_json()
    groups = {pod.group for pod in trace.pods() if pod.group is not None}
    assert {g["group"] for g in data["gangs"]} >= groups
    assert len(data["gangs"]) > GANG_ROWS
    for gang in data["gangs"]:
        assert set(gang) == GANG_KEYS
        assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", key) for key in gang)
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", gang["outcome"])


@pytest.mark.parametrize("width", [80, 120])
def test_the_gang_table_fits_the_terminal(redis_url: str, width: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/gangs.yaml in 80 columns cuts no header or name and prints no table line
    wider; at 120 no header or row wraps; the longest waits are shown, then how many
    more."""
    monkeypatch.setenv("COLUMNS", str(width))
    out = io.StringIO()
    assert simulate_command(EXAMPLES / "gangs.yaml", False, redis_url, out=out,
                            err=io.StringIO()) == 0
    text = out.getvalue()
    trace = parse_trace(yaml.safe_load((EXAMPLES / "gangs.yaml").read_text()))
    report = run_simulation(trace, redis_url)
    tables = report_tables(report)
    headers = [str(c.header) for t in tables for c in t.columns if c.header]
    assert "outcome" in headers
    assert tablefit.problems(text, width, headers, unwrapped=width >= 120) == []
    assert f"... and {len(report.gangs) - GANG_ROWS} more (--json lists every gang)" in text
    if width >= 120:
        shown = rows(text)
        assert len(shown) == GANG_ROWS
        longest = max(report.gangs, key=lambda g: g.wait)
        assert next(iter(shown.items())) == (longest.group, [
            longest.tenant, str(longest.size), f"{longest.arrived:,.0f}",
            "-" if longest.released is None else f"{longest.released:,.0f}",
            f"{longest.wait:,.0f}", f"{longest.ran:,.0f}", OUTCOME_WORDS[longest.outcome]])


def pod(group: str, created: float, released: float | None, started: float | None = None,
        ended: float | None = None, size: int = 2) -> PodHistory:
    spec = PodSpec(namespace="team-a-sim", name=f"{group}-{created}-{released}",
                   tenant="team-a", pod_class="training", demand={"gpu": 1}, duration=60,
                   group=group, group_size=size)
    return PodHistory(spec, "t", "training", created, released, started, ended)


def test_a_gang_released_in_part_is_a_violation_shown_first() -> None:
    """No healthy run releases a gang in part: the records say it happened. The gang
    heads the table whatever its wait, in words that say it is a violation."""
    history = {str(i): record for i, record in enumerate([
        pod("split", 0, 5, 5, 65), pod("split", 0, 9, 9, 69),  # released at two instants
        pod("short", 0, 1, 1), pod("waits", 0, None), pod("waits", 0, None)])}
    gangs = gang_reports(history, horizon=100)
    assert [(g.group, g.released, g.outcome) for g in gangs] == [
        ("short", None, "partly_released"),  # 1 of its 2 pods, released
        ("split", 9, "partly_released"), ("waits", None, "waiting_at_end")]
    assert gang_violations(history) == ["team-a-sim/short: release times ['1']",
                                        "team-a-sim/split: release times ['5', '9']"]
    report = SimulationReport(jain_index=None, utilization=0.0, wait_seconds={}, tenants={},
                              gang_violations=gang_violations(history), gangs=gangs)
    printed = io.StringIO()
    render_report(report, Console(file=printed, width=120))
    table_rows = rows(printed.getvalue())
    assert list(table_rows)[:2] == ["short", "split"]
    assert table_rows["split"][-1] == "partly released (a violation)"


def test_a_gang_released_but_not_placed_by_the_end_says_so() -> None:
    history = {"1": pod("g", 0, 40, 40), "2": pod("g", 0, 40)}
    [gang] = gang_reports(history, horizon=100)
    assert (gang.released, gang.wait, gang.ran, gang.outcome) == (
        40, 40, 60, "released_not_started")
