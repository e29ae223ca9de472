"""The dispatcher against the real queue (real Redis) and a simulated cluster."""

from __future__ import annotations

import io
import threading
from collections import Counter
from typing import Any

import pytest
import redis
from rich.console import Console

from audit import CAPACITY, DISPATCH, PREEMPT, RECLAIM, RELEASE, START, AuditLog
from fairshare.cluster.cluster import (
    CapacityReport,
    ChangeKind,
    ClusterChange,
    EventType,
    GpuPod,
    LiftOutcome,
    PodRef,
)
from fairshare.cluster.pod_evict import EVICTED, EvictOutcome
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.sim.simcluster import PodSpec, SimulatedCluster, VirtualClock
from fairshare.status import reclaim_lines, render_status, status_report, why_report
from tenants.models import FairgateConfig, FairShareSpec, PriorityClasses
from tests.fairshare.simkit import admit_hook, make_config, make_rig

TEAM_A = {"team-a": {"weight": 1, "nominal": {"gpu": 4}}}


def _used(queue: FairQueue, tenant: str = "team-a") -> int:
    return next(s.used_slices for s in queue.tenant_status() if s.tenant == tenant)


def test_a_finished_pod_frees_its_gpu_for_the_next_one(redis_url: str) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = make_rig(redis_url, TEAM_A, {"gpu": 1}, audit=audit)
    first = rig.pod("first", duration=10)
    second = rig.pod("second", duration=10)
    assert not first.gated and second.gated
    rig.settle()
    assert _used(rig.queue) == 7
    waiting = rig.queue.ticket_status(second.ticket, rig.clock())
    assert waiting is not None and waiting.state == "queued"

    rig.at(1_010.0)  # first ends: its usage is freed and second released
    history = rig.cluster.history
    assert history[first.uid].ended == 1_010.0
    assert history[second.uid].released == 1_010.0
    assert history[second.uid].started == 1_010.0
    assert _used(rig.queue) == 7
    admitted = [e for e in rig.cluster.events if e.reason == "Admitted"]
    assert [(e.pod.name, e.message) for e in admitted] == [
        ("second", "Admitted after 10.0s in queue")
    ]

    rig.at(1_020.0)
    assert _used(rig.queue) == 0
    records = [e.record for e in audit.entries() if e.record is not None]
    # the dispatcher stamps its records with its own clock (here virtual: 1,000 s on)
    assert [(r.decision, r.name, r.time[11:19]) for r in records] == [
        (CAPACITY, "", "00:16:40"), (START, "first", "00:16:40"),
        (RELEASE, "first", "00:16:50"), (DISPATCH, "second", "00:16:50"),
        (START, "second", "00:16:50"), (RELEASE, "second", "00:17:00"),
    ]
    assert records[3].uid == second.ticket and records[3].tenant == "team-a"
    assert "after 10.0s" in records[3].reason
    assert records[0].diff == {"gpu": {"before": None, "after": 1}}
    assert records[4].diff == {"pod": {"band": "training", "node": "sim-node",
                                       "gpuProduct": None}}


def test_the_dispatcher_stores_the_clusters_capacity_report_for_status(
    redis_url: str
) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 3})
    rig.settle()
    notes = rig.queue.capacity_notes()
    assert notes is not None and notes["override"] is False
    assert CapacityReport.from_json(notes) == CapacityReport({"gpu": 3})
    rig.cluster.capacity_counts["gpu"] = 2  # a node went away: CAPACITY, fresh notes
    rig.dispatcher.handle([ClusterChange(ChangeKind.CAPACITY)])
    notes = rig.queue.capacity_notes()
    assert notes is not None and notes["total"] == {"gpu": 2}


def test_queued_events_tell_position_and_reason_and_are_rate_limited(redis_url: str) -> None:
    settings = DispatcherSettings(status_every=1.0, queued_event_interval=60.0)
    rig = make_rig(redis_url, TEAM_A, {"gpu": 1}, settings=settings)
    for i in range(9):
        rig.pod(f"p{i}", duration=30)
    rig.settle()

    def queued_since(count: int) -> dict[str, str]:
        events = [e for e in rig.cluster.events if e.reason == "Queued"][count:]
        return {e.pod.name: e.message for e in events}

    first = queued_since(0)
    assert sorted(first) == [f"p{i}" for i in range(1, 9)]  # one per gated pod
    assert first["p1"] == ("Queued: position 1 of 8 for team-a/training, waiting for "
                           "1 x gpu of cluster capacity")
    assert first["p8"].startswith("Queued: position 8 of 8 for team-a/training, waiting for")
    told = len(first)

    rig.at(1_030.0)  # p1 released, everyone moves up one place: too soon, too little
    assert queued_since(told) == {}
    rig.at(1_060.0)  # p3 and p4 went from 3 and 4 to 1 and 2 (halved), a minute later
    assert queued_since(told) == {
        "p3": "Queued: position 1 of 6 for team-a/training, waiting for 1 x gpu of cluster "
              "capacity",
        "p4": "Queued: position 2 of 6 for team-a/training, waiting for 1 x gpu of cluster "
              "capacity",
    }
    told += 2
    rig.at(1_090.0)  # p4 halved again, but was told 30 s ago; p5 and p6 halved
    assert sorted(queued_since(told)) == ["p5", "p6"]
    told += 2
    rig.at(1_120.0)
    assert sorted(queued_since(told)) == ["p7", "p8"]


