"""A pod, parsed once into a typed, immutable view that every rule reads.

Contract: :meth:`PodView.parse` takes the pod exactly as the API server sends it
(AdmissionReview ``request.object``, camelCase JSON) and either returns a
:class:`PodView` holding what fairgate's rules read of it, or raises :class:`PodError`
saying which field has the wrong shape. An absent or ``null`` field reads as empty (JSON
``omitempty``). Values are checked for shape only: what they mean (a quantity, a class,
a gang size) is for the rules. The view cannot be changed (frozen, read-only mappings,
tuples); nothing here mutates the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from tenants.models import MAX_GENERATED_PREFIX

JsonObject = Mapping[str, Any]
ClaimKind = Literal["ResourceClaim", "ResourceClaimTemplate"]
CLAIM: ClaimKind = "ResourceClaim"
TEMPLATE: ClaimKind = "ResourceClaimTemplate"
SIDECAR_RESTART_POLICY = "Always"


class PodError(ValueError):
    """A pod whose JSON does not have the shape of a Pod; the message names the field."""


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One entry of ``metadata.ownerReferences``."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool = False


@dataclass(frozen=True, slots=True)
class Container:
    """One entry of ``spec.containers`` or ``spec.initContainers``: ``where`` names it
    in messages (``container 'main'``, ``init container 'setup'``, or by index when it
    has no name); ``limits`` and ``requests`` hold the quantities as sent."""

    where: str
    name: str = ""
    limits: Mapping[str, object] = field(default_factory=dict)
    requests: Mapping[str, object] = field(default_factory=dict)
    restart_policy: str | None = None

    def __post_init__(self) -> None:
        _freeze(self, "limits", "requests")

    @property
    def sidecar(self) -> bool:
        """A restartable init container (``restartPolicy: Always``)."""
        return self.restart_policy == SIDECAR_RESTART_POLICY


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of ``spec.resourceClaims``: its name and the one object it names."""

    name: str
    kind: ClaimKind
    object_name: str

    @property
    def where(self) -> str:
        """How messages name it: ``resource claim 'gpu'``."""
        return f"resource claim {self.name!r}"


@dataclass(frozen=True, slots=True)
class PodView:
    """What fairgate's rules read of a pod. ``pod_group_name`` is
    ``spec.schedulingGroup.podGroupName`` (Workload API); ``claim_statuses`` maps a
    ``spec.resourceClaims`` entry to the ResourceClaim generated for it
    (``status.resourceClaimStatuses``); ``active_deadline_seconds`` is
    ``spec.activeDeadlineSeconds`` (None when unset)."""

    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    claims: tuple[PodClaim, ...] = ()
    scheduling_gates: tuple[str, ...] = ()
    priority_class_name: str | None = None
    pod_group_name: str = ""
    claim_statuses: Mapping[str, str] = field(default_factory=dict)
    active_deadline_seconds: int | None = None

    def __post_init__(self) -> None:
        _freeze(self, "labels", "annotations", "claim_statuses")

    @classmethod
    def parse(cls, obj: object) -> PodView:
        """The view of ``obj``; raises :class:`PodError` naming a field of the wrong shape."""
        pod = mapping(obj, "pod")
        meta = mapping(pod.get("metadata"), "metadata")
        spec = mapping(pod.get("spec"), "spec")
        status = mapping(pod.get("status"), "status")
        group = mapping(spec.get("schedulingGroup"), "spec.schedulingGroup")
        return cls(
            name=_string(meta.get("name"), "metadata.name"),
            generate_name=_string(meta.get("generateName"), "metadata.generateName"),
            namespace=_string(meta.get("namespace"), "metadata.namespace"),
            uid=_string(meta.get("uid"), "metadata.uid"),
            labels=_strings(meta.get("labels"), "metadata.labels"),
            annotations=_strings(meta.get("annotations"), "metadata.annotations"),
            owners=tuple(_owner(o, f"metadata.ownerReferences[{i}]") for i, o in
                         enumerate(_list(meta.get("ownerReferences"),
                                         "metadata.ownerReferences"))),
            containers=_containers(spec, "containers"),
            init_containers=_containers(spec, "initContainers"),
            claims=tuple(_claim(c, i) for i, c in enumerate(
                _list(spec.get("resourceClaims"), "spec.resourceClaims"))),
            scheduling_gates=tuple(_gate(g, i) for i, g in enumerate(
                _list(spec.get("schedulingGates"), "spec.schedulingGates"))),
            priority_class_name=_optional(spec.get("priorityClassName"),
                                          "spec.priorityClassName"),
            pod_group_name=_string(group.get("podGroupName"),
                                   "spec.schedulingGroup.podGroupName"),
            claim_statuses=_claim_statuses(status),
            active_deadline_seconds=deadline(spec.get("activeDeadlineSeconds"),
                                             "spec.activeDeadlineSeconds"),
        )

    @property
    def admitted_name(self) -> str:
        """The name its CREATE is admitted under (:func:`admitted_name`)."""
        return admitted_name(self.name, self.generate_name)

    @property
    def controller(self) -> OwnerRef | None:
        """The owner reference marked ``controller: true``, if any."""
        return next((o for o in self.owners if o.controller), None)


