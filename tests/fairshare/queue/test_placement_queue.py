"""Capacity per placement class in the Lua queue, on a real Redis.

Capacity and cluster usage are per capacity key (a resource in one placement class,
tenants.placement); quota and a tenant's usage stay per resource. A pod is released
only against its own class's capacity, pool tenants never reach another pool's
capacity (borrowing included), holds are per class, quota safety (invariant 1) holds.
"""

from __future__ import annotations

import random

import pytest
import redis

from fairshare.queue.entitlement import snapshot_fairness
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GatedPod, PodRequest, RunningPod
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec
from tenants.placement import Placement, pod_placement
from tests.fairshare.tickets import pod_uid, seen

SINGLE = Placement("single", "1g.5gb")
A100 = Placement("none", None, "a100-pool")
POOL_A = Placement("none", None, "a")
POOL_B = Placement("none", None, "b")


def queue(client: redis.Redis, capacity: dict[str, int],
          tenants: dict[str, dict[str, object]], quotas: dict[str, dict[str, object]]) -> FairQueue:
    platform = PlatformConfig.model_validate({"tenants": tenants})
    config = FairgateConfig(platform=platform, quotas={
        name: QuotaSpec.model_validate(q) for name, q in quotas.items()})
    q = FairQueue(client)
    q.sync_config(config, capacity)
    return q


def pod(ticket: str, tenant: str, demand: dict[str, int], where: Placement | None = None,
        at: float = 0.0, pod_class: str = "training") -> PodRequest:
    """A pod of ``where`` (default: the class of ``demand`` without label or pool)."""
    where = where or pod_placement(demand, None, None)
    return PodRequest(ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}", name=ticket,
                      pod_class=pod_class,  # type: ignore[arg-type]
                      demand=where.keyed(demand), submitted_at=at)


PRIORITY = {"i": 3, "t": 2, "b": 1}
BAND_CODE = {"inference": "i", "training": "t", "borrowed": "b"}


def used(client: redis.Redis, lowest: str = "b") -> dict[str, int]:
    """Cluster usage per capacity key in the bands of priority >= ``lowest``'s."""
    total: dict[str, int] = {}
    for field, value in client.hgetall("fairgate:used").items():
        band, _, key = field.decode().partition(":")
        if PRIORITY[band] >= PRIORITY[lowest]:
            total[key] = total.get(key, 0) + int(value)
    return {k: v for k, v in total.items() if v}


def tenant(ceiling: int = 64, pool: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"weight": 1, "ceiling": {"gpuEquivalents": ceiling}}
    if pool is not None:
        spec["nodePool"] = pool
    return spec


def test_whole_gpu_backlog_is_released_only_against_whole_gpu_capacity(
        redis_client: redis.Redis) -> None:
    """The headline bug: 8 plain GPUs + 56 single-strategy MIG devices is not 64 GPUs."""
    q = queue(redis_client, {"gpu": 8, "mig-1g.5gb#single": 56},
              {"t": tenant(80)}, {"t": {"nominal": {"gpu": 64, "mig-1g.5gb": 70}}})
    outcomes = [q.admit(pod(f"g{i}", "t", {"gpu": 1}, at=i), float(i)).outcome
                for i in range(12)]
    assert outcomes.count("reserved") == 8
    assert q.dispatch(20.0, 10) == []  # 56 free MIG devices are not whole GPUs
    # the single-MIG pods are not stuck behind the whole-GPU backlog
    for i in range(56):
        assert q.admit(pod(f"m{i}", "t", {"mig-1g.5gb": 1}, SINGLE, at=30 + i),
                       30.0 + i).outcome == "reserved"
    waiting = q.admit(pod("m56", "t", {"mig-1g.5gb": 1}, SINGLE, at=90), 90.0)
    assert waiting.outcome == "queued"
    assert waiting.waiting_for == "1 x mig-1g.5gb (MIG single 1g.5gb) of cluster capacity"
    assert used(redis_client) == {"gpu": 8, "mig-1g.5gb#single": 56}
    # a whole GPU frees: one whole-GPU pod goes, nothing of the other class
    assert q.release("g0", pod_uid("g0"), 100.0)
    released = q.dispatch(101.0, 10)
    assert [r.ticket for r in released] == ["g8"]
    assert dict(released[0].demand) == {"gpu": 1}


