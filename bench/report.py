"""``fairgate report`` over a large audit stream: time to verify and bill.

Run: python bench/report.py [--records 1000000] [--redis-url URL]

Starts a private redis-server (or uses ``--redis-url``, whose ``--stream`` must not
exist), writes ``--records`` audit records through the real :class:`audit.AuditLog`
(hash chain, Lua append; retention above the count): a month of pods of 8 tenants, each
pod as the webhook and dispatcher record it (``queue``, ``dispatch``, ``start``,
``release``; one in 50 also ``preempt``), with 1-8 whole GPUs or MIG slices on two
products, a ``capacity`` record every 2,000 records and a price change mid-month. Then
times, in the same run, the baseline ``fairgate audit verify`` (read + verify the chain)
and ``fairgate report --json`` (read + verify + bill + print) on the same stream, and
prints one JSON object: records, seconds of each, their ratio, and the rows billed.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from audit import commands
from audit.chain import AuditRecord, format_time
from audit.usage import capacity_detail, preempt_detail, pricing_detail, start_detail
from cost.report import report_command
from fairshare.localredis import local_redis

MONTH = datetime(2026, 3, 1, tzinfo=UTC)
PRODUCTS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3")
DEMANDS = ("gpu=1", "gpu=2", "gpu=4", "gpu=8", "mig-1g.10gb=1", "mig-3g.40gb=2")


def drafts(count: int, seed: int = 1) -> Iterator[AuditRecord]:
    """``count`` records spread evenly over March 2026, in time order."""
    rng = random.Random(seed)
    step = timedelta(days=30) / count
    i = 0

    def stamp() -> str:
        return format_time(MONTH + step * i)

    prices = {"pricing.currency": "USD", "pricing.gpuHour.default": 2.5,
              f"pricing.gpuHour.{PRODUCTS[0]}": 3.1}
    running: list[dict[str, Any]] = []
    yield AuditRecord("pricing", time=stamp(), diff=pricing_detail(None, prices))
    changed = False
    i = 1
    while i < count:
        if i % 2000 == 1:
            yield AuditRecord("capacity", time=stamp(), diff=capacity_detail(
                {"gpu": 512}, {"gpu": 512 + (i // 2000) % 3}))
        elif i >= count // 2 and not changed:
            changed = True
            yield AuditRecord("pricing", time=stamp(), diff=pricing_detail(
                prices, {**prices, "pricing.gpuHour.default": 2.8}))
        elif running and (len(running) > 400 or rng.random() < 0.5):
            pod = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.02:
                yield AuditRecord("preempt", time=stamp(), diff=preempt_detail(
                    pod["band"], 1800.0, "team-x-dev/infer"), **pod["fields"])
                i += 1
            yield AuditRecord("release", time=stamp(), reason="pod Succeeded",
                              **pod["fields"])
        else:
            n = i
            tenant = f"team-{rng.randrange(8)}"
            band = rng.choice(("training", "borrowed", "inference"))
            fields = {"uid": f"{n:08d}-0000-4000-8000-000000000000", "tenant": tenant,
                      "namespace": f"{tenant}-dev", "name": f"job-{n}",
                      "pod_class": "inference" if band == "inference" else "training",
                      "demand": rng.choice(DEMANDS)}
            yield AuditRecord("queue", time=stamp(), reason="waiting for its turn",
                              user="system:serviceaccount:x:y", operation="CREATE", **fields)
            yield AuditRecord("dispatch", time=stamp(), user="fairgate-dispatcher",
                              reason=f"released as {band} after 3.0s", **fields)
            yield AuditRecord("start", time=stamp(), reason="running on node gpu-1",
                              diff=start_detail(band, "gpu-1", rng.choice(PRODUCTS)),
                              **fields)
            i += 2
            running.append({"band": band, "fields": fields})
        i += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--redis-url")
    parser.add_argument("--stream", default="bench:audit")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.redis_url or stack.enter_context(local_redis())
        client = redis.Redis.from_url(url)
        if client.exists(args.stream):
            raise SystemExit(f"stream {args.stream} exists: pick another --stream")
        from audit.log import AuditLog

        started = time.perf_counter()
        log = AuditLog(client, stream=args.stream, maxlen=args.records * 2, out=io.StringIO())
        written = len(log.record_many(drafts(args.records)))
        fill = time.perf_counter() - started

        started = time.perf_counter()
        assert commands.verify(client, io.StringIO(), stream=args.stream) == 0
        verify_s = time.perf_counter() - started

        out = io.StringIO()
        started = time.perf_counter()
        code = report_command(client, out, since="2026-03-01", until="2026-04-01",
                              output="json", stream=args.stream,
                              now=datetime(2026, 4, 2, tzinfo=UTC))
        report_s = time.perf_counter() - started
        assert code == 0
        billed = json.loads(out.getvalue())
        client.delete(args.stream, args.stream + ":head")
    print(json.dumps({
        "records": written, "fill_s": round(fill, 1), "verify_s": round(verify_s, 2),
        "report_s": round(report_s, 2), "report_over_verify": round(report_s / verify_s, 3),
        "rows": len(billed["rows"]), "total_gpu_hours": round(billed["totals"]["gpu_hours"], 1),
        "total_cost": round(billed["totals"]["cost"], 2),
        "preempted_pods": billed["totals"]["preempted_pods"],
    }, indent=2))


if __name__ == "__main__":
    main()
