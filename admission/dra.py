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
  * ``spec.resourceClaims[].resourceClaimName``: the shared claim, charged in full to
    every pod that references it (never less than what runs).
- Per request: ``exactly`` with ``allocationMode: ExactCount`` (the default) counts
  ``count`` devices (default 1); ``adminAccess: true`` consumes nothing;
  ``allocationMode: All`` is refused (it cannot be bounded before allocation);
  ``firstAvailable`` counts its largest alternative, in slices.
- A ``mig`` class needs the request's CEL selectors to pin the profile with a conjunct
  ``device.attributes["<domain>"].profile == "<profile>"``; an expression with ``||``
  or no such conjunct cannot be mapped and is refused.
- Every refusal is a :class:`DraError` whose message says what to change.
Pure: the DRA objects come in as :class:`DraObjects`, plain data.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from admission import pods
from tenants import resources
from tenants.models import DEFAULT_DEVICE_CLASSES, MIG_RULE, NONE_RULE
from tenants.resources import ResourceCounts

DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
MAX_REQUEST_DEVICES = 1_000_000

_PROFILE = re.compile(
    r"""^\s*device\.attributes\[\s*["']([\w.\-/]+)["']\s*\]\s*\.\s*profile\s*==\s*"""
    r"""["']([\w.+\-]+)["']\s*$"""
)
_GPU_LIKE = re.compile(r"gpu|mig|nvidia", re.IGNORECASE)

ClaimKey = tuple[str, str]  # (namespace, name)


class DraError(pods.PodError):
    """A DRA request fairgate cannot account; the message says what to change."""


@dataclass(frozen=True)
class DraObjects:
    """The DRA objects a pod's demand depends on, as plain JSON.

    ``extended_names``: ``spec.extendedResourceName`` -> DeviceClass name, of the
    cluster's DeviceClasses; ``templates``: ``(namespace, name)`` -> a
    ResourceClaimTemplate's ``spec.spec``; ``claims``: ``(namespace, name)`` -> a
    ResourceClaim's ``spec``.
    """

    extended_names: Mapping[str, str] = field(default_factory=dict)
    templates: Mapping[ClaimKey, Mapping[str, Any]] = field(default_factory=dict)
    claims: Mapping[ClaimKey, Mapping[str, Any]] = field(default_factory=dict)


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


def claims_demand(pod: object, context: DraContext) -> ResourceCounts:
    """Devices of the pod's ``spec.resourceClaims`` (templates and shared claims), by
    resource (positive counts only)."""
    total: ResourceCounts = {}
    for where, claim_spec in _pod_claims(pod, context):
        for short, count in _claim_demand(claim_spec, context, where).items():
            total[short] = total.get(short, 0) + count
    return {k: v for k, v in total.items() if v}


def claim_spec_demand(spec: Mapping[str, Any], context: DraContext,
                      where: str) -> ResourceCounts:
    """Devices of one ResourceClaim spec (a template's ``spec.spec``) by resource, as
    a pod naming it is charged (positive counts only); :class:`DraError` (or its base
    :class:`~admission.pods.PodError`) when fairgate cannot price it."""
    return {k: v for k, v in _claim_demand(spec, context, where).items() if v}


