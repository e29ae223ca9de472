"""validate_create / validate_update verdicts, and the whole pure pipeline on fixtures."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from admission_kit import CONFIG, NAMESPACES, gpu_pod, load_review
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pod_strategies import pods

from admission.mutation import build_patch, mutate_pod
from admission.plan import MAX_MESSAGE_CHARS, Denied, NotOurs, PodPlan, plan_create
from admission.reviews import parse_review
from admission.validation import WEBHOOK_USER, Verdict, validate_create, validate_update
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    DISPATCHER_USER,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    PriorityBand,
)

CLASSES = CONFIG.platform.priority_classes
ALICE = "alice@example.com"


def stamped(pod: dict[str, Any], namespace: str, band: PriorityBand, gated: bool = False) -> Any:
    plan = plan_create(pod, namespace, "uid-1", CONFIG)
    assert isinstance(plan, PodPlan), plan
    return mutate_pod(pod, plan, band, gated, CLASSES)


def denied(verdict: Verdict, *fragments: str) -> None:
    assert verdict.allowed is False
    assert len(verdict.reason) <= MAX_MESSAGE_CHARS
    for fragment in fragments:
        assert fragment in verdict.reason


@pytest.mark.parametrize(
    ("fixture", "band", "gated"),
    [
        ("deployment_inference_create", "inference", False),
        ("job_init_sidecar_create", "training", True),
        ("mig_pytorchjob_create", "borrowed", True),
        ("affinity_tolerations_create", "training", False),
        ("bare_create", "borrowed", False),
    ],
)
def test_pipeline_on_fixtures_passes_validation_and_is_stable_on_reinvocation(
    fixture: str, band: PriorityBand, gated: bool
) -> None:
    """parse -> plan -> patch -> apply -> validate; then a reinvocation on the result."""
    request = parse_review(load_review(fixture)).request
    pod = request.object
    assert pod is not None
    plan = plan_create(pod, request.namespace, request.uid, CONFIG)
    assert isinstance(plan, PodPlan)
    mutated = jsonpatch.apply_patch(pod, build_patch(pod, plan, band, gated, CLASSES))
    verdict = validate_create(mutated, request.namespace, CONFIG)
    assert verdict.allowed, verdict.reason
    # The API server may call the mutating webhook again, with a new uid: same ticket,
    # and the patch is then empty (idempotent mutation).
    again = plan_create(mutated, request.namespace, "another-uid", CONFIG)
    assert isinstance(again, PodPlan), again
    assert again.ticket == request.uid and again.reused_ticket
    assert again.pod_class == plan.pod_class and again.warnings == ()
    assert build_patch(mutated, again, band, gated, CLASSES) == []


def test_pod_without_gpu_is_allowed_anywhere() -> None:
    verdict = validate_create({"spec": {"containers": [{"name": "a"}]}}, "plain-ns", CONFIG)
    assert verdict.allowed


@pytest.mark.parametrize(
    ("pod", "namespace", "fragments"),
    [
        (gpu_pod(namespace="plain-ns"), "plain-ns", ["has no fairgate.io/tenant label"]),
        (gpu_pod(), "team-a-train", ["lacks the fairgate.io/ticket stamp"]),
        (gpu_pod(1, resource="nvidia.com/mig-8g.80gb"), "team-a-train", ["unknown MIG profile"]),
        # training may hold 8 GPUs of nominal (10 GPU-eq less 2 reserved) + 4 borrowed
        (gpu_pod(20), "team-a-train", ["at most 12.00 GPU-eq"]),
    ],
)
def test_create_denials_shared_with_plan(pod: Any, namespace: str, fragments: list[str]) -> None:
    denied(validate_create(pod, namespace, CONFIG), *fragments)


def test_class_label_the_tenant_does_not_allow() -> None:
    pod = stamped(gpu_pod(namespace="team-b-dev"), "team-b-dev", "training")
    pod["metadata"]["labels"][CLASS_LABEL] = "inference"
    denied(
        validate_create(pod, "team-b-dev", CONFIG),
        "fairgate.io/class='inference' is not a class tenant team-b allows",
    )


def test_missing_class_label() -> None:
    pod = stamped(gpu_pod(), "team-a-train", "training")
    del pod["metadata"]["labels"][CLASS_LABEL]
    denied(validate_create(pod, "team-a-train", CONFIG), "lacks label fairgate.io/class")


@pytest.mark.parametrize(
    ("owner", "band", "priority_class", "fragments"),
    [
        ("ReplicaSet", "inference", "fairgate-training", ["reserved for training pods"]),
        (
            "ReplicaSet",
            "inference",
            None,
            ["inference GPU pod must have priorityClassName fairgate-inference, not none"],
        ),
        (
            "Job",
            "training",
            None,
            ["must have priorityClassName fairgate-borrowed or fairgate-training"],
        ),
        ("Job", "training", "high", ["not 'high'"]),
        ("Job", "training", "fairgate-inference", ["reserved for inference pods"]),
        # borrowed class without the borrowed annotation
        ("Job", "training", "fairgate-borrowed", ['fairgate.io/borrowed="true" must be set']),
        # borrowed annotation without the borrowed class
        ("Job", "borrowed", "fairgate-training", ['only valid as "true" with']),
    ],
)
def test_priority_class_must_match_class_and_band(
    owner: str, band: PriorityBand, priority_class: str | None, fragments: list[str]
) -> None:
    namespace = "team-a-serving" if owner == "ReplicaSet" else "team-a-train"
    pod = stamped(gpu_pod(owner=owner, namespace=namespace), namespace, band)
    if priority_class is None:
        del pod["spec"]["priorityClassName"]
    else:
        pod["spec"]["priorityClassName"] = priority_class
    denied(validate_create(pod, namespace, CONFIG), *fragments)


def test_forged_demand_annotation_is_denied() -> None:
    pod = stamped(gpu_pod(2), "team-a-train", "training")
    pod["metadata"]["annotations"][DEMAND_ANNOTATION] = "gpu=1"
    denied(validate_create(pod, "team-a-train", CONFIG), "does not match the pod's GPU demand")


# --- UPDATE ----------------------------------------------------------------------------


def test_fixture_gate_removal_by_a_user_is_denied() -> None:
    request = parse_review(load_review("gate_removal_update")).request
    assert request.operation == "UPDATE"
    verdict = validate_update(
        request.old_object,
        request.object,
        request.user_info.username,
        request.user_info.groups,
        CONFIG,
    )
    denied(verdict, "only fairgate's dispatcher may remove the scheduling gate fairgate.io/queue")


@pytest.mark.parametrize(
    ("user", "allowed"),
    [
        (DISPATCHER_USER, True),
        (WEBHOOK_USER, False),
        (ALICE, False),
        ("system:serviceaccount:kube-system:x", False),
    ],
)
def test_only_the_dispatcher_removes_the_gate(user: str, allowed: bool) -> None:
    request = parse_review(load_review("gate_removal_update")).request
    verdict = validate_update(request.old_object, request.object, user, [], CONFIG)
    assert verdict.allowed is allowed


def _gated() -> dict[str, Any]:
    return stamped(gpu_pod(), "team-a-train", "training", gated=True)


def _edit_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][CLASS_LABEL] = "inference"


def _drop_ticket(pod: dict[str, Any]) -> None:
    del pod["metadata"]["annotations"][TICKET_ANNOTATION]


def _add_borrowed(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"][BORROWED_ANNOTATION] = "true"


def _add_fairgate_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"]["fairgate.io/extra"] = "1"


def _drop_labels(pod: dict[str, Any]) -> None:
    del pod["metadata"]["labels"]


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (_edit_label, "label 'fairgate.io/class' is managed by fairgate"),
        (_drop_ticket, "annotation 'fairgate.io/ticket' is managed by fairgate"),
        (_add_borrowed, "annotation 'fairgate.io/borrowed' is managed by fairgate"),
        (_add_fairgate_label, "label 'fairgate.io/extra'"),
        (_drop_labels, "label 'fairgate.io/class'"),
    ],
)
def test_fairgate_fields_are_fairgates(edit: Any, fragment: str) -> None:
    old = _gated()
    new = copy.deepcopy(old)
    edit(new)
    denied(validate_update(old, new, ALICE, ["team-a-devs"], CONFIG), fragment)
    for user in (WEBHOOK_USER, DISPATCHER_USER):
        assert validate_update(old, new, user, [], CONFIG).allowed


def test_other_changes_are_allowed() -> None:
    old = _gated()
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "vision"
    new["metadata"]["annotations"]["note"] = "hi"
    new["spec"]["schedulingGates"].append({"name": "example.com/other"})
    assert validate_update(old, new, ALICE, [], CONFIG).allowed
    # removing someone else's gate is not fairgate's business
    old2 = copy.deepcopy(new)
    new2 = copy.deepcopy(new)
    new2["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    assert validate_update(old2, new2, ALICE, [], CONFIG).allowed


def test_dispatcher_release_with_bookkeeping_is_allowed() -> None:
    old = _gated()
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = []
    new["metadata"]["annotations"]["fairgate.io/released"] = "2026-11-30T00:00:00Z"
    assert validate_update(old, new, DISPATCHER_USER, [], CONFIG).allowed
    denied(validate_update(old, new, WEBHOOK_USER, [], CONFIG), "fairgate.io/queue")


def test_malformed_update_is_denied_clearly() -> None:
    old = _gated()
    new = copy.deepcopy(old)
    new["spec"]["schedulingGates"] = [{"name": 3}]
    denied(
        validate_update(old, new, ALICE, [], CONFIG),
        "malformed pod",
        "spec.schedulingGates[0].name",
    )


def test_tenant_label_on_update() -> None:
    old = _gated()
    new = copy.deepcopy(old)
    new["metadata"]["labels"][TENANT_LABEL] = "team-b"
    denied(validate_update(old, new, ALICE, [], CONFIG), "label 'fairgate.io/tenant'")


# --- property: plan, patch and validation agree on every pod ------------------------------


@st.composite
def admission_cases(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    namespace = draw(st.sampled_from(sorted(NAMESPACES)))
    pod = draw(pods(namespace))
    metadata = pod["metadata"]
    labels = dict(metadata.get("labels") or {})
    annotations = dict(metadata.get("annotations") or {})
    if draw(st.booleans()):
        labels[CLASS_LABEL] = draw(st.sampled_from(["inference", "training", "batch"]))
    if draw(st.booleans()):
        labels[POD_GROUP_LABEL] = "gang"
        annotations[POD_GROUP_SIZE_ANNOTATION] = draw(st.sampled_from(["1", "4", "0", "x"]))
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["ReplicaSet", "StatefulSet", "Job", "JobSet", "Foo"]))
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": kind, "name": "o", "uid": "u", "controller": True}
        ]
    metadata["labels"], metadata["annotations"] = labels, annotations
    return pod, namespace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(admission_cases(), st.booleans(), st.booleans())
def test_plan_patch_and_validation_agree(
    case: tuple[dict[str, Any], str], borrow: bool, gated: bool
) -> None:
    pod, namespace = case
    result = plan_create(pod, namespace, "uid-x", CONFIG)
    event(type(result).__name__ + (f" {result.code}" if isinstance(result, Denied) else ""))
    if isinstance(result, NotOurs):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        forged = (
            "fairgate.io/tenant" in (meta.get("labels") or {})
            or any(k.startswith("fairgate.io/") and k != "fairgate.io/pod-group-size"
                   for k in meta.get("annotations") or {})
            or {"name": "fairgate.io/queue"} in (spec.get("schedulingGates") or [])
        )
        assert validate_create(pod, namespace, CONFIG).allowed is not forged
        return
    if isinstance(result, Denied):
        assert 0 < len(result.message) <= MAX_MESSAGE_CHARS
        denied(validate_create(pod, namespace, CONFIG))
        return
    band: PriorityBand = (
        "inference" if result.pod_class == "inference" else ("borrowed" if borrow else "training")
    )
    mutated = jsonpatch.apply_patch(pod, build_patch(pod, result, band, gated, CLASSES))
    verdict = validate_create(mutated, namespace, CONFIG)
    assert verdict.allowed, verdict.reason
    again = plan_create(mutated, namespace, "uid-y", CONFIG)
    assert isinstance(again, PodPlan)
    assert (again.ticket, again.pod_class, again.demand) == (
        "uid-x",
        result.pod_class,
        result.demand,
    )
    assert build_patch(mutated, again, band, gated, CLASSES) == []


POD_KEYS = [
    "metadata",
    "labels",
    "annotations",
    "ownerReferences",
    "kind",
    "controller",
    "spec",
    "containers",
    "initContainers",
    "resources",
    "limits",
    "requests",
    "nvidia.com/gpu",
    "priorityClassName",
    "schedulingGates",
    "name",
    "restartPolicy",
    CLASS_LABEL,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    DEMAND_ANNOTATION,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
]
JSON_ISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["1", "gpu=1", "x", ""]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(POD_KEYS), inner, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=200, deadline=None)
@given(JSON_ISH, JSON_ISH, st.sampled_from(sorted(NAMESPACES)))
def test_arbitrary_json_never_raises(first: Any, second: Any, namespace: str) -> None:
    result = plan_create(first, namespace, "uid", CONFIG)
    assert isinstance(result, NotOurs | Denied | PodPlan)
    assert isinstance(validate_create(first, namespace, CONFIG), Verdict)
    assert isinstance(validate_update(first, second, ALICE, [], CONFIG), Verdict)


@pytest.mark.parametrize(
    ("metadata", "spec", "named"),
    [
        ({"labels": {"fairgate.io/tenant": "team-a"}}, {}, "label fairgate.io/tenant"),
        ({"annotations": {"fairgate.io/ticket": "t-1"}}, {}, "annotation fairgate.io/ticket"),
        ({}, {"schedulingGates": [{"name": "fairgate.io/queue"}]}, "scheduling gate"),
    ],
)
def test_gpu_less_pod_with_fairgate_only_marker_is_denied(
    metadata: dict[str, Any], spec: dict[str, Any], named: str
) -> None:
    pod = {"metadata": {"name": "p", **metadata},
           "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}
    verdict = validate_create(pod, "team-a-train", CONFIG)
    assert not verdict.allowed
    assert named in verdict.reason and "remove" in verdict.reason


def test_gpu_less_pod_with_user_class_and_group_is_allowed() -> None:
    pod = {"metadata": {"name": "p",
                        "labels": {"fairgate.io/class": "training", "fairgate.io/pod-group": "g"},
                        "annotations": {"fairgate.io/pod-group-size": "2"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert validate_create(pod, "team-a-train", CONFIG).allowed
