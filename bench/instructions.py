"""Benchmark: instructions Redis executes per admission and per dispatch decision.

    python bench/instructions.py admit --cases fast-10-training queue-100-training gang-4
    python bench/instructions.py dispatch --tenants 1000 --queued 100000 --decisions 100
    python bench/instructions.py --code DIR dispatch  # DIR: another commit's worktree

Time measured on a shared machine moves by 20-40% between runs of the same code; the
number of instructions does not. This counts them with valgrind's callgrind tool
(``Ir``, instructions executed inside Redis' ``processCommand``: the command, i.e.
the script (``EVALSHA``, older checkouts) or function (``FCALL``) and its
``redis.call``s; not reading the request or writing the reply, and
not the timers of the event loop), zeroing the counters before
each measured operation and dumping them after it (``callgrind_control``), so the
setup is never counted. A ratio of two codes' counts is a ratio of CPU work, not of
time (cache misses and the like do not show).

``admit``: for each case of ``bench/redis_scripts.py`` (its ``prepare``), on an empty
Redis under callgrind, ``--count`` admissions through ``FairQueue.admit`` are counted,
each alone (median, mean, and the ``ZRANGE``s it made, i.e. ready-set members read, by
``INFO commandstats``). ``admit --half-life S`` sets ``fairShare.usageHalfLife`` and runs
the cases on a live clock (``--live-clock``: the same without a half-life); ``admit
--cluster TENANTS QUEUED`` also counts admissions on ``bench/dispatch.py``'s full
cluster and backlog built on a live clock (see ``--help``). ``dispatch``: the state of
``bench/dispatch.py`` (same tenants, mix and
seed: the cluster filled with running pods, then ``--queued`` pods queued) is built in
a plain ``redis-server``, saved, and loaded into one under callgrind; then
``--decisions`` times a random running pod ends (uncounted) and one
``dispatch(limit=1)`` is counted. Loading the code into Redis is never counted: the
setup's calls load the scripts or the function library (and, for a library, make its
per-prefix instance: ``fairshare/queue/README.md``, "Redis Functions"). ``--code DIR`` puts
another checkout first on the import path (the queue, its Lua and the bench helpers all
come from it); it works with checkouts from before the uid-bound
``confirm``/``release`` API and with those that run the queue as scripts;
``dispatch --half-life`` needs one whose ``bench/dispatch.py`` has ``with_half_life``.
Needs ``valgrind`` and ``redis-server``.
"""

from __future__ import annotations

import argparse
import inspect
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import redis


def start_redis(workdir: Path, callgrind: bool) -> tuple[subprocess.Popen[bytes], redis.Redis]:
    """A redis-server in ``workdir`` (loading its dump.rdb if there is one), optionally
    under callgrind (counting from the start; callers zero before they measure)."""
    from fairshare.localredis import free_port  # the checkout measured (see main)

    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(workdir), "--dbfilename", "dump.rdb"]
    if callgrind:
        # only inside processCommand: one command, its script and the script's own
        # redis.calls; not the event loop, whose timers (serverCron: expiry, rehashing)
        # run more often per command the slower the machine is
        command = ["valgrind", "--tool=callgrind", "--toggle-collect=processCommand",
                   f"--callgrind-out-file={workdir}/callgrind.%p.out", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=None)  # (redis-py 8: 5 s by default)
    deadline = time.monotonic() + 1800  # a large dataset loads slowly under valgrind
    while True:
        try:
            if client.info("persistence")["loading"] == 0:
                return process, client
        except (redis.ConnectionError, redis.BusyLoadingError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"redis-server did not start: {' '.join(command)}")
        time.sleep(0.5)


class Counter:
    """Instructions of the callgrind'd redis-server ``process`` between
    :meth:`start` and :meth:`read`."""

    def __init__(self, process: subprocess.Popen[bytes], workdir: Path) -> None:
        self.pid = process.pid
        self.workdir = workdir

    def _control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        """Zero the counters."""
        self._control("-z")

    def read(self) -> int:
        """Instructions since :meth:`start`."""
        self._control("-d")
        dumps = sorted(self.workdir.glob(f"callgrind.{self.pid}.out.*"),
                       key=lambda p: int(p.suffix[1:]))
        text = dumps[-1].read_text()
        for dump in dumps:
            dump.unlink()
        for line in text.splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no instruction total in the callgrind dump of {self.pid}")


def under_callgrind(process: subprocess.Popen[bytes], client: redis.Redis,
                    workdir: Path) -> tuple[subprocess.Popen[bytes], redis.Redis]:
    """Save the state built at full speed by ``process`` and serve it again from a
    redis-server under callgrind."""
    client.save()
    process.terminate()
    process.wait()
    return start_redis(workdir, callgrind=True)


