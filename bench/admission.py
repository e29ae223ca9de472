"""Admission latency and throughput of the webhook over HTTPS on loopback.

Run (from the repository root):

    python -m bench.admission                     # the full run: table + JSON
    python -m bench.admission --duration 5        # shorter
    python -m bench.admission scaling --workers 1,2,4
    python -m bench.admission gang --rounds 6       # gang member against single pod, p99
    python -m bench.admission breakdown --profile   # where the time goes (py-spy)
    python -m bench.admission serve --workers 2 ...   # only the bench server (manual runs)

What it measures, all in one run against one server process (``wrk`` from Debian, the
Lua script ``bench/wrk/review.lua`` posting a real AdmissionReview v1 with a fresh uid
per request; a real ``redis-server`` on 127.0.0.1):

- ``baseline``: ``POST /bench/allow`` on the same app, uvicorn and TLS stack: reads the
  body, parses the JSON, answers ``allowed: true`` with the uid.
- ``mutate-fast``: ``/mutate`` for a GPU pod of a tenant with room (reserved at once).
- ``mutate-queue``: ``/mutate`` for a GPU pod of a tenant whose quota is full (queued
  behind a growing backlog: one Lua script each, gate + warning in the answer).
- ``mutate-gang``: ``/mutate`` for a member of a gang (fairgate's label
  ``fairgate.io/pod-group`` and annotation ``fairgate.io/pod-group-size``) of tenant
  ``fast``: every ``--gang-size`` requests (8) of a wrk thread name a fresh gang, so
  each member joins a gang of that size and every 8th completes it (queued whole for the
  dispatcher, which the bench does not run: complete gangs pile up as a backlog).
  ``gang`` runs it interleaved with ``mutate-fast`` and reports the p99 ratio.
- ``validate``: ``/validate`` for the CREATE of a pod as ``/mutate`` stamped it (one
  stamp for every request, no pod uid: the ticket is not claimed).
- ``validate-bind``: ``/validate`` as the API server sends it after ``/mutate``: each
  request's pod carries the ``fairgate.io/ticket`` a prior ``/mutate`` of this run minted
  and a ``metadata.uid``, so the webhook claims that ticket for the pod (``bind``).

Each at a fixed rate (``--rate``, paced by the Lua script: Debian has no wrk2) and at
saturation (closed loop, ``--connections``). Redis is emptied before every run.

The bench server is :func:`webhook.app.create_app` over the same
:func:`fairshare.connection.connect_redis` client, :func:`certs.server_ssl_context` and uvicorn
options as ``fairgate serve``, plus the baseline route, served by ``--workers`` uvicorn
processes on one socket (``fairgate serve`` has no ``--workers``). ``--check-serve``
also measures the real ``fairgate serve`` process at saturation on ``/mutate``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import redis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from audit import AuditLog
from certs import server_ssl_context, write_bundle
from fairshare.connection import connect_redis, connect_redis_async
from fairshare.localredis import free_port, local_redis
from tenants.localdir import write_config_dir
from tenants.source import LocalDirSource
from webhook.app import create_app
from webhook.process import ServeProcess, client_context
from webhook.service import AdmissionService

HOST = "127.0.0.1"
WRK_SCRIPT = Path(__file__).parent / "wrk" / "review.lua"
UID = "UID_PLACEHOLDER"
BASELINE_PATH = "/bench/allow"
REDIS_BASELINE_PATH = "/bench/allow-after-redis"
_ENV_PREFIX = "FAIRGATE_BENCH_"

# Tenant "fast" never runs out of room; tenant "queue" has one GPU, held before each run.
PLATFORM_YAML = """\
platformAdmins: {groups: [platform-team]}
capacity: {gpu: 10000000}
tenants:
  fast: {weight: 1, ceiling: {gpuEquivalents: 10000000}}
  queue: {weight: 1, ceiling: {gpuEquivalents: 1}}
onRedisUnavailable: deny
"""
QUOTAS = {
    "fast": "nominal: {gpu: 10000000}\ndefaultClass: training\n",
    "queue": "nominal: {gpu: 1}\ndefaultClass: training\n",
}
NAMESPACES_YAML = "fast-dev: {fairgate.io/tenant: fast}\nqueue-dev: {fairgate.io/tenant: queue}\n"


def write_bench_config(directory: Path) -> Path:
    """The bench's config dir (tenants ``fast`` and ``queue``)."""
    return write_config_dir(directory, PLATFORM_YAML, QUOTAS, NAMESPACES_YAML)


