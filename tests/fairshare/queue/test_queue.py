"""Behaviour of the fair queue against a real redis-server: bands, fast path, order,
gangs, capacity held for the tenant first in order, expiry, requeue, idempotency, dry
run, rebuild, snapshots."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

import pytest
import redis

from admission.pods import admitted_name
from fairshare.queue.calls import (
    TicketConflictError,
    UnknownTenantError,
    UnmintedTicketError,
    lane_entry,
    text,
)
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, GatedPod, InvalidRequestError, PodRequest, RunningPod
from tenants.models import FairgateConfig, PlatformConfig, PodClass, QuotaSpec
from tenants.resources import ResourceCounts
from tests.fairshare.tickets import pod_uid, seen


def config(**tenants: dict[str, Any]) -> FairgateConfig:
    """Tenants as name=dict(weight=..., nominal={...}, borrow=GPUs, reserve=GPUs)."""
    platform = PlatformConfig.model_validate({
        "tenants": {name: {"weight": t.get("weight", 1), "ceiling": {"gpuEquivalents": 1000}}
                    for name, t in tenants.items()},
    })
    quotas = {
        name: QuotaSpec.model_validate({
            "nominal": t.get("nominal", {}),
            "borrowLimit": {"gpuEquivalents": t.get("borrow", 0)},
            "inferenceReserve": {"gpuEquivalents": t.get("reserve", 0)},
        })
        for name, t in tenants.items()
    }
    return FairgateConfig(platform=platform, quotas=quotas)


def keeping_reserves(config: FairgateConfig) -> FairgateConfig:
    """``config`` with ``fairShare.lendInferenceReserve: false``."""
    fair_share = config.platform.fair_share.model_copy(update={"lend_inference_reserve": False})
    return FairgateConfig(
        platform=config.platform.model_copy(update={"fair_share": fair_share}),
        quotas=config.quotas)


class Pods:
    """Makes numbered PodRequests."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, tenant: str, pod_class: PodClass = "training",
                 demand: ResourceCounts | None = None, group: str | None = None,
                 size: int = 1, at: float | None = None) -> PodRequest:
        self.n += 1
        return PodRequest(
            ticket=f"t{self.n}", tenant=tenant, namespace=f"ns-{tenant}", name=f"p{self.n}",
            pod_class=pod_class, demand=demand or {"gpu": 1}, group=group, group_size=size,
            submitted_at=float(self.n) if at is None else at,
        )


@pytest.fixture
def pods() -> Pods:
    return Pods()


def queue_with(client: redis.Redis, capacity: ResourceCounts,
               **tenants: dict[str, Any]) -> FairQueue:
    q = FairQueue(client)
    q.sync_config(config(**tenants), capacity)
    return q


def admit_all(q: FairQueue, reqs: list[PodRequest], now: float = 0.0) -> list[Admission]:
    return [q.admit(r, now) for r in reqs]


def released(q: FairQueue, now: float = 100.0, limit: int = 100) -> list[str]:
    return [r.ticket for r in q.dispatch(now, limit)]


def test_bands_follow_nominal_then_borrow_then_wait(redis_client: redis.Redis,
                                                    pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 100},
                   a={"nominal": {"gpu": 3}, "borrow": 1, "reserve": 1})
    got = admit_all(q, [pods("a") for _ in range(4)] + [pods("a", "inference")] * 1)
    # training room is 3 - 1 reserved GPUs: two training, one borrowed, then it waits
    assert [(a.outcome, a.band) for a in got] == [
        ("reserved", "training"), ("reserved", "training"), ("reserved", "borrowed"),
        ("queued", "training"), ("reserved", "inference"),
    ]
    assert got[3].waiting_for == "1.00 GPU-eq of tenant quota"
    assert got[3].position == 1 and got[3].queue_length == 1
    assert (got[3].free_slices, got[3].nominal_slices) == (7, 21)
    # inference uses the reserve but never borrows
    extra = q.admit(pods("a", "inference"), 0.0)
    assert (extra.outcome, extra.band) == ("queued", "inference")


def admit_seen(q: FairQueue, reqs: list[PodRequest], now: float = 0.0) -> list[Admission]:
    """Admit each pod, and let the dispatcher see it before the next one arrives."""
    answers = []
    for req in reqs:
        answers.append(q.admit(req, now))
        assert seen(q, req) == "confirmed"
    return answers


def test_band_counts_training_queued_ahead(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}, "borrow": 1})
    got = admit_seen(q, [pods("a") for _ in range(6)])
    # capacity 1: one runs, three queue as training (nominal 4 counts them), then borrowed
    assert [a.band for a in got] == ["training"] * 4 + ["borrowed", "training"]
    assert [a.outcome for a in got] == ["reserved"] + ["queued"] * 5


def test_orphan_queue_entries_never_count_as_queued_ahead_and_expire(
        redis_client: redis.Redis, pods: Pods) -> None:
    """Orphans: pods fairgate queued but a later admission step refused
    (ResourceQuota, PodSecurity) never come to exist. Until a pod is seen its entry does
    not push others into the borrowed band, and it expires after the TTL."""
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 2}, "borrow": 2})
    running = pods("a")
    assert q.admit(running, 0.0).outcome == "reserved"
    seen(q, running)
    orphans = [pods("a") for _ in range(3)]  # refused after mutation: never seen
    assert [a.band for a in admit_all(q, orphans)] == ["training"] * 3
    legit = pods("a")
    answer = q.admit(legit, 1.0)
    assert (answer.outcome, answer.band) == ("queued", "training")  # not borrowed
    seen(q, legit)
    assert q.expire(0.0 + q.reservation_ttl - 1) == []
    assert q.expire(0.0 + q.reservation_ttl) == [o.ticket for o in orphans]
    assert q.expire(1.0 + q.reservation_ttl + 100) == []  # seen pods never expire
    q.release(running.ticket, pod_uid(running.ticket))
    assert released(q) == [legit.ticket]
    counters = cast(dict[bytes, bytes], redis_client.hgetall("fairgate:ts:a"))
    assert {k: v for k, v in counters.items() if k.startswith((b"q", b"u")) and v != b"0"} \
        == {b"ut": b"7", b"u:gpu": b"1"}  # only legit runs; nothing queued is left over


def test_mig_pod_is_not_stuck_behind_whole_gpu_pods(redis_client: redis.Redis,
                                                    pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1, "mig-1g.5gb": 7},
                   a={"nominal": {"gpu": 4, "mig-1g.5gb": 7}})
    admit_all(q, [pods("a"), pods("a")])  # the second waits for cluster capacity
    mig = q.admit(pods("a", demand={"mig-1g.5gb": 1}), 0.0)
    assert mig.outcome == "reserved"
    same = q.admit(pods("a"), 0.0)
    assert (same.outcome, same.waiting_for) == ("queued", "1 x gpu of cluster capacity")