def fair_queue() -> type[Any]:
    """The measured checkout's ``FairQueue``: ``fairshare/queue/fairqueue.py``, or
    ``fairshare/queue.py`` in a checkout from before the queue had its own package."""
    try:
        from fairshare.queue.fairqueue import FairQueue
    except ModuleNotFoundError:
        from fairshare.queue import FairQueue  # type: ignore[attr-defined,no-redef]
    return FairQueue


def uid_bound(queue_type: type[Any]) -> bool:
    """Whether this checkout's ``FairQueue.release`` takes the pod uid."""
    return "uid" in inspect.signature(queue_type.release).parameters


# The clock of a live cluster (``admit --half-life``/``--live-clock``, ``admit --cluster``):
ARRIVAL_S = 1.0  # between two admissions of a case of bench/redis_scripts.py
FILL_S = 0.1  # between two admissions while --cluster fills the cluster
BACKLOG_S = 0.01  # between two admissions of --cluster's backlog (a 100/s sweep)
RUN_S = 600.0  # mean run time of a pod: one of n running pods ends every RUN_S / n s
SETTLE_S = 300.0  # of pods ending (and dispatch) between the backlog and the measurement
CASE_DECISIONS = 10  # dispatch decisions between a case's set-up and its measurement


class Clock:
    """``now``, advanced by :meth:`tick`."""

    def __init__(self, now: float = 1.0) -> None:
        self.now = now

    def tick(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def count_each(counter: Counter, client: redis.Redis, queue: Any, req: Any,
               now: float) -> tuple[int, dict[str, int], str]:
    """Instructions of one ``queue.admit(req, now)``, the calls per command it made
    (``INFO commandstats`` deltas; the INFOs are not counted) and its outcome."""
    before = client.info("commandstats")
    counter.start()
    outcome = str(queue.admit(req, now).outcome)
    ir = counter.read()
    after = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) - int(before.get(k, {}).get("calls", 0))
             for k, v in after.items()}
    return ir, {k: n for k, n in calls.items() if n and k not in ("info", "fcall")}, outcome


def report(label: str, counts: list[int], calls: list[dict[str, int]],
           outcomes: dict[str, int]) -> None:
    zrange = sorted(c.get("zrange", 0) for c in calls)
    print(f"admit {label}: {len(counts)} admissions "
          f"({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}): instructions per "
          f"admission median {statistics.median(counts):,.0f}, mean "
          f"{statistics.mean(counts):,.0f}, max {max(counts):,}; ZRANGE (ready-set members "
          f"read) median {statistics.median(zrange):g}, mean {statistics.mean(zrange):.1f}, "
          f"max {zrange[-1]}; redis.calls mean "
          f"{statistics.mean(sum(c.values()) for c in calls):.1f}", flush=True)


def measure_admit(cases: list[str], count: int, half_life: float, live: bool) -> None:
    from bench import redis_scripts
    from bench.dispatch import PREFIX, make_config

    FairQueue = fair_queue()
    for name in cases:
        case = next((c for c in redis_scripts.CASES if c.name == name), None)
        if case is None:
            raise SystemExit(f"unknown case {name!r}: one of "
                             f"{', '.join(c.name for c in redis_scripts.CASES)}")
        with tempfile.TemporaryDirectory(prefix="fairgate-instr-") as tmp:
            process, client = start_redis(Path(tmp), callgrind=True)
            try:
                config, capacity, names = make_config(case.tenants)
                if half_life:
                    # (in bench/dispatch.py since its own --half-life: not in older checkouts)
                    from bench.dispatch import with_half_life

                    config = with_half_life(config, half_life)
                queue = FairQueue(client, prefix=PREFIX)
                queue.sync_config(config, capacity)
                clock = Clock(redis_scripts.NOW)
                if live:
                    # pods arrive ARRIVAL_S apart, then a few dispatch decisions pass
                    stream = redis_scripts.prepare(queue, case, names,
                                                   partial(clock.tick, ARRIVAL_S))
                    for _ in range(CASE_DECISIONS):
                        queue.dispatch(clock.tick(ARRIVAL_S), 1)
                else:
                    stream = redis_scripts.prepare(queue, case, names)
                reqs = [next(stream) for _ in range(count)]
                counter = Counter(process, Path(tmp))
                counts: list[int] = []
                calls: list[dict[str, int]] = []
                outcomes: dict[str, int] = {}
                for req in reqs:
                    now = clock.tick(ARRIVAL_S) if live else redis_scripts.NOW
                    ir, made, outcome = count_each(counter, client, queue, req, now)
                    counts.append(ir)
                    calls.append(made)
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
            finally:
                process.terminate()
                process.wait()
        label = name + (f", usage half-life {half_life:g} s" if half_life else "") + (
            ", live clock" if live else "")
        report(label, counts, calls, outcomes)


