"""The devices ResourceSlices publish, and which of them a DRA request's CEL selectors can
be given.

Contract (docs/dra.md, "Selectors are CEL"):
- :func:`published_devices` turns ResourceSlices (``resource.k8s.io/v1``, plain JSON)
  into :class:`Device` values: every device of the newest generation of its pool (a
  pool is a driver's pool name), whatever node, node selector or ``allNodes`` it is
  published for. A device's :attr:`Device.resource` is the GPU resource it is
  (``gpu`` for ``type: gpu``, ``mig-<profile>`` for ``type: mig`` with a known profile,
  both from the NVIDIA driver's attributes), or None.
- :func:`selectable` evaluates CEL expressions with a CEL engine against one device,
  exposed as Kubernetes exposes it to selectors: ``device.driver``,
  ``device.attributes[<domain>].<name>`` and ``device.capacity[<domain>].<name>``
  (an attribute or capacity name without a domain belongs to the driver's). Its answer
  is the device's fate at allocation: True when every expression is true; False when one
  is false or looks up an attribute the device lacks (the scheduler cannot give such a
  device); True, to be safe, when an expression uses what this engine cannot evaluate
  (Kubernetes' ``quantity`` and ``semver`` functions, a result that is not a boolean):
  a selector fairgate cannot evaluate never makes a request look smaller.
- Selectors are never read as text: comments, string literals, ``||``, ``!``, ``in`` and
  parentheses mean what CEL says they mean.
Pure: no I/O; compiled expressions are cached by their text, and which devices a set of
selectors can be given by the selectors and the devices.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cel

from tenants import resources

NVIDIA_DRIVER = "gpu.nvidia.com"
"""The NVIDIA DRA driver for GPUs: the driver whose devices fairgate knows how to price."""

_VALUE_KINDS = ("string", "int", "bool", "version")
_MEMORY = re.compile(r"\.(\d+)gb")


@dataclass(frozen=True)
class Device:
    """One published device: where it is, what a CEL selector sees of it (:attr:`view`),
    and the GPU resource it is (None: not a GPU fairgate knows)."""

    driver: str
    pool: str
    name: str
    node: str | None
    resource: str | None
    view: Mapping[str, Any] = field(hash=False, repr=False)


def published_devices(slices: Iterable[Mapping[str, Any]]) -> tuple[Device, ...]:
    """The devices of ``slices``, newest pool generation only (see the module contract)."""
    newest: dict[tuple[str, str], int] = {}
    kept: list[tuple[tuple[str, str], int, Mapping[str, Any]]] = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver", "")), str(pool.get("name", "")))
        generation = int(pool.get("generation") or 0)
        newest[key] = max(newest.get(key, generation), generation)
        kept.append((key, generation, spec))
    devices: list[Device] = []
    for key, generation, spec in kept:
        if generation != newest[key]:
            continue
        node = spec.get("nodeName") or None
        for raw in spec.get("devices") or []:
            if isinstance(raw, Mapping):
                devices.append(_device(key[0], key[1], node, raw))
    return tuple(devices)


def _device(driver: str, pool: str, node: str | None, raw: Mapping[str, Any]) -> Device:
    attributes = _by_domain(driver, raw.get("attributes"), _attribute_value)
    capacity = _by_domain(driver, raw.get("capacity"), _capacity_value)
    view = {"driver": driver, "attributes": attributes, "capacity": capacity,
            "allowMultipleAllocations": bool(raw.get("allowMultipleAllocations"))}
    return Device(driver, pool, str(raw.get("name", "")), node,
                  _resource(driver, attributes.get(NVIDIA_DRIVER, {})), view)


def _by_domain(driver: str, raw: object, value_of: Any) -> dict[str, dict[str, Any]]:
    domains: dict[str, dict[str, Any]] = {}
    for qualified, raw_value in (raw.items() if isinstance(raw, Mapping) else ()):
        domain, _, name = str(qualified).rpartition("/")
        value = value_of(raw_value)
        if value is not None:
            domains.setdefault(domain or driver, {})[name] = value
    return domains


def _attribute_value(raw: object) -> object:
    if not isinstance(raw, Mapping):
        return None
    return next((raw[kind] for kind in _VALUE_KINDS if kind in raw), None)


def _capacity_value(raw: object) -> object:
    return str(raw.get("value")) if isinstance(raw, Mapping) and "value" in raw else None


def _resource(driver: str, nvidia: Mapping[str, Any]) -> str | None:
    if driver != NVIDIA_DRIVER:
        return None
    kind = nvidia.get("type")
    if kind == "gpu":
        return "gpu"
    profile = nvidia.get("profile")
    if kind == "mig" and isinstance(profile, str):
        short = resources.MIG_PREFIX + resources.normalise(profile)
        return short if resources.is_known(short) else None
    return None


def size_of(resource: str) -> tuple[int, int]:
    """How large a device of ``resource`` is: compute slices, then memory (GB) for two MIG
    profiles of the same slices (``mig-3g.40gb`` is larger than ``mig-3g.20gb``)."""
    memory = _MEMORY.search(resource)
    return resources.slices_of(resource), int(memory.group(1)) if memory else 0


@functools.lru_cache(maxsize=4096)
def _program(expression: str) -> Any:
    """The compiled expression, or None when this engine cannot parse it."""
    try:
        return cel.compile(expression)
    except Exception:  # the engine's parse errors have no common type
        return None


def _holds(expression: str, device: Device) -> bool:
    program = _program(expression)
    if program is None:
        return True  # cannot be evaluated here: assume the scheduler may pick it
    context = cel.Context()
    context.add_variable("device", dict(device.view))
    try:
        result = program.execute(context)
    except KeyError:
        return False  # the device lacks the attribute: the scheduler cannot give it
    except Exception:  # a function or overload this engine lacks (quantity, semver, ...)
        return True
    return result if isinstance(result, bool) else True


def selectable(expressions: Sequence[str], device: Device) -> bool:
    """Whether a request with these selectors (its class's and its own) can be given
    ``device`` (see the module contract)."""
    return all(_holds(expression, device) for expression in expressions)


def candidates(expressions: Sequence[str], devices: Iterable[Device]) -> list[Device]:
    """The ``devices`` a request with these selectors can be given."""
    return list(_candidates(tuple(expressions), tuple(devices)))


@functools.lru_cache(maxsize=512)
def _candidates(expressions: tuple[str, ...], devices: tuple[Device, ...]) -> tuple[Device, ...]:
    """:func:`candidates`, evaluated once per selectors and published devices (they change
    when the slices do, not per request)."""
    return tuple(device for device in devices if selectable(expressions, device))