def test_fast_path_does_not_jump_own_queue(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a", demand={"gpu": 2}), pods("a", demand={"gpu": 2})])
    assert q.release("t1", pod_uid("t1"))
    # capacity is free again, but t2 waits ahead of a new pod of the same class
    newcomer = q.admit(pods("a"), 0.0)
    assert (newcomer.outcome, newcomer.waiting_for) == ("queued", "1 training pod(s) ahead in a")
    assert released(q) == ["t2"]


def test_inference_is_released_before_training(redis_client: redis.Redis,
                                               pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1},
                   a={"nominal": {"gpu": 4}}, b={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a", demand={"gpu": 1})])
    admit_all(q, [pods("a"), pods("b"), pods("b", "inference"), pods("a", "inference")])
    # inference counts training capacity as free: both inference pods went straight in
    assert [r.band for r in q.dispatch(100.0, 10)] == []
    assert q.ticket_status("t4", 0.0) is not None
    assert q.ticket_status("t4", 0.0).state == "reserved"  # type: ignore[union-attr]
    q.release("t1", pod_uid("t1"))
    q.release("t4", pod_uid("t4"))
    q.release("t5", pod_uid("t5"))
    assert released(q, limit=1) == ["t2"]


def test_training_waits_while_an_inference_pod_fits(redis_client: redis.Redis,
                                                    pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 4}},
                   b={"nominal": {"gpu": 4}}, c={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a", "inference", {"gpu": 2}), pods("a", "inference")])
    trainee = q.admit(pods("b"), 0.0)
    assert trainee.outcome == "queued"
    q.release("t1", pod_uid("t1"))  # the queued inference pod t2 now fits
    late = q.admit(pods("c"), 0.0)
    assert (late.outcome, late.waiting_for) == ("queued", "inference pods released first")
    assert released(q) == ["t2", "t3"]


def test_lowest_weighted_share_goes_first(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 6},
                   a={"weight": 1, "nominal": {"gpu": 6}}, b={"weight": 2, "nominal": {"gpu": 6}})
    blockers = admit_all(q, [pods("a", "inference", {"gpu": 6})])
    assert blockers[0].outcome == "reserved"
    reqs = [pods("a") for _ in range(6)] + [pods("b") for _ in range(6)]
    admit_all(q, reqs)
    q.release("t1", pod_uid("t1"))
    order = [r.tenant for r in q.dispatch(100.0, 6)]
    # shares (slices / weight) stay balanced 1:2
    assert order == ["a", "b", "b", "a", "b", "b"]


def test_gang_is_released_all_at_once_when_complete(redis_client: redis.Redis,
                                                    pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 3}, a={"nominal": {"gpu": 8}})
    first = q.admit(pods("a", group="g", size=3), 0.0)
    assert (first.outcome, first.position, first.waiting_for) == (
        "queued", None, "2 more pods of gang ns-a/g (1 of 3 pods created)")
    q.admit(pods("a", group="g", size=3), 0.0)
    assert released(q) == []
    last = q.admit(pods("a", group="g", size=3), 0.0)
    # the gang is one queue entry (first in line); its three pods are queued
    assert (last.outcome, last.position, last.queue_length) == ("queued", 1, 3)
    assert sorted(released(q)) == ["t1", "t2", "t3"]


def test_gang_waits_for_room_for_every_member(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 3}, a={"nominal": {"gpu": 8}})
    q.admit(pods("a", demand={"gpu": 2}), 0.0)
    admit_all(q, [pods("a", group="g", size=2), pods("a", group="g", size=2)])
    assert released(q) == []  # only one GPU free: no member may start alone
    q.release("t1", pod_uid("t1"))
    assert sorted(released(q)) == ["t2", "t3"]
    # a member that ends and is recreated completes its gang with the one running
    q.release("t2", pod_uid("t2"))
    again = q.admit(pods("a", group="g", size=2), 0.0)
    assert again.outcome == "queued"
    assert released(q) == ["t4"]


def test_mixed_class_gang_is_refused(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 3}, a={"nominal": {"gpu": 8}})
    q.admit(pods("a", group="g", size=2), 0.0)
    with pytest.raises(InvalidRequestError, match=r"same fairgate\.io/class"):
        q.admit(pods("a", "inference", group="g", size=2), 0.0)


def test_capacity_is_held_for_the_tenant_first_in_order(redis_client: redis.Redis,
                                                        pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 4},
                   big={"nominal": {"gpu": 4}}, small={"nominal": {"gpu": 4}})
    admit_all(q, [pods("small", at=0.0) for _ in range(4)])  # t1-t4 run
    large = q.admit(pods("big", demand={"gpu": 4}, at=1.0), 1.0)  # t5
    assert large.waiting_for == "4 x gpu of cluster capacity"
    admit_all(q, [pods("small", at=2.0) for _ in range(4)])  # t6-t9 queue
    # big (share 0, below its 2 GPUs of weighted share) is first in order: the freed
    # GPUs are held for it, small pods no longer take them
    q.release("t1", pod_uid("t1"), 3.0)
    assert released(q, now=3.0) == []
    status = q.ticket_status("t5", 3.0)
    assert status is not None and status.waiting_for == "capacity held for you: 1 of 4 GPUs"
    status = q.ticket_status("t6", 3.0)
    assert status is not None and status.waiting_for == (
        "gpu capacity held for big (ahead in fair-share order)")
    q.release("t2", pod_uid("t2"), 4.0)
    q.release("t3", pod_uid("t3"), 4.0)
    status = q.ticket_status("t5", 4.0)
    assert status is not None and status.waiting_for == "capacity held for you: 3 of 4 GPUs"
    q.release("t4", pod_uid("t4"), 5.0)
    assert released(q, now=5.0, limit=1) == ["t5"]


def test_no_capacity_is_held_for_a_tenant_at_its_weighted_share(redis_client: redis.Redis,
                                                                pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 4},
                   a={"nominal": {"gpu": 8}}, b={"nominal": {"gpu": 8}})
    admit_all(q, [pods("a", demand={"gpu": 2}, at=0.0)])  # t1: a holds its half
    admit_all(q, [pods("b", at=0.0) for _ in range(2)])  # t2, t3
    q.admit(pods("a", demand={"gpu": 4}, at=1.0), 1.0)  # t4 queues
    admit_all(q, [pods("b", at=2.0) for _ in range(2)])  # t5, t6 queue
    # a's share equals b's (2 GPUs each), and a's head is older: a is first in order,
    # but at its weighted share (4 GPUs / 2 tenants): nothing is held for it
    q.release("t2", pod_uid("t2"))
    assert released(q, now=3.0) == ["t5"]
    status = q.ticket_status("t4", 3.0)
    assert status is not None and status.waiting_for == "4 x gpu of cluster capacity"


# Without a half-life lib_order.lua's below_share decides from the tenant's ready-set score
# (slices in use / weight) times the summed weight; with weight 3.1 that product rounds
# to just below the capacity (14 / 3.1 * 6.2 < 28), so a tenant exactly at its share
# would read as below it without the rounding guard.
@pytest.mark.parametrize("weight", [1.0, 3.1])
def test_nothing_is_held_for_a_tenant_exactly_at_its_weighted_share(
        redis_client: redis.Redis, pods: Pods, weight: float) -> None:
    q = queue_with(redis_client, {"gpu": 4}, a={"nominal": {"gpu": 8}, "weight": weight},
                   b={"nominal": {"gpu": 8}, "weight": weight})
    admit_all(q, [pods("a", demand={"gpu": 2}, at=0.0),  # t1
                  pods("b", demand={"gpu": 2}, at=0.0)])  # t2
    q.admit(pods("a", demand={"gpu": 4}, at=1.0), 1.0)  # t3: the older head, first in order
    q.admit(pods("b", demand={"gpu": 4}, at=2.0), 2.0)  # t4
    # a holds exactly its weighted share (2 of 4 GPUs, equal weights): nothing is held
    assert q.holds(3.0) == []
    # below it (nothing running), the capacity its head needs is held for it
    q.release("t1", pod_uid("t1"))
    assert [(h.tenant, h.demand, h.held) for h in q.holds(4.0)] == [("a", {"gpu": 4}, {"gpu": 2})]


