"""Webhook memory (RSS) idle and under load, and Redis bytes per queued pod.

Run (from the repository root):

    python -m bench.memory                 # table + JSON
    python -m bench.memory --duration 30 --workers 2

What it does: starts the real ``fairgate serve`` (``--workers 1``) or the bench server of
:mod:`bench.admission` (``--workers N``, N > 1) on loopback with a private
``redis-server``; samples every server process's ``VmRSS`` at idle, then while ``wrk``
loads ``/mutate`` at saturation (fast path, then queue path); reports idle, peak and
after-load RSS per worker against the 150 MB target. Redis bytes per queued pod: Redis
``used_memory`` before and after the queue-path load, minus what the audit stream grew
by (``MEMORY USAGE fairgate:audit``, reported on its own per record), divided by the
number of pods queued.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.admission import (
    BenchEnvironment,
    LoadPlan,
    Server,
    machine,
    quiesce,
    reset_redis,
    run_wrk,
    scenarios,
)
from fairshare.queue.fairqueue import FairQueue

TARGET_RSS_MB = 150.0
AUDIT_STREAM = "fairgate:audit"


def rss_mb(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker_pids(server: Server, workers: int) -> list[int]:
    """The processes that serve requests (the workers, or the only process)."""
    pids = server.pids()
    return pids[1:] if workers > 1 else pids[:1]


class Sampler:
    """Samples the RSS of some processes every ``interval`` seconds in a thread."""

    def __init__(self, pids: Sequence[int], interval: float = 0.2) -> None:
        self.pids = list(pids)
        self.interval = interval
        self.peak = {pid: 0.0 for pid in self.pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], rss_mb(pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _audit_bytes(env: BenchEnvironment) -> int:
    used = env.redis.memory_usage(AUDIT_STREAM, samples=0)
    return int(used or 0)


def measure(env: BenchEnvironment, server: Server, workers: int, plan: LoadPlan
            ) -> dict[str, Any]:
    """RSS idle / under load per worker, and Redis bytes per queued pod."""
    pids = worker_pids(server, workers)
    loads = {s.name: s for s in scenarios(server)}
    time.sleep(2.0)
    idle = {pid: rss_mb(pid) for pid in pids}
    result: dict[str, Any] = {"workers": workers, "idle_mb": max(idle.values())}
    for name in ("mutate-fast", "mutate-queue"):
        reset_redis(env, server)
        before_memory = int(env.redis.info("memory")["used_memory"])
        before_audit = _audit_bytes(env)
        with Sampler(pids) as sampler:
            load = run_wrk(server, loads[name], rate=0, duration=plan.duration,
                           connections=plan.saturation_connections, threads=plan.threads,
                           workdir=env.workdir)
            quiesce(env)
        result[name] = {"requests": load.requests, "rps": load.rps,
                        "peak_mb": round(max(sampler.peak.values()), 1),
                        "after_mb": round(max(rss_mb(pid) for pid in pids), 1)}
        if name == "mutate-queue":
            queued = sum(s.queued["training"] for s in FairQueue(env.redis).tenant_status())
            audit = _audit_bytes(env) - before_audit
            records = int(env.redis.xlen(AUDIT_STREAM))
            grown = int(env.redis.info("memory")["used_memory"]) - before_memory
            result["redis"] = {
                "queued_pods": queued,
                "bytes_per_queued_pod": round((grown - audit) / queued) if queued else None,
                "audit_records": records,
                "audit_bytes_per_record": round(audit / records) if records else None,
            }
    result["target_mb"] = TARGET_RSS_MB
    result["met"] = max(result[n]["peak_mb"] for n in ("mutate-fast", "mutate-queue")) \
        <= TARGET_RSS_MB
    return result


def _table(result: dict[str, Any]) -> str:
    lines = ["| workers | idle MB | load | req/s | peak MB/worker | after MB | target |",
             "|---|---|---|---|---|---|---|"]
    for name in ("mutate-fast", "mutate-queue"):
        row = result[name]
        lines.append(f"| {result['workers']} | {result['idle_mb']:.1f} | {name} saturation | "
                     f"{row['rps']:.0f} | {row['peak_mb']:.1f} | {row['after_mb']:.1f} | "
                     f"<= {TARGET_RSS_MB:.0f} MB: {'met' if result['met'] else 'MISSED'} |")
    redis_row = result["redis"]
    lines += ["", "| queued pods | Redis bytes / queued pod | audit records | "
              "audit bytes / record |", "|---|---|---|---|",
              f"| {redis_row['queued_pods']} | {redis_row['bytes_per_queued_pod']} | "
              f"{redis_row['audit_records']} | {redis_row['audit_bytes_per_record']} |"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.memory [--duration S] [--workers N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per load (20)")
    parser.add_argument("--connections", type=int, default=32, help="connections (32)")
    parser.add_argument("--workers", type=int, default=1,
                        help="1: the real `fairgate serve`; N > 1: the bench server (1)")
    args = parser.parse_args(argv)
    plan = LoadPlan(duration=args.duration, saturation_connections=args.connections)
    with ExitStack() as stack:
        env = BenchEnvironment(stack)
        if args.workers == 1:
            server = stack.enter_context(env.fairgate_serve())
        else:
            server = stack.enter_context(env.bench_server(args.workers))
        result = measure(env, server, args.workers, plan)
    print(_table(result))
    print()
    print(json.dumps({"machine": machine(), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
