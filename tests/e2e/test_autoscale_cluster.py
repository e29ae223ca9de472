"""Autoscaled GPU pools on the real control plane: fairgate's `provisioningRequest` mode
against cluster-autoscaler's own ProvisioningRequest CRD (tests/e2e/crds, so the API
server validates every request fairgate makes) and the harness's fake autoscaler
(harness.provisioner: `best-effort-atomic-scale-up`, nodes through the fake kubelet
after a delay). A private cluster of one 2-GPU node; `fairgate-platform` has
`autoscaling: {mode: provisioningRequest, maxCapacity: {gpu: 16}, inFlight: 1}`, so
requests are made one at a time, in queue order. fairgate's dispatcher runs with the
base manifests' RBAC: it may create requests and templates, never delete them. The
last two tests switch fairgate-platform to `mode: pending` and to no `autoscaling`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.api import CRDS, message_of, serve_crd
from harness.fairgate import GATE, PLATFORM_YAML, SYSTEM_NAMESPACE, pods_api, tenant_namespace
from harness.kubelet import whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.provisioner import FakeAutoscaler, fake_autoscaler, requests_in
from harness.waiting import wait_for
from kubernetes import client

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BASE = whole_gpu_node("gpu-base-0", gpus=2)
AUTOSCALING = """\
autoscaling:
  mode: provisioningRequest
  maxCapacity: {gpu: 16}
  inFlight: 1
"""
DELAY = 3.0
"""The fake autoscaler's time from a request to its nodes."""
HEAD_LABEL = "fairgate.io/provisioning-for"
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
A, B = tenant_namespace("team-a"), tenant_namespace("team-b")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("autoscale"), (BASE,),
                         platform_yaml=PLATFORM_YAML + AUTOSCALING) as cluster:
        serve_crd(cluster.cp.admin, CRDS / "autoscaling.x-k8s.io_provisioningrequests.yaml")
        yield cluster


@pytest.fixture(scope="module")
def autoscaler(env: PrivateCluster) -> Iterator[FakeAutoscaler]:
    with fake_autoscaler(env.cp, env.kubelet, delay=DELAY) as running:
        yield running


@pytest.fixture
def clean(env: PrivateCluster, autoscaler: FakeAutoscaler) -> Iterator[None]:
    """After the test: its pods deleted, their requests collected, fairgate idle, the
    added nodes removed (a scale-down), the autoscaler's knobs back."""
    yield
    for namespace in (A, B):
        env.admin.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        wait_for(partial(no_pods, env.admin, namespace), 60, f"pods of {namespace} to go")
        wait_for(lambda ns=namespace: not _requests(env, ns), 60, f"requests of {namespace} to go")
    env.fairgate.wait_idle(60)
    autoscaler.reset(DELAY)
    wait_for(lambda: env.class_capacity().get("gpu") == 2, 30, "the base node's capacity only")


def _requests(env: PrivateCluster, namespace: str) -> list[dict[str, Any]]:
    return requests_in(env.cp.admin, namespace)


def _templates(env: PrivateCluster, namespace: str) -> list[Any]:
    items: list[Any] = env.admin.list_namespaced_pod_template(
        namespace, label_selector=HEAD_LABEL).items
    return items


def _reasons(env: PrivateCluster, namespace: str, pod: str) -> dict[str, list[str]]:
    events = env.admin.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}").items
    said: dict[str, list[str]] = {}
    for event in events:
        said.setdefault(event.reason, []).append(event.message)
    return said


def _fill_base(env: PrivateCluster) -> None:
    """team-a's pod `a0` (2 GPUs) runs on the base node: nothing is free."""
    pods_api(env.cp, "team-a").create_namespaced_pod(A, pod_manifest("a0", {"nvidia.com/gpu": 2}))
    assert wait_for(partial(running_node, env.admin, A, "a0"), 60, "a0 to run") == BASE.name


