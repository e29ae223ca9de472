"""Pod manifests and pod-state probes shared by the e2e tests."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from .waiting import wait_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod_manifest(
    name: str,
    resources: Mapping[str, int] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    priority_class: str | None = None,
    gates: Sequence[str] = (),
    tolerate_gpu: bool = True,
) -> dict[str, Any]:
    """A one-container pod asking for `resources` (extended resources go in limits)."""
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if resources:
        container["resources"] = {"limits": {k: str(v) for k, v in resources.items()}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 30}
    if tolerate_gpu:
        spec["tolerations"] = [GPU_TOLERATION]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


def running_node(core: Any, namespace: str, name: str) -> str | None:
    """The node the pod runs on, or None while it is not Running."""
    pod = core.read_namespaced_pod(name, namespace)
    return pod.spec.node_name if pod.status.phase == "Running" else None


def start_one_gpu_pods(core: Any, namespace: str, names: Sequence[str], *,
                       last_alone: bool) -> None:
    """Create a 1-GPU pod per name and wait until each runs; with ``last_alone``, the
    last is created only once the others run and a second has passed, so that it alone
    started last (``status.startTime`` has whole seconds: pods started in one second
    are equally young to the kube-scheduler)."""
    first = names[:-1] if last_alone else names
    for name in first:
        core.create_namespaced_pod(namespace, pod_manifest(name, {"nvidia.com/gpu": 1}))
    for name in first:
        wait_for(partial(running_node, core, namespace, name), 60, f"{name} to run")
    if last_alone:
        time.sleep(1.1)
        core.create_namespaced_pod(namespace, pod_manifest(names[-1], {"nvidia.com/gpu": 1}))
        wait_for(partial(running_node, core, namespace, names[-1]), 60, f"{names[-1]} to run")


def no_pods(core: Any, namespace: str) -> bool:
    """True once `namespace` has no pods."""
    return not core.list_namespaced_pod(namespace).items


def condition(pod: Any, kind: str) -> Any | None:
    """The pod's status condition of type `kind`, or None."""
    for cond in pod.status.conditions or []:
        if cond.type == kind:
            return cond
    return None


def is_gated(pod: Any) -> bool:
    """True if the API server reports the pod as held by a scheduling gate."""
    scheduled = condition(pod, "PodScheduled")
    return scheduled is not None and scheduled.reason == "SchedulingGated"


def _matches(expression: Any, labels: dict[str, str]) -> bool:
    value = labels.get(expression.key)
    values = expression.values or []
    if expression.operator == "In":
        return value in values
    if expression.operator == "NotIn":
        return value not in values
    if expression.operator == "Exists":
        return value is not None
    if expression.operator == "DoesNotExist":
        return value is None
    raise ValueError(f"operator {expression.operator} not supported by this helper")


def required_affinity_admits(pod: Any, labels: dict[str, str]) -> bool:
    """Whether the pod's required node affinity admits a node with `labels` (terms are ORed,
    expressions within a term ANDed; no affinity admits every node)."""
    affinity = pod.spec.affinity
    required = (
        affinity
        and affinity.node_affinity
        and (affinity.node_affinity.required_during_scheduling_ignored_during_execution)
    )
    if not required:
        return True
    return any(
        all(_matches(e, labels) for e in term.match_expressions or [])
        for term in required.node_selector_terms
    )