def test_an_incomplete_gang_is_told_what_it_waits_for(redis_url: str) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = make_rig(redis_url, TEAM_A, {"gpu": 4}, settings=DispatcherSettings(status_every=0),
                   audit=audit)
    for i in range(2):
        rig.pod(f"g{i}", group="llm", group_size=3)
    rig.settle()
    messages = sorted(e.message for e in rig.cluster.events if e.reason == "Queued")
    assert len(messages) == 2
    assert messages[0] == ("Queued for team-a/training, waiting for the 3rd pod of gang of pod "
                           "group llm (2 of 3 pods created)")
    rig.pod("g2", group="llm", group_size=3)  # the gang completes and fits: all released
    rig.settle()
    started = {h.spec.name: h.started for h in rig.cluster.history.values()}
    assert started == {"g0": 1_000.0, "g1": 1_000.0, "g2": 1_000.0}
    # the dispatch records name the gang the pods were released with
    reasons = sorted(e.record.reason for e in audit.entries()
                     if e.record is not None and e.record.decision == DISPATCH)
    assert reasons == ["released as training after 0.0s with its gang of pod group llm "
                       "(3 pods)"] * 3


def test_a_deleted_gated_pod_leaves_the_queue(redis_url: str) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 1})
    rig.pod("running")
    gated = rig.pod("waiting")
    rig.settle()
    assert next(s.queued["training"] for s in rig.queue.tenant_status()) == 1
    rig.cluster.delete_pod(gated.uid)
    rig.settle()
    assert rig.queue.ticket_status(gated.ticket, rig.clock()) is None
    assert next(s.queued["training"] for s in rig.queue.tenant_status()) == 0
    assert _used(rig.queue) == 7


def test_a_reservation_no_pod_confirms_is_expired(redis_url: str) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 4})
    rig.settle()  # the dispatcher's start-up reconcile
    now = rig.clock()
    request = PodRequest(ticket="never-created", tenant="team-a", namespace="team-a-ns",
                         name="ghost", pod_class="training", demand={"gpu": 2},
                         submitted_at=now)
    assert rig.queue.admit(request, now).outcome == "reserved"
    rig.settle()
    assert _used(rig.queue) == 14
    rig.at(now + rig.queue.reservation_ttl + 10)
    assert _used(rig.queue) == 0
    assert rig.dispatcher.metrics.expired._value.get() == 1


def test_metrics_show_queue_depth_usage_and_waits(redis_url: str) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 2}, settings=DispatcherSettings(status_every=0))
    for i in range(5):
        rig.pod(f"p{i}", duration=50)
    rig.settle()
    text = rig.dispatcher.metrics.render().decode()
    assert 'fairgate_pending_workloads{class="training",tenant="team-a"} 3.0' in text
    assert 'fairgate_tenant_resource_usage{resource="gpu",tenant="team-a"} 2.0' in text
    assert 'fairgate_tenant_nominal_quota{resource="gpu",tenant="team-a"} 4.0' in text
    assert 'fairgate_cluster_capacity{resource="gpu"} 2.0' in text
    # alone with 5 GPUs of demand on 2: entitled to the 2 it holds
    assert 'fairgate_tenant_fair_share{tenant="team-a"} 2.0' in text
    assert "fairgate_fairness_jain_index NaN" in text  # one tenant: not defined
    rig.at(1_050.0)
    text = rig.dispatcher.metrics.render().decode()
    assert ('fairgate_admission_wait_time_seconds_count{class="training",tenant="team-a"} 2.0'
            in text)
    assert 'fairgate_gate_lifts_total{outcome="lifted"} 2.0' in text


def test_a_redis_flush_is_noticed_and_rebuilt(redis_url: str) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 1}, settings=DispatcherSettings(status_every=5))
    rig.pod("running", duration=100)
    rig.pod("waiting", duration=100)
    rig.settle()
    rig.client.flushall()  # Redis loses everything
    rig.pod("newcomer", duration=100)  # the webhook re-syncs config and queues it
    rig.at(1_010.0)  # the next status pass sees the queue hold less than the cluster
    status = {s.tenant: s for s in rig.queue.tenant_status()}
    assert status["team-a"].used_slices == 7
    assert status["team-a"].queued["training"] == 2


