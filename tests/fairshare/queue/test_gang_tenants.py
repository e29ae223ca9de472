"""One gang, two tenants: a pod group (``namespace/group``) whose namespace changed
its ``fairgate.io/tenant`` label while the gang was partly queued. Admission refuses
the member of the other tenant; a Redis or cluster that already holds such a gang
(admitted before that check) must not make dispatch fail, against a real redis-server.
"""

from __future__ import annotations

import pytest
import redis

from fairshare.queue.calls import text
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GatedPod, InvalidRequestError, PodRequest
from tests.fairshare.queue.test_queue import queue_with
from tests.fairshare.tickets import pod_uid

PREFIX = "fairgate:"


def member(ticket: str, tenant: str, group: str = "g", size: int = 2,
           gpus: int = 1, namespace: str = "ns-x") -> PodRequest:
    """A training gang member of pod group ``namespace/group`` admitted under ``tenant``."""
    return PodRequest(
        ticket=ticket, tenant=tenant, namespace=namespace, name=f"p-{ticket}",
        pod_class="training", demand={"gpu": gpus}, group=group, group_size=size,
        submitted_at=float(ticket.lstrip("t")),
    )


def single(ticket: str, tenant: str, gpus: int = 1) -> PodRequest:
    return PodRequest(
        ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}", name=f"p-{ticket}",
        pod_class="training", demand={"gpu": gpus}, submitted_at=float(ticket.lstrip("t")),
    )


def plant_stale_ready(client: redis.Redis, tenant: str, shape: str, score: float) -> None:
    """What the scripts before the tenant check could leave behind: ``tenant`` in the
    ready set of ``shape`` (and the shape in its lanes) while its lane is empty."""
    client.zadd(f"{PREFIX}r:{shape}", {tenant: score})
    client.sadd(f"{PREFIX}sh:t", shape)
    client.sadd(f"{PREFIX}tl:{tenant}", shape)
    assert client.llen(f"{PREFIX}q:{tenant}:{shape}") == 0


def assert_no_stale_ready(client: redis.Redis, tenants: list[str]) -> None:
    """Every tenant in a ready set has a non-empty lane of that shape (a member is the
    lane head's key, a space and the tenant; a planted stale one the bare tenant)."""
    for key in client.scan_iter(f"{PREFIX}r:*"):
        shape = text(key)[len(PREFIX) + 2:]
        for member in client.zrange(key, 0, -1):
            name = text(member).rpartition(" ")[2]
            assert client.llen(f"{PREFIX}q:{name}:{shape}") > 0, (name, shape)
    for tenant in tenants:
        for lane in client.smembers(f"{PREFIX}tl:{tenant}"):
            assert client.llen(f"{PREFIX}q:{tenant}:{text(lane)}") > 0, (tenant, lane)


def two_tenants(client: redis.Redis, gpus: int) -> FairQueue:
    return queue_with(client, {"gpu": gpus}, a={"nominal": {"gpu": 8}},
                      b={"nominal": {"gpu": 8}}, c={"nominal": {"gpu": 8}})


def test_gang_member_under_another_tenant_is_refused(redis_client: redis.Redis) -> None:
    q = two_tenants(redis_client, 8)
    first = q.admit(member("t1", "a"), 0.0)
    assert (first.outcome, first.waiting_for) == (
        "queued", "the 2nd pod of gang ns-x/g (1 of 2 pods created)")
    before = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    for dry_run in (True, False):
        with pytest.raises(InvalidRequestError) as refused:
            q.admit(member("t2", "b"), 0.0, dry_run=dry_run)
        message = str(refused.value)
        assert message.startswith("pod group ns-x/g mixes tenants: ")
        assert "a" in message and "b" in message
        assert "every member of a gang must be in the same tenant" in message
        assert "recreate" in message
    # nothing was written: no key, no counter, no sequence number
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == before
    assert q.ticket_status("t2", 0.0) is None
    # the gang completes with a member of its own tenant and runs whole
    q.admit(member("t3", "a"), 0.0)
    assert sorted(r.ticket for r in q.dispatch(1.0, 10)) == ["t1", "t3"]
    # while members run, the gang keeps its tenant: a recreated member of b is refused
    q.release("t3", pod_uid("t3"))
    with pytest.raises(InvalidRequestError, match="mixes tenants"):
        q.admit(member("t4", "b"), 2.0)
    again = q.admit(member("t5", "a"), 2.0)
    assert again.outcome == "queued"
    assert [r.ticket for r in q.dispatch(3.0, 10)] == ["t5"]
    # once the gang is gone, its id may be used by another tenant
    q.release("t1", pod_uid("t1"))
    q.release("t5", pod_uid("t5"))
    assert q.admit(member("t6", "b"), 4.0).outcome == "queued"


