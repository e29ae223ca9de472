"""The ``fairgate audit`` subcommands as plain functions (the CLI module wires them).

Contract: each takes a Redis client and output streams and returns the process exit
code. ``tail`` prints stream records as JSON lines (the last ``last`` ones, then new
ones as they arrive while ``follow``); ``query`` prints matching records as a table or as
JSON lines (exit 2 on an unreadable ``--since``/``--until``); ``verify`` prints the outcome
(as text or one JSON object) and exits 0 when the chain is intact, 1 naming the first
broken or missing record.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

import redis
from rich.console import Console
from rich.table import Table

from audit.chain import AuditRecord
from audit.log import STREAM, AuditLog, StoredRecord, parse_entry
from audit.query import AuditFilter, parse_when


def tail(client: redis.Redis, out: TextIO, *, last: int = 10, follow: bool = True,
         stream: str = STREAM, block_ms: int = 1000, stop: threading.Event | None = None,
         limit: int | None = None) -> int:
    """Print the last ``last`` records, then (``follow``) new ones until ``stop`` is set or
    ``limit`` records were printed after the backlog."""
    newest: list[Any] = list(client.xrevrange(stream, count=max(last, 1)) or [])
    for raw_id, values in reversed(newest[:last]):
        _print_entry(out, parse_entry(raw_id, values))
    cursor: Any = newest[0][0] if newest else "0-0"
    printed = 0
    while follow and not (stop is not None and stop.is_set()):
        if limit is not None and printed >= limit:
            break
        reply: list[Any] = list(client.xread({stream: cursor}, block=block_ms, count=100) or [])
        for _name, entries in reply:
            for raw_id, values in entries:
                cursor = raw_id
                _print_entry(out, parse_entry(raw_id, values))
                printed += 1
    return 0


def query(client: redis.Redis, out: TextIO, *, tenant: str | None = None,
          decision: str | None = None, user: str | None = None, since: str | None = None,
          until: str | None = None, as_json: bool = False, stream: str = STREAM,
          err: TextIO | None = None) -> int:
    """Print the records matching every given filter, oldest first."""
    try:
        selection = AuditFilter(
            tenant=tenant, decision=decision, user=user,
            since=parse_when(since) if since else None,
            until=parse_when(until) if until else None,
        )
    except ValueError as exc:
        (err or sys.stderr).write(f"error: {exc}\n")
        return 2
    log = AuditLog(client, stream=stream, out=out)
    entries = log.entries(selection.stream_start())
    found = selection.select(e.record for e in entries if e.record is not None)
    if as_json:
        for record in found:
            out.write(record.to_json() + "\n")
        return 0
    _print_table(out, list(found))
    return 0


def verify(client: redis.Redis, out: TextIO, *, stream: str = STREAM,
           as_json: bool = False) -> int:
    """Verify the chain in ``stream``; print the result (as text, or ``as_json`` one
    object: ``stream``, ``ok``, ``checked``, ``first_seq``, ``last_seq``, ``first_bad``
    and ``stream_id`` of the first broken record (null when intact or missing from the
    end), ``problem`` (empty when intact)); 0 if intact, else 1."""
    scan = AuditLog(client, stream=stream, out=out).scan()
    for _body in scan:
        pass
    result, entries = scan.result, scan.entries
    assert result is not None  # set once the scan is consumed
    broken_id = None
    if not result.ok and result.position is not None and result.position < len(entries):
        broken_id = entries[result.position].stream_id
    if as_json:
        out.write(json.dumps({
            "stream": stream, "ok": result.ok, "checked": result.checked,
            "first_seq": result.first_seq, "last_seq": result.last_seq,
            "first_bad": result.first_bad, "stream_id": broken_id, "problem": result.problem,
        }) + "\n")
    elif result.ok and result.checked == 0:
        out.write(f"OK: {stream} holds no audit records\n")
    elif result.ok:
        out.write(
            f"OK: {result.checked} records verified (seq {result.first_seq} to "
            f"{result.last_seq}); seq {result.first_seq}'s prev is the trusted anchor "
            f"(older records are removed by retention)\n"
        )
    else:
        where = f" (stream id {broken_id})" if broken_id is not None else ""
        seq = f"seq {result.first_bad}" if result.first_bad is not None else "the first record"
        out.write(f"BROKEN at {seq}{where}: {result.problem}\n")
    return 0 if result.ok else 1


def _print_entry(out: TextIO, entry: StoredRecord) -> None:
    if entry.record is not None:
        out.write(entry.record.to_json() + "\n")
    else:
        out.write(f'{{"stream_id":"{entry.stream_id}","error":"unreadable entry"}}\n')
    out.flush()


def _print_table(out: TextIO, records: list[AuditRecord]) -> None:
    table = Table(title=f"{len(records)} audit records", title_justify="left")
    for column in ("seq", "time", "decision", "tenant", "object", "class", "demand",
                   "user", "reason", "ms"):
        table.add_column(column, overflow="fold")
    for r in records:
        target = "/".join(part for part in (r.namespace, r.name) if part)
        table.add_row(str(r.seq), r.time, r.decision, r.tenant, target, r.pod_class,
                      r.demand, r.user, r.reason, f"{r.latency_ms:g}")
    Console(file=out, width=160, highlight=False, soft_wrap=False).print(table)