def test_an_emptied_redis_is_rebuilt_at_the_next_step_even_with_no_gpu_pods(
    redis_url: str,
) -> None:
    """A webhook with --wait-for-rebuild queues everything until the rebuild marker is
    back, so the dispatcher must rebuild as soon as Redis was emptied, pods or not."""
    rig = make_rig(redis_url, TEAM_A, {"gpu": 1}, settings=DispatcherSettings(status_every=600))
    rig.settle()
    assert rig.queue.is_rebuilt()
    rig.client.flushall()
    assert not rig.queue.is_rebuilt()
    rig.settle()
    assert rig.queue.is_rebuilt()


class _SharedCluster:
    """One simulated cluster watched by several dispatchers (each sees every change)."""

    def __init__(self, sim: SimulatedCluster) -> None:
        self.sim = sim
        self.lock = threading.RLock()
        self.views: list[_View] = []
        self.lifts: Counter[tuple[str, LiftOutcome]] = Counter()

    def view(self) -> _View:
        view = _View(self)
        self.views.append(view)
        return view

    def pump(self) -> None:
        changes = self.sim.changes(0)
        for view in self.views:
            view.pending.extend(changes)


class _View:
    def __init__(self, shared: _SharedCluster) -> None:
        self.shared = shared
        self.pending: list[ClusterChange] = []

    def list_pods(self) -> list[GpuPod]:
        with self.shared.lock:
            return self.shared.sim.list_pods()

    def changes(self, timeout: float) -> list[ClusterChange]:
        with self.shared.lock:
            self.shared.pump()
            batch, self.pending = self.pending, []
            return batch

    def capacity(self) -> dict[str, int]:
        with self.shared.lock:
            return self.shared.sim.capacity()

    def capacity_report(self) -> CapacityReport:
        with self.shared.lock:
            return self.shared.sim.capacity_report()

    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        with self.shared.lock:
            outcome = self.shared.sim.lift_gate(pod)
            self.shared.lifts[(pod.ticket, outcome)] += 1
            return outcome

    def post_event(self, pod: GpuPod, reason: str, message: str, type_: EventType) -> None:
        with self.shared.lock:
            self.shared.sim.post_event(pod, reason, message, type_)


def test_two_dispatchers_release_each_ticket_exactly_once(redis_url: str) -> None:
    config = make_config({"team-a": {"weight": 1, "nominal": {"gpu": 300}},
                          "team-b": {"weight": 2, "nominal": {"gpu": 300}}})
    clock = VirtualClock(1_000.0)
    setup_queue = FairQueue(redis.Redis.from_url(redis_url))
    setup_queue.sync_config(config, {"gpu": 0})
    sim = SimulatedCluster({"gpu": 0}, admit_hook(setup_queue, clock, config), clock)
    shared = _SharedCluster(sim)
    settings = DispatcherSettings(batch=1, reconcile_every=1e9)
    dispatchers = [
        Dispatcher(FairQueue(redis.Redis.from_url(redis_url)), shared.view(), lambda: config,
                   clock=clock, settings=settings)
        for _ in range(2)
    ]
    pods = [
        sim.create_pod(_spec(f"p{i}", "team-a" if i % 3 else "team-b")) for i in range(240)
    ]
    assert all(p.gated for p in pods)
    for dispatcher in dispatchers:
        dispatcher.step()  # both reconcile and see every gated pod
    with shared.lock:
        sim.capacity_counts["gpu"] = 240
        for view in shared.views:
            view.pending.append(ClusterChange(ChangeKind.CAPACITY))

    released: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def work(index: int) -> None:
        start.wait()
        for _ in range(2_000):
            result = dispatchers[index].step()
            released[index] += [r.ticket for r in result.released]
            with shared.lock:
                if all(not p.gated for p in sim.list_pods()):
                    return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    tickets = [t for part in released for t in part]
    assert sorted(tickets) == sorted(p.ticket for p in pods)  # each exactly once
    assert all(outcome is LiftOutcome.LIFTED for (_, outcome) in shared.lifts)
    assert sum(shared.lifts.values()) == len(pods)
    assert all(not p.gated for p in sim.list_pods())


def _spec(name: str, tenant: str) -> PodSpec:
    return PodSpec(namespace=f"{tenant}-ns", name=name, tenant=tenant, pod_class="training",
                   demand={"gpu": 1}, duration=100)


class _FlakyCluster(SimulatedCluster):
    """A simulated cluster whose API is down for the first ``outages`` lists."""

    outages = 2

    def list_pods(self) -> list[GpuPod]:
        if self.outages:
            self.outages -= 1
            raise ConnectionRefusedError("API server unreachable")
        return super().list_pods()


