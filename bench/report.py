"""``fairgate report`` over a large audit stream: time to verify and bill.

Run: python bench/report.py [--records 1000000] [--redis-url URL]

Starts a private redis-server (or uses ``--redis-url``, whose ``--stream`` must not
exist), writes ``--records`` audit records through the real :class:`audit.AuditLog`
(hash chain, Lua append; retention above the count): a month of pods of 8 tenants, each
pod as the webhook and dispatcher record it (``queue``, ``dispatch``, ``start``,
``release``; one in 50 also ``preempt``), with 1-8 whole GPUs or MIG slices on two
products, a ``capacity`` record every 2,000 records and a price change mid-month. Then
times, in the same run and on the same stream: the reference (the report's path before
the one-pass scan: :meth:`AuditLog.verify`, which builds every record, then
:func:`cost.billing.bill` over them; its bill must equal the report's),
``fairgate audit verify`` (read + verify the chain) and ``fairgate report --json``
(read + verify + bill + print), and
prints one JSON object: records, wall seconds, this process's CPU seconds and the Redis
server's CPU seconds of each (on a loaded machine wall time is mostly waiting for a
CPU), their ratios, the 1-minute load average, and what was billed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from audit import commands
from audit.chain import AuditRecord, format_time
from audit.log import AuditLog
from audit.usage import capacity_detail, preempt_detail, pricing_detail, start_detail
from cost.billing import bill
from cost.report import report_command
from fairshare.localredis import local_redis

MONTH = datetime(2026, 3, 1, tzinfo=UTC)
WINDOW = (MONTH, datetime(2026, 4, 1, tzinfo=UTC))
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


class _Clocks:
    """Wall time, this process's CPU and the Redis server's CPU between laps."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.last = self._now()

    def _now(self) -> tuple[float, float, float]:
        cpu: dict[str, Any] = self.client.info("cpu")
        return (time.perf_counter(), time.process_time(),
                float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))

    def lap(self) -> dict[str, float]:
        now = self._now()
        (wall, cpu, server), self.last = (b - a for a, b in zip(self.last, now, strict=True)), now
        return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "redis_cpu_s": round(server, 2)}


def stream_arguments(description: str, records: int, stream: str) -> argparse.Namespace:
    """The command line of a bench over a generated audit stream (``--records``,
    ``--redis-url``, ``--stream``, with these defaults)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", type=int, default=records)
    parser.add_argument("--redis-url")
    parser.add_argument("--stream", default=stream)
    return parser.parse_args()


def empty_stream(stack: ExitStack, args: argparse.Namespace) -> tuple[redis.Redis, AuditLog]:
    """A client on ``--redis-url`` (else a private redis-server kept open by ``stack``) and
    an audit log on ``--stream``, which must not exist, keeping twice ``--records``."""
    url = args.redis_url or stack.enter_context(local_redis())
    client = redis.Redis.from_url(url)
    if client.exists(args.stream):
        raise SystemExit(f"stream {args.stream} exists: pick another --stream")
    return client, AuditLog(client, stream=args.stream, maxlen=args.records * 2,
                            out=io.StringIO())


def main() -> None:
    args = stream_arguments(__doc__.splitlines()[0], 1_000_000, "bench:audit")
    with ExitStack() as stack:
        client, log = empty_stream(stack, args)
        started = time.perf_counter()
        written = len(log.record_many(drafts(args.records)))
        fill = time.perf_counter() - started

        clocks = _Clocks(client)
        result, entries = AuditLog(client, stream=args.stream).verify()
        assert result.ok
        old_bill = bill([e.record for e in entries if e.record is not None], *WINDOW)
        del entries
        reference = clocks.lap()

        assert commands.verify(client, io.StringIO(), stream=args.stream) == 0
        verify = clocks.lap()

        out = io.StringIO()
        code = report_command(client, out, since=WINDOW[0].isoformat(),
                              until=WINDOW[1].isoformat(),
                              output="json", stream=args.stream,
                              now=datetime(2026, 4, 2, tzinfo=UTC))
        report = clocks.lap()
        assert code == 0
        billed = json.loads(out.getvalue())
        assert billed["rows"] == old_bill.to_json()["rows"], "the two paths bill differently"
        client.delete(args.stream, args.stream + ":head")
    print(json.dumps({
        "records": written, "fill_s": round(fill, 1),
        "reference_verify_then_bill_records": reference, "verify": verify, "report": report,
        "report_over_reference_wall": round(report["wall_s"] / reference["wall_s"], 3),
        "report_over_reference_cpu": round(
            (report["cpu_s"] + report["redis_cpu_s"])
            / (reference["cpu_s"] + reference["redis_cpu_s"]), 3),
        "report_over_verify_wall": round(report["wall_s"] / verify["wall_s"], 3),
        "report_over_verify_cpu": round(
            (report["cpu_s"] + report["redis_cpu_s"])
            / (verify["cpu_s"] + verify["redis_cpu_s"]), 3),
        "load_average_1m": os.getloadavg()[0],
        "rows": len(billed["rows"]), "total_gpu_hours": round(billed["totals"]["gpu_hours"], 1),
        "total_cost": round(billed["totals"]["cost"], 2),
        "preempted_pods": billed["totals"]["preempted_pods"],
    }, indent=2))


if __name__ == "__main__":
    main()
