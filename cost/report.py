"""``fairgate report``: chargeback from the verified audit log.

Contract: :func:`report_command` verifies the hash chain of the audit stream first and
refuses (exit 1, the reason on ``err``) when it does not verify; otherwise it bills the
window (:func:`cost.billing.bill`) and prints a table per tenant and class (rich), CSV or
JSON on ``out``, exit 0. ``since``/``until`` are RFC 3339 times, dates (UTC midnight) or
ages (``7d``); the default window is this calendar month (UTC) so far; ``until`` is
never later than now: a later one is cut back to now, with a note on ``err``. A bad time
is exit 2. When retention removed records the window needs (the oldest record left is
younger than ``since``), the bill is marked incomplete: a warning (under the table; on
``err`` with CSV and JSON) and ``complete: false`` in JSON. Retention is by the stream's
append time (``--audit-retention`` of serve and dispatch): keep it above the longest window
billed plus the longest pod run, since a pod whose ``start`` record was trimmed
is not billed at all.
CSV rows: one per tenant and class, then ``total``, then ``(idle)`` (the cluster's
capacity not used, with its cost at the default price; empty when unknown).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal, TextIO

import redis
from rich.console import Console
from rich.table import Table

from audit.log import STREAM, AuditLog
from audit.query import parse_when
from cost.billing import Bill, BillRow, bill_bodies
from tenants.models import PricingSpec
from tenants.tables import tenant_table

Format = Literal["table", "csv", "json"]
COLUMNS = ("tenant", "class", "gpu_hours", "borrowed_gpu_hours", "cost", "preempted_pods",
           "preempted_gpu_hours", "reclaimed_pods", "reclaimed_gpu_hours", "idle_gpu_hours",
           "idle_cost", "total_cost")


def month_start(now: datetime) -> datetime:
    """Midnight UTC of the first day of ``now``'s month."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def window(since: str | None, until: str | None,
           now: datetime | None = None) -> tuple[datetime, datetime]:
    """The report window from the CLI's values (see the module contract); raises
    ValueError saying what is wrong."""
    moment = now or datetime.now(UTC)
    start = parse_when(since, moment) if since else month_start(moment)
    end = min(parse_when(until, moment), moment) if until else moment
    if end <= start:
        raise ValueError(f"the window is empty: --since {start.isoformat()} is not before "
                         f"--until {end.isoformat()} (the report never bills the future)")
    return start, end


def report_command(client: redis.Redis, out: TextIO, *, since: str | None = None,
                   until: str | None = None, output: Format = "table",
                   share_idle: bool = False, pricing: PricingSpec | None = None,
                   now: datetime | None = None, stream: str = STREAM,
                   err: TextIO | None = None) -> int:
    """Verify, bill and print (see the module contract); returns the exit code."""
    errors = err or sys.stderr
    moment = now or datetime.now(UTC)
    try:
        start, end = window(since, until, moment)
        if until and parse_when(until, moment) > moment:
            errors.write(f"note: --until {until} is in the future: the report is cut back "
                         f"to now ({_text(moment)}); the future is not billed\n")
    except ValueError as exc:
        errors.write(f"error: {exc}\n")
        return 2
    scan = AuditLog(client, stream=stream, out=out).scan()
    billed = bill_bodies(scan, start, end, pricing, share_idle=share_idle)
    result = scan.result
    assert result is not None  # set once the scan is consumed
    if not result.ok:
        errors.write(f"refusing to bill: the audit log {stream} does not verify: "
                     f"{result.problem} (run `fairgate audit verify` for details)\n")
        return 1
    warnings = []
    if result.first_seq not in (None, 1) and scan.oldest > _text(start):
        warnings.append(f"records before {scan.oldest} were removed by retention "
                        f"(oldest kept: seq {result.first_seq}): pods that started earlier "
                        f"are missing, so this bill is incomplete")
    if output != "table":  # the table prints them under the bill
        for warning in warnings:
            errors.write(f"warning: {warning}\n")
    if output == "json":
        data = billed.to_json()
        data.update(records=result.checked, complete=not warnings, warnings=warnings)
        out.write(json.dumps(data, indent=2) + "\n")
    elif output == "csv":
        write_csv(billed, out)
    else:
        print_table(billed, out, warnings, result.checked)
    return 0


