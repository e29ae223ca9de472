"""Placement classes: which nodes a GPU pod may run on, and which capacity is whose.

One pure definition shared by the webhook (the node affinity it writes) and the
dispatcher (the capacity it counts), so that a pod is only ever released against
capacity its own affinity can reach.

Contract:
- A :class:`Placement` is (MIG strategy of the nodes, MIG profile for ``single``, node
  pool). Strategy ``none``: nodes whose ``nvidia.com/mig.strategy`` label is neither
  ``single`` nor ``mixed`` (whole GPUs, ``nvidia.com/gpu``); ``mixed``: nodes labelled
  ``mixed`` (``nvidia.com/mig-<profile>``, and ``nvidia.com/gpu`` for their GPUs without
  MIG); ``single``: nodes labelled ``single`` whose ``nvidia.com/gpu.product`` is
  ``<GPU>-MIG-<profile>`` for a GPU in :data:`SINGLE_PRODUCTS` (GPU Feature Discovery's
  labels; every ``nvidia.com/gpu`` device there is one MIG device of that profile).
  Pool: the node's ``fairgate.io/node-pool`` label; nodes without it are in no pool.
- :func:`requirements` is the nodeSelector requirements of a placement; a node's GPUs
  are counted (:func:`node_capacity`) in exactly the placement whose requirements admit
  the node, under capacity keys (:mod:`tenants.resources`): classes partition the nodes.
- :func:`pod_placement` is the placement of an admitted pod: its accounted demand
  (:mod:`admission.demand`), its ``fairgate.io/mig-profile`` label and its tenant's pool.
  A pod with the label is a ``single`` pod (it asks for ``nvidia.com/gpu`` and is
  accounted as that profile's MIG devices); else MIG demand makes it ``mixed``, and
  only ``gpu`` makes it ``none``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tenants import resources

NODE_POOL_LABEL = "fairgate.io/node-pool"
"""Node label: the node belongs to this pool (only tenants with that ``nodePool`` use it)."""
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_PROFILE_LABEL = "fairgate.io/mig-profile"
"""Pod label (set at CREATE, immutable after): run on ``single``-strategy MIG nodes of
this profile; the pod asks for ``nvidia.com/gpu``, accounted as ``mig-<profile>``."""
NODE_POOL_ANNOTATION = "fairgate.io/node-pool"
"""Pod annotation the webhook writes: the tenant's pool the pod was admitted to."""

Strategy = Literal["none", "mixed", "single"]
MIG_STRATEGIES: tuple[Strategy, ...] = ("single", "mixed")

# GPU Feature Discovery names a single-strategy node's product <GPU>-MIG-<profile>,
# where <GPU> is the product name the driver reports, with or without "NVIDIA-".
_PRODUCTS_BY_GPU: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("A100-SXM4-40GB", "A100-PCIE-40GB"),
    "A100-80GB": ("A100-SXM4-80GB", "A100-80GB-PCIe"),
    "H100-80GB": ("H100-80GB-HBM3", "H100-PCIe", "H100-SXM5-80GB"),
    "H100-94GB": ("H100-NVL",),
    "H100-96GB": ("GH200-480GB",),
    "H200-141GB": ("H200", "H200-NVL"),
}
SINGLE_PRODUCTS: Mapping[str, tuple[str, ...]] = {
    profile: tuple(sorted(
        f"{prefix}{gpu}-MIG-{profile}"
        for family, gpus in _PRODUCTS_BY_GPU.items()
        if profile in resources.mig_profiles_of(family)
        for gpu in gpus for prefix in ("", "NVIDIA-")
    ))
    for profile in sorted(resources.MIG_PROFILES)
}
"""Per MIG profile, the ``nvidia.com/gpu.product`` values of single-strategy nodes of it."""
_PROFILE_OF_PRODUCT: Mapping[str, str] = {
    product: profile for profile, products in SINGLE_PRODUCTS.items() for product in products
}

_POOL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def check_node_pool(value: str | None) -> str | None:
    """A tenant's ``nodePool``: None or a Kubernetes label value (raises ValueError)."""
    if value is not None and not _POOL.match(value):
        raise ValueError(
            f"nodePool {value!r} is not a Kubernetes label value: use 1-63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit (the "
            f"value of the pool's nodes' {NODE_POOL_LABEL} label)"
        )
    return value


