"""Which gang a pod belongs to, as the ecosystem's tools declare gangs (pure).

Contract of :func:`pod_gang` (the pod is a :class:`~admission.pods.PodView`; ``objects``
are the cluster's size objects as plain JSON, see :class:`GangObjects`):

- None when the pod declares no gang of 2 or more, or only one fairgate does not read.
- otherwise a :class:`Gang`: ``key`` (the group name the queue and the
  ``fairgate.io/pod-group`` label use: a label value, unique per gang instance),
  ``size`` (None while the object that gives it has not been seen: the pod then waits
  behind the gate for it, see ``awaiting``) and ``source`` (e.g. ``Indexed Job trainer``,
  for messages).
- :class:`GangError` (its message says what is wrong) when a declaration is unusable: a
  size that is not a whole number from 2 to :data:`MAX_GANG_SIZE`, a Kueue group
  without its total count.

The first source that applies wins (fairgate's own ``fairgate.io/pod-group`` label is
read before all of them, in :mod:`admission.plan`):

1. ``spec.schedulingGroup.podGroupName`` (Kubernetes 1.36, KEP-4671): PodGroup
   ``scheduling.k8s.io/v1alpha2`` of that name; a gang of its
   ``spec.schedulingPolicy.gang.minCount`` (a ``basic`` policy is no gang).
2. JobSet (labels ``jobset.sigs.k8s.io/jobset-name``, ``jobset-uid``, ``restart-attempt``):
   one gang per JobSet run, of the sum over ``spec.replicatedJobs`` of ``replicas`` x
   the Job template's ``parallelism`` (defaults 1), counting only replicated jobs whose
   pods ask for a GPU (``asks_for_gpu``): the others never reach fairgate's queue.
3. LeaderWorkerSet (label ``leaderworkerset.sigs.k8s.io/name``, annotation
   ``leaderworkerset.sigs.k8s.io/size``): each group (label ``group-index``, or the leader
   pod's ordinal before LeaderWorkerSet's webhook labelled it) is a gang of ``size``.
4. Kueue plain pods: label ``kueue.x-k8s.io/pod-group-name``, annotation
   ``kueue.x-k8s.io/pod-group-total-count``.
5. Coscheduling plugin: label ``scheduling.x-k8s.io/pod-group``, PodGroup
   ``scheduling.x-k8s.io/v1alpha1`` ``spec.minMember``.
6. Volcano: annotation ``scheduling.k8s.io/group-name``, PodGroup
   ``scheduling.volcano.sh/v1beta1`` ``spec.minMember``.
7. Indexed Job whose ``parallelism`` equals its ``completions`` (the pod's controller is
   a ``batch/v1`` Job and it carries ``batch.kubernetes.io/job-completion-index``): one
   gang of ``parallelism`` pods per Job (by uid). The size is the Job as seen when each
   pod is admitted: a Job whose parallelism no longer equals its completions is no gang
   for the pods created after that (see docs/gangs.md).

A size object that exists but names another instance (a JobSet recreated under the same
name, with another uid) counts as not seen.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from admission.pods import OwnerRef, PodView

MAX_GANG_SIZE = 10_000
"""The largest gang fairgate admits (the same bound as ``fairgate.io/pod-group-size``)."""

# Kubernetes Workload API (v1.36): the pod's field and its PodGroup
K8S_SCHEDULING = "scheduling.k8s.io"
# JobSet (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go, pkg/constants)
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
# LeaderWorkerSet (sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go)
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
# Kueue plain pods
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# coscheduling plugin (scheduler-plugins) and Volcano
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
# Indexed Jobs
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

Json = Mapping[str, Any]
AsksForGpu = Callable[[Json], bool]
"""Whether a pod (here a JobSet's pod template, as ``{"metadata", "spec"}``) asks for GPUs."""


class GangError(ValueError):
    """A gang declaration fairgate cannot use; the message says which and how to fix it."""


@dataclass(frozen=True)
class GangObjects:
    """The size objects seen in the cluster, as plain JSON.

    ``jobs``: Job uid -> Job; ``jobsets``: (namespace, name) -> JobSet;
    ``pod_groups``: (API group, namespace, name) -> PodGroup, for the API groups
    ``scheduling.k8s.io``, ``scheduling.x-k8s.io`` and ``scheduling.volcano.sh``.
    """

    jobs: Mapping[str, Json] = field(default_factory=dict)
    jobsets: Mapping[tuple[str, str], Json] = field(default_factory=dict)
    pod_groups: Mapping[tuple[str, str, str], Json] = field(default_factory=dict)


NO_GANG_OBJECTS = GangObjects()


@dataclass(frozen=True)
class Gang:
    """A pod's gang: queue key, size (None: not known yet) and where it comes from."""

    key: str
    size: int | None
    source: str
    awaiting: str = ""  # what the size waits for, when it is None

    def describe(self) -> str:
        """E.g. ``gang of Indexed Job trainer (4 pods)``."""
        size = f"{self.size} pods" if self.size is not None else f"size once {self.awaiting}"
        return f"gang of {self.source} ({size})"


def gang_key(kind: str, name: str, identity: str) -> str:
    """The queue key of a gang instance: ``<kind>.<name>.<hash of identity>``, cut to a
    valid label value (at most 63 characters, starting and ending alphanumeric)."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", f"{kind}.{name}")[:50].rstrip("._-")
    return f"{readable}.{digest}"


def pod_gang(pod: PodView, namespace: str, objects: GangObjects = NO_GANG_OBJECTS,
             asks_for_gpu: AsksForGpu | None = None) -> Gang | None:
    """The gang ``pod`` (in ``namespace``) declares, by the sources of the module doc."""
    found = _declared(pod, namespace, objects, asks_for_gpu)
    return found if found is not None and found.size != 1 else None


def _declared(pod: PodView, namespace: str, objects: GangObjects,
              asks_for_gpu: AsksForGpu | None) -> Gang | None:
    """The first source's answer; a gang of size 1 is a source that declares its pods
    are no gang (an Indexed Job whose parallelism is not its completions, a basic
    PodGroup)."""
    for source in (_workload, _jobset, _lws, _kueue, _coscheduling, _volcano, _indexed_job):
        found = source(pod, namespace, objects, asks_for_gpu)
        if not isinstance(found, _Next):
            return found
    return None


class _Next:
    """The source does not apply: try the next one."""


_NEXT = _Next()
_Found = Gang | None | _Next


def _size(text: object, what: str) -> int:
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise GangError(f"{what} must be a whole number, got {text!r}")
    valid = isinstance(text, int) or (text.isascii() and text.isdigit() and len(text) <= 6)
    if not valid or not 1 <= int(text) <= MAX_GANG_SIZE:
        raise GangError(f"{what}={text!r} must be a whole number from 1 to {MAX_GANG_SIZE}")
    return int(text)


def _count(value: object) -> int:
    """A replica or parallelism count of a controller's spec (absent: 1)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def _workload(pod: PodView, namespace: str, objects: GangObjects,
              asks_for_gpu: AsksForGpu | None) -> _Found:
    name = pod.pod_group_name
    if not name:
        return _NEXT
    key = gang_key("podgroup", name, f"{K8S_SCHEDULING}/{namespace}/{name}")
    source = f"PodGroup {name}"
    found = objects.pod_groups.get((K8S_SCHEDULING, namespace, name))
    if found is None:
        return Gang(key, None, source, f"PodGroup {name} ({K8S_SCHEDULING}) exists")
    policy = _path(found, "spec", "schedulingPolicy")
    gang = policy.get("gang")
    if not isinstance(gang, Mapping):
        return Gang(key, 1, source)  # the basic policy: pods scheduled one by one
    return Gang(key, _size(gang.get("minCount"), f"PodGroup {name} minCount"), source)