def test_gang_split_over_tenants_by_the_cluster_dispatches(redis_client: redis.Redis) -> None:
    """A cluster listing a gang whose members carry two tenants (admitted before the
    check) is rebuilt; removing members and dispatching keep working."""
    q = two_tenants(redis_client, 8)
    q.rebuild([], [GatedPod(member("t1", "a"), "training", pod_uid("t1")),
                   GatedPod(member("t2", "b"), "training", pod_uid("t2")),
                   GatedPod(single("t3", "c"), "training", pod_uid("t3"))])
    assert_no_stale_ready(redis_client, ["a", "b", "c"])
    # the member of a is deleted: the gang is incomplete again
    assert q.remove("t1", pod_uid("t1"))
    assert_no_stale_ready(redis_client, ["a", "b", "c"])
    assert [r.ticket for r in q.dispatch(1.0, 10)] == ["t3"]
    # the gang keeps the tenant it was listed with first: b's new member is refused
    # until the gang is recreated
    with pytest.raises(InvalidRequestError, match="pod group ns-x/g mixes tenants"):
        q.admit(member("t4", "b"), 2.0)
    q.admit(member("t5", "a"), 2.0)
    # the gang runs whole, each member counting against the tenant it was admitted under
    assert sorted(r.ticket for r in q.dispatch(3.0, 10)) == ["t2", "t5"]
    used = {s.tenant: s.used.get("gpu", 0) for s in q.tenant_status()}
    assert used == {"a": 1, "b": 1, "c": 1}
    assert_no_stale_ready(redis_client, ["a", "b", "c"])
    for ticket in ("t2", "t5"):
        assert q.release(ticket, pod_uid(ticket))
    assert q.admit(member("t6", "b"), 4.0).outcome == "queued"


def test_gang_split_over_tenants_requeues_and_releases(redis_client: redis.Redis) -> None:
    q = two_tenants(redis_client, 8)
    q.rebuild([], [GatedPod(member("t1", "a", size=3), "training", pod_uid("t1")),
                   GatedPod(member("t2", "b", size=3), "training", pod_uid("t2")),
                   GatedPod(member("t3", "b", size=3), "training", pod_uid("t3"))])
    assert sorted(r.ticket for r in q.dispatch(1.0, 10)) == ["t1", "t2", "t3"]
    # a member that could not start is retried alone; another one ends
    assert q.requeue("t2")
    assert q.release("t3", pod_uid("t3"))
    assert_no_stale_ready(redis_client, ["a", "b"])
    assert [r.ticket for r in q.dispatch(2.0, 10)] == ["t2"]
    for ticket in ("t1", "t2"):
        assert q.release(ticket, pod_uid(ticket))
    assert {s.tenant: s.used_slices for s in q.tenant_status()} == {"a": 0, "b": 0, "c": 0}


@pytest.mark.parametrize("stale_shape", ["t/gpu=1", "t/gpu=2"],
                         ids=["fits", "blocked-by-capacity"])
def test_dispatch_drops_a_ready_tenant_whose_lane_is_empty(redis_client: redis.Redis,
                                                          stale_shape: str) -> None:
    """A Redis written before the tenant check may hold a tenant in a ready set whose
    lane is empty (its gang moved to another tenant's lane): dispatch skips and drops
    it instead of failing, whether it would be picked (fits), its head read for the
    hold test (blocked by capacity) or compared with its tenant's other lane."""
    q = queue_with(redis_client, {"gpu": 3, "mig-1g.5gb": 7},
                   a={"nominal": {"gpu": 8}}, b={"nominal": {"gpu": 8}},
                   c={"nominal": {"gpu": 8}})
    q.admit(single("t1", "c", gpus=2), 0.0)
    q.admit(single("t2", "c"), 0.0)  # both reserved: the cluster is full
    assert q.admit(single("t3", "b"), 0.0).outcome == "queued"
    q.release("t2", pod_uid("t2"))  # one GPU free: t3 may run
    plant_stale_ready(redis_client, "a", stale_shape, 0.0)
    plant_stale_ready(redis_client, "b", "t/gpu=3", 0.0)
    plant_stale_ready(redis_client, "b", "t/mig-1g.5gb=1", 0.0)
    status = q.ticket_status("t3", 0.0)
    assert status is not None and status.state == "queued"
    assert [r.ticket for r in q.dispatch(1.0, 10)] == ["t3"]
    assert_no_stale_ready(redis_client, ["a", "b", "c"])
    assert redis_client.smembers(f"{PREFIX}tl:a") == set()
    # the queue works on: a pod of a's former shape is reserved once capacity is free
    q.release("t1", pod_uid("t1"))
    assert q.admit(single("t4", "a", gpus=2), 2.0).outcome == "reserved"


def test_admission_and_why_survive_a_ready_tenant_whose_lane_is_empty(
        redis_client: redis.Redis) -> None:
    q = queue_with(redis_client, {"gpu": 3},
                   a={"nominal": {"gpu": 8}}, b={"nominal": {"gpu": 8}})
    q.admit(single("t1", "b", gpus=2), 0.0)  # reserved
    plant_stale_ready(redis_client, "a", "t/gpu=2", 0.0)
    queued = q.admit(single("t2", "b", gpus=2), 100.0)  # blocked by capacity
    assert (queued.outcome, queued.waiting_for) == ("queued", "1 x gpu of cluster capacity")
    status = q.ticket_status("t2", 100.0)  # b, alone in the queue, is owed the free GPU
    assert status is not None and status.waiting_for == "capacity held for you: 1 of 2 GPUs"
    assert q.admit(single("t3", "a", gpus=2), 100.0, dry_run=True).outcome == "queued"
    assert q.dispatch(100.0, 10) == []
    assert_no_stale_ready(redis_client, ["a", "b"])