Requirement = dict[str, Any]


class PlacementError(ValueError):
    """A pod whose placement cannot be decided; the message says what to fix."""


@dataclass(frozen=True, order=True)
class Placement:
    """Nodes of one MIG strategy (``single``: of one MIG ``profile``) in one ``pool``."""

    strategy: Strategy = "none"
    profile: str | None = None
    pool: str | None = None

    def key(self, resource: str) -> str:
        """The capacity key of ``resource`` on this placement's nodes."""
        usual: Strategy = "none" if resource == resources.GPU else "mixed"
        tag = "" if self.strategy == usual else resources.STRATEGY_SEP + self.strategy
        pool = "" if self.pool is None else resources.POOL_SEP + self.pool
        return f"{resource}{tag}{pool}"

    def keyed(self, counts: Mapping[str, int]) -> dict[str, int]:
        """``counts`` (by resource) under this placement's capacity keys."""
        return {self.key(name): n for name, n in counts.items()}

    def describe(self) -> str:
        """Human text: ``whole GPUs``, ``MIG mixed``, ``MIG single 1g.5gb``, + pool."""
        what = {"none": "whole GPUs", "mixed": "MIG mixed",
                "single": f"MIG single {self.profile}"}[self.strategy]
        return what + (f" in pool {self.pool}" if self.pool is not None else "")


def requirements(placement: Placement) -> list[Requirement]:
    """The nodeSelector requirements that admit exactly the nodes of ``placement``."""
    found: list[Requirement] = []
    if placement.strategy == "none":
        found.append({"key": MIG_STRATEGY_LABEL, "operator": "NotIn",
                      "values": list(MIG_STRATEGIES)})
    else:
        found.append({"key": MIG_STRATEGY_LABEL, "operator": "In",
                      "values": [placement.strategy]})
    if placement.strategy == "single":
        assert placement.profile is not None
        found.append({"key": GPU_PRODUCT_LABEL, "operator": "In",
                      "values": list(SINGLE_PRODUCTS[placement.profile])})
    if placement.pool is None:
        found.append({"key": NODE_POOL_LABEL, "operator": "DoesNotExist"})
    else:
        found.append({"key": NODE_POOL_LABEL, "operator": "In", "values": [placement.pool]})
    return found


def node_placement(labels: Mapping[str, str]) -> Placement | str:
    """The placement whose pods can run on a node with ``labels``, or why none can (a
    ``single`` node whose product names no MIG profile fairgate knows)."""
    pool = labels.get(NODE_POOL_LABEL)
    strategy = labels.get(MIG_STRATEGY_LABEL)
    if strategy == "mixed":
        return Placement("mixed", None, pool)
    if strategy != "single":
        return Placement("none", None, pool)
    product = labels.get(GPU_PRODUCT_LABEL, "")
    profile = _PROFILE_OF_PRODUCT.get(product)
    if profile is None:
        return (f"MIG strategy single with {GPU_PRODUCT_LABEL}={product!r}, not "
                "'<GPU>-MIG-<profile>' for a GPU and profile fairgate knows "
                "(see docs/architecture.md, placement classes)")
    return Placement("single", profile, pool)


def node_capacity(placement: Placement, gpus: Mapping[str, int]) -> dict[str, int]:
    """The capacity keys a node of ``placement`` offers, from its ``nvidia.com/*``
    allocatable by resource: what that placement's pods can use there (``single``
    nodes: their ``nvidia.com/gpu`` devices are MIG devices of the profile; ``none``
    nodes: MIG resources no pod's affinity reaches are left out)."""
    if placement.strategy == "single":
        assert placement.profile is not None
        units = gpus.get(resources.GPU, 0)
        counts = {resources.MIG_PREFIX + placement.profile: units} if units else {}
    elif placement.strategy == "none":
        counts = {name: n for name, n in gpus.items() if name == resources.GPU}
    else:
        counts = dict(gpus)
    return placement.keyed(counts)


