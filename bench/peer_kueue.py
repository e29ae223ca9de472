"""fairgate and Kueue v0.17.0 side by side: the same traces on the same real control plane.

Usage: python bench/peer_kueue.py [--only fairgate|kueue] [--scenarios a,b,...]
                                  [--release-backlog N] [--json FILE]

Each scenario runs once per system, each on a fresh e2e control plane (kube-apiserver,
kube-scheduler, kube-controller-manager, etcd; tests/e2e/controlplane/build.sh) with the
scenario's fake GPU nodes and the fake kubelet, and only that system installed:
fairgate from manifests/ (`fairgate serve` + `fairgate dispatch`, default config), or
Kueue (tests/e2e/controlplane/build_kueue.sh; harness/kueue.py: plain-pod integration,
a ClusterQueue per tenant in one cohort with the same nominal quota, unlimited
borrowing, fair sharing with the same weights, Admission Fair Sharing on). Tenants'
users create plain pods; a pod runs (the fake kubelet reports Running) for its
duration, then the bench has the fake kubelet finish it (Succeeded).

Scenarios (time compressed: pods of seconds):
- head-start: 8 GPUs on one node, two tenants of weight 1 (nominal 4 each), every pod
  needs all 8 GPUs (4 s); team-a's backlog is created 30 s before team-b's.
- weights-1-2-3: 12 GPUs, weights 1:2:3 (nominal 2/4/6), 300 one-GPU pods (6 s) per
  tenant created at once, the weight-1 tenant's first.
- mixed-sizes: 8 GPUs, two tenants of weight 1, team-a 4-GPU pods, team-b 1-GPU pods.
- staggered-sizes: 12 GPUs as three nodes of 4, weights 1:2:3 (nominal 2/4/6), joins
  staggered by 20 s, each tenant one pod size: team-a 1 GPU, team-b 2, team-c (the
  latest and heaviest) 4, a whole node each (6 s pods).
- inference: 8 GPUs, team-a's training backlog (1 GPU, 30 s) fills the cluster
  (borrowing team-b's nominal 4); team-b sends 1-GPU inference pods every 3 s.
- inference-reserve: the same trace, team-b keeping 1 GPU of its nominal for its
  inference: fairgate's inferenceReserve 1 with `fairShare.lendInferenceReserve:
  false`, Kueue's lendingLimit 3 (team-a borrows at most 3 of team-b's 4 GPUs).
- newcomer (reclaim): 16 GPUs as two nodes of 8, two tenants of weight 1 (Kueue: nominal
  8 each); team-a fills the cluster with 16 preemptible 1-GPU pods of 8 hours (none ends
  in the run); team-b joins 60 s later with 16 such pods. fairgate runs with
  `fairShare.reclaim` on (RECLAIM) and every tenant's nominal quota the whole cluster,
  so no pod is in the borrowed band and only reclaim moves GPUs between tenants; Kueue
  preempts by fair sharing (every pod of the same priority).
- newcomer-no-wait: the same trace, fairgate only, with reclaim's `after` at 0 s (Kueue
  has no such wait): the owed newcomer is reclaimed for at the first check.
- newcomer-borrowed: the same trace, fairgate only, with the quotas of the other rows
  (nominal 8, borrow limit 8): team-a's pods beyond its nominal run in the borrowed
  band, which team-b's pods within nominal preempt through the kube-scheduler.
- two-backlogged (reclaim): 16 GPUs, two tenants of weight 1, both backlogged from the
  start (creates interleaved, so each runs 8 at once) with preemptible 1-GPU pods of
  90 s (team-a) and 120 s (team-b) that keep the cluster turning over; quotas and
  reclaim as in newcomer. Preemptions per hour after a settling time of 60 s.
- release: 200 GPUs (2 nodes of 100) held by two 100-GPU pods, a backlog of
  `--release-backlog` (2,000) one-GPU pods; both holders finish at once: how fast are
  pods ungated. Also the pod create call latency, 30 pods one at a time, before the
  system is installed (no admission controller) and after.

Per scenario and system: each tenant's GPU-time share over the window in which every
tenant has a backlog (from the last tenant's first pod to the end) against its
entitlement (weight / sum of weights), Jain's index of share / entitlement, utilisation
(GPU-time / capacity x window), pods preempted, inference create-to-Running p50 / p99.
With preemptible pods (the reclaim scenarios) also: seconds from the last tenant's
first pod until every tenant has held its entitled GPUs, the GPU-seconds preempted pods
had run, who ended them (the reason of their DisruptionTarget condition), and with a
settling time the preemptions per hour after it (see `measure`).
Prints one Markdown table; `--json` writes every number.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import urllib3
from harness.controlplane import ControlPlane, build_controlplane
from harness.fairgate import FairgateStack, create_tenant_namespace, pods_api, tenant_namespace
from harness.kubelet import FakeKubelet, GpuNode, whole_gpu_node
from harness.kueue import KueueStack, Tenant, build_kueue
from harness.pods import pod_manifest
from harness.waiting import wait_for
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

GPU = "nvidia.com/gpu"
DURATION = "bench.fairgate.io/duration"
INFERENCE_PRIORITY = "bench-inference"  # Kueue's way to say inference: pod priority
PREEMPTIBLE = "fairgate.io/preemptible"  # fairgate's label: reclaim may evict the pod
SYSTEMS = ("fairgate", "kueue")
# fairgate's fairShare.reclaim in the reclaim scenarios: what the docs suggest for 8-hour
# pods (after 5m, minRuntime 30m, perHour 12) at the runs' scale of one second a minute
RECLAIM = "{after: 5s, minRuntime: 30s, perHour: 720}"
HOUR = 3600.0


@dataclass(frozen=True)
class Stream:
    """`count` pods of `tenant` asking `gpus` each, running `duration` s, from `at` s on,
    one every `every` s (0: all at once)."""

    tenant: str
    at: float
    count: int
    gpus: int
    duration: float
    every: float = 0.0
    inference: bool = False
    preemptible: bool = False  # fairgate: labelled PREEMPTIBLE (Kueue: same priority)


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: tuple[GpuNode, ...]
    tenants: tuple[Tenant, ...]
    streams: tuple[Stream, ...]
    # seconds from the first create to the end of the measurement: the shares window
    # (from the last backlog's first pod) covers at least 30 pod lengths, the span over
    # which fairness is defined (docs/fairness.md), and every backlog outlasts it (the
    # reclaim scenarios, whose pods outlast the run or turn over a few times, excepted)
    horizon: float
    # fairgate's fairShare.reclaim (a YAML flow mapping; "": off)
    reclaim: str = ""
    # fairgate's quotas: False, those of Kueue's ClusterQueues with the rest of the
    # cluster as borrow limit (see fairgate_config); True, the whole cluster as
    # every tenant's nominal: no borrowed band, so the kube-scheduler never preempts one
    # tenant's training for another's and only reclaim moves GPUs between tenants
    whole_nominal: bool = False
    # seconds from the first create after which preemptions count as churn (None: not
    # measured); measure() reports them per hour
    settle: float | None = None
    systems: tuple[str, ...] = SYSTEMS  # the systems it is run with

    @property
    def capacity(self) -> int:
        return sum(n.devices.get(GPU, 0) for n in self.nodes)


def scenarios() -> dict[str, Scenario]:
    two = (Tenant("team-a", 1, 4), Tenant("team-b", 1, 4))
    eight = (whole_gpu_node("gpu-0", 4), whole_gpu_node("gpu-1", 4))
    sixteen = (whole_gpu_node("gpu-0", 8), whole_gpu_node("gpu-1", 8))
    two_of_16 = (Tenant("team-a", 1, 8), Tenant("team-b", 1, 8))
    eight_hours = 8 * HOUR
    newcomer = (Stream("team-a", 0, 16, 1, eight_hours, preemptible=True),
                Stream("team-b", 60, 16, 1, eight_hours, preemptible=True))
    return {s.name: s for s in (
        Scenario("head-start", (whole_gpu_node("gpu-0", 8),), two,
                 (Stream("team-a", 0, 40, 8, 4), Stream("team-b", 30, 40, 8, 4)), 150),
        Scenario("weights-1-2-3", tuple(whole_gpu_node(f"gpu-{i}", 4) for i in range(3)),
                 (Tenant("team-a", 1, 2), Tenant("team-b", 2, 4), Tenant("team-c", 3, 6)),
                 tuple(Stream(t, 0, 300, 1, 6) for t in ("team-a", "team-b", "team-c")), 220),
        Scenario("mixed-sizes", eight, two,
                 (Stream("team-a", 0, 40, 4, 5), Stream("team-b", 0, 160, 1, 5)), 150),
        Scenario("staggered-sizes", tuple(whole_gpu_node(f"gpu-{i}", 4) for i in range(3)),
                 (Tenant("team-a", 1, 2), Tenant("team-b", 2, 4), Tenant("team-c", 3, 6)),
                 (Stream("team-a", 0, 200, 1, 6), Stream("team-b", 20, 100, 2, 6),
                  Stream("team-c", 40, 60, 4, 6)), 240),
        Scenario("inference", eight, two,
                 (Stream("team-a", 0, 100, 1, 30),
                  Stream("team-b", 10, 20, 1, 2, every=3, inference=True)), 75),
        Scenario("inference-reserve", eight,
                 (Tenant("team-a", 1, 4), Tenant("team-b", 1, 4, reserve=1)),
                 (Stream("team-a", 0, 100, 1, 30),
                  Stream("team-b", 10, 20, 1, 2, every=3, inference=True)), 75),
        Scenario("newcomer", sixteen, two_of_16, newcomer, 240, RECLAIM, whole_nominal=True),
        Scenario("newcomer-no-wait", sixteen, two_of_16, newcomer, 240,
                 RECLAIM.replace("after: 5s", "after: 0s"), whole_nominal=True,
                 systems=("fairgate",)),
        Scenario("newcomer-borrowed", sixteen, two_of_16, newcomer, 240, RECLAIM,
                 systems=("fairgate",)),
        Scenario("two-backlogged", sixteen, two_of_16,
                 (Stream("team-a", 0, 120, 1, 90, every=0.2, preemptible=True),
                  Stream("team-b", 0.1, 100, 1, 120, every=0.2, preemptible=True)),
                 600, RECLAIM, whole_nominal=True, settle=60),
    )}


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def jain(values: Sequence[float]) -> float:
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 0.0


@dataclass
class PodRecord:
    tenant: str
    gpus: int
    duration: float | None
    inference: bool
    created: float | None = None  # before the create call
    ungated: float | None = None
    running: float | None = None
    ended: float | None = None
    finish_asked: bool = False
    disrupted_by: str | None = None  # reason of its DisruptionTarget condition, if any


class PodLog:
    """One watch over every pod: when each was ungated, Running and ended (Succeeded,
    Failed, terminating or gone), in time.perf_counter(); finishes each pod `duration`
    seconds after it went Running through the fake kubelet."""

    def __init__(self, core: Any, kubelet: FakeKubelet, tenants: dict[str, str]) -> None:
        self.core = core
        self.kubelet = kubelet
        self.tenants = tenants  # namespace -> tenant
        self.pods: dict[tuple[str, str], PodRecord] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self._due: list[tuple[float, str, str]] = []
        self._due_ready = threading.Condition(self.lock)
        self._finishers = ThreadPoolExecutor(16)

    def start(self) -> None:
        threading.Thread(target=self._watch, daemon=True).start()
        threading.Thread(target=self._finish_loop, daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        with self._due_ready:
            self._due_ready.notify_all()
        self._finishers.shutdown(wait=False, cancel_futures=True)

    def expect(self, namespace: str, name: str, record: PodRecord) -> None:
        with self.lock:
            self.pods[(namespace, name)] = record

    def _watch(self) -> None:
        version = ""
        while not self.stopped.is_set():
            try:
                if not version:
                    listed = self.core.list_pod_for_all_namespaces()
                    for pod in listed.items:
                        self._record(pod, "ADDED")
                    version = listed.metadata.resource_version
                for event in watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, resource_version=version,
                    timeout_seconds=60,
                ):
                    if self.stopped.is_set():
                        return
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    self._record(event["object"], event["type"])
                    version = event["object"].metadata.resource_version
            except (ApiException, urllib3.exceptions.HTTPError, ValueError) as error:
                if not self.stopped.is_set():
                    print(f"  (pod watch: {type(error).__name__}: {error}; listing again)",
                          flush=True)
                version = ""

    def _record(self, pod: Any, kind: str) -> None:
        now = time.perf_counter()
        key = (pod.metadata.namespace, pod.metadata.name)
        with self.lock:
            record = self.pods.get(key)
            if record is None:
                return
            if record.ungated is None and not pod.spec.scheduling_gates:
                record.ungated = now
            if record.running is None and pod.status.phase == "Running":
                record.running = now
                if record.duration is not None:
                    heapq.heappush(self._due, (now + record.duration, *key))
                    self._due_ready.notify()
            ended = (kind == "DELETED" or pod.metadata.deletion_timestamp is not None
                     or pod.status.phase in ("Succeeded", "Failed"))
            if ended and record.ended is None:
                record.ended = now
            if record.disrupted_by is None:
                record.disrupted_by = next(
                    (c.reason for c in pod.status.conditions or []
                     if c.type == "DisruptionTarget" and c.status == "True"), None)

    def _finish_loop(self) -> None:
        with self._due_ready:
            while not self.stopped.is_set():
                now = time.perf_counter()
                for namespace, name in self.take_due(now):
                    self._finishers.submit(self._finish, namespace, name)
                timeout = self._due[0][0] - now if self._due else 1.0
                self._due_ready.wait(max(0.0, timeout))

    def take_due(self, now: float) -> list[tuple[str, str]]:
        """The pods due to finish by `now` that are still running, each marked
        `finish_asked` (the caller holds the lock); a pod that ended before its time
        (preempted, evicted) is dropped unmarked, so it counts as preempted."""
        due = []
        while self._due and self._due[0][0] <= now:
            _, namespace, name = heapq.heappop(self._due)
            record = self.pods[(namespace, name)]
            if record.ended is None:
                record.finish_asked = True
                due.append((namespace, name))
        return due

    def _finish(self, namespace: str, name: str) -> None:
        with contextlib.suppress(Exception):  # preempted or gone meanwhile
            self.kubelet.finish(namespace, name)

    def snapshot(self) -> list[PodRecord]:
        with self.lock:
            return [PodRecord(**asdict(r)) for r in self.pods.values()]


class System:
    """fairgate or Kueue on a control plane: install, and how a pod of a class looks."""

    def __init__(self, name: str, cp: ControlPlane, work_dir: Path, capacity: int,
                 tenants: Sequence[Tenant], stack: contextlib.ExitStack,
                 largest: dict[str, int] | None = None, reclaim: str = "",
                 whole_nominal: bool = False) -> None:
        """`largest`: each tenant's largest pod, in GPUs; `reclaim`, `whole_nominal`:
        fairgate's, as Scenario has them (see fairgate_config)."""
        self.name = name
        self.largest = dict(largest or {})
        self.reclaim = reclaim
        self.whole_nominal = whole_nominal
        self.cp = cp
        self.tenants = tuple(tenants)
        self.capacity = capacity
        self.work_dir = work_dir
        self.stack = stack
        self.fairgate: FairgateStack | None = None
        self.kueue: KueueStack | None = None

    def install(self) -> None:
        if self.name == "fairgate":
            self._install_fairgate()
        else:
            self._install_kueue()

    def _install_fairgate(self) -> None:
        (self.work_dir / "fairgate").mkdir(parents=True, exist_ok=True)
        platform_yaml, quotas = fairgate_config(self.tenants, self.capacity, self.largest,
                                                self.reclaim, self.whole_nominal)
        fairgate = FairgateStack(self.cp, self.work_dir / "fairgate", platform_yaml, quotas)
        self.stack.callback(fairgate.stop)
        fairgate.install()
        fairgate.start_webhook()
        fairgate.start_dispatcher()
        self.fairgate = fairgate

    def _install_kueue(self) -> None:
        (self.work_dir / "kueue").mkdir(parents=True, exist_ok=True)
        kueue = KueueStack(self.cp, self.work_dir / "kueue", build_kueue())
        self.stack.callback(kueue.stop)
        for t in self.tenants:
            create_tenant_namespace(self.cp, t.name)
        client.SchedulingV1Api(self.cp.admin).create_priority_class(
            {"metadata": {"name": INFERENCE_PRIORITY}, "value": 1000})
        kueue.install()
        kueue.start()
        kueue.configure(list(self.tenants),
                        {t.name: tenant_namespace(t.name) for t in self.tenants})
        self.kueue = kueue

    def manifest(self, name: str, gpus: int, duration: float | None,
                 inference: bool, preemptible: bool = False) -> dict[str, Any]:
        return manifest(self.name, name, gpus, duration, inference, preemptible)

    def check_alive(self) -> None:
        if self.fairgate is not None:
            self.fairgate.check_alive()
        if self.kueue is not None:
            self.kueue.check_alive()


