"""The dispatcher's budget pass over a full audit stream: what month-to-date spend costs.

Run: python bench/budget.py [--records 100000] [--redis-url URL]

Starts a private redis-server (or uses ``--redis-url``, whose ``--stream`` must not exist)
and writes ``--records`` audit records (default: the stream's retention, 100,000) of a
month of pods through the real :class:`audit.AuditLog`, the same history as
``bench/report.py``. Then times, in the same run: the baseline ``AuditLog.verify()`` (what
``fairgate report`` does before billing), the first budget pass of a freshly started
dispatcher (:class:`cost.budget.AuditSpend` reads the whole stream and bills the month),
and a later pass after 1,000 more records (it reads only those, then bills again). Prints
one JSON object with wall, CPU and Redis CPU seconds of each, the ratios to the baseline,
the records the pass keeps and how much this process grew holding them,
the 1-minute load average, and whether the spend equals the report's bill to the cent.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from report import MONTH, _Clocks, drafts, empty_stream, stream_arguments

from cost.billing import bill
from cost.budget import AuditSpend


def _rss_mb() -> float:
    """This process's resident memory in MiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    args = stream_arguments(__doc__.splitlines()[0], 100_000, "bench:budget")
    with ExitStack() as stack:
        client, log = empty_stream(stack, args)
        log.record_many(drafts(args.records))
        until = MONTH + timedelta(days=30)

        clocks = _Clocks(client)
        result, entries = log.verify()
        verify = clocks.lap()
        assert result.ok

        del entries  # keep only what the budget pass itself holds
        rss_before = _rss_mb()
        spend = AuditSpend(log)
        first, currency = spend.spent(MONTH, until, None)
        first_pass = clocks.lap()
        kept_mb = _rss_mb() - rss_before

        # what arrives between two passes: other pods (uids of their own)
        log.record_many(replace(d, uid="f" + d.uid[1:] if d.uid else d.uid)
                        for d in drafts(1_000, seed=2))
        clocks.lap()
        later, _ = spend.spent(MONTH, until, None)
        later_pass = clocks.lap()

        records = [e.record for e in log.entries() if e.record is not None]
        reported = bill(records, MONTH, until).rows
        by_tenant: dict[str, float] = {}
        for row in reported:
            by_tenant[row.tenant] = by_tenant.get(row.tenant, 0.0) + row.cost
        client.delete(args.stream, args.stream + ":head")
    print(json.dumps({
        "records": args.records, "verify": verify, "first_pass": first_pass,
        "later_pass_after_1000_records": later_pass,
        "first_over_verify_cpu": round(
            (first_pass["cpu_s"] + first_pass["redis_cpu_s"])
            / (verify["cpu_s"] + verify["redis_cpu_s"]), 3),
        "later_over_verify_cpu": round(
            (later_pass["cpu_s"] + later_pass["redis_cpu_s"])
            / (verify["cpu_s"] + verify["redis_cpu_s"]), 3),
        "load_average_1m": os.getloadavg()[0],
        "rss_growth_mb_first_pass": round(kept_mb, 1), "kept_records": spend.kept(),
        "tenants": len(first), "currency": currency,
        "month_spend": round(sum(later.values()), 2),
        "equals_report_to_the_cent": all(
            round(later.get(t, 0.0), 2) == round(c, 2) for t, c in by_tenant.items()),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }, indent=2))


if __name__ == "__main__":
    main()
