"""Capacity held for the entries owed it (fairshare/queue/README.md "Holding"), on the real Lua
in a real Redis: every owed entry below its weighted share holds the free capacity not
held for the entries before it, so holds never add up beyond the free capacity and the
first owed entry is served first; with a half-life, a tenant first in (decayed) order
but above its share now does not hide the next owed tenant of its shape."""

from __future__ import annotations

import dataclasses
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, Hold, PodRequest
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec
from tests.fairshare.queue.reference import Reference, waiting_for
from tests.fairshare.tickets import pod_uid

BANDS = ("i", "t", "b")
PRIO = {"i": 3, "t": 2, "b": 1}
BAND_CODE = {"inference": "i", "training": "t", "borrowed": "b"}


def queue(client: redis.Redis, capacity: dict[str, int], weights: dict[str, float],
          half_life: str = "0s", nominal: int = 24, borrow: int = 0) -> FairQueue:
    platform = PlatformConfig.model_validate({
        "tenants": {t: {"weight": w, "ceiling": {"gpuEquivalents": 1000}}
                    for t, w in weights.items()},
        "fairShare": {"usageHalfLife": half_life},
    })
    quota = QuotaSpec.model_validate({"nominal": {"gpu": nominal},
                                      "borrowLimit": {"gpuEquivalents": borrow}})
    q = FairQueue(client)
    q.sync_config(FairgateConfig(platform=platform, quotas={t: quota for t in weights}),
                  capacity)
    return q


def pod(ticket: str, tenant: str, gpus: int, at: float) -> PodRequest:
    return PodRequest(ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}", name=ticket,
                      pod_class="training", demand={"gpu": gpus}, submitted_at=at)


def test_freed_gpus_go_to_the_owed_big_pod_tenant_not_to_small_pods_above_their_share(
        redis_client: redis.Redis) -> None:
    """Seed 43 of bench/fairness.py in small: 24 GPUs, 8-GPU pods of a (weight 4) and b
    (weight 3), 1-GPU pods of c (weight 1), decayed usage. a arrived last, so it is first
    in order, but it runs 16 GPUs (above its 12); b runs nothing (below its 9) and comes
    before c (whose history is larger). The GPUs c's pods free must be held for b, not
    go to c's next pods (c runs 8, far above its 3)."""
    q = queue(redis_client, {"gpu": 24}, {"a": 4, "b": 3, "c": 1}, half_life="1h")
    for i in range(8):
        assert q.admit(pod(f"c{i}", "c", 1, 0.0), 0.0).outcome == "reserved"
    assert q.admit(pod("b0", "b", 8, 0.0), 0.0).outcome == "reserved"
    assert q.release("b0", pod_uid("b0"), now=1000.0)
    for i in range(2):
        assert q.admit(pod(f"a{i}", "a", 8, 1000.0), 1000.0).outcome == "reserved"
    assert q.admit(pod("a2", "a", 8, 1001.0), 1001.0).outcome == "queued"
    assert q.admit(pod("b1", "b", 8, 1001.0), 1001.0).outcome == "queued"
    for i in range(8, 16):
        assert q.admit(pod(f"c{i}", "c", 1, 1001.0), 1001.0).outcome == "queued"
    for i in range(7):
        now = 1010.0 + i
        assert q.release(f"c{i}", pod_uid(f"c{i}"), now=now)
        assert q.dispatch(now, 100) == []  # c's pods wait: the freed GPUs are b's
        # c, down to 2 running (below its 3), is owed too, after b: nothing left for it
        owed_after_b: list[tuple[str, dict[str, int]]] = [("c", {})] if i >= 5 else []
        assert [(h.tenant, dict(h.held)) for h in q.holds(now)] == [
            ("b", {"gpu": i + 1}), *owed_after_b]
    # the fast path respects b's hold too: 7 GPUs are free, a new 1-GPU pod of c waits
    # for the capacity held for b
    late = q.admit(pod("c16", "c", 1, 1016.0), 1016.0)
    assert (late.outcome, late.waiting_for) == (
        "queued", "gpu capacity held for b (ahead in fair-share order)")
    status = q.ticket_status("b1", 1016.0)
    assert status is not None and status.waiting_for == "capacity held for you: 7 of 8 GPUs"
    status = q.ticket_status("c8", 1016.0)
    assert status is not None and status.waiting_for == (
        "gpu capacity held for b (ahead in fair-share order)")
    # 8 GPUs free: the 8-GPU entry first in order (a's) fits and goes; c still waits
    assert q.release("c7", pod_uid("c7"), now=1017.0)
    assert [r.ticket for r in q.dispatch(1017.0, 100)] == ["a2"]