def fairgate_config(tenants: Sequence[Tenant], capacity: int, largest: dict[str, int],
                    reclaim: str = "", whole_nominal: bool = False,
                    ) -> tuple[str, dict[str, str]]:
    """fairgate's platform.yaml and each tenant's quota.yaml for a run.

    Same weights and nominal quotas as Kueue, the rest of the cluster as borrow limit;
    but fairgate admits a pod whole within its nominal quota or whole within its borrow
    limit, so a nominal smaller than the tenant's largest pod (`largest`: tenant -> GPUs)
    is raised to it (head-start: nominal 8 of 8 GPUs each, as the simulator's traces
    have it). `whole_nominal`: every tenant's nominal is the whole cluster, no borrowing.
    `reclaim`: `fairShare.reclaim` (a YAML flow mapping; "": left out, off). A tenant's
    `reserve` is its inferenceReserve, kept free (`fairShare.lendInferenceReserve:
    false` when any tenant has one)."""
    lines = ["platformAdmins: {groups: [platform-team], users: []}", "capacity: {}",
             "tenants:"]
    quotas = {}
    for t in tenants:
        nominal = capacity if whole_nominal else max(t.nominal, largest.get(t.name, 0))
        lines.append(f"  {t.name}: {{weight: {t.weight}, ceiling: {{gpuEquivalents: "
                     f"{capacity}}}, admins: {{groups: [{t.name}-admins], users: []}}}}")
        quotas[t.name] = (f"nominal: {{gpu: {nominal}}}\n"
                          f"borrowLimit: {{gpuEquivalents: {capacity - nominal}}}\n"
                          f"inferenceReserve: {{gpuEquivalents: {t.reserve}}}\n"
                          "defaultClass: training\n")
    fair_share = [f"reclaim: {reclaim}"] if reclaim else []
    if any(t.reserve for t in tenants):
        fair_share.append("lendInferenceReserve: false")
    if fair_share:
        lines.append(f"fairShare: {{{', '.join(fair_share)}}}")
    lines.append("onRedisUnavailable: deny")
    return "\n".join(lines) + "\n", quotas


