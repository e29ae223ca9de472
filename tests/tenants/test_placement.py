"""tenants.placement: the node side (capacity) and the pod side (affinity) agree.

The affinity is checked by evaluating the nodeSelector requirements the webhook writes
against node labels with Kubernetes' operator semantics (written out here, not taken
from the code under test).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenants import resources
from tenants.placement import (
    GPU_PRODUCT_LABEL,
    MIG_STRATEGY_LABEL,
    NODE_POOL_LABEL,
    SINGLE_PRODUCTS,
    Placement,
    PlacementError,
    device_counts,
    node_capacity,
    node_placement,
    placement_of_key,
    pod_placement,
    profile_demand,
    requirements,
)

PROFILES = sorted(resources.MIG_PROFILES)
POOLS = ["a", "b", "gpu-pool.1"]


def admits(reqs: list[dict[str, Any]], labels: Mapping[str, str]) -> bool:
    """Kubernetes' nodeSelectorRequirement semantics (all must hold)."""
    for r in reqs:
        key, op, values = r["key"], r["operator"], r.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        assert op in ("In", "NotIn", "Exists", "DoesNotExist"), op
    return True


ALL_PRODUCTS = sorted({p for products in SINGLE_PRODUCTS.values() for p in products})


@st.composite
def node_labels(draw: st.DrawFn) -> dict[str, str]:
    labels: dict[str, str] = {"kubernetes.io/hostname": "n"}
    strategy = draw(st.sampled_from([None, "single", "mixed", "none", "Single", ""]))
    if strategy is not None:
        labels[MIG_STRATEGY_LABEL] = strategy
    product = draw(st.one_of(
        st.none(), st.sampled_from(ALL_PRODUCTS),
        st.sampled_from(["A100-SXM4-40GB", "Tesla-T4", "A100-SXM4-40GB-MIG-1g.5gb-SHARED",
                         "Foo-MIG-1g.5gb", "A100-SXM4-40GB-MIG-9g.9gb"])))
    if product is not None:
        labels[GPU_PRODUCT_LABEL] = product
    pool = draw(st.one_of(st.none(), st.sampled_from(POOLS)))
    if pool is not None:
        labels[NODE_POOL_LABEL] = pool
    return labels


placements = st.one_of(
    st.builds(Placement, st.just("none"), st.none(), st.one_of(st.none(), st.sampled_from(POOLS))),
    st.builds(Placement, st.just("mixed"), st.none(), st.one_of(st.none(), st.sampled_from(POOLS))),
    st.builds(Placement, st.just("single"), st.sampled_from(PROFILES),
              st.one_of(st.none(), st.sampled_from(POOLS))),
)


@settings(max_examples=600, deadline=None)
@given(node_labels(), placements)
def test_a_pods_affinity_admits_exactly_the_nodes_of_its_placement(
    labels: dict[str, str], pod: Placement
) -> None:
    node = node_placement(labels)
    assert admits(requirements(pod), labels) == (node == pod)


@settings(max_examples=300, deadline=None)
@given(node_labels(), st.dictionaries(st.sampled_from(sorted(resources.KNOWN_RESOURCES)),
                                      st.integers(1, 64), max_size=4))
def test_every_capacity_key_of_a_node_is_reachable_only_by_pods_its_affinity_admits(
    labels: dict[str, str], gpus: dict[str, int]
) -> None:
    node = node_placement(labels)
    if isinstance(node, str):
        # no placement admits it: no pod of any class could be scheduled there
        assert all(not admits(requirements(Placement("single", p, labels.get(NODE_POOL_LABEL))),
                              labels) for p in PROFILES)
        return
    for key, units in node_capacity(node, gpus).items():
        resource, where = placement_of_key(key)
        assert where == node
        assert admits(requirements(where), labels)
        # a pod of that class asking for that resource is keyed to exactly this key (a
        # mixed node's whole GPUs: a pod that asks for MIG devices too)
        demand = {resource: 1, "mig-1g.5gb": 1} if where.strategy == "mixed" else {resource: 1}
        assert pod_placement(demand, where.profile, where.pool).key(resource) == key
        assert units == (gpus.get("gpu", 0) if where.strategy == "single" else gpus[resource])


