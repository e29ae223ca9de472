"""Benchmark: Redis-side cost of one ``FairQueue.admit`` (``admit.lua``, a function of the
queue's Redis Function library, called with ``FCALL``).

    python -m bench.redis_scripts                       # every case, best of 3 x 1000 admissions
    python -m bench.redis_scripts --rounds 1 --only fast-10-training queue-10000-training

For each case it empties Redis, configures the tenants as ``bench/dispatch.py`` does
(weights 1-4; each tenant: nominal 64 GPUs, 56 ``mig-1g.5gb``, 16 ``mig-3g.40gb``,
borrow limit 16 GPU-eq, inference reserve 2 GPU-eq; cluster 512 GPUs) and sets up the
path, then admits one-GPU pods through the real ``FairQueue.admit`` in batches. Each
batch is measured alone: ``CONFIG RESETSTAT`` before it, ``INFO commandstats`` and
``INFO cpu`` after it; the batch is then undone (``release``/``remove``, not measured)
so every batch meets the same state. Cases:

- ``fast-<tenants>-<class>``: the tenant has room and nothing is queued anywhere
  (reserved at once); pods go round robin over the tenants, which already hold 300
  pods (half confirmed, half reserved: the ticket hash and the reservation set are
  past Redis' small encodings, as on a live cluster).
- ``queue-<backlog>-<class>``: the tenant's quota is full (its nominal quota and, for
  training, its borrow limit are held by running pods) and ``<backlog>`` pods of its
  class wait before each batch; every measured pod is queued behind them.
- ``gang-<size>``: members of gangs of that size of tenants with room, holding 300
  pods as above (members wait until the last completes the gang, which then becomes
  one queue entry).

Per admission: ``FCALL`` microseconds as Redis times the command (the function and its
``redis.call``s), Redis CPU (``used_cpu_user + used_cpu_sys``: also reading the request
and writing the reply), ``redis.call``s made by the script (``commandstats`` counts the
commands scripts run) and the client's wall time (Python and the loopback round trip
included). Each case runs ``--rounds`` times, the cases interleaved, and the round with
the least ``FCALL`` time is kept (the machine is shared: the least disturbed round).
Prints a Markdown table and one JSON object (with the calls per command).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis

from bench.dispatch import PREFIX, clear, make_config, pod_uid, server
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, PodRequest
from tenants.models import PodClass

NOW = 1.0
KNOWN_PODS = 300  # held before a fast-path or gang case: half confirmed, half reserved
# commandstats entries that are not the script's own redis.calls
_OUTSIDE = {"fcall", "function|load", "info", "config|resetstat"}


@dataclass(frozen=True)
class Case:
    """One admission path: ``backlog`` None is the fast path; ``gang_size`` > 1 gangs."""

    name: str
    tenants: int
    pod_class: PodClass
    backlog: int | None = None
    gang_size: int = 1


CASES = [
    Case("fast-10-training", 10, "training"),
    Case("fast-100-training", 100, "training"),
    Case("fast-10-inference", 10, "inference"),
    Case("fast-100-inference", 100, "inference"),
    Case("queue-100-training", 10, "training", backlog=100),
    Case("queue-10000-training", 10, "training", backlog=10_000),
    Case("queue-100-inference", 10, "inference", backlog=100),
    Case("queue-10000-inference", 10, "inference", backlog=10_000),
    Case("gang-4", 10, "training", gang_size=4),
]


@dataclass
class Result:
    case: str
    admissions: int
    outcomes: dict[str, int]
    fcall_us: float  # Redis' own time of the FCALL command, per admission
    redis_cpu_us: float  # redis-server user + sys CPU, per admission
    redis_calls: float  # redis.call()s made by the script, per admission
    client_us: float  # wall time of FairQueue.admit in this process, per admission
    calls: dict[str, float] = field(default_factory=dict)  # per command, per admission


def requests(case: Case, tenants: Sequence[str], first: int = 0) -> Iterator[PodRequest]:
    """One-GPU pods of ``case``: round robin over ``tenants``, in gangs if it has them;
    pod ``first`` first (tickets and names differ between pods)."""
    i = first
    while True:
        tenant = tenants[(i // case.gang_size) % len(tenants)]
        yield PodRequest(
            ticket=str(uuid.UUID(int=i + 1)), tenant=tenant, namespace=f"{tenant}-ml",
            name=f"{case.pod_class[:5]}-{i:07d}", pod_class=case.pod_class,
            demand={"gpu": 1}, group=f"job-{i // case.gang_size}" if case.gang_size > 1 else None,
            group_size=case.gang_size, submitted_at=NOW + i * 1e-6,
        )
        i += 1


def _redis_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def prepare(queue: FairQueue, case: Case, tenants: Sequence[str],
            clock: Callable[[], float] | None = None) -> Iterator[PodRequest]:
    """Set ``case`` up and return the stream of pods to measure: a queue case fills
    the first tenant's quota with running pods and queues ``case.backlog`` pods; other
    cases reserve :data:`KNOWN_PODS` single pods over ``tenants`` and confirm half.
    ``clock``: called for each admission's ``now`` (default: :data:`NOW` for all)."""
    if clock is None:
        clock = lambda: NOW  # noqa: E731
    if case.backlog is None:
        singles = Case(case.name, case.tenants, case.pod_class)
        known = requests(singles, tenants, first=10**8)
        for n in range(KNOWN_PODS):
            req = next(known)
            if queue.admit(req, clock()).outcome != "reserved":
                raise RuntimeError(f"{case.name}: pod {n} of the known pods was not reserved")
            if n % 2:
                queue.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)
        return requests(case, tenants)
    stream = requests(case, tenants[:1])
    queued = 0
    while queued < case.backlog:
        req = next(stream)
        if queue.admit(req, clock()).outcome == "reserved":
            if queued:
                raise RuntimeError(f"{case.name}: a pod was reserved behind the backlog")
            queue.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)
        else:
            queued += 1
    return stream


