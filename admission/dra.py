"""GPU demand a pod gets through Dynamic Resource Allocation (``resource.k8s.io/v1``).

Contract (docs/dra.md):
- A DeviceClass is accounted by a *rule* (platform config ``deviceClasses``, on top of
  :data:`tenants.models.DEFAULT_DEVICE_CLASSES`): ``gpu`` (each device a whole GPU),
  ``mig`` (each device a MIG device whose profile the request's selector names),
  ``mig-<profile>`` (each device that MIG profile) or ``none`` (not a GPU: not counted).
  A class with no rule whose name looks like a GPU class (:func:`looks_like_gpu`) cannot
  be accounted and is refused; other classes are not fairgate's business.
- Routes to a device, all counted:
  * a container resource ``deviceclass.resource.kubernetes.io/<class>: N`` (the implicit
    extended resource of every DeviceClass) or a DeviceClass's
    ``spec.extendedResourceName`` (KEP-5004): N devices of that class, under the same
    effective-request rule as ``nvidia.com/*`` (:mod:`admission.demand`);
  * ``spec.resourceClaims[].resourceClaimTemplateName``: the template's claim, per pod;
  * ``spec.resourceClaims[].resourceClaimName``: the shared claim, priced in full for
    every pod that references it; :func:`shared_claims` names it by uid, so that a
    tenant is charged for it once however many of its pods share it
    (:mod:`admission.sharing`).
- Per request: ``exactly`` with ``allocationMode: ExactCount`` (the default) counts
  ``count`` devices (default 1); ``adminAccess: true`` consumes nothing;
  ``allocationMode: All`` is refused (it cannot be bounded before allocation);
  ``firstAvailable`` counts its largest alternative, in slices.
- A ``mig`` class is priced with CEL (:mod:`admission.devices`): each device counts as the
  largest device the ResourceSlices publish that the class's and the request's selectors
  can be given. No such device published yet, or one fairgate cannot price, is refused.
  Selectors are never read as text.
- Objects, not names: :func:`priced_record` records, per claim entry of a pod, the kind,
  name and uid of the object it was priced from (the specs of both kinds are immutable,
  so the uid stands for the spec). :func:`release_check` decides, before a gate is lifted,
  whether the claims the pod will actually be allocated (a template's entry: the claim
  the resourceclaim controller generated for this pod) are still within what the pod
  was admitted for; :func:`allocated_demand` is what a pod's claims hold once allocated
  (``status.allocation``), never re-priced from a template.
- Every refusal is a :class:`DraError` whose message says what to change. The pod comes
  parsed (:class:`admission.pods.PodView`): an entry of ``spec.resourceClaims`` that
  names no object, or two, was refused there.
Pure: the DRA objects come in as :class:`DraObjects`, plain data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission.devices import Device, candidates, size_of
from admission.pods import CLAIM, TEMPLATE, ClaimKind, PodClaim, PodError, PodView, mapping
from tenants import resources
from tenants.models import (
    DEFAULT_DEVICE_CLASSES,
    MIG_RULE,
    NONE_RULE,
    PRICED_CLAIMS_ANNOTATION,
)
from tenants.resources import ResourceCounts

DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
MAX_REQUEST_DEVICES = 1_000_000

_GPU_LIKE = re.compile(r"gpu|mig|nvidia", re.IGNORECASE)

ClaimKey = tuple[str, str]  # (namespace, name)
DraKind = ClaimKind


class DraError(PodError):
    """A DRA request fairgate cannot account; the message says what to change."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One entry of a ResourceClaim's ``status.allocation.devices.results``."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False


@dataclass(frozen=True)
class DraObject:
    """A ResourceClaimTemplate (``spec`` is its ``spec.spec``) or a ResourceClaim as it is
    now: its uid; for a claim the uid of the Pod that owns it (a claim generated from a
    template, else ``""``) and its allocation (None while it has none)."""

    spec: Mapping[str, Any]
    uid: str = ""
    owner: str = ""
    allocation: tuple[AllocatedDevice, ...] | None = None


