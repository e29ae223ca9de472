"""plan_create: NotOurs / Denied / PodPlan for every rule, on real AdmissionReview JSON."""

from __future__ import annotations

from typing import Any

import pytest
from admission_kit import CONFIG, gpu_pod, load_review, make_config

from admission.plan import MAX_MESSAGE_CHARS, Denied, NotOurs, PodGroup, PodPlan, plan_create
from admission.reviews import parse_review
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    PREEMPTIBLE_LABEL,
    TENANT_LABEL,
    TICKET_ANNOTATION,
)

UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def plan(pod: Any, namespace: str = "team-a-train") -> NotOurs | Denied | PodPlan:
    return plan_create(pod, namespace, UID, CONFIG)


def planned(pod: Any, namespace: str = "team-a-train") -> PodPlan:
    result = plan(pod, namespace)
    assert isinstance(result, PodPlan), result
    return result


def denied(pod: Any, namespace: str = "team-a-train") -> Denied:
    result = plan(pod, namespace)
    assert isinstance(result, Denied), result
    assert len(result.message) <= MAX_MESSAGE_CHARS
    return result


@pytest.mark.parametrize(
    ("fixture", "tenant", "pod_class", "demand", "slices", "group", "warnings"),
    [
        ("deployment_inference_create", "team-a", "inference", {"gpu": 1}, 7, None, ()),
        ("job_init_sidecar_create", "team-a", "training", {"gpu": 4}, 28, None, ()),
        ("mig_pytorchjob_create", "team-a", "training", {"mig-1g.5gb": 2}, 2, None, ()),
        ("bare_create", "team-a", "training", {"gpu": 1}, 7, None, ()),
        (
            "affinity_tolerations_create",
            "team-b",
            "training",
            {"gpu": 2},
            14,
            PodGroup("sweep-lr", 1),
            (
                "class 'inference' not allowed for team-b; using defaultClass training",
                "priorityClassName 'high-priority' replaced by fairgate's class for training pods",
            ),
        ),
    ],
)
def test_fixture_plans(
    fixture: str,
    tenant: str,
    pod_class: str,
    demand: dict[str, int],
    slices: int,
    group: PodGroup | None,
    warnings: tuple[str, ...],
) -> None:
    request = parse_review(load_review(fixture)).request
    result = plan_create(request.object, request.namespace, request.uid, CONFIG)
    assert isinstance(result, PodPlan), result
    assert result.tenant.name == tenant
    assert result.pod_class == pod_class
    assert dict(result.demand) == demand
    assert result.demand_slices == slices
    assert result.ticket == request.uid
    assert result.reused_ticket is False
    assert result.group == group
    assert result.warnings == warnings


def test_pod_without_gpu_is_not_ours_even_in_unlabelled_namespace() -> None:
    pod = gpu_pod(0)
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "4"
    assert isinstance(plan(pod, "plain-ns"), NotOurs)
    assert isinstance(plan(pod, "orphan-ns"), NotOurs)


