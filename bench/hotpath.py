"""In-process micro-benchmarks of the /mutate hot path: build_patch and the audit append.

Run: python -m bench.hotpath [--calls N] [--records N]
Prints one JSON object:
- ``build_patch``: µs per call (best and median of 7 rounds of ``--calls`` calls) for a
  small Job pod (bench.admission's) and a large pod (4 containers x 40 env vars, volumes,
  two node-selector terms, tolerations, gates).
- ``audit``: records/s and Redis CPU µs per record (``cmdstat_evalsha``) appending
  ``--records`` admission-shaped records with ``AuditLog.record`` one at a time, against a
  private redis-server, writing the JSON lines to /dev/null (a real write + flush).
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

import redis

from admission.mutation import build_patch
from admission.plan import PodPlan, plan_create
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
    """µs per build_patch call for the small and the large pod (training band, gated)."""
    classes = config.platform.priority_classes
    results: dict[str, Any] = {}
    for label, obj in (("small_pod", pod("fast-dev", "t-0")),
                       ("large_pod", large_pod("fast-dev", "t-1"))):
        plan = _plan(obj, config)
        results[label] = {
            "pod_json_bytes": len(json.dumps(obj)),
            "build_patch": per_call_us(
                lambda o=obj, p=plan: build_patch(o, p, "training", True, classes), calls),
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


def _evalsha_usec(client: redis.Redis) -> float:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec", 0))


def audit_timings(records: int) -> dict[str, Any]:
    """records/s and Redis CPU per record for one-at-a-time appends."""
    results: dict[str, Any] = {"records": records}
    with local_redis() as url, open(os.devnull, "w", encoding="utf-8") as sink:
        client = redis.Redis.from_url(url)
        log = AuditLog(client, out=sink)
        client.config_resetstat()
        started = time.perf_counter()
        for i in range(records):
            log.record("admit", **audit_fields(i))
        elapsed = time.perf_counter() - started
        results["record_one_at_a_time"] = {
            "records_per_s": round(records / elapsed),
            "redis_cpu_us_per_record": round(_evalsha_usec(client) / records, 1),
            "chain_ok": log.verify()[0].ok,
        }
        client.close()
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
