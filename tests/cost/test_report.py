"""`fairgate report` against a real redis-server and a real hash-chained audit stream."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import tablefit

from audit import AuditLog
from audit.chain import format_time
from audit.log import STREAM
from audit.usage import capacity_detail, preempt_detail, pricing_detail, start_detail
from cost.billing import bill_bodies
from cost.report import bill_tables, month_start, report_command, window

NOW = datetime(2026, 3, 20, 12, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
REPO = Path(__file__).resolve().parents[2]


def _at(day: int, hour: float = 0) -> str:
    return format_time(datetime(2026, 3, day, tzinfo=UTC) + timedelta(hours=hour))


def _pod(log: AuditLog, ticket: str, tenant: str, demand: str, start: str, end: str | None,
         band: str = "training", product: str | None = None, **extra: Any) -> None:
    common: dict[str, Any] = {"uid": ticket, "tenant": tenant, "pod_class": "training",
                              "demand": demand, "namespace": f"{tenant}-dev",
                              "name": ticket}
    log.record("start", time=start, diff=start_detail(band, "n1", product), **common)
    if extra.get("preempted"):
        log.record("preempt", time=end, diff=preempt_detail(band, 3600.0, "b-dev/infer"),
                   **common)
    if end is not None:
        log.record("release", time=end, reason="pod Succeeded", **common)


def _fill(client: redis.Redis) -> AuditLog:
    """March 2026: prices 2.00 (default) / 3.50 (A100) until the 10th, then 4.00 default."""
    log = AuditLog(client, out=io.StringIO())
    log.record("pricing", time=_at(1), diff=pricing_detail(
        None, {"pricing.currency": "USD", "pricing.gpuHour.default": 2.0,
               f"pricing.gpuHour.{A100}": 3.5}))
    log.record("capacity", time=_at(1), diff=capacity_detail(None, {"gpu": 8}))
    # team-a: 2 A100s from Feb 28 22:00 to Mar 1 02:00: 2 h x 2 GPUs inside March
    _pod(log, "a1", "team-a", "gpu=2", format_time(datetime(2026, 2, 28, 22, tzinfo=UTC)),
         _at(1, 2), product=A100)
    # team-b: a 3g MIG slice from the 9th 22:00 to the 10th 02:00 across the price change
    _pod(log, "b1", "team-b", "mig-3g.40gb=1", _at(9, 22), _at(10, 2))
    log.record("quota-change", time=_at(10), name="fairgate-platform",
               namespace="fairgate-system", operation="UPDATE",
               diff={"pricing.gpuHour.default": {"before": 2.0, "after": 4.0}})
    # team-a borrowed 1 GPU for 1 h on the 15th, preempted
    _pod(log, "a2", "team-a", "gpu=1", _at(15, 1), _at(15, 2), band="borrowed",
         preempted=True)
    return log


def _run(client: redis.Redis, **kwargs: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = report_command(client, out, err=err, now=NOW, **kwargs)
    return code, out.getvalue(), err.getvalue()


def test_the_report_bills_the_verified_log_exactly(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    code, out, err = _run(redis_client, output="json")
    assert code == 0, err
    data = json.loads(out)
    assert data["since"] == "2026-03-01T00:00:00Z" and data["until"] == "2026-03-20T12:00:00Z"
    rows = {r["tenant"]: r for r in data["rows"]}
    a, b = rows["team-a"], rows["team-b"]
    assert a["gpu_hours"] == 4 + 1 and a["borrowed_gpu_hours"] == 1
    assert abs(a["cost"] - (4 * 3.5 + 1 * 4.0)) < 1e-9 and a["opencost"] == {
        "gpuHours": a["gpu_hours"], "gpuCost": a["cost"]}
    assert a["preempted_pods"] == 1 and a["preempted_gpu_hours"] == 1
    assert abs(b["gpu_hours"] - 4 * 3 / 7) < 1e-12
    assert abs(b["cost"] - (2 * 3 / 7 * 2.0 + 2 * 3 / 7 * 4.0)) < 1e-9
    hours = (NOW - datetime(2026, 3, 1, tzinfo=UTC)) / timedelta(hours=1)
    assert data["capacity_gpu_hours"] == 8 * hours
    assert abs(data["idle_gpu_hours"] - (8 * hours - 5 - 12 / 7)) < 1e-9
    assert data["complete"] is True and data["currency"] == "USD"

    code, out, _ = _run(redis_client, output="csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert [r["tenant"] for r in table] == ["team-a", "team-b", "total", "(idle)"]
    assert table[2]["gpu_hours"] == f"{5 + 12 / 7:.4f}" and table[0]["cost"] == "18.00"

    code, out, _ = _run(redis_client, since="2026-03-15", until="2026-03-16")
    assert code == 0
    assert "team-a" in out and "team-b" not in out and "total" in out
    assert "4.00" in out and "capacity 192.00 GPU-h, idle 191.00 GPU-h" in out


def test_a_log_with_a_record_removed_is_refused(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    entries = redis_client.xrange(STREAM)
    redis_client.xdel(STREAM, entries[4][0])  # one release record
    code, out, err = _run(redis_client)
    assert code == 1 and out == ""
    assert "refusing to bill" in err and "seq 5" in err


def test_an_edited_record_is_refused(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    stream_id, fields = redis_client.xrange(STREAM)[3]
    body = fields[b"record"].replace(b'"mig-3g.40gb=1"', b'"mig-1g.10gb=1"')
    redis_client.xadd(STREAM, {**fields, b"record": body}, id="*")  # appended copy
    redis_client.xdel(STREAM, stream_id)
    code, _, err = _run(redis_client)
    assert code == 1 and "refusing to bill" in err


def test_the_window_defaults_to_this_month_and_never_bills_the_future() -> None:
    assert window(None, None, NOW) == (month_start(NOW), NOW)
    assert window("2026-03-01", "2027-01-01", NOW)[1] == NOW
    assert window("7d", None, NOW)[0] == NOW - timedelta(days=7)


def test_an_until_in_the_future_says_it_is_cut_back_to_now(redis_client: redis.Redis) -> None:
    _fill(redis_client)
    code, out, err = _run(redis_client, until="2027-01-01", output="json")
    assert code == 0 and json.loads(out)["until"] == "2026-03-20T12:00:00Z"
    assert "--until 2027-01-01 is in the future" in err and "cut back to now" in err
    code, _, err = _run(redis_client, until="2026-03-10", output="json")
    assert code == 0 and "future" not in err


def test_bad_times_and_empty_windows_are_usage_errors(redis_client: redis.Redis) -> None:
    code, _, err = _run(redis_client, since="last tuesday")
    assert code == 2 and "cannot read time 'last tuesday'" in err
    code, _, err = _run(redis_client, since="2026-03-21")
    assert code == 2 and "window is empty" in err


def test_retention_gaps_mark_the_bill_incomplete(redis_client: redis.Redis) -> None:
    log = AuditLog(redis_client, out=io.StringIO(), maxlen=2)
    for hour in range(4):
        log.record("capacity", time=_at(5, hour), diff=capacity_detail(None, {"gpu": hour}))
    code, out, _ = _run(redis_client, output="json")
    data = json.loads(out)
    assert code == 0 and data["complete"] is False and "retention" in data["warnings"][0]


def test_a_window_older_than_the_age_retention_warns_in_every_format(
        redis_client: redis.Redis) -> None:
    """Records trimmed by age (--audit-retention): the report says its bill is
    incomplete, under the table and on stderr with CSV and JSON, and still bills what
    is left; a window that starts after the oldest kept record is complete."""
    old = AuditLog(redis_client, out=io.StringIO(), max_age=timedelta(seconds=2))
    _pod(old, "gone", "team-a", "gpu=1", _at(2), _at(2, 1))
    time.sleep(2.5)  # the two records above are now older than the retention age
    _pod(old, "kept", "team-b", "gpu=1", _at(3), _at(3, 2))
    assert redis_client.xlen(STREAM) == 2
    code, out, err = _run(redis_client, output="json")
    data = json.loads(out)
    assert code == 0 and data["complete"] is False
    assert [r["tenant"] for r in data["rows"]] == ["team-b"]
    assert "removed by retention (oldest kept: seq 3)" in data["warnings"][0]
    assert err == f"warning: {data['warnings'][0]}\n"
    code, out, err = _run(redis_client, output="csv")
    assert code == 0 and "team-b" in out and "bill is incomplete" in err
    code, out, err = _run(redis_client)
    assert code == 0 and "warning: records before" in out and err == ""
    code, out, err = _run(redis_client, output="json", since="2026-03-03T00:00:00Z")
    assert code == 0 and json.loads(out)["complete"] is True and err == ""


def test_the_command_line(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    _fill(client)
    env = {**os.environ, "PYTHONPATH": str(REPO), "REDIS_URL": redis_url}
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "report", "--since", "2026-03-01",
         "--until", "2026-03-20T12:00:00Z", "--csv"],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("tenant,class,gpu_hours")
    assert "team-a,training,5.0000,1.0000,18.00,1,1.0000" in result.stdout
    helped = subprocess.run([sys.executable, "-m", "webhook.cli", "report", "--help"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert "fairgate report --since 2026-03-01" in helped.stdout


def test_gpu_hours_lost_to_reclaim_are_counted_per_tenant(redis_client: redis.Redis) -> None:
    """team-b's 2-GPU pod ran 2 h and was reclaimed (fairgate evicted it for team-a, owed
    its fair share): 4 GPU-hours lost, apart from preemption, in JSON, CSV and table."""
    log = _fill(redis_client)
    common: dict[str, Any] = {"uid": "b2", "tenant": "team-b", "pod_class": "training",
                              "demand": "gpu=2", "namespace": "team-b-dev", "name": "b2"}
    log.record("start", time=_at(16, 1), diff=start_detail("training", "n1", None), **common)
    log.record("reclaim", time=_at(16, 3), reason="reclaimed for team-a-dev/a9 of tenant "
               "team-a (owed its fair share) after 7200.0s running",
               diff=preempt_detail("training", 7200.0, "team-a-dev/a9"), **common)
    log.record("release", time=_at(16, 3), reason="pod Failed", **common)
    code, out, err = _run(redis_client, output="json")
    assert code == 0, err
    data = json.loads(out)
    rows = {r["tenant"]: r for r in data["rows"]}
    assert rows["team-b"]["reclaimed_pods"] == 1 and rows["team-b"]["reclaimed_gpu_hours"] == 4
    assert rows["team-b"]["preempted_pods"] == 0
    assert rows["team-a"]["reclaimed_pods"] == 0  # its preemption stays a preemption
    assert data["totals"]["reclaimed_gpu_hours"] == 4
    code, out, _ = _run(redis_client, output="csv")
    table = {r["tenant"]: r for r in csv.DictReader(io.StringIO(out))}
    assert table["team-b"]["reclaimed_pods"] == "1"
    assert table["team-b"]["reclaimed_gpu_hours"] == "4.0000"
    assert table["(idle)"]["reclaimed_pods"] == ""
    code, out, _ = _run(redis_client, since="2026-03-16", until="2026-03-17")
    assert "reclaimed GPU-h" in out and "4.00" in out


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("share_idle", [False, True], ids=["bill", "share-idle"])
def test_the_report_tables_fit_the_terminal(redis_client: redis.Redis, width: int,
                                            share_idle: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``fairgate report`` in a terminal of 80 columns cuts no header or name and prints
    no table line wider; at 120 no header or row wraps either (with --share-idle too)."""
    monkeypatch.setenv("COLUMNS", str(width))
    log = _fill(redis_client)
    _pod(log, "c1", "research-long", "gpu=8", _at(16), _at(18), product=A100)
    code, out, err = _run(redis_client, share_idle=share_idle)
    assert code == 0, err
    billed = bill_bodies(AuditLog(redis_client, out=io.StringIO()).scan(), month_start(NOW),
                         NOW, share_idle=share_idle)
    headers = [str(c.header) for t in bill_tables(billed) for c in t.columns]
    assert len(bill_tables(billed)) == (3 if share_idle else 2)
    assert tablefit.problems(out, width, headers, unwrapped=width >= 120) == []
    names = {line[1:].split("│")[0].strip() for line in out.splitlines()
             if line.startswith("│ ")}
    assert names == {"team-a", "team-b", "research-long", "total"}
