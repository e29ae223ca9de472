"""PodView.parse: a pod read once into a typed, immutable view, or a PodError naming the
field that has the wrong shape."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from admission_kit import gpu_pod, load_review
from hypothesis import given, settings
from hypothesis import strategies as st
from pod_strategies import pods

from admission.pods import CLAIM, TEMPLATE, OwnerRef, PodClaim, PodError, PodView


@pytest.mark.parametrize(
    ("bad_pod", "message"),
    [
        ([], "pod must be an object"),
        ({"metadata": "x"}, "metadata must be an object"),
        ({"spec": []}, "spec must be an object"),
        ({"spec": {"containers": {"a": 1}}}, "spec.containers must be a list"),
        ({"spec": {"containers": ["x"]}}, r"spec.containers\[0\] must be an object"),
        ({"spec": {"initContainers": 3}}, "spec.initContainers must be a list"),
        ({"spec": {"containers": [{"name": 3}]}}, r"spec.containers\[0\].name must be a string"),
        (
            {"spec": {"containers": [{"name": "a", "resources": []}]}},
            "container 'a': resources must be",
        ),
        (
            {"spec": {"containers": [{"resources": {"limits": "1"}}]}},
            r"spec.containers\[0\]: resources.limits",
        ),
        (
            {"spec": {"initContainers": [{"name": "i", "resources": {"requests": []}}]}},
            "init container 'i': resources.requests must be an object",
        ),
        (
            {"spec": {"initContainers": [{"name": "s", "restartPolicy": True}]}},
            r"spec.initContainers\[0\].restartPolicy must be a string",
        ),
        ({"metadata": {"labels": ["a"]}}, "metadata.labels must be an object"),
        ({"metadata": {"annotations": {"a": 1}}}, r"metadata.annotations\['a'\] must be a string"),
        ({"metadata": {"name": 5}}, "metadata.name must be a string"),
        ({"metadata": {"ownerReferences": {}}}, "metadata.ownerReferences must be a list"),
        ({"metadata": {"ownerReferences": [{"kind": 1}]}},
         r"metadata.ownerReferences\[0\].kind must be a string"),
        ({"metadata": {"ownerReferences": [{"controller": "yes"}]}},
         r"metadata.ownerReferences\[0\].controller must be a boolean"),
        ({"spec": {"priorityClassName": 7}}, "spec.priorityClassName must be a string"),
        ({"spec": {"schedulingGates": [{"name": 3}]}}, r"spec.schedulingGates\[0\].name"),
        ({"spec": {"schedulingGroup": "g"}}, "spec.schedulingGroup must be an object"),
        ({"spec": {"resourceClaims": {}}}, "spec.resourceClaims must be a list"),
        ({"spec": {"resourceClaims": [{"name": "x"}]}},
         "resource claim 'x': name a resourceClaimName or a resourceClaimTemplateName"),
        ({"spec": {"resourceClaims": [{"name": "x", "resourceClaimName": "c",
                                        "resourceClaimTemplateName": "t"}]}},
         "resource claim 'x': name either resourceClaimName or resourceClaimTemplateName"),
        ({"status": {"resourceClaimStatuses": [{"name": "x", "resourceClaimName": 1}]}},
         r"status.resourceClaimStatuses\[0\].resourceClaimName must be a string"),
    ],
)
def test_a_pod_of_the_wrong_shape_is_a_pod_error_naming_the_field(
    bad_pod: Any, message: str
) -> None:
    with pytest.raises(PodError, match=message):
        PodView.parse(bad_pod)


def test_the_view_holds_what_the_rules_read() -> None:
    view = PodView.parse({
        "metadata": {
            "generateName": "trainer-", "namespace": "ns", "uid": "u-1",
            "labels": {"app": "t"}, "annotations": {"a": "b"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r"},
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j-1",
                 "controller": True},
            ],
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            "initContainers": [{"name": "side", "restartPolicy": "Always"}, {}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "tpl"},
                               {"resourceClaimName": "shared"}],
            "schedulingGates": [{"name": "g"}],
            "priorityClassName": "p",
            "schedulingGroup": {"podGroupName": "pg"},
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "c-1"},
                                             {"name": "none"}]},
    })
    assert (view.admitted_name, view.namespace, view.uid) == ("trainer-*", "ns", "u-1")
    assert dict(view.labels) == {"app": "t"} and dict(view.annotations) == {"a": "b"}
    assert view.controller == OwnerRef("batch/v1", "Job", "j", "j-1", controller=True)
    assert view.owners[0].kind == "ReplicaSet" and not view.owners[0].controller
    assert view.containers[0].where == "container 'main'"
    assert dict(view.containers[0].limits) == {"nvidia.com/gpu": "2"}
    assert [c.sidecar for c in view.init_containers] == [True, False]
    assert view.init_containers[1].where == "spec.initContainers[1]"
    assert view.claims == (PodClaim("gpus", TEMPLATE, "tpl"), PodClaim("1", CLAIM, "shared"))
    assert view.scheduling_gates == ("g",)
    assert view.priority_class_name == "p" and view.pod_group_name == "pg"
    assert dict(view.claim_statuses) == {"gpus": "c-1"}


def test_an_absent_or_null_field_reads_as_empty() -> None:
    view = PodView.parse({"metadata": None, "spec": {"containers": None}})
    assert view == PodView()
    assert view.admitted_name == "" and view.controller is None


def test_the_view_cannot_be_changed_nor_changes_with_the_pod() -> None:
    pod = gpu_pod(2, labels={"app": "t"})
    view = PodView.parse(pod)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.labels["app"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        view.containers[0].limits["nvidia.com/gpu"] = "9"  # type: ignore[index]
    pod["metadata"]["labels"]["app"] = "changed"
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9"
    assert view.labels["app"] == "t"
    assert view.containers[0].limits["nvidia.com/gpu"] == 2


def test_a_view_built_in_code_is_read_only_too() -> None:
    labels = {"a": "b"}
    view = PodView(labels=labels)
    labels["a"] = "c"
    assert view.labels["a"] == "b"
    with pytest.raises(TypeError):
        view.labels["a"] = "d"  # type: ignore[index]


def test_a_long_generate_name_is_cut_as_the_api_server_cuts_it() -> None:
    view = PodView.parse({"metadata": {"generateName": "d" * 70}})
    assert view.admitted_name == "d" * 58 + "*"
    assert PodView.parse({"metadata": {"name": "n", "generateName": "g-"}}).admitted_name == "n"


@pytest.mark.parametrize("fixture", ["bare_create", "job_init_sidecar_create",
                                     "mig_pytorchjob_create", "deployment_inference_create"])
def test_real_pods_parse(fixture: str) -> None:
    view = PodView.parse(load_review(fixture)["request"]["object"])
    assert view.containers


@settings(max_examples=200, deadline=None)
@given(pods())
def test_every_generated_pod_parses(pod: dict[str, Any]) -> None:
    view = PodView.parse(pod)
    assert len(view.containers) == len(pod["spec"].get("containers") or [])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "spec", "status", "labels", "containers", "name",
                         "resources", "limits", "resourceClaims", "ownerReferences"]),
        inner, max_size=4),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_arbitrary_json_gives_a_view_or_a_pod_error(value: Any) -> None:
    try:
        view = PodView.parse(value)
    except PodError:
        return
    assert isinstance(view, PodView)