def test_a_mig_device_of_one_strategy_is_not_one_of_the_other(
        redis_client: redis.Redis) -> None:
    """Same profile, same quota resource, different nodes: mixed and single capacities
    are apart, while the tenant's quota counts both (per resource)."""
    q = queue(redis_client, {"mig-1g.5gb": 2, "mig-1g.5gb#single": 2},
              {"t": tenant(8)}, {"t": {"nominal": {"mig-1g.5gb": 3}}})
    assert q.admit(pod("x1", "t", {"mig-1g.5gb": 1}), 1.0).outcome == "reserved"
    assert q.admit(pod("x2", "t", {"mig-1g.5gb": 1}), 2.0).outcome == "reserved"
    assert q.admit(pod("x3", "t", {"mig-1g.5gb": 1}), 3.0).outcome == "queued"  # mixed full
    assert q.admit(pod("s1", "t", {"mig-1g.5gb": 1}, SINGLE), 4.0).outcome == "reserved"
    # quota is per resource: 3 mig-1g.5gb in use, the 4th waits for quota although a
    # single-strategy device is free
    s2 = q.admit(pod("s2", "t", {"mig-1g.5gb": 1}, SINGLE), 5.0)
    assert s2.outcome == "queued"
    (status,) = q.tenant_status()
    assert dict(status.used) == {"mig-1g.5gb": 3}
    assert used(redis_client) == {"mig-1g.5gb": 2, "mig-1g.5gb#single": 1}


def test_a_pool_tenant_never_takes_another_pools_capacity_not_even_borrowing(
        redis_client: redis.Redis) -> None:
    q = queue(redis_client, {"gpu": 4, "gpu@a": 2, "gpu@b": 8},
              {"p": tenant(16, "a"), "idle": tenant(16)},
              {"p": {"nominal": {"gpu": 1}, "borrowLimit": {"gpuEquivalents": 8}},
               "idle": {"nominal": {"gpu": 4}}})
    results = [q.admit(pod(f"p{i}", "p", {"gpu": 1}, POOL_A, at=i), float(i))
               for i in range(6)]
    assert [r.outcome for r in results].count("reserved") == 2
    assert {r.band for r in results if r.outcome == "reserved"} == {"training", "borrowed"}
    assert q.dispatch(10.0, 10) == []  # 4 default and 8 pool-b GPUs stay unused by p
    assert used(redis_client) == {"gpu@a": 2}
    # the default class is untouched by p's backlog
    for i in range(4):
        assert q.admit(pod(f"i{i}", "idle", {"gpu": 1}, at=20 + i), 20.0 + i).outcome == \
            "reserved"


def _per_key(q: FairQueue) -> dict[str, tuple[dict[str, int], ...]]:
    """Per tenant: running units per key (all bands, inference band), queued (same)."""
    snap = q.snapshot()
    return {s.tenant: (dict(s.running_by_key), dict(s.running_inference_by_key),
                       dict(snap.queued_by_key[s.tenant]),
                       dict(snap.queued_inference_by_key[s.tenant]))
            for s in snap.tenants}


