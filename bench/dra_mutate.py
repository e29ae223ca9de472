"""Benchmark: ``/mutate`` of a pod with ResourceClaims against a ``nvidia.com/gpu`` pod.

    python -m bench.dra_mutate                          # 20 rounds x 100 requests per case
    python -m bench.dra_mutate --rounds 5 --batch 50 --json dra.json
    python -m bench.dra_mutate --gpu-nodes 32 --mig-nodes 32   # more published devices

In one process, against a private ``redis-server`` (or ``--redis-url URL``: its current
database is emptied before every batch), a :class:`webhook.service.AdmissionService` built
as ``fairgate serve`` builds it, with a static DRA source in place of the cluster's watches
(the objects a ``DraWatch`` would hold: the NVIDIA driver's two DeviceClasses with their
selectors, two ResourceClaimTemplates, and ResourceSlices publishing ``--gpu-nodes`` x
``--gpus-per-node`` whole GPUs and ``--mig-nodes`` x ``--migs-per-node`` ``1g.5gb`` MIG
devices, with the attributes and capacities the driver publishes). Each request is a real
AdmissionReview v1 pod CREATE with a fresh request uid and pod name, answered through
``AdmissionService.review("mutate", body, progress)`` as ``webhook.app`` calls it (a
:class:`~webhook.service.Progress` started at receipt, the decision a future awaited with
the deadline). Cases:

- ``gpu``: a pod with ``nvidia.com/gpu: 1`` (the device plugin; no claims): reserved at once.
- ``dra-gpu``: a pod naming a ResourceClaimTemplate of one ``gpu.nvidia.com`` device.
- ``dra-mig``: a pod naming a ResourceClaimTemplate of one ``mig.nvidia.com`` device whose
  CEL selector (``profile == "1g.5gb"``) is evaluated, with the class's, against every
  published device.

Pods with claims are always queued behind the gate (the dispatcher checks their claims
before it lifts it); each case has a tenant of its own with room for every pod, so the
``gpu`` pod is always reserved. Every request's outcome is checked against its case's
path (an answer off it is counted with its reason, and the target is missed).

Each round runs ``--batch`` requests of each case, one at a time, the cases in an order
that rotates from round to round. Before each batch Redis is emptied and one request of
the case is answered unmeasured (the config stored again), so every batch meets the same
state: the ``gpu`` tenant holding only its own batch's reservations, a DRA tenant only its
own batch's queued pods (all naming one template, as a Job's pods do: the noting of
what a template was priced at looks at each live pod noted under it, so ``--batch`` also
sets that number). Each batch is measured alone: ``CONFIG RESETSTAT`` before it and
``INFO commandstats`` after it give the commands Redis ran (a script's own
``redis.call``s counted beside its ``fcall``) and their time in Redis; the service's Redis
client counts the round trips it makes (commands sent). The budget states (one HGETALL
every 5 s in ``fairgate serve``, not per request) are read once, at the first (unmeasured)
request. Audit records are written to memory (their Redis writes are batched off the
request path, one record per request in every case).

Prints a Markdown table (p50/p99/mean ms per case, each case's over ``gpu``'s, Redis round
trips and commands per request) and one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from admission.devices import published_devices
from admission.dra import DraObject, DraObjects
from audit import AuditLog
from fairshare.connection import connect_redis_async
from fairshare.localredis import local_redis
from tenants.localdir import write_config_dir
from tenants.source import LocalDirSource
from webhook.service import AdmissionService, Progress

DEADLINE_SECONDS = 10.0  # fairgate serve's is shorter; a bench request never nears it
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PROFILE = "1g.5gb"
CLASS_SELECTORS = {  # as the NVIDIA driver's DeviceClasses select their devices
    GPU_CLASS: ('device.driver == "gpu.nvidia.com" && '
                'device.attributes["gpu.nvidia.com"].type == "gpu"',),
    MIG_CLASS: ('device.driver == "gpu.nvidia.com" && '
                'device.attributes["gpu.nvidia.com"].type == "mig"',),
}
CASES = ("gpu", "dra-gpu", "dra-mig")
EXPECTED = {"gpu": "admit", "dra-gpu": "queue", "dra-mig": "queue"}
TEMPLATE_OF = {"dra-gpu": "one-gpu", "dra-mig": "one-mig"}
# the bench's own commands, left out of the commands per request
_OWN = {"info", "config|resetstat"}

# One tenant per case, each with room for every pod.
TENANT_OF = {"gpu": "gpu", "dra-gpu": "dragpu", "dra-mig": "dramig"}
PLATFORM_YAML = "platformAdmins: {groups: [platform-team]}\n" \
    "capacity: {gpu: 100000000, mig-1g.5gb: 100000000}\ntenants:\n" + "".join(
        f"  {t}: {{weight: 1, ceiling: {{gpuEquivalents: 100000000}}}}\n"
        for t in TENANT_OF.values()) + "onRedisUnavailable: deny\n"
QUOTAS = {t: "nominal: {gpu: 10000000, mig-1g.5gb: 10000000}\ndefaultClass: training\n"
          for t in TENANT_OF.values()}
NAMESPACES_YAML = "".join(f"{t}-dev: {{fairgate.io/tenant: {t}}}\n" for t in TENANT_OF.values())


def namespace(case: str) -> str:
    """The namespace of ``case``'s pods (its tenant's)."""
    return f"{TENANT_OF[case]}-dev"


# -- what the cluster shows --------------------------------------------------------------


def _attributes(**values: str | int) -> dict[str, dict[str, str | int]]:
    out: dict[str, dict[str, str | int]] = {}
    for name, value in values.items():
        if isinstance(value, int):
            out[name] = {"int": value}
        elif name in ("driverVersion", "cudaComputeCapability", "cudaDriverVersion"):
            out[name] = {"version": value}
        else:
            out[name] = {"string": value}
    return out


def gpu_slice(node: str, gpus: int) -> dict[str, Any]:
    """A ResourceSlice as the NVIDIA DRA driver publishes a node's whole GPUs (H100)."""
    devices = [{
        "name": f"gpu-{i}",
        "attributes": _attributes(
            type="gpu", uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}",
            productName="NVIDIA H100 80GB HBM3", brand="Nvidia", architecture="Hopper",
            driverVersion="560.35.3", cudaComputeCapability="9.0", cudaDriverVersion="12.6.0",
            pcieBusID=f"0000:{0x18 + i:02x}:00.0", index=i, minor=i),
        "capacity": {"memory": {"value": "80Gi"}},
    } for i in range(gpus)]
    return {"spec": {"driver": GPU_CLASS, "nodeName": node,
                     "pool": {"name": node, "generation": 1}, "devices": devices}}