def test_ties_go_to_the_older_head_not_the_name(redis_client: redis.Redis,
                                                pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8},
                   a={"nominal": {"gpu": 8}}, b={"nominal": {"gpu": 8}})
    q.admit(pods("a", demand={"gpu": 8}, at=0.0), 0.0)  # t1 runs
    q.admit(pods("b", demand={"gpu": 8}, at=1.0), 1.0)  # t2: b's head, older
    q.admit(pods("a", demand={"gpu": 8}, at=2.0), 2.0)  # t3
    q.release("t1", pod_uid("t1"), 3.0)  # b waited since 1.0, a just ran: b goes first
    assert released(q, now=3.0) == ["t2"]
    q.release("t2", pod_uid("t2"), 4.0)
    assert released(q, now=4.0) == ["t3"]


def test_expire_frees_unconfirmed_reservations(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 2}})
    first, second = pods("a"), pods("a")
    admit_all(q, [first, second], now=10.0)
    assert seen(q, first) == "confirmed"
    assert q.confirm("nope", "uid-nope", "ns-a", "p9") == "unknown"
    assert q.expire(39.0) == []
    assert q.expire(40.0) == ["t2"]
    assert [t.used for t in q.tenant_status()] == [{"gpu": 1}]
    assert q.ticket_status("t2", 41.0) is None


def as_before_buckets(client: redis.Redis) -> None:
    """Rewrite the unseen tickets as a version before buckets kept them: one sorted set
    ``resv``, member = the ticket (``rv:<b>`` packs a uuid: byte 255 and its 16 bytes)."""
    for key in list(client.scan_iter("fairgate:rv:*")):
        for member, score in client.zrange(key, 0, -1, withscores=True):
            ticket = str(uuid.UUID(bytes=member[1:])) if member[:1] == b"\xff" else member
            client.zadd("fairgate:resv", {ticket: score})
        client.delete(key)
    client.delete("fairgate:rv")


def test_unseen_tickets_of_a_redis_written_before_buckets_still_expire(
        redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 8}})
    made = [dataclasses.replace(pods("a"), ticket=str(uuid.UUID(int=n + 1)))
            for n in range(5)]
    running, started, queued, confirmed, deleted = made
    assert [a.outcome for a in admit_all(q, made, now=10.0)] == ["reserved"] + ["queued"] * 4
    as_before_buckets(redis_client)
    assert redis_client.zcard("fairgate:resv") == 5
    assert seen(q, confirmed) == "confirmed"  # seen since: never expires
    assert q.remove(deleted.ticket, pod_uid(deleted.ticket))  # forgotten since
    q.release(running.ticket, pod_uid(running.ticket), 20.0)
    assert released(q, now=20.0, limit=1) == [started.ticket]  # a new time: 20 s
    assert q.expire(39.0) == []
    assert q.expire(40.0) == [queued.ticket]
    assert not redis_client.exists("fairgate:resv")
    assert q.expire(49.0) == []
    assert q.expire(50.0) == [started.ticket]
    assert [r.ticket for r in q.dispatch(60.0, 10)] == [confirmed.ticket]
    assert q.expire(1000.0) == []


def uuid_pods(pods: Pods, tenant: str, count: int, **kw: Any) -> list[PodRequest]:
    """``count`` of ``pods(tenant, **kw)`` with uuid tickets, as fairgate mints them."""
    made = [pods(tenant, **kw) for _ in range(count)]
    return [dataclasses.replace(r, ticket=str(uuid.UUID(int=pods.n * 100 + i)))
            for i, r in enumerate(made)]


def test_queued_uuid_tickets_are_stored_compactly(redis_client: redis.Redis,
                                                  pods: Pods) -> None:
    """Lanes and unseen-ticket buckets hold a uuid ticket in 17 bytes; the tenant state,
    which remembers each lane head, and the buckets stay listpack-encoded."""
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 8}})
    made = [r for gpus in (1, 2, 4) for r in uuid_pods(pods, "a", 5, demand={"gpu": gpus})]
    assert [a.outcome for a in admit_all(q, made)] == ["reserved"] + ["queued"] * 14
    entries = [e for key in redis_client.scan_iter("fairgate:q:*")
               for e in redis_client.lrange(key, 0, -1)]
    assert len(entries) == 14 and all(len(e) == 17 and e[0] == 0xFF for e in entries)
    assert redis_client.object("encoding", "fairgate:ts:a") == b"listpack"
    buckets = list(redis_client.scan_iter("fairgate:rv:*"))
    assert sum(redis_client.zcard(b) for b in buckets) == 15
    assert {redis_client.object("encoding", b) for b in buckets} == {b"listpack"}
    assert sorted(e for key in redis_client.scan_iter("fairgate:q:*")
                  for e in q.lane_entries("a", text(key).split(":", 3)[3], 0, -1)) \
        == sorted(r.ticket for r in made[1:])


def test_unseen_tickets_spread_over_buckets_whatever_their_uuids(
        redis_client: redis.Redis, pods: Pods) -> None:
    """Buckets come from sha1, not from a uuid's bytes: uuids that differ only in a
    counter (bench/wrk/review.lua's; a time-ordered uuid's clock) still spread, so every
    bucket stays a small listpack."""
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 8}})
    made = [dataclasses.replace(pods("a"), ticket=f"0badcafe-0000-4000-8000-{n:012x}")
            for n in range(400)]
    admit_all(q, made)
    buckets = list(redis_client.scan_iter("fairgate:rv:*"))
    assert sum(redis_client.zcard(b) for b in buckets) == 400 and len(buckets) > 300
    assert {redis_client.object("encoding", b) for b in buckets} == {b"listpack"}


def index_entries(client: redis.Redis, index: str) -> int:
    """How many entries the buckets ``<index>:<b>`` of a bucket index hold."""
    count = client.hlen if index == "nm" else client.zcard
    return sum(count(key) for key in client.scan_iter(f"fairgate:{index}:*"))