def test_run_outlives_failing_steps_and_stops_when_told(redis_url: str) -> None:
    config = make_config(TEAM_A)
    clock = VirtualClock(1_000.0)
    queue = FairQueue(redis.Redis.from_url(redis_url))
    cluster = _FlakyCluster({"gpu": 1}, admit_hook(queue, clock, config), clock)
    dispatcher = Dispatcher(queue, cluster, lambda: config, clock=clock,
                            settings=DispatcherSettings(idle_wait=0.01))
    queue.sync_config(config, {"gpu": 1})
    first = cluster.create_pod(_spec("first", "team-a"))
    second = cluster.create_pod(_spec("second", "team-a"))
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        for _ in range(500):
            if cluster.outages == 0 and first.ticket in dispatcher.pods:
                break
            stop.wait(0.01)
        clock.advance_to(1_100.0)
        cluster.advance()  # first ends: the running loop releases second
        for _ in range(500):
            if cluster.history[second.uid].started is not None:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert cluster.outages == 0
    assert cluster.history[second.uid].started == 1_100.0


class _StubbornCluster(SimulatedCluster):
    """A simulated cluster whose API refuses the first ``refusals`` gate lifts."""

    refusals = 1

    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        if self.refusals:
            self.refusals -= 1
            return LiftOutcome.FAILED
        return super().lift_gate(pod)


def test_a_failed_lift_goes_back_to_the_queue_and_is_retried(redis_url: str) -> None:
    config = make_config(TEAM_A)
    clock = VirtualClock(1_000.0)
    queue = FairQueue(redis.Redis.from_url(redis_url))
    cluster = _StubbornCluster({"gpu": 1}, admit_hook(queue, clock, config), clock)
    dispatcher = Dispatcher(queue, cluster, lambda: config, clock=clock)
    queue.sync_config(config, {"gpu": 1})
    first = cluster.create_pod(_spec("first", "team-a"))
    second = cluster.create_pod(_spec("second", "team-a"))
    dispatcher.step()
    clock.advance_to(1_100.0)
    cluster.advance()  # first ends; second is released but its lift fails
    result = dispatcher.step()
    assert result.requeued == [second.ticket] and result.released == []
    status = queue.ticket_status(second.ticket, clock())
    assert status is not None and status.state == "queued" and status.position == 1
    assert _used(queue) == 0  # the failed release holds nothing
    assert dispatcher.metrics.lifts.labels("failed")._value.get() == 1
    result = dispatcher.step()  # the API is back
    assert [r.ticket for r in result.released] == [second.ticket]
    assert cluster.history[second.uid].started == 1_100.0
    assert first.ticket not in dispatcher.pods


# -- fencing epoch: a new Redis primary is reconciled at once ---------------------------


def _lose_last_write(rig: Any, promote: bool) -> str:
    """Admit a pod and let the dispatcher see it, then put Redis back as it was before
    (as a failover to a replica that missed the writes would); with ``promote``, also
    the way a promotion does it (REPLICAOF somewhere unreachable, then NO ONE: a new
    replication id). The pod's
    ticket."""
    keys = rig.client.keys("fairgate:*")
    saved = {key: rig.client.dump(key) for key in keys}
    pod = rig.pod("late", duration=100)
    assert not pod.gated
    rig.dispatcher.step()  # the dispatcher has seen the pod: no change about it is left
    rig.client.delete(*rig.client.keys("fairgate:*"))
    for key, value in saved.items():
        rig.client.restore(key, 0, value)
    if promote:
        rig.client.replicaof("127.0.0.1", 1)
        rig.client.replicaof("NO", "ONE")
    ticket: str = pod.ticket
    return ticket


@pytest.mark.parametrize("promote", [True, False])
def test_a_new_redis_primary_is_reconciled_in_the_same_step(
    redis_url: str, promote: bool
) -> None:
    rig = make_rig(redis_url, TEAM_A, {"gpu": 4})
    rig.pod("early", duration=100)
    rig.settle()
    rig.dispatcher.step()
    assert _used(rig.queue) == 7
    ticket = _lose_last_write(rig, promote)
    assert _used(rig.queue) == 7  # the running "late" pod's reservation is gone
    result = rig.dispatcher.step()
    # A new primary: reconciled before anything else, the lost pod counted once. The
    # same primary (no failover): nothing tells the dispatcher yet.
    assert result.reconciled is promote
    assert _used(rig.queue) == (14 if promote else 7)
    assert (rig.queue.ticket_status(ticket, rig.clock()) is not None) is promote
    assert rig.dispatcher.metrics.primary_changes._value.get() == int(promote)


class _Evictions:
    """An evictor that records the pods it was asked to evict (the cluster keeps them)."""

    def __init__(self) -> None:
        self.pods: list[GpuPod] = []

    def evict(self, pod: GpuPod) -> EvictOutcome:
        self.pods.append(pod)
        return EVICTED


