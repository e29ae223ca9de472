"""The ProvisioningRequest bodies fairgate sends (autoscaling.x-k8s.io/v1, as
cluster-autoscaler's types define them): one PodTemplate per pod shape, counted, owned
by the pods, and valid under cluster-autoscaler's own CRD schema (tests/e2e/crds; the
e2e tests have the API server check them too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fairshare.cluster.provreq_create import MAX_POD_SETS, pod_sets, request_body

CRD = Path(__file__).parents[2] / "e2e" / "crds" / "autoscaling.x-k8s.io_provisioningrequests.yaml"
LABELS = {"fairgate.io/provisioning-for": "fairgate-abc"}


def _pod(name: str, gpus: int, index: int | None = None) -> dict[str, Any]:
    """A gated GPU pod; with ``index``, as an Indexed Job's controller makes it."""
    labels = {"fairgate.io/pod-group": "g"}
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": "fairgate.io/queue"}],
        "containers": [{"name": "main", "image": "trainer",
                        "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if index is not None:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
        spec = {**spec, "hostname": f"{name}-{index}", "subdomain": "ddp"}
    return {"metadata": {"name": name, "namespace": "team-a-ns", "uid": f"uid-{name}",
                         "labels": labels, "annotations": {"fairgate.io/ticket": name}},
            "spec": spec, "status": {"phase": "Pending"}}


def _v1_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = next(v for v in crd["spec"]["versions"]
                                  if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    return schema


def test_a_gang_of_two_shapes_is_two_pod_sets_with_their_counts() -> None:
    pods = [_pod("w0", 2), _pod("w1", 2), _pod("l0", 1)]
    sets = pod_sets("fairgate-abc", pods, LABELS)
    assert [(t["metadata"]["name"], count) for t, count in sets] == [
        ("fairgate-abc-0", 2), ("fairgate-abc-1", 1)]
    template = sets[0][0]
    assert template["kind"] == "PodTemplate" and template["metadata"]["labels"] == LABELS
    assert "schedulingGates" not in template["template"]["spec"]  # what would run
    # what the pods of a set share: the gang label, not one pod's ticket
    assert template["template"]["metadata"] == {
        "labels": {"fairgate.io/pod-group": "g"}, "annotations": {}}
    body = request_body("fairgate-abc", sets, LABELS)
    assert body["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert body["kind"] == "ProvisioningRequest"
    assert body["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": "fairgate-abc-0"}, "count": 2},
                    {"podTemplateRef": {"name": "fairgate-abc-1"}, "count": 1}]}


def test_request_and_templates_are_owned_by_every_pod_without_blocking_deletion() -> None:
    pods = [_pod("w0", 2), _pod("l0", 1)]
    sets = pod_sets("fairgate-abc", pods, LABELS)
    owners = [{"apiVersion": "v1", "kind": "Pod", "name": n, "uid": f"uid-{n}"}
              for n in ("w0", "l0")]
    assert [t["metadata"]["ownerReferences"] for t, _ in sets] == [owners, owners]
    assert request_body("fairgate-abc", sets, LABELS)["metadata"]["ownerReferences"] == owners


def test_an_indexed_gang_of_40_is_one_pod_set_valid_under_the_crd() -> None:
    """An Indexed Job's pods differ in hostname, index label and ticket only: one shape.
    One template per pod would be 40 pod sets, past the CRD's maxItems (32)."""
    pods = [_pod("ddp", 1, i) for i in range(40)]
    sets = pod_sets("fairgate-abc", pods, LABELS)
    assert [count for _, count in sets] == [40]
    spec = sets[0][0]["template"]["spec"]
    assert "hostname" not in spec and spec["subdomain"] == "ddp"
    body = request_body("fairgate-abc", sets, LABELS)
    jsonschema.validate(body, _v1_schema())


def test_the_api_token_volume_of_each_pod_is_not_its_shape() -> None:
    """The ServiceAccount admission plugin gives every pod a projected token volume of a
    random name, mounted in each container: pods of one gang are still one shape."""
    pods = []
    for suffix in ("x7k2q", "p9w4z"):
        pod = _pod(f"w-{suffix}", 2)
        pod["spec"]["volumes"] = [
            {"name": f"kube-api-access-{suffix}", "projected": {"sources": []}},
            {"name": "data", "emptyDir": {}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [
            {"name": f"kube-api-access-{suffix}", "mountPath": "/var/run/secrets"},
            {"name": "data", "mountPath": "/data"}]
        pods.append(pod)
    [(template, count)] = pod_sets("fairgate-abc", pods, LABELS)
    spec = template["template"]["spec"]
    assert count == 2 and spec["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]


def test_more_shapes_than_a_request_holds_is_refused_saying_so() -> None:
    pods = [_pod(f"p{i}", i + 1) for i in range(MAX_POD_SETS + 1)]
    with pytest.raises(ValueError, match="at most 32 pod sets"):
        pod_sets("fairgate-abc", pods, LABELS)
    body = request_body("fairgate-abc", pod_sets("fairgate-abc", pods[:MAX_POD_SETS], LABELS),
                        LABELS)
    jsonschema.validate(body, _v1_schema())  # 32 is the most that is valid