def test_the_snapshot_carries_usage_and_demand_per_class_and_entitles_per_class(
        redis_client: redis.Redis) -> None:
    """examples/placement.yaml's cluster through admit: each tenant holds all of the one
    class it asks for (team-pool partly borrowed) with more queued. The snapshot has
    each tenant's running units per capacity key (all bands) and its seen queued units
    per key, and the inference band's part of each; the entitlement is per class: no
    one is entitled to more of a class than it has, every tenant reads 1.0 of its
    entitlement, Jain 1. A pod that ends, a queued pod deleted, and a rebuild from the
    same pods keep the per-key counts exact."""
    q = queue(redis_client, {"gpu": 8, "mig-1g.5gb#single": 56, "gpu@a100-pool": 4},
              {"team-a": {**tenant(), "weight": 2}, "team-b": tenant(),
               "team-pool": tenant(pool="a100-pool")},
              {"team-a": {"nominal": {"gpu": 8, "mig-1g.5gb": 14},
                          "borrowLimit": {"gpuEquivalents": 8}},
               "team-b": {"nominal": {"gpu": 2, "mig-1g.5gb": 56},
                          "borrowLimit": {"gpuEquivalents": 4}},
               "team-pool": {"nominal": {"gpu": 2}, "borrowLimit": {"gpuEquivalents": 8}}})
    pods = ([pod(f"a{i}", "team-a", {"gpu": 1}, at=i) for i in range(10)]
            + [pod(f"b{i}", "team-b", {"mig-1g.5gb": 2}, SINGLE, at=i, pod_class="inference")
               for i in range(30)]
            + [pod(f"p{i}", "team-pool", {"gpu": 1}, A100, at=i) for i in range(6)])
    bands, reserved = {}, set()
    for req in pods:
        admission = q.admit(req, req.submitted_at)
        bands[req.ticket] = admission.band
        if admission.outcome == "reserved":
            reserved.add(req.ticket)
        seen(q, req)
    assert len(reserved) == 8 + 28 + 4
    assert [bands[f"p{i}"] for i in range(4)] == ["training"] * 2 + ["borrowed"] * 2

    snapshot = q.snapshot()
    assert _per_key(q) == {
        "team-a": ({"gpu": 8}, {}, {"gpu": 2}, {}),
        "team-b": ({"mig-1g.5gb#single": 56}, {"mig-1g.5gb#single": 56},
                   {"mig-1g.5gb#single": 4}, {"mig-1g.5gb#single": 4}),
        "team-pool": ({"gpu@a100-pool": 4}, {}, {"gpu@a100-pool": 2}, {}),
    }
    fair = snapshot_fairness(snapshot)
    assert {t: f.entitlement for t, f in fair.tenants.items()} == pytest.approx(
        {"team-a": 8, "team-b": 8, "team-pool": 4})
    assert fair.jain_index == pytest.approx(1.0)

    assert q.release("p3", pod_uid("p3"))  # a borrowed pod ends
    assert q.remove("a9", pod_uid("a9"))
    expected = {
        "team-a": ({"gpu": 8}, {}, {"gpu": 1}, {}),
        "team-b": ({"mig-1g.5gb#single": 56}, {"mig-1g.5gb#single": 56},
                   {"mig-1g.5gb#single": 4}, {"mig-1g.5gb#single": 4}),
        "team-pool": ({"gpu@a100-pool": 3}, {}, {"gpu@a100-pool": 2}, {}),
    }
    assert _per_key(q) == expected
    gone = {"p3", "a9"}
    q.rebuild([RunningPod(req.ticket, req.tenant, req.namespace, req.name, req.pod_class,
                          bands[req.ticket], req.demand, pod_uid(req.ticket))
               for req in pods if req.ticket in reserved - gone],
              [GatedPod(req, bands[req.ticket], pod_uid(req.ticket))
               for req in pods if req.ticket not in reserved | gone])
    assert _per_key(q) == expected


def test_a_hold_for_one_class_does_not_block_another(redis_client: redis.Redis) -> None:
    """The hold (capacity owed to the tenant first in order) is per class."""
    q = queue(redis_client, {"gpu": 4, "mig-1g.5gb#single": 7},
              {"a": tenant(32), "b": tenant(32)},
              {"a": {"nominal": {"gpu": 4}}, "b": {"nominal": {"gpu": 4, "mig-1g.5gb": 7}}})
    for i in range(3):
        assert q.admit(pod(f"b{i}", "b", {"gpu": 1}, at=i), float(i)).outcome == "reserved"
    big = pod("a-big", "a", {"gpu": 4}, at=10.0)
    assert q.admit(big, 10.0).outcome == "queued"  # a is owed whole GPUs: held
    seen(q, big)
    holds = q.holds(11.0)
    assert [(h.tenant, dict(h.demand)) for h in holds] == [("a", {"gpu": 4})]
    # b's single-MIG pod uses no held capacity: it goes at once
    assert q.admit(pod("b-mig", "b", {"mig-1g.5gb": 2}, SINGLE, at=12.0), 12.0).outcome == \
        "reserved"
    # while a whole-GPU pod of b would take the held GPU: it waits
    assert q.admit(pod("b-gpu", "b", {"gpu": 1}, at=13.0), 13.0).outcome == "queued"