@pytest.mark.parametrize(
    ("pod", "namespace", "code", "fragments"),
    [
        (
            gpu_pod(),
            "plain-ns",
            "no-tenant",
            [
                "namespace plain-ns has no fairgate.io/tenant label",
                "kubectl label namespace plain-ns fairgate.io/tenant=<tenant>",
            ],
        ),
        (gpu_pod(), "never-heard-of", "no-tenant", ["kubectl label namespace never-heard-of"]),
        (
            gpu_pod(),
            "orphan-ns",
            "unknown-tenant",
            ["fairgate.io/tenant='ghost'", "defines no tenant 'ghost'"],
        ),
        (
            gpu_pod(1, resource="nvidia.com/mig-5g.55gb"),
            "team-a-train",
            "invalid-demand",
            ["unknown MIG profile '5g.55gb'"],
        ),
        (gpu_pod("1500m"), "team-a-train", "invalid-demand", ["whole devices"]),
        (
            {"spec": {"containers": "nope"}},
            "team-a-train",
            "malformed-pod",
            ["malformed pod: spec.containers must be a list"],
        ),
        # inference never borrows: per resource over nominal
        (
            gpu_pod(9, owner="ReplicaSet"),
            "team-a-serving",
            "never-fits",
            ["inference pod asks for gpu=9", "nominal quota has gpu=8", "quota-team-a"],
        ),
        (
            gpu_pod(1, resource="nvidia.com/mig-3g.40gb", owner="ReplicaSet"),
            "team-a-serving",
            "never-fits",
            ["mig-3g.40gb=0"],
        ),
        # training: over what nominal (less the inference reserve, only of the resources
        # asked for) and borrowLimit can hold: 8 GPUs of nominal (10 GPU-eq in all less
        # 2 reserved) + 4 borrowed = 12 GPUs; 13 can never run
        (
            gpu_pod(13),
            "team-a-train",
            "never-fits",
            ["gpu=13 (13.00 GPU-eq)", "at most 12.00 GPU-eq of it as training",
             "less inferenceReserve 2.00", "plus borrowLimit 4.00"],
        ),
        # a gang is judged whole: 4 x 4 GPUs can never run at once
        (
            gpu_pod(4, labels={"fairgate.io/pod-group": "ddp"},
                    annotations={"fairgate.io/pod-group-size": "4"}),
            "team-a-train",
            "never-fits",
            ["gang ddp asks for 4 x gpu=4 = gpu=16 (16.00 GPU-eq)", "at most 12.00 GPU-eq"],
        ),
        # an inference gang too, per resource against nominal
        (
            gpu_pod(3, owner="ReplicaSet", labels={"fairgate.io/pod-group": "serve"},
                    annotations={"fairgate.io/pod-group-size": "3"}),
            "team-a-serving",
            "never-fits",
            ["inference gang serve asks for 3 x gpu=3 = gpu=9", "nominal quota has gpu=8"],
        ),
        # training in a tenant that cannot borrow: per resource over nominal
        (gpu_pod(3), "team-b-dev", "never-fits", ["at most 2.00 GPU-eq"]),
        (
            gpu_pod(1, resource="nvidia.com/mig-1g.5gb"),
            "team-b-dev",
            "never-fits",
            ["mig-1g.5gb=1 (0.14 GPU-eq)", "at most 0.00 GPU-eq", "borrowLimit 0.00"],
        ),
        # tenant without a quota ConfigMap has no nominal quota
        (gpu_pod(1), "team-c-lab", "never-fits", ["at most 0.00 GPU-eq"]),
        # priority classes reserved for another class
        (
            gpu_pod(owner="ReplicaSet", priorityClassName="fairgate-training"),
            "team-a-serving",
            "reserved-priority-class",
            ["fairgate-training is reserved for training pods"],
        ),
        (
            gpu_pod(owner="ReplicaSet", priorityClassName="fairgate-borrowed"),
            "team-a-serving",
            "reserved-priority-class",
            ["fairgate-borrowed is reserved for training pods"],
        ),
        (
            gpu_pod(priorityClassName="fairgate-inference"),
            "team-a-train",
            "reserved-priority-class",
            ["fairgate-inference is reserved for inference pods", "remove priorityClassName"],
        ),
        # fairgate.io fields users may not set
        (
            gpu_pod(labels={TENANT_LABEL: "team-b"}),
            "team-a-train",
            "fairgate-field",
            [
                "label fairgate.io/tenant='team-b' disagrees with namespace team-a-train "
                "(tenant team-a)"
            ],
        ),
        (
            gpu_pod(annotations={TICKET_ANNOTATION: "mine"}),
            "team-a-train",
            "fairgate-field",
            ["fairgate.io/demand does not match"],
        ),
        (
            gpu_pod(annotations={DEMAND_ANNOTATION: "gpu=1"}),
            "team-a-train",
            "fairgate-field",
            [
                "annotation fairgate.io/demand is set by fairgate",
                "remove annotations fairgate.io/demand",
            ],
        ),
        (
            gpu_pod(
                labels={TENANT_LABEL: "team-a"},
                annotations={TICKET_ANNOTATION: "x y", DEMAND_ANNOTATION: "gpu=1"},
            ),
            "team-a-train",
            "fairgate-field",
            ["annotation fairgate.io/ticket is not one fairgate set"],
        ),
        (
            gpu_pod(annotations={BORROWED_ANNOTATION: "true"}),
            "team-a-train",
            "fairgate-field",
            ["annotation fairgate.io/borrowed is set by fairgate"],
        ),
        (
            gpu_pod(labels={"fairgate.io/priority": "high"}),
            "team-a-train",
            "fairgate-field",
            ["label 'fairgate.io/priority' is not a fairgate.io key users may set"],
        ),
        (
            gpu_pod(annotations={"fairgate.io/whatever": "x"}),
            "team-a-train",
            "fairgate-field",
            ["annotation 'fairgate.io/whatever'"],
        ),
        # ticket + demand but no tenant label: not fairgate's own stamp
        (
            gpu_pod(annotations={TICKET_ANNOTATION: "t", DEMAND_ANNOTATION: "gpu=1"}),
            "team-a-train",
            "fairgate-field",
            ["without label fairgate.io/tenant"],
        ),
        # our stamp, but the borrowed annotation without the borrowed priority class
        (
            gpu_pod(
                labels={TENANT_LABEL: "team-a"},
                annotations={
                    TICKET_ANNOTATION: "t",
                    DEMAND_ANNOTATION: "gpu=1",
                    BORROWED_ANNOTATION: "true",
                },
                priorityClassName="fairgate-training",
            ),
            "team-a-train",
            "fairgate-field",
            ['only valid as "true" with priorityClassName fairgate-borrowed'],
        ),
        (
            gpu_pod(
                labels={TENANT_LABEL: "team-a"},
                annotations={
                    TICKET_ANNOTATION: "t",
                    DEMAND_ANNOTATION: "gpu=1",
                    BORROWED_ANNOTATION: "yes",
                },
                priorityClassName="fairgate-borrowed",
            ),
            "team-a-train",
            "fairgate-field",
            ["only valid as"],
        ),
        # gangs
        (
            gpu_pod(labels={POD_GROUP_LABEL: "g"}),
            "team-a-train",
            "invalid-pod-group",
            ["label fairgate.io/pod-group='g' needs annotation fairgate.io/pod-group-size"],
        ),
        (
            gpu_pod(annotations={POD_GROUP_SIZE_ANNOTATION: "4"}),
            "team-a-train",
            "invalid-pod-group",
            ["without label fairgate.io/pod-group"],
        ),
        *[
            (
                gpu_pod(
                    labels={POD_GROUP_LABEL: "g"}, annotations={POD_GROUP_SIZE_ANNOTATION: size}
                ),
                "team-a-train",
                "invalid-pod-group",
                ["must be a whole number from 1 to 10000"],
            )
            for size in ["0", "-1", "two", "1.5", "", " 3", "99999", "٣", "1" * 5000]
        ],
        # malformed metadata
        (
            dict(gpu_pod(), metadata={"labels": ["a"]}),
            "team-a-train",
            "malformed-pod",
            ["metadata.labels must be an object"],
        ),
        (
            dict(gpu_pod(), metadata={"annotations": {"a": 1}}),
            "team-a-train",
            "malformed-pod",
            ["metadata.annotations['a'] must be a string"],
        ),
        (
            gpu_pod(priorityClassName=7),
            "team-a-train",
            "malformed-pod",
            ["spec.priorityClassName must be a string"],
        ),
    ],
)
def test_denials(pod: Any, namespace: str, code: str, fragments: list[str]) -> None:
    result = denied(pod, namespace)
    assert result.code == code
    for fragment in fragments:
        assert fragment in result.message