@dataclass(frozen=True)
class DraObjects:
    """The DRA objects a pod's demand depends on, as plain data.

    ``extended_names``: ``spec.extendedResourceName`` -> DeviceClass name, of the
    cluster's DeviceClasses; ``class_selectors``: DeviceClass name -> the CEL expressions
    of its ``spec.selectors``; ``templates`` and ``claims``: ``(namespace, name)`` -> a
    ResourceClaimTemplate or ResourceClaim; ``devices``: what the ResourceSlices publish.
    """

    extended_names: Mapping[str, str] = field(default_factory=dict)
    templates: Mapping[ClaimKey, DraObject] = field(default_factory=dict)
    claims: Mapping[ClaimKey, DraObject] = field(default_factory=dict)
    class_selectors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    devices: tuple[Device, ...] = ()


NO_OBJECTS = DraObjects()


@dataclass(frozen=True)
class DraContext:
    """What a pod's DRA demand is computed with: its namespace, the platform's class
    rules (:attr:`tenants.models.PlatformConfig.device_class_rules`) and the objects."""

    namespace: str = ""
    rules: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DEVICE_CLASSES))
    objects: DraObjects = NO_OBJECTS


def looks_like_gpu(device_class: str) -> bool:
    """Whether a DeviceClass without a rule must be refused rather than ignored: its name
    mentions gpu, mig or nvidia."""
    return bool(_GPU_LIKE.search(device_class))


def container_resource_class(name: str, context: DraContext) -> str | None:
    """The DeviceClass a container resource name asks for through DRA, or None."""
    if name.startswith(DEVICE_CLASS_PREFIX):
        return name[len(DEVICE_CLASS_PREFIX):]
    if name.startswith(resources.NVIDIA_PREFIX):
        return None  # device plugin first; the scheduler uses DRA only where it has none
    return context.objects.extended_names.get(name)


def class_resource(device_class: str, context: DraContext, where: str) -> str | None:
    """The resource one device of ``device_class`` is, for a request without a profile
    selector (None: not a GPU); a ``mig`` class refuses."""
    rule = _rule(device_class, context, where)
    if rule == MIG_RULE:
        raise DraError(
            f"{where}: DeviceClass {device_class!r} is MIG, and a container resource cannot "
            "say which profile: use a ResourceClaimTemplate whose request selects "
            'device.attributes["gpu.nvidia.com"].profile == "<profile>"'
        )
    return None if rule == NONE_RULE else rule


def claims_demand(pod: PodView, context: DraContext) -> ResourceCounts:
    """Devices of the pod's ``spec.resourceClaims`` (templates and shared claims), by
    resource (positive counts only), priced from the objects the pod names."""
    return _total(_claim_demand(found.spec, context, claim.where)
                  for claim, found in _resolved(pod, context, _named(context)))


def claim_spec_demand(spec: Mapping[str, Any], context: DraContext,
                      where: str) -> ResourceCounts:
    """Devices one claim spec (a claim's ``spec``, a template's ``spec.spec``) asks for,
    by resource; ``where`` names it in a refusal."""
    return {k: v for k, v in _claim_demand(spec, context, where).items() if v}


def priced_record(pod: PodView, context: DraContext) -> str:
    """The record of what the pod's claims were priced from: per entry of
    ``spec.resourceClaims``,
    ``<entry>=<ResourceClaim|ResourceClaimTemplate>/<name>/<uid>/<price>``, joined by
    ``,`` (empty for a pod without claims); ``<price>`` is the devices that object was
    priced at, ``gpu:3+mig-1g.5gb:1`` (``none`` for no GPU)."""
    return ",".join(
        f"{claim.name}={claim.kind}/{claim.object_name}/{found.uid}/"
        + ("+".join(f"{short}:{count}" for short, count in sorted(
            _claim_demand(found.spec, context, claim.where).items()) if count) or "none")
        for claim, found in _resolved(pod, context, _named(context)))


def _recorded_claims(pod: PodView) -> dict[str, tuple[str, str, ResourceCounts]]:
    """Per claim entry named in the pod's :func:`priced_record` (its
    ``fairgate.io/priced-claims`` stamp, immutable), the name, uid and price of the
    ResourceClaim it was priced from; an entry not recorded so is left out."""
    recorded: dict[str, tuple[str, str, ResourceCounts]] = {}
    for item in pod.annotations.get(PRICED_CLAIMS_ANNOTATION, "").split(","):
        entry, _, source = item.partition("=")
        parts = source.split("/")
        if len(parts) != 4 or parts[0] != CLAIM or not parts[2]:
            continue
        price: ResourceCounts = {}
        for part in parts[3].split("+") if parts[3] != "none" else ():
            short, _, count = part.partition(":")
            if not count.isdigit():
                break
            price[short] = int(count)
        else:
            recorded[entry] = (parts[1], parts[2], price)
    return recorded


