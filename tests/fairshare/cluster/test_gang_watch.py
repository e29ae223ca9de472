"""GangWatch: the size objects as watched (lists and events fed as the watch loop
feeds them), what it keeps of them, and the sizes it hands the queue."""

from __future__ import annotations

import sys
from pathlib import Path

from kubernetes import client

from admission.gangs import gang_key
from fairshare.cluster.gangs import GangWatch, trimmed

sys.path.insert(0, str(Path(__file__).parents[2] / "admission"))
from gang_pods import JOB_UID, job, jobset, pod_group


def watch() -> GangWatch:
    return GangWatch(client.ApiClient(client.Configuration()))


def test_lists_and_events_make_the_snapshot_and_sizes() -> None:
    w = watch()
    assert not w.ready
    w.on_list("jobs", [job()])
    w.on_list("jobsets", [])
    for group in ("scheduling.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"):
        w.on_list(group, [])
    assert w.ready
    key = gang_key("job", "trainer", JOB_UID)
    assert w.sizes() == {f"team-a-train/{key}": 4}
    w.on_event("scheduling.x-k8s.io", "ADDED",
               pod_group("scheduling.x-k8s.io", "pg", min_member=3))
    assert ("scheduling.x-k8s.io", "team-a-train", "pg") in w.objects().pod_groups
    assert len(w.sizes()) == 2
    w.on_event("jobs", "MODIFIED", job(parallelism=8, completions=8))
    assert w.sizes()[f"team-a-train/{key}"] == 8
    w.on_event("jobs", "DELETED", job())
    assert JOB_UID not in w.objects().jobs and len(w.sizes()) == 1


def test_a_change_to_what_sizes_no_gang_changes_nothing() -> None:
    w = watch()
    w.on_list("jobs", [job()])
    before = w.objects()
    status_only = job()
    status_only["status"] = {"active": 4, "ready": 3}
    status_only["metadata"]["resourceVersion"] = "99"
    w.on_event("jobs", "MODIFIED", status_only)
    assert w.objects() is before
    w.on_event("jobsets", "DELETED", jobset())  # never seen: nothing to delete
    assert w.objects() is before


def test_only_the_fields_gangs_are_sized_from_are_kept() -> None:
    big = job()
    big["spec"]["template"] = {"spec": {"containers": [{"name": "x" * 1000}]}}
    kept = trimmed("jobs", big)
    assert kept == {"metadata": {"name": "trainer", "namespace": "team-a-train",
                                 "uid": JOB_UID},
                    "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed"}}
    assert trimmed("jobsets", jobset(restarts=2))["status"] == {"restarts": 2}


def test_a_relist_replaces_what_was_known() -> None:
    w = watch()
    w.on_list("jobsets", [jobset()])
    assert w.objects().jobsets
    w.on_list("jobsets", [])  # e.g. the CRD was removed: the kind is absent
    assert not w.objects().jobsets and w.sizes() == {}