def mig_slice(node: str, migs: int) -> dict[str, Any]:
    """A ResourceSlice as the driver publishes a node's ``1g.5gb`` MIG devices (A100)."""
    parent = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, node)}"
    devices = [{
        "name": f"gpu-0-mig-1g5gb-{i}",
        "attributes": _attributes(
            type="mig", profile=PROFILE, parentUUID=parent,
            uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/mig/{i}')}",
            productName="NVIDIA A100-SXM4-40GB", brand="Nvidia", architecture="Ampere",
            driverVersion="560.35.3", cudaComputeCapability="8.0", cudaDriverVersion="12.6.0",
            pcieBusID="0000:07:00.0", index=0, parentMinor=0, memorySlice=i),
        "capacity": {"memory": {"value": "4864Mi"}, "multiprocessors": {"value": "14"},
                     "copyEngines": {"value": "1"}, "decoders": {"value": "0"},
                     "encoders": {"value": "0"}, "jpegEngines": {"value": "0"},
                     "ofaEngines": {"value": "0"}},
    } for i in range(migs)]
    return {"spec": {"driver": GPU_CLASS, "nodeName": node,
                     "pool": {"name": node, "generation": 1}, "devices": devices}}


def claim_template(device_class: str, selector: str | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate's ``spec.spec``: one device of ``device_class``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": 1}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


class StaticDra:
    """The DRA objects a ``DraWatch`` would hold for this cluster (never changing)."""

    def __init__(self, gpu_nodes: int, gpus_per_node: int, mig_nodes: int,
                 migs_per_node: int) -> None:
        slices = [gpu_slice(f"gpu-node-{n}", gpus_per_node) for n in range(gpu_nodes)]
        slices += [mig_slice(f"mig-node-{n}", migs_per_node) for n in range(mig_nodes)]
        profile = f'device.attributes["gpu.nvidia.com"].profile == "{PROFILE}"'
        specs = {"dra-gpu": claim_template(GPU_CLASS),
                 "dra-mig": claim_template(MIG_CLASS, profile)}
        self._objects = DraObjects(
            templates={(namespace(case), TEMPLATE_OF[case]): DraObject(spec, uid=str(uuid.uuid4()))
                       for case, spec in specs.items()},
            class_selectors=CLASS_SELECTORS,
            devices=published_devices(slices),
        )

    def objects(self) -> DraObjects:
        return self._objects

    def objects_for(self, pod: object, namespace: str) -> DraObjects:
        return self._objects  # every template the pods name is in the watch's cache


# -- the requests ------------------------------------------------------------------------


def pod(case: str, name: str) -> dict[str, Any]:
    """A training pod of ``case`` as a Job controller would create it."""
    resources: dict[str, Any] = {"limits": {"cpu": "4", "memory": "16Gi"},
                                 "requests": {"cpu": "4", "memory": "16Gi"}}
    spec: dict[str, Any] = {"restartPolicy": "Never"}
    if case == "gpu":
        resources["limits"]["nvidia.com/gpu"] = "1"
    else:
        resources["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu",
                                   "resourceClaimTemplateName": TEMPLATE_OF[case]}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace(case),
            "labels": {"app": "trainer", "job-name": "trainer"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer",
                                 "uid": "0b5c6a86-8f2f-4c8e-9a43-7d1c6c1d2e11",
                                 "controller": True}],
        },
        "spec": {**spec, "containers": [{
            "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "train.py"], "resources": resources}]},
    }


def body(case: str) -> bytes:
    """An AdmissionReview v1 pod CREATE of ``case``: a fresh request uid and pod name."""
    uid = str(uuid.uuid4())
    obj = pod(case, f"trainer-{uid[:8]}")
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "name": obj["metadata"]["name"],
            "namespace": namespace(case),
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": obj, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }).encode()


# -- measuring ---------------------------------------------------------------------------


class CountingClient:
    """Counts the commands (round trips) a ``redis.asyncio.Redis`` sends, by name."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.sent: Counter[str] = Counter()
        send = client.execute_command

        async def counted(*args: Any, **options: Any) -> Any:
            self.sent[str(args[0]).lower()] += 1
            return await send(*args, **options)  # type: ignore[no-untyped-call]

        client.execute_command = counted  # type: ignore[method-assign]


@dataclass
class Tally:
    """What one case's measured requests took, over all rounds."""

    latencies_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)  # round trips by command
    ran: Counter[str] = field(default_factory=Counter)  # commands Redis ran, by name
    redis_usec: float = 0.0  # Redis' own time of those commands


@dataclass
class CaseResult:
    case: str
    requests: int
    outcomes: dict[str, int]
    p50_ms: float
    p99_ms: float
    mean_ms: float
    p50_ratio: float  # over the gpu case's
    p99_ratio: float
    round_trips: float  # commands the service sent, per request
    redis_commands: float  # commands Redis ran (scripts' redis.calls included), per request
    redis_us: float  # Redis' time of them, per request
    sent: dict[str, float]
    ran: dict[str, float]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, float]]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in stats.items() if name.removeprefix("cmdstat_") not in _OWN}


