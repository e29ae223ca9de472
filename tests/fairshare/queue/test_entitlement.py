"""Water-filling entitlements and Jain's index (fairshare.queue.entitlement)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairshare.queue.entitlement import (
    TenantLoad,
    entitled_jain,
    fairness,
    jain_index,
    jain_text,
    snapshot_fairness,
    water_fill,
)
from fairshare.queue.model import QueueSnapshot, TenantStatus
from tenants.resources import base_of, total_slices


def test_uncapped_tenants_share_by_weight() -> None:
    assert water_fill(12, {"a": 1, "b": 2, "c": 3}, {}) == pytest.approx(
        {"a": 2, "b": 4, "c": 6})


def test_a_tenant_asking_less_than_its_share_gets_its_demand_and_the_rest_is_shared() -> None:
    got = water_fill(16, {"a": 1, "b": 1, "c": 2}, {"a": 1, "b": None, "c": None})
    assert got == pytest.approx({"a": 1, "b": 5, "c": 10})


def test_everyone_capped_leaves_capacity_unallocated() -> None:
    assert water_fill(16, {"a": 1, "b": 1}, {"a": 2, "b": 3}) == pytest.approx({"a": 2, "b": 3})


def test_bad_inputs_are_refused_with_the_culprit_named() -> None:
    with pytest.raises(ValueError, match="weight of b"):
        water_fill(1, {"a": 1, "b": 0}, {})
    with pytest.raises(ValueError, match="cap of a"):
        water_fill(1, {"a": 1}, {"a": -1})


@given(
    capacity=st.integers(0, 1000),
    tenants=st.dictionaries(
        st.sampled_from("abcdef"),
        st.tuples(st.integers(1, 5), st.none() | st.integers(0, 400)),
        min_size=1,
    ),
)
def test_water_fill_is_capped_complete_and_weight_proportional(
    capacity: int, tenants: dict[str, tuple[int, int | None]]
) -> None:
    weights = {t: float(w) for t, (w, _) in tenants.items()}
    caps = {t: c for t, (_, c) in tenants.items()}
    got = water_fill(capacity, weights, caps)
    total_cap = sum(c for c in caps.values() if c is not None) if None not in caps.values() \
        else float("inf")
    assert sum(got.values()) == pytest.approx(min(capacity, total_cap), abs=1e-6)
    for t, share in got.items():
        cap = caps[t]
        assert cap is None or share <= cap + 1e-9
    # an uncapped-by-demand tenant never gets less per weight than anyone else
    level = {t: got[t] / weights[t] for t in got}
    for t in got:
        if caps[t] is None or got[t] < caps[t] - 1e-9:
            assert all(level[t] >= level[u] - 1e-9 for u in got)


def test_a_floor_above_the_weighted_share_is_given_first_and_the_rest_shared_by_weight() -> None:
    """Inference goes ahead of training: a weight-1 tenant serving 2 GPUs of inference on
    12 is entitled to those 2 (its weighted share would be 12 / 14), and the training
    tenants share the other 10 by weight, 7:5; a floor below the weighted share changes
    nothing."""
    got = water_fill(12, {"serve": 1, "a": 7, "b": 5}, {"serve": 2, "a": None, "b": None},
                     {"serve": 2})
    assert got == pytest.approx({"serve": 2, "a": 10 * 7 / 12, "b": 10 * 5 / 12})
    assert water_fill(12, {"a": 1, "b": 1}, {}, {"a": 1}) == pytest.approx({"a": 6, "b": 6})


def test_floors_that_do_not_fit_are_shared_by_weight_each_up_to_its_floor() -> None:
    got = water_fill(4, {"a": 1, "b": 1, "c": 1}, {}, {"a": 1, "b": 6})
    assert got == pytest.approx({"a": 1, "b": 3, "c": 0})
    with pytest.raises(ValueError, match="floors must be >= 0"):
        water_fill(4, {"a": 1}, {}, {"a": -1})


def test_floors_that_fill_the_capacity_but_for_rounding_are_each_met() -> None:
    """Floors in sevenths of a GPU that fill 4 GPUs sum to a hair below 4 in floating
    point, and the floors of a subset, summed in another order, to a hair above it: no
    rest becomes a negative capacity (the dispatcher's status pass and reclaim check
    raised on it at 100 tenants). The order depends on the tenants' names (a set's), so
    the case is tried under 300 sets of names."""
    sevenths = [6, 1, 10, 4, 4, 3]
    weights = [4.0, 1.0, 2.0, 4.0, 1.0, 1.0]
    for r in range(300):
        names = [f"team-{r}-{i}" for i in range(len(sevenths))]
        floors = {n: k / 7 for n, k in zip(names, sevenths, strict=True)}
        assert sum(floors.values()) < 4.0
        got = water_fill(4.0, dict(zip(names, weights, strict=True)), {}, floors)
        assert got == pytest.approx(floors)


@given(
    capacity=st.integers(0, 200),
    tenants=st.dictionaries(
        st.sampled_from("abcdef"),
        st.tuples(st.integers(1, 5), st.none() | st.integers(0, 80), st.integers(0, 80)),
        min_size=1,
    ),
)
def test_water_fill_with_floors_gives_each_its_floor_then_shares_by_weight(
    capacity: int, tenants: dict[str, tuple[int, int | None, int]]
) -> None:
    weights = {t: float(w) for t, (w, _, _) in tenants.items()}
    caps = {t: c for t, (_, c, _) in tenants.items()}
    floors = {t: float(f if c is None else min(f, c)) for t, (_, c, f) in tenants.items()}
    got = water_fill(capacity, weights, caps, floors)
    total_cap = (sum(c for c in caps.values() if c is not None)
                 if None not in caps.values() else float("inf"))
    assert sum(got.values()) == pytest.approx(min(capacity, total_cap), abs=1e-6)
    for t, share in got.items():
        cap = caps[t]
        assert cap is None or share <= cap + 1e-9
    if sum(floors.values()) <= capacity:
        # every floor is met; above its floor and below its cap, nobody gets less per
        # weight than anyone else gets above its own floor
        assert all(got[t] >= floors[t] - 1e-9 for t in got)
        level = {t: got[t] / weights[t] for t in got}
        free = [t for t in got if got[t] > floors[t] + 1e-9]
        for t in got:
            cap = caps[t]
            if cap is None or got[t] < cap - 1e-9:
                assert all(level[t] >= level[u] - 1e-9 for u in free)
    else:  # not every floor fits: nobody gets more than its floor
        assert all(got[t] <= floors[t] + 1e-9 for t in got)


def test_fairness_counts_inference_demand_as_a_floor() -> None:
    """A tenant's inference, held or queued, is its floor: a weight-1 tenant serving
    2 GPUs is entitled to them, and holding them is not over its share."""
    gpu = 7
    fair = fairness(12 * gpu, {
        "serve": TenantLoad(weight=1, used_slices=2 * gpu, queued_slices=0,
                            inference_slices=2 * gpu),
        "a": TenantLoad(weight=7, used_slices=6 * gpu, queued_slices=90 * gpu),
        "b": TenantLoad(weight=5, used_slices=4 * gpu, queued_slices=90 * gpu),
    })
    entitled = {name: t.entitlement for name, t in fair.tenants.items()}
    assert entitled == pytest.approx({"serve": 2, "a": 70 / 12, "b": 50 / 12})


def test_jain_index() -> None:
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([]) == 1.0


def test_fairness_caps_by_demand_and_quota_and_skips_tenants_without_demand() -> None:
    gpu = 7
    fair = fairness(12 * gpu, {
        "small": TenantLoad(weight=1, used_slices=1 * gpu, queued_slices=0),  # wants 1
        "capped": TenantLoad(weight=4, used_slices=2 * gpu, queued_slices=20 * gpu,
                             limit_slices=3 * gpu),  # quota: at most 3
        "big": TenantLoad(weight=1, used_slices=9 * gpu, queued_slices=50 * gpu),
        "idle": TenantLoad(weight=5, used_slices=0, queued_slices=0),
    })
    assert fair.capacity == 12.0
    entitled = {name: t.entitlement for name, t in fair.tenants.items()}
    assert entitled == pytest.approx({"small": 1, "capped": 3, "big": 8, "idle": 0})
    assert fair.tenants["capped"].weighted_share == pytest.approx(2 / 4)
    assert fair.tenants["big"].demand == pytest.approx(59)
    assert fair.tenants["idle"].of_entitlement is None
    ratios = [1.0, 2 / 3, 9 / 8]  # used / entitlement; idle is entitled to nothing
    assert fair.jain_index == pytest.approx(jain_index(ratios))


def test_fairness_jain_is_one_when_everyone_holds_its_entitlement() -> None:
    """Whatever the weights and caps: Jain's index is of used / entitlement."""
    fair = fairness(10 * 7, {
        "a": TenantLoad(weight=1, used_slices=2 * 7, queued_slices=7),
        "b": TenantLoad(weight=3, used_slices=6 * 7, queued_slices=7),
        "c": TenantLoad(weight=9, used_slices=2 * 7, queued_slices=0),  # capped at 2
    })
    assert [t.entitlement for t in fair.tenants.values()] == pytest.approx([2, 6, 2])
    assert fair.jain_index == pytest.approx(1.0)


