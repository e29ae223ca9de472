"""Audit log throughput and verification cost against a private redis-server.

Run: python bench/bench_audit.py [--records N] [--writers W]
Prints one JSON object: single-writer records/s and per-record latency percentiles,
multi-process records/s, verify time for the stream,
Redis memory per stored record and Redis CPU per append (the Lua script's SHA-256 link).

Run: python bench/bench_audit.py --split [--rounds N]
Prints one JSON object: ``per_record_us``: where the CPU of auditing an admission-shaped
record goes, in µs per record (this thread's CPU time, median of ``--rounds`` batches of
64): building the record (``AuditRecord(...)``, on the request path), its canonical JSON
form, digests and links, the script call, the returned records, the stdout lines and
their write; ``record_many`` as a whole; the writer's GIL hold per 64-record batch
before the script call and after its reply; Redis CPU per record (``cmdstat_evalsha``
and ``used_cpu_user + used_cpu_sys``). ``writer``: an
:class:`~webhook.auditing.AuditWriter` fed 64 records every ~2.3 ms (about 28,000/s)
while this thread, standing for the event loop, sleeps 0.5 ms four times between feeds:
records per script call, how late its wake-ups are less its wait for a CPU (so: the GIL
held by the writer thread), also with bursts of 512 and with the writer idle, and the
CPU of submit and of the writer per record. ``writer_at_1500_per_s``: the same writer
fed 1,500 records/s evenly: records per script call, CPU per record of
submit, the writer thread and Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from audit.chain import AuditRecord
from audit.log import AuditLog, _links
from bench.machine import run_delay_ns
from fairshare.localredis import local_redis
from webhook.auditing import AuditWriter

BATCH = 64


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


def admission_fields(i: int) -> dict[str, Any]:
    """The fields the webhook audits for an admitted pod (as webhook.service passes them)."""
    return {"uid": f"{i:08d}-0b5c-4c8e-9a43-7d1c6c1d2e11",
            "user": "system:serviceaccount:kube-system:job-controller",
            "groups": ("system:serviceaccounts", "system:authenticated"),
            "operation": "CREATE", "tenant": "fast", "namespace": "fast-dev",
            "name": f"trainer-{i}", "pod_class": "training", "demand": "gpu=1",
            "reason": "reserved as training within nominal quota", "latency_ms": 1.2345678}


def _redis_cpu_us(client: redis.Redis) -> tuple[float, float]:
    """Redis CPU so far: the script's (cmdstat_evalsha usec) and the server's, in µs."""
    script = float(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
    cpu = client.info("cpu")
    return script, 1e6 * (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))


def _script_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def split(url: str, rounds: int) -> dict[str, float]:
    """µs of CPU per record for each step of auditing a batch of 64 records."""
    client = redis.Redis.from_url(url)
    client.flushall()
    with open(os.devnull, "w", encoding="utf-8") as sink:
        log = AuditLog(client, out=sink)
        log.record("admit", **admission_fields(0))  # loads the script, learns the head
        steps: dict[str, list[float]] = {}

        @contextlib.contextmanager
        def timed(step: str) -> Iterator[None]:
            started = time.thread_time_ns()
            yield
            steps.setdefault(step, []).append((time.thread_time_ns() - started) / 1e3 / BATCH)

        script_before, cpu_before = _redis_cpu_us(client)
        for n in range(rounds):
            fields = [admission_fields(n * BATCH + i) for i in range(BATCH)]
            with timed("build: AuditRecord(...)"):
                drafts = [AuditRecord("admit", **f) for f in fields]
            with timed("canonical JSON (wire_form)"):
                forms = [d.wire_form() for d in drafts]
            with timed("body bytes"):
                bodies = [f.body().encode() for f in forms]
            with timed("digests and links"):
                links = _links(log._head, [hashlib.sha256(b).hexdigest() for b in bodies])
            with timed("returned records (with_chain)"):
                chained = [d.with_chain(*link) for d, link in zip(drafts, links, strict=True)]
            with timed("stdout lines"):
                lines = "\n".join([f.line(r.seq, r.prev, r.hash)
                                   for f, r in zip(forms, chained, strict=True)]) + "\n"
            with timed("stdout write + flush"):
                sink.write(lines)
                sink.flush()
            with timed("record_many, in all"):
                log.record_many(drafts)
        script_after, cpu_after = _redis_cpu_us(client)
        verdict, _ = log.verify()
        assert verdict.ok and verdict.checked == rounds * BATCH + 1, verdict
    client.close()
    result = {step: round(statistics.median(us), 2) for step, us in steps.items()}
    parts = sum(us for step, us in result.items() if not step.startswith(("build", "record_")))
    result["script call (record_many minus the other steps)"] = round(
        result["record_many, in all"] - parts, 2)
    # The writer thread holds the GIL from the start of record_many to the script call's
    # socket write, and from the reply to the stdout write: its longest holds per batch.
    result["GIL held per 64-record batch, before the script call (ms)"] = round(BATCH * sum(
        result[step] for step in ("canonical JSON (wire_form)", "body bytes",
                                  "digests and links")) / 1e3, 3)
    result["GIL held per 64-record batch, after the reply (ms)"] = round(BATCH * sum(
        result[step] for step in ("returned records (with_chain)", "stdout lines")) / 1e3, 3)
    records = rounds * BATCH
    result["redis: script CPU per record"] = round((script_after - script_before) / records, 2)
    result["redis: server CPU per record"] = round((cpu_after - cpu_before) / records, 2)
    return result


def _feed(writer: AuditWriter, feeds: int, first: int, burst: int = BATCH,
          ) -> tuple[list[float], int]:
    """Submit ``burst`` records, then sleep 0.5 ms ``burst / 16`` times, ``feeds`` times:
    how late each wake-up was (µs, sorted), not counting the time the thread waited for a
    CPU (two cores are shared with redis-server and the writer), and the CPU (ns) of the
    submits."""
    schedstat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    lateness: list[float] = []
    submit_ns = 0
    for n in range(feeds):
        fields = [admission_fields(first + n * burst + i) for i in range(burst)]
        started = time.thread_time_ns()
        for f in fields:
            writer.submit("admit", **f)
        submit_ns += time.thread_time_ns() - started
        for _ in range(burst // 16):
            waited = run_delay_ns(schedstat)
            asleep = time.perf_counter_ns()
            time.sleep(0.0005)
            late = time.perf_counter_ns() - asleep - 500_000
            lateness.append((late - (run_delay_ns(schedstat) - waited)) / 1e3)
    return sorted(lateness), submit_ns


def _percentiles(lateness: list[float]) -> dict[str, int]:
    return {"p50": round(statistics.median(lateness)),
            "p99": round(lateness[int(len(lateness) * 0.99)]), "max": round(lateness[-1])}


def writer_gil(url: str, feeds: int) -> dict[str, Any]:
    """How late a thread sleeping 0.5 ms wakes (µs, less its wait for a CPU: so the wait
    for the GIL, and the timer's own slack) while an AuditWriter appends the 64
    records it submitted before each four sleeps (the wake-up waits for the GIL the
    writer thread holds), the same with bursts of 512 records before 32 sleeps, and
    without the writer thread running (the machine's own noise); the CPU of ``submit``
    and of the writer thread (the process's CPU minus this thread's) per record."""
    client = redis.Redis.from_url(url)
    client.flushall()
    with open(os.devnull, "w", encoding="utf-8") as sink:
        writer = AuditWriter(AuditLog(client, out=sink), capacity=1_000_000)
        idle, _ = _feed(writer, feeds, 0)  # the writer thread not started: records wait
        writer.start()
        writer.stop()  # writes them; the script is loaded, the head known
        writer.start()
        calls_before = _script_calls(client)
        process_before, thread_before = time.process_time_ns(), time.thread_time_ns()
        loaded, submit_ns = _feed(writer, feeds, feeds * BATCH)
        writer_ns = ((time.process_time_ns() - process_before)
                     - (time.thread_time_ns() - thread_before))
        calls = _script_calls(client) - calls_before
        bursts, _ = _feed(writer, feeds // 8, 2 * feeds * BATCH, burst=8 * BATCH)
        writer.stop()
        verdict, _ = writer.audit_log.verify()
        assert verdict.ok and verdict.checked == (2 * feeds + feeds // 8 * 8) * BATCH, verdict
    client.close()
    records = feeds * BATCH
    return {"wakeups": len(loaded),
            "records_per_script_call": round(records / max(calls, 1), 1),
            "late_us_writer_running": _percentiles(loaded),
            "late_us_writer_running_bursts_of_512": _percentiles(bursts),
            "late_us_writer_idle": _percentiles(idle),
            "submit_cpu_us_per_record": round(submit_ns / 1e3 / records, 2),
            "writer_thread_cpu_us_per_record": round(writer_ns / 1e3 / records, 2)}


def paced(url: str, rate: int, seconds: float) -> dict[str, float]:
    """An AuditWriter (default linger) fed ``rate`` records/s, evenly, for ``seconds``:
    records per script call, the CPU of submit and of the writer thread per record (as
    in :func:`writer_gil`), Redis CPU per record."""
    client = redis.Redis.from_url(url)
    client.flushall()
    with open(os.devnull, "w", encoding="utf-8") as sink:
        writer = AuditWriter(AuditLog(client, out=sink), capacity=1_000_000)
        writer.start()
        writer.submit("admit", **admission_fields(0))
        writer.stop()  # the script is loaded, the head known
        writer.start()
        client.config_resetstat()
        script_before, server_before = _redis_cpu_us(client)
        records = int(rate * seconds)
        fields = [admission_fields(1 + i) for i in range(records)]
        submit_ns = 0
        process_before, thread_before = time.process_time_ns(), time.thread_time_ns()
        started = time.perf_counter()
        for i, f in enumerate(fields):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            before = time.thread_time_ns()
            writer.submit("admit", **f)
            submit_ns += time.thread_time_ns() - before
        writer.stop()
        writer_ns = ((time.process_time_ns() - process_before)
                     - (time.thread_time_ns() - thread_before))
        script_after, server_after = _redis_cpu_us(client)
        calls = _script_calls(client)
        verdict, _ = writer.audit_log.verify()
        assert verdict.ok and verdict.checked == records + 1, verdict
    client.close()
    return {"records": records, "records_per_script_call": round(records / max(calls, 1), 1),
            "submit_cpu_us_per_record": round(submit_ns / 1e3 / records, 2),
            "writer_thread_cpu_us_per_record": round(writer_ns / 1e3 / records, 2),
            "redis_script_cpu_us_per_record": round(
                (script_after - script_before) / records, 2),
            "redis_server_cpu_us_per_record": round(
                (server_after - server_before) / records, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--split", action="store_true",
                        help="only the per-step CPU split and the writer's GIL holds")
    parser.add_argument("--rounds", type=int, default=200, help="batches for --split")
    args = parser.parse_args()
    if args.split:
        with local_redis() as url:
            print(json.dumps({"load_average": os.getloadavg()[0],
                              "per_record_us": split(url, args.rounds),
                              "writer": writer_gil(url, args.rounds),
                              "writer_at_1500_per_s": paced(url, 1500, 4.0)}, indent=2))
        return
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
