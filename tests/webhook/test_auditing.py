"""The webhook's audit writer: order kept, nothing lost at stop, bounded when stuck."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterable

from audit import AuditLog, AuditRecord
from webhook.auditing import AuditWriter


def test_every_submitted_record_is_written_in_order_and_flushed_at_stop() -> None:
    out = io.StringIO()
    writer = AuditWriter(AuditLog(None, out=out))
    writer.start()

    def submit(thread: int) -> None:
        for i in range(250):
            writer.submit("admit", uid=f"{thread}-{i}", tenant="team-a")

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.stop()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 2000
    assert [r["seq"] for r in records] == list(range(1, 2001))  # one chain, no gaps
    for t in range(8):  # each submitter's records stay in its order
        mine = [int(r["uid"].split("-")[1]) for r in records if r["uid"].startswith(f"{t}-")]
        assert mine == list(range(250))
    assert writer.dropped == 0


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    out = io.StringIO()
    writer = AuditWriter(AuditLog(None, out=out), capacity=10)
    for i in range(15):  # the writer is not running: nothing drains
        writer.submit("deny", uid=str(i))
    assert writer.dropped == 5
    writer.start()
    writer.stop()
    assert [json.loads(line)["uid"] for line in out.getvalue().splitlines()] == [
        str(i) for i in range(10)]


def test_a_record_the_audit_log_refuses_is_dropped_not_raised() -> None:
    out = io.StringIO()
    writer = AuditWriter(AuditLog(None, out=out))
    writer.start()
    writer.submit("admit", no_such_field=1)
    writer.submit("Not A Decision", uid="x")
    writer.submit("deny", uid="kept")
    writer.stop()
    assert writer.dropped == 2
    assert [json.loads(line)["uid"] for line in out.getvalue().splitlines()] == ["kept"]


class _CountingLog(AuditLog):
    """An in-memory AuditLog that counts its appends."""

    def __init__(self) -> None:
        super().__init__(None, out=io.StringIO())
        self.batches: list[int] = []

    def record_many(self, drafts: Iterable[AuditRecord]) -> list[AuditRecord]:
        stored = super().record_many(drafts)
        self.batches.append(len(stored))
        return stored


def test_records_submitted_while_the_writer_lingers_are_appended_together() -> None:
    audit_log = _CountingLog()
    writer = AuditWriter(audit_log, linger=30.0)  # stop() ends the linger early
    writer.start()
    for i in range(100):
        writer.submit("admit", uid=str(i))
    writer.stop()
    assert audit_log.batches == [64, 36]  # appended together, at most 64 per call
    assert writer.dropped == 0


def test_the_writer_wakes_again_after_idling() -> None:
    audit_log = _CountingLog()
    writer = AuditWriter(audit_log, linger=0.0)
    writer.start()
    for i in range(3):
        done = len(audit_log.batches)
        writer.submit("admit", uid=str(i))
        for _ in range(500):  # the idle writer was woken and wrote the record
            if len(audit_log.batches) > done:
                break
            threading.Event().wait(0.01)
        assert sum(audit_log.batches) == i + 1
    writer.stop()