def measure(client: redis.Redis, case: Case, count: int, batch: int) -> Result:
    """``count`` admissions of ``case`` on an emptied Redis (keys under ``bench:``)."""
    clear(client)
    config, capacity, names = make_config(case.tenants)
    queue = FairQueue(client, prefix=PREFIX)
    queue.sync_config(config, capacity)
    stream = prepare(queue, case, names)
    expected = "reserved" if case.backlog is None and case.gang_size == 1 else "queued"
    calls: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    fcall_us = cpu = wall = 0.0
    done = 0
    while done < count:
        size = min(batch, count - done)
        size -= size % case.gang_size  # whole gangs only
        reqs = [next(stream) for _ in range(max(size, case.gang_size))]
        client.config_resetstat()
        cpu_before = _redis_cpu(client)
        started = time.perf_counter()
        answers: list[Admission] = [queue.admit(req, NOW) for req in reqs]
        wall += time.perf_counter() - started
        cpu += _redis_cpu(client) - cpu_before
        stats = client.info("commandstats")
        fcall_us += float(stats["cmdstat_fcall"]["usec"])
        for key, value in stats.items():
            command = key.removeprefix("cmdstat_")
            if command not in _OUTSIDE:
                calls[command] += int(value["calls"])
        outcomes.update(a.outcome for a in answers)
        for req in reqs:  # undo the batch, unmeasured
            if expected == "reserved":
                queue.release(req.ticket, pod_uid(req.ticket))
            else:
                queue.remove(req.ticket, pod_uid(req.ticket))
        done += len(reqs)
    if set(outcomes) != {expected}:
        raise RuntimeError(f"{case.name}: expected every admission {expected}, got {outcomes}")
    clear(client)
    return Result(
        case=case.name,
        admissions=done,
        outcomes=dict(outcomes),
        fcall_us=round(fcall_us / done, 1),
        redis_cpu_us=round(1e6 * cpu / done, 1),
        redis_calls=round(sum(calls.values()) / done, 1),
        client_us=round(1e6 * wall / done, 1),
        calls={name: round(n / done, 2) for name, n in calls.most_common()},
    )


def table(results: Sequence[Result]) -> str:
    """A Markdown table of ``results``."""
    lines = ["| case | admissions | FCALL us/admit | Redis CPU us/admit | "
             "redis.call/admit | client us/admit |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.case} | {r.admissions} | {r.fcall_us:.1f} | "
                     f"{r.redis_cpu_us:.1f} | {r.redis_calls:.1f} | {r.client_us:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.redis_scripts [--count N] [--only CASE ...]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.redis_scripts",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000,
                        help="admissions per case and round (1000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per case; the least disturbed is kept (3)")
    parser.add_argument("--batch", type=int, default=200,
                        help="admissions per measured batch (200)")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CASES],
                        help="only these cases")
    parser.add_argument("--redis-url", help="use this Redis (keys under 'bench:' are "
                        "deleted; CONFIG RESETSTAT is run) instead of a private redis-server")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if min(args.count, args.batch, args.rounds) < 1:
        parser.error("--count, --batch and --rounds must be >= 1")
    cases = [case for case in CASES if not args.only or case.name in args.only]
    best: dict[str, Result] = {}
    with server(args.redis_url) as client:
        version = client.info("server")["redis_version"]
        for _ in range(args.rounds):
            for case in cases:
                result = measure(client, case, args.count, args.batch)
                if case.name not in best or result.fcall_us < best[case.name].fcall_us:
                    best[case.name] = result
    results = [best[case.name] for case in cases]
    print(table(results))
    print()
    report = {"redis_version": version, "count": args.count, "batch": args.batch,
              "rounds": args.rounds,
              "results": [asdict(r) for r in results]}
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
