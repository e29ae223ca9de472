"""Released pods the scheduler cannot place: caught after the grace, told
with a Warning Event, counted in metrics, kept against quota, their demand withheld from
the capacity the queue releases into; freed exactly once when they go.

The dispatcher and queue are the real ones (real Redis); the cluster is a simulated one
whose nodes report ``phantom`` GPUs its scheduler cannot use (a node the scheduler
refuses for a reason fairgate cannot see), so released pods beyond the real pool stay
Pending with ``PodScheduled=False, reason=Unschedulable``, as the real scheduler says.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace

import redis

from admission.demand import pod_demand
from audit import RELEASE, AuditLog
from fairshare.cluster.cluster import CapacityReport, ChangeKind, ClusterChange, GpuPod, PodRef
from fairshare.cluster.kube import pod_from_manifest, unschedulable
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.fairqueue import FairQueue
from fairshare.sim.simcluster import SimulatedCluster, VirtualClock
from fairshare.status import capacity_lines, status_report, why_report
from tenants.models import FairgateConfig, PlatformConfig, PriorityClasses, QuotaSpec
from tests.fairshare.simkit import Rig, admit_hook, make_config

GRACE = 30.0
MESSAGE = ("0/3 nodes are available: 1 node(s) had untolerated taint {example.com/broken: }, "
           "2 Insufficient nvidia.com/gpu.")
TEAM_A = {"team-a": {"weight": 1, "nominal": {"gpu": 8}}}


@dataclass
class PhantomCluster(SimulatedCluster):
    """Reports ``phantom`` more capacity than its scheduler can place; released pods it
    cannot place carry the scheduler's Unschedulable message."""

    phantom: dict[str, int] = field(default_factory=dict)

    def capacity_report(self) -> CapacityReport:
        real = self.capacity()
        return CapacityReport({name: n + self.phantom.get(name, 0) for name, n in real.items()})

    def schedule(self) -> None:
        super().schedule()
        for sim in list(self._unscheduled.values()):
            if sim.pod.unschedulable is None:
                self._set(sim, replace(sim.pod, unschedulable=MESSAGE))


def _rig(redis_url: str, pool: int, phantom: int, audit: AuditLog | None = None,
         config: FairgateConfig | None = None, key: str = "gpu",
         more: dict[str, int] | None = None) -> Rig:
    """``pool`` real units of capacity key ``key`` reported as ``pool + phantom``, and
    ``more`` capacity elsewhere."""
    client = redis.Redis.from_url(redis_url)
    queue = FairQueue(client)
    clock = VirtualClock(1_000.0)
    config = config or make_config(TEAM_A)
    cluster = PhantomCluster({key: pool, **(more or {})}, admit_hook(queue, clock, config),
                             clock, phantom={key: phantom})
    settings = DispatcherSettings(unschedulable_grace=GRACE, status_every=5.0)
    dispatcher = Dispatcher(queue, cluster, lambda: config, clock=clock, audit=audit,
                            settings=settings)
    dispatcher.sync(force=True)
    return Rig(client, queue, clock, cluster, dispatcher, config)


def _used(queue: FairQueue) -> int:
    return next(s.used_slices for s in queue.tenant_status() if s.tenant == "team-a")


def _warnings(rig: Rig) -> dict[str, str]:
    return {e.pod.name: e.message for e in rig.cluster.events
            if e.reason == "Unschedulable" and e.type_ == "Warning"}


def _sample(rig: Rig, name: str, labels: dict[str, str] | None = None) -> float | None:
    value = rig.dispatcher.metrics.registry.get_sample_value(name, labels or {})
    return value


def _stuck_rig(redis_url: str, audit: AuditLog | None = None) -> tuple[Rig, list[GpuPod]]:
    """4 real GPUs reported as 8: 8 one-GPU pods released, 4 run, 4 stay Unschedulable
    (the first runs 50 s, the other running ones 100 s); 2 more wait behind the gate."""
    rig = _rig(redis_url, pool=4, phantom=4, audit=audit)
    pods = [rig.pod(f"p{i}", duration=50.0 if i == 0 else 100.0) for i in range(10)]
    rig.settle()
    assert [p.gated for p in pods] == [False] * 8 + [True] * 2
    assert {p.uid for p in rig.cluster.pending_released()} == {p.uid for p in pods[4:8]}
    return rig, pods