def pod(namespace: str, name: str) -> dict[str, Any]:
    """A one-GPU training pod as a Job controller would create it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"app": "trainer", "job-name": "trainer"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer",
                                 "uid": "0b5c6a86-8f2f-4c8e-9a43-7d1c6c1d2e11",
                                 "controller": True}],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["python", "train.py"],
                "resources": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                              "requests": {"cpu": "4", "memory": "16Gi"}},
            }],
        },
    }


def review(obj: dict[str, Any], uid: str = UID) -> dict[str, Any]:
    """An AdmissionReview v1 pod CREATE as the API server sends it."""
    meta = obj["metadata"]
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "name": meta["name"], "namespace": meta["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": obj, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


# -- the bench server ------------------------------------------------------------------


def _baseline_answer(body: bytes) -> bytes:
    uid = json.loads(body)["request"]["uid"]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": uid, "allowed": True}}).encode()


def bench_app() -> FastAPI:
    """The webhook app as ``fairgate serve`` builds it, plus ``POST /bench/allow``.

    Reads its settings from ``FAIRGATE_BENCH_*`` environment variables (it is the
    uvicorn app factory of every worker process).
    """
    source = LocalDirSource(Path(os.environ[_ENV_PREFIX + "CONFIG_DIR"]), poll_interval=1.0)
    source.start()
    url = os.environ[_ENV_PREFIX + "REDIS_URL"]
    # What-if: audit kept in memory only (no Redis append, no stdout), to measure its share.
    audit = (AuditLog(None, out=open(os.devnull, "w"))  # noqa: SIM115 (lives with the app)
             if os.environ.get(_ENV_PREFIX + "AUDIT_OFF") else AuditLog(connect_redis(url)))
    service = AdmissionService(source, connect_redis_async(url), audit)
    app = create_app(service)

    async def allow(request: Request) -> Response:
        return Response(_baseline_answer(await request.body()), media_type="application/json")

    async def allow_after_redis(request: Request) -> Response:
        body = await request.body()
        await service.client.ping()  # one round trip on the decisions' Redis client
        return Response(_baseline_answer(body), media_type="application/json")

    app.add_route(BASELINE_PATH, allow, methods=["POST"])  # routed as /mutate is
    app.add_route(REDIS_BASELINE_PATH, allow_after_redis, methods=["POST"])

    return app


def _ssl_context(config: uvicorn.Config, _default: Any) -> ssl.SSLContext:
    return server_ssl_context(Path(os.environ[_ENV_PREFIX + "CERT_DIR"]))


def serve(cert_dir: Path, redis_url: str, config_dir: Path, port: int, workers: int,
          audit_off: bool = False) -> None:
    """Serve :func:`bench_app` on 127.0.0.1:``port`` with ``workers`` processes;
    ``audit_off`` keeps audit records in memory only (a what-if measurement, never a
    product setting)."""
    os.environ.update({_ENV_PREFIX + "CERT_DIR": str(cert_dir),
                       _ENV_PREFIX + "REDIS_URL": redis_url,
                       _ENV_PREFIX + "CONFIG_DIR": str(config_dir),
                       _ENV_PREFIX + "AUDIT_OFF": "1" if audit_off else ""})
    uvicorn.run(
        "bench.admission:bench_app", factory=True, host=HOST, port=port, workers=workers,
        ssl_context_factory=_ssl_context, log_config=None, access_log=False,
        server_header=False, lifespan="on",
    )


@dataclass
class Server:
    """A running server process (bench server or ``fairgate serve``) on loopback."""

    process: subprocess.Popen[bytes]
    port: int
    ca_file: Path

    @property
    def base_url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{HOST}:{self.port}"

    def client(self) -> httpx.Client:
        """A verifying HTTPS client."""
        return httpx.Client(base_url=self.base_url, verify=client_context(self.ca_file),
                            timeout=10.0)

    def pids(self) -> list[int]:
        """The server's process and its worker processes."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            kids = [int(p) for p in children.read_text().split()]
        except OSError:
            kids = []
        return [self.process.pid, *kids]

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by the server and its workers."""
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


class BenchEnvironment:
    """Certificates, config dir and a private ``redis-server`` for a bench run."""

    def __init__(self, stack: ExitStack) -> None:
        """Set everything up; torn down when ``stack`` closes."""
        self._stack = stack
        self.workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="fairgate-bench-")))
        self.cert_dir = self.workdir / "certs"
        write_bundle(self.cert_dir, extra_sans=(HOST,))
        self.config_dir = write_bench_config(self.workdir / "config")
        self.redis_url = stack.enter_context(local_redis())
        self.redis = redis.Redis.from_url(self.redis_url)
        stack.callback(self.redis.close)

    @contextmanager
    def bench_server(self, workers: int = 1, audit_off: bool = False) -> Iterator[Server]:
        """The bench server with ``workers`` uvicorn processes (see :func:`serve` for
        ``audit_off``), until the context exits."""
        port = free_port()
        command = [sys.executable, "-m", "bench.admission", "serve",
                   "--cert-dir", str(self.cert_dir), "--redis-url", self.redis_url,
                   "--config-dir", str(self.config_dir), "--port", str(port),
                   "--workers", str(workers),
                   *(["--audit-off"] if audit_off else [])]
        log = (self.workdir / f"server-{port}.log").open("ab")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=Path(__file__).resolve().parent.parent)
        server = Server(process, port, self.cert_dir / "ca.crt")
        try:
            _wait_healthy(server, workers)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()

    @contextmanager
    def fairgate_serve(self) -> Iterator[Server]:
        """The real ``fairgate serve`` process (one worker; no baseline route)."""
        with ServeProcess(self.cert_dir, self.redis_url, self.config_dir,
                          self.workdir / "fairgate-serve.log") as serve_process:
            assert serve_process.process is not None
            yield Server(serve_process.process, serve_process.port, serve_process.ca_file)


def _wait_healthy(server: Server, workers: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with server.client() as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"bench server exited with {server.process.returncode}")
            try:
                if (client.get("/healthz").status_code == 200
                        and len(server.pids()) >= (workers + 1 if workers > 1 else 1)):
                    time.sleep(1.0 if workers > 1 else 0.0)  # let every worker start
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"bench server not healthy within {timeout}s")


# -- scenarios -------------------------------------------------------------------------

GANG = "GANG_PLACEHOLDER"
GANG_SIZE = 8


def gang_member(namespace: str, name: str, size: int) -> dict[str, Any]:
    """:func:`pod` as a member of gang ``GANG_PLACEHOLDER`` of ``size`` pods (fairgate's
    own label and annotation; wrk names a fresh gang every ``size`` requests)."""
    member = pod(namespace, name)
    member["metadata"]["labels"]["fairgate.io/pod-group"] = GANG
    member["metadata"]["annotations"] = {"fairgate.io/pod-group-size": str(size)}
    return member


@dataclass(frozen=True)
class Scenario:
    """One endpoint and body to load."""

    name: str
    path: str
    body: str  # JSON with UID_PLACEHOLDER for the request uid
    # True: UID_PLACEHOLDER is also the pod's ticket (and uid), minted before the run by
    # /mutate requests whose uids the measured run's uids repeat (see :func:`measure`)
    minted: bool = False
    gang_size: int = 1  # requests per gang name (GANG_PLACEHOLDER), see bench/wrk/review.lua


def _stamped(server: Server, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as ``/mutate`` stamps it (the body ``/validate`` then sees)."""
    body = review(obj, uid="6b0c9a52-2f1e-4d8a-9e57-3c2d1b0a9f88")
    with server.client() as client:
        answer = client.post("/mutate", json=body).json()["response"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return result


def _bound(server: Server, obj: dict[str, Any]) -> str:
    """The review ``/validate`` gets for ``obj`` after ``/mutate``: stamped, its ticket
    (the mutating request's uid) and its ``metadata.uid`` both UID_PLACEHOLDER."""
    stamp = "6b0c9a52-2f1e-4d8a-9e57-3c2d1b0a9f88"
    stamped = _stamped(server, obj)
    stamped["metadata"]["uid"] = UID
    body = json.dumps(review(stamped))
    if f'"fairgate.io/ticket": "{stamp}"' not in body:
        raise RuntimeError(f"/mutate stamped no ticket {stamp}: {body}")
    return body.replace(stamp, UID)


def scenarios(server: Server, gang_size: int = GANG_SIZE) -> list[Scenario]:
    """Baseline, /mutate fast path, /mutate queue path, /mutate of gang members (gangs
    of ``gang_size``), /validate (one stamp, no pod uid) and /validate with a minted
    ticket and a pod uid."""
    fast = json.dumps(review(pod("fast-dev", "trainer-0")))
    member = json.dumps(review(gang_member("fast-dev", "trainer-0", gang_size)))
    queued = json.dumps(review(pod("queue-dev", "trainer-0")))
    validate = json.dumps(review(_stamped(server, pod("fast-dev", "trainer-0"))))
    bound = _bound(server, pod("fast-dev", "trainer-0"))
    return [
        Scenario("baseline", BASELINE_PATH, fast),
        Scenario("baseline-redis", REDIS_BASELINE_PATH, fast),
        Scenario("mutate-fast", "/mutate", fast),
        Scenario("mutate-queue", "/mutate", queued),
        Scenario("mutate-gang", "/mutate", member, gang_size=gang_size),
        Scenario("validate", "/validate", validate),
        Scenario("validate-bind", "/validate", bound, minted=True),
    ]


def quiesce(env: BenchEnvironment, quiet: float = 0.5, timeout: float = 60.0) -> None:
    """Wait until the server stopped writing to Redis (requests and audit drained)."""
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        # INFO itself is a command: one per look.
        count = int(env.redis.info("stats")["total_commands_processed"])
        if count == last + 1:
            return
        last = count
        time.sleep(quiet)
    raise RuntimeError(f"the server kept writing to Redis for {timeout}s after the load")


def reset_redis(env: BenchEnvironment, server: Server) -> None:
    """Empty Redis once the server is idle, then fill tenant ``queue``'s only GPU so its
    pods must wait."""
    quiesce(env)
    env.redis.flushall()
    holder = review(pod("queue-dev", "holder"), uid=f"{secrets.token_hex(4)}-0000-4000-8000-"
                    "000000000000")
    with server.client() as client:
        answer = client.post("/mutate", json=holder).json()["response"]
    if answer["auditAnnotations"]["decision"] != "admit":
        raise RuntimeError(f"could not fill tenant queue's quota: {answer}")


@dataclass(frozen=True)
class LoadResult:
    """What ``wrk`` saw in one run."""

    scenario: str
    mode: str  # "rate=<n>" or "saturation"
    connections: int
    seconds: float
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    errors: int
    non_2xx: int
    decisions: dict[str, int]
    server_cpu_ms: float  # server CPU time per request (all its processes)
    redis_cpu_ms: float  # redis-server CPU time per request
    # commands redis-server ran per request, by name (INFO commandstats; the bench's own
    # INFO calls left out): what the server's requests cost in Redis calls, at any load
    redis_calls: dict[str, float] = field(default_factory=dict)


def _redis_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
            if name != "cmdstat_info"}