def admitted_name(name: str, generate_name: str) -> str:
    """The name an object CREATE is admitted under: ``name`` when set, else ``<prefix>*``
    where prefix is ``generate_name`` cut as the API server cuts it
    (:data:`MAX_GENERATED_PREFIX`), so that the generated name is exactly the prefix plus
    :data:`GENERATED_SUFFIX` characters; '' when it has neither."""
    if name:
        return name
    if generate_name:
        return generate_name[:MAX_GENERATED_PREFIX] + "*"
    return ""


def _freeze(view: object, *fields: str) -> None:
    """Make the mappings ``fields`` of a frozen ``view`` read-only copies (once)."""
    for name in fields:
        value = getattr(view, name)
        if not isinstance(value, MappingProxyType):
            object.__setattr__(view, name, MappingProxyType(dict(value)))


def mapping(value: object, where: str) -> JsonObject:
    """``value`` as an object (``None`` reads as empty); ``where`` names it in errors."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _optional(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise PodError(f"{where} must be a string, got {type(value).__name__}")


def _string(value: object, where: str) -> str:
    return _optional(value, where) or ""


def deadline(value: object, where: str) -> int | None:
    """An ``activeDeadlineSeconds`` field: a whole number of seconds >= 1, or None when
    unset; raises :class:`PodError` naming ``where`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PodError(f"{where} must be a whole number of seconds >= 1 (or left out), "
                       f"got {value!r}")
    return value


def _strings(value: object, where: str) -> Mapping[str, str]:
    items = mapping(value, where)
    for key, item in items.items():
        if not isinstance(item, str):
            raise PodError(f"{where}[{key!r}] must be a string, got {type(item).__name__}")
    return items


def _owner(value: object, where: str) -> OwnerRef:
    owner = mapping(value, where)
    controller = owner.get("controller")
    if controller is not None and not isinstance(controller, bool):
        raise PodError(f"{where}.controller must be a boolean, got {type(controller).__name__}")
    return OwnerRef(
        api_version=_string(owner.get("apiVersion"), f"{where}.apiVersion"),
        kind=_string(owner.get("kind"), f"{where}.kind"),
        name=_string(owner.get("name"), f"{where}.name"),
        uid=_string(owner.get("uid"), f"{where}.uid"),
        controller=controller is True,
    )


def _containers(spec: JsonObject, field: str) -> tuple[Container, ...]:
    kind = "init container" if field == "initContainers" else "container"
    parsed = []
    for index, value in enumerate(_list(spec.get(field), f"spec.{field}")):
        at = f"spec.{field}[{index}]"
        container = mapping(value, at)
        name = _string(container.get("name"), f"{at}.name")
        where = f"{kind} {name!r}" if name else at
        resources = mapping(container.get("resources"), f"{where}: resources")
        parsed.append(Container(
            where=where,
            name=name,
            limits=mapping(resources.get("limits"), f"{where}: resources.limits"),
            requests=mapping(resources.get("requests"), f"{where}: resources.requests"),
            restart_policy=_optional(container.get("restartPolicy"), f"{at}.restartPolicy"),
        ))
    return tuple(parsed)


def _claim(value: object, index: int) -> PodClaim:
    entry = mapping(value, f"spec.resourceClaims[{index}]")
    name = _string(entry.get("name"), f"spec.resourceClaims[{index}].name") or str(index)
    where = f"resource claim {name!r}"
    template = _string(entry.get("resourceClaimTemplateName"),
                       f"{where}: resourceClaimTemplateName")
    claim = _string(entry.get("resourceClaimName"), f"{where}: resourceClaimName")
    if template and claim:
        raise PodError(f"{where}: name either resourceClaimName or "
                       "resourceClaimTemplateName, not both")
    if not template and not claim:
        raise PodError(f"{where}: name a resourceClaimName or a resourceClaimTemplateName")
    return PodClaim(name, TEMPLATE, template) if template else PodClaim(name, CLAIM, claim)


def _gate(value: object, index: int) -> str:
    name = mapping(value, f"spec.schedulingGates[{index}]").get("name")
    if not isinstance(name, str):
        raise PodError(f"spec.schedulingGates[{index}].name must be a string")
    return name


def _claim_statuses(status: JsonObject) -> Mapping[str, str]:
    generated = {}
    for index, value in enumerate(_list(status.get("resourceClaimStatuses"),
                                        "status.resourceClaimStatuses")):
        at = f"status.resourceClaimStatuses[{index}]"
        entry = mapping(value, at)
        claim = _string(entry.get("resourceClaimName"), f"{at}.resourceClaimName")
        if claim:
            generated[_string(entry.get("name"), f"{at}.name")] = claim
    return generated