def test_quota_and_capacity_hold_per_key_under_random_traffic(
        redis_client: redis.Redis) -> None:
    """Invariant 1 per tenant (per resource); a pod released in band B fits its own
    capacity key with the usage of bands >= B (lower ones count as free: preemption),
    so inference usage never exceeds any key's capacity."""
    capacity = {"gpu": 6, "gpu@a": 3, "mig-1g.5gb": 7, "mig-1g.5gb#single": 14,
                "mig-1g.5gb#single@a": 7}
    nominal = {"gpu": 3, "mig-1g.5gb": 6}
    q = queue(redis_client, capacity,
              {"x": tenant(32), "y": tenant(32), "p": tenant(32, "a")},
              {t: {"nominal": nominal, "borrowLimit": {"gpuEquivalents": 2}}
               for t in ("x", "y", "p")})
    rng = random.Random(7)
    running: list[str] = []
    for step in range(300):
        now = float(step)
        roll = rng.random()
        if roll < 0.5:
            t = rng.choice(["x", "y", "p"])
            pool = "a" if t == "p" else None
            where, res = rng.choice([
                (Placement("none", None, pool), "gpu"),
                (Placement("mixed", None, pool), "mig-1g.5gb"),
                (Placement("single", "1g.5gb", pool), "mig-1g.5gb"),
            ])
            req = pod(f"k{step}", t, {res: rng.randint(1, 2)}, where, now,
                      rng.choice(["training", "inference"]))
            try:
                admitted = q.admit(req, now)
            except ValueError:
                continue  # a pod that can never fit its quota
            seen(q, req)
            if admitted.outcome == "reserved":
                running.append(req.ticket)
                released = [(admitted.band, req.demand)]
            else:
                released = []
        elif roll < 0.8 and running:
            ticket = running.pop(rng.randrange(len(running)))
            q.release(ticket, pod_uid(ticket), now)
            released = []
        else:
            dispatched = q.dispatch(now, 3)
            running += [r.ticket for r in dispatched]
            released = [(r.band, r.demand) for r in dispatched]
        for band, demand in released:
            in_band = used(redis_client, BAND_CODE[band])
            for key in demand:
                assert in_band[key] <= capacity.get(key, 0), (step, band, key)
        for key, units in used(redis_client, "i").items():
            assert units <= capacity.get(key, 0), (step, key, units)
        for status in q.tenant_status():
            for res, n in status.used.items():
                assert n <= nominal.get(res, 0), (step, status.tenant, res)


def test_a_per_class_count_left_negative_by_an_older_version_reads_as_zero(
        redis_client: redis.Redis) -> None:
    """A pod admitted by a version that kept no per-class counts and freed by this one
    leaves its count at -1 until the next rebuild: the snapshot reads it as 0 (the
    dispatcher's chores and `fairgate status` keep working), the other bands' counts
    of the key as they are."""
    q = queue(redis_client, {"gpu": 4}, {"t": tenant()}, {"t": {"nominal": {"gpu": 4}}})
    req = pod("t0", "t", {"gpu": 1})
    assert q.admit(req, 0.0).outcome == "reserved"
    redis_client.hincrby("fairgate:ts:t", "k:b:gpu", -1)  # what that release leaves
    (status,) = q.snapshot().tenants
    assert dict(status.running_by_key) == {"gpu": 1}