def test_tenant_that_allows_no_class_is_denied() -> None:
    config = make_config()
    platform = config.platform.model_copy(
        update={
            "tenants": {
                **config.platform.tenants,
                "team-a": config.platform.tenants["team-a"].model_copy(update={"classes": ()}),
            }
        }
    )
    config = type(config)(platform=platform, quotas=config.quotas, namespaces=config.namespaces)
    result = plan_create(gpu_pod(), "team-a-train", UID, config)
    assert isinstance(result, Denied)
    assert result.code == "no-class"


def test_messages_stay_short_with_long_names() -> None:
    long = "x" * 63
    result = denied(gpu_pod(labels={TENANT_LABEL: long, POD_GROUP_LABEL: long}), "plain-ns")
    assert result.message.startswith("namespace plain-ns has no")
    result = denied(gpu_pod(labels={TENANT_LABEL: long}))
    assert len(result.message) <= MAX_MESSAGE_CHARS


@pytest.mark.parametrize(
    ("pod", "namespace", "pod_class"),
    [
        # inference exactly at nominal is fine
        (gpu_pod(8, owner="ReplicaSet"), "team-a-serving", "inference"),
        (
            gpu_pod(14, resource="nvidia.com/mig-1g.5gb", owner="StatefulSet"),
            "team-a-serving",
            "inference",
        ),
        # training may exceed nominal per resource when the tenant can borrow: up to
        # the 8 GPUs of nominal that are not the inference reserve + 4 borrowed
        (gpu_pod(12), "team-a-train", "training"),
        # a gang that fits whole: 3 x 4 GPUs
        (gpu_pod(4, labels={"fairgate.io/pod-group": "ddp"},
                 annotations={"fairgate.io/pod-group-size": "3"}), "team-a-train", "training"),
        (gpu_pod(2, resource="nvidia.com/mig-3g.40gb"), "team-a-train", "training"),
        (gpu_pod(2), "team-b-dev", "training"),
    ],
)
def test_pods_that_can_fit_are_planned(pod: Any, namespace: str, pod_class: str) -> None:
    assert planned(pod, namespace).pod_class == pod_class


