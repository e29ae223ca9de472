"""The JSON Patch that stamps a planned GPU pod with fairgate's fields.

Contract of :func:`build_patch` (pure): given the pod exactly as received (AdmissionReview
``request.object``), its :class:`~admission.plan.PodPlan`, the priority band the queue chose
and whether the pod must wait, return RFC 6902 operations that, applied to that pod,
produce :func:`mutate_pod`'s result. The operations apply cleanly to any pod of valid
shape (missing or ``null`` parents are created first; ``/`` in keys is escaped as ``~1``)
and only add to what the user wrote, except for the fields fairgate owns:
- labels ``fairgate.io/tenant`` and ``fairgate.io/class``;
- annotations ``fairgate.io/ticket``, ``fairgate.io/demand`` and, exactly when the band is
  ``borrowed``, ``fairgate.io/borrowed: "true"``;
- ``spec.priorityClassName``, ``spec.priority`` and ``spec.preemptionPolicy`` of the band;
- the scheduling gate ``fairgate.io/queue``, present exactly when ``gated`` (other gates
  are kept, in order).
It also appends the toleration ``nvidia.com/gpu:NoSchedule`` (``operator: Exists``) unless
an existing toleration already tolerates that taint, and adds the placement requirements
(:func:`placement_requirements`) to every non-empty required nodeSelectorTerm, creating
``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` when absent.
Empty terms match no node in Kubernetes and are left alone; the user's matchExpressions
and matchFields are never dropped. A band that does not suit the plan's class (inference
must be ``inference``; training ``training`` or ``borrowed``) raises ``ValueError``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from admission import pods
from admission.plan import BANDS_OF_CLASS, PodPlan
from tenants import resources
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    NODE_POOL_LABEL,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    PriorityBand,
    PriorityClasses,
)

GPU_TAINT_KEY = "nvidia.com/gpu"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_STRATEGIES = ("single", "mixed")
GPU_TOLERATION: Mapping[str, str] = {
    "key": GPU_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}
JsonObject = dict[str, Any]


def placement_requirements(demand: Mapping[str, int], node_pool: str | None) -> list[JsonObject]:
    """Node selector requirements for a demand: MIG (mixed) demand needs a node whose
    ``nvidia.com/mig.strategy`` is ``mixed``; whole-GPU demand avoids MIG-partitioned
    nodes (strategy ``single`` or ``mixed``); a tenant node pool adds
    ``fairgate.io/node-pool In [<pool>]``."""
    requirements: list[JsonObject] = []
    if any(name.startswith(resources.MIG_PREFIX) for name in demand):
        requirements.append({"key": MIG_STRATEGY_LABEL, "operator": "In", "values": ["mixed"]})
    elif resources.GPU in demand:
        requirements.append(
            {"key": MIG_STRATEGY_LABEL, "operator": "NotIn", "values": list(MIG_STRATEGIES)}
        )
    if node_pool:
        requirements.append({"key": NODE_POOL_LABEL, "operator": "In", "values": [node_pool]})
    return requirements


def tolerates_gpu_taint(toleration: Mapping[str, Any]) -> bool:
    """Whether a toleration tolerates the taint ``nvidia.com/gpu:NoSchedule`` (any value)."""
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    effect = toleration.get("effect") or ""
    return operator == "Exists" and key in ("", GPU_TAINT_KEY) and effect in ("", "NoSchedule")


def _child(parent: JsonObject, key: str) -> JsonObject:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise pods.PodError(f"{key} must be an object, got {type(value).__name__}")
    return value


def _children(parent: JsonObject, key: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise pods.PodError(f"{key} must be a list, got {type(value).__name__}")
    return value


def _merge_affinity(spec: JsonObject, requirements: list[JsonObject]) -> None:
    if not requirements:
        return
    node_affinity = _child(_child(spec, "affinity"), "nodeAffinity")
    required = _child(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = _children(required, "nodeSelectorTerms")
    if not terms:
        terms.append({"matchExpressions": copy.deepcopy(requirements)})
        return
    for term in terms:
        if not isinstance(term, dict):
            raise pods.PodError("nodeSelectorTerms entries must be objects")
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue
        expressions = _children(term, "matchExpressions")
        for requirement in requirements:
            if requirement not in expressions:
                expressions.append(copy.deepcopy(requirement))


def _set_gate(spec: JsonObject, gated: bool) -> None:
    if spec.get("schedulingGates") is None and not gated:
        return
    gates = _children(spec, "schedulingGates")
    kept = [g for g in gates if not (isinstance(g, dict) and g.get("name") == QUEUE_GATE)]
    if gated:
        kept.append({"name": QUEUE_GATE})
    gates[:] = kept


def mutate_pod(
    pod: Mapping[str, Any],
    plan: PodPlan,
    band: PriorityBand,
    gated: bool,
    priority_classes: PriorityClasses,
) -> JsonObject:
    """A deep copy of ``pod`` carrying fairgate's fields (the result of build_patch)."""
    if band not in BANDS_OF_CLASS[plan.pod_class]:
        raise ValueError(f"band {band!r} does not suit a {plan.pod_class} pod")
    mutated: JsonObject = copy.deepcopy(dict(pod))
    metadata = _child(mutated, "metadata")
    labels = _child(metadata, "labels")
    labels[TENANT_LABEL] = plan.tenant.name
    labels[CLASS_LABEL] = plan.pod_class
    annotations = _child(metadata, "annotations")
    annotations[TICKET_ANNOTATION] = plan.ticket
    annotations[DEMAND_ANNOTATION] = resources.format_counts(plan.demand)
    if band == "borrowed":
        annotations[BORROWED_ANNOTATION] = "true"
    else:
        annotations.pop(BORROWED_ANNOTATION, None)
    spec = _child(mutated, "spec")
    priority = priority_classes.for_band(band)
    spec["priorityClassName"] = priority.name
    spec["priority"] = priority.value
    spec["preemptionPolicy"] = priority.preemption_policy
    tolerations = _children(spec, "tolerations")
    if not any(isinstance(t, dict) and tolerates_gpu_taint(t) for t in tolerations):
        tolerations.append(dict(GPU_TOLERATION))
    _merge_affinity(spec, placement_requirements(plan.demand, plan.tenant.node_pool))
    _set_gate(spec, gated)
    return mutated


def build_patch(
    pod: Mapping[str, Any],
    plan: PodPlan,
    band: PriorityBand,
    gated: bool,
    priority_classes: PriorityClasses,
) -> list[JsonObject]:
    """RFC 6902 operations turning ``pod`` into ``mutate_pod(pod, ...)``."""
    mutated = mutate_pod(pod, plan, band, gated, priority_classes)
    ops: list[JsonObject] = jsonpatch.make_patch(dict(pod), mutated).patch
    return ops