def test_a_pod_beyond_the_nodes_gets_a_request_then_nodes_then_runs(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    _fill_base(env)
    a1 = pods_api(env.cp, "team-a").create_namespaced_pod(
        A, pod_manifest("a1", {"nvidia.com/gpu": 2}))
    [request] = wait_for(lambda: _requests(env, A) or None, 30, "a ProvisioningRequest")
    meta = request["metadata"]
    assert meta["name"].startswith("fairgate-") and meta["labels"] == {HEAD_LABEL: meta["name"]}
    assert [(o["kind"], o["name"], o["uid"]) for o in meta["ownerReferences"]] == [
        ("Pod", "a1", a1.metadata.uid)]
    assert request["spec"]["provisioningClassName"] == \
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    [pod_set] = request["spec"]["podSets"]
    assert pod_set["count"] == 1
    [template] = _templates(env, A)
    assert pod_set["podTemplateRef"]["name"] == template.metadata.name
    assert template.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
    assert is_gated(env.admin.read_namespaced_pod("a1", A))  # held until Provisioned
    node = wait_for(partial(running_node, env.admin, A, "a1"), 60, "a1 to run on a new node")
    assert node in autoscaler.nodes()
    seen = autoscaler.seen[f"{A}/{meta['name']}"]
    assert seen.outcome == "Provisioned" and seen.done_at - seen.first_seen >= DELAY
    pod = env.admin.read_namespaced_pod("a1", A)
    assert pod.metadata.annotations[CONSUME] == meta["name"]
    said = _reasons(env, A, "a1")
    assert any(meta["name"] in m for m in said["Provisioning"]), said
    assert "WaitingForNodes" in said, said
    assert len(_requests(env, A)) == 1  # nothing more was asked


def test_two_tenants_backlogs_get_nodes_in_fair_order(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    """team-a (weight 2) queues three 2-GPU pods, then team-b (weight 1) two, behind a
    full base node: nodes are asked for one head at a time (inFlight 1) in fairgate's
    weighted fair order, not in order of arrival, and every pod runs."""
    _fill_base(env)
    team_a, team_b = pods_api(env.cp, "team-a"), pods_api(env.cp, "team-b")
    for i in range(1, 4):
        team_a.create_namespaced_pod(A, pod_manifest(f"a{i}", {"nvidia.com/gpu": 2}))
    for i in range(1, 3):
        team_b.create_namespaced_pod(B, pod_manifest(f"b{i}", {"nvidia.com/gpu": 2}))
    for namespace, names in ((A, ["a1", "a2", "a3"]), (B, ["b1", "b2"])):
        for name in names:
            wait_for(partial(running_node, env.admin, namespace, name), 120, f"{name} to run")
    owners = {}
    for namespace in (A, B):
        for request in _requests(env, namespace):
            [owner] = request["metadata"]["ownerReferences"]
            owners[f"{namespace}/{request['metadata']['name']}"] = owner["name"]
    order = [owners[k] for k in sorted(owners, key=lambda k: autoscaler.seen[k].first_seen)]
    assert sorted(order) == ["a1", "a2", "a3", "b1", "b2"], order
    print("requests in the order made:", order)
    assert order.index("b1") < order.index("a3"), order  # not first come, first served
    assert [p for p in order if p.startswith("a")] == ["a1", "a2", "a3"]  # FIFO within
    starts = sorted(autoscaler.seen[k].first_seen for k in owners)
    assert min(b - a for a, b in itertools.pairwise(starts)) >= DELAY * 0.9


def test_a_gangs_request_is_one_for_all_its_pods(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    """Three 2-GPU pods of one gang on a 2-GPU cluster: one request with all three (one
    pod set of count 3, owned by each pod); none runs before the nodes for all are there."""
    team_a = pods_api(env.cp, "team-a")
    gang = {"labels": {"fairgate.io/pod-group": "ddp"},
            "annotations": {"fairgate.io/pod-group-size": "3"}}
    uids = {team_a.create_namespaced_pod(A, pod_manifest(f"g{i}", {"nvidia.com/gpu": 2},
                                                         **gang)).metadata.uid: f"g{i}"
            for i in range(3)}
    [request] = wait_for(lambda: _requests(env, A) or None, 30, "the gang's request")
    assert request["spec"]["podSets"][0]["count"] == 3 and len(request["spec"]["podSets"]) == 1
    assert {o["uid"]: o["name"] for o in request["metadata"]["ownerReferences"]} == uids
    key = f"{A}/{request['metadata']['name']}"
    while not autoscaler.seen.get(key) or not autoscaler.seen[key].outcome:
        pods = env.admin.list_namespaced_pod(A).items
        assert all(is_gated(p) for p in pods), [p.metadata.name for p in pods]
        time.sleep(0.2)
    assert len(autoscaler.seen[key].nodes) == 3 and autoscaler.seen[key].pods == 3
    for name in uids.values():
        wait_for(partial(running_node, env.admin, A, name), 60, f"{name} to run")
    assert len(_requests(env, A)) == 1


def test_a_failed_request_is_retried_and_reported(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    autoscaler.fail_next = 1
    _fill_base(env)
    pods_api(env.cp, "team-a").create_namespaced_pod(A, pod_manifest("a1", {"nvidia.com/gpu": 2}))
    [first] = wait_for(lambda: _requests(env, A) or None, 30, "the first request")
    name = first["metadata"]["name"]
    warned = wait_for(lambda: _reasons(env, A, "a1").get("ProvisioningFailed"), 60,
                      "a ProvisioningFailed Event")
    assert warned == [f"ProvisioningRequest {name} failed (Failed: OutOfStock (the e2e "
                      "harness's fake autoscaler was told to fail)): asking again in 30s "
                      "(attempt 2)"]
    why = env.why(A, "a1")
    assert f"ProvisioningRequest {name} failed" in why["summary"], why
    assert "asking again in" in why["summary"] and "(attempt 2)" in why["summary"], why
    assert is_gated(env.admin.read_namespaced_pod("a1", A))
    wait_for(partial(running_node, env.admin, A, "a1"), 90, "a1 to run after the retry")
    names = sorted(r["metadata"]["name"] for r in _requests(env, A))
    assert names == [name, f"{name}-2"]  # the failed one stays, owned by a1, until it goes
    assert env.admin.read_namespaced_pod("a1", A).metadata.annotations[CONSUME] == f"{name}-2"


def test_pods_gone_their_request_and_templates_are_collected(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    autoscaler.delay = 3600.0  # no nodes come while the test runs
    _fill_base(env)
    pods_api(env.cp, "team-a").create_namespaced_pod(A, pod_manifest("a1", {"nvidia.com/gpu": 2}))
    wait_for(lambda: _requests(env, A) and _templates(env, A), 30, "a request and its template")
    env.admin.delete_namespaced_pod("a1", A, grace_period_seconds=0)
    wait_for(lambda: not _requests(env, A) and not _templates(env, A), 60,
             "the garbage collector to delete the request and its templates")
    wait_for(lambda: env.status()["tenants"]["team-a"]["used"] == 2, 30, "a1's GPUs freed")


def _platform(env: PrivateCluster, text: str) -> None:
    client.CoreV1Api(env.cp.admin).patch_namespaced_config_map(
        "fairgate-platform", SYSTEM_NAMESPACE, {"data": {"platform.yaml": text}})


def _past_the_pools(env: PrivateCluster) -> bool:
    """Whether the webhook refuses an 8-GPU pod naming autoscaling.maxCapacity (dry run):
    it shows which platform config the webhook has read."""
    try:
        pods_api(env.cp, "team-a").create_namespaced_pod(
            A, pod_manifest("big", {"nvidia.com/gpu": 8}), dry_run="All")
    except client.exceptions.ApiException as error:
        return "autoscaling.maxCapacity" in message_of(error)
    return False


def test_pending_mode_lifts_the_gate_for_the_autoscaler_to_see(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    """`mode: pending`: the head beyond the nodes is released at once, pending and
    unschedulable; an autoscaler that reacts to pending pods adds a node and it runs; no
    ProvisioningRequest is made."""
    autoscaler.pending_pods = True
    pending = AUTOSCALING.replace("provisioningRequest", "pending")
    _platform(env, PLATFORM_YAML + pending.replace("{gpu: 16}", "{gpu: 6}"))
    try:
        wait_for(lambda: _past_the_pools(env), 30, "the webhook to read mode pending")
        time.sleep(5)  # the dispatcher reads the same ConfigMap
        _fill_base(env)
        pods_api(env.cp, "team-a").create_namespaced_pod(
            A, pod_manifest("a1", {"nvidia.com/gpu": 2}))
        wait_for(lambda: not is_gated(env.admin.read_namespaced_pod("a1", A)), 30,
                 "a1's gate lifted for the autoscaler to see it pending")
        said = wait_for(lambda: _reasons(env, A, "a1").get("WaitingForNodes"), 30,
                        "a WaitingForNodes Event")
        assert any("autoscaling mode pending" in m for m in said), said
        node = wait_for(partial(running_node, env.admin, A, "a1"), 60, "a1 to run")
        assert node in autoscaler.nodes() and autoscaler.seen[f"pod:{A}/a1"].nodes == (node,)
        assert not _requests(env, A)
    finally:
        _platform(env, PLATFORM_YAML + AUTOSCALING)
        wait_for(lambda: not _past_the_pools(env), 30, "mode provisioningRequest back")


def test_without_autoscaling_nothing_is_requested(
    env: PrivateCluster, autoscaler: FakeAutoscaler, clean: None,
) -> None:
    """`autoscaling` taken out of fairgate-platform: a pod beyond the nodes waits gated
    and no request is made. (The webhook shows when the new config is read: with
    maxCapacity {gpu: 6} an 8-GPU pod is refused naming it, without autoscaling not.)"""
    core = pods_api(env.cp, "team-a")
    _platform(env, PLATFORM_YAML + AUTOSCALING.replace("{gpu: 16}", "{gpu: 6}"))
    try:
        wait_for(lambda: _past_the_pools(env), 30, "the webhook to refuse past maxCapacity 6")
        _platform(env, PLATFORM_YAML)
        wait_for(lambda: not _past_the_pools(env), 30, "the webhook to read: no autoscaling")
        time.sleep(5)  # the dispatcher reads the same ConfigMap
        _fill_base(env)
        core.create_namespaced_pod(A, pod_manifest("a1", {"nvidia.com/gpu": 2}))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert not _requests(env, A) and not autoscaler.nodes()
            assert [g.name for g in env.admin.read_namespaced_pod("a1", A).spec
                    .scheduling_gates] == [GATE]
            time.sleep(0.5)
        why = env.why(A, "a1")
        assert why["verdict"] == "queued" and "waiting for nodes" not in why["summary"], why
    finally:
        _platform(env, PLATFORM_YAML + AUTOSCALING)