def test_bucket_indexes_grow_and_every_pod_is_still_found_and_expires(
        redis_client: redis.Redis, pods: Pods) -> None:
    """The name index and the unseen tickets split a bucket each time their entries pass
    the load a bucket (here: a count set as if 10 million pods were known), so a bucket
    stays a small listpack at any number of pods; entries moved by a split are still
    found by name and still expire, and a rebuild starts the indexes again."""
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 8}})
    before = uuid_pods(pods, "a", 1500)
    admit_all(q, before, now=10.0)
    assert redis_client.hget("fairgate:ix", "nm:c") == b"1500"
    assert redis_client.hget("fairgate:ix", "nm:n") is None  # 2048 buckets: no split yet
    redis_client.hset("fairgate:ix", mapping={"nm:c": 10**7, "rv:c": 10**7})
    after = uuid_pods(pods, "a", 1500)
    admit_all(q, after, now=20.0)
    # every admission added an entry to each index, and each addition split a bucket
    assert redis_client.hget("fairgate:ix", "nm:n") == b"3548"
    assert redis_client.hget("fairgate:ix", "rv:n") == b"3548"
    assert index_entries(redis_client, "nm") == index_entries(redis_client, "rv") == 3000
    assert max(int(text(k).rsplit(":", 1)[1])
               for k in redis_client.scan_iter("fairgate:rv:*")) >= 2048  # moved there
    for req in before + after:
        assert q.find(req.namespace, req.name) == req.ticket
    assert seen(q, before[0]) == "confirmed"  # seen: it no longer expires
    assert redis_client.hget("fairgate:ix", "rv:c") == str(10**7 + 1500 - 1).encode()
    assert sorted(q.expire(40.0)) == sorted(r.ticket for r in before[1:])
    assert sorted(q.expire(50.0)) == sorted(r.ticket for r in after)
    assert index_entries(redis_client, "rv") == 0
    assert q.find(before[0].namespace, before[0].name) == before[0].ticket
    q.rebuild([], [])
    assert redis_client.hmget("fairgate:ix", "nm:n", "rv:n") == [None, None]
    assert index_entries(redis_client, "nm") == 0


def as_before_packing(client: redis.Redis) -> None:
    """Rewrite lanes and the lane heads the tenant states remember (``rk:``) as a version
    before packed entries wrote them: uuid tickets as text."""
    for key in list(client.scan_iter("fairgate:q:*")):
        entries = [lane_entry(v) for v in client.lrange(key, 0, -1)]
        client.delete(key)
        client.rpush(key, *entries)
    for key in list(client.scan_iter("fairgate:ts:*")):
        for field, value in client.hgetall(key).items():
            if field.startswith(b"rk:") and len(value) == 49:
                client.hset(key, field, value[:32] + lane_entry(value[32:]).encode())


def test_lanes_written_before_packing_answer_the_same(redis_client: redis.Redis,
                                                      pods: Pods) -> None:
    first = uuid_pods(pods, "a", 1, demand={"gpu": 2})
    made = uuid_pods(pods, "a", 4) + uuid_pods(pods, "b", 3, demand={"gpu": 2})
    unseen = uuid_pods(pods, "a", 1)  # its pod never seen: it expires after its release
    answers = []
    for before_packing in (False, True):
        redis_client.flushdb()
        q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 4}},
                       b={"nominal": {"gpu": 4}})
        admit_seen(q, first + made)
        q.admit(unseen[0], 1.0)
        if before_packing:
            as_before_packing(redis_client)
            assert redis_client.lindex("fairgate:q:a:t/gpu=1", 0) == made[0].ticket.encode()
        got: list[object] = [q.lane_entries("a", "t/gpu=1", 0, -1), q.holds(0.0)]
        got += [q.ticket_statuses([r.ticket for r in made], 0.0)]
        assert q.remove(made[1].ticket, pod_uid(made[1].ticket))
        assert q.remove(made[5].ticket, pod_uid(made[5].ticket))
        got += [q.lane_entries("a", "t/gpu=1", 0, -1), q.lane_entries("b", "t/gpu=2", 0, -1)]
        got += [q.ticket_statuses([r.ticket for r in made], 0.0)]
        order: list[list[str]] = []
        running = [first[0].ticket]
        for step in range(6):
            for ticket in running:
                if ticket != unseen[0].ticket:  # never seen: it does not end, it expires
                    q.release(ticket, pod_uid(ticket), 10.0 + step)
            running = [r.ticket for r in q.dispatch(10.0 + step, 10)]
            order.append(running)
        got += [order, q.expire(1000.0), q.expire(2000.0)]
        answers.append(got)
    assert answers[0] == answers[1]
    assert sorted(t for step in answers[0][-3] for t in step) \
        == sorted(r.ticket for r in made + unseen if r not in (made[1], made[5]))
    assert answers[0][-2:] == [[unseen[0].ticket], []]


def test_requeue_puts_a_ticket_back_at_the_head(redis_client: redis.Redis,
                                                pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a"), pods("a"), pods("a")])
    q.release("t1", pod_uid("t1"))
    assert released(q, limit=1) == ["t2"]
    assert q.requeue("t2")
    assert not q.requeue("t3")  # queued, not released
    status = q.ticket_status("t2", 0.0)
    assert status is not None and (status.state, status.position) == ("queued", 1)
    assert released(q, limit=1) == ["t2"]


def test_release_and_remove_are_idempotent(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a"), pods("a")])
    assert not q.remove("t1", pod_uid("t1"))  # running: remove only drops queued pods
    assert q.remove("t2", pod_uid("t2")) and not q.remove("t2", pod_uid("t2"))
    assert q.release("t1", pod_uid("t1")) and not q.release("t1", pod_uid("t1"))
    (status,) = q.tenant_status()
    assert (status.used_slices, status.queued) == (0, {"inference": 0, "training": 0})


def dump_all(client: redis.Redis) -> dict[bytes, tuple[object, object, int]]:
    """Every key with its type, full content and TTL. (Raw DUMP bytes are not
    comparable: Redis rehashes large hashes and sets incrementally, even on reads and
    in the background, which reorders their serialization without changing them.)"""
    snapshot: dict[bytes, tuple[object, object, int]] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        content: object
        if kind == b"hash":
            content = sorted(client.hgetall(key).items())
        elif kind == b"set":
            content = sorted(client.smembers(key))
        elif kind == b"zset":
            content = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            content = client.lrange(key, 0, -1)
        else:
            content = client.dump(key)
        snapshot[key] = (kind, content, client.pttl(key))
    return snapshot


def test_same_ticket_twice_and_dry_run_change_nothing(redis_client: redis.Redis,
                                                      pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}})
    first = q.admit(pods("a"), 0.0)
    before = dump_all(redis_client)
    again = q.admit(PodRequest("t1", "a", "ns-a", "p1", "training", {"gpu": 1}), 5.0)
    assert again == Admission(**{**first.__dict__, "duplicate": True})
    dry = q.admit(pods("a"), 5.0, dry_run=True)
    assert (dry.outcome, dry.position, dry.waiting_for) == (
        "queued", 1, "1 x gpu of cluster capacity")
    assert dump_all(redis_client) == before
    real = q.admit(PodRequest("t2", "a", "ns-a", "p2", "training", {"gpu": 1}), 5.0)
    assert real.outcome == dry.outcome and real.band == dry.band


