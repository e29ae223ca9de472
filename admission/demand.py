"""A pod's GPU demand, following Kubernetes' effective-request rule.

Contract:
- NVIDIA extended resources count (``nvidia.com/gpu`` and ``nvidia.com/mig-<profile>``),
  and so do GPUs through DRA (:mod:`admission.dra`: DeviceClass extended resources in
  containers, ResourceClaimTemplates and ResourceClaims); everything else (cpu, memory,
  other vendors) is ignored.
- Per container and resource name, the amount comes from ``limits``; if only ``requests`` names it,
  from ``requests``; if both name it they must be equal. Amounts are Kubernetes quantities
  and must be whole, non-negative numbers (GPUs and MIG devices are whole devices).
- Per resource, the pod's demand is the larger of
  (a) the sum over app containers plus every restartable init container (sidecar,
      ``restartPolicy: Always``), and
  (b) for each regular init container, its amount plus the amounts of the sidecars
      listed before it in ``initContainers`` (and, for each sidecar, the sum of the
      sidecars up to and including it).
  This is the computation of Kubernetes' ``PodRequests`` for extended resources.
- A pod labelled ``fairgate.io/mig-profile: <profile>`` runs on ``single``-strategy MIG
  nodes of that profile (:mod:`tenants.placement`), where each ``nvidia.com/gpu`` is one
  MIG device: its ``gpu`` demand is accounted as ``mig-<profile>``. The label on a pod
  asking for MIG resources or no ``nvidia.com/gpu``, or naming an unknown profile, is a
  :class:`DemandError`.
- Zero amounts are no demand: the result holds only positive counts, keyed by short name
  (``gpu``, ``mig-1g.5gb``). An empty result means the pod asks for no GPU.
- Any problem (unknown NVIDIA resource or MIG profile, fractional, negative or absurd
  (over :data:`MAX_DEVICES`) count,
  requests != limits) raises :class:`DemandError` naming the container and resource; no
  other exception type escapes. The pod comes parsed (:class:`admission.pods.PodView`):
  one not shaped like a Pod was refused there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from admission.dra import (
    DraContext,
    DraError,
    allocated_demand,
    claims_demand,
    class_resource,
    container_resource_class,
)
from admission.pods import Container, PodError, PodView
from admission.quantity import QuantityError, parse_quantity
from tenants import placement, resources
from tenants.resources import ResourceCounts

NO_DRA = DraContext()
MAX_DEVICES = 1_000_000


class DemandError(PodError):
    """A pod whose GPU demand cannot be determined; the message says what to fix."""


def _resource_name(name: str, where: str, dra: DraContext) -> str | None:
    device_class = container_resource_class(name, dra)
    if device_class is not None:
        return class_resource(device_class, dra, where)
    short = resources.short_name(name)
    if short is None:
        return None
    if resources.is_known(short):
        return short
    if short.startswith(resources.MIG_PREFIX):
        raise DemandError(
            f"{where}: unknown MIG profile {short[len(resources.MIG_PREFIX) :]!r} in {name!r}: "
            "use a profile of your GPUs, e.g. nvidia.com/mig-1g.5gb, nvidia.com/mig-3g.40gb"
        )
    raise DemandError(
        f"{where}: unknown NVIDIA resource {name!r}: fairgate accounts nvidia.com/gpu and "
        "nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb)"
    )


def _count(name: str, value: Any, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise DemandError(f"{where}: {name}: {exc}") from exc
    if abs(amount) > MAX_DEVICES:
        raise DemandError(f"{where}: {name} is out of range (at most {MAX_DEVICES} devices)")
    if amount < 0:
        raise DemandError(f"{where}: {name} is {value!r}: a device count cannot be negative")
    if amount.denominator != 1:
        raise DemandError(
            f"{where}: {name} is {value!r}: GPUs and MIG devices are whole devices; "
            "ask for a whole number such as 1"
        )
    return int(amount)


def _container_demand(container: Container, dra: DraContext) -> ResourceCounts:
    where, limits, requests = container.where, container.limits, container.requests
    demand: ResourceCounts = {}
    for name in sorted(limits.keys() | requests.keys()):
        short = _resource_name(name, where, dra)
        if short is None:
            continue
        if name in limits:
            count = _count(name, limits[name], where)
            if name in requests and _count(name, requests[name], where) != count:
                raise DemandError(
                    f"{where}: {name} requests ({requests[name]}) differ from limits "
                    f"({limits[name]}): for GPUs set them equal, or set only limits"
                )
        else:
            count = _count(name, requests[name], where)
        if count:
            demand[short] = demand.get(short, 0) + count
    return demand


def _add(total: ResourceCounts, more: Mapping[str, int]) -> None:
    for name, n in more.items():
        total[name] = total.get(name, 0) + n


def _max_into(total: ResourceCounts, other: Mapping[str, int]) -> None:
    for name, n in other.items():
        total[name] = max(total.get(name, 0), n)


def _effective_demand(
    app: Iterable[Mapping[str, int]], init: Iterable[tuple[Mapping[str, int], bool]]
) -> ResourceCounts:
    total: ResourceCounts = {}
    for counts in app:
        _add(total, counts)
    sidecars: ResourceCounts = {}
    init_peak: ResourceCounts = {}
    for counts, sidecar in init:
        if sidecar:
            _add(total, counts)
            _add(sidecars, counts)
            _max_into(init_peak, sidecars)
        else:
            running = dict(sidecars)
            _add(running, counts)
            _max_into(init_peak, running)
    _max_into(total, init_peak)
    return {name: n for name, n in total.items() if n}


def pod_demand(pod: PodView, dra: DraContext = NO_DRA) -> ResourceCounts:
    """The pod's accounted GPU demand by short resource name (positive counts only):
    device-plugin resources and DRA devices (:mod:`admission.dra`), looked up in ``dra``."""
    return _labelled(pod, _device_demand(pod, dra, claims=True))


def container_demand(pod: PodView, dra: DraContext = NO_DRA) -> ResourceCounts:
    """:func:`pod_demand` without ``spec.resourceClaims``: what the pod's containers ask
    for, which (unlike the objects its claims name) cannot change after CREATE."""
    return _labelled(pod, _device_demand(pod, dra, claims=False))


def held_demand(pod: PodView, dra: DraContext) -> ResourceCounts:
    """The GPUs a pod holds: its containers' (:func:`container_demand`) and the devices
    its DRA claims were allocated (:func:`admission.dra.allocated_demand`; none before
    allocation), never re-priced from the objects its claims name."""
    held = dict(container_demand(pod, dra))
    for short, count in (allocated_demand(pod, dra) or {}).items():
        held[short] = held.get(short, 0) + count
    return held


def _labelled(pod: PodView, raw: ResourceCounts) -> ResourceCounts:
    profile = pod.labels.get(placement.MIG_PROFILE_LABEL)
    if profile is None:
        return raw
    try:
        return placement.profile_demand(raw, profile)
    except placement.PlacementError as exc:
        raise DemandError(str(exc)) from exc


def _device_demand(pod: PodView, dra: DraContext, claims: bool) -> ResourceCounts:
    """The pod's effective demand by short resource name (positive counts only), as the
    scheduler counts it on a node (no label applied): containers' resources under the
    effective-request rule, plus (with ``claims``) the devices of its resource claims."""
    try:
        app = [_container_demand(c, dra) for c in pod.containers]
        init = [(_container_demand(c, dra), c.sidecar) for c in pod.init_containers]
        demand = _effective_demand(app, init)
        if claims:
            _add(demand, claims_demand(pod, dra))
    except DemandError:
        raise
    except DraError as exc:
        raise DemandError(str(exc)) from exc
    return demand