def fill_cluster(queue: Any, names: list[str], queued: int, rng: random.Random,
                 clock: Clock | None = None, ends: random.Random | None = None,
                 ) -> tuple[list[str], Iterator[Any]]:
    """bench/dispatch.py's state: the cluster filled with running pods (admitted and
    confirmed until 200 pods in a row had to queue), then ``queued`` pods queued; returns
    the running tickets and the rest of the pod stream. ``clock`` None: every admission
    at t = 1. Else the live clock: admissions FILL_S then BACKLOG_S apart, and while
    the backlog arrives one running pod (picked by ``ends``) ends every RUN_S / (pods
    running) seconds, each end followed by one ``dispatch(limit=1)``."""
    from bench.dispatch import pods

    bound = uid_bound(type(queue))

    def pod_uid(ticket: str) -> str:  # (bench/dispatch.py's, not in older checkouts)
        return f"uid-{ticket}"

    running: list[str] = []
    stream = pods(names, 10**9, rng)
    in_a_row = 0
    for req in stream:
        if queue.admit(req, clock.tick(FILL_S) if clock else 1.0).outcome == "reserved":
            queue.confirm(*((req.ticket, pod_uid(req.ticket), req.namespace, req.name)
                            if bound else (req.ticket, 1.0)))
            running.append(req.ticket)
            in_a_row = 0
        else:
            queue.remove(*((req.ticket, pod_uid(req.ticket)) if bound else (req.ticket,)))
            in_a_row += 1
            if in_a_row == 200:
                break
    waiting = 0
    next_end = clock.now + RUN_S / len(running) if clock else math.inf
    for req in stream:
        now = clock.tick(BACKLOG_S) if clock else 1.0
        while clock and ends and now >= next_end:
            end_one(queue, running, ends, next_end)
            next_end += RUN_S / len(running)
        if queue.admit(req, now).outcome == "reserved":
            queue.release(*((req.ticket, pod_uid(req.ticket)) if bound else (req.ticket,)))
            continue
        waiting += 1
        if waiting == queued:
            break
    return running, stream


def end_one(queue: Any, running: list[str], rng: random.Random, now: float) -> int:
    """A random running pod ends at ``now`` and one dispatch decision follows; the pods
    it releases start running (uid-bound API). Returns how many it released."""
    from bench.dispatch import pod_uid

    ticket = running.pop(rng.randrange(len(running)))
    queue.release(ticket, pod_uid(ticket), now)
    got = queue.dispatch(now, 1)
    for r in got:
        queue.confirm(r.ticket, pod_uid(r.ticket), r.namespace, r.name)
    running += [r.ticket for r in got]
    return len(got)


def measure_admit_cluster(tenants: int, queued: int, count: int, half_life: float) -> None:
    from bench.dispatch import PREFIX, make_config, pod_uid, with_half_life

    FairQueue = fair_queue()
    with tempfile.TemporaryDirectory(prefix="fairgate-instr-") as tmp:
        workdir = Path(tmp)
        process, client = start_redis(workdir, callgrind=False)
        rng = random.Random(tenants * 1_000_003 + queued)
        ends = random.Random(7)
        config, capacity, names = make_config(tenants)
        queue = FairQueue(client, prefix=PREFIX)
        queue.sync_config(with_half_life(config, half_life), capacity)
        clock = Clock()
        running, stream = fill_cluster(queue, names, queued, rng, clock, ends)
        settle_until = clock.now + SETTLE_S
        while clock.now < settle_until:
            end_one(queue, running, ends, clock.tick(RUN_S / len(running)))
        process, client = under_callgrind(process, client, workdir)
        try:
            queue = FairQueue(client, prefix=PREFIX)
            counter = Counter(process, workdir)
            counts: list[int] = []
            calls: list[dict[str, int]] = []
            outcomes: dict[str, int] = {}
            for req in (next(stream) for _ in range(count)):
                # as many pods arrive as end: one ends (and a decision) before each admission
                now = clock.tick(RUN_S / len(running))
                end_one(queue, running, ends, now)
                ir, made, outcome = count_each(counter, client, queue, req, now)
                counts.append(ir)
                calls.append(made)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcome == "reserved":
                    queue.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)
                    running.append(req.ticket)
        finally:
            process.terminate()
            process.wait()
    report(f"{tenants} tenants x {queued} queued"
           f"{f', usage half-life {half_life:g} s' if half_life else ''}, live clock "
           f"(t = {clock.now:,.0f} s at the end)", counts, calls, outcomes)


