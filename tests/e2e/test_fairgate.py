"""fairgate end to end: the real API server calls `fairgate serve` over TLS, applies its
JSON Patch, runs the Priority plugin and RBAC; the real scheduler binds and preempts;
`fairgate dispatch` lifts gates. Every request is made by a real user of a tenant."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import pytest
import redis
import yaml
from harness.api import JSON_PATCH, MERGE_PATCH, message_of, refusal
from harness.controlplane import ControlPlane
from harness.fairgate import (
    GATE,
    QUOTA_YAML,
    SYSTEM_NAMESPACE,
    FairgateStack,
    pods_api,
    tenant_namespace,
)
from harness.kubelet import DEFAULT_GPU_NODES, FakeKubelet, GpuNode
from harness.pods import (
    is_gated,
    pod_manifest,
    required_affinity_admits,
    running_node,
    start_one_gpu_pods,
)
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
T = TypeVar("T")

WHOLE_GPU_NODES = {n.name for n in DEFAULT_GPU_NODES if n.mig_strategy == "none"}
CLUSTER_GPUS = sum(n.devices.get("nvidia.com/gpu", 0) for n in DEFAULT_GPU_NODES)


def event_message(core: Any, namespace: str, pod: str, reason: str) -> str | None:
    """The message of the newest Event `reason` about `pod`, or None."""
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},reason={reason}"
    ).items
    if not events:
        return None
    message: str = events[-1].message
    return message


def redis_snapshot(url: str) -> dict[bytes, tuple[Any, Any]]:
    """Every key with its type and serialised value."""
    r = redis.Redis.from_url(url)
    try:
        return {key: (r.type(key), r.dump(key)) for key in r.scan_iter(count=1000)}
    finally:
        r.close()


# 1 -------------------------------------------------------------------------------------


def test_gpu_pod_is_stamped_by_the_webhook_through_the_api_server(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    scheduling: Any = client.SchedulingV1Api(controlplane.admin)
    scheduling.create_priority_class({"metadata": {"name": "team-a-urgent"}, "value": 500000})
    try:
        pod, _, headers = core.create_namespaced_pod_with_http_info(
            ns,
            pod_manifest(
                "trainer", {"nvidia.com/gpu": 1}, tolerate_gpu=False, priority_class="team-a-urgent"
            ),
        )
    finally:
        scheduling.delete_priority_class("team-a-urgent")
    labels, annotations = pod.metadata.labels, pod.metadata.annotations
    assert labels["fairgate.io/tenant"] == "team-a"
    assert labels["fairgate.io/class"] == "training"
    assert annotations["fairgate.io/ticket"]
    assert annotations["fairgate.io/demand"] == "gpu=1"
    assert "fairgate.io/borrowed" not in annotations
    assert pod.spec.priority_class_name == "fairgate-training"
    assert pod.spec.priority == 10000  # the Priority plugin and fairgate agree
    assert pod.spec.preemption_policy == "PreemptLowerPriority"
    assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in pod.spec.tolerations)
    admitted = {n.name for n in DEFAULT_GPU_NODES if required_affinity_admits(pod, n.labels())}
    assert admitted == WHOLE_GPU_NODES  # whole-GPU demand avoids MIG-partitioned nodes
    assert not pod.spec.scheduling_gates
    # The user's own priority class was replaced; the API server passes the warning on.
    warnings = headers.get("Warning", "")
    assert "team-a-urgent" in warnings, headers

    node = wait_for(partial(running_node, core, ns, "trainer"), 30, "trainer to run")
    assert node in WHOLE_GPU_NODES  # whole-GPU demand avoids MIG nodes


def test_mig_pod_is_placed_on_a_mig_node_by_fairgates_affinity(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    pod = core.create_namespaced_pod(ns, pod_manifest("mig", {"nvidia.com/mig-1g.5gb": 2}))
    assert pod.metadata.annotations["fairgate.io/demand"] == "mig-1g.5gb=2"
    admitted = {n.name for n in DEFAULT_GPU_NODES if required_affinity_admits(pod, n.labels())}
    assert admitted == {n.name for n in DEFAULT_GPU_NODES if n.mig_strategy == "mixed"}
    node = wait_for(partial(running_node, core, ns, "mig"), 30, "the MIG pod to run")
    assert node == "gpu-mig-5gb"


# 2 -------------------------------------------------------------------------------------


def test_over_quota_pod_waits_gated_until_the_dispatcher_releases_it(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 4}))
    wait_for(partial(running_node, core, ns, "first"), 30, "first to run")

    created, _, headers = core.create_namespaced_pod_with_http_info(
        ns, pod_manifest("second", {"nvidia.com/gpu": 1})
    )
    assert [g.name for g in created.spec.scheduling_gates] == [GATE]
    assert headers.get("Warning"), "a queued pod should say why it waits"
    assert is_gated(core.read_namespaced_pod("second", ns))
    # What `kubectl describe pod second` shows the user: where it stands and why.
    queued = wait_for(
        partial(event_message, core, ns, "second", "Queued"), 30, "a Queued event on second"
    )
    assert "position 1" in queued, queued
    assert core.read_namespaced_pod("second", ns).spec.node_name is None

    kubelet.finish(ns, "first")
    node = wait_for(
        partial(running_node, core, ns, "second"),
        60,
        "the dispatcher to lift the gate and the scheduler to bind second",
    )
    assert node in WHOLE_GPU_NODES
    assert not core.read_namespaced_pod("second", ns).spec.scheduling_gates
    wait_for(partial(event_message, core, ns, "second", "Admitted"), 10, "an Admitted event")


def test_gang_waits_whole_and_is_released_together(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 2}))
    wait_for(partial(running_node, core, ns, "first"), 30, "first to run")
    members = ["worker-0", "worker-1"]
    for name in members:  # 2 x 2 GPUs: one would fit next to first, both do not
        member = pod_manifest(
            name,
            {"nvidia.com/gpu": 2},
            labels={"fairgate.io/pod-group": "pair"},
            annotations={"fairgate.io/pod-group-size": "2"},
        )
        pod = core.create_namespaced_pod(ns, member)
        assert [g.name for g in pod.spec.scheduling_gates] == [GATE], name
    wait_for(partial(event_message, core, ns, "worker-1", "Queued"), 30, "a Queued event")
    assert all(is_gated(core.read_namespaced_pod(n, ns)) for n in members)

    kubelet.finish(ns, "first")
    for name in members:
        wait_for(partial(running_node, core, ns, name), 60, f"gang member {name} to run")


# 3 -------------------------------------------------------------------------------------


def test_pod_that_can_never_fit_is_refused_with_fairgates_message(
    controlplane: ControlPlane,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    core = pods_api(controlplane, "team-b")
    status, message = refusal(
        lambda: core.create_namespaced_pod(
            tenant_namespace("team-b"), pod_manifest("huge", {"nvidia.com/gpu": CLUSTER_GPUS + 1})
        )
    )
    assert status in (400, 403), message
    assert 'admission webhook "pods.mutate.fairgate.io" denied the request' in message, message
    assert "quota-team-b" in message, message  # says where the limit is set
    assert not core.list_namespaced_pod(tenant_namespace("team-b")).items


# 4 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("last_alone", [True, False], ids=["youngest-alone", "started-together"])
def test_inference_takes_back_borrowed_capacity_as_it_is_admitted(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
    last_alone: bool,
) -> None:
    """Exactly one borrowed pod goes for a 1-GPU inference pod. When the youngest
    borrowed pod started alone in its second, fairgate's dispatcher evicts it through the
    Eviction API as the pod is admitted (its Event says so), and the kube-scheduler,
    trying the pod meanwhile, finds that pod going and takes no other. When the
    youngest started together, the scheduler would break the tie at random: fairgate
    leaves the preemption to it, and still only one pod goes."""
    ns_a, ns_b = tenant_namespace("team-a"), tenant_namespace("team-b")
    team_a, team_b = pods_api(controlplane, "team-a"), pods_api(controlplane, "team-b")
    # team-a: nominal 4 GPUs + borrowLimit 4: eight 1-GPU trainers fill all 8 GPUs.
    trainers = [f"trainer-{i}" for i in range(CLUSTER_GPUS)]
    start_one_gpu_pods(team_a, ns_a, trainers, last_alone=last_alone)
    pods = {p.metadata.name: p for p in team_a.list_namespaced_pod(ns_a).items}
    borrowed = {
        n
        for n, p in pods.items()
        if (p.metadata.annotations or {}).get("fairgate.io/borrowed") == "true"
    }
    assert len(borrowed) == CLUSTER_GPUS - 4
    assert {pods[n].spec.priority_class_name for n in borrowed} == {"fairgate-borrowed"}

    server = pod_manifest(
        "server", {"nvidia.com/gpu": 1}, labels={"fairgate.io/class": "inference"}
    )
    created = team_b.create_namespaced_pod(ns_b, server)
    assert created.spec.priority_class_name == "fairgate-inference"
    assert not created.spec.scheduling_gates  # lower-priority capacity counts as free
    wait_for(
        partial(running_node, team_b, ns_b, "server"),
        60,
        "a borrowed pod to be preempted for the inference pod",
    )
    survivors = {p.metadata.name for p in team_a.list_namespaced_pod(ns_a).items}
    evicted = set(trainers) - survivors
    assert len(evicted) == 1 and evicted <= borrowed, (evicted, borrowed)
    (victim,) = evicted
    if last_alone:
        assert victim == trainers[-1]
        admin: Any = client.CoreV1Api(controlplane.admin)
        message = wait_for(lambda: event_message(admin, ns_a, victim, "Preempted"), 30,
                           "fairgate's Event on the evicted pod")
        assert f"evicted for inference pod {ns_b}/server of tenant team-b" in message, message
    time.sleep(3)  # a second eviction, by either, would show by now
    assert len(set(trainers) - {p.metadata.name
                                for p in team_a.list_namespaced_pod(ns_a).items}) == 1


# 5 -------------------------------------------------------------------------------------


def test_tenant_user_cannot_lift_the_gate_or_forge_fairgate_labels(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 4}))
    held = core.create_namespaced_pod(ns, pod_manifest("held", {"nvidia.com/gpu": 1}))
    assert [g.name for g in held.spec.scheduling_gates] == [GATE]

    status, message = refusal(
        lambda: core.patch_namespaced_pod(
            "held",
            ns,
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            _content_type=JSON_PATCH,
        )
    )
    assert status in (400, 403), message
    # fairgate's ValidatingAdmissionPolicy runs before its webhook and refuses first
    # (tests/security/test_stamp_immutability_e2e.py has the policy's own tests).
    assert "ValidatingAdmissionPolicy 'fairgate-stamps'" in message, message
    assert GATE in message
    assert is_gated(core.read_namespaced_pod("held", ns))

    status, message = refusal(
        lambda: core.patch_namespaced_pod(
            "held",
            ns,
            {"metadata": {"labels": {"fairgate.io/tenant": "team-a"}}},
            _content_type=MERGE_PATCH,
        )
    )
    assert "fairgate.io/tenant" in message, message

    forged = pod_manifest("forged", {"nvidia.com/gpu": 1}, labels={"fairgate.io/tenant": "team-a"})
    status, message = refusal(lambda: core.create_namespaced_pod(ns, forged))
    assert status in (400, 403), message
    assert "fairgate.io/tenant" in message, message


def test_pod_without_gpus_cannot_carry_a_forged_tenant_label(
    controlplane: ControlPlane, fairgate: FairgateStack, tenant_pods: None
) -> None:
    """The validating webhook's matchConditions send such CREATEs precisely so that a
    forged `fairgate.io/tenant` label is refused even on a pod that asks for no GPU."""
    core = pods_api(controlplane, "team-b")
    forged = pod_manifest("forged-cpu", labels={"fairgate.io/tenant": "team-a"}, tolerate_gpu=False)
    status, message = refusal(
        lambda: core.create_namespaced_pod(tenant_namespace("team-b"), forged)
    )
    assert status in (400, 403), message
    assert "fairgate.io/tenant" in message, message


# 6 -------------------------------------------------------------------------------------


def _quota_patch(nominal_gpu: int) -> dict[str, Any]:
    text = QUOTA_YAML["team-a"].replace("gpu: 4,", f"gpu: {nominal_gpu},")
    return {"data": {"quota.yaml": text}}


def test_quota_configmap_edits_are_authorised_by_rbac_and_the_webhook(
    controlplane: ControlPlane,
    fairgate: FairgateStack,
) -> None:
    alice: Any = client.CoreV1Api(controlplane.client_for("alice@example.com", ["team-a-admins"]))
    admin: Any = client.CoreV1Api(controlplane.admin)
    try:
        edited = alice.patch_namespaced_config_map(
            "quota-team-a", SYSTEM_NAMESPACE, _quota_patch(3), _content_type=MERGE_PATCH
        )
        assert "gpu: 3," in edited.data["quota.yaml"]

        # Above the ceiling (9 GPU-equivalents): RBAC allows it, fairgate refuses it.
        status, message = refusal(
            lambda: alice.patch_namespaced_config_map(
                "quota-team-a", SYSTEM_NAMESPACE, _quota_patch(9), _content_type=MERGE_PATCH
            )
        )
        assert 'admission webhook "configmaps.validate.fairgate.io"' in message
        assert "ceiling" in message, message

        # Another tenant's quota: RBAC refuses it ...
        status, message = refusal(
            lambda: alice.patch_namespaced_config_map(
                "quota-team-b",
                SYSTEM_NAMESPACE,
                {"data": {"quota.yaml": QUOTA_YAML["team-b"]}},
                _content_type=MERGE_PATCH,
            )
        )
        assert status == 403 and "alice@example.com" in message

        # ... and with a mistaken RoleBinding, fairgate still does (defence in depth).
        rbac: Any = client.RbacAuthorizationV1Api(controlplane.admin)
        rbac.create_namespaced_role_binding(
            SYSTEM_NAMESPACE,
            {
                "metadata": {"name": "mistake-alice-edits-team-b"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "fairgate-quota-editor-team-b",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "alice@example.com",
                    }
                ],
            },
        )
        try:

            def refused_by_fairgate() -> str | None:
                try:
                    alice.patch_namespaced_config_map(
                        "quota-team-b",
                        SYSTEM_NAMESPACE,
                        {"data": {"quota.yaml": QUOTA_YAML["team-b"]}},
                        _content_type=MERGE_PATCH,
                    )
                except ApiException as exc:
                    message = message_of(exc)
                    return message if "configmaps.validate.fairgate.io" in message else None
                raise AssertionError("alice changed team-b's quota")

            message = wait_for(refused_by_fairgate, 15, "the RoleBinding to take effect")
            assert "alice@example.com" in message, message
        finally:
            rbac.delete_namespaced_role_binding("mistake-alice-edits-team-b", SYSTEM_NAMESPACE)
    finally:
        admin.patch_namespaced_config_map(
            "quota-team-a",
            SYSTEM_NAMESPACE,
            {"data": {"quota.yaml": QUOTA_YAML["team-a"]}},
            _content_type=MERGE_PATCH,
        )


# 7 -------------------------------------------------------------------------------------


def test_server_dry_run_changes_nothing_in_redis(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 3}))
    wait_for(partial(running_node, core, ns, "first"), 30, "first to run")
    before = redis_snapshot(fairgate.redis_url)
    fits = core.create_namespaced_pod(
        ns, pod_manifest("fits", {"nvidia.com/gpu": 1}), dry_run="All"
    )
    waits = core.create_namespaced_pod(
        ns, pod_manifest("waits", {"nvidia.com/gpu": 2}), dry_run="All"
    )
    assert fits.metadata.labels["fairgate.io/tenant"] == "team-b"  # the webhook did answer
    assert not fits.spec.scheduling_gates
    assert [g.name for g in waits.spec.scheduling_gates] == [GATE]
    assert redis_snapshot(fairgate.redis_url) == before
    assert [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["first"]


# 8 -------------------------------------------------------------------------------------


def test_with_fairgate_down_gpu_pods_are_refused_and_other_pods_are_not(
    controlplane: ControlPlane,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    fairgate.stop_webhook()
    try:
        created = core.create_namespaced_pod(ns, pod_manifest("cpu-only", tolerate_gpu=False))
        assert "fairgate.io/tenant" not in (created.metadata.labels or {})
        status, message = refusal(
            lambda: core.create_namespaced_pod(ns, pod_manifest("gpu", {"nvidia.com/gpu": 1}))
        )
        assert status >= 400
        assert 'failed calling webhook "pods.mutate.fairgate.io"' in message, message
    finally:
        fairgate.start_webhook()


def test_with_redis_down_gpu_pods_are_refused_clearly_until_it_is_back(
    controlplane: ControlPlane,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-a")  # the platform says onRedisUnavailable: deny
    core = pods_api(controlplane, "team-a")
    fairgate.redis.stop()
    try:
        status, message = refusal(
            lambda: core.create_namespaced_pod(ns, pod_manifest("gpu", {"nvidia.com/gpu": 1}))
        )
        assert status in (403, 503), message  # the webhook's own Status code is passed on
        assert 'admission webhook "pods.mutate.fairgate.io" denied the request' in message
        assert "Redis" in message, message
        created = core.create_namespaced_pod(ns, pod_manifest("cpu-only", tolerate_gpu=False))
        assert created.metadata.name == "cpu-only"
    finally:
        fairgate.redis.start()
    # An empty Redis: the dispatcher rebuilds it, then fitting pods are admitted again.
    fairgate.wait_admitting()
    pod = core.create_namespaced_pod(ns, pod_manifest("gpu", {"nvidia.com/gpu": 1}))
    assert not pod.spec.scheduling_gates


# 9 -------------------------------------------------------------------------------------


def test_after_redis_is_flushed_the_dispatcher_rebuilds_and_the_queue_drains(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")
    core = pods_api(controlplane, "team-b")
    core.create_namespaced_pod(ns, pod_manifest("running", {"nvidia.com/gpu": 4}))
    wait_for(partial(running_node, core, ns, "running"), 30, "running to run")
    for name in ("queued-1", "queued-2"):
        pod = core.create_namespaced_pod(ns, pod_manifest(name, {"nvidia.com/gpu": 2}))
        assert pod.spec.scheduling_gates, name
    expected = fairgate.tenant_state("team-b")

    r = redis.Redis.from_url(fairgate.redis_url)
    r.flushall()
    r.close()
    wait_for(
        lambda: fairgate.tenant_state("team-b") == expected or None,
        60,
        f"the reconciler to restore team-b's usage and queue ({expected})",
    )

    # Usage was restored: a new pod still has to wait behind the running one.
    late = core.create_namespaced_pod(ns, pod_manifest("late", {"nvidia.com/gpu": 1}))
    assert late.spec.scheduling_gates

    kubelet.finish(ns, "running")
    for name in ("queued-1", "queued-2"):
        wait_for(partial(running_node, core, ns, name), 60, f"{name} to be released and run")
    time.sleep(2)  # the dispatcher is running: late must stay held, 4 GPUs are in use
    assert is_gated(core.read_namespaced_pod("late", ns))


# 10 ------------------------------------------------------------------------------------
# Orphans (pods a later admission step refused): tests/security/test_orphans_e2e.py.


# 11 ------------------------------------------------------------------------------------
# Workloads: pods the kube-controller-manager's controllers create with `generateName`.


def _template(resources: dict[str, int], labels: dict[str, str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod template asking for `resources`, as a Deployment or Job carries it."""
    pod = pod_manifest("template", resources, labels=labels, annotations=annotations)
    del pod["metadata"]["name"]
    return {"metadata": pod["metadata"], "spec": pod["spec"]}


