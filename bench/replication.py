"""Benchmark: what "acknowledged means replicated" costs an admission, and what loading
the queue's function library costs the call that finds it missing.

Starts a primary and one linked replica (own redis-server processes on loopback) and
times, client side, the webhook's admission call (``AsyncFairQueue.admit``, one
``FCALL``, asyncio, the loopback round trip included) on the same primary:

- ``plain``: the call alone (a standalone Redis, ``replicas=0``);
- ``wait``: the call, then ``WAIT 1`` on the same connection (``replicas=1``, what a
  ``redis+sentinel://`` target does);
- ``reload``: the first call after ``FUNCTION FLUSH`` (as on a Redis restarted empty:
  FCALL answers "Function not found", the client loads the library with ``FUNCTION
  LOAD`` and calls again), against the next call. A promoted replica does not need
  this: functions replicate.

Rounds alternate plain and wait batches, so both see the same machine load; the result
is the ratio of medians (and of p99s) in the same run.

    python bench/replication.py                 # 20 rounds x 200 admissions each
    python bench/replication.py --rounds 5 --batch 100 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairshare.localredis import local_redis
from fairshare.queue.fastpath import AsyncFairQueue
from fairshare.queue.model import PodRequest
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec

PREFIX = "bench:"


def _config() -> FairgateConfig:
    platform = PlatformConfig.model_validate(
        {"tenants": {"team-a": {"weight": 1, "ceiling": {"gpuEquivalents": 10**6}}},
         "capacity": {"gpu": 10**6}})
    quota = QuotaSpec.model_validate({"nominal": {"gpu": 10**6}})
    return FairgateConfig(platform=platform, quotas={"team-a": quota})


def _request(n: int) -> PodRequest:
    return PodRequest(ticket=f"t{n}", tenant="team-a", namespace="ns", name=f"p{n}",
                      pod_class="training", demand={"gpu": 1}, submitted_at=float(n))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(url: str, rounds: int, batch: int) -> dict[str, list[float]]:
    client = redis.asyncio.Redis.from_url(url)
    plain = AsyncFairQueue(client, prefix=PREFIX)
    waiting = AsyncFairQueue(client, prefix=PREFIX, replicas=1)
    await plain.sync_config(_config(), None)
    times: dict[str, list[float]] = {"plain": [], "wait": [], "reload": [], "loaded": []}
    n = 0
    for _ in range(rounds):
        for name, queue in (("plain", plain), ("wait", waiting)):
            for _ in range(batch):
                n += 1
                started = time.perf_counter()
                await queue.admit(_request(n), float(n))
                times[name].append(time.perf_counter() - started)
        await client.function_flush()
        for name in ("reload", "loaded"):
            n += 1
            started = time.perf_counter()
            await plain.admit(_request(n), float(n))
            times[name].append(time.perf_counter() - started)
    await client.aclose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with local_redis() as primary, local_redis() as replica_url:
        replica = redis.Redis.from_url(replica_url)
        port = int(primary.rsplit(":", 1)[1].split("/")[0])
        replica.replicaof("127.0.0.1", port)
        while replica.info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        times = asyncio.run(_measure(primary, args.rounds, args.batch))
        replica.close()
    result = {}
    for name, values in times.items():
        result[name] = {"p50_ms": statistics.median(values) * 1000,
                        "p99_ms": _percentile(values, 0.99) * 1000, "n": len(values)}
    result["wait_vs_plain"] = {
        "p50": result["wait"]["p50_ms"] / result["plain"]["p50_ms"],
        "p99": result["wait"]["p99_ms"] / result["plain"]["p99_ms"]}
    result["reload_vs_loaded"] = {"p50": result["reload"]["p50_ms"] /
                                  result["loaded"]["p50_ms"]}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