def test_user_class_label_and_tenant_label_matching_namespace_are_accepted() -> None:
    result = planned(gpu_pod(labels={CLASS_LABEL: "inference", TENANT_LABEL: "team-a"}))
    assert result.pod_class == "inference"
    assert result.warnings == ()


def test_a_user_may_mark_training_preemptible() -> None:
    """Consent to reclaim is the user's own: the label is accepted as it is."""
    result = planned(gpu_pod(labels={PREEMPTIBLE_LABEL: "true"}))
    assert result.pod_class == "training"
    assert result.warnings == ()


def test_gang_is_read() -> None:
    pod = gpu_pod(
        labels={POD_GROUP_LABEL: "llama-ft"}, annotations={POD_GROUP_SIZE_ANNOTATION: "8"}
    )
    assert planned(pod).group == PodGroup("llama-ft", 8)


def test_foreign_priority_class_gives_a_warning_not_a_denial() -> None:
    result = planned(gpu_pod(priorityClassName="system-cluster-critical"))
    assert result.warnings == (
        "priorityClassName 'system-cluster-critical' replaced by fairgate's class "
        "for training pods",
    )


@pytest.mark.parametrize("pc", ["fairgate-training", "fairgate-borrowed"])
def test_training_may_carry_either_training_band(pc: str) -> None:
    assert planned(gpu_pod(priorityClassName=pc)).warnings == ()


def test_reinvocation_reuses_the_ticket() -> None:
    pod = gpu_pod(
        2,
        labels={TENANT_LABEL: "team-a", CLASS_LABEL: "training"},
        annotations={
            TICKET_ANNOTATION: "first-uid",
            DEMAND_ANNOTATION: "gpu=2",
            BORROWED_ANNOTATION: "true",
        },
        priorityClassName="fairgate-borrowed",
        priority=1000,
    )
    result = planned(pod)
    assert result.ticket == "first-uid"
    assert result.reused_ticket is True


def test_reinvocation_with_changed_demand_is_refused() -> None:
    pod = gpu_pod(
        3,
        labels={TENANT_LABEL: "team-a"},
        annotations={TICKET_ANNOTATION: "first-uid", DEMAND_ANNOTATION: "gpu=2"},
    )
    assert "does not match the pod's GPU demand gpu=3" in denied(pod).message


