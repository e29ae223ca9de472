"""Node lifecycle and unschedulable releases end to end: a private control
plane (with the real scheduler and node lifecycle controller) whose fake nodes include a
cordoned one and one whose kubelet starts reporting NotReady; fairgate installed from
manifests/ with `fairgate dispatch --unschedulable-grace 4 --not-ready-grace 20`.

While a NotReady node still counts (its grace), fairgate releases pods the scheduler
cannot place: each is caught after the unschedulable grace, never before (Warning Event,
metric, status and why), stays counted against quota, and frees its quota exactly once
when deleted. Once past its grace the node is no capacity: a fitting pod stays gated and
`why` says what it waits for; Ready again, the pod is released. No pod ever runs on the
cordoned or the NotReady node, and every pod runs where its affinity says. Cordoning
nodes at run time takes their GPUs out at once: a fitting pod waits gated until uncordon.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from harness.fairgate import GATE, pods_api, tenant_namespace
from harness.kubelet import (
    DEFAULT_GPU_NODES,
    NOT_READY_TAINT,
    cordon,
    whole_gpu_node,
)
from harness.pods import condition, pod_manifest, required_affinity_admits, running_node
from harness.private import PrivateCluster, private_cluster
from harness.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UNSCHEDULABLE_GRACE = 4.0
NOT_READY_GRACE = 20.0
CORDONED = whole_gpu_node("gpu-cordoned", cordoned=True)
FLAKY = whole_gpu_node("gpu-flaky")
NODES = (*DEFAULT_GPU_NODES, CORDONED, FLAKY)
LABELS = {n.name: n.labels() for n in NODES}
GPUS = sum(n.devices.get("nvidia.com/gpu", 0) for n in NODES if not n.cordoned)  # 12
# e2e quotas (harness.fairgate): team-a 4 GPUs + 4 GPU-eq borrowed, team-b 4 GPUs.
CEILING = {"team-a": 8.0, "team-b": 4.0}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    with private_cluster(tmp_path_factory.mktemp("lifecycle"), NODES,
                         "--unschedulable-grace", f"{UNSCHEDULABLE_GRACE:g}",
                         "--not-ready-grace", f"{NOT_READY_GRACE:g}") as cluster:
        yield cluster


def _when(text: Any) -> float:
    if isinstance(text, datetime.datetime):
        return text.timestamp()
    return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def _fairgate_events(core: Any, namespace: str, pod: str, reason: str) -> list[Any]:
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},reason={reason}").items
    return [e for e in events if e.source and e.source.component == "fairgate-dispatcher"]


def _unschedulable_since(pod: Any) -> float | None:
    scheduled = condition(pod, "PodScheduled")
    if scheduled is None or scheduled.status != "False" or scheduled.reason != "Unschedulable":
        return None
    return _when(scheduled.last_transition_time)


def _states(core: Any) -> dict[str, Any]:
    """name -> (phase, node, PodScheduled condition, nominated node), for failures."""
    found: dict[str, Any] = {}
    for tenant in CEILING:
        for pod in _pods(core, tenant):
            scheduled = condition(pod, "PodScheduled")
            found[pod.metadata.name] = (
                pod.status.phase, pod.spec.node_name,
                scheduled and (scheduled.status, scheduled.reason, scheduled.message),
                pod.status.nominated_node_name)
    return found


def _pods(core: Any, tenant: str) -> list[Any]:
    return list(core.list_namespaced_pod(tenant_namespace(tenant)).items)


def _check_placement(core: Any, forbidden: set[str]) -> None:
    """Every bound pod sits where its required affinity admits, never on a node of
    `forbidden`."""
    for tenant in CEILING:
        for pod in _pods(core, tenant):
            node = pod.spec.node_name
            if node is None:
                continue
            assert node not in forbidden, (pod.metadata.name, node)
            assert required_affinity_admits(pod, LABELS[node]), (pod.metadata.name, node)


def _used(status: Any) -> dict[str, float]:
    return {t: float(status["tenants"].get(t, {}).get("used", 0)) for t in CEILING}


def test_a_cordoned_node_is_not_capacity_and_status_says_why(env: PrivateCluster) -> None:
    status = env.status()
    notes = status["capacity_notes"]
    assert notes["total"]["gpu"] == GPUS
    assert [(e["node"], e["reason"]) for e in notes["excluded"]] == [(CORDONED.name,
                                                                      "cordoned")]
    text = env.status_text()
    assert f"node {CORDONED.name} cordoned (gpu=4 not counted)" in text


def test_releases_onto_a_node_gone_not_ready_are_caught_after_the_grace_and_freed_once(
    env: PrivateCluster,
) -> None:
    core = env.admin
    env.kubelet.set_ready(FLAKY.name, False)
    try:
        _caught_then_freed(env, core)
    finally:
        env.kubelet.set_ready(FLAKY.name, True)
        for tenant in CEILING:
            core.delete_collection_namespaced_pod(tenant_namespace(tenant),
                                                  grace_period_seconds=0)


def _caught_then_freed(env: PrivateCluster, core: Any) -> None:
    wait_for(lambda: any(t.key == NOT_READY_TAINT
                         for t in core.read_node(FLAKY.name).spec.taints or []),
             30, "the node lifecycle controller to taint the NotReady node")
    # fairgate still counts the node for its grace: 12 one-GPU pods fit its view. Those
    # within nominal quota first (training priority), team-a's 4 borrowed ones last: at
    # the lowest priority they preempt nobody, so they are the ones left unplaced.
    created = {"team-b": [f"b{i}" for i in range(4)], "team-a": [f"a{i}" for i in range(8)]}
    for tenant, names in created.items():
        api = pods_api(env.cp, tenant)
        for name in names:
            pod = api.create_namespaced_pod(tenant_namespace(tenant),
                                            pod_manifest(name, {"nvidia.com/gpu": 1}))
            assert not pod.spec.scheduling_gates, name  # released at admission

    def stuck_now() -> dict[str, tuple[str, float]] | None:
        found: dict[str, tuple[str, float]] = {}
        running = 0
        for tenant in CEILING:
            for pod in _pods(core, tenant):
                since = _unschedulable_since(pod)
                if since is not None:
                    found[pod.metadata.name] = (tenant, since)
                running += pod.status.phase == "Running"
        return found if running == 8 and len(found) == 4 else None

    try:
        stuck = wait_for(stuck_now, 60, "8 pods running and 4 reported Unschedulable")
    except AssertionError as error:
        raise AssertionError(f"{error}; pods: {_states(core)}") from None
    _check_placement(core, {CORDONED.name, FLAKY.name})

    def caught() -> dict[str, Any] | None:
        events = {name: _fairgate_events(core, tenant_namespace(tenant), name,
                                         "Unschedulable")
                  for name, (tenant, _) in stuck.items()}
        return events if all(events.values()) else None

    events = wait_for(caught, UNSCHEDULABLE_GRACE + 60, "fairgate to catch the 4 stuck pods")
    for name, found in events.items():
        assert len(found) == 1, name
        event = found[0]
        assert event.type == "Warning"
        assert "Unschedulable for" in event.message and "counted against" in event.message
        waited = _when(event.first_timestamp) - stuck[name][1]
        # Never caught before the grace (timestamps have whole seconds: 1 s of slack).
        assert waited >= UNSCHEDULABLE_GRACE - 1.0, (name, waited)
    assert env.metric("fairgate_unschedulable_releases_total") == 4
    assert env.metric("fairgate_unschedulable_pods") == 4
    assert env.metric("fairgate_unschedulable_withheld_capacity") == 4

    status = env.status()
    notes = status["capacity_notes"]
    assert notes["withheld"] == {"gpu": 4}
    assert sorted(p["pod"].split("/")[1] for p in notes["unschedulable"]) == sorted(stuck)
    used = _used(status)
    assert sum(used.values()) == 12  # every released pod stays counted
    assert all(used[t] <= CEILING[t] for t in CEILING), used  # nothing over quota
    name, (tenant, _) = next(iter(stuck.items()))
    why = env.why(tenant_namespace(tenant), name)
    assert why["verdict"] == "running" and "the scheduler cannot place it" in why["summary"]
    assert why["unschedulable"]

    # Their owners delete the stuck pods: their quota comes back exactly once.
    for name, (tenant, _) in stuck.items():
        core.delete_namespaced_pod(name, tenant_namespace(tenant), grace_period_seconds=0)
    wait_for(lambda: not env.status()["capacity_notes"]["unschedulable"], 30,
             "the deleted pods to leave the capacity notes")
    assert sum(_used(env.status()).values()) == 8
    assert env.metric("fairgate_unschedulable_pods") == 0

    # Past its grace the NotReady node is no capacity: a fitting pod waits behind the gate.
    wait_for(lambda: any(e["node"] == FLAKY.name and e["reason"].startswith("NotReady since")
                         for e in env.status()["capacity_notes"]["excluded"]),
             NOT_READY_GRACE + 30, "the NotReady node to leave capacity")
    used = _used(env.status())
    tenant = next(t for t in CEILING if used[t] < CEILING[t])
    namespace = tenant_namespace(tenant)
    pods_api(env.cp, tenant).create_namespaced_pod(namespace,
                                                   pod_manifest("late", {"nvidia.com/gpu": 1}))
    late = core.read_namespaced_pod("late", namespace)
    assert [g.name for g in late.spec.scheduling_gates or []] == [GATE]
    why = env.why(namespace, "late")
    assert why["verdict"] == "queued" and "cluster capacity" in why["waiting_for"], why

    env.kubelet.set_ready(FLAKY.name, True)  # back: its GPUs count again at once
    node = wait_for(partial(running_node, core, namespace, "late"), 60, "late to run")
    assert node != CORDONED.name
    _check_placement(core, {CORDONED.name})


def test_pods_stay_gated_while_their_capacity_is_cordoned_and_run_once_uncordoned(
    env: PrivateCluster,
) -> None:
    core = env.admin
    env.fairgate.wait_idle(60)
    spare = "gpu-a100-1"
    cordon(core, FLAKY.name)
    cordon(core, spare)
    try:
        wait_for(lambda: {e["node"] for e in env.status()["capacity_notes"]["excluded"]}
                 == {CORDONED.name, FLAKY.name, spare}, 30, "the cordons to leave capacity")
        assert env.status()["capacity_notes"]["total"]["gpu"] == 4
        team_b = pods_api(env.cp, "team-b")
        for i in range(4):
            team_b.create_namespaced_pod(tenant_namespace("team-b"),
                                         pod_manifest(f"c{i}", {"nvidia.com/gpu": 1}))
        for i in range(4):
            node = wait_for(partial(running_node, core, tenant_namespace("team-b"), f"c{i}"),
                            60, f"c{i} to run")
            assert node == "gpu-a100-0"
        namespace = tenant_namespace("team-a")
        pods_api(env.cp, "team-a").create_namespaced_pod(
            namespace, pod_manifest("waits", {"nvidia.com/gpu": 1}))
        waiting = core.read_namespaced_pod("waits", namespace)
        assert [g.name for g in waiting.spec.scheduling_gates or []] == [GATE]
        why = env.why(namespace, "waits")
        assert why["verdict"] == "queued" and "cluster capacity" in why["waiting_for"], why
        text = env.status_text()
        assert f"node {spare} cordoned (gpu=4 not counted)" in text

        cordon(core, spare, False)  # its GPUs count again: the gated pod is released
        node = wait_for(partial(running_node, core, namespace, "waits"), 60, "waits to run")
        assert node == spare
        _check_placement(core, {CORDONED.name, FLAKY.name})
    finally:
        cordon(core, FLAKY.name, False)
        cordon(core, spare, False)
        for tenant in CEILING:
            core.delete_collection_namespaced_pod(tenant_namespace(tenant),
                                                  grace_period_seconds=0)
