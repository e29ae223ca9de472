"""Paths of ``admit.lua`` that the cost work (bench/redis_scripts.py) made conditional,
against a real redis-server: a fast-path reservation re-evaluates the tenant's waiting
lanes with its new usage."""

from __future__ import annotations

import redis

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec
from tenants.resources import ResourceCounts
from tests.fairshare.tickets import pod_uid


def request(ticket: str, tenant: str, demand: ResourceCounts, at: float) -> PodRequest:
    return PodRequest(ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}", name=ticket,
                      pod_class="training", demand=demand, submitted_at=at)


def test_reservation_takes_a_waiting_lane_out_of_turn_when_it_uses_the_room(
        redis_client: redis.Redis) -> None:
    # a: 2 GPUs + 7 MIG slices nominal (21 slices), 1 GPU-eq kept for inference, so
    # training may use 14 slices: the 2-GPU pod alone, or MIG pods, not both.
    platform = PlatformConfig.model_validate({"tenants": {
        "a": {"weight": 1, "ceiling": {"gpuEquivalents": 100}},
        "b": {"weight": 1, "ceiling": {"gpuEquivalents": 100}},
    }})
    quotas = {
        "a": QuotaSpec.model_validate({"nominal": {"gpu": 2, "mig-1g.5gb": 7},
                                       "inferenceReserve": {"gpuEquivalents": 1}}),
        "b": QuotaSpec.model_validate({"nominal": {"gpu": 1}}),
    }
    q = FairQueue(redis_client)
    q.sync_config(FairgateConfig(platform=platform, quotas=quotas),
                  {"gpu": 2, "mig-1g.5gb": 7})
    assert q.admit(request("b1", "b", {"gpu": 1}, 1.0), 1.0).outcome == "reserved"
    big = q.admit(request("a1", "a", {"gpu": 2}, 2.0), 2.0)
    assert (big.outcome, big.waiting_for) == ("queued", "1 x gpu of cluster capacity")
    # a MIG pod shares no resource with the waiting lane and fits: reserved at once,
    # and now a's training slices leave no room for the 2-GPU pod
    assert q.admit(request("a2", "a", {"mig-1g.5gb": 1}, 3.0), 3.0).outcome == "reserved"
    assert q.release("b1", pod_uid("b1"))
    assert q.dispatch(4.0, limit=10) == []  # capacity is free, a's quota is not
    why = q.ticket_status("a1", 4.0)
    assert why is not None and why.waiting_for == "0.14 GPU-eq of tenant quota"
    assert q.release("a2", pod_uid("a2"))
    assert [r.ticket for r in q.dispatch(5.0, limit=10)] == ["a1"]