def test_mig_profile_pod_is_planned_for_single_nodes_of_its_profile() -> None:
    result = plan(gpu_pod(2, labels={"fairgate.io/mig-profile": "1g.5gb"}))
    assert isinstance(result, PodPlan)
    assert result.demand == {"mig-1g.5gb": 2}
    assert result.demand_slices == 2
    assert (result.placement.strategy, result.placement.profile) == ("single", "1g.5gb")


def test_pool_tenant_plan_has_its_pool_and_others_none() -> None:
    pooled = plan(gpu_pod(1, namespace="team-b-dev"), "team-b-dev")
    assert isinstance(pooled, PodPlan)
    assert pooled.placement.pool == "a100-pool"
    plain = plan(gpu_pod(1))
    assert isinstance(plain, PodPlan)
    assert plain.placement.pool is None


def test_mig_profile_on_a_mixed_pod_is_denied_with_a_fix() -> None:
    result = denied(gpu_pod(1, labels={"fairgate.io/mig-profile": "1g.5gb"},
                            resource="nvidia.com/mig-1g.5gb"))
    assert result.code == "invalid-demand"
    assert "request nvidia.com/gpu only, or drop the label" in result.message


def test_mig_profile_label_without_gpu_is_denied() -> None:
    pod = gpu_pod(0, labels={"fairgate.io/mig-profile": "1g.5gb"})
    result = denied(pod)
    assert result.code == "invalid-demand"
    assert "asks for no nvidia.com/gpu" in result.message


def test_forged_pool_annotation_is_refused() -> None:
    result = denied(gpu_pod(1, annotations={"fairgate.io/node-pool": "a100-pool"}))
    assert result.code == "fairgate-field"


def _autoscaled(max_capacity: dict[str, int], mode: str = "pending") -> Any:
    """CONFIG with autoscaled pools of at most ``max_capacity``."""
    from dataclasses import replace

    from tenants.models import AutoscalingSpec

    spec = AutoscalingSpec.model_validate({"mode": mode, "maxCapacity": max_capacity})
    return replace(CONFIG, platform=CONFIG.platform.model_copy(update={"autoscaling": spec}))


def test_with_autoscaled_pools_a_pod_larger_than_their_maximum_never_fits() -> None:
    config = _autoscaled({"gpu": 4})
    result = plan_create(gpu_pod(5), "team-a-train", UID, config)
    assert isinstance(result, Denied) and result.code == "never-fits", result
    assert result.message == (
        "pod asks for gpu=5 of whole GPUs but the GPU pools can hold at most gpu=4 "
        "(autoscaling.maxCapacity in ConfigMap fairgate-platform): ask for less, or ask a "
        "platform admin to raise maxCapacity")
    assert isinstance(plan_create(gpu_pod(4), "team-a-train", UID, config), PodPlan)
    # without autoscaling the same pod is judged by quota alone (it waits for capacity)
    assert isinstance(plan(gpu_pod(5)), PodPlan)


def test_a_gang_is_judged_whole_against_the_pools_maximum() -> None:
    config = _autoscaled({"gpu": 6}, mode="provisioningRequest")
    pod = gpu_pod(2, labels={POD_GROUP_LABEL: "g"},
                  annotations={POD_GROUP_SIZE_ANNOTATION: "4"})
    result = plan_create(pod, "team-a-train", UID, config)
    assert isinstance(result, Denied) and result.code == "never-fits", result
    assert result.message.startswith("gang g asks for gpu=8 of whole GPUs but the GPU pools "
                                     "can hold at most gpu=6")


def test_keys_the_maximum_does_not_list_are_not_autoscaled_and_not_judged() -> None:
    # team-b's pods run in node pool a100-pool: only gpu@a100-pool would bound them
    config = _autoscaled({"gpu": 1})
    assert isinstance(plan_create(gpu_pod(2, namespace="team-b-dev"), "team-b-dev", UID,
                                  config), PodPlan)
    config = _autoscaled({"gpu@a100-pool": 1})
    result = plan_create(gpu_pod(2, namespace="team-b-dev"), "team-b-dev", UID, config)
    assert isinstance(result, Denied) and "at most gpu@a100-pool=1" in result.message