def manifest(system: str, name: str, gpus: int, duration: float | None, inference: bool,
             preemptible: bool = False) -> dict[str, Any]:
    """A bench pod as `system` is told its class: inference is fairgate's
    `fairgate.io/class` label or, for Kueue, a higher PriorityClass; preemptible is
    fairgate's PREEMPTIBLE label, while for Kueue every training pod has the same
    priority and fair sharing decides what it preempts."""
    labels: dict[str, str] = {}
    priority = None
    if inference and system == "fairgate":
        labels["fairgate.io/class"] = "inference"
    if inference and system == "kueue":
        priority = INFERENCE_PRIORITY
    if preemptible and system == "fairgate":
        labels[PREEMPTIBLE] = "true"
    annotations = {DURATION: str(duration)} if duration is not None else {}
    return pod_manifest(name, {GPU: gpus}, labels=labels, annotations=annotations,
                        priority_class=priority)


@contextlib.contextmanager
def cluster(system: str, nodes: Sequence[GpuNode], tenants: Sequence[Tenant],
            work_dir: Path, largest: dict[str, int] | None = None, reclaim: str = "",
            whole_nominal: bool = False,
            ) -> Iterator[tuple[ControlPlane, FakeKubelet, System, PodLog]]:
    """A fresh control plane with `nodes` and the fake kubelet, `system` not yet
    installed (`largest`, `reclaim`, `whole_nominal`: see System), and a PodLog
    watching every pod."""
    with contextlib.ExitStack() as stack:
        cp = ControlPlane(build_controlplane(), work_dir / "controlplane")
        stack.callback(cp.stop)
        cp.start()
        kubelet = FakeKubelet(cp, nodes)
        kubelet.register_nodes()
        kubelet.start()
        stack.callback(kubelet.stop)
        for tenant in tenants:  # each user's certificate, before threads share the client
            pods_api(cp, tenant.name)
        capacity = sum(n.devices.get(GPU, 0) for n in nodes)
        peer = System(system, cp, work_dir, capacity, tenants, stack, largest, reclaim,
                      whole_nominal)
        log = PodLog(client.CoreV1Api(cp.admin), kubelet,
                     {tenant_namespace(t.name): t.name for t in tenants})
        log.start()
        stack.callback(log.stop)
        yield cp, kubelet, peer, log
        peer.check_alive()