def _jobset(pod: PodView, namespace: str, objects: GangObjects,
            asks_for_gpu: AsksForGpu | None) -> _Found:
    name, uid = pod.labels.get(JOBSET_NAME_LABEL), pod.labels.get(JOBSET_UID_LABEL)
    if not name or not uid:
        return _NEXT
    attempt = pod.labels.get(JOBSET_RESTART_LABEL, "0")
    key = gang_key("jobset", name, f"{uid}/{attempt}")
    source = f"JobSet {name}"
    found = objects.jobsets.get((namespace, name))
    if found is None or _path(found, "metadata").get("uid") != uid:
        return Gang(key, None, source, f"JobSet {name} is seen")
    return Gang(key, _size(jobset_size(found, asks_for_gpu) or 1, f"{source} size"), source)


def jobset_size(jobset: Json, asks_for_gpu: AsksForGpu | None = None) -> int:
    """The pods of one JobSet run that ask for GPUs: per replicated job ``replicas`` x
    its Job template's ``parallelism`` (each absent: 1)."""
    total = 0
    for rjob in _path(jobset, "spec").get("replicatedJobs") or []:
        if not isinstance(rjob, Mapping):
            continue
        job_spec = _path(rjob, "template", "spec")
        template = _path(job_spec, "template")
        if asks_for_gpu is not None and not asks_for_gpu(template):
            continue
        total += _count(rjob.get("replicas")) * _count(job_spec.get("parallelism"))
    return total