def test_without_a_half_life_the_first_owed_entry_takes_the_freed_capacity(
        redis_client: redis.Redis) -> None:
    """Two owed entries on one resource (8 GPUs of a, 4 of b, both below their share):
    the first in order is served first, the second holds only what is left (nothing
    while the first lacks any), and small pods of c wait behind both."""
    q = queue(redis_client, {"gpu": 16}, {"a": 1, "b": 1, "c": 1})
    for i in range(16):
        assert q.admit(pod(f"c{i}", "c", 1, 0.0), 0.0).outcome == "reserved"
    assert q.admit(pod("a0", "a", 8, 1.0), 1.0).outcome == "queued"
    assert q.admit(pod("b0", "b", 4, 2.0), 2.0).outcome == "queued"
    assert q.admit(pod("c16", "c", 1, 3.0), 3.0).outcome == "queued"
    got = []
    for i in range(12):
        assert q.release(f"c{i}", pod_uid(f"c{i}"))
        got += [r.ticket for r in q.dispatch(10.0 + i, 100)]
        holds = [(h.tenant, dict(h.held)) for h in q.holds(10.0 + i)]
        if i < 7:  # a (share 0, older head) is first: everything freed is a's
            assert holds == [("a", {"gpu": i + 1}), ("b", {})]
        if i == 7:
            assert got == ["a0"]
        if 7 < i < 11:  # then b's: what frees is held for it (c, owed too, gets none)
            assert holds[0] == ("b", {"gpu": i - 7})
            assert [held for _, held in holds[1:]] in ([], [{}])
    assert got == ["a0", "b0"]  # c16 never passed them


def _free(client: redis.Redis, band: str, res: str) -> int:
    """Units of `res` free for an entry of `band` (lower bands count as free)."""
    used = sum(int(client.hget("fairgate:used", f"{b}:{res}") or 0)
               for b in BANDS if PRIO[b] >= PRIO[band])
    return int(client.hget("fairgate:cap", res) or 0) - used


def check_holds(client: redis.Redis, holds: list[Hold]) -> None:
    """Per tier and resource: each hold is at most its demand; holds sum to at most the
    free capacity; and they fill in order (a hold short of its demand is followed only
    by empty ones: the first owed entry is served first)."""
    by_tier: dict[str, list[Hold]] = {}
    for h in holds:
        by_tier.setdefault(BAND_CODE[h.band], []).append(h)
    for tier, tier_holds in by_tier.items():
        for res in {r for h in tier_holds for r in h.demand}:
            total, short = 0, False
            for h in tier_holds:
                units = h.held.get(res, 0)
                assert 0 <= units <= h.demand.get(res, 0)
                assert not (short and units > 0), (res, tier_holds)
                short = short or units < h.demand.get(res, 0)
                total += units
            assert total <= max(0, _free(client, tier, res)), (res, tier_holds)


Op = tuple[str, Any, Any]
ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.sampled_from("abcd"), st.sampled_from([1, 2, 4, 8])),
    st.tuples(st.just("end"), st.integers(0, 1000), st.none()),
    st.tuples(st.just("dispatch"), st.integers(1, 3), st.none()),
), min_size=5, max_size=40)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fill=st.lists(st.sampled_from("abcd"), min_size=16, max_size=16), steps=ops,
       weights=st.lists(st.integers(1, 5), min_size=4, max_size=4),
       half_life=st.sampled_from(["0s", "600s"]), borrow=st.sampled_from([0, 8]))
def test_holds_never_sum_beyond_the_free_capacity(
        redis_client: redis.Redis, fill: list[str], steps: list[Op], weights: list[int],
        half_life: str, borrow: int) -> None:
    """A cluster full of 1-GPU pods (`fill`: their tenants), then random admissions of
    1-8 GPU pods, ends and dispatches; the holds are checked after every step."""
    redis_client.flushall()
    q = queue(redis_client, {"gpu": 16}, dict(zip("abcd", weights, strict=True)),
              half_life=half_life, nominal=8, borrow=borrow)
    running: list[str] = []
    for n, tenant in enumerate(fill):
        if q.admit(pod(f"f{n}", tenant, 1, 0.0), 0.0).outcome == "reserved":
            running.append(f"f{n}")
    now = 0.0
    for n, (op, x, y) in enumerate(steps):
        now += 7.0
        if op == "admit":
            ticket = f"p{n}"
            if q.admit(pod(ticket, x, y, now), now).outcome == "reserved":
                running.append(ticket)
        elif op == "end" and running:
            ticket = running.pop(x % len(running))
            assert q.release(ticket, pod_uid(ticket), now=now)
        elif op == "dispatch":
            running += [r.ticket for r in q.dispatch(now, x)]
        check_holds(redis_client, q.holds(now))