def shared_claim_names(pod: PodView) -> dict[str, str]:
    """The name of each ResourceClaim the pod was priced from at admission (its
    ``fairgate.io/priced-claims`` stamp), by uid: what :func:`shared_claims` keys by."""
    return {uid: name for name, uid, _ in _recorded_claims(pod).values()}


@dataclass(frozen=True)
class Release:
    """The claims the pod will be allocated are within what it was admitted for."""


@dataclass(frozen=True)
class Wait:
    """Not decidable yet (a claim not generated or seen yet): ``reason`` says what for."""

    reason: str


@dataclass(frozen=True)
class Refuse:
    """The claims give the pod more than it was admitted for: ``reason`` says what."""

    reason: str


ReleaseVerdict = Release | Wait | Refuse


def release_check(pod: PodView, admitted: ResourceCounts,
                  context: DraContext) -> ReleaseVerdict:
    """Whether a pod admitted with claims priced at ``admitted`` (by resource) may be
    released: the claims it will actually be allocated are priced now, a template's entry
    by the claim generated for this pod (owned by its uid, named in
    ``status.resourceClaimStatuses``), a named claim by the claim of that name now. A
    claim not there yet is a :class:`Wait`; a price above ``admitted`` in any resource,
    or one that cannot be priced any more, is a :class:`Refuse`."""
    try:
        actual = _total(_claim_demand(found.spec, context, claim.where)
                        for claim, found in _resolved(pod, context, _actual(pod, context)))
    except _Missing as missing:
        return Wait(str(missing))
    except PodError as error:
        return Refuse(f"its claims cannot be priced any more: {error}")
    if exceeds(actual, admitted):
        return Refuse(
            f"its claims now ask for {resources.format_counts(actual)} but it was admitted "
            f"for {resources.format_counts(admitted) or 'none'}: a ResourceClaim or "
            "ResourceClaimTemplate it names was replaced by a larger one"
        )
    return Release()


def exceeds(asks: ResourceCounts, priced: ResourceCounts) -> bool:
    """Whether ``asks`` is more than ``priced`` for any resource."""
    return any(count > priced.get(short, 0) for short, count in asks.items())


def allocated_demand(pod: PodView, context: DraContext) -> ResourceCounts | None:
    """The devices the pod's claims were allocated (``status.allocation``), by resource;
    None while any claim of the pod is not there or not allocated. A device counts by its
    request's DeviceClass rule (a ``mig`` class: the device's own profile, as published;
    a device no slice publishes any more counts as a whole GPU); admin access is free."""
    try:
        claims = list(_resolved(pod, context, _actual(pod, context)))
    except (_Missing, PodError):
        return None
    if any(claim.allocation is None for _, claim in claims):
        return None
    return _total(_allocated(claim, context) for _, claim in claims)


def _allocated(claim: DraObject, context: DraContext) -> ResourceCounts:
    """The devices ``claim`` was allocated, by resource (none before allocation)."""
    total: ResourceCounts = {}
    for device in claim.allocation or ():
        short = _allocated_resource(claim.spec, device, context)
        if short is not None:
            total[short] = total.get(short, 0) + 1
    return total


def shared_claims(pod: PodView, context: DraContext) -> dict[str, ResourceCounts]:
    """The ResourceClaims the pod names by name (shared claims, not made from a
    template), by the uid of the claim it was priced from at admission (its
    :func:`priced_record`): the devices each gives, the larger, per resource, of that
    price and what the claim of that uid was allocated. A claim deleted, or made again
    under the same name (a new uid: another claim), keeps its recorded uid and price. A
    pod without that record (admitted before fairgate recorded prices) shares by the
    claim of that name now; one not there or that cannot be priced is left out (the pod
    is then charged for it in full, alone)."""
    recorded = _recorded_claims(pod)
    shared: dict[str, ResourceCounts] = {}
    for claim in pod.claims:
        found = context.objects.claims.get((context.namespace, claim.object_name))
        if claim.kind != CLAIM:
            continue
        if claim.name in recorded:
            _, uid, priced = recorded[claim.name]
        elif found is not None and found.uid:
            uid = found.uid
            try:
                priced = claim_spec_demand(found.spec, context, claim.where)
            except PodError:
                continue
        else:
            continue
        held = _allocated(found, context) if found is not None and found.uid == uid else {}
        shared[uid] = {r: max(priced.get(r, 0), held.get(r, 0)) for r in {*priced, *held}}
    return shared


