"""Benchmark: what the fairness numbers add to the dispatcher's status pass.

    python -m bench.fairness_snapshot                  # 10, 100, 1,000 tenants; 10,000 pods
    python -m bench.fairness_snapshot --tenants 1000 --pods 100000 --repeat 50

Per case: tenants configured as ``bench/dispatch.py`` does, then ``--pods`` pods admitted
round robin through the real ``FairQueue.admit`` (those that fit are reserved, the rest
queue). Then, alternated ``--repeat`` times on the same Redis: the old status pass
(``FairQueue.tenant_status()``) and the new one (``FairQueue.snapshot()``: ``status.lua``
and ``demand.lua`` in one MULTI/EXEC, plus ``snapshot_fairness``). Reported: median
client wall time of each, their ratio (the baseline is the old pass in the same run),
and the Redis time per pass (``INFO commandstats`` of FCALL_RO, the read-only
functions: how long Redis is busy, i.e. blocks other clients). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import redis

from bench.dispatch import PREFIX, clear, make_config, pods, server
from fairshare.queue.entitlement import snapshot_fairness
from fairshare.queue.fairqueue import FairQueue


def _function_usec(client: redis.Redis) -> float:
    stats = client.info("commandstats").get("cmdstat_fcall_ro", {})
    return float(stats.get("usec", 0))


def measure(client: redis.Redis, tenants: int, count: int, repeat: int) -> list[str]:
    """One table row: tenants, pods, old ms, new ms, ratio, Redis µs old, new."""
    clear(client)
    config, capacity, names = make_config(tenants)
    queue = FairQueue(client, prefix=PREFIX)
    queue.sync_config(config, capacity)
    queued = 0
    for req in pods(names, count, random.Random(tenants)):
        queued += queue.admit(req, 1.0).outcome == "queued"
    old_wall: list[float] = []
    new_wall: list[float] = []
    old_redis = new_redis = 0.0
    for _ in range(repeat):
        client.config_resetstat()
        start = time.perf_counter()
        queue.tenant_status()
        old_wall.append(time.perf_counter() - start)
        old_redis += _function_usec(client)
        client.config_resetstat()
        start = time.perf_counter()
        snapshot_fairness(queue.snapshot())
        new_wall.append(time.perf_counter() - start)
        new_redis += _function_usec(client)
    old, new = statistics.median(old_wall) * 1000, statistics.median(new_wall) * 1000
    return [f"{tenants:,}", f"{count:,} ({queued:,} queued)", f"{old:.2f}", f"{new:.2f}",
            f"{new / old:.2f}", f"{old_redis / repeat:.0f}", f"{new_redis / repeat:.0f}"]


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--redis-url", help="use this Redis (default: start one)")
    args = parser.parse_args(argv)
    print("| tenants | pods | tenant_status ms | snapshot + fairness ms | ratio "
          "| Redis µs old | Redis µs new |")
    print("|---|---|---|---|---|---|---|")
    with server(args.redis_url) as client:
        for tenants in args.tenants:
            print("| " + " | ".join(measure(client, tenants, args.pods, args.repeat)) + " |",
                  flush=True)
        clear(client)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
