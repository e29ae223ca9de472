"""The JSON Patch that stamps a planned GPU pod with fairgate's fields.

Contract of :func:`build_patch` (pure): given the pod exactly as received (AdmissionReview
``request.object``), its :class:`~admission.plan.PodPlan`, the priority band the queue chose
and whether the pod must wait, return RFC 6902 operations that, applied to that pod,
produce :func:`mutate_pod`'s result. The operations apply cleanly to any pod of valid
shape (missing or ``null`` parents are created first; ``/`` in keys is escaped as ``~1``)
and only add to what the user wrote, except for the fields fairgate owns:
- labels ``fairgate.io/tenant`` and ``fairgate.io/class``;
- for a gang fairgate recognised from another source (the plan's group has a
  ``source``), label ``fairgate.io/pod-group`` (its key) and, when its size is known,
  annotation ``fairgate.io/pod-group-size``: the pod then carries its gang, which the
  reconciler rebuilds the queue from and a reinvocation reads back;
- annotations ``fairgate.io/ticket``, ``fairgate.io/demand``, exactly when the band is
  ``borrowed`` ``fairgate.io/borrowed: "true"``, and exactly when the tenant has a node
  pool ``fairgate.io/node-pool: <pool>`` (what the dispatcher reads the pod's placement
  class from), and exactly when the pod has DRA claims ``fairgate.io/priced-claims`` (the
  objects they were priced from, and at: shared claims are charged by it);
- ``spec.priorityClassName``, ``spec.priority`` and ``spec.preemptionPolicy`` of the band;
- the scheduling gate ``fairgate.io/queue``, present exactly when ``gated`` (other gates
  are kept, in order).
It also appends the toleration ``nvidia.com/gpu:NoSchedule`` (``operator: Exists``) unless
an existing toleration already tolerates that taint, and adds the placement requirements
(:func:`tenants.placement.requirements` of the plan's placement) to every non-empty
required nodeSelectorTerm, creating
``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` when absent.
Empty terms match no node in Kubernetes and are left alone; the user's matchExpressions
and matchFields are never dropped. A band that does not suit the plan's class (inference
must be ``inference``; training ``training`` or ``borrowed``) raises ``ValueError``; a pod
whose fields on those paths have the wrong shape raises :class:`~admission.pods.PodError`.
The operations are computed from the plan and the fields they touch, so their cost does not
grow with the rest of the pod; a pod that already carries everything gets no operations.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from admission import pods
from admission.plan import BANDS_OF_CLASS, PodPlan
from tenants import resources
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    GPU_TAINT_KEY,
    GPU_TOLERATION,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    PRICED_CLAIMS_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    PriorityBand,
    PriorityClasses,
)
from tenants.placement import NODE_POOL_ANNOTATION, requirements

JsonObject = dict[str, Any]
AFFINITY_PATH = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
"""Where the required nodeSelectorTerms live under ``spec``."""


def tolerates_gpu_taint(toleration: Mapping[str, Any]) -> bool:
    """Whether a toleration tolerates the taint ``nvidia.com/gpu:NoSchedule`` (any value)."""
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    effect = toleration.get("effect") or ""
    return operator == "Exists" and key in ("", GPU_TAINT_KEY) and effect in ("", "NoSchedule")


def _object(parent: Mapping[str, Any], key: str) -> JsonObject | None:
    """``parent[key]`` when it is an object, None when absent or null."""
    value = parent.get(key)
    if value is not None and not isinstance(value, dict):
        raise pods.PodError(f"{key} must be an object, got {type(value).__name__}")
    return value


def _array(parent: Mapping[str, Any], key: str) -> list[Any] | None:
    """``parent[key]`` when it is a list, None when absent or null."""
    value = parent.get(key)
    if value is not None and not isinstance(value, list):
        raise pods.PodError(f"{key} must be a list, got {type(value).__name__}")
    return value


def _child(parent: JsonObject, key: str) -> JsonObject:
    value = _object(parent, key)
    if value is None:
        value = parent[key] = {}
    return value


def _children(parent: JsonObject, key: str) -> list[Any]:
    value = _array(parent, key)
    if value is None:
        value = parent[key] = []
    return value


# --- what fairgate writes: shared by mutate_pod (in place) and build_patch (as operations) ---


def _check_band(plan: PodPlan, band: PriorityBand) -> None:
    if band not in BANDS_OF_CLASS[plan.pod_class]:
        raise ValueError(f"band {band!r} does not suit a {plan.pod_class} pod")


def _labels(plan: PodPlan) -> dict[str, str]:
    wanted = {TENANT_LABEL: plan.tenant.name, CLASS_LABEL: plan.pod_class}
    if plan.group is not None and plan.group.source:
        wanted[POD_GROUP_LABEL] = plan.group.name
    return wanted


def _annotations(plan: PodPlan, band: PriorityBand) -> dict[str, str]:
    wanted = {
        TICKET_ANNOTATION: plan.ticket,
        DEMAND_ANNOTATION: resources.format_counts(plan.demand),
    }
    if plan.group is not None and plan.group.source and plan.group.size is not None:
        wanted[POD_GROUP_SIZE_ANNOTATION] = str(plan.group.size)
    if band == "borrowed":
        wanted[BORROWED_ANNOTATION] = "true"
    if plan.placement.pool is not None:
        wanted[NODE_POOL_ANNOTATION] = plan.placement.pool
    if plan.priced_claims:
        wanted[PRICED_CLAIMS_ANNOTATION] = plan.priced_claims
    return wanted


def _stale_annotations(plan: PodPlan, band: PriorityBand) -> tuple[str, ...]:
    stale = () if band == "borrowed" else (BORROWED_ANNOTATION,)
    stale = stale if plan.placement.pool is not None else (*stale, NODE_POOL_ANNOTATION)
    return stale if plan.priced_claims else (*stale, PRICED_CLAIMS_ANNOTATION)


def _priority_fields(band: PriorityBand, priority_classes: PriorityClasses) -> dict[str, Any]:
    priority = priority_classes.for_band(band)
    return {
        "priorityClassName": priority.name,
        "priority": priority.value,
        "preemptionPolicy": priority.preemption_policy,
    }


def _lacks_gpu_toleration(tolerations: list[Any]) -> bool:
    return not any(isinstance(t, dict) and tolerates_gpu_taint(t) for t in tolerations)


def _is_live(term: Any) -> bool:
    """Whether a nodeSelectorTerm selects anything (empty terms match no node)."""
    if not isinstance(term, dict):
        raise pods.PodError("nodeSelectorTerms entries must be objects")
    return bool(term.get("matchExpressions") or term.get("matchFields"))


def _missing(expressions: list[Any], requirements: list[JsonObject]) -> list[JsonObject]:
    return [r for r in requirements if r not in expressions]


def _is_queue_gate(gate: Any) -> bool:
    return isinstance(gate, dict) and gate.get("name") == QUEUE_GATE


def _gates_after(gates: list[Any], gated: bool) -> list[Any]:
    kept = [g for g in gates if not _is_queue_gate(g)]
    return [*kept, {"name": QUEUE_GATE}] if gated else kept


def _copies(requirements: list[JsonObject]) -> list[JsonObject]:
    return copy.deepcopy(requirements)


# --- mutate_pod: the stamped pod ---------------------------------------------------------


def _merge_affinity(spec: JsonObject, requirements: list[JsonObject]) -> None:
    if not requirements:
        return
    required = spec
    for key in AFFINITY_PATH:
        required = _child(required, key)
    terms = _children(required, "nodeSelectorTerms")
    if not terms:
        terms.append({"matchExpressions": _copies(requirements)})
        return
    for term in terms:
        if _is_live(term):
            expressions = _children(term, "matchExpressions")
            expressions.extend(_copies(_missing(expressions, requirements)))


def _set_gate(spec: JsonObject, gated: bool) -> None:
    if spec.get("schedulingGates") is None and not gated:
        return
    gates = _children(spec, "schedulingGates")
    gates[:] = _gates_after(gates, gated)


def mutate_pod(
    pod: Mapping[str, Any],
    plan: PodPlan,
    band: PriorityBand,
    gated: bool,
    priority_classes: PriorityClasses,
) -> JsonObject:
    """A deep copy of ``pod`` carrying fairgate's fields (the result of build_patch)."""
    _check_band(plan, band)
    mutated: JsonObject = copy.deepcopy(dict(pod))
    metadata = _child(mutated, "metadata")
    _child(metadata, "labels").update(_labels(plan))
    annotations = _child(metadata, "annotations")
    annotations.update(_annotations(plan, band))
    for key in _stale_annotations(plan, band):
        annotations.pop(key, None)
    spec = _child(mutated, "spec")
    spec.update(_priority_fields(band, priority_classes))
    tolerations = _children(spec, "tolerations")
    if _lacks_gpu_toleration(tolerations):
        tolerations.append(dict(GPU_TOLERATION))
    _merge_affinity(spec, requirements(plan.placement))
    _set_gate(spec, gated)
    return mutated


