"""Create-to-Running of a fitting inference pod while a training backlog waits, on the
real control plane (the seed's SLA: 200 ms).

Usage: python bench/e2e_inference_sla.py [--backlog N] [--pods N] [--workers W]

One e2e cluster as in bench/e2e_pod_create.py (kube-apiserver, kube-scheduler,
kube-controller-manager, etcd, the 4 default fake GPU nodes with 8 whole GPUs and the
fake kubelet; fairgate installed from manifests/ with `fairgate serve` and `fairgate
dispatch` running). A watch on every pod timestamps when each is bound (spec.nodeName)
and when the fake kubelet reports it Running. Three phases, `--pods` inference pods
each, created one at a time by the tenant's user, each deleted once Running:

1. baseline: fairgate's webhook configurations removed and no backlog: what the API
   server, the scheduler and the fake kubelet (which polls every 0.2 s) take alone;
2. fits: fairgate on; team-b (nominal 4 GPUs, no borrowing) has created 4 + N training
   pods in parallel: 4 run and N wait gated for quota. team-a creates 1-GPU inference
   pods: 4 whole GPUs are free;
3. preempt: team-a has created 8 + N training pods: 4 within nominal and 4 borrowed
   fill the cluster's 8 whole GPUs and N wait. team-b creates 1-GPU inference pods:
   each must make the scheduler preempt a borrowed pod, and the fake kubelet finish its
   graceful deletion, first. Before the next one, a new borrowed team-a pod refills the
   GPU (the backlog itself waits for nominal room: its band was fixed at create).

Prints, per phase, p50/p99 of: the create call, create -> bound, create -> Running,
and how many inference pods fairgate gated.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from e2e_pod_create import Webhooks, percentile, start_cluster
from harness.fairgate import FairgateStack, pods_api, tenant_namespace
from harness.pods import pod_manifest
from harness.waiting import wait_for
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

CLUSTER_GPUS = 8  # whole GPUs of the default fake nodes
INFERENCE = {"fairgate.io/class": "inference"}


@dataclass
class PodTimes:
    """When the watch first saw a pod bound and Running, and whether it is gone."""

    bound: float | None = None
    running: float | None = None
    deleted: bool = False


@dataclass
class PodWatch:
    """Timestamps (time.perf_counter) of every pod's binding and Running, from one watch
    over all namespaces, kept up in a daemon thread."""

    core: Any
    pods: dict[tuple[str, str], PodTimes] = field(default_factory=dict)
    phases: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, args=(self._list(),), daemon=True).start()

    def _list(self) -> str:
        """Record every pod as listed now (those gone since count as deleted); the list's
        resource version."""
        listed = self.core.list_pod_for_all_namespaces()
        present = {(p.metadata.namespace, p.metadata.name) for p in listed.items}
        with self.lock:
            for key in set(self.phases) - present:
                self.pods[key].deleted = True
                del self.phases[key]
        for pod in listed.items:
            self._record(pod, "ADDED")
        version: str = listed.metadata.resource_version
        return version

    def stop(self) -> None:
        """Stop recording (call before the API server stops: the thread then ends
        quietly at its next error or event)."""
        self.stopped.set()

    def _run(self, resource_version: str) -> None:
        while not self.stopped.is_set():
            # Watch.stream resumes from the last version it saw when the server ends a
            # watch; an ERROR event (history expired) or a dropped connection: list again.
            try:
                for event in watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, resource_version=resource_version
                ):
                    if event["type"] == "ERROR" or self.stopped.is_set():
                        break
                    self._record(event["object"], event["type"])
            except (ApiException, urllib3.exceptions.HTTPError) as error:
                if self.stopped.is_set():
                    return
                print(f"  (pod watch: {type(error).__name__}: {error}; listing again)",
                      flush=True)
            if not self.stopped.is_set():
                resource_version = self._list()

    def _record(self, pod: Any, kind: str) -> None:
        now = time.perf_counter()
        key = (pod.metadata.namespace, pod.metadata.name)
        with self.lock:
            times = self.pods.setdefault(key, PodTimes())
            if kind == "DELETED":
                times.deleted = True
                self.phases.pop(key, None)
                return
            self.phases[key] = pod.status.phase or "Pending"
            if times.bound is None and pod.spec.node_name:
                times.bound = now
            if times.running is None and pod.status.phase == "Running":
                times.running = now

    def times(self, namespace: str, name: str) -> PodTimes:
        with self.lock:
            return self.pods.get((namespace, name), PodTimes())

    def running(self, namespace: str) -> int:
        with self.lock:
            return sum(1 for (ns, _), p in self.phases.items()
                       if ns == namespace and p == "Running")

    def count(self, namespace: str) -> int:
        with self.lock:
            return sum(1 for ns, _ in self.phases if ns == namespace)


@dataclass
class Samples:
    """Per inference pod: the create call, create -> bound, create -> Running (ms)."""

    create: list[float] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    gated: int = 0


def create_backlog(core: Any, namespace: str, count: int, workers: int) -> None:
    """Create `count` 1-GPU training pods in parallel API calls."""
    def create(i: int) -> None:
        core.create_namespaced_pod(namespace, pod_manifest(f"train-{i}", {"nvidia.com/gpu": 1}))

    began = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(count)))
    took = time.perf_counter() - began
    print(f"  created {count} training pods in {namespace} in {took:.1f}s "
          f"({count / took:.0f}/s, {workers} in parallel)", flush=True)


def wait_backlog(fairgate: FairgateStack, pods: PodWatch, tenant: str, running: int,
                 queued: int) -> None:
    namespace = tenant_namespace(tenant)
    wait_for(lambda: pods.running(namespace) == running, 300, f"{running} {tenant} pods to run")

    def queued_now() -> int:
        count: int = fairgate.tenant_state(tenant).get("queued", {}).get("training", 0)
        return count

    wait_for(lambda: queued_now() == queued, 300, f"{queued} {tenant} pods queued")


def measure(core: Any, pods: PodWatch, namespace: str, label: str, count: int,
            before_each: Any = None) -> Samples:
    """Create `count` inference pods one at a time; each deleted once Running."""
    samples = Samples()
    for i in range(count):
        if before_each is not None:
            before_each()
        name = f"{label}-{i}"
        began = time.perf_counter()
        created = core.create_namespaced_pod(
            namespace, pod_manifest(name, {"nvidia.com/gpu": 1}, labels=INFERENCE)
        )
        samples.create.append((time.perf_counter() - began) * 1000)
        samples.gated += bool(created.spec.scheduling_gates)
        wait_for(lambda n=name: pods.times(namespace, n).running is not None, 120,
                 f"{namespace}/{name} to run")
        times = pods.times(namespace, name)
        assert times.bound is not None and times.running is not None
        samples.bound.append((times.bound - began) * 1000)
        samples.running.append((times.running - began) * 1000)
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wait_for(lambda n=name: pods.times(namespace, n).deleted, 60,
                 f"{namespace}/{name} to go")
    return samples


def clean(admin: Any, fairgate: FairgateStack, pods: PodWatch) -> None:
    """Delete every pod of both tenants; wait until fairgate has no usage or queue."""
    for tenant in ("team-a", "team-b"):
        admin.delete_collection_namespaced_pod(tenant_namespace(tenant), grace_period_seconds=0)
    for tenant in ("team-a", "team-b"):
        wait_for(lambda t=tenant: not pods.count(tenant_namespace(t)), 300, f"{tenant} pods to go")
    fairgate.wait_idle(timeout=300)


def audit_latencies(fairgate: FairgateStack) -> dict[str, float]:
    """Pod name -> latency_ms of fairgate's `admit` audit records (the webhook's own
    decision time)."""
    result = fairgate.run_cli("audit", "query", "--decision", "admit", "--json",
                              "--redis-url", fairgate.redis_url)
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {r["name"]: float(r["latency_ms"]) for r in records if "latency_ms" in r}


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    print(f"{name} ...", flush=True)
    began = time.perf_counter()
    yield
    print(f"  {name} done in {time.perf_counter() - began:.1f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=2000, help="queued training pods")
    parser.add_argument("--pods", type=int, default=30, help="inference pods per phase")
    parser.add_argument("--workers", type=int, default=16, help="parallel backlog creates")
    parser.add_argument("--kubelet-interval", type=float, default=0.2,
                        help="how often the fake kubelet polls its nodes' pods (default "
                        "0.2 s, as in the e2e tests)")
    args = parser.parse_args()

    results: dict[str, Samples] = {}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        cp, fairgate = start_cluster(stack, Path(tmp), args.kubelet_interval)
        admin: Any = client.CoreV1Api(cp.admin)
        pods = PodWatch(admin)
        pods.start()
        stack.callback(pods.stop)
        ns_a, ns_b = tenant_namespace("team-a"), tenant_namespace("team-b")
        team_a, team_b = pods_api(cp, "team-a"), pods_api(cp, "team-b")
        webhooks = Webhooks(cp, fairgate, team_a, ns_a)

        with phase("baseline: no webhook, no backlog"):
            webhooks.switch("none")
            results["baseline"] = measure(team_a, pods, ns_a, "base", args.pods)
            webhooks.switch("fairgate")

        with phase(f"fits: team-b 4 running + {args.backlog} queued for quota"):
            create_backlog(team_b, ns_b, 4 + args.backlog, args.workers)
            wait_backlog(fairgate, pods, "team-b", 4, args.backlog)
            results["fits"] = measure(team_a, pods, ns_a, "fit", args.pods)
            clean(admin, fairgate, pods)

        with phase(f"preempt: team-a {CLUSTER_GPUS} running + {args.backlog} queued"):
            create_backlog(team_a, ns_a, CLUSTER_GPUS + args.backlog, args.workers)
            wait_backlog(fairgate, pods, "team-a", CLUSTER_GPUS, args.backlog)

            refills = itertools.count()

            def refill() -> None:
                # The preempted pod's borrowed GPU is taken again by a backlog pod queued
                # in the borrowed band (a backlog beyond nominal is split between the
                # bands), or, when none is, by a new pod, as the preempted pod's
                # controller would re-create it. Only once fairgate has freed the
                # preempted pod's usage: created while the borrow limit is still full,
                # the new pod would get the training band.
                def refilled() -> bool:
                    return pods.running(ns_a) == CLUSTER_GPUS or \
                        fairgate.tenant_state("team-a")["borrowed"] < 4

                wait_for(refilled, 60, "fairgate to free the preempted pod's borrowed usage")
                if pods.running(ns_a) < CLUSTER_GPUS and \
                        fairgate.tenant_state("team-a")["borrowed"] < 4:
                    team_a.create_namespaced_pod(ns_a, pod_manifest(
                        f"refill-{next(refills)}", {"nvidia.com/gpu": 1}))
                wait_for(lambda: pods.running(ns_a) == CLUSTER_GPUS, 120,
                         "a borrowed team-a pod to fill the cluster again")

            results["preempt"] = measure(team_b, pods, ns_b, "pre", args.pods, refill)
        fairgate.check_alive()
        decided = audit_latencies(fairgate)

    print("\nfairgate's own time per inference pod (the audit record's latency_ms: the "
          "webhook's decision, Redis included):")
    for name, prefix in (("fits", "fit-"), ("preempt", "pre-")):
        values = [ms for pod, ms in decided.items() if pod.startswith(prefix)]
        if values:
            print(f"  {name}: p50 {percentile(values, 0.5):.2f} ms, "
                  f"p99 {percentile(values, 0.99):.2f} ms, max {max(values):.2f} ms")
    print(f"\n{args.pods} inference pods per phase, backlog {args.backlog}, fake kubelet "
          f"polling every {args.kubelet_interval} s\n")
    print("| phase | gated | create p50 / p99 ms | bound p50 / p99 ms "
          "| Running p50 / p99 ms | Running mean / max ms |")
    print("|---|---|---|---|---|---|")
    for name, s in results.items():
        cells = [f"{percentile(v, 0.5):.1f} / {percentile(v, 0.99):.1f}"
                 for v in (s.create, s.bound, s.running)]
        print(f"| {name} | {s.gated}/{len(s.running)} | {' | '.join(cells)} | "
              f"{statistics.fmean(s.running):.1f} / {max(s.running):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
