"""Benchmark: cost of one dispatch decision and Redis memory per queued pod.

For each (tenants, queued pods) point of a 10x grid it starts from an empty Redis,
configures the tenants, fills the cluster with running pods through the real
``FairQueue.admit`` (the webhook's path) until 200 pods in a row have to queue,
queues the backlog through the same path, and then repeats: one running pod ends
(``release``, untimed), one ``dispatch(limit=1)`` decision (timed, client side,
including the loopback round trip). Memory per queued pod is the ``used_memory``
delta of queueing the backlog divided by its size.

``--half-life S`` sets ``fairShare.usageHalfLife`` (default 0: not set, the default
order, virtual time) so the decayed-usage path is timed: a decision then computes the
current score of each ready-set member it walks and writes the ones that rose back (``best_of`` in
``fairshare/queue/scripts/lib_order.lua``). The clock advances 1 ms per decision and the release
before it gets the same clock, as in ``bench/instructions.py dispatch``.

    python bench/dispatch.py                      # full grid, own redis-server
    python bench/dispatch.py --tenants 10 100 --queued 1000 --json out.json
    python bench/dispatch.py --tenants 1000 --queued 100000 --half-life 3600
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.models import FairgateConfig, FairShareSpec, PlatformConfig, PodClass, QuotaSpec
from tenants.resources import ResourceCounts

PREFIX = "bench:"
# (share of pods, class, demand): a mix of whole-GPU and MIG pods, 10% inference
MIX: list[tuple[float, PodClass, ResourceCounts]] = [
    (0.40, "training", {"gpu": 1}),
    (0.15, "training", {"gpu": 2}),
    (0.05, "training", {"gpu": 8}),
    (0.15, "training", {"mig-1g.5gb": 1}),
    (0.15, "training", {"mig-3g.40gb": 1}),
    (0.05, "inference", {"gpu": 1}),
    (0.05, "inference", {"mig-1g.5gb": 1}),
]


@dataclass
class Point:
    tenants: int
    queued: int
    half_life_s: float
    decisions: int
    released: int
    dispatch_p50_ms: float
    dispatch_p99_ms: float
    admit_p50_ms: float
    bytes_per_queued_pod: float


def make_config(tenants: int) -> tuple[FairgateConfig, ResourceCounts, list[str]]:
    names = [f"team-{i:04d}" for i in range(tenants)]
    platform = PlatformConfig.model_validate({
        "tenants": {n: {"weight": 1 + i % 4, "ceiling": {"gpuEquivalents": 10_000}}
                    for i, n in enumerate(names)},
    })
    quota = QuotaSpec.model_validate({
        "nominal": {"gpu": 64, "mig-1g.5gb": 56, "mig-3g.40gb": 16},
        "borrowLimit": {"gpuEquivalents": 16},
        "inferenceReserve": {"gpuEquivalents": 2},
    })
    config = FairgateConfig(platform=platform, quotas={n: quota for n in names})
    capacity = {"gpu": 512, "mig-1g.5gb": 448, "mig-3g.40gb": 128}
    return config, capacity, names


def with_half_life(config: FairgateConfig, half_life: float) -> FairgateConfig:
    """``config`` with ``fairShare.usageHalfLife`` = ``half_life`` seconds (0: unchanged,
    the default order: virtual time). Also used by ``bench/instructions.py dispatch
    --half-life``."""
    if not half_life:
        return config
    fair_share = FairShareSpec.model_validate({"usageHalfLife": half_life})
    return replace(config, platform=config.platform.model_copy(
        update={"fair_share": fair_share}))


def pod_uid(ticket: str) -> str:
    """The uid the benchmarks give the pod of ``ticket`` (it binds the ticket)."""
    return f"uid-{ticket}"


def pods(names: list[str], count: int, rng: random.Random) -> Iterator[PodRequest]:
    weights = [share for share, _, _ in MIX]
    for i in range(count):
        tenant = names[i % len(names)]
        _, pod_class, demand = rng.choices(MIX, weights)[0]
        yield PodRequest(
            ticket=str(uuid.UUID(int=rng.getrandbits(128))), tenant=tenant,
            namespace=f"{tenant}-ml", name=f"{pod_class[:5]}-{i:07d}-{rng.randrange(16**5):05x}",
            pod_class=pod_class, demand=dict(demand), submitted_at=1.0 + i * 1e-6,
        )


@contextmanager
def server(url: str | None) -> Iterator[redis.Redis]:
    if url is not None:
        client = redis.Redis.from_url(url)
        yield client
        client.close()
        return
    with local_redis() as own:
        client = redis.Redis.from_url(own)
        yield client
        client.close()


def clear(client: redis.Redis) -> None:
    keys = list(client.scan_iter(match=PREFIX + "*", count=10_000))
    for i in range(0, len(keys), 10_000):
        client.delete(*keys[i : i + 10_000])


def measure(client: redis.Redis, tenants: int, queued: int, decisions: int,
            half_life: float = 0.0) -> Point:
    clear(client)
    rng = random.Random(tenants * 1_000_003 + queued)
    config, capacity, names = make_config(tenants)
    config = with_half_life(config, half_life)
    queue = FairQueue(client, prefix=PREFIX)
    queue.sync_config(config, capacity)
    running: list[str] = []
    stream = pods(names, 10**9, rng)
    # fill the cluster: pods that reserve run, until 200 pods in a row had to queue
    in_a_row = 0
    for req in stream:
        if queue.admit(req, 1.0).outcome == "reserved":
            queue.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)
            running.append(req.ticket)
            in_a_row = 0
        else:
            queue.remove(req.ticket, pod_uid(req.ticket))
            in_a_row += 1
            if in_a_row == 200:
                break
    # the backlog: only what it adds is counted
    memory_before = int(client.info("memory")["used_memory"])
    admit_times: list[float] = []
    queued_count = 0
    for req in stream:
        start = time.perf_counter()
        answer = queue.admit(req, 1.0)
        admit_times.append(time.perf_counter() - start)
        if answer.outcome == "reserved":
            # rare once the cluster is full: keep it as it is
            queue.release(req.ticket, pod_uid(req.ticket))
            continue
        queued_count += 1
        if queued_count == queued:
            break
    memory_after = int(client.info("memory")["used_memory"])
    times: list[float] = []
    released = 0
    for step in range(decisions):
        ticket = running.pop(rng.randrange(len(running)))
        now = 2.0 + step * 1e-3  # with a half-life, decayed usage decays between decisions
        queue.release(ticket, pod_uid(ticket), now)
        start = time.perf_counter()
        got = queue.dispatch(now, 1)
        times.append(time.perf_counter() - start)
        released += len(got)
        running += [r.ticket for r in got]
    times.sort()
    return Point(
        tenants=tenants,
        queued=queued,
        half_life_s=half_life,
        decisions=decisions,
        released=released,
        dispatch_p50_ms=round(statistics.median(times) * 1000, 3),
        dispatch_p99_ms=round(times[int(len(times) * 0.99)] * 1000, 3),
        admit_p50_ms=round(statistics.median(admit_times) * 1000, 3),
        bytes_per_queued_pod=round((memory_after - memory_before) / queued, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--queued", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--half-life", type=float, default=0.0, metavar="SECONDS",
                        help="fairShare.usageHalfLife in seconds (default 0: not set, "
                        "virtual time); times the decayed-usage walk of the ready sets, whose "
                        "current scores a decision computes and writes back")
    parser.add_argument("--redis-url", help="use this Redis (keys under 'bench:' are "
                        "deleted) instead of starting a private redis-server")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    points: list[Point] = []
    header = (f"{'tenants':>8} {'queued':>8} {'decisions':>9} {'released':>8} "
              f"{'p50 ms':>8} {'p99 ms':>8} {'admit p50':>9} {'B/pod':>7}")
    if args.half_life:
        print(f"usage half-life {args.half_life:g} s")
    print(header)
    with server(args.redis_url) as client:
        version = client.info("server")["redis_version"]
        for tenants in args.tenants:
            for queued in args.queued:
                p = measure(client, tenants, queued, args.decisions, args.half_life)
                points.append(p)
                print(f"{p.tenants:>8} {p.queued:>8} {p.decisions:>9} {p.released:>8} "
                      f"{p.dispatch_p50_ms:>8.3f} {p.dispatch_p99_ms:>8.3f} "
                      f"{p.admit_p50_ms:>9.3f} {p.bytes_per_queued_pod:>7.1f}", flush=True)
        clear(client)
    result = {"redis_version": version, "points": [asdict(p) for p in points]}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