@given(placements, st.sampled_from(sorted(resources.KNOWN_RESOURCES)))
def test_capacity_keys_round_trip(where: Placement, resource: str) -> None:
    if where.strategy == "single":
        resource = resources.MIG_PREFIX + str(where.profile)
    elif where.strategy == "none":
        resource = resources.GPU  # nodes without MIG offer nothing else (node_capacity)
    resource_of, back = placement_of_key(where.key(resource))
    assert (resource_of, back) == (resource, where)
    assert resources.base_of(where.key(resource)) == resource
    assert resources.slices_of(where.key(resource)) == resources.slices_of(resource)


@pytest.mark.parametrize(
    ("demand", "profile", "pool", "key"),
    [
        ({"gpu": 2}, None, None, "gpu"),
        ({"gpu": 2}, None, "a", "gpu@a"),
        ({"mig-1g.5gb": 1}, None, None, "mig-1g.5gb"),
        ({"mig-1g.5gb": 1}, "1g.5gb", None, "mig-1g.5gb#single"),
        ({"mig-1g.5gb": 1}, "1g.5gb", "a", "mig-1g.5gb#single@a"),
    ],
)
def test_pod_keys(demand: dict[str, int], profile: str | None, pool: str | None,
                  key: str) -> None:
    assert list(pod_placement(demand, profile, pool).keyed(demand)) == [key]


def test_gpus_of_a_mixed_pod_are_the_mixed_nodes_gpus() -> None:
    where = pod_placement({"gpu": 1, "mig-2g.10gb": 1}, None, None)
    assert where.keyed({"gpu": 1, "mig-2g.10gb": 1}) == {"gpu#mixed": 1, "mig-2g.10gb": 1}
    mixed = node_placement({MIG_STRATEGY_LABEL: "mixed"})
    assert isinstance(mixed, Placement)
    assert node_capacity(mixed, {"gpu": 2, "mig-2g.10gb": 3}) == {"gpu#mixed": 2,
                                                                "mig-2g.10gb": 3}


def test_headline_nodes() -> None:
    """An 8-GPU plain node and a 56-device single-strategy node are two classes."""
    plain = node_placement({})
    single = node_placement({MIG_STRATEGY_LABEL: "single",
                             GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"})
    assert isinstance(plain, Placement) and isinstance(single, Placement)
    assert node_capacity(plain, {"gpu": 8}) == {"gpu": 8}
    assert node_capacity(single, {"gpu": 56}) == {"mig-1g.5gb#single": 56}
    # MIG resources on a node without the mixed strategy label: no pod's affinity goes there
    assert node_capacity(plain, {"gpu": 1, "mig-1g.5gb": 7}) == {"gpu": 1}


def test_single_node_of_an_unknown_product_is_nobodys() -> None:
    reason = node_placement({MIG_STRATEGY_LABEL: "single", GPU_PRODUCT_LABEL: "X-MIG-1g.5gb"})
    assert isinstance(reason, str) and "X-MIG-1g.5gb" in reason


@pytest.mark.parametrize(
    ("raw", "profile", "fragment"),
    [
        ({"gpu": 1}, "9g.99gb", "not a MIG profile fairgate knows"),
        ({"gpu": 1}, "1g.10gb+me", "not a MIG profile fairgate knows"),
        ({"gpu": 1, "mig-1g.5gb": 1}, "1g.5gb", "nvidia.com/mig-1g.5gb"),
        ({}, "1g.5gb", "asks for no nvidia.com/gpu"),
    ],
)
def test_profile_label_misuse_is_refused(raw: dict[str, int], profile: str,
                                         fragment: str) -> None:
    with pytest.raises(PlacementError, match=r"fairgate\.io/mig-profile") as info:
        profile_demand(raw, profile)
    assert fragment in str(info.value)


def test_profile_label_accounts_the_profile_and_takes_the_nodes_gpus() -> None:
    assert profile_demand({"gpu": 3}, "1g.5gb") == {"mig-1g.5gb": 3}
    single = pod_placement({"mig-1g.5gb": 3}, "1g.5gb", None)
    assert device_counts(single, {"mig-1g.5gb": 3}) == {"gpu": 3}
    mixed = pod_placement({"mig-1g.5gb": 3}, None, None)
    assert device_counts(mixed, {"mig-1g.5gb": 3}) == {"mig-1g.5gb": 3}