_ORDINAL = re.compile(r"-(\d+)$")


def _lws(pod: PodView, namespace: str, objects: GangObjects,
         asks_for_gpu: AsksForGpu | None) -> _Found:
    name = pod.labels.get(LWS_NAME_LABEL)
    if not name:
        return _NEXT
    size = _size(pod.annotations.get(LWS_SIZE_ANNOTATION), f"annotation {LWS_SIZE_ANNOTATION}")
    index = pod.labels.get(LWS_GROUP_INDEX_LABEL)
    if index is None and pod.labels.get(LWS_WORKER_INDEX_LABEL) == "0":
        # a leader before LeaderWorkerSet's webhook set its group index: its ordinal
        match = _ORDINAL.search(pod.name)
        index = match.group(1) if match else None
    if index is None:
        raise GangError(
            f"pod of LeaderWorkerSet {name} has no label {LWS_GROUP_INDEX_LABEL}: fairgate "
            "cannot tell its group (is LeaderWorkerSet's webhook running?)"
        )
    return Gang(gang_key("lws", f"{name}-{index}", f"{namespace}/{name}/{index}"), size,
                f"LeaderWorkerSet {name} group {index}")


def _kueue(pod: PodView, namespace: str, objects: GangObjects,
           asks_for_gpu: AsksForGpu | None) -> _Found:
    name = pod.labels.get(KUEUE_GROUP_LABEL)
    if not name:
        return _NEXT
    count = pod.annotations.get(KUEUE_COUNT_ANNOTATION)
    if count is None:
        raise GangError(
            f"label {KUEUE_GROUP_LABEL}={name!r} needs annotation {KUEUE_COUNT_ANNOTATION}: "
            '"<n>", the number of pods in the group'
        )
    size = _size(count, f"annotation {KUEUE_COUNT_ANNOTATION}")
    return Gang(gang_key("kueue", name, f"{namespace}/{name}"), size, f"Kueue pod group {name}")


def _min_member(api_group: str, name: str, namespace: str, objects: GangObjects) -> Gang:
    kind = "coscheduling" if api_group == COSCHEDULING_GROUP else "volcano"
    key = gang_key(kind, name, f"{api_group}/{namespace}/{name}")
    source = f"PodGroup {name} ({api_group})"
    found = objects.pod_groups.get((api_group, namespace, name))
    if found is None:
        return Gang(key, None, source, f"PodGroup {name} ({api_group}) exists")
    return Gang(key, _size(_path(found, "spec").get("minMember"), f"{source} minMember"),
                source)


def _coscheduling(pod: PodView, namespace: str, objects: GangObjects,
                  asks_for_gpu: AsksForGpu | None) -> _Found:
    name = pod.labels.get(COSCHEDULING_LABEL)
    if not name:
        return _NEXT
    return _min_member(COSCHEDULING_GROUP, name, namespace, objects)


def _volcano(pod: PodView, namespace: str, objects: GangObjects,
             asks_for_gpu: AsksForGpu | None) -> _Found:
    name = pod.annotations.get(VOLCANO_ANNOTATION)
    if not name:
        return _NEXT
    return _min_member(VOLCANO_GROUP, name, namespace, objects)


