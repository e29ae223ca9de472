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

``--reclaim`` turns ``fairShare.reclaim`` on (``after`` 0 s, ``minRuntime`` 0 s,
``perHour`` 1000, every running pod preemptible) and also times, after each decision, the
dispatcher's reclaim check (``fairshare.dispatcher.reclaim_check``: the owed head, the
tenants' standings from a queue snapshot, the victims among the running pods of the
dispatcher's pod map, which holds every queued pod as well). Reclaim is not part of a
decision: the dispatcher makes the check every 10 s, or when one is due.

    python bench/dispatch.py                      # full grid, own redis-server
    python bench/dispatch.py --tenants 10 100 --queued 1000 --json out.json
    python bench/dispatch.py --tenants 1000 --queued 100000 --half-life 3600
    python bench/dispatch.py --tenants 10000 --queued 1000000 --decisions 500 --reclaim
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

from fairshare.cluster.cluster import GpuPod, PodRef
from fairshare.dispatcher import reclaim_check
from fairshare.localredis import local_redis
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.models import (
    FairgateConfig,
    FairShareSpec,
    PlatformConfig,
    PodClass,
    QuotaSpec,
    ReclaimSpec,
)
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
    reclaim_p50_ms: float | None = None
    reclaim_p99_ms: float | None = None


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


RECLAIM = ReclaimSpec.model_validate({"after": 0, "minRuntime": 0, "perHour": 1000})


def with_reclaim(config: FairgateConfig) -> FairgateConfig:
    """``config`` with :data:`RECLAIM` as ``fairShare.reclaim``."""
    fair_share = config.platform.fair_share.model_copy(update={"reclaim": RECLAIM})
    return replace(config, platform=config.platform.model_copy(
        update={"fair_share": fair_share}))


def gpu_pod(req: PodRequest, running: bool) -> GpuPod:
    """The dispatcher's view of the pod of ``req``: running (preemptible) or gated."""
    return GpuPod(
        ref=PodRef(req.namespace, req.name), uid=pod_uid(req.ticket), ticket=req.ticket,
        tenant=req.tenant, pod_class=req.pod_class,
        band="inference" if req.pod_class == "inference" else "training",
        demand=req.demand, group=None, group_size=1,
        phase="Running" if running else "Pending", gated=not running, node=None,
        created=req.submitted_at, started_at=0.0 if running else None, preemptible=running)


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
            half_life: float = 0.0, reclaim: bool = False) -> Point:
    clear(client)
    rng = random.Random(tenants * 1_000_003 + queued)
    config, capacity, names = make_config(tenants)
    config = with_half_life(config, half_life)
    if reclaim:
        config = with_reclaim(config)
    # the dispatcher's pod map, kept only with --reclaim (the reclaim check reads it)
    pod_map: dict[str, GpuPod] = {}
    started: dict[str, float] = {}
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
            if reclaim:
                pod_map[req.ticket] = gpu_pod(req, running=True)
                started[req.ticket] = 0.0
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
        if reclaim:
            pod_map[req.ticket] = gpu_pod(req, running=False)
        if queued_count == queued:
            break
    memory_after = int(client.info("memory")["used_memory"])
    times: list[float] = []
    checks: list[float] = []
    released = 0
    for step in range(decisions):
        ticket = running.pop(rng.randrange(len(running)))
        now = 2.0 + step * 1e-3  # with a half-life, decayed usage decays between decisions
        queue.release(ticket, pod_uid(ticket), now)
        pod_map.pop(ticket, None)
        start = time.perf_counter()
        got = queue.dispatch(now, 1)
        times.append(time.perf_counter() - start)
        released += len(got)
        running += [r.ticket for r in got]
        if reclaim:
            for r in got:
                pod_map[r.ticket] = replace(pod_map[r.ticket], phase="Running", gated=False,
                                            started_at=now, preemptible=True)
                started[r.ticket] = now
            start = time.perf_counter()
            reclaim_check(queue, pod_map, started, {}, RECLAIM, now, [])
            checks.append(time.perf_counter() - start)
    times.sort()
    checks.sort()
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
        reclaim_p50_ms=round(statistics.median(checks) * 1000, 3) if checks else None,
        reclaim_p99_ms=round(checks[int(len(checks) * 0.99)] * 1000, 3) if checks else None,
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
    parser.add_argument("--reclaim", action="store_true",
                        help="turn fairShare.reclaim on and also time the dispatcher's "
                        "reclaim check after each decision")
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
                p = measure(client, tenants, queued, args.decisions, args.half_life,
                            args.reclaim)
                points.append(p)
                print(f"{p.tenants:>8} {p.queued:>8} {p.decisions:>9} {p.released:>8} "
                      f"{p.dispatch_p50_ms:>8.3f} {p.dispatch_p99_ms:>8.3f} "
                      f"{p.admit_p50_ms:>9.3f} {p.bytes_per_queued_pod:>7.1f}"
                      + (f" reclaim check p50 {p.reclaim_p50_ms} ms p99 {p.reclaim_p99_ms} ms"
                         if p.reclaim_p50_ms is not None else ""), flush=True)
        clear(client)
    result = {"redis_version": version, "points": [asdict(p) for p in points]}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