def _allocated_resource(spec: Mapping[str, Any], device: AllocatedDevice,
                        context: DraContext) -> str | None:
    if device.admin_access:
        return None
    device_class = _request_class(spec, device.request)
    rule = context.rules.get(device_class or "")
    if rule is None:
        rule = "gpu" if device_class is None or looks_like_gpu(device_class) else NONE_RULE
    if rule == NONE_RULE:
        return None
    if rule != MIG_RULE:
        return rule
    published = next((d for d in context.objects.devices
                      if (d.driver, d.pool, d.name) == (device.driver, device.pool,
                                                         device.device)), None)
    return published.resource if published and published.resource else "gpu"


def _request_class(spec: Mapping[str, Any], request: str) -> str | None:
    """The DeviceClass of a result's request (``<request>`` or ``<request>/<sub>``)."""
    name, _, sub = request.partition("/")
    for raw in ((spec.get("devices") or {}).get("requests") or []):
        if not isinstance(raw, Mapping) or raw.get("name") != name:
            continue
        if not sub:
            return str((raw.get("exactly") or {}).get("deviceClassName") or "") or None
        for alternative in raw.get("firstAvailable") or []:
            if isinstance(alternative, Mapping) and alternative.get("name") == sub:
                return str(alternative.get("deviceClassName") or "") or None
    return None


def _total(parts: Iterator[ResourceCounts] | Sequence[ResourceCounts]) -> ResourceCounts:
    total: ResourceCounts = {}
    for part in parts:
        for short, count in part.items():
            total[short] = total.get(short, 0) + count
    return {k: v for k, v in total.items() if v}


def referenced_objects(pod: PodView) -> tuple[frozenset[str], frozenset[str]]:
    """The ResourceClaimTemplate names and ResourceClaim names the pod's
    ``spec.resourceClaims`` refer to."""
    return (frozenset(c.object_name for c in pod.claims if c.kind == TEMPLATE),
            frozenset(c.object_name for c in pod.claims if c.kind == CLAIM))


def _rule(device_class: str, context: DraContext, where: str) -> str:
    rule = context.rules.get(device_class)
    if rule is not None:
        return rule
    if looks_like_gpu(device_class):
        raise DraError(
            f"{where}: DeviceClass {device_class!r} looks like a GPU class, and fairgate does "
            "not know how to count it: ask your platform team to map it in fairgate-platform "
            "(deviceClasses: {" + device_class + ": gpu}, or mig, mig-<profile>, none)"
        )
    return NONE_RULE


class _Missing(DraError):
    """A claim the pod needs is not there yet."""


Resolver = Callable[[str, str, str], DraObject | None]
"""(entry name, kind, object name) -> the object that entry gets, or None."""


def _named(context: DraContext) -> Resolver:
    """Resolve an entry by the object it names (admission)."""
    def resolve(_entry: str, kind: str, name: str) -> DraObject | None:
        store = context.objects.templates if kind == TEMPLATE else context.objects.claims
        return store.get((context.namespace, name))

    return resolve


def _actual(pod: PodView, context: DraContext) -> Resolver:
    """Resolve an entry by the claim the pod will be allocated: a template's by the claim
    generated for this pod (``status.resourceClaimStatuses``), owned by its uid."""
    def resolve(entry: str, kind: str, name: str) -> DraObject | None:
        if kind == TEMPLATE:
            claim_name = pod.claim_statuses.get(entry)
            found = context.objects.claims.get((context.namespace, str(claim_name)))
            if not claim_name or found is None or found.owner != pod.uid:
                raise _Missing(f"the ResourceClaim generated from {kind} {name!r} for "
                               f"claim {entry!r}")
            return found
        found = context.objects.claims.get((context.namespace, name))
        if found is None:
            raise _Missing(f"ResourceClaim {name!r}")
        return found

    return resolve