RETRIES: dict[str, int] = {}  # system -> creates refused with 503 and retried


def create(cp: ControlPlane, peer: System, log: PodLog, tenant: str, name: str, gpus: int,
           duration: float | None, inference: bool = False, preemptible: bool = False,
           ) -> float:
    """Create one pod as the tenant's user; the create call's latency (s). A 503 (a
    webhook past its deadline on a loaded machine) is retried after 0.5 s, as a
    controller would, and counted in RETRIES; the pod's create time stays the first."""
    namespace = tenant_namespace(tenant)
    record = PodRecord(tenant, gpus, duration, inference)
    log.expect(namespace, name, record)
    record.created = time.perf_counter()
    for attempt in range(20):
        try:
            pods_api(cp, tenant).create_namespaced_pod(
                namespace, peer.manifest(name, gpus, duration, inference, preemptible))
            break
        except ApiException as error:
            if error.status != 503 or attempt == 19:
                raise
            RETRIES[peer.name] = RETRIES.get(peer.name, 0) + 1
            time.sleep(0.5)
    return time.perf_counter() - record.created


def run_trace(system: str, scenario: Scenario, work_dir: Path) -> dict[str, Any]:
    largest: dict[str, int] = {}
    for stream in scenario.streams:
        largest[stream.tenant] = max(largest.get(stream.tenant, 0), stream.gpus)
    with cluster(system, scenario.nodes, scenario.tenants, work_dir, largest,
                 scenario.reclaim, scenario.whole_nominal) as (cp, _, peer, log):
        peer.install()
        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            futures = []
            timed = sorted(
                ((s.at + i * s.every, order, i, s) for order, s in enumerate(scenario.streams)
                 for i in range(s.count)), key=lambda x: (x[0], x[1], x[2]))
            for at, _, i, stream in timed:
                delay = began + at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(
                    create, cp, peer, log, stream.tenant, f"{stream.tenant}-{i}", stream.gpus,
                    stream.duration, stream.inference, stream.preemptible))
            for future in futures:
                future.result()
        remaining = began + scenario.horizon - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        end = time.perf_counter()
        records = log.snapshot()
    return measure(scenario, records, began, end)


