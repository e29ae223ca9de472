"""A ResourceClaim two pods share is charged once, by the dispatcher against the real
queue (real Redis) and a simulated cluster: the second pod rides on the first's charge,
the charge moves to it when the first ends (usage never drops on the way), and a Redis
flush rebuilds the same usage from the pods."""

from __future__ import annotations

from typing import Any

import redis

from fairshare.cluster.cluster import GpuPod
from fairshare.dispatcher import Dispatcher
from fairshare.queue.fairqueue import FairQueue
from fairshare.sim.simcluster import PodSpec, SimulatedCluster, VirtualClock
from tests.fairshare.simkit import Rig, admit_hook, make_config

TEAM_A = {"team-a": {"weight": 1, "nominal": {"gpu": 4}}}
CLAIM = {"claim-uid-x": {"gpu": 3}}
GPU = 7  # slices


class _Recording(FairQueue):
    """The real queue, noting team-a's usage after every release and rebuild."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.seen: list[int] = []

    def used(self) -> int:
        return next(s.used_slices for s in self.tenant_status() if s.tenant == "team-a")

    def release(self, ticket: str, uid: str, now: float | None = None,
                hand_over: bool = True) -> bool:
        released = super().release(ticket, uid, now, hand_over=hand_over)
        self.seen.append(self.used())
        return released

    def rebuild(self, *args: Any, **kwargs: Any) -> None:
        super().rebuild(*args, **kwargs)
        self.seen.append(self.used())


def _rig(redis_url: str) -> tuple[Rig, _Recording]:
    client = redis.Redis.from_url(redis_url)
    queue = _Recording(client)
    clock = VirtualClock(1_000.0)
    config = make_config(TEAM_A)
    cluster = SimulatedCluster({"gpu": 8}, admit_hook(queue, clock, config), clock)
    dispatcher = Dispatcher(queue, cluster, lambda: config, clock=clock)
    dispatcher.sync(force=True)
    return Rig(client, queue, clock, cluster, dispatcher, config), queue


def _sharer(rig: Rig, name: str, duration: float) -> GpuPod:
    """A pod whose only GPUs are the shared 3-GPU claim."""
    return rig.cluster.create_pod(PodSpec("team-a-ns", name, "team-a", "training",
                                          {"gpu": 3}, duration, shared=CLAIM))


def test_a_shared_claim_is_charged_once_and_moves_to_the_pod_still_holding_it(
    redis_url: str,
) -> None:
    rig, queue = _rig(redis_url)
    first = _sharer(rig, "first", 100)
    second = _sharer(rig, "second", 200)
    assert not first.gated and second.gated  # the queue priced it in full at CREATE
    rig.settle()
    history = rig.cluster.history
    assert history[second.uid].released == 1_000.0  # it rides on first's charge
    assert queue.used() == 3 * GPU
    own = rig.pod("own-2", demand={"gpu": 2}, duration=10)
    rig.settle()
    assert history[own.uid].released is None and queue.used() == 3 * GPU

    queue.seen.clear()
    rig.at(1_100.0)  # first ends; second still holds the claim
    assert history[first.uid].ended == 1_100.0
    assert queue.seen and min(queue.seen) == 3 * GPU, queue.seen
    assert queue.used() == 3 * GPU and history[own.uid].released is None

    rig.at(1_200.0)  # the last pod holding the claim ends: its charge goes with it
    assert history[own.uid].released == 1_200.0
    assert queue.used() == 2 * GPU


def test_a_redis_flush_rebuilds_one_charge_for_the_shared_claim(redis_url: str) -> None:
    rig, queue = _rig(redis_url)
    _sharer(rig, "first", 100)
    _sharer(rig, "second", 100)
    rig.settle()
    assert queue.used() == 3 * GPU
    rig.client.flushall()
    rig.settle()
    assert queue.used() == 3 * GPU