def test_entitled_jain_is_not_defined_for_one_tenant_or_no_usage() -> None:
    assert entitled_jain([]) is None
    assert entitled_jain([None, 0.0]) is None  # one tenant entitled to something
    assert entitled_jain([1.0]) is None
    assert entitled_jain([0.0, 0.0]) is None  # nobody uses anything
    assert entitled_jain([1.0, 0.0, None]) == pytest.approx(0.5)
    assert jain_text(None) == "n/a" and jain_text(0.5, 3) == "0.500"


def test_a_lone_backlogged_tenant_holding_nothing_does_not_read_fair() -> None:
    """The only backlogged tenant holds 0 of its 4 entitled GPUs: n/a, never 1.0."""
    gpu = 7
    fair = fairness(4 * gpu, {
        "a": TenantLoad(weight=1, used_slices=0, queued_slices=4 * gpu),
        "idle": TenantLoad(weight=1, used_slices=0, queued_slices=0),
    })
    assert fair.tenants["a"].entitlement == pytest.approx(4)
    assert fair.jain_index is None
    # beside a tenant holding all of its entitlement, it reads 0.5
    fair = fairness(8 * gpu, {
        "a": TenantLoad(weight=1, used_slices=0, queued_slices=4 * gpu),
        "b": TenantLoad(weight=1, used_slices=4 * gpu, queued_slices=0),
    })
    assert fair.jain_index == pytest.approx(0.5)