def _indexed_job(pod: PodView, namespace: str, objects: GangObjects,
                 asks_for_gpu: AsksForGpu | None) -> _Found:
    if COMPLETION_INDEX not in pod.annotations and COMPLETION_INDEX not in pod.labels:
        return _NEXT
    owner = pod.controller
    if owner is None or (owner.api_version, owner.kind) != ("batch/v1", "Job") or not owner.uid:
        return _NEXT
    uid, name = owner.uid, owner.name
    key = gang_key("job", name, uid)
    source = f"Indexed Job {name}"
    job = objects.jobs.get(uid)
    if job is None:
        return Gang(key, None, source, f"Job {name} is seen")
    spec = _path(job, "spec")
    parallelism, completions = spec.get("parallelism"), spec.get("completions")
    if spec.get("completionMode") != "Indexed" or parallelism != completions:
        return Gang(key, 1, source)  # pods come and go: no gang
    return Gang(key, _size(_count(parallelism), f"Job {name} parallelism"), source)


def declared_run(pod: PodView, objects: GangObjects = NO_GANG_OBJECTS) -> int | None:
    """The pod's declared run time in seconds, an upper bound on how long it runs: the
    shorter of its own ``spec.activeDeadlineSeconds`` and that of the ``batch/v1`` Job
    that controls it, as seen in ``objects`` (a Job not seen yet, or without a deadline,
    adds nothing); None when neither declares one. A Job's deadline counts from the
    Job's start, so it bounds each of its pods' run times too."""
    runs = [pod.active_deadline_seconds]
    owner = pod.controller
    if owner is not None and (owner.api_version, owner.kind) == ("batch/v1", "Job"):
        job_run = _path(objects.jobs.get(owner.uid) or {}, "spec").get("activeDeadlineSeconds")
        if isinstance(job_run, int) and not isinstance(job_run, bool) and job_run >= 1:
            runs.append(job_run)
    return min((r for r in runs if r is not None), default=None)


def _path(obj: Json, *keys: str) -> Json:
    """``obj[k1][k2]...`` where each is an object; anything else reads as empty."""
    for key in keys:
        value = obj.get(key)
        obj = value if isinstance(value, Mapping) else {}
    return obj


def declared_sizes(objects: GangObjects,
                   asks_for_gpu: AsksForGpu | None = None) -> dict[tuple[str, str], int]:
    """(namespace, gang key) -> size of every gang the size objects define, as
    :func:`pod_gang` finds it for their pods (a gang whose size object came after its
    pods learns its size from here); 1 for an object that declares its pods are no gang
    (its pods queued before it was seen are then released as one entry, never held for
    members that will not come). A JobSet defines the gang of its current run."""
    probes: list[tuple[str, PodView]] = []
    for job in objects.jobs.values():
        meta = _path(job, "metadata")
        owner = OwnerRef("batch/v1", "Job", str(meta.get("name") or ""),
                         str(meta.get("uid") or ""), controller=True)
        probes.append((str(meta.get("namespace", "")), PodView(
            annotations={COMPLETION_INDEX: "0"}, owners=(owner,))))
    for (namespace, name), jobset in objects.jobsets.items():
        probes.append((namespace, PodView(labels={
            JOBSET_NAME_LABEL: name,
            JOBSET_UID_LABEL: str(_path(jobset, "metadata").get("uid")),
            JOBSET_RESTART_LABEL: str(_path(jobset, "status").get("restarts") or 0)})))
    for (api_group, namespace, name) in objects.pod_groups:
        if api_group == K8S_SCHEDULING:
            probe = PodView(pod_group_name=name)
        elif api_group == COSCHEDULING_GROUP:
            probe = PodView(labels={COSCHEDULING_LABEL: name})
        else:
            probe = PodView(annotations={VOLCANO_ANNOTATION: name})
        probes.append((namespace, probe))
    sizes: dict[tuple[str, str], int] = {}
    for namespace, pod in probes:
        try:
            gang = _declared(pod, namespace, objects, asks_for_gpu)
        except GangError:
            continue
        if gang is not None and gang.size is not None:
            sizes[(namespace, gang.key)] = gang.size
    return sizes
