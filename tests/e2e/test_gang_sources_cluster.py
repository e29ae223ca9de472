"""Gangs as users declare them, on the real control plane: the in-tree Job controller
makes Indexed Jobs' pods, the JobSet CRD (from the JobSet project's source) is served so
that sizes come from real JobSet objects, and Kueue-labelled bare pods arrive apart.
fairgate's webhook and dispatcher run as in a cluster; no pod of a gang may ever run
before its whole gang is released."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from harness.api import CRDS, serve_crd
from harness.controlplane import ControlPlane
from harness.fairgate import FairgateStack, pods_api, tenant_namespace
from harness.kubelet import FakeKubelet, cordon
from harness.pods import is_gated, pod_manifest
from harness.waiting import wait_for
from kubernetes import client

pytestmark = pytest.mark.e2e

SPLIT_SECONDS = 5.0
"""How long a gang's gates may be seen partly lifted: one dispatch round's lifts."""


def _split(core: Any, namespace: str, selector: str) -> tuple[list[str], list[str]]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return (sorted(p.metadata.name for p in pods if p.status.phase == "Running"),
            sorted(p.metadata.name for p in pods if is_gated(p)))


def _template(gpus: int) -> dict[str, Any]:
    """A pod template asking for `gpus`, as a Job or JobSet carries it."""
    pod = pod_manifest("x", {"nvidia.com/gpu": gpus})
    del pod["metadata"]["name"]
    return {"metadata": pod["metadata"], "spec": {**pod["spec"], "restartPolicy": "Never"}}


def _indexed_job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    template = _template(gpus)
    return {"metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "parallelism": pods, "completions": pods,
                     "backoffLimit": 0, "template": template}}


@pytest.fixture
def one_node(controlplane: ControlPlane, fairgate: FairgateStack) -> Iterator[None]:
    """Capacity of 4 GPUs: gpu-a100-1 cordoned (its GPUs are not capacity)."""
    admin = client.CoreV1Api(controlplane.admin)
    cordon(admin, "gpu-a100-1")
    try:
        yield
    finally:
        cordon(admin, "gpu-a100-1", False)


def test_two_tenants_indexed_jobs_never_run_in_part_and_both_complete(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None, one_node: None,
) -> None:
    """Two tenants' Indexed Jobs of 3 pods x 1 GPU, on capacity (4 GPUs) for one: a
    member of a Job is never released (ungated, not finished) while another stays gated
    (the dispatcher lifts a gang's gates in one round, pod by pod: a split may be seen
    for the moment that takes, never longer); one Job runs whole and completes, then
    the other."""
    batch = client.BatchV1Api(controlplane.admin)
    core = client.CoreV1Api(controlplane.admin)
    jobs = {"team-a": "ddp-a", "team-b": "ddp-b"}
    for tenant, name in jobs.items():
        batch.create_namespaced_job(tenant_namespace(tenant), _indexed_job(name, 3, 1))
    try:
        def state() -> dict[str, tuple[list[str], list[str]]]:
            return {t: _split(core, tenant_namespace(t), f"job-name={n}")
                    for t, n in jobs.items()}

        split_since: dict[str, float] = {}

        def never_in_part() -> dict[str, tuple[list[str], list[str]]]:
            for tenant, name in jobs.items():
                pods = core.list_namespaced_pod(tenant_namespace(tenant),
                                                label_selector=f"job-name={name}").items
                gated = [p.metadata.name for p in pods if is_gated(p)]
                released = [p.metadata.name for p in pods if not is_gated(p)
                            and p.status.phase in ("Pending", "Running")]
                if not (gated and released):
                    split_since.pop(tenant, None)
                    continue
                since = split_since.setdefault(tenant, time.monotonic())
                assert time.monotonic() - since < SPLIT_SECONDS, (tenant, gated, released)
            return state()

        first = wait_for(lambda: next((t for t, (r, _) in never_in_part().items()
                                       if len(r) == 3), None), 90, "one whole Job to run")
        other = next(t for t in jobs if t != first)
        deadline = time.monotonic() + 10  # the other stays whole-gated meanwhile
        while time.monotonic() < deadline:
            assert len(never_in_part()[other][1]) == 3
            time.sleep(0.5)
        gated = state()[other][1]
        why = fairgate.run_cli("why", f"{tenant_namespace(other)}/{gated[0]}", "--json",
                               "--redis-url", fairgate.redis_url)
        assert yaml.safe_load(why.stdout)["verdict"] == "queued"
        for pod in state()[first][0]:
            kubelet.finish(tenant_namespace(first), pod)
        wait_for(lambda: len(never_in_part()[other][0]) == 3, 90, "the other Job to run whole")
        for pod in state()[other][0]:
            kubelet.finish(tenant_namespace(other), pod)
        for tenant, name in jobs.items():
            wait_for(lambda t=tenant, n=name: (batch.read_namespaced_job_status(
                n, tenant_namespace(t)).status.succeeded or 0) == 3, 60, f"{name} to complete")
    finally:
        for tenant, name in jobs.items():
            batch.delete_namespaced_job(name, tenant_namespace(tenant),
                                        propagation_policy="Foreground")


def test_kueue_pods_created_10_s_apart_none_runs_before_the_last(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    ns = tenant_namespace("team-a")
    core = pods_api(controlplane, "team-a")
    names = [f"sweep-{i}" for i in range(3)]
    for i, name in enumerate(names):
        pod = pod_manifest(name, {"nvidia.com/gpu": 1},
                           labels={"kueue.x-k8s.io/pod-group-name": "sweep"},
                           annotations={"kueue.x-k8s.io/pod-group-total-count": "3"})
        created = core.create_namespaced_pod(ns, pod)
        assert created.metadata.labels["fairgate.io/pod-group"].startswith("kueue.sweep.")
        if i < len(names) - 1:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                running, gated = _split(core, ns, "kueue.x-k8s.io/pod-group-name=sweep")
                assert not running and len(gated) == i + 1
                time.sleep(0.5)
    wait_for(lambda: _split(core, ns, "kueue.x-k8s.io/pod-group-name=sweep")[0] == names,
             60, "the whole group to run")


@pytest.fixture
def jobset_crd(controlplane: ControlPlane) -> None:
    """The JobSet CRD, served (established)."""
    serve_crd(controlplane.admin, CRDS / "jobset.x-k8s.io_jobsets.yaml")


def _jobset_pod(name: str, jobset: dict[str, Any], index: int) -> dict[str, Any]:
    """A pod of replicated job `workers` (Job index 0) as the JobSet and Job controllers
    label it (sigs.k8s.io/jobset labelAndAnnotateObject); no owner, as no Job runs here."""
    js = jobset["metadata"]
    keys = {
        "jobset.sigs.k8s.io/jobset-name": js["name"],
        "jobset.sigs.k8s.io/jobset-uid": js["uid"],
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/restart-attempt": "0",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/global-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/group-name": "default",
        "jobset.sigs.k8s.io/group-replicas": "1",
        "jobset.sigs.k8s.io/job-group-index": "0",
        "batch.kubernetes.io/job-completion-index": str(index),
    }
    return pod_manifest(name, {"nvidia.com/gpu": 1}, labels=keys, annotations=keys)


def test_jobset_pods_are_sized_from_the_real_jobset(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None, jobset_crd: None,
) -> None:
    ns = tenant_namespace("team-a")
    custom = client.CustomObjectsApi(controlplane.admin)
    core = pods_api(controlplane, "team-a")
    template = _template(1)
    body = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "pretrain"},
            "spec": {"suspend": True, "replicatedJobs": [{"name": "workers", "replicas": 1,
                     "template": {"spec": {"parallelism": 3, "completions": 3,
                                           "completionMode": "Indexed",
                                           "template": template}}}]}}
    jobset = custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns,
                                                    "jobsets", body)
    try:
        names = [f"pretrain-workers-0-{i}" for i in range(3)]
        selector = "jobset.sigs.k8s.io/jobset-name=pretrain"
        for name in names[:2]:
            core.create_namespaced_pod(ns, _jobset_pod(name, jobset, 0))
        # the watch may not have listed JobSets yet (its CRD is new): whatever the size
        # it knows, two of three never run
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert _split(core, ns, selector)[0] == []
            time.sleep(0.5)
        core.create_namespaced_pod(ns, _jobset_pod(names[2], jobset, 0))
        wait_for(lambda: _split(core, ns, selector)[0] == names, 90,
                 "the JobSet's 3 pods to run together")
        stamped = core.read_namespaced_pod(names[0], ns).metadata
        assert stamped.labels["fairgate.io/pod-group"].startswith("jobset.pretrain.")
    finally:
        custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets",
                                               "pretrain")


def test_a_workload_api_gang_whose_pod_group_comes_after_its_pods_waits_then_runs(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    """Kubernetes 1.36's Workload API: pods naming a PodGroup (scheduling.k8s.io/v1alpha2)
    in spec.schedulingGroup, created before it. They wait for its size, and `why` says
    so; once the PodGroup with a gang policy of 2 exists, they run together."""
    ns = tenant_namespace("team-b")
    custom = client.CustomObjectsApi(controlplane.admin)
    core = pods_api(controlplane, "team-b")
    names = ["ddp-0", "ddp-1"]
    for name in names:
        pod = pod_manifest(name, {"nvidia.com/gpu": 1}, labels={"app": "ddp"})
        pod["spec"]["schedulingGroup"] = {"podGroupName": "ddp"}
        core.create_namespaced_pod(ns, pod)
    wait_for(lambda: _split(core, ns, "app=ddp")[1] == names, 30, "both pods gated")
    why = fairgate.run_cli("why", f"{ns}/{names[0]}", "--json",
                           "--redis-url", fairgate.redis_url)
    assert "waiting for its size (known once PodGroup ddp (scheduling.k8s.io) exists)" in \
        yaml.safe_load(why.stdout)["summary"]
    time.sleep(3)
    assert _split(core, ns, "app=ddp")[0] == []
    group = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
             "metadata": {"name": "ddp"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}
    custom.create_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", ns, "podgroups",
                                           group)
    try:
        wait_for(lambda: _split(core, ns, "app=ddp")[0] == names, 90,
                 "the PodGroup's pods to run together")
    finally:
        custom.delete_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", ns,
                                               "podgroups", "ddp")


def test_a_failed_member_s_replacement_rejoins_its_running_gang(
    controlplane: ControlPlane, kubelet: FakeKubelet, fairgate: FairgateStack,
    tenant_pods: None,
) -> None:
    """An Indexed Job of 3 runs whole; index 1 fails and the Job controller recreates
    it: the replacement completes the gang with the two still running and runs at once,
    without waiting for a whole new gang, while the others keep running."""
    ns = tenant_namespace("team-a")
    batch = client.BatchV1Api(controlplane.admin)
    core = client.CoreV1Api(controlplane.admin)
    body = _indexed_job("elastic", 3, 1)
    body["spec"]["backoffLimit"] = 2
    batch.create_namespaced_job(ns, body)
    selector = "job-name=elastic"
    try:
        first = wait_for(lambda: r if len(r := _split(core, ns, selector)[0]) == 3 else None,
                         90, "the gang to run whole")
        index_of = {p.metadata.name: p.metadata.annotations[
            "batch.kubernetes.io/job-completion-index"]
            for p in core.list_namespaced_pod(ns, label_selector=selector).items}
        failed = next(n for n in first if index_of[n] == "1")
        kept = [n for n in first if n != failed]
        kubelet.finish(ns, failed, "Failed")

        def replacement() -> str | None:
            running, gated = _split(core, ns, selector)
            assert set(kept) <= set(running), (running, gated)  # the others keep running
            return next((n for n in running if n not in first), None)

        new = wait_for(replacement, 120, "the replacement of index 1 to run")
        pod = core.read_namespaced_pod(new, ns)
        assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1"
        group = core.read_namespaced_pod(kept[0], ns).metadata.labels["fairgate.io/pod-group"]
        assert pod.metadata.labels["fairgate.io/pod-group"] == group
    finally:
        batch.delete_namespaced_job("elastic", ns, propagation_policy="Foreground")
