"""In-process micro-benchmarks of the /mutate hot path: build_patch and the audit append.

Run: python -m bench.hotpath [--calls N] [--records N]
Prints one JSON object:
- ``patch``: µs per call (best and median of 7 rounds of ``--calls`` calls) for a small
  Job pod (bench.admission's) and a large pod (4 containers x 40 env vars, volumes, two
  node-selector terms, tolerations, gates): ``build_patch``, and for reference the former
  implementation, ``jsonpatch.make_patch`` of the pod and ``mutate_pod``'s deep copy.
- ``audit``: appending ``--records`` admission-shaped records against a private
  redis-server, writing the JSON lines to /dev/null (a real write + flush per batch):
  records/s, Redis CPU µs per record and per script call (``cmdstat_evalsha``), for
  ``AuditLog.record`` one at a time, ``record_many`` in batches of 16 and 256, and batches
  of 256 from two writers taking turns (every batch finds the head moved by the other
  writer: the worst case, two script calls per batch, one link hashed in Lua).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import redis

from admission.mutation import build_patch, mutate_pod
from admission.plan import PodPlan, plan_create
from audit.chain import AuditRecord
from audit.log import AuditLog
from bench.admission import pod, write_bench_config
from fairshare.localredis import local_redis
from tenants.localdir import load_config_dir
from tenants.models import FairgateConfig

ROUNDS = 7


def large_pod(namespace: str, name: str) -> dict[str, Any]:
    """A pod of realistic bulk: 4 containers with 40 env vars each, volumes, affinity with
    two required terms, tolerations and a foreign scheduling gate."""
    obj = pod(namespace, name)
    main = obj["spec"]["containers"][0]
    obj["spec"]["containers"] = [
        {**main, "name": f"c{i}",
         "env": [{"name": f"VAR_{j}", "value": f"value-{i}-{j}" * 3} for j in range(40)],
         "volumeMounts": [{"name": f"v{j}", "mountPath": f"/data/{j}"} for j in range(6)]}
        for i in range(4)
    ]
    obj["spec"]["volumes"] = [{"name": f"v{j}", "emptyDir": {}} for j in range(6)]
    obj["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "ml",
                                   "effect": "NoSchedule"}]
    obj["spec"]["schedulingGates"] = [{"name": "example.com/quota-check"}]
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                   "values": ["eu-west-1a", "eu-west-1b"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In",
                              "values": ["gpu-node-17"]}]},
        ]}}}
    obj["metadata"]["annotations"] = {f"example.com/note-{j}": "x" * 40 for j in range(10)}
    return obj


def per_call_us(call: Callable[[], object], calls: int) -> dict[str, float]:
    """Best and median µs per call over ROUNDS rounds of ``calls`` calls."""
    rounds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append(1e6 * (time.perf_counter() - started) / calls)
    return {"best_us": round(min(rounds), 1), "median_us": round(statistics.median(rounds), 1)}


def _plan(obj: dict[str, Any], config: FairgateConfig) -> PodPlan:
    plan = plan_create(obj, obj["metadata"]["namespace"], "0b5c6a86-uid", config)
    assert isinstance(plan, PodPlan), plan
    return plan


def patch_timings(config: FairgateConfig, calls: int) -> dict[str, Any]:
    """µs per call for the small and the large pod (training band, gated)."""
    classes = config.platform.priority_classes
    results: dict[str, Any] = {}
    for label, obj in (("small_pod", pod("fast-dev", "t-0")),
                       ("large_pod", large_pod("fast-dev", "t-1"))):
        plan = _plan(obj, config)

        def direct(obj: dict[str, Any] = obj, plan: PodPlan = plan) -> object:
            return build_patch(obj, plan, "training", True, classes)

        def diffed(obj: dict[str, Any] = obj, plan: PodPlan = plan) -> object:
            return jsonpatch.make_patch(obj, mutate_pod(obj, plan, "training", True, classes))

        results[label] = {
            "pod_json_bytes": len(json.dumps(obj)),
            "build_patch": per_call_us(direct, calls),
            "reference_make_patch_of_mutate_pod": per_call_us(diffed, calls),
        }
    return results


def audit_fields(i: int) -> dict[str, Any]:
    """An admission-shaped audit record's fields (~600-byte body)."""
    return {"uid": f"{i:08d}-0b5c-4c8e-9a43-7d1c6c1d2e11",
            "user": "system:serviceaccount:kube-system:job-controller",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "operation": "CREATE", "tenant": "fast", "namespace": "fast-dev",
            "name": f"trainer-{i}", "pod_class": "training", "demand": "gpu=1",
            "reason": "reserved as training within nominal quota", "latency_ms": 1.234}


def _evalsha(client: redis.Redis) -> tuple[float, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0)), int(stats.get("calls", 0))


def _append(client: redis.Redis, logs: list[AuditLog], records: int, batch: int) -> dict[str, Any]:
    """Append ``records`` records in batches of ``batch``, the logs taking turns."""
    client.flushall()
    logs[0].record("admit", **audit_fields(0))  # loads the script
    client.config_resetstat()
    started = time.perf_counter()
    for n, first in enumerate(range(0, records, batch)):
        log = logs[n % len(logs)]
        if batch == 1:
            log.record("admit", **audit_fields(first))
        else:
            log.record_many(AuditRecord("admit", **audit_fields(i))
                            for i in range(first, min(first + batch, records)))
    elapsed = time.perf_counter() - started
    usec, calls = _evalsha(client)
    result, _ = logs[0].verify()
    return {"records_per_s": round(records / elapsed),
            "redis_cpu_us_per_record": round(usec / records, 1),
            "redis_us_per_script_call": round(usec / max(calls, 1), 1),
            "chain_ok": result.ok and result.checked == records + 1}


def audit_timings(records: int) -> dict[str, Any]:
    """records/s and Redis CPU per record, one at a time and in batches."""
    results: dict[str, Any] = {"records": records}
    with local_redis() as url, open(os.devnull, "w", encoding="utf-8") as sink:
        client = redis.Redis.from_url(url)
        other = redis.Redis.from_url(url)
        log = AuditLog(client, out=sink)
        results["record_one_at_a_time"] = _append(client, [log], records, 1)
        results["record_many_16"] = _append(client, [log], records, 16)
        results["record_many_256"] = _append(client, [log], records, 256)
        results["record_many_256_two_writers_alternating"] = _append(
            client, [log, AuditLog(other, out=sink)], records, 256)
        client.close()
        other.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="build_patch calls per round")
    parser.add_argument("--records", type=int, default=5000, help="audit records per measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config_dir(write_bench_config(Path(tmp) / "config"))
    results = {"load_average": os.getloadavg()[0],
               "patch": patch_timings(config, args.calls),
               "audit": audit_timings(args.records)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
