"""fairgate's stamps are immutable after CREATE, enforced by the API server itself.

The quota integrity attacks, each on the real kube-apiserver with fairgate installed from
manifests/: the ValidatingAdmissionPolicy `fairgate-stamps` (manifests/admission-policy.yaml)
refuses them, including on finished and terminating pods that the validating webhook
never sees, and with the webhook down. What must keep working (finalizer removal, the
dispatcher lifting the gate) is checked too, and so are the API server's own rules that
keep a pod from growing its GPU use past fairgate through a subresource.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import JSON_PATCH, MERGE_PATCH, create_namespace, refusal
from harness.controlplane import ControlPlane
from harness.fairgate import (
    GATE,
    POLICY,
    QUOTA_YAML,
    SYSTEM_NAMESPACE,
    FairgateStack,
    pods_api,
    tenant_namespace,
    tenant_user,
)
from harness.kubelet import FakeKubelet
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.waiting import wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("stamps")]

DENIED = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request"
DISPATCHER = "fairgate-dispatcher"
# e2e quotas (harness.fairgate): team-a 4 GPUs + 4 GPU-eq borrowed, team-b 4 GPUs.
LIMIT = {"team-a": 8.0, "team-b": 4.0}


def assert_refused_by_policy(call: Any, *words: str) -> str:
    """`call()` is refused by fairgate's policy with a message naming every one of `words`."""
    status, message = refusal(call)
    assert status == 403, (status, message)
    assert DENIED in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def assert_patch_refused(core: Any, namespace: str, name: str, patch: dict[str, Any],
                         *words: str) -> str:
    """A merge patch of pod `namespace/name` is refused by fairgate's policy (see
    `assert_refused_by_policy`)."""
    return assert_refused_by_policy(
        lambda: core.patch_namespaced_pod(name, namespace, patch, _content_type=MERGE_PATCH),
        *words,
    )


def held_gpus(admin: Any, namespace: str) -> float:
    """GPUs the namespace's pods hold by their specs: released (no fairgate gate) and not
    finished."""
    total = 0.0
    for pod in admin.list_namespaced_pod(namespace).items:
        gates = [g.name for g in pod.spec.scheduling_gates or []]
        if GATE in gates or pod.status.phase in ("Succeeded", "Failed"):
            continue
        limits = pod.spec.containers[0].resources.limits or {}
        total += float(limits.get("nvidia.com/gpu", 0))
    return total


def assert_usage_exact(controlplane: ControlPlane, fairgate: FairgateStack) -> None:
    """`fairgate status` settles on exactly the GPUs each tenant's pods hold (a finished
    pod's release may still be on its way), and no tenant holds more than its quota."""
    admin: Any = client.CoreV1Api(controlplane.admin)
    deadline = time.monotonic() + 30
    while True:
        held = {t: held_gpus(admin, tenant_namespace(t)) for t in QUOTA_YAML}
        shown = {t: float(fairgate.tenant_state(t).get("used", 0.0)) for t in QUOTA_YAML}
        if held == shown or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert held == shown, f"fairgate status shows {shown} GPUs in use; the pods hold {held}"
    assert all(held[t] <= LIMIT[t] for t in held), f"above quota: {held}"


def gone(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def fairgate_metadata(pod: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's fairgate.io/ labels and annotations."""
    return (
        {k: v for k, v in (pod.metadata.labels or {}).items() if k.startswith("fairgate.io/")},
        {k: v for k, v in (pod.metadata.annotations or {}).items() if k.startswith("fairgate.io/")},
    )


def grant(controlplane: ControlPlane, tenant: str, name: str, resources: list[str]) -> None:
    """Let the tenant's users patch `resources` (pod subresources) in its namespace, as an
    over-generous Role would: what is refused after this is refused by admission, not RBAC."""
    rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
    namespace = tenant_namespace(tenant)
    user, groups = tenant_user(tenant)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["patch", "update"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": groups[0]}
            ],
        },
    )
    # the authorizer reads Roles from its cache: wait until it allows what was granted
    for resource in resources:
        wait_for(partial(_allowed, controlplane, user, groups, namespace, resource), 30,
                 f"RBAC to allow {user} to patch {resource}")