def held_from(records: Sequence[PodRecord], tenant: str, gpus: float,
              since: float) -> float | None:
    """The first time from `since` on at which `tenant`'s pods running at once hold at
    least `gpus` GPUs (`since` itself if they already do then); None if never."""
    mine = [r for r in records if r.tenant == tenant and r.running is not None]
    held = sum(r.gpus for r in mine if r.running is not None and r.running <= since
               and (r.ended is None or r.ended > since))
    if held >= gpus:
        return since
    changes = sorted([(r.running, r.gpus) for r in mine
                      if r.running is not None and r.running > since]
                     + [(r.ended, -r.gpus) for r in mine
                        if r.ended is not None and r.ended > since])  # ends first at a tie
    for at, delta in changes:
        held += delta
        if held >= gpus:
            return at
    return None


def measure(scenario: Scenario, records: list[PodRecord], began: float,
            end: float) -> dict[str, Any]:
    """The row's numbers from the pods' records (times in time.perf_counter(); `began`:
    the first create was due, `end`: the horizon): see the module docstring. With
    preemptible streams also `entitled_after_s` (from the last backlog's first pod until
    every backlogged tenant has held its entitled GPUs, capacity x weight / sum of
    weights; per tenant in `entitled_after_s_by_tenant`; None: never), `preempted_gpu_s`
    (GPU-seconds the preempted pods had run: the work lost) and `preempted_by` (their
    DisruptionTarget reasons: how many each); with the scenario's `settle`, the pods
    preempted from `began + settle` to the end, and that per hour."""
    backlogged = {s.tenant for s in scenario.streams if not s.inference}
    firsts = [min(r.created for r in records if r.tenant == t and r.created is not None)
              for t in backlogged]
    start = max(firsts)
    gpu_time = {t: 0.0 for t in backlogged}
    total = 0.0
    for r in records:
        if r.running is None:
            continue
        overlap = max(0.0, min(r.ended or end, end) - max(r.running, start))
        total += r.gpus * overlap
        if r.tenant in gpu_time:
            gpu_time[r.tenant] += r.gpus * overlap
    weights = {t.name: t.weight for t in scenario.tenants if t.name in backlogged}
    shares = {t: gpu_time[t] / sum(gpu_time.values()) if sum(gpu_time.values()) else 0.0
              for t in sorted(backlogged)}
    entitled = {t: weights[t] / sum(weights.values()) for t in sorted(backlogged)}
    inference = [r for r in records if r.inference]
    waits = [(r.running - r.created) * 1000 for r in inference
             if r.running is not None and r.created is not None]
    # (pod, seconds it ran) of each pod that ended without the bench finishing it
    preempted = [(r, r.ended - r.running) for r in records
                 if r.ended is not None and r.running is not None and not r.finish_asked]
    result: dict[str, Any] = {
        "window_s": round(end - start, 1),
        "shares": {t: round(v, 4) for t, v in shares.items()},
        "entitled": {t: round(v, 4) for t, v in entitled.items()},
        "jain": round(jain([shares[t] / entitled[t] for t in shares]), 4)
        if len(shares) > 1 else None,
        "utilisation": round(total / (scenario.capacity * (end - start)), 4),
        "preempted": len(preempted),
        "pods_run": sum(1 for r in records if r.running is not None),
    }
    if any(s.preemptible for s in scenario.streams):
        reached = {t: held_from(records, t, scenario.capacity * entitled[t], start)
                   for t in sorted(backlogged)}
        times = [at for at in reached.values() if at is not None]
        result["entitled_after_s_by_tenant"] = {
            t: None if at is None else round(at - start, 1) for t, at in reached.items()}
        result["entitled_after_s"] = (round(max(times) - start, 1)
                                      if len(times) == len(reached) else None)
        result["preempted_gpu_s"] = round(sum(r.gpus * ran for r, ran in preempted), 1)
        reasons = Counter(r.disrupted_by or "no condition" for r, _ in preempted)
        result["preempted_by"] = dict(sorted(reasons.items()))
        if scenario.settle is not None:
            late = sum(1 for r, _ in preempted if r.ended is not None
                       and r.ended >= began + scenario.settle)
            result["preempted_after_settle"] = late
            result["preempted_per_hour_after_settle"] = round(
                late * HOUR / (end - began - scenario.settle), 1)
    if inference:
        result["inference_ran"] = f"{len(waits)}/{len(inference)}"
        if waits:
            result["inference_p50_ms"] = round(percentile(waits, 0.5), 1)
            result["inference_p99_ms"] = round(percentile(waits, 0.99), 1)
    return result