def _reclaim_rig(redis_url: str, reclaim: dict[str, Any] | None, preemptible: bool,
                 audit: AuditLog | None = None, every: float = 0.0,
                 status_every: float = 10.0) -> tuple[Any, _Evictions]:
    """16 GPUs full of "old"'s long training pods (started at 1,000 s), then "new" asks
    for 2 x 8 GPUs at 1,010 s; the dispatcher checks for reclaim every ``every`` seconds
    (by default on every step)."""
    tenants = {name: {"weight": 1, "nominal": {"gpu": 16}} for name in ("old", "new")}
    rig = make_rig(redis_url, tenants, {"gpu": 16}, audit=audit,
                   settings=DispatcherSettings(reclaim_every=every,
                                               status_every=status_every))
    platform = rig.config.platform.model_copy(update={"fair_share": FairShareSpec.model_validate(
        {} if reclaim is None else {"reclaim": reclaim})})
    config = FairgateConfig(platform=platform, quotas=rig.config.quotas)
    rig.dispatcher.config = lambda: config
    evictions = _Evictions()
    rig.dispatcher.evictor = evictions
    for i in range(4):
        rig.cluster.create_pod(PodSpec("old-ns", f"old-{i}", "old", "training", {"gpu": 4},
                                       duration=8 * 3600, preemptible=preemptible))
    rig.settle()
    rig.at(1_010.0)
    for i in range(2):
        rig.cluster.create_pod(PodSpec("new-ns", f"new-{i}", "new", "training", {"gpu": 8},
                                       duration=3600))
    rig.settle()
    return rig, evictions


RECLAIM_ON = {"after": "1m", "minRuntime": "10m", "perHour": 12}


def test_reclaim_evicts_for_the_owed_head_only_what_it_lacks(redis_url: str) -> None:
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True, audit=audit)
    rig.at(1_500.0)  # the head waited 490 s, the pods ran 500 s: not minRuntime yet
    assert evictions.pods == []
    rig.at(1_700.0)
    assert [p.tenant for p in evictions.pods] == ["old", "old"]  # 8 GPUs for new's head
    warned = [e for e in rig.cluster.events if e.reason == "Reclaimed"]
    assert [e.type_ for e in warned] == ["Warning", "Warning"]
    assert "reclaimed for new-ns/new-0 of tenant new" in warned[0].message
    records = [e.record for e in audit.entries()
               if e.record is not None and e.record.decision == RECLAIM]
    assert sorted(r.name for r in records) == sorted(p.ref.name for p in evictions.pods)
    rig.at(2_000.0)  # the evicted pods are still terminating: nothing more is evicted
    assert len(evictions.pods) == 2


def test_the_reclaim_check_comes_when_time_allows_it_not_a_period_later(
    redis_url: str,
) -> None:
    """Checks 250 s apart (from 1,000 s: 1,500 s, then 1,750 s): the head has waited
    `after` at 1,070 s and old's pods reach `minRuntime` at 1,600 s, so the check comes
    at 1,600 s, not at 1,750 s."""
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True, every=250.0)
    for t in range(1_020, 1_600, 10):
        rig.at(float(t))
    rig.at(1_599.5)
    assert evictions.pods == []
    rig.at(1_600.0)
    assert [p.tenant for p in evictions.pods] == ["old", "old"]


def test_a_queued_training_pod_is_checked_for_once_it_has_waited_after(
    redis_url: str,
) -> None:
    """Checks 250 s apart (from 1,000 s); new's pods arrive at 1,010 s and old's have run
    minRuntime already: the check comes when new's head has waited `after` (1,070 s),
    not at the next period (1,250 s)."""
    prompt = {"after": "1m", "minRuntime": "1s", "perHour": 12}
    rig, evictions = _reclaim_rig(redis_url, prompt, preemptible=True, every=250.0)
    for t in range(1_020, 1_070, 10):
        rig.at(float(t))
    rig.at(1_069.5)
    assert evictions.pods == []
    rig.at(1_070.0)
    assert [p.tenant for p in evictions.pods] == ["old", "old"]


def _count_snapshots(rig: Any) -> list[float]:
    """The times at which the dispatcher reads the queue's snapshot from now on."""
    reads: list[float] = []
    snapshot = rig.queue.snapshot

    def counted() -> Any:
        reads.append(rig.clock())
        return snapshot()

    rig.dispatcher.queue.snapshot = counted
    return reads


def test_the_reclaim_check_shares_the_status_passs_snapshot(redis_url: str) -> None:
    """With the status pass and the reclaim check in every step, each step reads the
    queue's snapshot once (the standings of 10,000 tenants take most of a second to
    read), and the reclaim still comes at 1,600 s."""
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True, status_every=0.0)
    reads = _count_snapshots(rig)
    steps = [float(t) for t in range(1_100, 1_700, 100)]
    for t in steps:
        rig.at(t)
    assert [p.tenant for p in evictions.pods] == ["old", "old"]
    assert sorted(set(reads)) == steps and len(reads) == len(steps)