def _allowed(controlplane: ControlPlane, user: str, groups: list[str], namespace: str,
             resource: str) -> bool:
    name, _, subresource = resource.partition("/")
    authorization: Any = client.AuthorizationV1Api(controlplane.admin)
    review = authorization.create_subject_access_review({
        "spec": {"user": user, "groups": groups, "resourceAttributes": {
            "namespace": namespace, "verb": "patch", "resource": name,
            "subresource": subresource}},
    })
    return bool(review.status.allowed)


def revoke(controlplane: ControlPlane, tenant: str, name: str) -> None:
    rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
    namespace = tenant_namespace(tenant)
    rbac.delete_namespaced_role_binding(name, namespace)
    rbac.delete_namespaced_role(name, namespace)


# -- fixtures ------------------------------------------------------------------------------


def _policy_refuses(core: Any, namespace: str) -> bool:
    """Whether the policy refuses (dry run) a cluster-admin's change of a fairgate.io/ label."""
    try:
        core.patch_namespaced_pod(
            "probe",
            namespace,
            {"metadata": {"labels": {"fairgate.io/class": "changed"}}},
            dry_run="All",
            _content_type=MERGE_PATCH,
        )
    except ApiException as error:
        return DENIED in (error.body or "")
    return False


@pytest.fixture(scope="module")
def stamps(controlplane: ControlPlane, fairgate: FairgateStack) -> Iterator[None]:
    """fairgate installed and its policy in force (the API server loads policies and
    bindings asynchronously: a dry-run probe shows when it refuses)."""
    admin: Any = client.CoreV1Api(controlplane.admin)
    namespace = "stamps-probe"
    create_namespace(admin, namespace)
    admin.create_namespaced_pod(
        namespace,
        pod_manifest("probe", labels={"fairgate.io/class": "probe"}, tolerate_gpu=False),
    )
    wait_for(partial(_policy_refuses, admin, namespace), 30, f"policy {POLICY} to be in force")
    yield
    admin.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)
    wait_for(partial(no_pods, admin, namespace), 30, "the probe pod to go")
    admin.delete_namespace(namespace)


def finished_pod(core: Any, kubelet: FakeKubelet, namespace: str, name: str) -> Any:
    """A 1-GPU pod that ran and Succeeded; returned as read back."""
    core.create_namespaced_pod(namespace, pod_manifest(name, {"nvidia.com/gpu": 1}))
    wait_for(partial(running_node, core, namespace, name), 30, f"{name} to run")
    kubelet.finish(namespace, name)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.status.phase == "Succeeded"
    return pod


def running_pod(core: Any, namespace: str, name: str, gpus: int = 1) -> Any:
    """A GPU pod that runs; returned as read back."""
    core.create_namespaced_pod(namespace, pod_manifest(name, {"nvidia.com/gpu": gpus}))
    wait_for(partial(running_node, core, namespace, name), 30, f"{name} to run")
    return core.read_namespaced_pod(name, namespace)


# -- the attacks ---------------------------------------------------------------------------


