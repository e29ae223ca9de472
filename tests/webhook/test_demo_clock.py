"""The demo tells one story: its audit records share one clock, and its counts add up."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from audit import AuditLog, AuditRecord
from fairshare.connection import RedisTarget, connect_redis

ROOT = Path(__file__).resolve().parents[2]
PODS = 32  # the stream's last gang makes it 34 pods


@dataclass(frozen=True)
class DemoRun:
    output: str
    records: list[AuditRecord]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """``fairgate demo --console --pods 32``: its output up to the console line, and its
    audit log read from its Redis while it still runs."""
    tmp = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_PASSWORD")}
    env["TMPDIR"] = str(tmp)
    env["PYTHONPATH"] = str(ROOT)
    env["COLUMNS"] = "200"
    demo = subprocess.Popen([sys.executable, "-m", "webhook.cli", "demo", "--console",
                             "--pods", str(PODS)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp)
    assert demo.stdout is not None
    seen: list[str] = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("console: "):
                break
        text = "".join(seen)
        hint = re.search(r"REDIS_URL=(\S+) REDIS_PASSWORD=(\S+) fairgate status", text)
        assert hint, text
        client = connect_redis(RedisTarget(hint.group(1), hint.group(2)), timeout=10)
        try:
            result, entries = AuditLog(client, out=io.StringIO()).verify()
        finally:
            client.close()
        assert result.ok, result.problem
        yield DemoRun(text, [e.record for e in entries if e.record is not None])
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(30)


ORDER = {"admit": 0, "queue": 0, "dispatch": 1, "start": 2, "preempt": 3, "release": 3}


def test_every_pods_records_follow_one_clock(demo_run: DemoRun) -> None:
    """admit/queue <= dispatch <= start <= release for each pod, in time as in the chain:
    the webhook's records and the dispatcher's are on the same clock."""
    by_pod: dict[tuple[str, str], list[AuditRecord]] = defaultdict(list)
    for record in demo_run.records:
        if record.decision in ORDER:
            by_pod[(record.namespace, record.name)].append(record)
    assert len(by_pod) >= PODS // 2
    for pod, records in by_pod.items():
        decisions = [r.decision for r in records]
        if "preempt" in decisions:  # re-created by its controller: several lives
            first = min(r.time for r in records if r.decision in ("admit", "queue"))
            assert first <= min(r.time for r in records if r.decision != "queue"), pod
            continue
        steps = sorted(records, key=lambda r: (ORDER[r.decision], r.seq))
        times = [r.time for r in steps]
        assert times == sorted(times), (pod, [(r.decision, r.time) for r in steps])
    admissions = [r.time for r in demo_run.records if r.decision in ("admit", "queue", "deny")]
    releases = [r.time for r in demo_run.records if r.decision == "release"]
    assert min(admissions) < max(releases)
    assert min(admissions) <= min(r.time for r in demo_run.records
                                  if r.decision in ("dispatch", "start", "release"))


def _table_sum(output: str, columns: tuple[str, ...]) -> int:
    """The sum of ``columns`` over the rows of the demo's per-tenant table."""
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith("┃ tenant") and "admitted" in line)
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    at = [names.index(column) for column in columns]
    body = lines[lines.index(header):]
    body = body[:next(i for i, line in enumerate(body) if line.startswith("└"))]
    rows = [line for line in body if line.startswith("│ ")]
    total = 0
    for row in rows:
        if row.startswith("│ total"):
            break
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        total += sum(int(cells[i]) for i in at)
    return total


def test_the_demos_counts_add_up_or_say_why(demo_run: DemoRun) -> None:
    """--pods, the progress bar, the AdmissionReviews sent, the table's rows and the audit
    log's admission records are each explained by the others."""
    out = demo_run.output
    counts = re.search(r"^(\d+) pods created \((\d+) asked; the last gang is kept whole\): "
                       r"(\d+) GPU pods in the table \+ (\d+) without a GPU", out, re.M)
    assert counts, out
    created, asked, in_table, without_gpu = map(int, counts.groups())
    assert asked == PODS and created > PODS
    assert created == in_table + without_gpu
    bar = re.search(r"pods created through the webhook \(32 asked; the last gang is kept "
                    r"whole\)\D*(\d+)/(\d+)", out)
    assert bar and int(bar.group(1)) == int(bar.group(2)) == created, out
    assert _table_sum(out.split("denials")[0], ("admitted", "queued", "denied")) == in_table
    sent = re.search(r"^(\d+) AdmissionReviews over HTTPS \((\d+) creations \+ (\d+) "
                     r"re-created after preemption\)", out, re.M)
    assert sent, out
    reviews, creations, recreated = map(int, sent.groups())
    assert creations == created and reviews == creations + recreated
    decided = [r for r in demo_run.records if r.decision in ("admit", "queue", "deny")]
    assert len(decided) == in_table + recreated, "one admission record per GPU pod request"
