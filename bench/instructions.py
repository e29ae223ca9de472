"""Benchmark: instructions Redis executes per admission and per dispatch decision.

    python bench/instructions.py admit --cases fast-10-training queue-100-training gang-4
    python bench/instructions.py dispatch --tenants 1000 --queued 100000 --decisions 100
    python bench/instructions.py --code /tmp/base4c dispatch     # an old commit's checkout

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
Redis under callgrind, ``--count`` admissions through ``FairQueue.admit`` are counted
together. ``dispatch``: the state of ``bench/dispatch.py`` (same tenants, mix and
seed: the cluster filled with running pods, then ``--queued`` pods queued) is built in
a plain ``redis-server``, saved, and loaded into one under callgrind; then
``--decisions`` times a random running pod ends (uncounted) and one
``dispatch(limit=1)`` is counted. Loading the code into Redis is never counted: the
setup's calls load the scripts or the function library (and, for a library, make its
per-prefix instance: ``fairshare/README.md``, "Redis Functions"). ``--code DIR`` puts
another checkout first on the import path (the queue, its Lua and the bench helpers all
come from it); it works with checkouts from before the uid-bound
``confirm``/``release`` API and with those that run the queue as scripts;
``dispatch --half-life`` needs one whose ``bench/dispatch.py`` has ``with_half_life``.
Needs ``valgrind`` and ``redis-server``.
"""

from __future__ import annotations

import argparse
import inspect
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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
    client = redis.Redis(port=port)
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


def uid_bound(queue_type: type[Any]) -> bool:
    """Whether this checkout's ``FairQueue.release`` takes the pod uid (issue 12)."""
    return "uid" in inspect.signature(queue_type.release).parameters


def measure_admit(cases: list[str], count: int) -> None:
    from bench import redis_scripts
    from bench.dispatch import PREFIX, make_config
    from fairshare.queue import FairQueue

    for name in cases:
        case = next((c for c in redis_scripts.CASES if c.name == name), None)
        if case is None:
            raise SystemExit(f"unknown case {name!r}: one of "
                             f"{', '.join(c.name for c in redis_scripts.CASES)}")
        with tempfile.TemporaryDirectory(prefix="fairgate-instr-") as tmp:
            process, client = start_redis(Path(tmp), callgrind=True)
            try:
                config, capacity, names = make_config(case.tenants)
                queue = FairQueue(client, prefix=PREFIX)
                queue.sync_config(config, capacity)
                stream = redis_scripts.prepare(queue, case, names)
                reqs = [next(stream) for _ in range(count)]
                counter = Counter(process, Path(tmp))
                counter.start()
                outcomes = {queue.admit(r, redis_scripts.NOW).outcome for r in reqs}
                ir = counter.read()
            finally:
                process.terminate()
                process.wait()
        print(f"admit {name}: {count} admissions ({', '.join(sorted(outcomes))}): "
              f"{ir / count:,.0f} instructions each", flush=True)


def measure_dispatch(tenants: int, queued: int, decisions: int, half_life: float) -> None:
    from bench.dispatch import PREFIX, make_config, pods
    from fairshare.queue import FairQueue

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
        running: list[str] = []
        stream = pods(names, 10**9, rng)
        in_a_row = 0
        for req in stream:
            if queue.admit(req, 1.0).outcome == "reserved":
                queue.confirm(*((req.ticket, uid(req.ticket), req.namespace, req.name)
                                if bound else (req.ticket, 1.0)))
                running.append(req.ticket)
                in_a_row = 0
            else:
                queue.remove(*((req.ticket, uid(req.ticket)) if bound else (req.ticket,)))
                in_a_row += 1
                if in_a_row == 200:
                    break
        waiting = 0
        for req in stream:
            if queue.admit(req, 1.0).outcome == "reserved":
                queue.release(*((req.ticket, uid(req.ticket)) if bound else (req.ticket,)))
                continue
            waiting += 1
            if waiting == queued:
                break
        client.save()
        process.terminate()
        process.wait()
        process, client = start_redis(workdir, callgrind=True)
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
    admit.add_argument("--cases", nargs="+", default=["fast-10-training", "fast-100-training",
                                                       "queue-100-training", "gang-4"])
    admit.add_argument("--count", type=int, default=200)
    dispatch = sub.add_parser("dispatch", help="instructions per dispatch decision")
    dispatch.add_argument("--tenants", type=int, default=1000)
    dispatch.add_argument("--queued", type=int, default=100_000)
    dispatch.add_argument("--decisions", type=int, default=100)
    dispatch.add_argument("--half-life", type=float, default=0.0,
                          help="fairShare.usageHalfLife in seconds (0: current usage only); "
                          "counts the decayed-usage walk of the ready sets")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind and redis-server "
                             "(Debian: apt-get install valgrind redis-server)")
    sys.path.insert(0, str((args.code or Path(__file__).resolve().parents[1]).resolve()))
    if args.what == "admit":
        measure_admit(args.cases, args.count)
    else:
        measure_dispatch(args.tenants, args.queued, args.decisions, args.half_life)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
