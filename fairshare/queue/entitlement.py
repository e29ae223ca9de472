"""Weighted fair entitlements by water-filling (invariant 3 in docs/reference.md).

Contract:
- :func:`water_fill` divides ``capacity`` among tenants in proportion to their weights,
  except that no tenant gets more than its cap (what it asks for, or what its quota
  lets it use); what a capped tenant leaves is shared again among the others, by
  weight, until nobody is capped or nothing is left. The result sums to
  ``min(capacity, sum of caps)`` (up to float rounding). With ``floors`` every tenant
  first gets its floor (at most its cap; floors that do not fit are shared by weight,
  each up to its floor), and only the rest is shared by weight: a tenant whose weighted
  share is below its floor is entitled to its floor.
- Entitlements are for reporting and checking fairness (metrics, ``status``,
  ``simulate``, the property tests): floats are fine here; quota arithmetic stays in
  integer slices elsewhere.
- :func:`jain_index` is Jain's fairness index of the given values: 1.0 when all are
  equal, 1/n when one value takes everything; 1.0 for no values or all zero.
- :func:`entitled_jain` (printed by :func:`jain_text`) is the one fairness figure every
  surface shows (the gauge, ``fairgate status``, the console, ``fairgate simulate``'s
  headline and window): Jain's
  index of used / entitlement over the tenants entitled to something, or None ("n/a")
  when it says nothing: fewer than two such tenants (one tenant is always "fair" to
  itself, even holding nothing of what it is owed), or none of them uses anything.
  A backlogged tenant holding 0 of its entitlement beside one holding all of its own
  reads 0.5, not 1.
- :func:`fairness` is the one computation behind the fairness gauges, ``fairgate
  status`` and ``fairgate simulate --timeline``: from each tenant's :class:`TenantLoad`
  (usage, queued demand, quota limit, weight) and the cluster capacity, per tenant its
  entitlement (GPU-equivalents, water-filled over the capacity among tenants with
  demand, each capped at what it uses plus what it has queued, and at nominal plus
  borrow limit; inference goes ahead of training, so a tenant's inference demand, held
  or queued, is its floor, and the tenants share the rest by weight), its weighted
  share (GPU-equivalents used per unit of weight), and :func:`entitled_jain` (1.0
  when every tenant entitled to something holds exactly its entitlement, whatever the
  weights or caps; None when not defined).
  With the capacity and every tenant's demand per capacity key (placement class: ``gpu``,
  ``gpu@pool-a``, ``mig-1g.5gb``), each class is water-filled on its own and a
  tenant's entitlement is the sum over classes (at most its limit): no tenant is
  entitled to more of a class than the class has, nor to a class it does not ask for.
  :func:`snapshot_fairness` applies it per class to a
  :class:`~fairshare.queue.model.QueueSnapshot`, as ``fairgate simulate`` does to its
  simulated cluster; :func:`slices_by_key` turns units per capacity key into the slices
  per key both pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fairshare.queue.model import QueueSnapshot
from tenants.resources import SLICES_PER_GPU, slices_of, total_slices


def water_fill(
    capacity: float, weights: Mapping[str, float], caps: Mapping[str, float | None],
    floors: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each tenant's entitlement out of ``capacity``.

    ``weights``: tenant -> weight (> 0); ``caps``: tenant -> the most it can use
    (``None`` or missing: no limit); ``floors``: tenant -> what it gets before the rest
    is shared by weight (missing: 0). Raises ValueError for a weight <= 0 or a negative
    capacity, cap or floor.
    """
    if floors:
        if any(f < 0 for f in floors.values()):
            raise ValueError(f"floors must be >= 0, got {dict(floors)}")
        least = {t: min(floors.get(t, 0.0), c) if (c := caps.get(t)) is not None
                 else floors.get(t, 0.0) for t in weights}
        if sum(least.values()) >= capacity:
            return water_fill(capacity, weights, least)
        # raise every tenant whose weighted share falls below its floor to that floor
        # and share what is left among the others, until no share is below its floor
        fixed: dict[str, float] = {}
        while True:
            rest = {t: w for t, w in weights.items() if t not in fixed}
            # (the fixed floors fit, but their sum may round a hair above the capacity)
            share = water_fill(max(0.0, capacity - sum(fixed.values())), rest, caps)
            below = {t for t, s in share.items() if s < least[t]}
            if not below:
                return {**share, **fixed}
            fixed.update({t: least[t] for t in below})
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    for tenant, weight in weights.items():
        if weight <= 0:
            raise ValueError(f"weight of {tenant} must be > 0, got {weight}")
        cap = caps.get(tenant)
        if cap is not None and cap < 0:
            raise ValueError(f"cap of {tenant} must be >= 0, got {cap}")
    share = {tenant: 0.0 for tenant in weights}
    open_ = set(weights)
    left = float(capacity)
    while open_ and left > 1e-12:
        level = left / sum(weights[t] for t in open_)
        capped = {
            t for t in open_
            if (cap := caps.get(t)) is not None and cap - share[t] <= weights[t] * level
        }
        if not capped:
            for t in open_:
                share[t] += weights[t] * level
            break
        for t in capped:
            cap = caps[t]
            assert cap is not None
            left -= cap - share[t]
            share[t] = float(cap)
        open_ -= capped
    return share


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2)."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


def entitled_jain(of_entitlement: Iterable[float | None]) -> float | None:
    """Jain's index of the tenants' used / entitlement ratios (None: entitled to
    nothing, left out); None when fewer than two are entitled or none uses anything."""
    xs = [x for x in of_entitlement if x is not None]
    if len(xs) < 2 or not any(xs):
        return None
    return jain_index(xs)