# --- build_patch: the same result as RFC 6902 operations ---------------------------------


def _pointer(base: str, key: str | int) -> str:
    """``base`` extended by one JSON Pointer token (RFC 6901 escaping)."""
    return f"{base}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _same(old: Any, new: Any) -> bool:
    # type too: JSON true is not 1, 1.0 is not 1
    return type(old) is type(new) and old == new


class _Patch:
    """Operations under construction."""

    def __init__(self) -> None:
        self.ops: list[JsonObject] = []

    def add(self, path: str, value: Any) -> None:
        self.ops.append({"op": "add", "path": path, "value": value})

    def remove(self, path: str) -> None:
        self.ops.append({"op": "remove", "path": path})

    def object(self, parent: Mapping[str, Any], path: str, key: str) -> JsonObject:
        """``parent[key]``; when absent or null, an operation creating it empty."""
        value = _object(parent, key)
        if value is None:
            self.add(_pointer(path, key), {})
            return {}
        return value

    def fields(self, parent: Mapping[str, Any], path: str, wanted: Mapping[str, Any],
               stale: tuple[str, ...] = ()) -> None:
        """Set every ``wanted`` member of the object ``parent`` at ``path``; remove ``stale``."""
        for key, value in wanted.items():
            if key not in parent:
                self.add(_pointer(path, key), value)
            elif not _same(parent[key], value):
                self.ops.append({"op": "replace", "path": _pointer(path, key), "value": value})
        for key in stale:
            if key in parent:
                self.remove(_pointer(path, key))

    def string_map(self, parent: Mapping[str, Any], path: str, key: str,
                   wanted: Mapping[str, str], stale: tuple[str, ...] = ()) -> None:
        """Like :meth:`fields` on ``parent[key]``, created whole when absent or null."""
        current = _object(parent, key)
        if current is None:
            self.add(_pointer(path, key), dict(wanted))
        else:
            self.fields(current, _pointer(path, key), wanted, stale)

    def tolerations(self, spec: Mapping[str, Any]) -> None:
        current = _array(spec, "tolerations")
        if current is None:
            self.add("/spec/tolerations", [dict(GPU_TOLERATION)])
        elif _lacks_gpu_toleration(current):
            self.add("/spec/tolerations/-", dict(GPU_TOLERATION))

    def affinity(self, spec: Mapping[str, Any], requirements: list[JsonObject]) -> None:
        if not requirements:
            return
        parent, path = spec, "/spec"
        for depth, key in enumerate(AFFINITY_PATH):
            child = _object(parent, key)
            if child is None:
                subtree: Any = [{"matchExpressions": _copies(requirements)}]
                for inner in reversed((*AFFINITY_PATH[depth + 1:], "nodeSelectorTerms")):
                    subtree = {inner: subtree}
                self.add(_pointer(path, key), subtree)
                return
            parent, path = child, _pointer(path, key)
        terms = _array(parent, "nodeSelectorTerms")
        path = _pointer(path, "nodeSelectorTerms")
        if terms is None:
            self.add(path, [{"matchExpressions": _copies(requirements)}])
        elif not terms:
            self.add(f"{path}/-", {"matchExpressions": _copies(requirements)})
        for i, term in enumerate(terms or ()):
            if not _is_live(term):
                continue
            expressions = _array(term, "matchExpressions")
            missing = _copies(_missing(expressions or [], requirements))
            where = f"{path}/{i}/matchExpressions"
            if expressions is None:
                self.add(where, missing)
            else:
                for requirement in missing:
                    self.add(f"{where}/-", requirement)

    def gates(self, spec: Mapping[str, Any], gated: bool) -> None:
        current = _array(spec, "schedulingGates")
        if current is None:
            if gated:
                self.add("/spec/schedulingGates", [{"name": QUEUE_GATE}])
            return
        if _gates_after(current, gated) == current:
            return
        for i in reversed(range(len(current))):
            if _is_queue_gate(current[i]):
                self.remove(f"/spec/schedulingGates/{i}")
        if gated:
            self.add("/spec/schedulingGates/-", {"name": QUEUE_GATE})


def build_patch(
    pod: Mapping[str, Any],
    plan: PodPlan,
    band: PriorityBand,
    gated: bool,
    priority_classes: PriorityClasses,
) -> list[JsonObject]:
    """RFC 6902 operations turning ``pod`` into ``mutate_pod(pod, ...)``."""
    _check_band(plan, band)
    patch = _Patch()
    metadata = patch.object(pod, "", "metadata")
    patch.string_map(metadata, "/metadata", "labels", _labels(plan))
    patch.string_map(metadata, "/metadata", "annotations", _annotations(plan, band),
                     _stale_annotations(plan, band))
    spec = patch.object(pod, "", "spec")
    patch.fields(spec, "/spec", _priority_fields(band, priority_classes))
    patch.tolerations(spec)
    patch.affinity(spec, requirements(plan.placement))
    patch.gates(spec, gated)
    return patch.ops