def test_a_copied_ticket_is_refused_and_changes_nothing(redis_client: redis.Redis,
                                                        pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}},
                   b={"nominal": {"gpu": 4}})
    running, queued = pods("a"), pods("a")
    assert [q.admit(r, 0.0).outcome for r in (running, queued)] == ["reserved", "queued"]
    generated = dataclasses.replace(pods("a"), name="train-*")  # generateName, no name yet
    assert q.admit(generated, 0.0).outcome == "queued"
    # reinvocations of the same CREATE (not confirmed yet): the same answer
    for req in (running, queued, generated):
        assert q.admit(req, 1.0).duplicate
    assert seen(q, running) == "confirmed"  # running's pod exists now
    before = dump_all(redis_client)
    copies = [
        (running, "running"),  # its YAML applied again (deleted, release not in yet)
        (dataclasses.replace(running, name="copy"), "running"),
        (dataclasses.replace(queued, name="copy"), "queued"),
        (dataclasses.replace(queued, namespace="ns-other"), "queued"),
        (dataclasses.replace(generated, name="train-x7k2p"), "queued"),  # the created pod's
        (dataclasses.replace(queued, tenant="b"), "queued"),
        (dataclasses.replace(queued, pod_class="inference"), "queued"),
        (dataclasses.replace(queued, demand={"gpu": 2}), "queued"),
    ]
    owners = {r.ticket: r for r in (running, queued, generated)}
    for copy, state in copies:
        for dry_run in (False, True):
            with pytest.raises(TicketConflictError, match="remove them") as error:
                q.admit(copy, 2.0, dry_run=dry_run)
            owner = owners[copy.ticket]
            assert (error.value.ticket, error.value.state, error.value.namespace,
                    error.value.name) == (owner.ticket, state, owner.namespace, owner.name)
    assert dump_all(redis_client) == before


def test_find_a_ticket_by_pod_name(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}})
    uid = "0f8e9d6c-1a2b-4c3d-8e9f-a0b1c2d3e4f5"
    reserved = dataclasses.replace(pods("a"), ticket=uid)
    queued, expiring = pods("a"), pods("a")
    assert q.admit(reserved, 0.0).outcome == "reserved"
    assert q.admit(queued, 0.0).outcome == "queued"
    assert q.find("ns-a", reserved.name) == uid
    assert q.find("ns-a", queued.name) == queued.ticket
    assert q.find("ns-b", queued.name) is None and q.find("ns-a", "nope") is None
    seen(q, reserved)
    q.release(uid, pod_uid(uid))
    assert q.find("ns-a", reserved.name) is None
    assert released(q) == [queued.ticket]
    assert q.find("ns-a", queued.name) == queued.ticket  # running now
    q.requeue(queued.ticket)
    assert q.find("ns-a", queued.name) == queued.ticket
    assert q.remove(queued.ticket, pod_uid(queued.ticket))
    assert q.find("ns-a", queued.name) is None
    assert q.admit(expiring, 5.0).outcome == "reserved"
    assert q.expire(5.0 + q.reservation_ttl) == [expiring.ticket]
    assert q.find("ns-a", expiring.name) is None
    # a rebuild indexes the listed pods under their own names
    generated = dataclasses.replace(pods("a"), name="train-*")
    q.admit(generated, 50.0)
    assert q.find("ns-a", "train-*") == generated.ticket
    pod = RunningPod(generated.ticket, "a", "ns-a", "train-x7k2p", "training", "training",
                     {"gpu": 1}, pod_uid(generated.ticket))
    q.rebuild([pod], [GatedPod(queued, "training", pod_uid(queued.ticket))], listed_at=100.0)
    assert q.find("ns-a", "train-*") is None
    assert q.find("ns-a", "train-x7k2p") == generated.ticket
    assert q.find("ns-a", queued.name) == queued.ticket
    # the same name for a new pod while the old ticket's release is not in yet
    again = dataclasses.replace(pods("a"), name=queued.name)
    q.admit(again, 60.0)
    q.release(queued.ticket, pod_uid(queued.ticket))
    assert q.find("ns-a", queued.name) == again.ticket


def test_unknown_tenant_and_bad_requests_are_refused(redis_client: redis.Redis,
                                                     pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 4}})
    with pytest.raises(UnknownTenantError, match="sync_config"):
        q.admit(pods("nobody"), 0.0)
    with pytest.raises(InvalidRequestError, match="demand is empty"):
        PodRequest("t", "a", "ns", "p", "training", {})
    with pytest.raises(InvalidRequestError, match="ticket"):
        PodRequest("bad ticket", "a", "ns", "p", "training", {"gpu": 1})
    with pytest.raises(InvalidRequestError, match="unknown resource"):
        PodRequest("t", "a", "ns", "p", "training", {"nvidia.com/gpu": 1})


def test_lowering_quota_evicts_nothing(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    admit_all(q, [pods("a") for _ in range(4)])
    q.sync_config(config(a={"nominal": {"gpu": 1}}), {"gpu": 8})
    (status,) = q.tenant_status()
    assert status.used == {"gpu": 4} and status.nominal == {"gpu": 1}
    waiting = q.admit(pods("a"), 0.0)
    assert waiting.waiting_for == "4.00 GPU-eq of tenant quota"
    for ticket in ("t1", "t2", "t3", "t4"):
        q.release(ticket, pod_uid(ticket))
    assert released(q) == ["t5"]


def test_sync_without_capacity_keeps_the_stored_capacity(redis_client: redis.Redis,
                                                         pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 4}})
    # the webhook pushes config without knowing the nodes: the dispatcher's capacity stays
    q.sync_config(config(a={"nominal": {"gpu": 4}}, b={"nominal": {"gpu": 1}}), None)
    assert redis_client.hgetall("fairgate:cap") == {b"gpu": b"2"}
    assert [s.tenant for s in q.tenant_status()] == ["a", "b"]
    assert [q.admit(pods("a"), 0.0).outcome for _ in range(3)] == ["reserved", "reserved",
                                                                   "queued"]
    # an explicit capacity, even an empty one, still replaces it
    q.sync_config(config(a={"nominal": {"gpu": 4}}), {})
    assert redis_client.hgetall("fairgate:cap") == {}


def test_status_snapshots(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2},
                   a={"weight": 2, "nominal": {"gpu": 2}, "borrow": 1, "reserve": 1},
                   b={"nominal": {"mig-1g.5gb": 7}})
    admit_all(q, [pods("a", "inference"), pods("a"), pods("a")])
    a, b = q.tenant_status()
    assert (a.tenant, a.weight, a.nominal_slices, a.borrow_limit_slices,
            a.inference_reserve_slices) == ("a", 2.0, 14, 7, 7)
    assert (a.inference_slices, a.training_slices, a.borrowed_slices, a.used_slices) == (
        7, 7, 0, 14)
    assert a.queued == {"inference": 0, "training": 1}
    assert a.weighted_share == 7.0
    assert (b.tenant, b.used_slices, b.nominal) == ("b", 0, {"mig-1g.5gb": 7})
    why = q.ticket_status("t3", 9.0)
    assert why is not None
    assert (why.state, why.band, why.position, why.queue_length, why.submitted_at) == (
        "queued", "borrowed", 1, 1, 3.0)
    assert why.waiting_for == "1 x gpu of cluster capacity"
    q.release("t1", pod_uid("t1"))
    (rel,) = q.dispatch(12.0)
    assert (rel.ticket, rel.band, rel.waited_seconds, rel.namespace) == (
        "t3", "borrowed", 9.0, "ns-a")
    running = q.ticket_status("t3", 13.0)
    assert running is not None and (running.state, running.released_at) == ("running", 12.0)