def device_counts(placement: Placement, demand: Mapping[str, int]) -> dict[str, int]:
    """The ``nvidia.com/*`` devices (by short name) a pod of ``placement`` with accounted
    ``demand`` takes from its node: a ``single`` pod's MIG devices are ``gpu``."""
    if placement.strategy != "single":
        return dict(demand)
    return {resources.GPU: sum(demand.values())}


def profile_demand(raw: Mapping[str, int], profile: str) -> dict[str, int]:
    """The accounted demand of a pod labelled ``fairgate.io/mig-profile=<profile>`` whose
    ``nvidia.com/*`` demand is ``raw``; raises :class:`PlacementError` when the label
    cannot apply (unknown profile, MIG resources asked for, no ``nvidia.com/gpu``)."""
    name = resources.MIG_PREFIX + profile
    if not resources.is_known(name) or resources.normalise(name) != name:
        raise PlacementError(
            f"label {MIG_PROFILE_LABEL}={profile!r} is not a MIG profile fairgate knows: "
            "use one such as 1g.5gb, 3g.20gb, 1g.10gb.me (the profile in your nodes' "
            f"{GPU_PRODUCT_LABEL}, after '-MIG-')"
        )
    mig = sorted(k for k in raw if k != resources.GPU)
    if mig:
        raise PlacementError(
            f"label {MIG_PROFILE_LABEL} asks for a single-strategy MIG device, but the pod "
            f"also asks for {', '.join(resources.k8s_name(k) for k in mig)} (mixed strategy): "
            f"request nvidia.com/gpu only, or drop the label"
        )
    units = raw.get(resources.GPU, 0)
    if units <= 0:
        raise PlacementError(
            f"label {MIG_PROFILE_LABEL} is set but the pod asks for no nvidia.com/gpu: on "
            "single-strategy MIG nodes each nvidia.com/gpu is one MIG device; request "
            "nvidia.com/gpu (e.g. limits: {nvidia.com/gpu: 1}) or drop the label"
        )
    return {name: units}


def pod_placement(
    demand: Mapping[str, int], profile: str | None, pool: str | None,
) -> Placement:
    """The placement of a pod with accounted ``demand``, ``fairgate.io/mig-profile``
    label value ``profile`` (None: no label) in a tenant of node pool ``pool``."""
    pool = pool or None
    if profile is not None:
        return Placement("single", profile, pool)
    if any(name.startswith(resources.MIG_PREFIX) for name in demand):
        return Placement("mixed", None, pool)
    return Placement("none", None, pool)


def key_problem(key: str) -> str | None:
    """What is wrong with a capacity key written by hand (a trace's or the platform's
    ``capacity``), with how to fix it; None when it is one :meth:`Placement.key` makes."""
    resource, where = placement_of_key(key)
    hint = ("write <resource>[#single|#mixed][@<pool>], e.g. gpu, gpu@pool-a, "
            "mig-1g.5gb#single, gpu#mixed")
    if not resources.is_known(resource) or resources.normalise(resource) != resource:
        return f"{key!r}: unknown resource {resource!r}: use gpu or a MIG profile (mig-1g.5gb)"
    if where.pool is not None:
        try:
            check_node_pool(where.pool)
        except ValueError as exc:
            return f"{key!r}: {exc}"
    if where.strategy == "none" and resource != resources.GPU:
        return f"{key!r}: nodes without MIG offer only gpu: {hint}"
    if where.strategy == "single" and resource == resources.GPU:
        return f"{key!r}: single-strategy nodes offer MIG devices (mig-<profile>#single): {hint}"
    if where.key(resource) != key:
        return f"{key!r} is not a capacity key: {hint}"
    return None


def placement_of_key(key: str) -> tuple[str, Placement]:
    """Inverse of :meth:`Placement.key`: the resource and placement of a capacity key."""
    rest, in_pool, pool = key.partition(resources.POOL_SEP)
    resource, _, tag = rest.partition(resources.STRATEGY_SEP)
    strategy: Strategy = "single" if tag == "single" else "mixed" if tag == "mixed" else (
        "none" if resource == resources.GPU else "mixed")
    profile = resource[len(resources.MIG_PREFIX):] if strategy == "single" else None
    return resource, Placement(strategy, profile, pool if in_pool else None)