def test_an_owed_entry_behind_another_on_one_resource_holds_its_other_resources(
        redis_client: redis.Redis) -> None:
    """The shrunk stateful-test case (holdfix): 1 GPU and 2 MIG slices, all
    c's. b (a GPU pod) and a (a GPU + MIG-slice pod) are owed, b first (older head).
    When c's MIG pod ends, no GPU is free, so b holds none and a none of the GPU, but a
    holds 1 of the 2 free MIG slices: c, far above its share, may not take them with a
    2-slice pod, neither by dispatch nor by the fast path. (The reference model still
    had the one-hold-per-resource rule: it skipped a, its GPU being b's, and released
    c's pod.) Lua and reference model must agree, step by step. Ordered by current
    usage, as the model here is: with virtual time c's second MIG pod, expected to end
    when a can start, would be backfilled at 6 s (test_backfill.py)."""
    platform = PlatformConfig.model_validate({
        "tenants": {t: {"weight": 1, "ceiling": {"gpuEquivalents": 100}} for t in "abc"},
        "fairShare": {"usageHalfLife": "0s"},
    })
    quota = QuotaSpec.model_validate({"nominal": {"gpu": 4, "mig-1g.5gb": 4}})
    config = FairgateConfig(platform=platform, quotas={t: quota for t in "abc"})
    capacity = {"gpu": 1, "mig-1g.5gb": 2}
    q, ref = FairQueue(redis_client), Reference()
    q.sync_config(config, capacity)
    ref.sync(config, capacity)

    def admit(ticket: str, tenant: str, demand: dict[str, int], at: float) -> Admission:
        req = PodRequest(ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}",
                         name=ticket, pod_class="training", demand=demand, submitted_at=at)
        got = q.admit(req, at)
        want, reason = ref.admit(req, at, False)
        assert got == dataclasses.replace(
            want, waiting_for=waiting_for(reason, tenant, "training"),
            reason=tuple(str(v) for v in reason) if want.outcome == "queued" else ())
        uid = pod_uid(ticket)
        assert q.confirm(ticket, uid, f"ns-{tenant}", ticket) == "confirmed"
        assert ref.confirm(ticket, uid, f"ns-{tenant}", ticket) == "confirmed"
        return got

    assert admit("c-gpu", "c", {"gpu": 1}, 1.0).outcome == "reserved"
    assert admit("c-mig0", "c", {"mig-1g.5gb": 2}, 1.0).outcome == "reserved"
    assert admit("b-gpu", "b", {"gpu": 1}, 2.0).outcome == "queued"
    assert admit("a-both", "a", {"gpu": 1, "mig-1g.5gb": 1}, 3.0).outcome == "queued"
    assert admit("c-mig1", "c", {"mig-1g.5gb": 2}, 4.0).outcome == "queued"
    # c's MIG pod ends: dispatch keeps a's slice (the old rule released c-mig1)
    assert q.release("c-mig0", pod_uid("c-mig0"), now=5.0)
    assert ref.release("c-mig0", False, pod_uid("c-mig0"))
    assert [(h.tenant, dict(h.held)) for h in q.holds(5.0)] == [
        ("b", {}), ("a", {"mig-1g.5gb": 1})]
    assert q.dispatch(5.0, 100) == ref.dispatch(5.0, 100) == []
    # and so does the fast path
    late = admit("c-mig2", "c", {"mig-1g.5gb": 2}, 5.0)
    assert (late.outcome, late.waiting_for) == (
        "queued", "mig-1g.5gb capacity held for a (ahead in fair-share order)")
    # c's GPU pod ends: the GPU goes to b (first owed), a's MIG slice stays held
    assert q.release("c-gpu", pod_uid("c-gpu"), now=6.0)
    assert ref.release("c-gpu", False, pod_uid("c-gpu"))
    got = q.dispatch(6.0, 100)
    assert got == ref.dispatch(6.0, 100)
    assert [r.ticket for r in got] == ["b-gpu"]