def test_rebuild_restores_order_and_usage(redis_client: redis.Redis, pods: Pods) -> None:
    tenants: dict[str, dict[str, Any]] = {
        "a": {"weight": 1, "nominal": {"gpu": 4, "mig-1g.5gb": 7}, "borrow": 2},
        "b": {"weight": 3, "nominal": {"gpu": 4}},
    }
    q = FairQueue(redis_client)
    q.sync_config(config(**tenants), {"gpu": 4, "mig-1g.5gb": 2})
    reqs = [
        pods("a"), pods("b", "inference", {"gpu": 2}), pods("a", demand={"mig-1g.5gb": 1}),
        pods("a"), pods("b"), pods("a", group="g", size=2), pods("b", "inference"),
        pods("a", demand={"mig-1g.5gb": 2}), pods("a", group="g", size=2), pods("a"),
        pods("b"), pods("a", "inference", {"mig-1g.5gb": 1}), pods("a", group="h", size=3),
    ]
    answers = {}
    for r in reqs:  # each pod is created (and seen by the dispatcher) before the next
        answers[r.ticket] = q.admit(r, r.submitted_at)
        assert seen(q, r) == "confirmed"
    released(q, limit=1)
    by_ticket = {r.ticket: r for r in reqs}

    def snapshot(queue: FairQueue) -> tuple[tuple[object, ...], tuple[object, ...]]:
        statuses = {t: queue.ticket_status(t, 50.0) for t in by_ticket}
        return tuple(queue.tenant_status()), tuple(sorted(
            (t, s.state, s.band, s.position, s.queue_length, s.waiting_for)
            for t, s in statuses.items() if s is not None))

    running, gated = [], []
    for ticket, req in by_ticket.items():
        status = q.ticket_status(ticket, 50.0)
        assert status is not None
        if status.state in ("running", "reserved"):
            running.append(RunningPod(ticket, req.tenant, req.namespace, req.name,
                                      req.pod_class, status.band, req.demand,
                                      pod_uid(ticket), req.group, req.group_size))
        else:
            gated.append(GatedPod(req, answers[ticket].band, pod_uid(ticket)))

    def carry_on(queue: FairQueue) -> list[str]:
        """Pods end one by one; what is released after each."""
        order: list[str] = []
        for pod in running:
            queue.release(pod.ticket, pod_uid(pod.ticket))
            order += ["|"] + [r.ticket for r in queue.dispatch(60.0, 100)]
        return order

    before = snapshot(q)
    assert len(before[1]) == len(reqs)
    expected = carry_on(q)
    redis_client.flushall()
    fresh = FairQueue(redis_client)
    fresh.sync_config(config(**tenants), {"gpu": 4, "mig-1g.5gb": 2})
    fresh.rebuild(running, reversed(gated), listed_at=50.0)  # a flushed Redis keeps nothing
    assert snapshot(fresh) == before
    assert carry_on(fresh) == expected
    assert len([t for t in expected if t != "|"]) >= 5


def test_rebuild_keeps_reservations_made_after_the_listing(redis_client: redis.Redis,
                                                           pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 2}})
    old = pods("a")
    assert q.admit(old, 0.0).outcome == "reserved"  # never confirmed: its pod was refused
    listed_at = 100.0  # the reconciler lists the pods: none exists yet
    late = pods("a")
    assert q.admit(late, 101.0).outcome == "reserved"  # the webhook, after the listing
    q.rebuild([], [], listed_at=listed_at)
    (status,) = q.tenant_status()
    assert status.used == {"gpu": 1}  # the late reservation still counts, the old is gone
    assert q.ticket_status(old.ticket, 102.0) is None
    assert q.admit(pods("a"), 102.0).outcome == "reserved"
    assert q.admit(pods("a"), 102.0).waiting_for == "1.00 GPU-eq of tenant quota"
    # a kept reservation still expires when no pod confirms it
    assert late.ticket in q.expire(101.0 + q.reservation_ttl)


def test_rebuild_drops_a_riders_ticket_even_in_flight(redis_client: redis.Redis,
                                                      pods: Pods) -> None:
    """Two pods share one 3-GPU claim: the first was released moments ago (in flight for
    the rebuild), the list shows the second paying and the first riding. In the same
    atomic rebuild the rider's ticket goes: at no moment are 6 GPUs charged for 3."""
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    first, second = pods("a", demand={"gpu": 3}), pods("a", demand={"gpu": 3})
    assert q.admit(first, 10.0).outcome == "reserved"
    payer = RunningPod(second.ticket, "a", second.namespace, second.name, "training",
                       "training", {"gpu": 3}, pod_uid(second.ticket))
    q.rebuild([payer], [], listed_at=10.0, riders=[first.ticket])
    assert q.tenant_status()[0].used == {"gpu": 3}
    assert q.ticket_status(first.ticket, 11.0) is None
    status = q.ticket_status(second.ticket, 11.0)
    assert status is not None and status.state == "running"
    # without riders the in-flight reservation is kept, as for any pod the list missed
    q.rebuild([payer], [], listed_at=10.0)
    assert q.tenant_status()[0].used == {"gpu": 3}  # first's ticket is gone for good
    third = pods("a", demand={"gpu": 1})
    assert q.admit(third, 11.0).outcome == "reserved"
    q.rebuild([payer], [], listed_at=11.0)
    assert q.tenant_status()[0].used == {"gpu": 4}


def test_rebuild_confirms_a_kept_reservation_whose_pod_is_listed(redis_client: redis.Redis,
                                                                  pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 2}})
    req = pods("a")
    assert q.admit(req, 100.0).outcome == "reserved"
    pod = RunningPod(req.ticket, "a", req.namespace, req.name, "training", "training",
                     {"gpu": 1}, pod_uid(req.ticket))
    q.rebuild([pod], [], listed_at=100.0)  # the pod exists; its confirm is not in yet
    assert q.expire(100.0 + 2 * q.reservation_ttl) == []
    status = q.ticket_status(req.ticket, 200.0)
    assert status is not None and status.state == "running"
    assert q.tenant_status()[0].used == {"gpu": 1}


def test_rebuild_does_not_queue_again_a_pod_dispatched_after_the_listing(
        redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 1}, a={"nominal": {"gpu": 2}})
    first, second = pods("a"), pods("a")
    assert q.admit(first, 0.0).outcome == "reserved"
    assert q.admit(second, 0.0).outcome == "queued"
    seen(q, first)
    running = [RunningPod(first.ticket, "a", first.namespace, first.name, "training",
                          "training", {"gpu": 1}, pod_uid(first.ticket))]
    listed_at = 200.0  # second is gated in the list
    gated = [GatedPod(second, "training", pod_uid(second.ticket))]
    q.release(first.ticket, pod_uid(first.ticket))  # first ended after the listing
    assert released(q, now=201.0) == [second.ticket]  # another dispatcher releases second
    q.rebuild(running, gated, listed_at=listed_at)
    status = q.ticket_status(second.ticket, 202.0)
    assert status is not None and status.state == "running"
    assert q.tenant_status()[0].queued == {"inference": 0, "training": 0}
    assert released(q, now=203.0) == []  # not released a second time
    assert q.tenant_status()[0].used == {"gpu": 2}  # the stale list brings first back
    # a later rebuild from a current list drops the ended pod, keeps the dispatched one
    q.rebuild([], [], listed_at=202.0)
    assert q.tenant_status()[0].used == {"gpu": 1}
    # once older than the reservation TTL only the list counts
    q.rebuild([], [], listed_at=201.0 + q.reservation_ttl)
    assert q.tenant_status()[0].used == {}