def test_a_release_unschedulable_past_the_grace_is_caught_kept_counted_and_withheld(
    redis_url: str,
) -> None:
    rig, pods = _stuck_rig(redis_url)
    rig.at(1_000.0 + GRACE)  # not longer than the grace yet
    assert _warnings(rig) == {}
    assert rig.queue.snapshot().capacity == {"gpu": 8}

    rig.at(1_000.0 + GRACE + 1)
    stuck = {p.ref.name for p in pods[4:8]}
    warnings = _warnings(rig)
    assert set(warnings) == stuck  # one Warning each, only for the stuck ones
    text = warnings[pods[4].ref.name]
    assert MESSAGE in text and "Unschedulable for 31s" in text
    assert "gpu=1 counted against team-a's quota" in text
    assert "releases no other pod into that much capacity" in text
    assert _used(rig.queue) == 8 * 7  # every released pod stays counted (invariant 1)
    assert rig.queue.snapshot().capacity == {"gpu": 4}  # 8 reported, 4 withheld
    assert rig.dispatcher.withheld() == {"gpu": 4}
    assert _sample(rig, "fairgate_unschedulable_releases_total",
                   {"class": "training", "tenant": "team-a"}) == 4
    assert _sample(rig, "fairgate_unschedulable_pods") == 4
    assert _sample(rig, "fairgate_unschedulable_withheld_capacity", {"resource": "gpu"}) == 4
    assert _sample(rig, "fairgate_cluster_capacity", {"resource": "gpu"}) == 4

    rig.at(1_100.0)  # much later: still stuck, told once only
    assert len([e for e in rig.cluster.events if e.reason == "Unschedulable"]) == 4


def test_capacity_that_frees_goes_to_the_stuck_pod_not_to_a_new_release(
    redis_url: str,
) -> None:
    rig, pods = _stuck_rig(redis_url)
    rig.at(1_040.0)  # caught
    rig.at(1_050.0)  # p0 ends: the scheduler places the oldest stuck pod, p4, there
    history = rig.cluster.history
    assert history[pods[4].uid].started == 1_050.0
    # Without withholding the queue would see 8 - 7 = 1 GPU free and release p8 into
    # capacity that is not there; withheld (3 still stuck), it releases nothing.
    assert history[pods[8].uid].released is None
    assert rig.queue.snapshot().capacity == {"gpu": 5}
    assert _used(rig.queue) == 7 * 7
    assert _sample(rig, "fairgate_unschedulable_pods") == 3

    rig.at(1_100.0)  # p1..p3 end: p5..p7 get their GPUs, nothing is stuck any more
    assert all(history[p.uid].started == 1_100.0 for p in pods[5:8])
    assert rig.dispatcher.withheld() == {}
    assert _sample(rig, "fairgate_unschedulable_pods") == 0
    assert _sample(rig, "fairgate_unschedulable_withheld_capacity", {"resource": "gpu"}) is None
    # Capacity is 8 again and usage 4: p8 and p9 are released (and stuck again, fresh).
    assert history[pods[8].uid].released == 1_100.0
    assert history[pods[9].uid].released == 1_100.0
    assert rig.dispatcher.withheld() == {}  # their grace starts now


def test_a_pod_bound_within_the_grace_is_never_caught(redis_url: str) -> None:
    rig, pods = _stuck_rig(redis_url)
    rig.at(1_025.0)
    rig.cluster.capacity_counts["gpu"] = 8  # the refused node is fixed: all four bind
    rig.cluster.schedule()
    rig.at(1_100.0)
    assert all(rig.cluster.history[p.uid].started == 1_025.0 for p in pods[4:8])
    assert _warnings(rig) == {}
    assert _sample(rig, "fairgate_unschedulable_releases_total",
                   {"class": "training", "tenant": "team-a"}) is None


def test_a_caught_pod_that_is_deleted_frees_its_quota_and_capacity_exactly_once(
    redis_url: str,
) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig, pods = _stuck_rig(redis_url, audit)
    rig.at(1_040.0)
    victim = pods[7]
    current = next(p for p in rig.cluster.pending_released() if p.uid == victim.uid)
    assert current.unschedulable == MESSAGE
    # Its owner deletes it: first the API server marks it deleting (a finalizer may keep
    # it), then it is gone; both reach the dispatcher, and a duplicate of each too.
    deleting = replace(current, deleting=True)
    rig.dispatcher.handle([ClusterChange(ChangeKind.POD, deleting),
                           ClusterChange(ChangeKind.POD, deleting)])
    assert _used(rig.queue) == 7 * 7
    assert rig.dispatcher.withheld() == {"gpu": 3}
    rig.cluster.delete_pod(victim.uid)
    rig.settle()
    rig.dispatcher.handle([ClusterChange(ChangeKind.POD_GONE, deleting)])
    assert _used(rig.queue) == 7 * 7  # freed once, not twice
    releases = [e.record for e in audit.entries()
                if e.record is not None and e.record.decision == RELEASE]
    assert [r.name for r in releases] == [victim.ref.name]
    assert rig.queue.snapshot().capacity == {"gpu": 5}
    assert _sample(rig, "fairgate_unschedulable_pods") == 3