def _pods(core: Any, namespace: str, selector: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=selector).items)


def _split(core: Any, namespace: str, selector: str) -> tuple[list[str], list[str]]:
    """Names of the pods matching `selector`: (Running, gated), each sorted."""
    pods = _pods(core, namespace, selector)
    running = sorted(p.metadata.name for p in pods if p.status.phase == "Running")
    gated = sorted(p.metadata.name for p in pods if is_gated(p))
    return running, gated


def _why(fairgate: FairgateStack, namespace: str, name: str) -> dict[str, Any]:
    result = fairgate.run_cli("why", f"{namespace}/{name}", "--json",  # exit 1: unknown
                              "--redis-url", fairgate.redis_url, check=False)
    report: dict[str, Any] = yaml.safe_load(result.stdout)
    return report


def _wait_pods(
    core: Any, namespace: str, selector: str, accept: Callable[[list[str], list[str]], T | None],
    timeout: float, what: str,
) -> T:
    """Wait until `accept(running, gated)` (the names `_split` gives) is not None; return it."""
    return wait_for(lambda: accept(*_split(core, namespace, selector)), timeout, what)


def _deployment(name: str, replicas: int, resources: dict[str, int],
                **spec: Any) -> dict[str, Any]:
    """A Deployment `name` whose pods (label app=<name>) ask for `resources`; `spec` adds
    fields (e.g. strategy)."""
    labels = {"app": name}
    return {"metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": _template(resources, labels), **spec}}


