"""Gang release latency on the e2e control plane: from the last member's CREATE to every
member's ``fairgate.io/queue`` gate lifted, for gangs of 8 and 256 one-GPU pods.

Usage: python bench/gang_release.py [--sizes 8,256] [--reps 5] [--json out.json]

Starts a private e2e cluster (tests/e2e/harness/private.py: its own kube-apiserver,
scheduler and controller-manager, the fake kubelet, fairgate from manifests/ with
`fairgate serve` and `fairgate dispatch` running) with 33 fake nodes of 8 whole GPUs
(264 GPUs) and tenant team-a's quota raised to 300 GPUs, so every gang fits at once.
Each repetition, as team-a's (non-admin) user, creates one gang of one-GPU training
pods carrying fairgate's label ``fairgate.io/pod-group`` (a fresh name) and annotation
``fairgate.io/pod-group-size``, from 16 threads at once (as a Job controller's burst).
A watch on the gang's pods, started before the first CREATE, notes when each pod is
first seen without the gate. Reported per repetition, from the moment the last CREATE
returned: the first gate seen lifted, every gate lifted; the lift rate between the two
(pods/s), whether every member was gated at CREATE, and the create burst's duration.
Sizes are interleaved (8, 256, 8, 256, ...); the gang's pods are deleted and the bench
waits for fairgate to free their usage before the next repetition.
Prints a Markdown table (median and max per size, and the per-pod cost 256 over 8) and
one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from harness.fairgate import PLATFORM_YAML, QUOTA_YAML, pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import pod_manifest
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for
from kubernetes import watch

TENANT = "team-a"
NS = tenant_namespace(TENANT)
GATE = "fairgate.io/queue"
BENCH_LABEL = "bench.fairgate.io/gang"
NODES = tuple(whole_gpu_node(f"gpu-{i:02d}", 8) for i in range(33))  # 264 GPUs
PLATFORM = PLATFORM_YAML.replace("ceiling: {gpuEquivalents: 9}   # nominal 5 + borrowLimit 4",
                                 "ceiling: {gpuEquivalents: 300}")
QUOTAS = {**QUOTA_YAML, TENANT: """\
nominal: {gpu: 300}
borrowLimit: {gpuEquivalents: 0}
inferenceReserve: {gpuEquivalents: 0}
defaultClass: training
"""}
CREATE_THREADS = 16


@dataclass(frozen=True)
class Rep:
    """One gang's figures; times in ms from the last CREATE's return."""

    size: int
    create_burst_ms: float  # first CREATE sent to last CREATE returned
    first_lift_ms: float
    all_lifted_ms: float
    lift_rate_per_s: float  # (size - 1) / (all lifted - first lift)
    gated_at_create: int  # members seen with the gate in their first watch event


class GateWatch:
    """Watches one gang's pods (by label) from before their CREATEs: the monotonic time
    each pod was first seen without the gate, and which pods were first seen gated."""

    def __init__(self, core: Any, gang: str, size: int) -> None:
        self.core, self.size = core, size
        self.selector = f"{BENCH_LABEL}={gang}"
        self.lifted: dict[str, float] = {}
        self.gated: set[str] = set()
        self.seen: set[str] = set()
        self.done = threading.Event()
        self._watch = watch.Watch()
        listing = core.list_namespaced_pod(NS, label_selector=self.selector)
        self._rv = listing.metadata.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for event in self._watch.stream(self.core.list_namespaced_pod, NS,
                                        label_selector=self.selector,
                                        resource_version=self._rv, timeout_seconds=300):
            now = time.perf_counter()
            pod = event["object"]
            name = pod.metadata.name
            gates = {g.name for g in (pod.spec.scheduling_gates or [])}
            if name not in self.seen:
                self.seen.add(name)
                if GATE in gates:
                    self.gated.add(name)
            if GATE not in gates and name not in self.lifted and event["type"] != "DELETED":
                self.lifted[name] = now
                if len(self.lifted) >= self.size:
                    self.done.set()
                    break
        self._watch.stop()

    def wait(self, timeout: float) -> None:
        """Until every member was seen without the gate (raises after ``timeout`` s)."""
        if not self.done.wait(timeout):
            raise RuntimeError(f"{len(self.lifted)} of {self.size} gates lifted after "
                               f"{timeout}s ({len(self.gated)} seen gated)")
        self._thread.join(10)


def used(env: PrivateCluster) -> float:
    """GPUs fairgate counts team-a as using."""
    return float(env.fairgate.tenant_state(TENANT).get("used", 0) or 0)


def run_gang(env: PrivateCluster, user: Any, size: int, number: int) -> Rep:
    """Create one gang of ``size``, time its release, delete it and wait until fairgate
    freed its usage."""
    gang = f"bench-{size}-{number}"
    bodies = [pod_manifest(f"{gang}-{i}", {"nvidia.com/gpu": 1},
                           labels={"fairgate.io/pod-group": gang, BENCH_LABEL: gang},
                           annotations={"fairgate.io/pod-group-size": str(size)})
              for i in range(size)]
    gates = GateWatch(env.admin, gang, size)
    started = time.perf_counter()
    returned: list[float] = []

    def create(body: dict[str, Any]) -> None:
        user.create_namespaced_pod(NS, body)
        returned.append(time.perf_counter())

    with ThreadPoolExecutor(min(CREATE_THREADS, size)) as pool:
        list(pool.map(create, bodies))
    last = max(returned)
    gates.wait(120)
    lifts = sorted(gates.lifted.values())
    first_ms, all_ms = 1000 * (lifts[0] - last), 1000 * (lifts[-1] - last)
    span = lifts[-1] - lifts[0]
    rep = Rep(size=size, create_burst_ms=round(1000 * (last - started), 1),
              first_lift_ms=round(first_ms, 1), all_lifted_ms=round(all_ms, 1),
              lift_rate_per_s=round((size - 1) / span, 1) if span > 0 else float("inf"),
              gated_at_create=len(gates.gated))
    env.admin.delete_collection_namespaced_pod(NS, label_selector=f"{BENCH_LABEL}={gang}",
                                               grace_period_seconds=0)
    wait_for(lambda: not env.admin.list_namespaced_pod(
        NS, label_selector=f"{BENCH_LABEL}={gang}").items, 120, f"gang {gang} to be gone")
    wait_for(lambda: used(env) == 0, 120, "fairgate to free the gang's usage")
    return rep


def summary(reps: list[Rep]) -> dict[int, dict[str, float]]:
    """Per size: median and max of each time, median lift rate."""
    out: dict[int, dict[str, float]] = {}
    for size in sorted({r.size for r in reps}):
        mine = [r for r in reps if r.size == size]
        out[size] = {
            "reps": len(mine),
            "all_lifted_ms_median": round(statistics.median(r.all_lifted_ms for r in mine), 1),
            "all_lifted_ms_max": max(r.all_lifted_ms for r in mine),
            "first_lift_ms_median": round(statistics.median(r.first_lift_ms for r in mine), 1),
            "first_lift_ms_max": max(r.first_lift_ms for r in mine),
            "lift_rate_per_s_median": round(statistics.median(r.lift_rate_per_s for r in mine), 1),
            "create_burst_ms_median": round(statistics.median(r.create_burst_ms for r in mine), 1),
            "all_gated_at_create": all(r.gated_at_create == size for r in mine),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,256", help="gang sizes, interleaved (8,256)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per size (5)")
    parser.add_argument("--json", help="also write the JSON object to this file")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) > sum(n.gpu_count for n in NODES):
        parser.error("a gang larger than the fake cluster's 264 GPUs never fits")

    reps: list[Rep] = []
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        env = stack.enter_context(private_cluster(Path(tmp), NODES, platform_yaml=PLATFORM,
                                                  quotas=QUOTAS))
        user = pods_api(env.cp, TENANT)
        wait_for(lambda: env.class_capacity().get("gpu", 0) >= max(sizes), 120,
                 "fairgate to see the fake GPUs")
        for number in range(args.reps):
            for size in sizes:
                rep = run_gang(env, user, size, number)
                reps.append(rep)
                print(f"gang of {size} #{number + 1}: first lift {rep.first_lift_ms:.0f} ms, "
                      f"all lifted {rep.all_lifted_ms:.0f} ms, {rep.lift_rate_per_s}/s, "
                      f"gated {rep.gated_at_create}/{size}", file=sys.stderr, flush=True)
        env.fairgate.check_alive()

    figures = summary(reps)
    print("| gang | reps | last CREATE -> first gate lifted, median / max ms | "
          "-> all lifted, median / max ms | lift rate, pods/s | per pod ms |")
    print("|---|---|---|---|---|---|")
    for size, f in figures.items():
        print(f"| {size} | {f['reps']} | {f['first_lift_ms_median']:.0f} / "
              f"{f['first_lift_ms_max']:.0f} | {f['all_lifted_ms_median']:.0f} / "
              f"{f['all_lifted_ms_max']:.0f} | {f['lift_rate_per_s_median']} | "
              f"{f['all_lifted_ms_median'] / size:.1f} |")
    report = {"sizes": sizes, "summary": figures, "reps": [asdict(r) for r in reps],
              "load_average": {"before": load_before, "after": os.getloadavg()},
              "cpus": os.cpu_count()}
    print()
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
