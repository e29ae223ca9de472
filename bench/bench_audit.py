"""Audit log throughput and verification cost against a private redis-server.

Run: python bench/bench_audit.py [--records N] [--writers W]
Prints one JSON object: single-writer records/s and per-record latency percentiles,
multi-process records/s, verify time for the stream,
Redis memory per stored record and Redis CPU per append (the Lua script's SHA-256 link).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import statistics
import time
from typing import Any

import redis

from audit.log import AuditLog
from fairshare.localredis import local_redis


def _record(log: AuditLog, i: int, writer: str) -> None:
    log.record("admit", uid=f"{writer}-{i:08d}-0000-0000-000000000000",
               user="system:serviceaccount:team-a-dev:trainer",
               groups=["system:serviceaccounts", "system:authenticated"], operation="CREATE",
               tenant="team-a", namespace="team-a-dev", name=f"train-{i}", pod_class="training",
               demand="gpu=1", reason="fits nominal quota", latency_ms=1.234)


def _writer(url: str, name: str, n: int, out: Any) -> None:
    client = redis.Redis.from_url(url)
    log = AuditLog(client, out=io.StringIO())
    start = time.perf_counter()
    for i in range(n):
        _record(log, i, name)
    out.put(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    results: dict[str, Any] = {"records": args.records, "writers": args.writers}
    with local_redis() as url:
        client = redis.Redis.from_url(url)
        log = AuditLog(client, out=io.StringIO())
        base_memory = int(client.info("memory")["used_memory"])
        latencies = []
        start = time.perf_counter()
        for i in range(args.records):
            t0 = time.perf_counter()
            _record(log, i, "single")
            latencies.append((time.perf_counter() - t0) * 1e6)
        elapsed = time.perf_counter() - start
        latencies.sort()
        results["single_writer"] = {
            "records_per_s": round(args.records / elapsed),
            "p50_us": round(statistics.median(latencies)),
            "p99_us": round(latencies[int(len(latencies) * 0.99)]),
        }
        used = int(client.info("memory")["used_memory"]) - base_memory
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        results["redis_script_us_per_record"] = stats.get("usec_per_call")
        results["redis_bytes_per_record"] = round(used / args.records)
        t0 = time.perf_counter()
        verdict, _ = log.verify()
        results["verify"] = {"ok": verdict.ok, "records": verdict.checked,
                             "seconds": round(time.perf_counter() - t0, 3)}

        client.flushall()
        per_writer = args.records // args.writers
        queue: Any = multiprocessing.get_context("spawn").Queue()
        procs = [multiprocessing.get_context("spawn").Process(
            target=_writer, args=(url, f"w{w}", per_writer, queue)) for w in range(args.writers)]
        t0 = time.perf_counter()
        for proc in procs:
            proc.start()
        outcomes = [queue.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
        wall = time.perf_counter() - t0
        verdict, _ = AuditLog(client, out=io.StringIO()).verify()
        results["concurrent"] = {
            "records_per_s": round(per_writer * args.writers / max(outcomes)),
            "wall_s_incl_spawn": round(wall, 2),
            "chain_ok": verdict.ok,
            "records": verdict.checked,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
