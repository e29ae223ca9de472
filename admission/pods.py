"""Typed, checked access to a pod given as plain JSON (AdmissionReview ``request.object``).

Contract: every accessor takes the pod dict exactly as the API server sends it (camelCase)
and either returns the requested part or raises :class:`PodError` saying which field has
the wrong shape. An absent or ``null`` field reads as empty (JSON ``omitempty``).
Nothing here mutates the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenants.models import MAX_GENERATED_PREFIX

JsonObject = Mapping[str, Any]


class PodError(ValueError):
    """A pod whose JSON does not have the shape of a Pod; the message names the field."""


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


def _strings(value: object, where: str) -> dict[str, str]:
    items = mapping(value, where)
    for key, item in items.items():
        if not isinstance(item, str):
            raise PodError(f"{where}[{key!r}] must be a string, got {type(item).__name__}")
    return dict(items)


def metadata(pod: object) -> JsonObject:
    """``metadata`` of the pod."""
    return mapping(mapping(pod, "pod").get("metadata"), "metadata")


def admitted_name(meta: JsonObject) -> str:
    """The name a pod CREATE is admitted under: ``metadata.name`` when set, else
    ``<prefix>*`` where prefix is ``metadata.generateName`` cut as the API server cuts it
    (:data:`MAX_GENERATED_PREFIX`), so that the pod's generated name is exactly the
    prefix plus :data:`GENERATED_SUFFIX` characters; '' when the pod has neither."""
    name = meta.get("name")
    if isinstance(name, str) and name:
        return name
    prefix = meta.get("generateName")
    if isinstance(prefix, str) and prefix:
        return prefix[:MAX_GENERATED_PREFIX] + "*"
    return ""


def spec(pod: object) -> JsonObject:
    """``spec`` of the pod."""
    return mapping(mapping(pod, "pod").get("spec"), "spec")


def labels_of(pod: object) -> dict[str, str]:
    """``metadata.labels`` (a copy)."""
    return _strings(metadata(pod).get("labels"), "metadata.labels")


def annotations_of(pod: object) -> dict[str, str]:
    """``metadata.annotations`` (a copy)."""
    return _strings(metadata(pod).get("annotations"), "metadata.annotations")


def owner_references(pod: object) -> list[JsonObject]:
    """``metadata.ownerReferences``; each entry is an object."""
    owners = _list(metadata(pod).get("ownerReferences"), "metadata.ownerReferences")
    return [mapping(o, f"metadata.ownerReferences[{i}]") for i, o in enumerate(owners)]


def containers(pod: object, field: str) -> list[JsonObject]:
    """``spec.<field>`` (``containers`` or ``initContainers``); each entry is an object."""
    items = _list(spec(pod).get(field), f"spec.{field}")
    return [mapping(c, f"spec.{field}[{i}]") for i, c in enumerate(items)]


def list_field(pod: object, field: str) -> list[Any]:
    """``spec.<field>`` as a list (e.g. ``tolerations``, ``schedulingGates``)."""
    return _list(spec(pod).get(field), f"spec.{field}")


def string_field(pod: object, field: str) -> str | None:
    """``spec.<field>`` as a string, or None when absent."""
    value = spec(pod).get(field)
    if value is None or isinstance(value, str):
        return value
    raise PodError(f"spec.{field} must be a string, got {type(value).__name__}")


def gate_names(pod: object) -> list[str]:
    """Names of ``spec.schedulingGates``."""
    gates = list_field(pod, "schedulingGates")
    names = []
    for i, gate in enumerate(gates):
        name = mapping(gate, f"spec.schedulingGates[{i}]").get("name")
        if not isinstance(name, str):
            raise PodError(f"spec.schedulingGates[{i}].name must be a string")
        names.append(name)
    return names
