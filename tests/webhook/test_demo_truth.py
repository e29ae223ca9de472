"""The demo tells the truth: its audit times are never in the future, and its cost table,
``fairgate report`` and the console's Cost page bill the same on its Redis, which the
demo tells how to reach (``REDIS_URL=... REDIS_PASSWORD=... fairgate status``)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx

from audit import AuditLog
from fairshare.connection import RedisTarget, connect_redis

ROOT = Path(__file__).resolve().parents[2]


def _total_row(lines: list[str]) -> tuple[float, float, float]:
    """GPU-h, borrowed GPU-h and cost of the demo's cost table's total row."""
    row = next(line for line in lines if line.startswith("│ total"))
    cells = [c.strip() for c in row.strip().strip("│").split("│")]
    return float(cells[2]), float(cells[3]), float(cells[4])


def test_the_demo_report_and_console_agree_and_no_audit_time_is_in_the_future(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD")}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT)
    demo = subprocess.Popen([sys.executable, "-m", "webhook.cli", "demo", "--console",
                             "--pods", "40"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=tmp_path)
    assert demo.stdout is not None
    seen: list[str] = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("console: "):
                break
        text = "".join(seen)
        hint = re.search(r"(REDIS_URL=(\S+) REDIS_PASSWORD=(\S+)) fairgate status", text)
        assert hint, text
        pointed = {**env, "REDIS_URL": hint.group(2), "REDIS_PASSWORD": hint.group(3)}
        # the printed hint works as written
        status = subprocess.run([sys.executable, "-m", "webhook.cli", "status"], env=pointed,
                                capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        now = datetime.now(UTC)
        client = connect_redis(RedisTarget(hint.group(2), hint.group(3)), timeout=10)
        try:
            result, entries = AuditLog(client, out=io.StringIO()).verify()
        finally:
            client.close()
        assert result.ok and entries
        times = [datetime.fromisoformat(e.record.time.replace("Z", "+00:00"))
                 for e in entries if e.record is not None]
        assert max(times) <= now, f"an audit record at {max(times)} is after now ({now})"

        gpu_hours, borrowed, cost = _total_row(seen)
        assert gpu_hours > 0
        report = subprocess.run([sys.executable, "-m", "webhook.cli", "report", "--json"],
                                env=pointed, capture_output=True, text=True, timeout=60,
                                cwd=tmp_path)
        assert report.returncode == 0, report.stderr
        totals = json.loads(report.stdout)["totals"]
        assert (round(totals["gpu_hours"], 2), round(totals["borrowed_gpu_hours"], 2),
                round(totals["cost"], 2)) == (gpu_hours, borrowed, cost)

        url = seen[-1].removeprefix("console: ").strip()
        base, token = url.split("/?token=")
        page = httpx.get(base + "/api/cost", timeout=60,
                         headers={"Authorization": f"Bearer {token}"}).json()
        assert page["available"], page
        shown = page["totals"]
        assert (round(shown["gpu_hours"], 2), round(shown["borrowed_gpu_hours"], 2),
                round(shown["cost"], 2)) == (gpu_hours, borrowed, cost)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(30)