def _job(name: str, pods: int, resources: dict[str, int], backoff_limit: int,
         labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job `name` running `pods` pods at once to as many completions, each asking for
    `resources` and never restarted in place (a failed pod is replaced by a new one)."""
    template = _template(resources, labels or {}, annotations)
    template["spec"]["restartPolicy"] = "Never"
    return {"metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": backoff_limit,
                     "template": template}}


@contextlib.contextmanager
def _workload(api: Any, kind: str, namespace: str, body: dict[str, Any]) -> Iterator[None]:
    """Create the workload `kind` (`deployment`, `job`, `stateful_set`: `api`'s method
    names) from `body`; on exit delete it in the foreground (the garbage collector deletes
    its pods first) and wait until it is gone."""
    name = body["metadata"]["name"]
    getattr(api, f"create_namespaced_{kind}")(namespace, body)
    try:
        yield
    finally:
        getattr(api, f"delete_namespaced_{kind}")(name, namespace,
                                                  propagation_policy="Foreground")
        wait_for(partial(_gone, getattr(api, f"read_namespaced_{kind}"), name, namespace), 60,
                 f"{namespace}/{name} and its pods to be deleted")


def _gone(read: Callable[..., Any], *args: str) -> bool:
    """True once `read(*args)` answers 404."""
    try:
        read(*args)
    except ApiException as error:
        return bool(error.status == 404)
    return False


def _running_once_created(core: Any, namespace: str, name: str) -> str | None:
    """`running_node`, None while the controller has not created the pod yet."""
    try:
        return running_node(core, namespace, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def test_a_deployment_past_quota_queues_its_extra_replicas_and_scaling_down_frees_quota(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    apps: Any = client.AppsV1Api(controlplane.admin)
    with _workload(apps, "deployment", ns, _deployment("serve", 6, {"nvidia.com/gpu": 1})):
        # The ReplicaSet controller creates 6 pods named serve-<hash>-<suffix>: 4 run, 2 wait.
        running, gated = _wait_pods(
            core, ns, "app=serve", lambda r, g: (r, g) if len(r) == 4 and len(g) == 2 else None,
            60, "4 replicas running and 2 gated",
        )
        for name in gated:
            assert name.startswith("serve-") and "*" not in name
            queued = wait_for(partial(event_message, core, ns, name, "Queued"), 30,
                              f"a Queued event on {name}")
            assert "waiting for" in queued, queued
            # `fairgate why` answers for the name `kubectl get pods` shows
            report = _why(fairgate, ns, name)
            assert report["verdict"] == "queued", report
            assert report["pod"] == f"{ns}/{name}" and report["tenant"] == "team-b"
        report = _why(fairgate, ns, running[0])
        assert report["verdict"] == "running", report
        assert fairgate.tenant_state("team-b")["used"] == 4.0

        # Scale down to 3: the ReplicaSet deletes the waiting pods first, then one running
        # pod; its GPU is free again and nothing stays queued.
        apps.patch_namespaced_deployment_scale("serve", ns, {"spec": {"replicas": 3}})
        _wait_pods(core, ns, "app=serve",
                   lambda r, g: len(r) == 3 and not g and len(_pods(core, ns, "app=serve")) == 3,
                   60, "3 replicas running and none waiting")
        wait_for(lambda: (lambda s: s.get("used") == 3.0 and not any(
            s.get("queued", {}).values()))(fairgate.tenant_state("team-b")),
            30, "fairgate to account 3 GPUs and no queue for team-b")
        for name in gated:
            assert _why(fairgate, ns, name)["verdict"] in ("ended", "unknown")


def test_a_job_gang_is_released_whole_and_its_completions_free_usage(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    batch: Any = client.BatchV1Api(controlplane.admin)
    core.create_namespaced_pod(ns, pod_manifest("first", {"nvidia.com/gpu": 2}))
    wait_for(partial(running_node, core, ns, "first"), 30, "first to run")
    sweep = _job("sweep", 4, {"nvidia.com/gpu": 1}, 0, {"fairgate.io/pod-group": "sweep"},
                 {"fairgate.io/pod-group-size": "4"})
    selector = "job-name=sweep"
    with _workload(batch, "job", ns, sweep):
        # 4 x 1 GPU next to first's 2: the gang does not fit whole, so all 4 wait.
        gated = _wait_pods(core, ns, selector, lambda r, g: g if len(g) == 4 and not r else None,
                           60, "the Job's 4 pods to be created and gated")
        wait_for(partial(event_message, core, ns, gated[-1], "Queued"), 30, "a Queued event")
        report = _why(fairgate, ns, gated[0])
        assert report["verdict"] == "queued", report
        # the whole gang's 4 GPUs are asked for at once: 2 more than team-b has free
        assert "waiting for 2.00 GPU-eq of tenant quota" in report["summary"], report

        kubelet.finish(ns, "first")
        members = _wait_pods(core, ns, selector, lambda r, g: r if len(r) == 4 else None,
                             60, "the whole gang to run")
        assert members == gated  # the same pods, released together
        assert fairgate.tenant_state("team-b")["used"] == 4.0

        for name in members:
            kubelet.finish(ns, name)
        wait_for(lambda: (batch.read_namespaced_job_status("sweep", ns).status.succeeded
                          or 0) == 4, 60, "the Job to count 4 completions")
        fairgate.wait_idle()  # the completions freed the gang's usage
        assert _why(fairgate, ns, members[0])["verdict"] == "ended"


def test_a_statefulsets_inference_pods_each_get_inference_priority_and_mig_placement(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal includes 2 x mig-3g.40gb
    core = pods_api(controlplane, "team-b")
    apps: Any = client.AppsV1Api(controlplane.admin)
    labels = {"app": "infer", "fairgate.io/class": "inference"}
    with _workload(apps, "stateful_set", ns, {
        "metadata": {"name": "infer"},
        "spec": {"replicas": 2, "serviceName": "infer",
                 "selector": {"matchLabels": {"app": "infer"}},
                 "template": _template({"nvidia.com/mig-3g.40gb": 1}, labels)},
    }):
        for name in ("infer-0", "infer-1"):  # created one after the other, once Running
            node = wait_for(partial(_running_once_created, core, ns, name), 60,
                            f"{name} to be created and run")
            pod = core.read_namespaced_pod(name, ns)
            assert pod.spec.priority_class_name == "fairgate-inference"
            assert pod.metadata.labels["fairgate.io/class"] == "inference"
            assert pod.metadata.annotations["fairgate.io/demand"] == "mig-3g.40gb=1"
            admitted = {n.name for n in DEFAULT_GPU_NODES
                        if required_affinity_admits(pod, n.labels())}
            assert admitted == {n.name for n in DEFAULT_GPU_NODES if n.mig_strategy == "mixed"}
            assert node in admitted
            report = _why(fairgate, ns, name)
            assert report["verdict"] == "running" and report["class"] == "inference", report
        assert fairgate.tenant_state("team-b")["queued"] == {"inference": 0, "training": 0}


def test_deleting_a_namespace_with_running_and_waiting_pods_leaves_nothing_behind(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
    make_namespace: Any,
) -> None:
    ns = make_namespace("team-b-tmp", {"fairgate.io/tenant": "team-b"})
    admin: Any = client.CoreV1Api(controlplane.admin)
    apps: Any = client.AppsV1Api(controlplane.admin)
    admin.create_namespaced_pod(ns, pod_manifest("run", {"nvidia.com/gpu": 4}))
    wait_for(partial(running_node, admin, ns, "run"), 30, "run to run")
    apps.create_namespaced_deployment(ns, _deployment("extra", 2, {"nvidia.com/gpu": 1}))
    waiting = _wait_pods(admin, ns, "app=extra", lambda r, g: g if len(g) == 2 else None,
                         60, "the Deployment's 2 pods to wait gated")
    wait_for(lambda: _why(fairgate, ns, waiting[0])["verdict"] == "queued", 30,
             "the dispatcher to see the waiting pods")
    state = fairgate.tenant_state("team-b")
    assert state["used"] == 4.0 and state["queued"]["training"] == 2

    admin.delete_namespace(ns)  # the namespace controller deletes the Deployment and pods
    wait_for(partial(_gone, admin.read_namespace, ns), 90, f"namespace {ns} to be deleted")
    fairgate.wait_idle()  # no usage and no queue entry for team-b
    for name in ("run", *waiting):
        report = _why(fairgate, ns, name)
        assert report["verdict"] == "ended", report  # no ticket left in the queue


def test_a_job_pod_that_fails_and_is_retried_is_accounted_once(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    batch: Any = client.BatchV1Api(controlplane.admin)
    selector = "job-name=retry"
    with _workload(batch, "job", ns, _job("retry", 1, {"nvidia.com/gpu": 3}, 2)):
        first = _wait_pods(core, ns, selector, lambda r, g: r[0] if r else None,
                           60, "the Job's first pod to run")
        assert fairgate.tenant_state("team-b")["used"] == 3.0
        kubelet.finish(ns, first, "Failed")
        # The Job controller creates a replacement (after its backoff); the failed pod's 3
        # GPUs are freed, so the replacement fits the 4-GPU quota and runs: 3, never 6.
        second = _wait_pods(core, ns, selector,
                            lambda r, g: next((n for n in r if n != first), None),
                            90, "the Job to retry with a new pod that runs")
        assert _why(fairgate, ns, first)["verdict"] == "ended"
        assert _why(fairgate, ns, second)["verdict"] == "running"
        state = fairgate.tenant_state("team-b")
        assert state["used"] == 3.0 and not any(state["queued"].values()), state
        kubelet.finish(ns, second)
        wait_for(lambda: (batch.read_namespaced_job_status("retry", ns).status.succeeded
                          or 0) == 1, 60, "the Job to succeed")
        fairgate.wait_idle()


def test_a_rolling_update_at_the_quota_edge_completes_and_never_runs_above_quota(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    apps: Any = client.AppsV1Api(controlplane.admin)
    roll = _deployment("roll", 4, {"nvidia.com/gpu": 1}, strategy={
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}})
    with _workload(apps, "deployment", ns, roll):
        old = _wait_pods(core, ns, "app=roll", lambda r, g: r if len(r) == 4 else None,
                         60, "4 replicas running")
        # A new revision: the surge pod meets a full quota and waits; each old pod the
        # Deployment takes down frees the GPU the next new pod is released onto.
        apps.patch_namespaced_deployment("roll", ns, {"spec": {"template": {"metadata": {
            "annotations": {"revision": "2"}}}}})
        most = 0

        def rolled() -> bool:
            nonlocal most
            running, _ = _split(core, ns, "app=roll")
            most = max(most, len(running))
            status = apps.read_namespaced_deployment_status("roll", ns).status
            return (len(running) == 4 and not set(running) & set(old)
                    and status.updated_replicas == 4 and status.available_replicas == 4)

        wait_for(rolled, 120, "the rollout to complete", interval=0.1)
        assert most <= 4, f"{most} replicas ran at once with a 4-GPU quota"
        state = fairgate.tenant_state("team-b")
        assert state["used"] == 4.0 and not any(state["queued"].values()), state


# placement classes ----------------------------------------------------------

SINGLE_MIG_NODE = GpuNode(
    "gpu-mig-single", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "single", {"nvidia.com/gpu": 56},
    56, 4864,
)


def _class_capacity(fairgate: FairgateStack) -> dict[str, int]:
    return {row["key"]: row["capacity"] for row in fairgate.status()["capacity_by_class"]}


def test_a_whole_gpu_backlog_is_released_only_onto_whole_gpus_and_single_mig_pods_run(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    """The headline case: 8 whole GPUs plus a node with 56 MIG devices under the
    `single` strategy (also `nvidia.com/gpu`) is not 64 GPUs. Whole-GPU pods are
    released only up to the 8 GPUs their affinity can reach (none is left Pending
    without a gate); pods labelled `fairgate.io/mig-profile: 1g.5gb` run on the MIG node."""
    admin: Any = client.CoreV1Api(controlplane.admin)
    extra = FakeKubelet(controlplane, nodes=[SINGLE_MIG_NODE])
    extra.register_nodes()
    extra.start()
    try:
        wait_for(lambda: _class_capacity(fairgate).get("mig-1g.5gb#single") == 56, 30,
                 "the dispatcher to count the single-strategy node as its own class")
        assert _class_capacity(fairgate)["gpu"] == CLUSTER_GPUS
        names: list[tuple[str, str]] = []

        def running_whole() -> int:
            return sum(1 for ns, name in names if running_node(admin, ns, name))

        # team-b's 4 GPUs first, then team-a's 8 (4 nominal + 4 borrowed): 12 GPUs that
        # quota allows, 8 that the whole-GPU nodes have (borrowed pods never preempt)
        for tenant, count in (("team-b", 4), ("team-a", 8)):
            ns, core = tenant_namespace(tenant), pods_api(controlplane, tenant)
            for i in range(count):
                core.create_namespaced_pod(ns, pod_manifest(f"w{i}", {"nvidia.com/gpu": 1}))
                names.append((ns, f"w{i}"))
            if tenant == "team-b":
                wait_for(lambda: running_whole() == 4, 60, "team-b's 4 pods to run")
        wait_for(lambda: running_whole() == CLUSTER_GPUS, 60, "8 whole-GPU pods to run")
        time.sleep(3)  # several dispatcher rounds: nothing more may be released
        pods = [admin.read_namespaced_pod(name, ns) for ns, name in names]
        released = [p for p in pods if not is_gated(p)]
        assert len(released) == CLUSTER_GPUS, [p.metadata.name for p in released]
        assert all(p.spec.node_name in WHOLE_GPU_NODES for p in released)

        ns, core = tenant_namespace("team-a"), pods_api(controlplane, "team-a")
        for i in range(3):
            pod = core.create_namespaced_pod(ns, pod_manifest(
                f"mig-single-{i}", {"nvidia.com/gpu": 1},
                labels={"fairgate.io/mig-profile": "1g.5gb"}))
            assert pod.metadata.annotations["fairgate.io/demand"] == "mig-1g.5gb=1"
            assert required_affinity_admits(pod, SINGLE_MIG_NODE.labels())
            assert not any(required_affinity_admits(pod, n.labels()) for n in DEFAULT_GPU_NODES)
        for i in range(3):
            node = wait_for(partial(running_node, core, ns, f"mig-single-{i}"), 30,
                            f"single-MIG pod {i} to run")
            assert node == SINGLE_MIG_NODE.name
        used = {row["key"]: row["used"] for row in fairgate.status()["capacity_by_class"]}
        assert used["mig-1g.5gb#single"] == 3 and used["gpu"] == CLUSTER_GPUS
        refused, message = refusal(lambda: core.create_namespaced_pod(ns, pod_manifest(
            "mig-wrong", {"nvidia.com/mig-1g.5gb": 1},
            labels={"fairgate.io/mig-profile": "1g.5gb"})))
        assert refused in (400, 403) and "request nvidia.com/gpu only" in message, message
    finally:
        for tenant in ("team-a", "team-b"):
            admin.delete_collection_namespaced_pod(tenant_namespace(tenant),
                                                   grace_period_seconds=0)
        extra.stop()
        admin.delete_node(SINGLE_MIG_NODE.name)
        client.CoordinationV1Api(controlplane.admin).delete_namespaced_lease(
            SINGLE_MIG_NODE.name, "kube-node-lease")


# A Deployment named with 47+ characters gives its pods a generateName of 59+ (name, "-",
# the pod-template hash, "-"); the API server cuts it to 58 before adding 5 characters.
LONG_NAME = "inference-server-for-the-recommendation-team-eu-west"  # 52 characters; its Job 60


def test_controllers_with_long_names_are_counted_and_queued_like_any_other(
    controlplane: ControlPlane,
    kubelet: FakeKubelet,
    fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-b")  # nominal 4 GPUs, no borrowing
    core = pods_api(controlplane, "team-b")
    apps: Any = client.AppsV1Api(controlplane.admin)
    batch: Any = client.BatchV1Api(controlplane.admin)
    deployment = _deployment(LONG_NAME, 3, {"nvidia.com/gpu": 1})
    job = _job(LONG_NAME + "-trainer", 3, {"nvidia.com/gpu": 1}, backoff_limit=6,
               labels={"app": "long-job"})
    with _workload(apps, "deployment", ns, deployment), _workload(batch, "job", ns, job):
        # 6 pods of 1 GPU on a 4-GPU quota: 4 run and 2 wait, whoever created them
        running, gated = _wait_pods(
            core, ns, "app", lambda r, g: (r, g) if len(r) == 4 and len(g) == 2 else None,
            90, "4 pods running and 2 gated",
        )
        assert all(len(name) == 63 for name in running + gated), running + gated
        wait_for(lambda: fairgate.tenant_state("team-b").get("used") == 4.0, 30,
                 "fairgate to count the 4 running pods")
        # each pod owns its ticket: no pod is taken for another's copy, and usage stays
        # counted past the reservation TTL (an unconfirmed reservation would expire)
        time.sleep(40)  # the 30 s TTL and the dispatcher's next expiry pass
        assert fairgate.tenant_state("team-b")["used"] == 4.0
        for name in running + gated:
            assert event_message(core, ns, name, "TicketConflict") is None, name
            report = _why(fairgate, ns, name)
            assert report["verdict"] == ("running" if name in running else "queued"), report
        # a running pod ends: a waiting one is released into its GPU, never more than 4
        core.delete_namespaced_pod(running[0], ns, grace_period_seconds=0)
        _wait_pods(core, ns, "app", lambda r, g: True if len(r) == 4 and len(g) <= 2
                   and running[0] not in r else None, 60, "a waiting pod released")
        assert fairgate.tenant_state("team-b")["used"] == 4.0