def _resolved(pod: PodView, context: DraContext,
              resolve: Resolver) -> Iterator[tuple[PodClaim, DraObject]]:
    """Per entry of ``spec.resourceClaims``, the object ``resolve`` gives it; refuses an
    entry whose object is not there."""
    for claim in pod.claims:
        found = resolve(claim.name, claim.kind, claim.object_name)
        if found is None:
            raise DraError(
                f"{claim.where}: {claim.kind} {claim.object_name!r} not found in namespace "
                f"{context.namespace!r}: create the {claim.kind} first, then the pod "
                "(fairgate counts the devices it asks for at admission)"
            )
        yield claim, found


def _claim_demand(claim_spec: Mapping[str, Any], context: DraContext,
                  where: str) -> ResourceCounts:
    devices = mapping(claim_spec.get("devices"), f"{where}: devices")
    requests = devices.get("requests") or []
    if not isinstance(requests, list):
        raise DraError(f"{where}: devices.requests must be a list")
    total: ResourceCounts = {}
    for index, raw in enumerate(requests):
        request = mapping(raw, f"{where}: devices.requests[{index}]")
        at = f"{where}, request {request.get('name') or index!r}"
        for short, count in _request_demand(request, context, at).items():
            total[short] = total.get(short, 0) + count
    return total


def _request_demand(request: Mapping[str, Any], context: DraContext,
                    where: str) -> ResourceCounts:
    exactly = request.get("exactly")
    alternatives = request.get("firstAvailable")
    if exactly is not None:
        return _exact_demand(mapping(exactly, f"{where}: exactly"), context, where)
    if alternatives is not None:
        if not isinstance(alternatives, list) or not alternatives:
            raise DraError(f"{where}: firstAvailable must be a non-empty list")
        options = [
            _exact_demand(mapping(sub, f"{where}: firstAvailable[{i}]"), context,
                          f"{where}, alternative {i}")
            for i, sub in enumerate(alternatives)
        ]
        return max(options, key=resources.total_slices)
    raise DraError(f"{where}: a request needs exactly or firstAvailable")


def _exact_demand(exact: Mapping[str, Any], context: DraContext,
                  where: str) -> ResourceCounts:
    device_class = exact.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        raise DraError(f"{where}: deviceClassName is required")
    rule = _rule(device_class, context, where)
    if rule == NONE_RULE or exact.get("adminAccess") is True:
        return {}
    mode = exact.get("allocationMode") or "ExactCount"
    if mode == "All":
        raise DraError(
            f"{where}: allocationMode All asks for every matching device, which fairgate "
            "cannot bound before allocation: use allocationMode ExactCount with a count"
        )
    if mode != "ExactCount":
        raise DraError(f"{where}: unknown allocationMode {mode!r}: use ExactCount")
    count = exact.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= (
            MAX_REQUEST_DEVICES):
        raise DraError(f"{where}: count must be a whole number from 0 to "
                       f"{MAX_REQUEST_DEVICES}, got {count!r}")
    short = _mig_resource(exact, device_class, context, where) if rule == MIG_RULE else rule
    return {short: count} if count else {}


def _mig_resource(exact: Mapping[str, Any], device_class: str, context: DraContext,
                  where: str) -> str:
    """The largest device the class's and the request's selectors can be given."""
    expressions = [*context.objects.class_selectors.get(device_class, ()),
                   *_selector_expressions(exact, where)]
    found = candidates(expressions, context.objects.devices)
    if not found:
        raise DraError(
            f"{where}: no ResourceSlice publishes a device of DeviceClass {device_class!r} "
            "that its selectors can be given, so fairgate cannot tell what it would get: "
            "check the selector, or create the pod once the driver publishes such devices"
        )
    unknown = sorted({f"{d.driver}/{d.pool}/{d.name}" for d in found if d.resource is None})
    if unknown:
        raise DraError(
            f"{where}: its selectors can be given device {unknown[0]}, which fairgate cannot "
            "count (not a GPU or MIG profile it knows): select the profile, e.g. "
            'device.attributes["gpu.nvidia.com"].profile == "1g.5gb"'
        )
    return max((d.resource for d in found if d.resource), key=size_of)


def _selector_expressions(exact: Mapping[str, Any], where: str) -> list[str]:
    expressions = []
    for index, raw in enumerate(exact.get("selectors") or []):
        selector = mapping(raw, f"{where}: selectors[{index}]")
        cel = mapping(selector.get("cel"), f"{where}: selectors[{index}].cel")
        expression = cel.get("expression")
        if not isinstance(expression, str):
            raise DraError(f"{where}: selectors[{index}].cel.expression must be a string")
        expressions.append(expression)
    return expressions
