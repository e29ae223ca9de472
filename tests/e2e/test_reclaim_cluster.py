"""Reclaim on the real control plane: fair-share preemption through the Eviction API.

Two tenants of weight 1 share 8 whole GPUs (two nodes of 4), each with a nominal quota
of 8 and no borrowing, so the kube-scheduler never preempts one for the other (same
priority) and only reclaim can move capacity. team-a fills the cluster with preemptible
1-GPU training pods; team-b then asks for its share.

With `fairShare.reclaim` on (module `env`):
- reclaim evicts team-a's pods, one reclaim at a time, until team-b holds what it asks
  for; each evicted pod keeps running through its termination grace period (the fake
  kubelet honours it for pods annotated so), gets a `Reclaimed` Event, and the audit
  log a `reclaim` record; the ReplicaSet's replacement pod is queued, not run;
- a PodDisruptionBudget that forbids any disruption holds: nothing is evicted, and
  team-b waits, until the budget allows one (the disruption controller runs here);
- a gang is reclaimed whole: all four pods of the younger gang go, the older stays (both
  have run `minRuntime`; a gang younger than that is not a victim).
With reclaim off (module `off`): nothing is evicted, team-b waits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.controlplane import CONTROLLERS
from harness.fairgate import EVEN_PLATFORM_YAML, pods_api, tenant_namespace
from harness.kubelet import HONOUR_GRACE, whole_gpu_node
from harness.pods import is_gated, no_pods, pod_manifest, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = tuple(whole_gpu_node(f"gpu-{i}") for i in range(2))  # 8 whole GPUs
PLATFORM = EVEN_PLATFORM_YAML
RECLAIM = """\
fairShare:
  reclaim: {after: 2s, minRuntime: 3s, perHour: 60}
"""
QUOTA = """\
nominal: {gpu: 8}
borrowLimit: {gpuEquivalents: 0}
inferenceReserve: {gpuEquivalents: 0}
defaultClass: training
"""
QUOTAS = {"team-a": QUOTA, "team-b": QUOTA}
A, B = tenant_namespace("team-a"), tenant_namespace("team-b")
MIN_RUNTIME = 3  # seconds, as RECLAIM says
GRACE = 5  # seconds: the evicted pods' termination grace period
PREEMPTIBLE = {"fairgate.io/preemptible": "true"}
# reclaim looks every 10 s, waits for one reclaim's pods to be gone before the next
RECLAIM_WAIT = 90


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("reclaim"), NODES,
                         platform_yaml=PLATFORM + RECLAIM, quotas=QUOTAS,
                         controllers=(*CONTROLLERS, "disruption-controller")) as cluster:
        yield cluster


def _replicaset(name: str, replicas: int) -> dict[str, Any]:
    """team-a's preemptible 1-GPU training pods, kept at `replicas` by their controller."""
    labels = {"app": name, **PREEMPTIBLE}
    template = pod_manifest(name, {"nvidia.com/gpu": 1}, labels=labels,
                            annotations={HONOUR_GRACE: "true"})
    template["spec"]["terminationGracePeriodSeconds"] = GRACE
    template = {"metadata": {"labels": labels, "annotations": template["metadata"]["annotations"]},
                "spec": template["spec"]}
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": template},
    }


def _pods(core: Any, namespace: str, selector: str = "") -> list[Any]:
    items: list[Any] = core.list_namespaced_pod(namespace, label_selector=selector).items
    return items