def test_fairness_per_placement_class_entitles_no_one_to_more_than_a_class_has() -> None:
    """8 whole GPUs and 8 GPU-equivalents of MIG: a whole-GPU tenant of weight 3 beside
    a MIG-only tenant is entitled to the 8 whole GPUs, not 12 of a pooled 16."""
    gpu = 7
    loads = {
        "whole": TenantLoad(weight=3, used_slices=8 * gpu, queued_slices=40 * gpu,
                            by_key={"gpu": 48 * gpu}),
        "mig": TenantLoad(weight=1, used_slices=8 * gpu, queued_slices=0,
                          by_key={"mig-1g.5gb#single": 8 * gpu}),
    }
    pooled = fairness(16 * gpu, loads)
    assert pooled.tenants["whole"].entitlement == pytest.approx(12)
    per_class = fairness(16 * gpu, loads, {"gpu": 8 * gpu, "mig-1g.5gb#single": 8 * gpu})
    assert {n: t.entitlement for n, t in per_class.tenants.items()} == pytest.approx(
        {"whole": 8, "mig": 8})
    assert per_class.jain_index == pytest.approx(1.0)


def _status(tenant: str, weight: float, nominal: dict[str, int], borrow_gpus: int,
            running: dict[str, int], inference: dict[str, int] | None = None,
            borrowed_slices: int = 0) -> TenantStatus:
    used, inference_slices = total_slices(running), total_slices(inference or {})
    return TenantStatus(
        tenant=tenant, weight=weight, nominal=nominal, nominal_slices=total_slices(nominal),
        borrow_limit_slices=7 * borrow_gpus, inference_reserve_slices=0,
        used={base_of(k): n for k, n in running.items()},
        used_slices=used, borrowed_slices=borrowed_slices,
        training_slices=used - inference_slices - borrowed_slices,
        inference_slices=inference_slices, running_by_key=running,
        running_inference_by_key=inference or {})