def test_lower_bands_count_as_free_capacity(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 2},
                   a={"nominal": {"gpu": 1}, "borrow": 1}, b={"nominal": {"gpu": 2}})
    got = admit_all(q, [pods("a"), pods("a")])
    assert [(a.outcome, a.band) for a in got] == [("reserved", "training"),
                                                  ("reserved", "borrowed")]
    # the cluster is full, but b's training may take the borrowed GPU (preemption)
    assert q.admit(pods("b"), 0.0).outcome == "reserved"
    assert q.admit(pods("b"), 0.0).waiting_for == "1 x gpu of cluster capacity"
    # a borrowed pod never counts a higher band as free
    q.release("t2", pod_uid("t2"))
    assert q.admit(pods("a"), 0.0).waiting_for == "1 x gpu of cluster capacity"


def test_training_band_goes_before_borrowed_pods(redis_client: redis.Redis,
                                                 pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 3}, a={"weight": 100, "nominal": {"gpu": 1},
                                                 "borrow": 1},
                   b={"weight": 1, "nominal": {"gpu": 3}})
    admit_all(q, [pods("a"), pods("b"), pods("b")])
    borrower = q.admit(pods("a"), 0.0)
    assert (borrower.band, borrower.waiting_for) == ("borrowed", "1 x gpu of cluster capacity")
    q.admit(pods("b"), 0.0)
    q.release("t2", pod_uid("t2"))
    # a's share is far lower, but its borrowed pod would be preempted at once by b's
    assert released(q) == ["t5"]
    status = q.ticket_status("t4", 1.0)
    assert status is not None and status.waiting_for == "1 x gpu of cluster capacity"


def test_wait_for_rebuild_reserves_nothing_until_usage_is_restored(
        redis_client: redis.Redis, pods: Pods) -> None:
    q = FairQueue(redis_client, wait_for_rebuild=True)
    q.sync_config(config(a={"nominal": {"gpu": 2}}), {"gpu": 8})
    # Redis is empty (fresh, or restarted): two pods of a may already run in the cluster
    gated = pods("a")
    first = q.admit(gated, 0.0)
    assert (first.outcome, first.waiting_for) == (
        "queued", "the dispatcher to restore usage from the cluster (Redis lost its data)")
    running = [RunningPod("old1", "a", "ns-a", "o1", "training", "training", {"gpu": 1},
                          pod_uid("old1")),
               RunningPod("old2", "a", "ns-a", "o2", "training", "training", {"gpu": 1},
                          pod_uid("old2"))]
    q.rebuild(running, [GatedPod(gated, first.band, pod_uid(gated.ticket))])
    assert q.admit(pods("a"), 0.0).waiting_for == "1.00 GPU-eq of tenant quota"
    q.release("old1", pod_uid("old1"))
    assert released(q) == ["t1"]
    q.release("old2", pod_uid("old2"))
    assert released(q) == ["t2"]
    q.release("t1", pod_uid("t1"))
    assert q.admit(pods("a"), 0.0).outcome == "reserved"  # usage is known again


def test_tied_tenants_go_in_order_of_their_heads_creation(redis_client: redis.Redis,
                                                          pods: Pods) -> None:
    """Tenants tied on the score are ordered by their lane heads' submitted_at (then
    admission order) as the ready sets store them: negative, fractional, microsecond
    apart and far-future times all sort numerically, whatever the names or the order of
    admission; a requeued pod keeps its place by its own creation time."""
    q = queue_with(redis_client, {"gpu": 1},
                   **{name: {"nominal": {"gpu": 1}} for name in ("a", "b", "c", "d", "e", "f")})
    admit_all(q, [pods("f", at=-100.0)])  # t1 runs: the cluster is full
    submitted = {"a": 1e9, "b": 1.000001, "c": -3.5, "d": 1.0, "e": 0.0}
    admitted = admit_all(q, [pods(tenant, at=at) for tenant, at in submitted.items()])
    assert all(a.outcome == "queued" for a in admitted)  # t2-t6
    ticket = {tenant: f"t{i}" for i, tenant in enumerate(submitted, start=2)}
    order = []
    running = "t1"
    for step in range(5):
        q.release(running, pod_uid(running))
        got = released(q, now=10.0 + step, limit=1)
        assert len(got) == 1
        order.append(got[0])
        running = got[0]
        if step == 0:  # the first one cannot start after all: back to its lane's head
            assert q.requeue(running, now=10.0)
            assert released(q, now=10.5, limit=1) == [running]
    assert order == [ticket[t] for t in sorted(submitted, key=submitted.__getitem__)]


def _generated(prefix: str, suffix: str = "x7k2p") -> str:
    """The name the API server gives a pod with ``generateName: prefix``."""
    return prefix[:58] + suffix


@pytest.mark.parametrize("length", [1, 5, 46, 57, 58, 59, 63, 64, 120, 253])
def test_a_long_generate_name_is_confirmed_as_the_api_server_names_the_pod(
    redis_client: redis.Redis, length: int
) -> None:
    """A Deployment of 47+ characters gives its pods a generateName past 58: the API
    server cuts it there. The pod's real name confirms its ticket (it is counted); a
    name that is not that prefix plus exactly 5 characters is another pod's."""
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    prefix = ("d" * length)[: length - 1] + "-"
    admitted = admitted_name("", prefix)
    assert admitted == prefix[:58] + "*"
    req = PodRequest(f"t{length}", "a", "ns-a", admitted, "training", {"gpu": 1})
    assert q.admit(req, 0.0).outcome == "reserved"
    for other in (_generated(prefix, "x7k2"), _generated(prefix, "x7k2pq"),
                  "e" + _generated(prefix)[1:]):
        assert q.confirm(req.ticket, "uid-other", "ns-a", other) == "conflict"
    assert seen(q, req, _generated(prefix)) == "confirmed"
    # confirmed: the reservation no longer expires, whatever the TTL
    assert q.expire(10**6) == []
    assert q.tenant_status()[0].used_slices == 7