async def _answer(service: AdmissionService, payload: bytes) -> tuple[float, str]:
    """One ``/mutate`` as ``webhook.app`` answers it: wall ms and the decision."""
    started = time.perf_counter()
    progress = Progress(started=started)
    decision = asyncio.ensure_future(service.review("mutate", payload, progress))
    done, _ = await asyncio.wait((decision,), timeout=DEADLINE_SECONDS)
    if not done:
        raise RuntimeError("a bench request missed the deadline")
    answer = decision.result()
    elapsed = 1e3 * (time.perf_counter() - started)
    response = answer.to_json()["response"]
    annotations = response.get("auditAnnotations") or {}
    verdict = str(annotations.get("decision", "allowed" if response["allowed"] else "denied"))
    if verdict not in EXPECTED.values():  # off every case's path: say why
        message = (response.get("status") or {}).get("message", "")
        verdict = f"{verdict} ({annotations.get('reason', '')}: {message})"
    return elapsed, verdict


async def _run(redis_url: str, sync: redis.Redis, config_dir: Path, dra: StaticDra,
               rounds: int, batch: int) -> dict[str, Tally]:
    source = LocalDirSource(config_dir)
    source.start()
    client = connect_redis_async(redis_url)
    counter = CountingClient(client)
    service = AdmissionService(source, client, AuditLog(None, out=io.StringIO()), dra=dra,
                               budget_refresh=float("inf"))
    service.start()
    tallies = {case: Tally() for case in CASES}
    try:
        for number in range(rounds):
            order = CASES[number % len(CASES):] + CASES[:number % len(CASES)]
            for case in order:
                tally = tallies[case]
                sync.flushdb()
                _, outcome = await _answer(service, body(case))  # unmeasured: config stored
                if outcome != EXPECTED[case]:
                    raise RuntimeError(f"{case}: warm-up answered {outcome}")
                payloads = [body(case) for _ in range(batch)]
                counter.sent.clear()
                sync.config_resetstat()
                for payload in payloads:
                    elapsed, outcome = await _answer(service, payload)
                    tally.latencies_ms.append(elapsed)
                    tally.outcomes[outcome] += 1
                for name, (calls, usec) in _commandstats(sync).items():
                    tally.ran[name] += calls
                    tally.redis_usec += usec
                tally.sent.update(counter.sent)
    finally:
        service.stop()
        await client.aclose()
    return tallies


