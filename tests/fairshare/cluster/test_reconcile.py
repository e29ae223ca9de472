"""Invariant 6: after Redis loses everything, the reconciler restores queue and usage
exactly from the cluster's pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from fairshare.cluster.cluster import GpuPod, PodRef
from fairshare.cluster.reconcile import cluster_truth, reconcile
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.sim.simulate import Simulation
from fairshare.sim.trace import load_trace
from tests.fairshare.queue.test_queue import config as make_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _snapshot(sim: Simulation, client: redis.Redis | None = None) -> dict[str, Any]:
    """Usage per tenant and, per tenant and class, the gated tickets in queue order;
    with ``client``, the cluster usage per band and capacity key (placement class)."""
    now = sim.clock()
    tenants = {
        s.tenant: (s.used, s.used_slices, s.borrowed_slices, s.training_slices,
                   s.inference_slices, dict(s.queued))
        for s in sim.queue.tenant_status()
    }
    order: dict[tuple[str, str], list[tuple[int | None, str, str]]] = {}
    gated = sorted((p for p in sim.cluster.list_pods() if p.gated), key=lambda p: p.ticket)
    step = max(1, len(gated) // 300)  # positions cost a script call each: sample big queues
    for pod in gated[::step]:
        status = sim.queue.ticket_status(pod.ticket, now)
        assert status is not None, f"{pod.ref} is gated but not in the queue"
        order.setdefault((pod.tenant, pod.pod_class), []).append(
            (status.position, status.state, pod.ticket)
        )
    used = ({} if client is None else
            {k: v for k, v in client.hgetall("fairgate:used").items() if int(v)})
    return {"tenants": tenants, "order": {k: sorted(v, key=str) for k, v in order.items()},
            "used": used}


@pytest.mark.slow
@pytest.mark.parametrize(("example", "when"), [
    ("weights-1-2-3.yaml", 777.0), ("inference-burst.yaml", 333.0), ("gangs.yaml", 421.0),
    ("mig-and-gpus.yaml", 1_234.0), ("placement.yaml", 600.0),
])
def test_flush_then_rebuild_restores_queue_order_and_usage(
    redis_url: str, example: str, when: float
) -> None:
    trace = load_trace(EXAMPLES / example)
    client = redis.Redis.from_url(redis_url)
    sim = Simulation(trace, client, "fairgate:")
    sim.advance(when)
    before = _snapshot(sim, client)
    assert any(before["order"].values()), "the trace should have pods queued at this point"
    assert any(t[1] for t in before["tenants"].values()), "and pods running"

    client.flushall()
    assert sim.queue.tenant_status() == []
    sim.dispatcher.reconcile()

    assert _snapshot(sim, client) == before


@pytest.mark.slow
@pytest.mark.parametrize("example", ["inference-burst.yaml", "gangs.yaml"])
def test_a_run_with_a_flush_in_the_middle_ends_like_one_without(
    redis_url: str, example: str
) -> None:
    trace = load_trace(EXAMPLES / example)
    client = redis.Redis.from_url(redis_url)
    plain = Simulation(trace, client, "fairgate:plain:")
    flushed = Simulation(trace, client, "fairgate:flushed:")
    plain.advance(500.0)
    flushed.advance(500.0)
    client.delete(*client.keys("fairgate:flushed:*"))  # this queue's Redis state is lost
    flushed.dispatcher.reconcile()
    assert plain.run().to_json() == flushed.run().to_json()


def test_cluster_truth_splits_gated_from_running_and_skips_finished(redis_url: str) -> None:
    trace = load_trace(EXAMPLES / "gangs.yaml")
    sim = Simulation(trace, redis.Redis.from_url(redis_url), "fairgate:")
    sim.advance(250.0)
    pods = sim.cluster.list_pods()
    truth = cluster_truth(pods)
    running = {p.ticket for p in pods if not p.gated and not p.finished}
    gated = {p.ticket for p in pods if p.gated}
    assert {r.ticket for r in truth.running} == running
    assert {g.request.ticket for g in truth.gated} == gated
    assert any(p.finished for p in pods)  # finished pods were there and were skipped
    gang = [g for g in truth.gated if g.request.group is not None]
    assert gang and all(g.request.gang == f"{g.request.namespace}/{g.request.group}"
                        for g in gang)
    assert truth.skipped == 0


def test_reconcile_from_a_listing_keeps_what_was_dispatched_since(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = FairQueue(client)
    config = make_config(a={"nominal": {"gpu": 2}})
    queue.sync_config(config, {"gpu": 0})  # no node yet: the pod queues
    request = PodRequest("tk-1", "a", "ns-a", "p1", "training", {"gpu": 1},
                         submitted_at=10.0)
    assert queue.admit(request, 10.0).outcome == "queued"
    listed = [GpuPod(PodRef("ns-a", "p1"), "uid-1", "tk-1", "a", "training", "training",
                     {"gpu": 1}, None, 1, "Pending", True, None, 10.0)]
    listed_at = 20.0  # the reconciler lists: p1 is gated
    queue.sync_config(config, {"gpu": 1})
    assert [r.ticket for r in queue.dispatch(21.0)] == ["tk-1"]  # a dispatcher, meanwhile
    summary = reconcile(queue, listed, listed_at=listed_at)
    assert (summary.running, summary.gated) == (0, 1)
    status = queue.ticket_status("tk-1", 22.0)
    assert status is not None and status.state == "running"
    assert queue.tenant_status()[0].used == {"gpu": 1}
    assert queue.dispatch(22.0) == []  # not released (and counted) twice


def _stamped(name: str, uid: str, created: float, gated: bool = False) -> GpuPod:
    return GpuPod(ref=PodRef("ns-a", name), uid=uid, ticket="t1", tenant="a",
                  pod_class="training", band="training", demand={"gpu": 2}, group=None,
                  group_size=1, phase="Pending" if gated else "Running", gated=gated,
                  node=None if gated else "node-1", created=created)


def test_a_twin_that_runs_is_counted_as_its_own_pod_and_never_as_the_owner() -> None:
    """Two pods with one ticket created within the same second (creation times have
    whole seconds): the one the dispatcher saw own it stays the owner, whatever the uids
    say; the other holds GPUs too, so it is counted under a ticket of its own; a gated
    twin holds nothing and is skipped."""
    owner, twin = _stamped("owner", "uid-b", 100.0), _stamped("copy", "uid-a", 100.0)
    truth = cluster_truth([twin, owner], bound={"t1": "uid-b"})
    assert truth.owners["t1"].uid == "uid-b" and truth.twins == [twin]
    assert sorted((p.ticket, p.uid) for p in truth.running) == [
        ("t1", "uid-b"), ("t1.twin.uid-a", "uid-a")]
    assert truth.skipped == 0
    gated = _stamped("gated-copy", "uid-c", 101.0, gated=True)
    truth = cluster_truth([twin, owner, gated], bound={"t1": "uid-b"})
    assert len(truth.running) == 2 and truth.skipped == 1


def test_a_charge_that_moves_to_a_pod_older_by_uid_frees_the_first_payers_ticket(
    redis_url: str,
) -> None:
    """Two pods share a 3-GPU claim and were created in the same second: the dispatcher
    released the first (charged 3) and let the second ride; the reconcile makes the one
    with the lower uid pay. The first's ticket, released moments ago (kept by the rebuild
    as in flight), must not stay charged too: 3 GPUs, not 6."""
    client = redis.Redis.from_url(redis_url)
    queue = FairQueue(client)
    config = make_config(a={"nominal": {"gpu": 4}})
    queue.sync_config(config, {"gpu": 8})
    claim = {"claim-uid": {"gpu": 3}}
    for ticket, name in (("tk-first", "first"), ("tk-second", "second")):
        request = PodRequest(ticket, "a", "ns-a", name, "training", {"gpu": 3},
                             submitted_at=10.0, hold=True)
        assert queue.admit(request, 10.0).outcome == "queued"
    assert [r.ticket for r in queue.dispatch(11.0)] == ["tk-first"]
    assert queue.release("tk-second", "uid-a", 11.0)  # the rider's queued place goes

    def pod(name: str, uid: str, ticket: str) -> GpuPod:
        return GpuPod(ref=PodRef("ns-a", name), uid=uid, ticket=ticket, tenant="a",
                      pod_class="training", band="training", demand={"gpu": 3}, group=None,
                      group_size=1, phase="Running", gated=False, node="node-1",
                      created=10.0, shared=claim)

    listed = [pod("first", "uid-b", "tk-first"), pod("second", "uid-a", "tk-second")]
    summary = reconcile(queue, listed, listed_at=12.0)
    assert [r.ref.name for r in summary.riders] == ["first"]  # uid-a is older by uid
    assert queue.tenant_status()[0].used == {"gpu": 3}