def run_release(system: str, backlog: int, work_dir: Path, samples: int = 30) -> dict[str, Any]:
    """Create latency without and with the system; ungate rate when 200 GPUs free under
    a backlog."""
    nodes = (whole_gpu_node("gpu-0", 100), whole_gpu_node("gpu-1", 100))
    tenants = (Tenant("team-a", 1, 200),)
    with cluster(system, nodes, tenants, work_dir, {"team-a": 100}) as (cp, kubelet, peer, log):
        core: Any = client.CoreV1Api(cp.admin)
        create_tenant_namespace(cp, "team-a")
        namespace = tenant_namespace("team-a")

        def latencies(label: str) -> list[float]:
            values = []
            for i in range(samples):
                values.append(create(cp, peer, log, "team-a", f"{label}-{i}", 1, None) * 1000)
            wait_for(lambda: all(r.running for (_, n), r in log.pods.items()
                                 if n.startswith(f"{label}-")), 120, f"{label} pods to run")
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            wait_for(lambda: not core.list_namespaced_pod(namespace).items, 120,
                     "the probe pods to go")
            return values

        plain = latencies("none")
        peer.install()
        admitted = latencies(system)
        for i in range(2):
            create(cp, peer, log, "team-a", f"holder-{i}", 100, None)
        wait_for(lambda: all(log.pods[(namespace, f"holder-{i}")].running for i in range(2)),
                 120, "the two holders to run")
        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: create(cp, peer, log, "team-a", f"q-{i}", 1, None),
                          range(backlog)))
        created_per_s = backlog / (time.perf_counter() - began)
        time.sleep(10)  # let the system take in its backlog (Kueue: a Workload per pod)
        early = sum(1 for (_, n), r in log.pods.items() if n.startswith("q-") and r.ungated)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: kubelet.finish(namespace, f"holder-{i}"), range(2)))
        freed = max(log.pods[(namespace, f"holder-{i}")].ended or 0.0 for i in range(2))

        def ungated() -> list[float]:
            return sorted(r.ungated for (_, n), r in log.pods.items()
                          if n.startswith("q-") and r.ungated is not None)

        wait_for(lambda: len(ungated()) >= 200, 600, "200 backlog pods to be ungated")
        times = ungated()[:200]
        wait_for(lambda: sum(1 for (_, n), r in log.pods.items()
                             if n.startswith("q-") and r.running) >= 200, 600,
                 "200 released pods to run")
        running = sorted(r.running for (_, n), r in log.pods.items()
                         if n.startswith("q-") and r.running)[:200]
    return {
        "create_none_p50_ms": round(percentile(plain, 0.5), 2),
        "create_none_p99_ms": round(percentile(plain, 0.99), 2),
        "create_p50_ms": round(percentile(admitted, 0.5), 2),
        "create_p99_ms": round(percentile(admitted, 0.99), 2),
        "added_p50_ms": round(percentile(admitted, 0.5) - percentile(plain, 0.5), 2),
        "backlog": backlog,
        "backlog_created_per_s": round(created_per_s, 1),
        "ungated_before_release": early,
        "first_ungate_ms": round((times[0] - freed) * 1000, 1),
        "ungated_200_s": round(times[-1] - freed, 2),
        "ungated_per_s": round(200 / max(times[-1] - freed, 1e-9), 1),
        "running_200_s": round(running[-1] - freed, 2),
    }


