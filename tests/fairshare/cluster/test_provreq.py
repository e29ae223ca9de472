"""The ProvisioningRequest bodies fairgate sends (autoscaling.x-k8s.io/v1, as
cluster-autoscaler's types define them): one PodTemplate per distinct pod, counted."""

from __future__ import annotations

from typing import Any

from fairshare.cluster.provreq_create import pod_sets, request_body


def _pod(name: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a-ns", "uid": name,
                         "labels": {"fairgate.io/pod-group": "g"}},
            "spec": {"schedulingGates": [{"name": "fairgate.io/queue"}],
                     "containers": [{"name": "main", "image": "trainer",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": "Pending"}}


def test_a_gang_of_two_shapes_is_two_pod_sets_with_their_counts() -> None:
    labels = {"fairgate.io/provisioning-for": "fairgate-abc"}
    sets = pod_sets("fairgate-abc", [_pod("w0", 2), _pod("w1", 2), _pod("l0", 1)], labels)
    assert [(t["metadata"]["name"], count) for t, count in sets] == [
        ("fairgate-abc-0", 2), ("fairgate-abc-1", 1)]
    template = sets[0][0]
    assert template["kind"] == "PodTemplate" and template["metadata"]["labels"] == labels
    assert "schedulingGates" not in template["template"]["spec"]  # what would run
    assert template["template"]["metadata"]["labels"] == {"fairgate.io/pod-group": "g"}
    body = request_body("fairgate-abc", sets, labels)
    assert body["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert body["kind"] == "ProvisioningRequest"
    assert body["spec"] == {
        "provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
        "podSets": [{"podTemplateRef": {"name": "fairgate-abc-0"}, "count": 2},
                    {"podTemplateRef": {"name": "fairgate-abc-1"}, "count": 1}]}
