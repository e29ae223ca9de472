"""pod_gang and the plan's gang: every source, on pods as their controllers make them,
and the rules that try to break it (own label wins, unknown sizes, replacements)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from admission_kit import CONFIG, gpu_pod
from gang_pods import (
    JOB_UID,
    JOBSET_UID,
    indexed_job_pod,
    job,
    jobset,
    jobset_pod,
    kueue_pod,
    lws_leader,
    lws_worker,
    pod_group,
    workload_pod,
)
from hypothesis import given
from hypothesis import strategies as st

from admission.gangs import (
    MAX_GANG_SIZE,
    Gang,
    GangError,
    GangObjects,
    declared_run,
    declared_sizes,
    gang_key,
    jobset_size,
    pod_gang,
)
from admission.mutation import mutate_pod
from admission.plan import Denied, PodPlan, plan_create
from admission.pods import PodView
from tenants.models import POD_GROUP_LABEL, POD_GROUP_SIZE_ANNOTATION

UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
NS = "team-a-train"
LABEL_VALUE_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def objects(*items: dict[str, Any]) -> GangObjects:
    jobs, jobsets, groups = {}, {}, {}
    for item in items:
        meta = item["metadata"]
        if item["kind"] == "Job":
            jobs[meta["uid"]] = item
        elif item["kind"] == "JobSet":
            jobsets[(meta["namespace"], meta["name"])] = item
        else:
            groups[(item["apiVersion"].split("/")[0], meta["namespace"], meta["name"])] = item
    return GangObjects(jobs=jobs, jobsets=jobsets, pod_groups=groups)


def gang(pod: dict[str, Any], *items: dict[str, Any], namespace: str = NS) -> Gang | None:
    return pod_gang(PodView.parse(pod), namespace, objects(*items))


def planned(pod: dict[str, Any], *items: dict[str, Any], namespace: str = NS) -> PodPlan:
    result = plan_create(pod, namespace, UID, CONFIG, gangs=objects(*items))
    assert isinstance(result, PodPlan), result
    return result


# -- each source -------------------------------------------------------------------


def test_indexed_job_is_one_gang_of_parallelism_keyed_by_its_uid() -> None:
    found = gang(indexed_job_pod(index=2), job(parallelism=4, completions=4))
    assert found == Gang(gang_key("job", "trainer", JOB_UID), 4, "Indexed Job trainer")
    # every index of the Job is the same gang
    assert gang(indexed_job_pod(index=0), job()) == found
    # another Job of the same name (recreated: another uid) is another gang
    other = "00000000-1111-4222-8333-444444444444"
    assert gang(indexed_job_pod(uid=other), job(uid=other)).key != found.key  # type: ignore[union-attr]


@pytest.mark.parametrize("spec", [
    {"parallelism": 2, "completions": 4},  # pods come and go: no gang
    {"parallelism": 4, "completions": None},  # work queue
    {"parallelism": 4, "completions": 4, "mode": "NonIndexed"},
    {"parallelism": 1, "completions": 1},  # a gang of one is a single pod
])
def test_a_job_that_is_no_gang(spec: dict[str, Any]) -> None:
    assert gang(indexed_job_pod(), job(**spec)) is None


def test_a_pod_without_completion_index_or_job_owner_is_no_job_gang() -> None:
    pod = indexed_job_pod()
    del pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    del pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
    assert gang(pod, job()) is None
    pod = indexed_job_pod()
    pod["metadata"]["ownerReferences"][0]["controller"] = False
    assert gang(pod, job()) is None
    pod = indexed_job_pod()
    pod["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert gang(pod, job()) is None


def test_an_unseen_job_leaves_the_size_unknown_and_says_for_what() -> None:
    found = gang(indexed_job_pod())
    assert found is not None and found.size is None
    assert found.key == gang_key("job", "trainer", JOB_UID)
    assert "Job trainer is seen" in found.describe()


def test_jobset_sums_replicas_times_parallelism_and_beats_the_indexed_job() -> None:
    js = jobset(replicated=[("workers", 2, 4, 1), ("ps", None, None, 1)])
    found = gang(jobset_pod(), js, job(parallelism=4, completions=4))
    assert found is not None
    assert found.size == 2 * 4 + 1 * 1
    assert found.source == "JobSet pretrain"
    assert found == gang(jobset_pod(rjob="ps", replicas=1), js)


def test_jobset_counts_only_replicated_jobs_whose_pods_ask_for_gpus() -> None:
    js = jobset(replicated=[("workers", 2, 4, 1), ("driver", 1, 1, 0)])
    plan = planned(jobset_pod(), js)
    assert plan.group is not None and plan.group.size == 8
    assert jobset_size(js) == 9  # without the GPU test every pod counts


def test_jobset_restart_is_a_new_gang_and_an_old_uid_is_not_seen() -> None:
    first = gang(jobset_pod(restarts=0), jobset(restarts=0))
    second = gang(jobset_pod(restarts=1), jobset(restarts=1))
    assert first and second and first.key != second.key and second.size == 8
    recreated = jobset(uid="aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee")
    assert gang(jobset_pod(), recreated).size is None  # type: ignore[union-attr]
    assert JOBSET_UID not in str(recreated)


def test_lws_each_group_is_a_gang_of_the_set_size() -> None:
    leader, worker = gang(lws_leader(group=1)), gang(lws_worker(group=1, worker=3))
    assert leader == worker and leader is not None and leader.size == 4
    assert gang(lws_worker(group=2)) != leader
    # the leader before LeaderWorkerSet's webhook labelled it: its ordinal
    assert gang(lws_leader(group=1, webhook_ran=False)) == leader


def test_lws_without_a_usable_size_or_group_is_refused() -> None:
    pod = lws_worker()
    pod["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] = "four"
    with pytest.raises(GangError, match=r"leaderworkerset\.sigs\.k8s\.io/size"):
        gang(pod)
    pod = lws_worker()
    del pod["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
    with pytest.raises(GangError, match="group-index"):
        gang(pod)


def test_kueue_plain_pod_group_needs_no_lookup() -> None:
    found = gang(kueue_pod("sweep", "3"))
    assert found == Gang(gang_key("kueue", "sweep", f"{NS}/sweep"), 3, "Kueue pod group sweep")
    with pytest.raises(GangError, match="pod-group-total-count"):
        gang(kueue_pod("sweep", None))
    for bad in ("0", "-1", "3.0", str(MAX_GANG_SIZE + 1), "\u0661"):
        with pytest.raises(GangError):
            gang(kueue_pod("sweep", bad))


@pytest.mark.parametrize("api_group,label", [
    ("scheduling.x-k8s.io", True), ("scheduling.volcano.sh", False)])
def test_coscheduling_and_volcano_pod_groups_by_min_member(api_group: str, label: bool) -> None:
    pod = gpu_pod(labels={"scheduling.x-k8s.io/pod-group": "pg"} if label else {},
                  annotations={} if label else {"scheduling.k8s.io/group-name": "pg"})
    assert gang(pod).size is None  # type: ignore[union-attr]
    found = gang(pod, pod_group(api_group, "pg", min_member=5))
    assert found is not None and found.size == 5 and api_group in found.source
    # a PodGroup of the other tool, of the same name, is not this one
    other = "scheduling.volcano.sh" if label else "scheduling.x-k8s.io"
    assert gang(pod, pod_group(other, "pg", min_member=5)).size is None  # type: ignore[union-attr]


def test_workload_api_pod_group_gang_min_count() -> None:
    assert gang(workload_pod("ddp-0")).size is None  # type: ignore[union-attr]
    found = gang(workload_pod("ddp-0"), pod_group("scheduling.k8s.io", "ddp-0", gang=6))
    assert found is not None and found.size == 6
    # the basic policy schedules pods one by one: no gang
    assert gang(workload_pod("ddp-0"), pod_group("scheduling.k8s.io", "ddp-0")) is None


def test_a_pod_group_in_another_namespace_is_not_seen() -> None:
    assert gang(workload_pod("g"), pod_group("scheduling.k8s.io", "g", "other", gang=3)
                ).size is None  # type: ignore[union-attr]


def test_plain_pods_have_no_gang() -> None:
    assert gang(gpu_pod()) is None
    assert gang(gpu_pod(owner="ReplicaSet")) is None


# -- keys --------------------------------------------------------------------------


@given(kind=st.sampled_from(["job", "jobset", "lws", "kueue", "podgroup"]),
       name=st.text(min_size=1, max_size=253), identity=st.text(max_size=100))
def test_keys_are_label_values(kind: str, name: str, identity: str) -> None:
    key = gang_key(kind, name, identity)
    assert 1 <= len(key) <= 63 and set(key) <= LABEL_VALUE_CHARS
    assert key[0].isalnum() and key[-1].isalnum()


@given(names=st.lists(st.text(min_size=1, max_size=80), min_size=2, max_size=2, unique=True))
def test_keys_of_different_gangs_differ(names: list[str]) -> None:
    assert gang_key("job", "same", names[0]) != gang_key("job", "same", names[1])


# -- in the plan ---------------------------------------------------------------------


def test_fairgate_label_wins_over_every_source() -> None:
    for pod in (indexed_job_pod(), jobset_pod(), lws_worker(namespace=NS), kueue_pod(),
                workload_pod()):
        pod["metadata"]["labels"][POD_GROUP_LABEL] = "mine"
        pod["metadata"]["annotations"][POD_GROUP_SIZE_ANNOTATION] = "2"
        plan = planned(pod, job(), jobset())
        assert plan.group is not None and (plan.group.name, plan.group.size) == ("mine", 2)


def test_fairgate_label_wins_even_over_an_unusable_declaration() -> None:
    pod = kueue_pod(count=None)
    pod["metadata"]["labels"][POD_GROUP_LABEL] = "mine"
    pod["metadata"]["annotations"][POD_GROUP_SIZE_ANNOTATION] = "2"
    assert planned(pod).group.name == "mine"  # type: ignore[union-attr]


def test_an_unusable_declaration_is_refused_naming_the_fix() -> None:
    result = plan_create(kueue_pod(count=None), NS, UID, CONFIG)
    assert isinstance(result, Denied) and result.code == "invalid-pod-group"
    assert "kueue.x-k8s.io/pod-group-total-count" in result.message


def test_the_mutation_stamps_the_gang_and_a_reinvocation_reads_it_back() -> None:
    pod = indexed_job_pod()
    plan = planned(pod, job())
    stamped = mutate_pod(pod, plan, "training", True, CONFIG.platform.priority_classes)
    meta = stamped["metadata"]
    assert meta["labels"][POD_GROUP_LABEL] == plan.group.name  # type: ignore[union-attr]
    assert meta["annotations"][POD_GROUP_SIZE_ANNOTATION] == "4"
    again = planned(stamped)  # the watch lost the Job since: the stamp still says 4
    assert again.reused_ticket and again.group == plan.group


def test_an_unknown_size_is_stamped_without_size_and_read_back_unknown() -> None:
    pod = indexed_job_pod()
    plan = planned(pod)
    assert plan.group is not None and plan.group.size is None
    stamped = mutate_pod(pod, plan, "training", True, CONFIG.platform.priority_classes)
    assert POD_GROUP_SIZE_ANNOTATION not in stamped["metadata"]["annotations"]
    assert planned(stamped).group == plan.group
    assert planned(stamped, job()).group.size == 4  # type: ignore[union-attr]


def test_a_label_without_size_that_is_not_the_declared_gang_is_refused() -> None:
    pod = indexed_job_pod()
    pod["metadata"]["labels"][POD_GROUP_LABEL] = "job.trainer.0123456789"  # forged
    result = plan_create(pod, NS, UID, CONFIG, gangs=objects(job()))
    assert isinstance(result, Denied) and POD_GROUP_SIZE_ANNOTATION in result.message


def test_a_replacement_pod_rejoins_its_gang() -> None:
    """The Job controller recreates a failed index from the same template: the same
    owner uid, so the same gang key (the queue completes it with the members running)."""
    first = planned(indexed_job_pod(index=1), job())
    replacement = copy.deepcopy(indexed_job_pod(index=1))
    replacement["metadata"]["generateName"] = "trainer-1-"
    assert planned(replacement, job()).group == first.group


def test_parallelism_change_sizes_later_pods() -> None:
    """Documented: the size is the Job as seen when each pod is admitted."""
    assert planned(indexed_job_pod(), job(parallelism=6, completions=6)).group.size == 6  # type: ignore[union-attr]
    assert planned(indexed_job_pod(), job(parallelism=3, completions=6)).group is None


# -- declared sizes (what the queue learns for gangs queued before) ------------------


def test_declared_sizes_match_what_pods_find() -> None:
    items = (job(), jobset(), pod_group("scheduling.k8s.io", "ddp-0", gang=6),
             pod_group("scheduling.x-k8s.io", "pg", min_member=5),
             pod_group("scheduling.volcano.sh", "vg", min_member=3),
             pod_group("scheduling.k8s.io", "basic"))
    sizes = declared_sizes(objects(*items))
    pods = [indexed_job_pod(), jobset_pod(), workload_pod("ddp-0"),
            gpu_pod(labels={"scheduling.x-k8s.io/pod-group": "pg"}),
            gpu_pod(annotations={"scheduling.k8s.io/group-name": "vg"})]
    expected = {}
    for pod in pods:
        found = gang(pod, *items)
        assert found is not None and found.size is not None
        expected[(NS, found.key)] = found.size
    # the Job of the JobSet pod is the same uid as job(): the JobSet wins for its pods,
    # the Job's own entry stays (an Indexed Job gang of its own pods' key)
    assert {k: v for k, v in sizes.items() if k in expected} == expected
    # the basic PodGroup declares its pods are no gang: size 1
    basic = pod_gang(PodView.parse(workload_pod("basic")), NS, objects(items[0]))
    assert basic is not None and basic.size is None  # before the PodGroup is seen
    assert {k: v for k, v in sizes.items() if k not in expected} == {(NS, basic.key): 1}


def test_pods_queued_before_their_job_showed_it_is_no_gang_are_not_held() -> None:
    """An Indexed Job whose parallelism is not its completions, unseen when its pods
    came: they wait as a gang of unknown size; once the Job is seen it declares size 1,
    so the queue releases them rather than wait for members that never come."""
    waiting = gang(indexed_job_pod())
    assert waiting is not None and waiting.size is None
    sizes = declared_sizes(objects(job(parallelism=2, completions=4)))
    assert sizes == {(NS, waiting.key): 1}
    assert gang(indexed_job_pod(), job(parallelism=2, completions=4)) is None


KEYS = ["jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/jobset-uid",
        "jobset.sigs.k8s.io/restart-attempt", "leaderworkerset.sigs.k8s.io/name",
        "leaderworkerset.sigs.k8s.io/group-index", "leaderworkerset.sigs.k8s.io/worker-index",
        "leaderworkerset.sigs.k8s.io/size", "kueue.x-k8s.io/pod-group-name",
        "kueue.x-k8s.io/pod-group-total-count", "scheduling.x-k8s.io/pod-group",
        "scheduling.k8s.io/group-name", "batch.kubernetes.io/job-completion-index"]
VALUES = st.one_of(st.sampled_from(["", "0", "1", "2", "3", "10000", "10001", "x", "pg",
                                    JOB_UID]), st.text(max_size=12))


@given(labels=st.dictionaries(st.sampled_from(KEYS), VALUES),
       annotations=st.dictionaries(st.sampled_from(KEYS), VALUES),
       owned=st.booleans(), group=st.one_of(st.none(), VALUES),
       seen=st.lists(st.sampled_from(["job", "jobset", "pg", "vg", "wl"]), unique=True))
def test_any_declaration_gives_a_usable_gang_or_says_why(
    labels: dict[str, str], annotations: dict[str, str], owned: bool, group: str | None,
    seen: list[str],
) -> None:
    pod = gpu_pod(labels=labels, annotations=annotations)
    if owned:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job",
                                               "name": "trainer", "uid": JOB_UID,
                                               "controller": True}]
    if group is not None:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    known = {"job": job(), "jobset": jobset(name=labels.get(KEYS[0], "pretrain")),
             "pg": pod_group("scheduling.x-k8s.io", labels.get(KEYS[9], "pg"), min_member=3),
             "vg": pod_group("scheduling.volcano.sh", annotations.get(KEYS[10], "vg"),
                             min_member=2),
             "wl": pod_group("scheduling.k8s.io", group or "wl", gang=4)}
    try:
        found = gang(pod, *(known[k] for k in seen))
    except GangError as error:
        assert str(error)
        return
    if found is None:
        return
    assert 1 <= len(found.key) <= 63 and set(found.key) <= LABEL_VALUE_CHARS
    assert found.size is None or 2 <= found.size <= MAX_GANG_SIZE
    assert (found.size is None) == bool(found.awaiting)


# -- declared run time (activeDeadlineSeconds of the pod or of its Job) -----------------


def _with_deadline(obj: dict[str, Any], seconds: int) -> dict[str, Any]:
    return {**obj, "spec": {**obj["spec"], "activeDeadlineSeconds": seconds}}


@pytest.mark.parametrize(
    ("pod_deadline", "job_deadline", "job_seen", "expected"),
    [
        (None, None, True, None),  # declares nothing
        (900, None, True, 900),  # the pod's own
        (None, 3600, True, 3600),  # its Job's, read from the watch cache
        (900, 3600, True, 900),  # the shorter of both
        (7200, 3600, True, 3600),
        (None, 3600, False, None),  # the Job not seen yet: the pod's own field alone
        (900, 3600, False, 900),
    ],
)
def test_the_declared_run_time_is_the_shorter_of_the_pod_and_its_job(
        pod_deadline: int | None, job_deadline: int | None, job_seen: bool,
        expected: int | None) -> None:
    pod = indexed_job_pod()
    if pod_deadline is not None:
        pod = _with_deadline(pod, pod_deadline)
    owner = job()
    if job_deadline is not None:
        owner = _with_deadline(owner, job_deadline)
    assert planned(pod, *([owner] if job_seen else [])).run_seconds == expected


def test_a_deadline_of_another_owner_kind_is_not_read() -> None:
    """Only a batch/v1 Job controller's deadline bounds the pod: another kind's object
    with the same uid is not one."""
    pod = indexed_job_pod()
    pod["metadata"]["ownerReferences"][0]["kind"] = "CronJob"
    assert declared_run(PodView.parse(pod), objects(_with_deadline(job(), 60))) is None


@pytest.mark.parametrize("bad", [0, -5, 1.5, "60", True])
def test_an_unusable_pod_deadline_is_refused_naming_the_field(bad: object) -> None:
    pod = indexed_job_pod()
    pod["spec"]["activeDeadlineSeconds"] = bad
    result = plan_create(pod, NS, UID, CONFIG)
    assert isinstance(result, Denied), result
    assert "spec.activeDeadlineSeconds must be a whole number of seconds >= 1" in result.message
