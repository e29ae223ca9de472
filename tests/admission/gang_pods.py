"""Pods exactly as the controllers that make them set their metadata, and the objects
that size their gangs.

- Indexed Job: the in-tree Job controller (pkg/controller/job, Kubernetes 1.36) labels
  each pod ``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name``,
  ``controller-uid``, ``job-name`` and ``batch.kubernetes.io/job-completion-index``,
  annotates it with the completion index, and makes the Job its controller owner.
- JobSet: ``labelAndAnnotateObject`` (sigs.k8s.io/jobset
  pkg/controllers/jobset_controller.go) puts the same keys as labels and annotations on
  the Job's pod template; the Job controller adds its own on top.
- LeaderWorkerSet: the leader StatefulSet's template carries ``name`` and
  ``worker-index: "0"`` labels and the ``size`` annotation; LeaderWorkerSet's pod webhook
  adds ``group-index`` and ``group-key`` to the leader; worker pods get ``name``,
  ``group-index``, ``group-key`` labels and ``size``, ``leader-name`` annotations
  (pkg/controllers/pod_controller.go constructWorkerStatefulSetApplyConfiguration).
"""

from __future__ import annotations

import hashlib
from typing import Any

from admission_kit import container

JOB_UID = "5b0c8ad2-7d1e-4f0e-9a3b-1c2d3e4f5a6b"
JOBSET_UID = "9f8e7d6c-5b4a-4392-8180-7f6e5d4c3b2a"


def _pod(name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str],
         owners: list[dict[str, Any]], gpus: int = 1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [container(limits={"nvidia.com/gpu": gpus})]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": owners},
            "spec": body}


def job_owner(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def indexed_job_pod(name: str = "trainer", index: int = 0, uid: str = JOB_UID,
                    namespace: str = "team-a-train", gpus: int = 1,
                    extra_labels: dict[str, str] | None = None,
                    extra_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {
        "batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
        "controller-uid": uid, "job-name": name,
        "batch.kubernetes.io/job-completion-index": str(index),
        **(extra_labels or {}),
    }
    annotations = {"batch.kubernetes.io/job-completion-index": str(index),
                   **(extra_annotations or {})}
    return _pod(f"{name}-{index}-", namespace, labels, annotations, [job_owner(name, uid)],
                gpus, subdomain=None)


def job(name: str = "trainer", parallelism: int | None = 4, completions: int | None = 4,
        mode: str | None = "Indexed", uid: str = JOB_UID,
        namespace: str = "team-a-train") -> dict[str, Any]:
    spec: dict[str, Any] = {"parallelism": parallelism, "completions": completions}
    if mode is not None:
        spec["completionMode"] = mode
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {k: v for k, v in spec.items() if v is not None},
            "status": {"active": 1}}


def _jobset_keys(jobset: str, rjob: str, replicas: int, index: int, restarts: int,
                 namespace: str, global_index: int, global_replicas: int) -> dict[str, str]:
    job_name = f"{jobset}-{rjob}-{index}"
    return {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/jobset-uid": JOBSET_UID,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
        "jobset.sigs.k8s.io/restart-attempt": str(restarts),
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
        "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
        "jobset.sigs.k8s.io/job-index": str(index),
        "jobset.sigs.k8s.io/job-key": hashlib.sha1(
            f"{namespace}/{job_name}".encode()).hexdigest(),
        "jobset.sigs.k8s.io/job-global-index": str(global_index),
        "jobset.sigs.k8s.io/group-name": "default",
        "jobset.sigs.k8s.io/group-replicas": str(global_replicas),
        "jobset.sigs.k8s.io/job-group-index": str(global_index),
    }


def jobset_pod(jobset: str = "pretrain", rjob: str = "workers", replicas: int = 2,
               index: int = 0, completion: int = 0, restarts: int = 0,
               namespace: str = "team-a-train", job_uid: str = JOB_UID,
               gpus: int = 1) -> dict[str, Any]:
    keys = _jobset_keys(jobset, rjob, replicas, index, restarts, namespace, index, replicas)
    pod = indexed_job_pod(f"{jobset}-{rjob}-{index}", completion, job_uid, namespace, gpus,
                          extra_labels=keys, extra_annotations=keys)
    return pod


def jobset(name: str = "pretrain", restarts: int = 0, uid: str = JOBSET_UID,
           replicated: list[tuple[str, int | None, int | None, int]] | None = None,
           namespace: str = "team-a-train") -> dict[str, Any]:
    """A JobSet; ``replicated``: (name, replicas, parallelism, GPUs per pod) per
    replicated job (None: left to the default)."""
    rjobs = []
    for rname, replicas, parallelism, gpus in replicated or [("workers", 2, 4, 1)]:
        limits = {"nvidia.com/gpu": gpus} if gpus else {"cpu": "1"}
        job_spec: dict[str, Any] = {"completionMode": "Indexed", "template": {"spec": {
            "containers": [container(limits=limits)], "restartPolicy": "Never"}}}
        if parallelism is not None:
            job_spec["parallelism"] = job_spec["completions"] = parallelism
        rjob: dict[str, Any] = {"name": rname, "template": {"spec": job_spec}}
        if replicas is not None:
            rjob["replicas"] = replicas
        rjobs.append(rjob)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"replicatedJobs": rjobs}, "status": {"restarts": restarts}}