def test_a_reclaim_check_with_nothing_to_reclaim_reads_no_snapshot(redis_url: str) -> None:
    """Reclaim on, but no pod is labelled preemptible (or none has run minRuntime): the
    check needs no standings, so it reads no snapshot; the status pass alone does."""
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=False,
                                  status_every=10_000.0)
    reads = _count_snapshots(rig)
    for t in (1_100.0, 1_700.0, 5_000.0):
        rig.at(t)
    assert evictions.pods == [] and reads == []
    rig.at(12_000.0)  # the status pass is due
    assert reads == [12_000.0]


def _newcomer_rig(redis_url: str, evictor: _Evictions | None) -> Any:
    """16 GPUs full of "old"'s preemptible 1-GPU pods (started at 1,000 s); "new" (equal
    weight) joins at 1,010 s with ten; reclaim on (after 1m, minRuntime 10m, 60 an hour),
    checked every 10 s; ``evictor``: None lets the cluster evict (at once)."""
    tenants = {name: {"weight": 1, "nominal": {"gpu": 16}} for name in ("old", "new")}
    rig = make_rig(redis_url, tenants, {"gpu": 16},
                   settings=DispatcherSettings(reclaim_every=10.0))
    platform = rig.config.platform.model_copy(update={"fair_share": FairShareSpec.model_validate(
        {"reclaim": {"after": "1m", "minRuntime": "10m", "perHour": 60}})})
    config = FairgateConfig(platform=platform, quotas=rig.config.quotas)
    rig.dispatcher.config = lambda: config
    rig.dispatcher.evictor = rig.cluster if evictor is None else evictor
    for i in range(16):
        rig.cluster.create_pod(PodSpec("old-ns", f"old-{i}", "old", "training", {"gpu": 1},
                                       duration=8 * 3600, preemptible=True))
    rig.settle()
    rig.at(1_010.0)
    for i in range(10):
        rig.cluster.create_pod(PodSpec("new-ns", f"new-{i}", "new", "training", {"gpu": 1},
                                       duration=8 * 3600))
    rig.settle()
    return rig


def test_the_next_reclaim_check_comes_once_the_last_reclaims_pods_are_gone(
    redis_url: str,
) -> None:
    """16 GPUs full of "old"'s preemptible 1-GPU pods; "new" (equal weight) joins with
    ten. Checks are 10 s apart, but once the pod a reclaim evicted is gone (the cluster
    evicts at once) and its head runs, the next head is checked at once: at the same
    instant "new" holds its 8 GPUs, and "old" keeps its 8."""
    rig = _newcomer_rig(redis_url, None)  # the cluster evicts at once; the controller re-creates
    rig.at(1_700.0)  # the pods ran 700 s, the heads waited 690 s

    def running(tenant: str) -> int:
        return sum(1 for h in rig.cluster.history.values() if h.spec.tenant == tenant
                   and h.started is not None and h.ended is None)

    assert (running("new"), running("old")) == (8, 8)
    assert rig.cluster.reclaims == 8
    rig.at(1_760.0)  # "new" holds its entitlement: nothing more is reclaimed
    assert (running("new"), running("old"), rig.cluster.reclaims) == (8, 8, 8)


def test_one_reclaim_check_reclaims_for_the_owed_tenants_next_heads_in_turn(
    redis_url: str,
) -> None:
    """16 GPUs full of "old"'s preemptible 1-GPU pods; "new" (equal weight) joins with
    ten. One check evicts 8 pods, one for each of new's first 8 pods (each Event names
    its own), without waiting for the first eviction's pod to be gone; not more: new
    then holds its entitlement."""
    evictions = _Evictions()  # asked to evict, the cluster keeps the pods for now
    rig = _newcomer_rig(redis_url, evictions)
    rig.at(1_700.0)
    assert [p.tenant for p in evictions.pods] == ["old"] * 8
    owed = sorted(e.message.split("reclaimed for ")[1].split(" ")[0]
                  for e in rig.cluster.events if e.reason == "Reclaimed")
    assert owed == sorted(f"new-ns/new-{i}" for i in range(8))


def test_reclaims_are_counted_in_the_metrics(redis_url: str) -> None:
    """Two 4-GPU pods of "old" reclaimed at 1,700 s, each 700 s into its run."""
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True)
    rig.at(1_700.0)
    assert len(evictions.pods) == 2
    text = rig.dispatcher.metrics.render().decode()
    assert 'fairgate_reclaims_total{tenant="old"} 2.0' in text
    assert 'fairgate_reclaimed_gpu_seconds_total{tenant="old"} 5600.0' in text
    assert 'fairgate_reclaims_total{tenant="new"}' not in text


@pytest.mark.parametrize(("reclaim", "preemptible"),
                         [(None, True), (None, False), (RECLAIM_ON, False)],
                         ids=["off", "off-unlabelled", "on-unlabelled"])