def _redis_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run_wrk(server: Server, scenario: Scenario, *, rate: int, duration: float,
            connections: int, threads: int, workdir: Path,
            redis_client: redis.Redis | None = None, tag: str = "",
            until: Callable[[], bool] | None = None) -> LoadResult:
    """Load ``scenario`` with wrk (``rate`` 0: saturation) and parse its JSON summary;
    CPU per request is measured on the server's processes and on ``redis_client``'s
    server (0 without one). ``tag``: the run tag of the request uids (8 hex digits;
    random by default); ``until``: polled every 0.1 s, wrk is stopped (SIGINT: it still
    prints its summary) once it is true."""
    template = workdir / f"{scenario.name}.json"
    template.write_text(scenario.body)
    command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s",
               "--timeout", "5s", "-s", str(WRK_SCRIPT), server.base_url + scenario.path,
               "--", str(template), str(rate), tag or secrets.token_hex(4), str(threads),
               str(scenario.gang_size)]
    cpu_before = server.cpu_seconds()
    redis_before = _redis_cpu(redis_client) if redis_client is not None else 0.0
    calls_before = _redis_calls(redis_client) if redis_client is not None else {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        deadline = time.monotonic() + duration + 60
        while until is not None and process.poll() is None and not until():
            time.sleep(0.1)
        if until is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    done = subprocess.CompletedProcess(command, process.returncode, out, err)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    cpu = server.cpu_seconds() - cpu_before
    redis_cpu = _redis_cpu(redis_client) - redis_before if redis_client is not None else 0.0
    calls = _redis_calls(redis_client) if redis_client is not None else {}
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{done.stdout}\n{done.stderr}")
    raw = json.loads(line.removeprefix("WRK_JSON "))
    seconds = raw["duration_us"] / 1e6
    errors = raw["errors"]
    lat = raw["latency_us"]
    return LoadResult(
        scenario=scenario.name,
        mode=f"rate={rate}" if rate else "saturation",
        connections=connections,
        seconds=round(seconds, 2),
        requests=raw["requests"],
        rps=round(raw["requests"] / seconds, 1),
        p50_ms=lat["p50"] / 1000, p99_ms=lat["p99"] / 1000, p999_ms=lat["p99.9"] / 1000,
        max_ms=lat["max"] / 1000,
        errors=errors["connect"] + errors["read"] + errors["write"] + errors["timeout"],
        non_2xx=errors["status"],
        decisions=raw["decisions"],
        server_cpu_ms=round(1000 * cpu / max(raw["requests"], 1), 3),
        redis_cpu_ms=round(1000 * redis_cpu / max(raw["requests"], 1), 3),
        redis_calls={name: round((n - calls_before.get(name, 0)) / max(raw["requests"], 1), 3)
                     for name, n in sorted(calls.items())
                     if n > calls_before.get(name, 0)},
    )


@dataclass(frozen=True)
class LoadPlan:
    """How hard and how long to load."""

    rate: int = 500
    duration: float = 15.0
    rate_connections: int = 16
    saturation_connections: int = 32
    threads: int = 1


# Tickets minted for a saturation run of a minted scenario: this many times what the
# warm-up's pace would send in the run (the run's count of bound tickets shows a shortfall).
MINT_MARGIN = 2.5


def mint(env: BenchEnvironment, server: Server, source: Scenario, tag: str, count: int,
         connections: int, threads: int) -> LoadResult:
    """``count`` (or a few more) ``/mutate`` answers for ``source`` with request uids of
    run tag ``tag`` (from ``threads`` wrk threads, as the run that repeats them): each an
    admission whose ticket is its request uid; then wait until the server is idle."""
    tickets = env.redis.hlen("fairgate:tk")  # the queue tenant's holder
    minted = run_wrk(server, source, rate=0, duration=600, connections=connections,
                     threads=threads, workdir=env.workdir, tag=tag,
                     until=lambda: env.redis.hlen("fairgate:tk") >= tickets + count)
    quiesce(env)
    made = env.redis.hlen("fairgate:tk") - tickets
    if made < count:  # (a denial, e.g. a Redis timeout on a loaded machine, mints nothing)
        raise RuntimeError(f"minted {made} of {count} tickets: {minted}")
    return minted


def bound_tickets(env: BenchEnvironment, tag: str, prefix: str = "fairgate:") -> int:
    """How many tickets of run tag ``tag`` were claimed for a pod uid at validation
    (``bind``; a record's 14th field)."""
    count = 0
    for _, raw in env.redis.hscan_iter(prefix + "tk", match=f"{tag}-*", count=1000):
        fields = raw.decode().split("|")
        count += len(fields) >= 14 and fields[13] != ""
    return count


def measure(env: BenchEnvironment, server: Server, plan: LoadPlan,
            only: Sequence[str] = (), modes: Sequence[str] = ("rate", "saturation"),
            gang_size: int = GANG_SIZE) -> list[LoadResult]:
    """Every scenario (or those named in ``only``) in every mode, Redis reset before each.

    A minted scenario's run repeats the request uids of ``/mutate`` requests (the fast
    path) sent after its warm-up with the same run tag, one per request it may send (at
    saturation: the warm-up's pace, :data:`MINT_MARGIN` times over); its decisions then
    also count the tickets the run bound (``bound``)."""
    results = []
    every = scenarios(server, gang_size)
    source = next(s for s in every if s.name == "mutate-fast")
    for scenario in every:
        if only and scenario.name not in only:
            continue
        for mode in modes:
            reset_redis(env, server)
            rate = plan.rate if mode == "rate" else 0
            connections = plan.rate_connections if rate else plan.saturation_connections
            # A short warm-up on the same path, not counted.
            warm = run_wrk(server, scenario, rate=0, duration=1, connections=connections,
                           threads=plan.threads, workdir=env.workdir)
            tag = secrets.token_hex(4)
            if scenario.minted:
                pace = rate or warm.rps * MINT_MARGIN
                mint(env, server, source, tag, int(pace * (plan.duration + 1)) + connections,
                     plan.saturation_connections, plan.threads)
            result = run_wrk(server, scenario, rate=rate, duration=plan.duration,
                             connections=connections, threads=plan.threads,
                             workdir=env.workdir, redis_client=env.redis, tag=tag)
            if scenario.minted:
                quiesce(env)
                result = LoadResult(**{**asdict(result), "decisions": {
                    **result.decisions, "bound": bound_tickets(env, tag)}})
            results.append(result)
    return results


# -- reporting -------------------------------------------------------------------------

TARGET_P99_MS = 5.0
TARGET_SATURATION_RPS = 1500.0
TARGET_P50_RATIO = 1.5
TARGET_GANG_P99_RATIO = 1.10  # a gang member's /mutate p99 over a single pod's


def verdicts(results: Sequence[LoadResult]) -> dict[str, Any]:
    """The issue's three targets, each with the measured figure and met or not; and, for
    information (no verdict), each p50 against ``baseline-redis`` (the baseline plus the
    one Redis round trip every /mutate decision needs)."""
    by = {(r.scenario, r.mode.split("=")[0]): r for r in results}
    base = by.get(("baseline", "rate"))
    redis_base = by.get(("baseline-redis", "rate"))
    out: dict[str, Any] = {}
    for name in ("mutate-fast", "mutate-queue", "mutate-gang", "validate", "validate-bind"):
        fixed, sat = by.get((name, "rate")), by.get((name, "saturation"))
        if fixed is not None:
            out[f"{name} p99 at fixed rate <= {TARGET_P99_MS} ms"] = {
                "measured_ms": fixed.p99_ms, "met": fixed.p99_ms <= TARGET_P99_MS}
            if base is not None:
                ratio = fixed.p50_ms / base.p50_ms
                out[f"{name} p50 <= {TARGET_P50_RATIO}x baseline"] = {
                    "ratio": round(ratio, 2), "met": ratio <= TARGET_P50_RATIO}
            if redis_base is not None:
                out[f"{name} p50 / baseline-redis p50"] = {
                    "ratio": round(fixed.p50_ms / redis_base.p50_ms, 2)}
        if sat is not None and name.startswith("mutate"):
            out[f"{name} saturation >= {TARGET_SATURATION_RPS:g} req/s"] = {
                "measured_rps": sat.rps, "met": sat.rps >= TARGET_SATURATION_RPS}
    single, member = by.get(("mutate-fast", "rate")), by.get(("mutate-gang", "rate"))
    if single is not None and member is not None:
        ratio = member.p99_ms / single.p99_ms
        out[f"mutate-gang p99 <= {TARGET_GANG_P99_RATIO}x mutate-fast p99 (one run each; "
            "`gang` interleaves rounds)"] = {"ratio": round(ratio, 2),
                                              "met": ratio <= TARGET_GANG_P99_RATIO}
    return out


def table(results: Sequence[LoadResult]) -> str:
    """A Markdown table of ``results``."""
    lines = ["| scenario | load | conns | req/s | p50 ms | p99 ms | p99.9 ms | max ms | "
             "errors | non-2xx | server CPU ms/req | Redis CPU ms/req | Redis calls/req | "
             "decisions |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        decisions = ", ".join(f"{k} {v}" for k, v in r.decisions.items() if v)
        calls = ", ".join(f"{k} {v:.2f}" for k, v in r.redis_calls.items() if v >= 0.005)
        lines.append(f"| {r.scenario} | {r.mode} | {r.connections} | {r.rps:.0f} | "
                     f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.p999_ms:.2f} | {r.max_ms:.1f} | "
                     f"{r.errors} | {r.non_2xx} | {r.server_cpu_ms:.2f} | {r.redis_cpu_ms:.3f} | "
                     f"{calls} | {decisions} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                   text=True, check=False).stdout.split()[2]
    return {"cpus": os.cpu_count(), "cpu": model, "python": sys.version.split()[0],
            "uvicorn": uvicorn.__version__, "wrk": wrk.stdout.split("\n")[0].split(" [")[0],
            "redis": redis_version.removeprefix("v="),
            "load_average_at_start": os.getloadavg()}


# -- where the time goes ----------------------------------------------------------------


def _per_call_us(call: Any, count: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(count):
        call()
    return 1e6 * (time.perf_counter() - started) / count


def breakdown(env: BenchEnvironment, count: int = 2000) -> dict[str, float]:
    """Microseconds per call of each step of a fast-path ``/mutate``, in this process
    (the same functions the service calls, in the same order)."""
    import asyncio
    import io
    import uuid

    from admission.mutation import build_patch
    from admission.plan import PodPlan, plan_create
    from admission.reviews import parse_review, with_patch
    from audit import AuditLog, AuditRecord
    from fairshare.queue.fairqueue import FairQueue
    from fairshare.queue.fastpath import AsyncFairQueue
    from fairshare.queue.model import PodRequest
    from tenants.localdir import load_config_dir
    from webhook.metrics import WebhookMetrics

    config = load_config_dir(env.config_dir)
    body = json.dumps(review(pod("fast-dev", "trainer-0"), uid=str(uuid.uuid4()))).encode()
    request = parse_review(body).request
    assert request.object is not None
    obj = request.object
    plan = plan_create(obj, request.namespace, request.uid, config)
    assert isinstance(plan, PodPlan)
    classes = config.platform.priority_classes
    ops = build_patch(obj, plan, "training", False, classes)
    FairQueue(env.redis).sync_config(config, config.platform.capacity)
    tickets = iter(range(10**9))
    audit = AuditLog(env.redis, out=io.StringIO())
    metrics = WebhookMetrics()

    async def admit_us(concurrency: int) -> float:
        """AsyncFairQueue.admit as the webhook awaits it, ``concurrency`` at a time."""
        client = connect_redis_async(env.redis_url)
        queue = AsyncFairQueue(client)

        async def admit() -> None:
            n = next(tickets)
            await queue.admit(PodRequest(
                ticket=f"bench-{n}", tenant="fast", namespace="fast-dev", name=f"trainer-{n}",
                pod_class="training", demand={"gpu": 1}, submitted_at=time.time()), time.time())

        await asyncio.gather(*(admit() for _ in range(concurrency)))  # connections made
        started = time.perf_counter()
        for _ in range(count // concurrency):
            await asyncio.gather(*(admit() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        await client.aclose()
        return 1e6 * elapsed / (count // concurrency * concurrency)

    def count_metrics() -> None:
        metrics.decisions.labels("fast", "admit").inc()
        metrics.duration.labels("mutate", "CREATE").observe(0.001)

    def audit_batch() -> None:
        audit.record_many(AuditRecord(
            decision="admit", uid=str(uuid.uuid4()), user="u", groups=("g",),
            operation="CREATE", tenant="fast", namespace="fast-dev", name="trainer-0",
            pod_class="training", demand="gpu=1", reason="reserved as training",
            latency_ms=1.0) for _ in range(64))

    steps = {
        "parse_review (pydantic, strict)": _per_call_us(lambda: parse_review(body), count),
        "plan_create": _per_call_us(
            lambda: plan_create(obj, request.namespace, request.uid, config), count),
        "build_patch": _per_call_us(
            lambda: build_patch(obj, plan, "training", False, classes), count),
        "with_patch + model_dump_json": _per_call_us(
            lambda: with_patch(request.uid, ops, [], {"decision": "admit"}).model_dump_json(
                by_alias=True, exclude_none=True), count),
        "metrics (decision + duration)": _per_call_us(count_metrics, count),
        "Redis PING round trip (for scale)": _per_call_us(env.redis.ping, count),
        "AsyncFairQueue.admit (one Lua script), one at a time": asyncio.run(admit_us(1)),
        "AsyncFairQueue.admit, 32 at once (per call)": asyncio.run(admit_us(32)),
        "audit, per record, in batches of 64 (AuditLog.record_many)": _per_call_us(
            audit_batch, max(count // 64, 10)) / 64,
    }
    return {name: round(us, 1) for name, us in steps.items()}


# Frames every request passes through (thread bootstrap, uvicorn/starlette/fastapi layers,
# this module): left out of the profile table, which is about where the work goes.
_FRAMEWORK = re.compile(r"threading\.py|runpy|runners\.py|uvicorn/(main|server|_compat|middleware)"
                        r"|starlette/|fastapi/|admission\.py\)$|<module>")


def profile(env: BenchEnvironment, seconds: float, connections: int, top: int = 25
            ) -> list[tuple[str, float]]:
    """py-spy ``--gil`` samples of the bench server under ``/mutate`` fast-path
    saturation: the frames holding the GIL most (inclusive share of samples)."""
    if shutil.which("py-spy") is None:
        raise RuntimeError("py-spy not found: pip install py-spy")
    counts: dict[str, int] = {}
    total = 0
    with env.bench_server(workers=1) as server:
        fast = next(s for s in scenarios(server) if s.name == "mutate-fast")
        reset_redis(env, server)
        raw = env.workdir / "py-spy.txt"
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.process.pid),
                                "--duration", str(int(seconds)), "--rate", "250", "--gil",
                                "--threads", "--nonblocking", "--format", "raw",
                                "-o", str(raw)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        run_wrk(server, fast, rate=0, duration=seconds + 1, connections=connections,
                threads=1, workdir=env.workdir)
        spy.wait(30)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        for frame in {f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] + ")"
                      for f in stack.split(";")[1:]}:
            counts[frame] = counts.get(frame, 0) + int(n)
    ranked = sorted(((f, n) for f, n in counts.items() if not _FRAMEWORK.search(f)),
                    key=lambda kv: -kv[1])[:top]
    return [(frame, round(100 * n / max(total, 1), 1)) for frame, n in ranked]


# -- commands --------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    plan = LoadPlan(rate=args.rate, duration=args.duration,
                    rate_connections=args.rate_connections,
                    saturation_connections=args.connections)
    report: dict[str, Any] = {"machine": machine(), "plan": asdict(plan),
                              "audit_off": args.audit_off}
    with ExitStack() as stack:
        env = BenchEnvironment(stack)
        with env.bench_server(workers=1, audit_off=args.audit_off) as server:
            results = measure(env, server, plan, only=args.only)
        if args.check_serve:
            with env.fairgate_serve() as real:
                reset_redis(env, real)
                fast = next(s for s in scenarios(real) if s.name == "mutate-fast")
                run_wrk(real, fast, rate=0, duration=1, connections=plan.saturation_connections,
                        threads=1, workdir=env.workdir)
                check = run_wrk(real, fast, rate=0, duration=plan.duration,
                                connections=plan.saturation_connections, threads=1,
                                workdir=env.workdir, redis_client=env.redis)
            results.append(LoadResult(**{**asdict(check),
                                         "scenario": "fairgate-serve mutate-fast"}))
    report["results"] = [asdict(r) for r in results]
    report["targets"] = verdicts(results)
    print(table(results))
    print()
    for name, verdict in report["targets"].items():
        mark = "INFO" if "met" not in verdict else "MET " if verdict["met"] else "MISS"
        print(f"{mark} {name}: "
              + ", ".join(f"{k}={v}" for k, v in verdict.items() if k != "met"))
    print()
    print(json.dumps(report))
    return 0


def _scaling(args: argparse.Namespace) -> int:
    plan = LoadPlan(duration=args.duration, saturation_connections=args.connections,
                    threads=args.threads)
    counts = [int(n) for n in args.workers.split(",")]
    report: dict[str, Any] = {"machine": machine(), "plan": asdict(plan), "curve": []}
    rows = ["| workers | scenario | req/s | p50 ms | p99 ms | p99.9 ms | non-2xx | "
            "server CPU ms/req |", "|---|---|---|---|---|---|---|---|"]
    with ExitStack() as stack:
        env = BenchEnvironment(stack)
        for workers in counts:
            with env.bench_server(workers=workers) as server:
                for result in measure(env, server, plan, only=("baseline", "mutate-fast"),
                                      modes=("saturation",)):
                    report["curve"].append({"workers": workers, **asdict(result)})
                    rows.append(f"| {workers} | {result.scenario} | {result.rps:.0f} | "
                                f"{result.p50_ms:.2f} | {result.p99_ms:.2f} | "
                                f"{result.p999_ms:.2f} | {result.non_2xx} | "
                                f"{result.server_cpu_ms:.2f} |")
    print("\n".join(rows))
    print()
    print(json.dumps(report))
    return 0


def _breakdown(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        steps = breakdown(BenchEnvironment(stack), args.count)
        frames = (profile(BenchEnvironment(stack), args.seconds, args.connections)
                  if args.profile else [])
    print("| step of a fast-path /mutate | us per call |\n|---|---|")
    for name, us in steps.items():
        print(f"| {name} | {us:.1f} |")
    if frames:
        print("\n| frame (py-spy --gil, inclusive) | % of GIL samples |\n|---|---|")
        for frame, share in frames:
            print(f"| `{frame}` | {share} |")
    print()
    print(json.dumps({"machine": machine(), "steps_us": steps, "gil_profile": frames}))
    return 0


def gang_rounds(env: BenchEnvironment, server: Server, plan: LoadPlan, rounds: int,
                gang_size: int, modes: Sequence[str]) -> list[dict[str, LoadResult]]:
    """``rounds`` rounds of ``mutate-fast`` and ``mutate-gang`` back to back on one server
    (the order alternates: single first in even rounds), Redis reset before each run."""
    out = []
    for i in range(rounds):
        order = ("mutate-fast", "mutate-gang") if i % 2 == 0 else ("mutate-gang", "mutate-fast")
        row: dict[str, LoadResult] = {}
        for name in order:
            for result in measure(env, server, plan, only=(name,), modes=modes,
                                  gang_size=gang_size):
                row[f"{name} {result.mode.split('=')[0]}"] = result
        out.append(row)
        print(f"round {i + 1}: " + ", ".join(
            f"{k} p50 {r.p50_ms:.2f} p99 {r.p99_ms:.2f} ms ({r.rps:.0f} req/s)"
            for k, r in sorted(row.items())), file=sys.stderr, flush=True)
    return out


def gang_summary(rounds: Sequence[dict[str, LoadResult]], modes: Sequence[str]
                 ) -> dict[str, Any]:
    """Per mode: median p50/p99 of each scenario, the per-round p99 and p50 ratios
    member / single (median, min, max) and the target on the median p99 ratio."""
    import statistics

    summary: dict[str, Any] = {}
    for mode in modes:
        single = [r[f"mutate-fast {mode}"] for r in rounds]
        member = [r[f"mutate-gang {mode}"] for r in rounds]
        p99 = [m.p99_ms / s.p99_ms for s, m in zip(single, member, strict=True)]
        p50 = [m.p50_ms / s.p50_ms for s, m in zip(single, member, strict=True)]
        summary[mode] = {
            "single_p50_ms": statistics.median(r.p50_ms for r in single),
            "single_p99_ms": statistics.median(r.p99_ms for r in single),
            "member_p50_ms": statistics.median(r.p50_ms for r in member),
            "member_p99_ms": statistics.median(r.p99_ms for r in member),
            "single_rps": statistics.median(r.rps for r in single),
            "member_rps": statistics.median(r.rps for r in member),
            "p99_ratios": [round(x, 3) for x in p99],
            "p50_ratios": [round(x, 3) for x in p50],
            "p99_ratio_median": round(statistics.median(p99), 3),
            "single_server_cpu_ms": statistics.median(r.server_cpu_ms for r in single),
            "member_server_cpu_ms": statistics.median(r.server_cpu_ms for r in member),
            "single_redis_cpu_ms": statistics.median(r.redis_cpu_ms for r in single),
            "member_redis_cpu_ms": statistics.median(r.redis_cpu_ms for r in member),
            "p50_ratio_median": round(statistics.median(p50), 3),
            "member_decisions": {k: sum(r.decisions.get(k, 0) for r in member)
                                 for k in ("admit", "queue", "deny", "other")},
            "errors": sum(r.errors + r.non_2xx for r in (*single, *member)),
        }
        if mode == "rate":
            summary[mode]["met"] = statistics.median(p99) <= TARGET_GANG_P99_RATIO
    return summary


def _gang(args: argparse.Namespace) -> int:
    plan = LoadPlan(rate=args.rate, duration=args.duration,
                    rate_connections=args.rate_connections,
                    saturation_connections=args.connections)
    modes = ("rate", "saturation") if args.saturation else ("rate",)
    with ExitStack() as stack:
        env = BenchEnvironment(stack)
        with env.bench_server(workers=1) as server:
            rounds = gang_rounds(env, server, plan, args.rounds, args.gang_size, modes)
    summary = gang_summary(rounds, modes)
    lines = [f"gangs of {args.gang_size}, {args.rounds} rounds\n",
             "| round | load | single p50 / p99 ms | member p50 / p99 ms | p99 ratio |",
             "|---|---|---|---|---|"]
    for i, row in enumerate(rounds):
        for mode in modes:
            s, m = row[f"mutate-fast {mode}"], row[f"mutate-gang {mode}"]
            lines.append(f"| {i + 1} | {s.mode} | {s.p50_ms:.2f} / {s.p99_ms:.2f} | "
                         f"{m.p50_ms:.2f} / {m.p99_ms:.2f} | {m.p99_ms / s.p99_ms:.2f} |")
    print("\n".join(lines))
    print()
    for mode, figures in summary.items():
        verdict = ("" if "met" not in figures else "MET  " if figures["met"] else "MISS ")
        print(f"{verdict or 'INFO '}{mode}: member / single p99 median "
              f"{figures['p99_ratio_median']} (target <= {TARGET_GANG_P99_RATIO} at the "
              f"fixed rate), p50 {figures['p50_ratio_median']}; CPU ms/req server "
              f"{figures['single_server_cpu_ms']:.3f} -> {figures['member_server_cpu_ms']:.3f}, "
              f"Redis {figures['single_redis_cpu_ms']:.3f} -> {figures['member_redis_cpu_ms']:.3f}")
    print()
    print(json.dumps({"machine": machine(), "plan": asdict(plan), "gang_size": args.gang_size,
                      "summary": summary,
                      "rounds": [{k: asdict(r) for k, r in row.items()} for row in rounds],
                      "load_average_at_end": os.getloadavg()}))
    return 0


def _serve(args: argparse.Namespace) -> int:
    serve(Path(args.cert_dir), args.redis_url, Path(args.config_dir), args.port, args.workers,
          args.audit_off)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.admission [run|scaling|gang|breakdown|serve] ...``."""
    if shutil.which("wrk") is None:
        print("bench: error: wrk not found: apt-get install wrk", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="latency and throughput of every scenario (default)")
    for p in (parser, run):
        p.add_argument("--rate", type=int, default=500, help="fixed rate, req/s (500)")
        p.add_argument("--duration", type=float, default=15.0, help="seconds per run (15)")
        p.add_argument("--rate-connections", type=int, default=16,
                       help="connections at the fixed rate (16)")
        p.add_argument("--connections", type=int, default=32,
                       help="connections at saturation (32)")
        p.add_argument("--only", action="append", default=[],
                       choices=["baseline", "baseline-redis", "mutate-fast", "mutate-queue",
                                "mutate-gang", "validate", "validate-bind"],
                       help="only this scenario (repeatable)")
        p.add_argument("--audit-off", action="store_true",
                       help="what-if: audit records in memory only (measures audit's cost)")
        p.add_argument("--check-serve", action="store_true",
                       help="also load the real `fairgate serve` (/mutate fast, saturation)")
        p.set_defaults(handler=_run)
    scaling = sub.add_parser("scaling", help="saturation throughput at 1, 2, 4 workers")
    scaling.add_argument("--workers", default="1,2,4", help="worker counts (1,2,4)")
    scaling.add_argument("--duration", type=float, default=10.0, help="seconds per run (10)")
    scaling.add_argument("--connections", type=int, default=64, help="connections (64)")
    scaling.add_argument("--threads", type=int, default=1, help="wrk threads (1)")
    scaling.set_defaults(handler=_scaling)
    gang = sub.add_parser("gang", help="/mutate p99 of a gang member against a single pod's")
    gang.add_argument("--gang-size", type=int, default=GANG_SIZE, help="pods per gang (8)")
    gang.add_argument("--rounds", type=int, default=6, help="rounds of both cases (6)")
    gang.add_argument("--rate", type=int, default=500, help="fixed rate, req/s (500)")
    gang.add_argument("--duration", type=float, default=15.0, help="seconds per run (15)")
    gang.add_argument("--rate-connections", type=int, default=16,
                      help="connections at the fixed rate (16)")
    gang.add_argument("--connections", type=int, default=32,
                      help="connections at saturation (32)")
    gang.add_argument("--saturation", action="store_true",
                      help="also each case at saturation (information)")
    gang.set_defaults(handler=_gang)
    why = sub.add_parser("breakdown", help="where the time of a /mutate goes")
    why.add_argument("--count", type=int, default=2000, help="calls per step (2000)")
    why.add_argument("--profile", action="store_true",
                     help="also py-spy --gil the server under load (pip install py-spy)")
    why.add_argument("--seconds", type=float, default=10.0, help="profile length (10)")
    why.add_argument("--connections", type=int, default=32, help="connections (32)")
    why.set_defaults(handler=_breakdown)
    srv = sub.add_parser("serve", help="only serve the bench app (for manual runs)")
    srv.add_argument("--cert-dir", required=True)
    srv.add_argument("--redis-url", required=True)
    srv.add_argument("--config-dir", required=True)
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--workers", type=int, default=1)
    srv.add_argument("--audit-off", action="store_true")
    srv.set_defaults(handler=_serve)
    args = parser.parse_args(argv)
    handler: Any = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