def table(results: dict[str, dict[str, Any]], systems: Sequence[str]) -> str:
    rows = ["| scenario | metric | " + " | ".join(systems) + " |",
            "|---|---|" + "---|" * len(systems)]

    def cell(system: str, scenario: str, key: str) -> str:
        value = results.get(system, {}).get(scenario, {}).get(key)
        if key == "shares":
            return " / ".join(f"{v:.3f}" for v in value.values()) if value else "-"
        if isinstance(value, dict):  # counts by name
            return ", ".join(f"{name} {n}" for name, n in value.items()) or "none"
        if key == "entitled_after_s" and value is None and scenario in results.get(system, {}):
            return "never"
        return "-" if value is None else str(value)

    for scenario in scenarios():
        if not any(scenario in results.get(s, {}) for s in systems):
            continue
        entitled = next(results[s][scenario]["entitled"] for s in systems
                        if scenario in results.get(s, {}))
        label = " / ".join(f"{v:.3f}" for v in entitled.values())
        for key, name in (("shares", f"GPU-time shares (entitled {label})"),
                          ("jain", "Jain's index"), ("utilisation", "utilisation"),
                          ("preempted", "pods preempted"),
                          ("preempted_by", "preempted by (DisruptionTarget reason)"),
                          ("preempted_gpu_s", "GPU-s the preempted pods had run (lost)"),
                          ("entitled_after_s", "s from the last join until every tenant "
                           "held its entitled GPUs"),
                          ("preempted_per_hour_after_settle",
                           "preemptions per hour after settling"),
                          ("inference_p50_ms", "inference create->Running p50 ms"),
                          ("inference_p99_ms", "inference create->Running p99 ms")):
            shown = [results.get(s, {}).get(scenario, {}) for s in systems]
            # a row whose every value is missing is left out; "never" is a value
            if any(r.get(key) is not None or (key == "entitled_after_s" and key in r)
                   for r in shown):
                rows.append(f"| {scenario} | {name} | "
                            + " | ".join(cell(s, scenario, key) for s in systems) + " |")
    for key, name in (("added_p50_ms", "pod create p50 added vs none, ms"),
                      ("create_p99_ms", "pod create p99 ms (none: see json)"),
                      ("ungated_per_s", "release: pods ungated per s"),
                      ("first_ungate_ms", "release: first ungate after capacity frees, ms"),
                      ("running_200_s", "release: 200 released pods Running after, s")):
        if any("release" in results.get(s, {}) for s in systems):
            rows.append(f"| release | {name} | "
                        + " | ".join(cell(s, "release", key) for s in systems) + " |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=SYSTEMS, help="run one system only")
    parser.add_argument("--scenarios", default=",".join([*scenarios(), "release"]),
                        help="comma-separated scenario names (default: all, and release)")
    parser.add_argument("--release-backlog", type=int, default=2000,
                        help="pods queued behind the holders in `release` (default 2,000)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--keep", type=Path,
                        help="run under this directory and keep it (every process's log "
                        "under <scenario>-<system>/controlplane/logs)")
    args = parser.parse_args()
    systems = (args.only,) if args.only else SYSTEMS
    chosen = args.scenarios.split(",")
    unknown = set(chosen) - {*scenarios(), "release"}
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    build_controlplane()
    if "kueue" in systems:
        build_kueue()
    results: dict[str, dict[str, Any]] = {s: {} for s in systems}
    for name in chosen:
        for system in systems:
            if name != "release" and system not in scenarios()[name].systems:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {name} with {system} ...", flush=True)
            with contextlib.ExitStack() as keep:
                if args.keep:
                    tmp = args.keep / f"{name}-{system}"
                    tmp.mkdir(parents=True, exist_ok=True)
                else:
                    tmp = Path(keep.enter_context(
                        tempfile.TemporaryDirectory(prefix=f"peer-{system}-")))
                if name == "release":
                    results[system][name] = run_release(system, args.release_backlog, tmp)
                else:
                    results[system][name] = run_trace(system, scenarios()[name], tmp)
            results[system][name]["create_503_retries"] = RETRIES.pop(system, 0)
            print(f"  {json.dumps(results[system][name])}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
    print(f"\nmachine: {os.cpu_count()} cores, {platform.platform()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print(table(results, systems))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