def test_no_training_pod_is_evicted_for_training_unless_reclaim_is_on(
    redis_url: str, reclaim: dict[str, Any] | None, preemptible: bool,
) -> None:
    rig, evictions = _reclaim_rig(redis_url, reclaim, preemptible)
    for at in (1_700.0, 5_000.0, 20_000.0):
        rig.at(at)
    assert evictions.pods == []
    assert not [e for e in rig.cluster.events if e.reason == "Reclaimed"]


def test_reclaims_are_shown_by_status_and_why(redis_url: str) -> None:
    """After the reclaim (two of old's pods, still terminating): ``fairgate status`` says
    reclaim is on and lists both; ``fairgate why`` says a victim is being reclaimed and
    that the head had pods reclaimed for it."""
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig, evictions = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True, audit=audit)
    rig.at(1_700.0)
    assert len(evictions.pods) == 2
    report = status_report(rig.queue, now=1_700.0)
    notes = report["reclaim"]
    assert notes["on"] is True and notes["last_hour"] == 2
    assert (notes["after"], notes["min_runtime"], notes["per_hour"]) == (60.0, 600.0, 12)
    assert {r["pod"] for r in notes["recent"]} == {str(p.ref) for p in evictions.pods}
    assert {(r["tenant"], r["for"], r["for_tenant"], r["ran_seconds"], r["gpu_equivalents"])
            for r in notes["recent"]} == {("old", "new-ns/new-0", "new", 700.0, 4.0)}
    out = io.StringIO()
    render_status(report, Console(file=out, width=170))
    text = out.getvalue()
    assert ("reclaim: on (after 60s waiting, pods that ran at least 600s, at most 12 an "
            "hour): 2 reclaimed in the last hour") in text
    assert (f"reclaimed {evictions.pods[0].ref} of tenant old (4 GPU-eq, after 700s running) "
            "for new-ns/new-0 of tenant new") in text
    records = [e.record for e in audit.entries() if e.record is not None]
    victim = why_report(evictions.pods[0].ref, rig.queue, records, 1_700.0)
    assert "; being reclaimed for new-ns/new-0 of tenant new" in victim.summary
    head = why_report(PodRef("new-ns", "new-0"), rig.queue, records, 1_700.0)
    assert head.verdict == "queued"
    assert "2 pods of other tenants reclaimed for it" in head.summary


def test_a_reclaimed_pod_that_is_gone_is_explained(redis_url: str) -> None:
    """With the cluster evicting for real (its pods end at once and are re-created), the
    evicted pod's why says it was reclaimed, for whom and after how long."""
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig, _ = _reclaim_rig(redis_url, RECLAIM_ON, preemptible=True, audit=audit)
    rig.dispatcher.evictor = rig.cluster
    rig.at(1_700.0)
    rig.at(1_710.0)
    gone = [h for h in rig.cluster.history.values() if h.reclaimed]
    assert len(gone) == 2
    records = [e.record for e in audit.entries() if e.record is not None]
    ref = PodRef(gone[0].spec.namespace, gone[0].spec.name)
    why = why_report(ref, rig.queue, records, 1_710.0)
    assert why.verdict == "ended"
    assert why.summary.startswith(
        "reclaimed for new-ns/new-0 of tenant new (owed its fair share) after 700.0s running")
    assert "its controller's replacement, if any, is queued like any new pod" in why.summary


@pytest.mark.parametrize("evictor", [True, False])
def test_status_says_when_reclaim_is_off(redis_url: str, evictor: bool) -> None:
    rig, _ = _reclaim_rig(redis_url, None if evictor else RECLAIM_ON, preemptible=True)
    if not evictor:
        rig.dispatcher.evictor = None  # a dispatcher that may not evict: reclaim is off
    rig.at(1_700.0)
    notes = rig.queue.reclaim_notes()
    assert notes is not None and notes["on"] is False and notes["last_hour"] == 0
    assert reclaim_lines(notes) == [
        "reclaim: off (fairShare.reclaim is not set in fairgate-platform): no training "
        "pod is evicted for another tenant's"]


def test_reclaim_lines_leave_out_reclaims_of_tenants_not_seen() -> None:
    entry = {"at": 0.0, "pod": "old-ns/old-1", "tenant": "old", "for": "new-ns/new-0",
             "for_tenant": "new", "ran_seconds": 700.0, "gpu_equivalents": 4.0}
    notes = {"on": True, "after": 60.0, "min_runtime": 600.0, "per_hour": 12, "last_hour": 1,
             "recent": [entry]}
    assert len(reclaim_lines(notes)) == 2
    assert len(reclaim_lines(notes, lambda t: t == "new")) == 1  # old's pod is not shown
    assert reclaim_lines(None) == []  # no dispatcher has checked yet