def _running(core: Any, namespace: str, selector: str = "") -> list[Any]:
    return [p for p in _pods(core, namespace, selector)
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def _terminating(core: Any, namespace: str) -> list[Any]:
    return [p for p in _pods(core, namespace) if p.metadata.deletion_timestamp is not None]


def _reclaim_events(core: Any) -> list[Any]:
    events: list[Any] = core.list_namespaced_event(
        A, field_selector="reason=Reclaimed").items
    return events


def _reclaim_records(env: PrivateCluster) -> list[dict[str, Any]]:
    result = env.fairgate.run_cli("audit", "query", "--decision", "reclaim", "--json",
                                  "--redis-url", env.fairgate.redis_url)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def _fill_team_a(env: PrivateCluster, name: str) -> None:
    client.AppsV1Api(env.cp.admin).create_namespaced_replica_set(A, _replicaset(name, 8))
    wait_for(lambda: len(_running(env.admin, A, f"app={name}")) == 8, 90,
             "team-a's 8 pods to run")


def _clean(env: PrivateCluster) -> None:
    apps = client.AppsV1Api(env.cp.admin)
    for rs in apps.list_namespaced_replica_set(A).items:
        apps.delete_namespaced_replica_set(rs.metadata.name, A)
    policy = client.PolicyV1Api(env.cp.admin)
    for pdb in policy.list_namespaced_pod_disruption_budget(A).items:
        policy.delete_namespaced_pod_disruption_budget(pdb.metadata.name, A)
    for namespace in (A, B):
        for pod in _pods(env.admin, namespace):
            try:
                env.admin.delete_namespaced_pod(pod.metadata.name, namespace,
                                                grace_period_seconds=0)
            except ApiException as error:
                if error.status != 404:  # gone already: its ReplicaSet's deletion took it
                    raise
        wait_for(lambda ns=namespace: no_pods(env.admin, ns), 90, f"{namespace} to be empty")


def test_reclaim_evicts_with_grace_and_the_replacement_queues(env: PrivateCluster) -> None:
    _fill_team_a(env, "train")
    user = pods_api(env.cp, "team-b")
    for name in ("b-0", "b-1"):
        user.create_namespaced_pod(B, pod_manifest(name, {"nvidia.com/gpu": 1}))
    assert is_gated(env.admin.read_namespaced_pod("b-0", B))

    # the first victim: evicted, and still running through its grace period
    victim = wait_for(lambda: next(iter(_terminating(env.admin, A)), None), RECLAIM_WAIT,
                      "a team-a pod to be evicted")
    assert victim.metadata.deletion_grace_period_seconds == GRACE
    assert victim.metadata.labels.get("fairgate.io/preemptible") == "true"
    time.sleep(GRACE / 2)
    still = env.admin.read_namespaced_pod(victim.metadata.name, A)
    assert still.metadata.uid == victim.metadata.uid and still.status.phase == "Running", (
        "the evicted pod did not get its grace period")

    # team-b gets its two GPUs, each freed by one reclaim; team-a keeps its entitlement (6)
    wait_for(lambda: running_node(env.admin, B, "b-0") and running_node(env.admin, B, "b-1"),
             RECLAIM_WAIT, "team-b's two pods to run")
    events = _reclaim_events(env.admin)
    assert len({e.involved_object.name for e in events}) == 2, [e.message for e in events]
    assert all("team-b" in e.message for e in events), [e.message for e in events]
    records = _reclaim_records(env)
    assert len(records) == 2 and {r["tenant"] for r in records} == {"team-a"}, records
    assert all(r["diff"]["preemption"]["ranSeconds"] >= MIN_RUNTIME for r in records), records

    # the ReplicaSet replaced both; the replacements are queued, not run (team-a holds 6)
    wait_for(lambda: len(_pods(env.admin, A, "app=train")) == 8, 60, "the replacements")
    time.sleep(12)  # past another reclaim check: nothing more moves
    team_a = _pods(env.admin, A, "app=train")
    assert sum(1 for p in team_a if is_gated(p)) == 2, [p.metadata.name for p in team_a]
    assert len(_running(env.admin, A, "app=train")) == 6
    assert len(_reclaim_events(env.admin)) == len(events), "reclaimed past team-a's share"
    _clean(env)


def test_a_disruption_budget_that_forbids_eviction_holds(env: PrivateCluster) -> None:
    _clean(env)
    policy = client.PolicyV1Api(env.cp.admin)
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": "train"},
              "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "held"}}}}
    policy.create_namespaced_pod_disruption_budget(A, budget)
    _fill_team_a(env, "held")
    before = len(_reclaim_events(env.admin))
    pods_api(env.cp, "team-b").create_namespaced_pod(
        B, pod_manifest("b-held", {"nvidia.com/gpu": 1}))
    time.sleep(30)  # three reclaim checks past `after` and `minRuntime`
    assert not _terminating(env.admin, A), "evicted against the PodDisruptionBudget"
    assert len(_reclaim_events(env.admin)) == before
    assert is_gated(env.admin.read_namespaced_pod("b-held", B))

    # the budget allows one disruption: reclaim goes through, team-b runs
    policy.patch_namespaced_pod_disruption_budget("train", A, {"spec": {"maxUnavailable": 1}})
    wait_for(lambda: running_node(env.admin, B, "b-held"), RECLAIM_WAIT,
             "team-b's pod to run once the budget allows")
    assert len(_reclaim_events(env.admin)) == before + 1
    _clean(env)


def _gang(name: str) -> list[dict[str, Any]]:
    members = []
    for i in range(4):
        pod = pod_manifest(f"{name}-{i}", {"nvidia.com/gpu": 1},
                           labels={"fairgate.io/pod-group": name, **PREEMPTIBLE},
                           annotations={"fairgate.io/pod-group-size": "4", HONOUR_GRACE: "true"})
        pod["spec"]["terminationGracePeriodSeconds"] = 1
        members.append(pod)
    return members


def test_a_gang_is_reclaimed_whole_and_the_youngest_first(env: PrivateCluster) -> None:
    _clean(env)
    user_a = pods_api(env.cp, "team-a")
    for name in ("old", "young"):  # "young" starts last: it is reclaimed
        for pod in _gang(name):
            user_a.create_namespaced_pod(A, pod)
        wait_for(lambda n=name: len(_running(env.admin, A, f"fairgate.io/pod-group={n}")) == 4,
                 60, f"gang {name} to run")
        time.sleep(1)
    time.sleep(MIN_RUNTIME)  # both gangs may be reclaimed: the younger must be chosen
    user_b = pods_api(env.cp, "team-b")
    for pod in _gang("b"):  # team-b's gang asks for its entitlement, 4
        pod["metadata"]["labels"].pop("fairgate.io/preemptible")
        user_b.create_namespaced_pod(B, pod)
    wait_for(lambda: len(_running(env.admin, B)) == 4, RECLAIM_WAIT, "team-b's gang to run")
    assert len(_running(env.admin, A, "fairgate.io/pod-group=old")) == 4
    assert not _pods(env.admin, A, "fairgate.io/pod-group=young"), "the gang was split"
    reclaimed = {e.involved_object.name for e in _reclaim_events(env.admin)}
    assert {f"young-{i}" for i in range(4)} <= reclaimed
    assert not any(name.startswith("old-") for name in reclaimed)
    _clean(env)


@pytest.fixture(scope="module")
def off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("no-reclaim"), NODES,
                         platform_yaml=PLATFORM, quotas=QUOTAS) as cluster:
        yield cluster


def test_with_reclaim_off_no_training_is_evicted_for_training(off: PrivateCluster) -> None:
    _fill_team_a(off, "train")
    pods_api(off.cp, "team-b").create_namespaced_pod(
        B, pod_manifest("b-0", {"nvidia.com/gpu": 1}))
    time.sleep(30)  # what reclaim, were it on, would have needed three times over
    assert not _terminating(off.admin, A)
    assert len(_running(off.admin, A, "app=train")) == 8
    assert not _reclaim_events(off.admin)
    assert is_gated(off.admin.read_namespaced_pod("b-0", B))
