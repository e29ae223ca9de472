"""The e2e harness itself, with no fairgate code: a real API server and scheduler, fake
GPU nodes and the fake kubelet do what Kubernetes does."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from harness.controlplane import REPO, ControlPlane
from harness.kubelet import DEFAULT_GPU_NODES, FakeKubelet
from harness.pods import condition, is_gated, pod_manifest
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WHOLE_GPU_NODES = {n.name for n in DEFAULT_GPU_NODES if n.mig_strategy == "none"}


def _running_on(core: Any, namespace: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod.spec.node_name if pod.status.phase == "Running" else None


def test_version_is_the_pinned_release(controlplane: ControlPlane) -> None:
    gomod = (REPO / "tests/e2e/controlplane/go.mod").read_text()
    match = re.search(r"k8s\.io/kubernetes (v\d+\.\d+\.\d+)", gomod)
    assert match, "go.mod does not require k8s.io/kubernetes"
    version: Any = client.VersionApi(controlplane.admin).get_code()
    assert version.git_version == match.group(1)
    assert (version.major, version.minor) == tuple(match.group(1)[1:].split(".")[:2])


def test_fake_gpu_nodes_are_ready_tainted_and_heartbeating(
    controlplane: ControlPlane, kubelet: FakeKubelet
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {n.name for n in DEFAULT_GPU_NODES}
    for spec in DEFAULT_GPU_NODES:
        node = nodes[spec.name]
        for resource, count in spec.devices.items():
            assert node.status.allocatable[resource] == str(count)
            assert node.status.capacity[resource] == str(count)
        assert node.metadata.labels["nvidia.com/gpu.product"] == spec.product
        assert node.metadata.labels["nvidia.com/mig.strategy"] == spec.mig_strategy
        assert [(t.key, t.effect) for t in node.spec.taints] == [("nvidia.com/gpu", "NoSchedule")]
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert [c.status for c in ready] == ["True"]
    lease: Any = client.CoordinationV1Api(controlplane.admin).read_namespaced_lease(
        DEFAULT_GPU_NODES[0].name, "kube-node-lease"
    )
    age = datetime.datetime.now(datetime.UTC) - lease.spec.renew_time
    assert age < datetime.timedelta(seconds=40), f"lease not renewed for {age}"


def test_gated_pod_is_bound_by_the_scheduler_once_the_gate_is_removed(
    controlplane: ControlPlane, kubelet: FakeKubelet, make_namespace: Any
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    ns = make_namespace()
    core.create_namespaced_pod(
        ns, pod_manifest("held", {"nvidia.com/gpu": 1}, gates=["e2e.fairgate.io/hold"])
    )
    pod = core.read_namespaced_pod("held", ns)
    assert is_gated(pod), pod.status
    time.sleep(2)  # the scheduler is running; a gated pod must stay unbound
    assert core.read_namespaced_pod("held", ns).spec.node_name is None

    core.patch_namespaced_pod(
        "held",
        ns,
        [{"op": "remove", "path": "/spec/schedulingGates"}],
        _content_type="application/json-patch+json",
    )
    node = wait_for(lambda: _running_on(core, ns, "held"), 30, "held pod to run")
    assert node in WHOLE_GPU_NODES  # the MIG node has no whole GPUs

    kubelet.finish(ns, "held")
    assert core.read_namespaced_pod("held", ns).status.phase == "Succeeded"


def test_mig_demand_is_scheduled_onto_the_mig_node(
    controlplane: ControlPlane, kubelet: FakeKubelet, make_namespace: Any
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    ns = make_namespace()
    core.create_namespaced_pod(ns, pod_manifest("mig", {"nvidia.com/mig-1g.5gb": 2}))
    node = wait_for(lambda: _running_on(core, ns, "mig"), 30, "MIG pod to run")
    assert node == "gpu-mig-5gb"  # the only node with 1g.5gb devices


def test_pod_without_toleration_is_not_scheduled_on_gpu_nodes(
    controlplane: ControlPlane, kubelet: FakeKubelet, make_namespace: Any
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    ns = make_namespace()
    core.create_namespaced_pod(ns, pod_manifest("plain", {"nvidia.com/gpu": 1}, tolerate_gpu=False))

    def unschedulable() -> str | None:
        scheduled = condition(core.read_namespaced_pod("plain", ns), "PodScheduled")
        if scheduled is None or scheduled.reason != "Unschedulable":
            return None
        message: str = scheduled.message
        return message

    message = wait_for(unschedulable, 30, "the scheduler to report the pod unschedulable")
    assert f"{len(DEFAULT_GPU_NODES)} node(s) had untolerated taint" in message


@pytest.fixture(scope="module")
def priority_classes(controlplane: ControlPlane) -> dict[str, int]:
    scheduling: Any = client.SchedulingV1Api(controlplane.admin)
    classes = {"e2e-high": 100000, "e2e-low": 1000}
    for name, value in classes.items():
        body: dict[str, Any] = {"metadata": {"name": name}, "value": value}
        if name == "e2e-low":
            body["preemptionPolicy"] = "Never"
        scheduling.create_priority_class(body)
    return classes


def test_priority_admission_fills_priority_from_the_class(
    controlplane: ControlPlane, priority_classes: dict[str, int], make_namespace: Any
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    ns = make_namespace()
    pod = core.create_namespaced_pod(ns, pod_manifest("p", priority_class="e2e-low"))
    assert pod.spec.priority == priority_classes["e2e-low"]
    assert pod.spec.preemption_policy == "Never"

    wrong = pod_manifest("q", priority_class="e2e-high")
    wrong["spec"]["priority"] = 5
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, wrong)
    assert refused.value.status == 403
    assert "priority" in str(refused.value.body)


def test_scheduler_preempts_lower_priority_pods_and_the_kubelet_completes_the_eviction(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    priority_classes: dict[str, int],
    make_namespace: Any,
) -> None:
    core: Any = client.CoreV1Api(controlplane.admin)
    ns = make_namespace()
    per_node = next(
        n.devices["nvidia.com/gpu"] for n in DEFAULT_GPU_NODES if n.name in WHOLE_GPU_NODES
    )
    low = [f"low-{i}" for i in range(len(WHOLE_GPU_NODES))]
    for name in low:
        core.create_namespaced_pod(
            ns, pod_manifest(name, {"nvidia.com/gpu": per_node}, priority_class="e2e-low")
        )
    for name in low:
        wait_for(partial(_running_on, core, ns, name), 30, f"{name} to run")

    core.create_namespaced_pod(
        ns, pod_manifest("high", {"nvidia.com/gpu": per_node}, priority_class="e2e-high")
    )
    node = wait_for(lambda: _running_on(core, ns, "high"), 60, "the high-priority pod to run")
    assert node in WHOLE_GPU_NODES
    survivors = {p.metadata.name for p in core.list_namespaced_pod(ns).items}
    assert "high" in survivors
    assert len(set(low) - survivors) == 1, f"exactly one victim expected, left: {survivors}"


def test_client_certificate_users_and_groups_are_authorised_by_rbac(
    controlplane: ControlPlane, make_namespace: Any
) -> None:
    ns = make_namespace()
    alice: Any = client.CoreV1Api(controlplane.client_for("alice@example.com", ["team-a-admins"]))
    with pytest.raises(ApiException) as refused:
        alice.list_namespaced_pod(ns)
    assert refused.value.status == 403
    assert "alice@example.com" in str(refused.value.body)

    rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "team-a-admins-read-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a-admins"}
            ],
        },
    )

    def can_list() -> bool:
        try:
            alice.list_namespaced_pod(ns)
        except ApiException as error:
            if error.status == 403:
                return False
            raise
        return True

    wait_for(can_list, 10, "the RoleBinding to let alice list pods")


def test_pytest_says_what_a_cold_build_builds_and_how_long_before_it_starts(
    tmp_path: Path,
) -> None:
    """`python -m pytest` on e2e tests with no cached binaries: before the build starts it
    says what it builds and roughly how long that takes, then shows build.sh's progress
    lines as they come. Here the build cannot download modules (empty module cache, no
    proxy), so it stops right after that line with a clear usage error instead of
    building for minutes."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FAIRGATE_CP_CACHE": str(tmp_path / "cp"),
        "GOMODCACHE": str(tmp_path / "mod"),
        "GOCACHE": str(tmp_path / "gocache"),
        "GOPROXY": "off",
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(Path(__file__))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
    announced = re.search(
        r"\[controlplane \d\d:\d\d:\d\d\] cold build of kube-apiserver kube-scheduler "
        r"kube-controller-manager etcd kubectl into \S+: about 5 min .* up to 20 min", output)
    assert announced, output
    failed = output.find("BUILD FAILED: cannot resolve k8s.io/kubernetes")
    assert failed > announced.start(), output
    assert "needs Go 1.26+ and the Go module proxy" in output[failed:], output