def _lending_rig(redis_url: str, audit: AuditLog | None = None,
                 starts: tuple[float, ...] = tuple(1_000.0 + i for i in range(8))) -> Any:
    """8 GPUs: "lender" (nominal 4) sends nothing, so "borrower" (nominal 4, borrowLimit 4)
    fills all 8 with 1-GPU training pods started at ``starts`` (by default one a second
    from 1,000 s; the last four borrowed). This simulated scheduler does not preempt for
    inference (its class says Never), so only the dispatcher can make room."""
    tenants = {"lender": {"nominal": {"gpu": 4}},
               "borrower": {"nominal": {"gpu": 4}, "borrowLimit": {"gpuEquivalents": 4}}}
    rig = make_rig(redis_url, tenants, {"gpu": 8}, audit=audit)
    rig.cluster.priority_classes = PriorityClasses.model_validate(
        {"inference": {"name": "fairgate-inference", "value": 100000,
                       "preemptionPolicy": "Never"}})
    rig.dispatcher.evictor = rig.cluster
    for i, start in enumerate(starts):
        rig.at(start)
        rig.pod(f"train-{i}", tenant="borrower", duration=3600)
        rig.settle()
    assert [p.band for p in _running_of(rig, "borrower")] == ["training"] * 4 + ["borrowed"] * 4
    return rig


def _running_of(rig: Any, tenant: str) -> list[GpuPod]:
    return sorted((p for p in rig.cluster.list_pods()
                   if p.tenant == tenant and p.phase == "Running"), key=lambda p: p.created)


def test_inference_takes_back_lent_capacity_at_once(redis_url: str) -> None:
    """A 1-GPU inference pod of the lender: the youngest borrowed pod, the one the
    kube-scheduler would take, is evicted as it is admitted (no training-band pod,
    nothing more), it runs, and the eviction has its Event, ``preempt`` record and
    metric."""
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = _lending_rig(redis_url, audit)
    rig.at(1_100.0)
    rig.pod("serve", tenant="lender", pod_class="inference", demand={"gpu": 1})
    rig.settle()
    assert [p.ref.name for p in _running_of(rig, "lender")] == ["serve"]
    assert [h.spec.name for h in rig.cluster.history.values() if h.reclaimed] == ["train-7"]
    (warned,) = [e for e in rig.cluster.events if e.reason == "Preempted"]
    assert warned.type_ == "Warning"
    assert "evicted for inference pod lender-ns/serve of tenant lender" in warned.message
    records = [e.record for e in audit.entries()
               if e.record is not None and e.record.decision == PREEMPT]
    assert [r.name for r in records] == ["train-7"]
    text = rig.dispatcher.metrics.render().decode()
    assert 'fairgate_preemptions_total{tenant="borrower"} 1.0' in text
    # the replacement of the evicted pod waits: the lender's quota is its own again
    assert len(_running_of(rig, "borrower")) == 7


@pytest.mark.parametrize(
    ("case", "starts", "demand"),
    [
        ("the two youngest started in one second: the scheduler picks one at random",
         (1_000.0, 1_001.0, 1_002.0, 1_003.0, 1_004.0, 1_005.0, 1_006.2, 1_006.7), {"gpu": 1}),
        ("a 2-GPU pod: the scheduler picks a node, not the two youngest pods",
         tuple(1_000.0 + i for i in range(8)), {"gpu": 2}),
    ],
)
def test_inference_room_is_left_to_the_scheduler_when_its_victim_is_not_certain(
        redis_url: str, case: str, starts: tuple[float, ...], demand: dict[str, int]) -> None:
    """The kube-scheduler preempts for the ungated inference pod as well: fairgate evicts
    only a pod it is certain the scheduler takes, or two pods go for one."""
    rig = _lending_rig(redis_url, starts=starts)
    rig.at(1_100.0)
    rig.pod("serve", tenant="lender", pod_class="inference", demand=demand)
    rig.settle()
    assert not [h for h in rig.cluster.history.values() if h.reclaimed], case
    assert not [e for e in rig.cluster.events if e.reason == "Preempted"], case


def test_inference_that_fits_evicts_nothing(redis_url: str) -> None:
    rig = _lending_rig(redis_url)
    rig.at(1_100.0)
    rig.cluster.delete_pod(_running_of(rig, "borrower")[-1].uid)  # one GPU frees
    rig.settle()
    rig.pod("serve", tenant="lender", pod_class="inference", demand={"gpu": 1})
    rig.settle()
    assert [p.ref.name for p in _running_of(rig, "lender")] == ["serve"]
    assert not [h for h in rig.cluster.history.values() if h.reclaimed]
    assert not [e for e in rig.cluster.events if e.reason == "Preempted"]


def test_no_eviction_for_inference_without_an_evictor(redis_url: str) -> None:
    rig = _lending_rig(redis_url)
    rig.dispatcher.evictor = None
    rig.at(1_100.0)
    rig.pod("serve", tenant="lender", pod_class="inference", demand={"gpu": 1})
    rig.settle()
    assert not [h for h in rig.cluster.history.values() if h.reclaimed]
    assert len(_running_of(rig, "borrower")) == 8