def results(tallies: dict[str, Tally]) -> list[CaseResult]:
    """Per case: percentiles, ratios over ``gpu`` and Redis per request."""
    base = tallies["gpu"].latencies_ms
    base_p50, base_p99 = percentile(base, 50), percentile(base, 99)
    out = []
    for case, tally in tallies.items():
        n = len(tally.latencies_ms)
        p50, p99 = percentile(tally.latencies_ms, 50), percentile(tally.latencies_ms, 99)
        out.append(CaseResult(
            case=case, requests=n, outcomes=dict(tally.outcomes),
            p50_ms=round(p50, 3), p99_ms=round(p99, 3),
            mean_ms=round(sum(tally.latencies_ms) / n, 3),
            p50_ratio=round(p50 / base_p50, 2), p99_ratio=round(p99 / base_p99, 2),
            round_trips=round(sum(tally.sent.values()) / n, 3),
            redis_commands=round(sum(tally.ran.values()) / n, 3),
            redis_us=round(tally.redis_usec / n, 1),
            sent={k: round(v / n, 3) for k, v in sorted(tally.sent.items())},
            ran={k: round(v / n, 3) for k, v in sorted(tally.ran.items())},
        ))
    return out


def verdicts(rows: Sequence[CaseResult], p99_target: float) -> dict[str, Any]:
    """The targets: no Redis round trip more than before for a pod without claims (the
    admission itself, one ``fcall``), exactly one more for a pod with claims, and each
    DRA pod's p99 within ``p99_target`` times the GPU pod's."""
    by = {r.case: r for r in rows}
    gpu = by["gpu"]
    return {
        "every_request_on_its_path": all(r.outcomes == {EXPECTED[r.case]: r.requests}
                                         for r in rows),
        "gpu_pod_round_trips_one_fcall": gpu.sent == {"fcall": 1.0},
        **{f"{case}_round_trips_gpu_plus_one": by[case].round_trips == gpu.round_trips + 1
           for case in CASES[1:]},
        **{f"{case}_p99_within_{p99_target}x": by[case].p99_ratio <= p99_target
           for case in CASES[1:]},
    }