@dataclass(frozen=True)
class TenantLoad:
    """What one tenant holds and asks for, in slices.

    ``limit_slices``: the most its quota lets it hold (nominal + borrow limit), None
    for no limit. ``inference_slices``: the part of used + queued that is inference.
    ``by_key``: used + queued per capacity key (placement class), and
    ``inference_by_key`` the inference part of it (None: not known per class).
    """

    weight: float
    used_slices: int
    queued_slices: int
    limit_slices: int | None = None
    inference_slices: int = 0
    by_key: Mapping[str, int] | None = None
    inference_by_key: Mapping[str, int] | None = None


@dataclass(frozen=True)
class TenantFairness:
    """One tenant against its fair share; every amount in GPU-equivalents."""

    weight: float
    used: float
    demand: float  # used + queued
    entitlement: float
    weighted_share: float  # used / weight

    @property
    def of_entitlement(self) -> float | None:
        """``used / entitlement`` (None when entitled to nothing)."""
        return self.used / self.entitlement if self.entitlement > 0 else None


@dataclass(frozen=True)
class Fairness:
    """Per-tenant fair shares out of ``capacity`` (GPU-equivalents), and
    :func:`entitled_jain` of them (None: not defined)."""

    capacity: float
    tenants: dict[str, TenantFairness]
    jain_index: float | None


def _entitled(capacity: float, loads: Mapping[str, TenantLoad], demand: Mapping[str, float],
              inference: Mapping[str, float]) -> dict[str, float]:
    """Water-fill ``capacity`` (GPU-equivalents) among the tenants with ``demand``, each
    capped at it and at its limit, its ``inference`` first."""
    gpu = float(SLICES_PER_GPU)
    wanting = {name for name, d in demand.items() if d > 0}
    caps: dict[str, float | None] = {
        name: min(demand[name], limit / gpu)
        if (limit := loads[name].limit_slices) is not None else demand[name]
        for name in wanting
    }
    return water_fill(capacity, {name: loads[name].weight for name in wanting}, caps,
                      {name: inference.get(name, 0.0) for name in wanting})


def fairness(capacity_slices: int, loads: Mapping[str, TenantLoad],
             capacity_by_key: Mapping[str, int] | None = None) -> Fairness:
    """Entitlements, weighted shares and Jain's index (see the module docstring).

    With ``capacity_by_key`` (slices per capacity key) and every load's ``by_key``, each
    placement class is water-filled on its own, so no tenant is entitled to more of a
    class than it has; a tenant's entitlement is the sum over classes, at most its limit.
    """
    gpu = float(SLICES_PER_GPU)
    demand = {name: (load.used_slices + load.queued_slices) / gpu
              for name, load in loads.items()}
    if capacity_by_key is None or any(load.by_key is None for load in loads.values()):
        entitled = _entitled(capacity_slices / gpu, loads, demand,
                             {name: load.inference_slices / gpu
                              for name, load in loads.items()})
    else:
        entitled = {}
        keys = set(capacity_by_key).union(*(load.by_key or {} for load in loads.values()))
        for key in sorted(keys):
            share = _entitled(
                capacity_by_key.get(key, 0) / gpu, loads,
                {name: (load.by_key or {}).get(key, 0) / gpu for name, load in loads.items()},
                {name: (load.inference_by_key or {}).get(key, 0) / gpu
                 for name, load in loads.items()})
            for name, amount in share.items():
                entitled[name] = entitled.get(name, 0.0) + amount
        for name, load in loads.items():
            if name in entitled and load.limit_slices is not None:
                entitled[name] = min(entitled[name], load.limit_slices / gpu)
    tenants = {
        name: TenantFairness(
            weight=load.weight, used=load.used_slices / gpu, demand=demand[name],
            entitlement=entitled.get(name, 0.0),
            weighted_share=load.used_slices / gpu / load.weight,
        )
        for name, load in loads.items()
    }
    return Fairness(capacity_slices / gpu, tenants,
                    entitled_jain(t.of_entitlement for t in tenants.values()))


def slices_by_key(*counts: Mapping[str, int]) -> dict[str, int]:
    """Units per capacity key, summed over ``counts``, as slices per key (what
    :func:`fairness` takes per class)."""
    out: dict[str, int] = {}
    for each in counts:
        for key, units in each.items():
            out[key] = out.get(key, 0) + units * slices_of(key)
    return out


def snapshot_fairness(snapshot: QueueSnapshot) -> Fairness:
    """:func:`fairness` of a queue snapshot, per placement class (each capacity key of
    the capacity, the tenants' running units and their queued units): limits are
    nominal + borrow limit, inference is the inference band (running and queued)."""
    loads = {
        s.tenant: TenantLoad(
            s.weight, s.used_slices, snapshot.queued_slices.get(s.tenant, 0),
            s.nominal_slices + s.borrow_limit_slices,
            s.inference_slices + snapshot.queued_inference_slices.get(s.tenant, 0),
            slices_by_key(s.running_by_key, snapshot.queued_by_key.get(s.tenant, {})),
            slices_by_key(s.running_inference_by_key,
                        snapshot.queued_inference_by_key.get(s.tenant, {})))
        for s in snapshot.tenants
    }
    return fairness(total_slices(snapshot.capacity), loads, slices_by_key(snapshot.capacity))


def jain_text(index: float | None, digits: int = 4) -> str:
    """:func:`entitled_jain` for people: ``0.9871``, or ``n/a`` when not defined."""
    return "n/a" if index is None else f"{index:.{digits}f}"