def lws_leader(name: str = "vllm", group: int = 1, size: int = 4,
               namespace: str = "team-a-serving", webhook_ran: bool = True
               ) -> dict[str, Any]:
    labels = {"leaderworkerset.sigs.k8s.io/name": name,
              "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    if webhook_ran:
        labels["leaderworkerset.sigs.k8s.io/group-index"] = str(group)
        labels["leaderworkerset.sigs.k8s.io/group-key"] = hashlib.sha1(
            f"{namespace}/{name}-{group}".encode()).hexdigest()
    pod = _pod("", namespace, labels, {"leaderworkerset.sigs.k8s.io/size": str(size)},
               [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                 "uid": "11111111-2222-4333-8444-555555555555", "controller": True}])
    del pod["metadata"]["generateName"]
    pod["metadata"]["name"] = f"{name}-{group}"
    return pod


def lws_worker(name: str = "vllm", group: int = 1, worker: int = 1, size: int = 4,
               namespace: str = "team-a-serving") -> dict[str, Any]:
    leader = f"{name}-{group}"
    labels = {"leaderworkerset.sigs.k8s.io/name": name,
              "leaderworkerset.sigs.k8s.io/group-index": str(group),
              "leaderworkerset.sigs.k8s.io/group-key": hashlib.sha1(
                  f"{namespace}/{leader}".encode()).hexdigest(),
              "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}
    annotations = {"leaderworkerset.sigs.k8s.io/size": str(size),
                   "leaderworkerset.sigs.k8s.io/leader-name": leader}
    pod = _pod("", namespace, labels, annotations,
               [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": leader,
                 "uid": "66666666-7777-4888-8999-000000000000", "controller": True}])
    del pod["metadata"]["generateName"]
    pod["metadata"]["name"] = f"{leader}-{worker}"
    return pod


def kueue_pod(group: str = "sweep", count: str | None = "3",
              namespace: str = "team-a-train") -> dict[str, Any]:
    annotations = {} if count is None else {"kueue.x-k8s.io/pod-group-total-count": count}
    return _pod(f"{group}-", namespace, {"kueue.x-k8s.io/pod-group-name": group,
                                         "kueue.x-k8s.io/queue-name": "user-queue"},
                annotations, [])


def workload_pod(group: str = "ddp-0", namespace: str = "team-a-train") -> dict[str, Any]:
    return _pod(f"{group}-", namespace, {}, {}, [],
                schedulingGroup={"podGroupName": group})


def pod_group(api_group: str, name: str, namespace: str = "team-a-train",
              min_member: int | None = None, gang: int | None = None) -> dict[str, Any]:
    """A PodGroup of ``api_group``: ``minMember`` (coscheduling, Volcano) or a Workload
    API gang policy of ``gang`` (None: the basic policy)."""
    if api_group == "scheduling.k8s.io":
        policy: dict[str, Any] = {"gang": {"minCount": gang}} if gang else {"basic": {}}
        spec: dict[str, Any] = {"podGroupTemplateRef": {"workload": {
            "workloadName": "ddp", "podGroupTemplateName": "workers"}},
            "schedulingPolicy": policy}
        version = "v1alpha2"
    else:
        spec = {"minMember": min_member}
        version = "v1alpha1" if api_group == "scheduling.x-k8s.io" else "v1beta1"
    return {"apiVersion": f"{api_group}/{version}", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": spec}