def table(rows: Sequence[CaseResult]) -> str:
    lines = ["| case | requests | outcome | p50 ms | p99 ms | mean ms | p50 / gpu | "
             "p99 / gpu | Redis round trips/req | Redis commands/req | Redis µs/req |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        outcome = ", ".join(f"{k} {v}" for k, v in r.outcomes.items())
        trips = ", ".join(f"{k} {v:g}" for k, v in r.sent.items())
        lines.append(f"| {r.case} | {r.requests} | {outcome} | {r.p50_ms:.2f} | "
                     f"{r.p99_ms:.2f} | {r.mean_ms:.2f} | {r.p50_ratio:.2f} | "
                     f"{r.p99_ratio:.2f} | {r.round_trips:g} ({trips}) | "
                     f"{r.redis_commands:.1f} | {r.redis_us:.1f} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    return {"cpus": os.cpu_count(), "cpu": model, "python": sys.version.split()[0],
            "redis_py": redis.__version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole bench: the JSON object it prints."""
    dra = StaticDra(args.gpu_nodes, args.gpus_per_node, args.mig_nodes, args.migs_per_node)
    with ExitStack() as stack:
        url = args.redis_url or stack.enter_context(local_redis())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dra-bench-")))
        config_dir = write_config_dir(workdir / "config", PLATFORM_YAML, QUOTAS,
                                      NAMESPACES_YAML)
        sync = redis.Redis.from_url(url)
        stack.callback(sync.close)
        redis_version = str(sync.info("server")["redis_version"])
        load_start = os.getloadavg()
        tallies = asyncio.run(_run(url, sync, config_dir, dra, args.rounds, args.batch))
        load_end = os.getloadavg()
    rows = results(tallies)
    return {
        "machine": {**machine(), "redis": redis_version,
                    "load_average": {"start": load_start, "end": load_end}},
        "published_devices": {"gpu": args.gpu_nodes * args.gpus_per_node,
                              "mig-1g.5gb": args.mig_nodes * args.migs_per_node},
        "rounds": args.rounds, "batch": args.batch,
        "cases": [asdict(r) for r in rows],
        "targets": verdicts(rows, args.p99_target),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.dra_mutate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="rounds (20)")
    p.add_argument("--batch", type=int, default=100,
                   help="requests of each case per round (100)")
    p.add_argument("--gpu-nodes", type=int, default=8, help="nodes of whole GPUs (8)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs a node publishes (8)")
    p.add_argument("--mig-nodes", type=int, default=8, help="nodes of MIG devices (8)")
    p.add_argument("--migs-per-node", type=int, default=7,
                   help="1g.5gb MIG devices a node publishes (7)")
    p.add_argument("--p99-target", type=float, default=1.5,
                   help="a DRA pod's p99 at most this times the GPU pod's (1.5)")
    p.add_argument("--redis-url", help="use this Redis (its current database is emptied)")
    p.add_argument("--json", type=Path, help="also write the JSON object here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.dra_mutate [options]``; exit 1 when a target is missed."""
    args = parser().parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        parser().error("--rounds and --batch must be at least 1")
    out = run(args)
    rows = [CaseResult(**case) for case in out["cases"]]
    print(table(rows))
    print()
    for name, met in out["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(json.dumps(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(out["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