def test_a_rebuild_keeps_caught_pods_withheld(redis_url: str) -> None:
    rig, _ = _stuck_rig(redis_url)
    rig.at(1_040.0)
    rig.client.flushall()  # Redis lost everything
    rig.dispatcher.step()
    rig.settle()
    assert rig.queue.snapshot().capacity == {"gpu": 4}
    assert _used(rig.queue) == 8 * 7
    assert len(_warnings(rig)) == 4  # not told again


def test_status_and_why_say_what_is_stuck_and_what_is_withheld(redis_url: str) -> None:
    rig, pods = _stuck_rig(redis_url)
    rig.at(1_040.0)
    report = status_report(rig.queue, now=1_040.0)
    notes = report["capacity_notes"]
    assert notes["withheld"] == {"gpu": 4}
    assert sorted(n["pod"] for n in notes["unschedulable"]) == sorted(
        str(p.ref) for p in pods[4:8])
    lines = capacity_lines(notes)
    assert ("  withheld gpu=4 for 4 released pods the scheduler cannot place (counted "
            "against quota until bound or gone):") in lines
    assert f"    {pods[4].ref} (gpu=1) Unschedulable since 1970-01-01T00:16:40Z: {MESSAGE}" \
        in lines
    why = why_report(pods[4].ref, rig.queue, [], 1_040.0)
    assert why.verdict == "running" and why.unschedulable == MESSAGE
    assert "the scheduler cannot place it (Unschedulable since 1970-01-01T00:16:40Z" \
        in why.summary
    placed = why_report(pods[1].ref, rig.queue, [], 1_040.0)
    assert placed.unschedulable is None and "cannot place" not in placed.summary


def _manifest(status: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                     "labels": {"fairgate.io/tenant": "team-a", "fairgate.io/class": "training"},
                     "annotations": {"fairgate.io/ticket": "t1", "fairgate.io/demand": "gpu=1"}},
        "spec": {"containers": [{"name": "main", "image": "pause",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": status,
    }


def test_only_a_scheduler_verdict_without_a_nominated_node_reads_as_unschedulable() -> None:
    stuck = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": MESSAGE}
    assert unschedulable({"conditions": [stuck]}) == MESSAGE
    assert unschedulable({"conditions": [{**stuck, "message": ""}]}) == "Unschedulable"
    # Preemption victims are on their way out: the capacity is there.
    assert unschedulable({"conditions": [stuck], "nominatedNodeName": "gpu-0"}) is None
    gated = {**stuck, "reason": "SchedulingGated"}
    assert unschedulable({"conditions": [gated]}) is None
    assert unschedulable({"conditions": [{**stuck, "status": "True"}]}) is None
    assert unschedulable({}) is None
    pod = pod_from_manifest(_manifest({"phase": "Pending", "conditions": [stuck]}),
                            PriorityClasses(), pod_demand)
    assert pod is not None and pod.unschedulable == MESSAGE
    assert pod.ref == PodRef("ns", "p")


def test_only_the_stuck_pods_placement_class_is_withheld(redis_url: str) -> None:
    """A pool tenant's pods stuck in its pool shrink the pool's capacity key, nothing
    else: the shared nodes' capacity is untouched."""
    platform = PlatformConfig.model_validate({"tenants": {"team-a": {
        "weight": 1, "ceiling": {"gpuEquivalents": 100}, "nodePool": "a"}}})
    config = FairgateConfig(platform=platform, quotas={
        "team-a": QuotaSpec.model_validate({"nominal": {"gpu": 8}})})
    rig = _rig(redis_url, pool=2, phantom=2, config=config, key="gpu@a", more={"gpu": 4})
    pods = [rig.pod(f"p{i}", demand={"gpu@a": 1}) for i in range(4)]
    rig.settle()
    assert {p.uid for p in rig.cluster.pending_released()} == {p.uid for p in pods[2:]}
    rig.at(1_000.0 + GRACE + 1)
    assert set(_warnings(rig)) == {p.ref.name for p in pods[2:]}
    assert rig.dispatcher.withheld() == {"gpu@a": 2}
    assert rig.queue.snapshot().capacity == {"gpu@a": 2, "gpu": 4}