def referenced_objects(pod: object) -> tuple[frozenset[str], frozenset[str]]:
    """The ResourceClaimTemplate names and ResourceClaim names the pod's
    ``spec.resourceClaims`` refer to (entries that are not well formed are skipped here:
    :func:`claims_demand` refuses them)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    entries = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    templates: set[str] = set()
    claims: set[str] = set()
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping):
            if isinstance(entry.get("resourceClaimTemplateName"), str):
                templates.add(entry["resourceClaimTemplateName"])
            if isinstance(entry.get("resourceClaimName"), str):
                claims.add(entry["resourceClaimName"])
    return frozenset(templates), frozenset(claims)


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


def _pod_claims(pod: object, context: DraContext) -> Iterator[tuple[str, Mapping[str, Any]]]:
    spec = pods.mapping(pods.mapping(pod, "pod").get("spec"), "spec")
    entries = spec.get("resourceClaims")
    if entries is None:
        return
    if not isinstance(entries, list):
        raise DraError("spec.resourceClaims must be a list")
    for index, raw in enumerate(entries):
        entry = pods.mapping(raw, f"spec.resourceClaims[{index}]")
        where = f"resource claim {entry.get('name') or index!r}"
        template = entry.get("resourceClaimTemplateName")
        claim = entry.get("resourceClaimName")
        if template and claim:
            raise DraError(f"{where}: name either resourceClaimName or "
                           "resourceClaimTemplateName, not both")
        if template:
            found = context.objects.templates.get((context.namespace, str(template)))
            kind, name = "ResourceClaimTemplate", template
        elif claim:
            found = context.objects.claims.get((context.namespace, str(claim)))
            kind, name = "ResourceClaim", claim
        else:
            raise DraError(f"{where}: name a resourceClaimName or a resourceClaimTemplateName")
        if found is None:
            raise DraError(
                f"{where}: {kind} {name!r} not found in namespace {context.namespace!r}: "
                f"create the {kind} first, then the pod (fairgate counts the devices it asks "
                "for at admission)"
            )
        yield where, found


def _claim_demand(claim_spec: Mapping[str, Any], context: DraContext,
                  where: str) -> ResourceCounts:
    devices = pods.mapping(claim_spec.get("devices"), f"{where}: devices")
    requests = devices.get("requests") or []
    if not isinstance(requests, list):
        raise DraError(f"{where}: devices.requests must be a list")
    total: ResourceCounts = {}
    for index, raw in enumerate(requests):
        request = pods.mapping(raw, f"{where}: devices.requests[{index}]")
        at = f"{where}, request {request.get('name') or index!r}"
        for short, count in _request_demand(request, context, at).items():
            total[short] = total.get(short, 0) + count
    return total


def _request_demand(request: Mapping[str, Any], context: DraContext,
                    where: str) -> ResourceCounts:
    exactly = request.get("exactly")
    alternatives = request.get("firstAvailable")
    if exactly is not None:
        return _exact_demand(pods.mapping(exactly, f"{where}: exactly"), context, where)
    if alternatives is not None:
        if not isinstance(alternatives, list) or not alternatives:
            raise DraError(f"{where}: firstAvailable must be a non-empty list")
        options = [
            _exact_demand(pods.mapping(sub, f"{where}: firstAvailable[{i}]"), context,
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
    short = _mig_resource(exact, device_class, where) if rule == MIG_RULE else rule
    return {short: count} if count else {}


def _mig_resource(exact: Mapping[str, Any], device_class: str, where: str) -> str:
    profiles = set()
    for index, raw in enumerate(exact.get("selectors") or []):
        selector = pods.mapping(raw, f"{where}: selectors[{index}]")
        cel = pods.mapping(selector.get("cel"), f"{where}: selectors[{index}].cel")
        expression = cel.get("expression")
        if not isinstance(expression, str):
            continue
        if "||" in expression:
            raise DraError(
                f"{where}: selector {expression!r} has ||, so fairgate cannot tell which MIG "
                "profile it gets: select one profile per request (use firstAvailable for "
                "alternatives)"
            )
        for conjunct in expression.split("&&"):
            match = _PROFILE.match(conjunct.strip().strip("()"))
            if match:
                profiles.add(resources.normalise(match.group(2)))
    if len(profiles) != 1:
        found = "names several profiles" if profiles else "names no profile"
        raise DraError(
            f"{where}: DeviceClass {device_class!r} hands out MIG devices and the request "
            f"{found}: add one selector such as "
            "device.attributes[\"gpu.nvidia.com\"].profile == \"1g.5gb\""
        )
    short = resources.MIG_PREFIX + profiles.pop()
    if not resources.is_known(short):
        raise DraError(f"{where}: unknown MIG profile {short[len(resources.MIG_PREFIX):]!r}: "
                       "use a profile of your GPUs, e.g. 1g.5gb, 3g.40gb")
    return short