def _text(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _values(row: BillRow, tenant: str, pod_class: str) -> list[str]:
    return [tenant, pod_class, f"{row.gpu_hours:.4f}", f"{row.borrowed_gpu_hours:.4f}",
            f"{row.cost:.2f}", str(row.preempted_pods), f"{row.preempted_gpu_hours:.4f}",
            str(row.reclaimed_pods), f"{row.reclaimed_gpu_hours:.4f}",
            f"{row.idle_gpu_hours:.4f}", f"{row.idle_cost:.2f}",
            f"{row.cost + row.idle_cost:.2f}"]


def write_csv(billed: Bill, out: TextIO) -> None:
    """The bill as CSV (:data:`COLUMNS`): rows, ``total``, ``(idle)``."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in billed.rows:
        writer.writerow(_values(row, row.tenant, row.pod_class))
    writer.writerow(_values(billed.totals(), "total", ""))
    idle = billed.idle_gpu_hours
    writer.writerow(["(idle)", "", "" if idle is None else f"{idle:.4f}", "",
                     "" if billed.idle_cost is None else f"{billed.idle_cost:.2f}",
                     "", "", "", "", "", "", ""])


def bill_tables(billed: Bill, title: str = "") -> list[Table]:
    """The bill as rich tables that fit 80 columns (the demo reuses them), each per tenant
    and class with a totals row: GPU hours and cost, then work lost to preemption and
    reclaim, then with
    ``share_idle`` the idle capacity's shares and the total cost."""
    bill = tenant_table(
        title or f"GPU cost, {_text(billed.since)} to {_text(billed.until)} "
        f"({billed.currency})", ("tenant", "class", "GPU-h", "borrowed GPU-h", "cost"),
        caption="GPU-h: GPU-equivalent hours", names=2)
    preempted = tenant_table("preempted and reclaimed pods",
                             ("tenant", "class", "preempted pods", "lost GPU-h",
                              "reclaimed pods", "reclaimed GPU-h"),
                             caption="lost GPU-h, reclaimed GPU-h: what those pods had run",
                             names=2)
    idle = tenant_table(f"idle capacity shared in proportion to use ({billed.currency})",
                        ("tenant", "class", "idle GPU-h share", "idle cost share",
                         "total cost"), names=2)

    def add(row: BillRow, tenant: str, pod_class: str, style: str | None = None) -> None:
        bill.add_row(tenant, pod_class, f"{row.gpu_hours:,.2f}",
                     f"{row.borrowed_gpu_hours:,.2f}", f"{row.cost:,.2f}", style=style)
        preempted.add_row(tenant, pod_class, str(row.preempted_pods),
                          f"{row.preempted_gpu_hours:,.2f}", str(row.reclaimed_pods),
                          f"{row.reclaimed_gpu_hours:,.2f}", style=style)
        idle.add_row(tenant, pod_class, f"{row.idle_gpu_hours:,.2f}", f"{row.idle_cost:,.2f}",
                     f"{row.cost + row.idle_cost:,.2f}", style=style)

    for row in billed.rows:
        add(row, row.tenant, row.pod_class)
    for table in (bill, preempted, idle):
        table.add_section()
    add(billed.totals(), "total", "", "bold")
    return [bill, preempted, idle] if billed.share_idle else [bill, preempted]


def idle_line(billed: Bill) -> str:
    """The cluster's capacity and idle GPU hours in words."""
    if billed.idle_gpu_hours is None or billed.capacity_gpu_hours is None:
        return ("idle GPU-h: unknown (no capacity record from the dispatcher before the "
                "end of the window)")
    cost = f", {billed.idle_cost:,.2f} {billed.currency} at the default price" \
        if billed.idle_cost else ""
    return (f"capacity {billed.capacity_gpu_hours:,.2f} GPU-h, idle "
            f"{billed.idle_gpu_hours:,.2f} GPU-h{cost}"
            + (" (shared in proportion to use)" if billed.share_idle else ""))


def print_table(billed: Bill, out: TextIO, warnings: Sequence[str], records: int,
                width: int | None = None) -> None:
    """The bill as tables, the idle line, and warnings, ``width`` columns wide (default:
    the terminal's, ``$COLUMNS``, else 80)."""
    console = Console(file=out, width=width, highlight=False, soft_wrap=False)
    for table in bill_tables(billed):
        console.print(table)
    console.print(idle_line(billed))
    console.print(f"from {records} verified audit records")
    for warning in warnings:
        console.print(f"warning: {warning}")