def test_snapshot_fairness_is_per_placement_class() -> None:
    """The queue's snapshot of examples/placement.yaml's cluster (8 whole GPUs, 56
    single-strategy MIG devices, 4 GPUs in a100-pool), each tenant holding all of the
    one class it asks for and more queued: each is entitled to what its class has (not
    team-a 12 GPUs of a pooled 20), so the fair allocation reads 1.0 of entitlement for
    every tenant and Jain 1."""
    snapshot = QueueSnapshot(
        tenants=(
            _status("team-a", 2, {"gpu": 8, "mig-1g.5gb": 14}, 8, {"gpu": 8}),
            _status("team-b", 1, {"gpu": 2, "mig-1g.5gb": 42}, 4, {"mig-1g.5gb#single": 56},
                    inference={"mig-1g.5gb#single": 42}, borrowed_slices=14),
            _status("team-pool", 1, {"gpu": 2}, 8, {"gpu@a100-pool": 4},
                    borrowed_slices=14),
        ),
        queued_slices={"team-a": 52 * 7, "team-b": 40, "team-pool": 36 * 7},
        capacity={"gpu": 8, "mig-1g.5gb#single": 56, "gpu@a100-pool": 4},
        queued_inference_slices={"team-b": 40},
        queued_by_key={"team-a": {"gpu": 52}, "team-b": {"mig-1g.5gb#single": 40},
                       "team-pool": {"gpu@a100-pool": 36}},
        queued_inference_by_key={"team-b": {"mig-1g.5gb#single": 40}},
    )
    fair = snapshot_fairness(snapshot)
    assert fair.capacity == pytest.approx(20)
    assert {n: t.entitlement for n, t in fair.tenants.items()} == pytest.approx(
        {"team-a": 8, "team-b": 8, "team-pool": 4})
    assert all(t.of_entitlement == pytest.approx(1.0) for t in fair.tenants.values())
    assert fair.jain_index == pytest.approx(1.0)


def test_snapshot_fairness_shares_a_class_by_weight_and_leaves_unasked_classes() -> None:
    """Two tenants asking for the same 8 whole GPUs share them 2:1, whatever MIG
    capacity no one asks for; a tenant's inference in a class is its floor there."""
    snapshot = QueueSnapshot(
        tenants=(
            _status("team-a", 2, {"gpu": 16}, 0, {"gpu": 8}),
            _status("team-b", 1, {"gpu": 16}, 0, {}),
        ),
        queued_slices={"team-a": 8 * 7, "team-b": 8 * 7},
        capacity={"gpu": 8, "mig-1g.5gb#single": 56},
        queued_inference_slices={"team-b": 5 * 7},
        queued_by_key={"team-a": {"gpu": 8}, "team-b": {"gpu": 8}},
        queued_inference_by_key={"team-b": {"gpu": 5}},
    )
    fair = snapshot_fairness(snapshot)
    assert {n: t.entitlement for n, t in fair.tenants.items()} == pytest.approx(
        {"team-a": 3, "team-b": 5})
    assert sum(t.entitlement for t in fair.tenants.values()) <= 8