def test_a_ticket_is_claimed_by_the_first_pod_validated_with_it_and_by_no_other(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """Copies of one ticket created at once all look like the same admission to the
    mutating webhook (nothing is stored yet); validation sees each pod's uid before it is
    stored, and only the first may present the ticket."""
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    req = dataclasses.replace(pods("a"), name="train-*")
    assert q.admit(req, 0.0).outcome == "reserved"
    for _ in range(8):  # reinvocations, or copies racing the first pod's creation
        assert q.admit(req, 0.5).duplicate
    assert q.bind(req.ticket, "uid-dry", "ns-a", "train-aaaaa", dry_run=True)  # no claim
    assert q.bind(req.ticket, "uid-1", "ns-a", "train-x7k2p")
    assert q.bind(req.ticket, "uid-1", "ns-a", "train-x7k2p")  # validation retried
    for uid, name in [("uid-2", "train-b8m3q"), ("uid-3", "train-x7k2p"),
                      ("uid-dry", "train-aaaaa")]:
        with pytest.raises(TicketConflictError, match="train-x7k2p"):
            q.bind(req.ticket, uid, "ns-a", name)
    # the claimed ticket: no later copy is the same admission, no other uid confirms it
    with pytest.raises(TicketConflictError):
        q.admit(req, 1.0)
    assert q.confirm(req.ticket, "uid-2", "ns-a", "train-x7k2p") == "conflict"
    assert q.confirm(req.ticket, "uid-1", "ns-a", "train-x7k2p") == "confirmed"
    assert q.tenant_status()[0].used_slices == 7
    assert not q.bind("never-admitted", "uid-4", "ns-a", "p")  # unknown: the caller decides


def test_a_presented_ticket_is_accepted_only_when_the_queue_minted_it(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """A pod carrying its ticket on CREATE is a reinvocation only if the queue holds that
    ticket's admission; a ticket chosen by hand, or left by an admission that ended, is
    refused and reserves nothing, copies at once included."""
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    minted = pods("a")
    assert q.admit(minted, 0.0).outcome == "reserved"
    assert q.admit(minted, 0.5, presented=True).duplicate  # the reinvocation
    before = dump_all(redis_client)
    chosen = pods("a")
    for _ in range(8):
        with pytest.raises(UnmintedTicketError, match=chosen.ticket):
            q.admit(chosen, 1.0, presented=True)
    assert dump_all(redis_client) == before
    assert q.admit(chosen, 1.0, presented=True, dry_run=True).outcome == "reserved"
    assert dump_all(redis_client) == before
    assert seen(q, minted) == "confirmed"
    assert q.release(minted.ticket, pod_uid(minted.ticket), 2.0)
    with pytest.raises(UnmintedTicketError):  # the ended admission's ticket, copied
        q.admit(dataclasses.replace(minted, name="copy"), 2.0, presented=True)
    assert q.tenant_status()[0].used_slices == 0


def test_a_claimed_but_never_stored_pod_still_frees_its_reservation(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """A later admission step (ResourceQuota) may refuse a pod after fairgate validated
    it: the claim alone keeps nothing for ever."""
    q = queue_with(redis_client, {"gpu": 8}, a={"nominal": {"gpu": 4}})
    req = pods("a")
    assert q.admit(req, 0.0).outcome == "reserved"
    assert q.bind(req.ticket, "uid-1", req.namespace, req.name)
    assert q.expire(q.reservation_ttl + 1) == [req.ticket]
    assert q.tenant_status()[0].used_slices == 0


def test_a_dispatch_may_fit_entries_against_grown_pools_in_queue_order(
    redis_client: redis.Redis, pods: Pods
) -> None:
    q = queue_with(redis_client, {"gpu": 2}, a={"nominal": {"gpu": 8}},
                   b={"nominal": {"gpu": 8}})
    admit_seen(q, [pods("a", demand={"gpu": 2})])  # runs: the cluster is full
    waiting = admit_seen(q, [pods("a", demand={"gpu": 2}), pods("b", demand={"gpu": 2}),
                             pods("b", demand={"gpu": 2})])
    assert [w.outcome for w in waiting] == ["queued"] * 3
    assert q.dispatch(10.0, 10) == []
    # pools that may grow to 6 GPUs: b (nothing running) first, then a; then the maximum
    grown = q.dispatch(10.0, 10, {"gpu": 6})
    assert [(r.tenant, r.name) for r in grown] == [("b", "p3"), ("a", "p2")]
    # the stored capacity (what fair shares use) is unchanged, and now over-used
    assert q.snapshot().capacity == {"gpu": 2}
    assert q.dispatch(10.0, 10) == [] and q.dispatch(10.0, 10, {"gpu": 6}) == []
    # at most `limit` heads, as any dispatch
    assert [r.name for r in q.dispatch(10.0, 1, {"gpu": 8})] == ["p4"]


def test_borrowed_pods_leave_an_unused_inference_reserve_free(
        redis_client: redis.Redis, pods: Pods) -> None:
    """With fairShare.lendInferenceReserve false, another tenant's borrowed training
    never takes the GPUs of an inferenceReserve while no inference pod uses them, so an
    inference pod finds them free at once; the rule holds through a rebuild, and a new
    config counts the reserves again."""
    tenants: dict[str, dict[str, Any]] = {
        "a": {"nominal": {"gpu": 2}, "borrow": 2},
        "b": {"nominal": {"gpu": 2}, "reserve": 1},
    }
    q = FairQueue(redis_client)
    q.sync_config(keeping_reserves(config(**tenants)), {"gpu": 4})
    got = admit_seen(q, [pods("a") for _ in range(4)])
    assert [(a.outcome, a.band) for a in got] == [
        ("reserved", "training"), ("reserved", "training"), ("reserved", "borrowed"),
        ("queued", "borrowed")]
    assert got[3].waiting_for == ("1 x gpu of cluster capacity: borrowed pods leave the "
                                  "tenants' unused inferenceReserve free")
    assert released(q) == []
    # b's inference pod runs at once, in the GPU nobody borrowed
    serving = pods("b", "inference")
    got = admit_seen(q, [serving], 1.0)
    assert [(a.outcome, a.band) for a in got] == [("reserved", "inference")]
    # while it runs the reserve is in use: a GPU that frees goes to the borrowed pod
    q.release("t1", pod_uid("t1"))
    assert released(q) == ["t4"]
    # when it ends (and a borrowed pod too), its GPU is the idle reserve again: a's
    # pod within nominal may take a free GPU, its borrowed one may not take the reserve
    q.release(serving.ticket, pod_uid(serving.ticket))
    q.release("t4", pod_uid("t4"))
    nominal, waiting = pods("a"), pods("a")
    got = admit_seen(q, [nominal, waiting], 2.0)
    assert [(a.outcome, a.band) for a in got] == [("reserved", "training"),
                                                  ("queued", "borrowed")]
    assert released(q) == []
    # a rebuild from the cluster counts the reserves again: still held
    running = [RunningPod(t, "a", "ns-a", f"p{t[1:]}", "training", band, {"gpu": 1},
                          pod_uid(t)) for t, band in (("t2", "training"), ("t3", "borrowed"),
                                                      (nominal.ticket, "training"))]
    q.rebuild(running, [GatedPod(waiting, "borrowed", pod_uid(waiting.ticket))],
              listed_at=200.0)
    assert released(q, now=201.0) == []
    # lending the reserves again (the default), nothing holds the GPU
    q.sync_config(config(**tenants), {"gpu": 4})
    assert released(q, now=202.0) == [waiting.ticket]


def test_by_default_a_borrowed_pod_may_run_in_an_unused_inference_reserve(
        redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, {"gpu": 4}, a={"nominal": {"gpu": 2}, "borrow": 2},
                   b={"nominal": {"gpu": 2}, "reserve": 1})
    got = admit_seen(q, [pods("a") for _ in range(4)])
    assert [(a.outcome, a.band) for a in got] == [
        ("reserved", "training"), ("reserved", "training"), ("reserved", "borrowed"),
        ("reserved", "borrowed")]