def measure_dispatch(tenants: int, queued: int, decisions: int, half_life: float) -> None:
    from bench.dispatch import PREFIX, make_config

    FairQueue = fair_queue()
    bound = uid_bound(FairQueue)

    def uid(ticket: str) -> str:
        return f"uid-{ticket}"

    with tempfile.TemporaryDirectory(prefix="fairgate-instr-") as tmp:
        workdir = Path(tmp)
        # bench/dispatch.py's state, built at full speed and saved
        process, client = start_redis(workdir, callgrind=False)
        rng = random.Random(tenants * 1_000_003 + queued)
        config, capacity, names = make_config(tenants)
        if half_life:
            # (in bench/dispatch.py since its own --half-life: not in older checkouts)
            from bench.dispatch import with_half_life

            config = with_half_life(config, half_life)
        queue = FairQueue(client, prefix=PREFIX)
        queue.sync_config(config, capacity)
        running, _ = fill_cluster(queue, names, queued, rng)
        process, client = under_callgrind(process, client, workdir)
        try:
            queue = FairQueue(client, prefix=PREFIX)
            counter = Counter(process, workdir)
            counts: list[int] = []
            released = 0
            for step in range(decisions):
                ticket = running.pop(rng.randrange(len(running)))
                now = 2.0 + step * 1e-3
                queue.release(*((ticket, uid(ticket), now) if bound else (ticket,)))
                counter.start()
                got = queue.dispatch(now, 1)
                counts.append(counter.read())
                released += len(got)
                running += [r.ticket for r in got]
        finally:
            process.terminate()
            process.wait()
    print(f"dispatch {tenants} tenants x {queued} queued"
          f"{f', usage half-life {half_life:g} s' if half_life else ''}: {decisions} decisions, "
          f"{released} released: instructions per decision median "
          f"{statistics.median(counts):,.0f}, mean {statistics.mean(counts):,.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path,
                        help="measure this checkout's queue and bench helpers instead")
    sub = parser.add_subparsers(dest="what", required=True)
    admit = sub.add_parser("admit", help="instructions per admission, per case")
    admit.add_argument("--cases", nargs="*", default=["fast-10-training", "fast-100-training",
                                                       "queue-100-training", "gang-4"],
                       help="cases of bench/redis_scripts.py (none: only --cluster)")
    admit.add_argument("--count", type=int, default=200)
    admit.add_argument("--half-life", type=float, default=0.0, metavar="SECONDS",
                       help="fairShare.usageHalfLife in seconds (default 0: not set, the "
                       "default order, virtual time, and the cases run as without this "
                       "option). Counts the "
                       "decayed-usage admission: the survey walks each ready set of the "
                       "pod's tier (and of higher tiers) while a stored score, a lower "
                       "bound, could beat the best current one, and admission writes no "
                       "score back. Implies --live-clock")
    admit.add_argument("--live-clock", action="store_true",
                       help="give the cases a clock that advances as on a live cluster "
                       f"(set-up and measured pods arrive {ARRIVAL_S:g} s apart, "
                       f"{CASE_DECISIONS} dispatch decisions before the measurement), so "
                       "decayed usage and stored-score staleness are exercised; alone, "
                       "the same procedure without a half-life (the baseline)")
    admit.add_argument("--cluster", type=int, nargs=2, metavar=("TENANTS", "QUEUED"),
                       help="also count --count admissions of bench/dispatch.py's pod mix "
                       "on its full cluster of TENANTS tenants with QUEUED pods queued, on a "
                       f"live clock: it fills {FILL_S:g} s and the backlog {BACKLOG_S:g} s "
                       f"per pod while running pods end (mean run {RUN_S:g} s, one "
                       f"dispatch decision after each end), then {SETTLE_S:g} s of ends "
                       "and decisions, then one end and decision (uncounted) before each "
                       "counted admission; pods released or reserved start running")
    dispatch = sub.add_parser("dispatch", help="instructions per dispatch decision")
    dispatch.add_argument("--tenants", type=int, default=1000)
    dispatch.add_argument("--queued", type=int, default=100_000)
    dispatch.add_argument("--decisions", type=int, default=100)
    dispatch.add_argument("--half-life", type=float, default=0.0,
                          help="fairShare.usageHalfLife in seconds (0: not set, virtual time); "
                          "counts the decayed-usage walk of the ready sets")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind and redis-server "
                             "(Debian: apt-get install valgrind redis-server)")
    sys.path.insert(0, str((args.code or Path(__file__).resolve().parents[1]).resolve()))
    if args.what == "admit":
        measure_admit(args.cases, args.count, args.half_life,
                      args.live_clock or args.half_life > 0)
        if args.cluster:
            tenants, queued = args.cluster
            measure_admit_cluster(tenants, queued, args.count, args.half_life)
    else:
        measure_dispatch(args.tenants, args.queued, args.decisions, args.half_life)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