def test_relabel_a_finished_pods_tenant(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    before = finished_pod(core, kubelet, ns, "done")
    assert before.metadata.labels["fairgate.io/tenant"] == "team-b"

    assert_patch_refused(
        core, ns, "done",
        {"metadata": {"labels": {"fairgate.io/tenant": "team-a"}}},
        "label fairgate.io/tenant",
        "dev@team-b.example.com",
        "create a new pod",
    )
    assert fairgate_metadata(core.read_namespaced_pod("done", ns)) == fairgate_metadata(before)
    assert_usage_exact(controlplane, fairgate)


def test_copy_another_pods_ticket_onto_a_finished_pod(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """The attack as reproduced: a finished pod takes a running pod's ticket (and a tenant
    label), so that the dispatcher would free the running pod's usage."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    victim = running_pod(core, ns, "victim")
    ticket = victim.metadata.annotations["fairgate.io/ticket"]
    before = finished_pod(core, kubelet, ns, "done")
    assert before.metadata.annotations["fairgate.io/ticket"] != ticket

    assert_patch_refused(
        core, ns, "done",
        {"metadata": {"annotations": {"fairgate.io/ticket": ticket}}},
        "annotation fairgate.io/ticket",
    )
    assert_patch_refused(
        core, ns, "done",
        {
            "metadata": {
                "labels": {"fairgate.io/tenant": "team-a"},
                "annotations": {"fairgate.io/ticket": ticket},
            }
        },
        "fairgate.io/ticket",
    )
    assert fairgate_metadata(core.read_namespaced_pod("done", ns)) == fairgate_metadata(before)
    assert core.read_namespaced_pod("victim", ns).metadata.annotations["fairgate.io/ticket"] == (
        ticket
    )
    assert_usage_exact(controlplane, fairgate)


def test_rewrite_a_ticket_through_the_status_subresource_as_its_node(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """pods/status may change annotations (NodeRestriction only stops a node's label
    changes), and no webhook sees pods/status: the policy covers the subresource."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    victim = running_pod(core, ns, "victim")
    before = running_pod(core, ns, "runner")
    node: Any = client.CoreV1Api(
        controlplane.client_for(f"system:node:{before.spec.node_name}", ["system:nodes"])
    )
    ticket = victim.metadata.annotations["fairgate.io/ticket"]
    assert_refused_by_policy(
        lambda: node.patch_namespaced_pod_status(
            "runner",
            ns,
            {"metadata": {"annotations": {"fairgate.io/ticket": ticket}}},
            _content_type=MERGE_PATCH,
        ),
        "annotation fairgate.io/ticket",
        f"system:node:{before.spec.node_name}",
    )
    assert fairgate_metadata(core.read_namespaced_pod("runner", ns)) == fairgate_metadata(before)
    assert_usage_exact(controlplane, fairgate)


def test_remove_the_tenant_label_from_a_running_pod(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """Without the label the pod would drop out of the dispatcher's label-selected watch."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    before = running_pod(core, ns, "runner")
    assert_refused_by_policy(
        lambda: core.patch_namespaced_pod(
            "runner",
            ns,
            [{"op": "remove", "path": "/metadata/labels/fairgate.io~1tenant"}],
            _content_type=JSON_PATCH,
        ),
        "label fairgate.io/tenant",
    )
    assert fairgate_metadata(core.read_namespaced_pod("runner", ns)) == fairgate_metadata(before)
    assert_usage_exact(controlplane, fairgate)


def test_change_the_demand_annotation(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    before = running_pod(core, ns, "runner", gpus=2)
    assert before.metadata.annotations["fairgate.io/demand"] == "gpu=2"
    assert_patch_refused(
        core, ns, "runner",
        {"metadata": {"annotations": {"fairgate.io/demand": "gpu=1"}}},
        "annotation fairgate.io/demand",
    )
    assert fairgate_metadata(core.read_namespaced_pod("runner", ns)) == fairgate_metadata(before)
    assert_usage_exact(controlplane, fairgate)


def test_add_or_remove_the_borrowed_annotation(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """team-a: nominal 4 GPUs, may borrow 4: a 4-GPU pod is nominal, the next borrows."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    nominal = core.create_namespaced_pod(ns, pod_manifest("nominal", {"nvidia.com/gpu": 4}))
    borrowing = core.create_namespaced_pod(ns, pod_manifest("borrowing", {"nvidia.com/gpu": 1}))
    assert "fairgate.io/borrowed" not in nominal.metadata.annotations
    assert borrowing.metadata.annotations["fairgate.io/borrowed"] == "true"

    assert_patch_refused(
        core, ns, "borrowing",
        {"metadata": {"annotations": {"fairgate.io/borrowed": None}}},
        "annotation fairgate.io/borrowed",
    )
    assert_patch_refused(
        core, ns, "nominal",
        {"metadata": {"annotations": {"fairgate.io/borrowed": "true"}}},
        "annotation fairgate.io/borrowed",
    )
    for pod in (nominal, borrowing):
        after = core.read_namespaced_pod(pod.metadata.name, ns)
        assert fairgate_metadata(after) == fairgate_metadata(pod)
    assert_usage_exact(controlplane, fairgate)


def test_strip_the_gate_as_a_tenant_user(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    running_pod(core, ns, "first", gpus=4)
    held = core.create_namespaced_pod(ns, pod_manifest("held", {"nvidia.com/gpu": 1}))
    assert [g.name for g in held.spec.scheduling_gates] == [GATE]

    assert_refused_by_policy(
        lambda: core.patch_namespaced_pod(
            "held",
            ns,
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            _content_type=JSON_PATCH,
        ),
        f"scheduling gate {GATE}",
        "dev@team-b.example.com",
    )
    assert is_gated(core.read_namespaced_pod("held", ns))
    assert_usage_exact(controlplane, fairgate)


def test_adding_a_fairgate_label_to_any_pod_is_refused(
    controlplane: ControlPlane, tenant_pods: None
) -> None:
    """A pod that never asked for a GPU cannot be given fairgate's stamp later either."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    core.create_namespaced_pod(ns, pod_manifest("cpu-only", tolerate_gpu=False))
    assert_patch_refused(
        core, ns, "cpu-only",
        {"metadata": {"labels": {"fairgate.io/tenant": "team-a"}}},
        "label fairgate.io/tenant",
    )


def test_cluster_admins_are_bound_too(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """system:masters bypasses RBAC, not admission policies (see docs/architecture.md)."""
    ns = tenant_namespace("team-a")
    admin: Any = client.CoreV1Api(controlplane.admin)
    running_pod(pods_api(controlplane, "team-a"), ns, "runner")
    assert_patch_refused(
        admin, ns, "runner",
        {"metadata": {"labels": {"fairgate.io/tenant": "team-b"}}},
        "label fairgate.io/tenant",
        "e2e-admin",
    )
    assert_usage_exact(controlplane, fairgate)


# -- what keeps working --------------------------------------------------------------------


def test_finalizer_removal_on_a_terminating_fairgate_pod_still_works(
    controlplane: ControlPlane, kubelet: FakeKubelet, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    pod = pod_manifest("held-open", {"nvidia.com/gpu": 1})
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    core.create_namespaced_pod(ns, pod)
    wait_for(partial(running_node, core, ns, "held-open"), 30, "held-open to run")
    core.delete_namespaced_pod("held-open", ns)
    terminating = core.read_namespaced_pod("held-open", ns)
    assert terminating.metadata.deletion_timestamp is not None

    # ... but its stamps stay fixed while it terminates.
    assert_patch_refused(
        core, ns, "held-open",
        {"metadata": {"labels": {"fairgate.io/tenant": "team-b"}}},
        "label fairgate.io/tenant",
    )
    core.patch_namespaced_pod(
        "held-open", ns, {"metadata": {"finalizers": None}}, _content_type=MERGE_PATCH
    )
    wait_for(partial(gone, core, ns, "held-open"), 60, "held-open to be deleted")


def test_with_the_webhook_down_the_policy_still_holds(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    running_pod(core, ns, "runner")
    finished_pod(core, kubelet, ns, "done")
    fairgate.stop_webhook()
    try:
        # The policy is evaluated before the validating webhooks are called.
        assert_patch_refused(
            core, ns, "runner",
            {"metadata": {"annotations": {"fairgate.io/demand": "gpu=0"}}},
            "annotation fairgate.io/demand",
        )
        assert_patch_refused(
            core, ns, "done",
            {"metadata": {"labels": {"fairgate.io/tenant": "team-b"}}},
            "label fairgate.io/tenant",
        )
        # A finished pod's other labels stay the user's: neither fairgate's policy nor
        # (skipped for finished pods) its webhook stands in the way.
        patched = core.patch_namespaced_pod(
            "done",
            ns,
            {"metadata": {"labels": {"example.com/note": "checked"}}},
            _content_type=MERGE_PATCH,
        )
        assert patched.metadata.labels["example.com/note"] == "checked"
    finally:
        fairgate.start_webhook()


def test_dispatcher_lifts_the_gate(
    controlplane: ControlPlane, kubelet: FakeKubelet, tenant_pods: None
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    running_pod(core, ns, "first", gpus=4)
    held = core.create_namespaced_pod(ns, pod_manifest("held", {"nvidia.com/gpu": 1}))
    assert [g.name for g in held.spec.scheduling_gates] == [GATE]
    kubelet.finish(ns, "first")
    wait_for(
        partial(running_node, core, ns, "held"),
        60,
        "the dispatcher to lift the gate (policy allows it) and held to run",
    )


def test_fairgates_service_accounts_may_change_fairgate_metadata(
    controlplane: ControlPlane, kubelet: FakeKubelet, tenant_pods: None
) -> None:
    """The exemption is by ServiceAccount: the dispatcher's own identity (a bound token)
    may change a fairgate.io/ annotation that everyone else may not."""
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    finished_pod(core, kubelet, ns, "done")
    kubeconfig = controlplane.token_kubeconfig(SYSTEM_NAMESPACE, DISPATCHER)
    dispatcher: Any = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    try:
        patched = dispatcher.patch_namespaced_pod(
            "done",
            ns,
            {"metadata": {"annotations": {"fairgate.io/e2e-check": "dispatcher"}}},
            _content_type=MERGE_PATCH,
        )
    finally:
        dispatcher.api_client.close()
    assert patched.metadata.annotations["fairgate.io/e2e-check"] == "dispatcher"


# -- the API server's own rules on GPU requests --------------------------------------------


def test_in_place_resize_of_nvidia_gpu_is_refused(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """No webhook sees pods/resize; the API server allows resizing only cpu and memory.

    The pod is a queued one (1 GPU, held by fairgate's gate) that would like to grow before
    it is released. (A pod with no running container is one the API server assumes can be
    resized; for a running one it also wants the kubelet to report container resources,
    which the fake kubelet does not, and that would be a second reason to refuse.)
    """
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    running_pod(core, ns, "first", gpus=4)
    held = core.create_namespaced_pod(ns, pod_manifest("held", {"nvidia.com/gpu": 1}))
    assert [g.name for g in held.spec.scheduling_gates] == [GATE]
    grant(controlplane, "team-b", "resize-pods", ["pods/resize"])
    try:
        status, message = refusal(
            lambda: core.patch_namespaced_pod_resize(
                "held",
                ns,
                {
                    "spec": {
                        "containers": [
                            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
                        ]
                    }
                },
            )
        )
    finally:
        revoke(controlplane, "team-b", "resize-pods")
    assert status == 422, (status, message)
    assert "only cpu and memory resources are mutable" in message, message
    assert "without support for resize" not in message, message
    pod = core.read_namespaced_pod("held", ns)
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert_usage_exact(controlplane, fairgate)


def test_ephemeral_container_asking_for_a_gpu_is_refused(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """No webhook sees pods/ephemeralcontainers; ephemeral containers get no resources."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    running_pod(core, ns, "runner")
    grant(controlplane, "team-a", "debug-pods", ["pods/ephemeralcontainers"])
    try:
        status, message = refusal(
            lambda: core.patch_namespaced_pod_ephemeralcontainers(
                "runner",
                ns,
                {
                    "spec": {
                        "ephemeralContainers": [
                            {
                                "name": "debugger",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ]
                    }
                },
            )
        )
    finally:
        revoke(controlplane, "team-a", "debug-pods")
    assert status == 422, (status, message)
    assert "ephemeralContainers[0].resources" in message, message
    assert not core.read_namespaced_pod("runner", ns).spec.ephemeral_containers
    assert_usage_exact(controlplane, fairgate)


def test_gpu_request_without_a_limit_is_refused(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """Refused, not defaulted: an extended resource needs a limit (requests default to the
    limit, never the other way round). The API server validates after admission, so
    fairgate's mutating webhook has already reserved the demand: the unconfirmed
    reservation expires (fairshare/queue/README.md, reservation_ttl) and usage returns to zero."""
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    pod = pod_manifest("requests-only")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    status, message = refusal(lambda: core.create_namespaced_pod(ns, pod))
    assert status == 422, (status, message)
    assert "Limit must be set for non overcommitable resources" in message, message
    assert not core.list_namespaced_pod(ns).items
    fairgate.wait_idle(timeout=90)
