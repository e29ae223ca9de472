"""build_patch: JSON Patch that applies to any valid pod and keeps the user's settings."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from admission_kit import CONFIG, gpu_pod, load_review
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pod_strategies import pods

from admission import pods as pods_module
from admission.mutation import GPU_TOLERATION, build_patch, mutate_pod
from admission.plan import PodPlan, plan_create
from admission.reviews import parse_review
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    PodClass,
    PriorityBand,
)
from tenants.placement import (
    NODE_POOL_ANNOTATION,
    SINGLE_PRODUCTS,
    pod_placement,
    requirements,
)

CLASSES = CONFIG.platform.priority_classes
K8S_VERSION = "1.33.0"
NOT_MIG = {"key": "nvidia.com/mig.strategy", "operator": "NotIn", "values": ["single", "mixed"]}
ONLY_MIXED = {"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["mixed"]}
ONLY_SINGLE = {"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["single"]}
NO_POOL = {"key": "fairgate.io/node-pool", "operator": "DoesNotExist"}


def placement_requirements(
    demand: dict[str, int], pool: str | None, profile: str | None = None
) -> list[dict[str, Any]]:
    """What the webhook must write for a pod of ``demand`` (label ``profile``) in ``pool``."""
    return requirements(pod_placement(demand, profile, pool))


def make_plan(
    demand: dict[str, int] | None = None,
    tenant: str = "team-a",
    pod_class: PodClass = "training",
    node_pool: str | None = None,
    profile: str | None = None,
) -> PodPlan:
    import dataclasses

    found = CONFIG.tenant(tenant)
    assert found is not None
    if node_pool is not None:
        found = dataclasses.replace(found, node_pool=node_pool)
    counts = demand or {"gpu": 1}
    return PodPlan(
        tenant=found,
        pod_class=pod_class,
        class_reason="test",
        demand=counts,
        demand_slices=0,
        ticket="ticket-1",
        reused_ticket=False,
        group=None,
        placement=pod_placement(counts, profile, found.node_pool),
    )


def patched(
    pod: dict[str, Any], plan: PodPlan, band: PriorityBand = "training", gated: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    original = copy.deepcopy(pod)
    ops = build_patch(pod, plan, band, gated, CLASSES)
    assert pod == original, "build_patch must not modify its input"
    result = jsonpatch.apply_patch(pod, ops)
    assert result == mutate_pod(pod, plan, band, gated, CLASSES)
    return ops, result


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


# --- table tests -------------------------------------------------------------------------


def test_bare_pod_gets_every_parent_created() -> None:
    pod = parse_review(load_review("bare_create")).request.object
    assert pod is not None
    ops, result = patched(pod, make_plan(), gated=True)
    paths = {op["path"] for op in ops}
    assert {
        "/metadata/labels",
        "/metadata/annotations",
        "/spec/tolerations",
        "/spec/affinity",
        "/spec/schedulingGates",
        "/spec/priorityClassName",
        "/spec/priority",
        "/spec/preemptionPolicy",
    } <= paths
    assert all(op["op"] == "add" for op in ops)
    assert result["metadata"]["labels"] == {TENANT_LABEL: "team-a", CLASS_LABEL: "training"}
    assert result["metadata"]["annotations"] == {
        TICKET_ANNOTATION: "ticket-1",
        DEMAND_ANNOTATION: "gpu=1",
    }
    assert result["spec"]["tolerations"] == [dict(GPU_TOLERATION)]
    assert required_terms(result) == [{"matchExpressions": [NOT_MIG, NO_POOL]}]
    assert result["spec"]["schedulingGates"] == [{"name": QUEUE_GATE}]
    assert (
        result["spec"]["priorityClassName"],
        result["spec"]["priority"],
        result["spec"]["preemptionPolicy"],
    ) == ("fairgate-training", 10000, "PreemptLowerPriority")


def test_keys_with_slashes_are_escaped() -> None:
    pod = gpu_pod(labels={"app": "x"}, annotations={"example.com/a": "b"})
    ops, _ = patched(pod, make_plan())
    paths = {op["path"] for op in ops}
    assert "/metadata/labels/fairgate.io~1tenant" in paths
    assert "/metadata/annotations/fairgate.io~1ticket" in paths


@pytest.mark.parametrize(
    ("demand", "pool", "expected"),
    [
        ({"gpu": 2}, None, [NOT_MIG, NO_POOL]),
        ({"mig-1g.5gb": 1}, None, [ONLY_MIXED, NO_POOL]),
        ({"mig-1g.5gb": 1, "gpu": 1}, None, [ONLY_MIXED, NO_POOL]),
        (
            {"gpu": 1},
            "a100-pool",
            [NOT_MIG, {"key": "fairgate.io/node-pool", "operator": "In", "values": ["a100-pool"]}],
        ),
    ],
)
def test_placement_requirements(
    demand: dict[str, int], pool: str | None, expected: list[dict[str, Any]]
) -> None:
    _, result = patched(gpu_pod(), make_plan(demand, node_pool=pool))
    assert required_terms(result) == [{"matchExpressions": expected}]


def test_single_mig_pod_goes_to_single_nodes_of_its_profile_and_pool_is_annotated() -> None:
    plan = make_plan({"mig-1g.5gb": 2}, node_pool="pool-a", profile="1g.5gb")
    _, result = patched(gpu_pod(), plan)
    product = {"key": "nvidia.com/gpu.product", "operator": "In",
               "values": list(SINGLE_PRODUCTS["1g.5gb"])}
    assert "A100-SXM4-40GB-MIG-1g.5gb" in product["values"]
    pool = {"key": "fairgate.io/node-pool", "operator": "In", "values": ["pool-a"]}
    assert required_terms(result) == [{"matchExpressions": [ONLY_SINGLE, product, pool]}]
    assert result["metadata"]["annotations"][NODE_POOL_ANNOTATION] == "pool-a"


def test_pool_annotation_is_removed_for_a_tenant_without_pool() -> None:
    pod = gpu_pod(annotations={NODE_POOL_ANNOTATION: "forged"})
    _, result = patched(pod, make_plan())
    assert NODE_POOL_ANNOTATION not in result["metadata"]["annotations"]


def test_affinity_fixture_merges_into_every_term_and_keeps_the_rest() -> None:
    request = parse_review(load_review("affinity_tolerations_create")).request
    pod = request.object
    assert pod is not None
    plan = plan_create(pod, request.namespace, request.uid, CONFIG)
    assert isinstance(plan, PodPlan)
    _, result = patched(pod, plan, gated=True)
    pool = {"key": "fairgate.io/node-pool", "operator": "In", "values": ["a100-pool"]}
    zone = {
        "key": "topology.kubernetes.io/zone",
        "operator": "In",
        "values": ["eu-west-1a", "eu-west-1b"],
    }
    assert required_terms(result) == [
        {"matchExpressions": [zone, NOT_MIG, pool]},
        {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-17"]}],
            "matchExpressions": [NOT_MIG, pool],
        },
    ]
    before, after = pod["spec"]["affinity"], result["spec"]["affinity"]
    assert after["podAntiAffinity"] == before["podAntiAffinity"]
    assert (
        after["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == before["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    )
    # the Equal/value toleration does not cover every nvidia.com/gpu taint: ours is appended
    assert result["spec"]["tolerations"] == [*pod["spec"]["tolerations"], dict(GPU_TOLERATION)]
    assert result["spec"]["schedulingGates"] == [
        {"name": "example.com/quota-check"},
        {"name": QUEUE_GATE},
    ]
    assert result["metadata"]["labels"][CLASS_LABEL] == "training"
    assert result["metadata"]["annotations"]["example.com/owner"] == "bob"
    assert result["spec"]["priorityClassName"] == "fairgate-training"


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "", "operator": "Exists", "effect": "NoSchedule"},
    ],
)
def test_equivalent_toleration_is_not_duplicated(toleration: dict[str, str]) -> None:
    _, result = patched(gpu_pod(tolerations=[toleration]), make_plan())
    assert result["spec"]["tolerations"] == [toleration]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "other", "operator": "Exists"},
    ],
)
def test_non_equivalent_toleration_gets_ours_appended(toleration: dict[str, str]) -> None:
    _, result = patched(gpu_pod(tolerations=[toleration]), make_plan())
    assert result["spec"]["tolerations"] == [toleration, dict(GPU_TOLERATION)]


def test_existing_requirement_is_not_duplicated_and_empty_terms_are_left_alone() -> None:
    terms = [{"matchExpressions": [NOT_MIG, NO_POOL]}, {},
             {"matchExpressions": [], "matchFields": []}]
    pod = gpu_pod(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }
    )
    _, result = patched(pod, make_plan())
    assert required_terms(result) == terms


@pytest.mark.parametrize(
    "affinity",
    [
        {},
        {"nodeAffinity": None},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}},
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
            }
        },
        {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
    ],
)
def test_partial_affinity_structures_are_completed(affinity: dict[str, Any]) -> None:
    _, result = patched(gpu_pod(affinity=affinity), make_plan({"mig-1g.5gb": 1}))
    assert required_terms(result) == [{"matchExpressions": [ONLY_MIXED, NO_POOL]}]


def test_null_metadata_maps_are_replaced() -> None:
    pod = gpu_pod()
    pod["metadata"]["labels"] = None
    pod["metadata"]["annotations"] = None
    pod["spec"]["tolerations"] = None
    _, result = patched(pod, make_plan())
    assert result["metadata"]["labels"][TENANT_LABEL] == "team-a"


def test_borrowed_band_stamps_annotation_and_never_preempts() -> None:
    _, result = patched(gpu_pod(), make_plan(), band="borrowed")
    assert result["metadata"]["annotations"][BORROWED_ANNOTATION] == "true"
    assert result["spec"]["priorityClassName"] == "fairgate-borrowed"
    assert result["spec"]["priority"] == 1000
    assert result["spec"]["preemptionPolicy"] == "Never"


def test_training_band_drops_a_stale_borrowed_annotation() -> None:
    pod = gpu_pod(annotations={BORROWED_ANNOTATION: "true", "keep": "me"})
    ops, result = patched(pod, make_plan(), band="training")
    assert result["metadata"]["annotations"] == {
        "keep": "me",
        TICKET_ANNOTATION: "ticket-1",
        DEMAND_ANNOTATION: "gpu=1",
    }
    assert {"op": "remove", "path": "/metadata/annotations/fairgate.io~1borrowed"} in ops


def test_inference_band_values() -> None:
    _, result = patched(
        gpu_pod(priorityClassName="x", priority=5),
        make_plan(pod_class="inference"),
        band="inference",
    )
    assert (result["spec"]["priorityClassName"], result["spec"]["priority"]) == (
        "fairgate-inference",
        100000,
    )


@pytest.mark.parametrize(
    ("gates", "gated", "expected"),
    [
        (None, False, None),
        (None, True, [QUEUE_GATE]),
        ([], False, []),
        (["a"], True, ["a", QUEUE_GATE]),
        ([QUEUE_GATE], True, [QUEUE_GATE]),
        (["a", QUEUE_GATE, "b"], True, ["a", "b", QUEUE_GATE]),
        ([QUEUE_GATE, "b", QUEUE_GATE], False, ["b"]),
    ],
)
def test_gate(gates: list[str] | None, gated: bool, expected: list[str] | None) -> None:
    pod = gpu_pod()
    if gates is not None:
        pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    _, result = patched(pod, make_plan(), gated=gated)
    got = result["spec"].get("schedulingGates")
    assert (None if got is None else [g["name"] for g in got]) == expected


@pytest.mark.parametrize(
    ("pod_class", "band"),
    [("inference", "training"), ("inference", "borrowed"), ("training", "inference")],
)
def test_band_must_suit_class(pod_class: PodClass, band: PriorityBand) -> None:
    with pytest.raises(ValueError, match="does not suit"):
        build_patch(gpu_pod(), make_plan(pod_class=pod_class), band, False, CLASSES)


@pytest.mark.parametrize(
    ("fixture", "band", "gated"),
    [
        ("deployment_inference_create", "inference", False),
        ("job_init_sidecar_create", "training", True),
        ("mig_pytorchjob_create", "borrowed", True),
        ("affinity_tolerations_create", "training", False),
        ("bare_create", "training", True),
    ],
)
def test_fixture_results_are_valid_pods(fixture: str, band: PriorityBand, gated: bool) -> None:
    request = parse_review(load_review(fixture)).request
    pod = request.object
    assert pod is not None
    plan = plan_create(pod, request.namespace, request.uid, CONFIG)
    assert isinstance(plan, PodPlan)
    _, result = patched(pod, plan, band, gated)
    kubernetes_validate.validate(result, K8S_VERSION, strict=True)


# --- property: the patch applies to any valid pod and keeps what the user wrote ----------

PLAN_ARGS = st.tuples(
    st.sampled_from([{"gpu": 1}, {"mig-1g.5gb": 2}, {"gpu": 1, "mig-3g.40gb": 1}]),
    st.sampled_from([None, "a100-pool"]),
    st.sampled_from(
        [("inference", "inference"), ("training", "training"), ("training", "borrowed")]
    ),
    st.booleans(),
)


OWNED_PATHS = (
    "/metadata/labels",
    "/metadata/annotations",
    "/spec/priorityClassName",
    "/spec/priority",
    "/spec/preemptionPolicy",
    "/spec/tolerations",
    "/spec/affinity",
    "/spec/schedulingGates",
)


def _non_empty(term: dict[str, Any]) -> bool:
    return bool(term.get("matchExpressions") or term.get("matchFields"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), PLAN_ARGS)
def test_patch_applies_and_keeps_user_settings(pod: dict[str, Any], args: Any) -> None:
    demand, pool, (pod_class, band), gated = args
    plan = make_plan(demand, pod_class=pod_class, node_pool=pool)
    before = copy.deepcopy(pod)
    ops = build_patch(pod, plan, band, gated, CLASSES)
    assert pod == before
    result = jsonpatch.apply_patch(pod, ops)  # raises if any op does not apply
    for op in ops:  # the patch only touches what fairgate owns or appends to
        assert op["op"] in ("add", "replace", "remove", "move"), op
        assert op["path"].startswith(OWNED_PATHS) or op["path"] in ("/metadata",), op

    spec, old_spec = result["spec"], before["spec"]
    assert spec["containers"] == old_spec["containers"]
    assert spec.get("initContainers") == old_spec.get("initContainers")
    assert spec.get("nodeSelector") == old_spec.get("nodeSelector")
    # every original toleration kept, in order; the GPU taint is tolerated
    old_tolerations = old_spec.get("tolerations") or []
    assert spec["tolerations"][: len(old_tolerations)] == old_tolerations
    assert any(
        t.get("operator") == "Exists"
        and t.get("key", "") in ("", "nvidia.com/gpu")
        and t.get("effect", "") in ("", "NoSchedule")
        for t in spec["tolerations"]
    )
    # node affinity: every original requirement kept; fairgate's added to every live term
    wanted = placement_requirements(demand, pool)
    old_affinity = old_spec.get("affinity") or {}
    old_node = old_affinity.get("nodeAffinity") or {}
    old_required = old_node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    old_terms = old_required.get("nodeSelectorTerms") or []
    terms = required_terms(result)
    if old_terms:
        assert len(terms) == len(old_terms)
    for i, term in enumerate(terms):
        old = old_terms[i] if old_terms else {}
        assert term.get("matchFields") == old.get("matchFields")
        old_expressions = old.get("matchExpressions") or []
        assert term.get("matchExpressions", [])[: len(old_expressions)] == old_expressions
        if _non_empty(old) or not old_terms:
            assert all(r in term["matchExpressions"] for r in wanted)
        else:
            assert term == old
    new_affinity = spec["affinity"]
    for key, value in old_affinity.items():
        if key != "nodeAffinity":
            assert new_affinity[key] == value
    if "preferredDuringSchedulingIgnoredDuringExecution" in old_node:
        assert (
            new_affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            == old_node["preferredDuringSchedulingIgnoredDuringExecution"]
        )
    # labels and annotations: user entries kept, fairgate's set
    labels, annotations = result["metadata"]["labels"], result["metadata"]["annotations"]
    for key, value in (before["metadata"].get("labels") or {}).items():
        assert key in (TENANT_LABEL, CLASS_LABEL) or labels[key] == value
    for key, value in (before["metadata"].get("annotations") or {}).items():
        assert key in (TICKET_ANNOTATION, DEMAND_ANNOTATION) or annotations[key] == value
    assert labels[TENANT_LABEL] == "team-a" and labels[CLASS_LABEL] == pod_class
    assert annotations[TICKET_ANNOTATION] == "ticket-1"
    assert annotations[DEMAND_ANNOTATION] == ",".join(f"{k}={v}" for k, v in sorted(demand.items()))
    assert (annotations.get(BORROWED_ANNOTATION) == "true") == (band == "borrowed")
    priority = CLASSES.for_band(band)
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        priority.name,
        priority.value,
        priority.preemption_policy,
    )
    # gates: the user's kept in order, ours exactly when gated
    old_gates = [
        g["name"] for g in old_spec.get("schedulingGates") or [] if g["name"] != QUEUE_GATE
    ]
    gates = [g["name"] for g in spec.get("schedulingGates") or []]
    assert gates == old_gates + ([QUEUE_GATE] if gated else [])


# --- property: the direct operations give exactly the pod the old diff approach gave -----

POOL_REQUIREMENT = {"key": "fairgate.io/node-pool", "operator": "In", "values": ["a100-pool"]}
MISSHAPEN = st.sampled_from(["x", 3, [], {}, [1], {"a": 1}])
# Paths where a pod may carry fairgate's fields already, stale, or with odd JSON types.
STAMPS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("metadata", "labels", TENANT_LABEL): st.sampled_from(["team-a", "team-b", 1]),
    ("metadata", "labels", CLASS_LABEL): st.sampled_from(["training", "inference"]),
    ("metadata", "annotations", TICKET_ANNOTATION): st.sampled_from(["ticket-1", "old"]),
    ("metadata", "annotations", DEMAND_ANNOTATION): st.sampled_from(["gpu=1", "mig-1g.5gb=2"]),
    ("metadata", "annotations", BORROWED_ANNOTATION): st.sampled_from(["true", "false"]),
    ("spec", "priorityClassName"): st.sampled_from(["fairgate-training", "fairgate-borrowed"]),
    ("spec", "priority"): st.sampled_from([10000, 1000, 100000, True, 10000.0, None]),
    ("spec", "preemptionPolicy"): st.sampled_from(["Never", "PreemptLowerPriority"]),
    ("spec", "tolerations"): st.just([dict(GPU_TOLERATION)]),
    ("spec", "schedulingGates"): st.lists(
        st.sampled_from([QUEUE_GATE, "example.com/a"]).map(lambda n: {"name": n}), max_size=4
    ),
}
# Paths fairgate reads or writes: any of them may have the wrong JSON type.
SHAPED = [
    ("metadata",), ("metadata", "labels"), ("metadata", "annotations"), ("spec",),
    ("spec", "tolerations"), ("spec", "schedulingGates"), ("spec", "affinity"),
    ("spec", "affinity", "nodeAffinity"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
     "nodeSelectorTerms"),
]


def _put(pod: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = pod
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def stamped_pods(draw: st.DrawFn) -> dict[str, Any]:
    """pods() that may already carry (some of) fairgate's fields, requirements in their
    terms, terms with null matchExpressions, or a wrong JSON type on one path."""
    pod = draw(pods())
    for path, values in STAMPS.items():
        if draw(st.booleans()):
            _put(pod, path, draw(values))
    terms: list[Any] = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                        .get("requiredDuringSchedulingIgnoredDuringExecution") or {}
                        ).get("nodeSelectorTerms") or []
    for i, term in enumerate(terms):
        if draw(st.booleans()):
            term["matchExpressions"] = draw(st.one_of(st.sampled_from(
                [None, [NOT_MIG], [ONLY_MIXED, POOL_REQUIREMENT], [POOL_REQUIREMENT]]), MISSHAPEN))
        if draw(st.integers(0, 9)) == 0:
            terms[i] = draw(MISSHAPEN)
    if draw(st.integers(0, 3)) == 0:
        _put(pod, draw(st.sampled_from(SHAPED)), draw(MISSHAPEN))
    return pod


def _outcome(make: Any) -> Any:
    try:
        return make()
    except pods_module.PodError as exc:
        return ("PodError", str(exc))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stamped_pods(), PLAN_ARGS)
def test_operations_give_exactly_the_pod_the_diff_of_mutate_pod_gives(
    pod: dict[str, Any], args: Any
) -> None:
    demand, pool, (pod_class, band), gated = args
    plan = make_plan(demand, pod_class=pod_class, node_pool=pool)
    before = copy.deepcopy(pod)

    def reference() -> Any:  # build_patch as it was: diff the stamped deep copy
        return jsonpatch.apply_patch(
            pod, jsonpatch.make_patch(pod, mutate_pod(pod, plan, band, gated, CLASSES)))

    expected = _outcome(reference)
    ops = _outcome(lambda: build_patch(pod, plan, band, gated, CLASSES))
    assert pod == before, "build_patch must not modify its input"
    if isinstance(expected, tuple):  # a misshapen pod: the same error, naming the field
        assert ops == expected
        return
    result = jsonpatch.apply_patch(pod, ops)
    # equal as JSON text too: Python's == takes true for 1 and 1.0 for 1
    assert json.dumps(result, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert build_patch(result, plan, band, gated, CLASSES) == []  # stamping is idempotent
