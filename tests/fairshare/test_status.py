"""`fairgate status` and `fairgate why` against a real Redis holding a queue built by the
real scripts, and an audit stream written by the real AuditLog."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
import redis
import tablefit

from audit import ADMIT, DENY, DISPATCH, QUEUE, RELEASE, AuditLog
from fairshare.cluster.cluster import CapacityReport, ForeignHold, GpuPod, NodeExclusion, PodRef
from fairshare.cluster.reconcile import reconcile
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.status import (
    capacity_lines,
    status_command,
    status_report,
    status_tables,
    why_command,
    why_report,
)
from tests.fairshare.simkit import make_config, make_rig
from tests.fairshare.tickets import pod_uid

NOW = 1_700_000_000.0
RAW_CONFIG = {
    "team-a": {"weight": 2, "nominal": {"gpu": 4, "mig-1g.5gb": 7},
               "borrowLimit": {"gpuEquivalents": 2}, "inferenceReserve": {"gpuEquivalents": 1}},
    "team-b": {"weight": 1, "nominal": {"gpu": 2}},
}
CONFIG = make_config(RAW_CONFIG)


def _request(ticket: str, name: str, tenant: str = "team-a", pod_class: str = "training",
             demand: dict[str, int] | None = None, at: float = NOW) -> PodRequest:
    return PodRequest(ticket=ticket, tenant=tenant, namespace=f"{tenant}-dev", name=name,
                      pod_class=pod_class,  # type: ignore[arg-type]
                      demand=demand or {"gpu": 1}, submitted_at=at)


@pytest.fixture
def queue(redis_client: redis.Redis) -> FairQueue:
    """A queue with team-a running 3 GPUs and 1 MIG slice, team-a and team-b queued."""
    q = FairQueue(redis_client)
    q.sync_config(CONFIG, {"gpu": 4, "mig-1g.5gb": 7})
    for i in range(3):
        assert q.admit(_request(f"a-run-{i}", f"run-{i}"), NOW).outcome == "reserved"
        q.confirm(f"a-run-{i}", pod_uid(f"a-run-{i}"), "team-a-dev", f"run-{i}")
    assert q.admit(_request("a-mig", "mig", pod_class="inference",
                            demand={"mig-1g.5gb": 1}), NOW).outcome == "reserved"
    assert q.admit(_request("b-run", "b-run", tenant="team-b"), NOW).outcome == "reserved"
    for i in range(2):
        admission = q.admit(_request(f"a-wait-{i}", f"wait-{i}", at=NOW + 1 + i), NOW + 1 + i)
        assert admission.outcome == "queued"
    assert q.admit(_request("b-wait", "b-wait", tenant="team-b", at=NOW + 5),
                   NOW + 5).outcome == "queued"
    # the dispatcher has seen the queued pods (their demand counts as queued from then on)
    for ticket, ns, name in (("a-wait-0", "team-a-dev", "wait-0"),
                             ("a-wait-1", "team-a-dev", "wait-1"),
                             ("b-wait", "team-b-dev", "b-wait")):
        assert q.confirm(ticket, pod_uid(ticket), ns, name) == "confirmed"
    return q


def test_status_reports_quota_usage_backlog_and_share(queue: FairQueue) -> None:
    report = status_report(queue)
    a, b = report["tenants"]["team-a"], report["tenants"]["team-b"]
    # 5 GPU-eq of capacity, water-filled per placement class: the 4 GPUs between the
    # two tenants asking for whole GPUs above their share (a: 3 used + 2 queued; b: 1 + 1,
    # cap 2 = its nominal) split 2:1; of the 7 MIG slices only team-a's one (inference)
    # is asked for, so the other 6 entitle no one.
    a_entitled = 4 * 2 / 3 + 1 / 7
    assert a == {
        "weight": 2.0, "nominal": {"gpu": 4, "mig-1g.5gb": 7}, "nominal_gpu_equivalents": 5.0,
        "borrow_limit": 2.0, "inference_reserve": 1.0, "used": 3.14, "borrowed": 0.0,
        "queued": {"inference": 0, "training": 2}, "weighted_share": round(22 / 7 / 2, 4),
        "entitlement": 2.81, "of_entitlement": round(22 / 7 / a_entitled, 4), "ticket_twins": 0,
    }
    assert b["used"] == 1.0 and b["queued"] == {"inference": 0, "training": 1}
    assert b["weighted_share"] == 1.0
    assert b["entitlement"] == 1.33 and b["of_entitlement"] == 0.75
    assert report["capacity"] == 5.0
    ratios = (22 / 7 / a_entitled, 0.75)
    assert report["jain_index"] == round(sum(ratios) ** 2 / (2 * sum(r * r for r in ratios)), 4)


def test_status_entitlement_is_capped_by_demand_and_by_quota(queue: FairQueue) -> None:
    """Entitlements are water-filled: a tenant asking less than its share gets what it
    asks, one whose quota (nominal + borrow limit) is below its share gets its quota,
    the rest goes to the others, and a tenant without demand is entitled to nothing."""
    queue.sync_config(make_config({**RAW_CONFIG, "team-c": {"weight": 5, "nominal": {"gpu": 1}}}),
                      None)
    assert queue.remove("b-wait", pod_uid("b-wait"))  # team-b: 1 GPU used, nothing queued
    report = status_report(queue)
    shares = {name: row["entitlement"] for name, row in report["tenants"].items()}
    # whole GPUs: team-b's 1 and the other 3 for team-a; MIG: team-a's one slice
    assert shares == {"team-a": 3.14, "team-b": 1.0, "team-c": 0.0}
    assert report["tenants"]["team-b"]["of_entitlement"] == 1.0
    assert report["tenants"]["team-c"]["of_entitlement"] is None

    queue.sync_config(make_config(RAW_CONFIG), {"gpu": 10, "mig-1g.5gb": 7})  # 11 GPU-eq
    for i in range(2):  # team-b asks for 3 GPUs, its nominal is 2 (no borrowing)
        at = NOW + 10 + i
        queue.admit(_request(f"b-more-{i}", f"more-{i}", tenant="team-b", at=at), at)
        queue.confirm(f"b-more-{i}", pod_uid(f"b-more-{i}"), "team-b-dev", f"more-{i}")
    report = status_report(queue)
    assert report["tenants"]["team-b"]["used"] == 2.0
    assert report["tenants"]["team-b"]["queued"]["training"] == 1
    shares = {name: row["entitlement"] for name, row in report["tenants"].items()}
    assert shares == {"team-a": 5.14, "team-b": 2.0, "team-c": 0.0}  # a: all it asks


def test_status_command_prints_json_and_a_table(queue: FairQueue, redis_url: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # rows on one line each
    out = io.StringIO()
    assert status_command(redis_url, True, out=out) == 0
    assert json.loads(out.getvalue()) == status_report(queue)
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    text = table.getvalue()
    quota_a, use_a, nominal_a = (line for line in text.splitlines()
                                 if line.startswith("│ team-a "))
    assert "5.00" in quota_a and "2.00" in quota_a  # nominal, borrow limit
    assert "3.14" in use_a and "2.81" in use_a and "112%" in use_a  # used, entitlement, ratio
    assert nominal_a.split() == ["│", "team-a", "│", "4", "│", "7", "│"]  # gpu, mig-1g.5gb
    assert "Jain's index of used / entitlement 0.963" in text.replace("\n", " ")


@pytest.mark.parametrize("width", [80, 120])
def test_status_tables_fit_the_terminal(queue: FairQueue, redis_url: str, width: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``fairgate status`` in a terminal of 80 columns cuts no header or name and prints
    no line wider; at 120 no header or row wraps either."""
    monkeypatch.setenv("COLUMNS", str(width))
    queue.sync_config(make_config({**RAW_CONFIG, "research-long": {
        "weight": 1, "nominal": {"gpu": 2, "mig-1g.5gb": 14, "mig-3g.40gb": 2}}}), None)
    out = io.StringIO()
    assert status_command(redis_url, False, out=out) == 0
    text = out.getvalue()
    headers = [str(c.header) for t in status_tables(status_report(queue)) for c in t.columns]
    assert tablefit.problems(text, width, headers, unwrapped=width >= 120) == []
    names = [line[1:].split("│")[0].strip() for line in text.splitlines()
             if line.startswith("│ ")]
    assert sorted(names) == ["research-long"] * 3 + ["team-a"] * 3 + ["team-b"] * 3, names


def test_status_jain_is_na_when_the_only_backlogged_tenant_holds_nothing(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """team-b's gang member waits for its second member: team-b is entitled to its 2
    GPUs and holds none, and no other tenant is entitled to anything. Jain's index of
    one ratio says nothing (it read 1.000): status says n/a."""
    q = FairQueue(redis_client)
    q.sync_config(CONFIG, {"gpu": 4})
    request = replace(_request("b-0", "b-0", tenant="team-b", demand={"gpu": 2}),
                      group="job", group_size=2)
    assert q.admit(request, NOW).outcome == "queued"
    assert q.confirm("b-0", pod_uid("b-0"), "team-b-dev", "b-0") == "confirmed"
    report = status_report(q)
    b = report["tenants"]["team-b"]
    assert (b["used"], b["entitlement"], b["of_entitlement"]) == (0.0, 2.0, 0.0)
    assert report["jain_index"] is None
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    assert "Jain's index of used / entitlement n/a" in table.getvalue().replace("\n", " ")


def test_status_shows_what_the_dispatcher_left_out_of_capacity(
    queue: FairQueue, redis_url: str
) -> None:
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    assert "capacity notes: none yet" in table.getvalue()
    report = CapacityReport(
        {"gpu": 4, "mig-1g.5gb": 7},
        excluded=(NodeExclusion("gpu-3", "cordoned", {"gpu": 8}),
                  NodeExclusion("gpu-5", "NotReady since 2023-11-14T22:10:00Z (more than "
                                "40s)", {"gpu": 4})),
        held=(ForeignHold("gpu-0", {"gpu": 2}, ("kube-system/burn-in",)),),
    )
    queue.write_capacity_notes({**report.to_json(), "at": NOW, "override": False})
    out = io.StringIO()
    assert status_command(redis_url, True, out=out) == 0
    notes = json.loads(out.getvalue())["capacity_notes"]
    assert CapacityReport.from_json(notes) == report and notes["at"] == NOW
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    lines = table.getvalue().splitlines()
    start = lines.index("capacity from the nodes: gpu=4,mig-1g.5gb=7 (at 2023-11-14T22:13:20Z)")
    assert lines[start + 1:start + 4] == [
        "  node gpu-3 cordoned (gpu=8 not counted)",
        "  node gpu-5 NotReady since 2023-11-14T22:10:00Z (more than 40s) (gpu=4 not counted)",
        "  node gpu-0: gpu=2 held by 1 pod fairgate does not manage (kube-system/burn-in)",
    ]
    queue.write_capacity_notes({**report.to_json(), "at": NOW, "override": True})
    assert capacity_lines(queue.capacity_notes())[0] == (
        "capacity set by platform.capacity; the nodes offer gpu=4,mig-1g.5gb=7 "
        "(at 2023-11-14T22:13:20Z)")
    assert capacity_lines({"total": "gpu=4"}) == [
        "capacity notes: unreadable (written by another fairgate version?)"]


def test_status_command_reports_an_unreachable_redis() -> None:
    err = io.StringIO()
    assert status_command("redis://127.0.0.1:1/0", True, out=io.StringIO(), err=err) == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in err.getvalue()


def _audit(client: redis.Redis) -> AuditLog:
    return AuditLog(client, out=io.StringIO())


def test_why_explains_a_queued_pod(queue: FairQueue, redis_client: redis.Redis) -> None:
    log = _audit(redis_client)
    log.record(QUEUE, uid="a-wait-1", tenant="team-a", namespace="team-a-dev",
               name="wait-1", pod_class="training", demand="gpu=1",
               reason="waiting for 1 x gpu of cluster capacity")
    records = [e.record for e in log.entries() if e.record]
    report = why_report(PodRef("team-a-dev", "wait-1"), queue, records, NOW + 10)
    assert report.verdict == "queued"
    assert report.position == 2 and report.queue_length == 2
    assert report.summary.startswith("queued: position 2 of 2 for team-a/training, waiting for ")
    assert report.waiting_for is not None and report.ticket == "a-wait-1"


def test_why_finds_a_queued_pod_by_name_without_audit_records(queue: FairQueue) -> None:
    report = why_report(PodRef("team-a-dev", "wait-1"), queue, [], NOW + 10)
    assert report.verdict == "queued" and report.ticket == "a-wait-1"
    assert report.summary.startswith("queued: position 2 of 2 for team-a/training")


def test_why_explains_a_running_pod_and_when_it_was_released(
    queue: FairQueue, redis_client: redis.Redis, redis_url: str
) -> None:
    log = _audit(redis_client)
    log.record(ADMIT, uid="a-run-1", tenant="team-a", namespace="team-a-dev", name="run-1",
               pod_class="training", demand="gpu=1", reason="reserved as training")
    records = [e.record for e in log.entries() if e.record]
    report = why_report(PodRef("team-a-dev", "run-1"), queue, records, NOW + 10)
    assert report.verdict == "running"
    assert report.released_at == NOW and report.waited_seconds == 0.0
    assert "released as training at 2023-11-14T22:13:20Z after 0.0s in queue" in report.summary
    out = io.StringIO()
    assert why_command(redis_url, "team-a-dev/run-1", out=out) == 0
    assert out.getvalue().startswith("team-a-dev/run-1: released as training at ")
    assert "reserved as training" in out.getvalue()  # the audit history


def test_why_follows_a_generated_name_through_the_ticket(
    queue: FairQueue, redis_client: redis.Redis
) -> None:
    log = _audit(redis_client)
    log.record(QUEUE, uid="a-wait-0", tenant="team-a", namespace="team-a-dev",
               name="trainer-*", pod_class="training", demand="gpu=1")
    log.record(DISPATCH, uid="a-wait-0", tenant="team-a", namespace="team-a-dev",
               name="trainer-x7k2p", pod_class="training", demand="gpu=1",
               reason="released as training after 12.4s")
    records = [e.record for e in log.entries() if e.record]
    report = why_report(PodRef("team-a-dev", "trainer-x7k2p"), queue, records, NOW + 10)
    assert report.ticket == "a-wait-0"
    assert len(report.history) == 2  # the webhook's record joined through the ticket


def test_why_explains_a_denied_pod_an_ended_pod_and_an_unknown_pod(
    queue: FairQueue, redis_client: redis.Redis, redis_url: str
) -> None:
    log = _audit(redis_client)
    log.record(DENY, uid="x1", tenant="team-a", namespace="team-a-dev", name="greedy",
               reason="exceeds the tenant's ceiling")
    log.record(ADMIT, uid="a-run-2", tenant="team-a", namespace="team-a-dev", name="run-2")
    assert queue.release("a-run-2", pod_uid("a-run-2"))
    log.record(RELEASE, uid="a-run-2", tenant="team-a", namespace="team-a-dev", name="run-2",
               reason="pod Succeeded")
    records = [e.record for e in log.entries() if e.record]

    denied = why_report(PodRef("team-a-dev", "greedy"), queue, records, NOW)
    assert denied.verdict == "denied"
    assert denied.summary == "denied at admission: exceeds the tenant's ceiling"

    ended = why_report(PodRef("team-a-dev", "run-2"), queue, records, NOW)
    assert ended.verdict == "ended" and "(pod Succeeded)" in ended.summary

    unknown = why_report(PodRef("team-a-dev", "cpu-only"), queue, records, NOW)
    assert unknown.verdict == "unknown"
    assert "not fairgate's business" in unknown.summary

    out = io.StringIO()
    assert why_command(redis_url, "team-a-dev/greedy", json_out=True, out=out) == 0
    assert json.loads(out.getvalue())["verdict"] == "denied"


def test_why_refuses_a_malformed_reference(redis_url: str) -> None:
    err = io.StringIO()
    assert why_command(redis_url, "just-a-name", out=io.StringIO(), err=err) == 2
    assert "expected <namespace>/<pod>" in err.getvalue()


def test_status_shows_capacity_held_and_for_whom(redis_client: redis.Redis,
                                                 redis_url: str) -> None:
    """A 4-GPU pod of team-b (share 0, below its weighted share) is first in order while
    team-a's 1-GPU pods fill the cluster: the GPUs freed are held for it, and status
    names the pod, its tenant and how much is held so far (JSON and table)."""
    q = FairQueue(redis_client)
    q.sync_config(make_config({"team-a": {"weight": 1, "nominal": {"gpu": 4}},
                               "team-b": {"weight": 1, "nominal": {"gpu": 4}}}), {"gpu": 4})
    for i in range(4):
        assert q.admit(_request(f"a{i}", f"a{i}", at=NOW), NOW).outcome == "reserved"
        q.confirm(f"a{i}", pod_uid(f"a{i}"), "team-a-dev", f"a{i}")
    big = _request("b-big", "big", tenant="team-b", demand={"gpu": 4}, at=NOW + 1)
    assert q.admit(big, NOW + 1).outcome == "queued"
    assert q.admit(_request("a-more", "more", at=NOW + 2), NOW + 2).outcome == "queued"
    # owed the next capacity, none free yet
    assert [(h["tenant"], h["held"]) for h in status_report(q, NOW + 2)["held"]] == [
        ("team-b", {"gpu": 0})]
    # a0 and a1 ran 700 s, so team-a's next pod is expected to run past when a2 and a3
    # are expected to end (600 s, the default): it may not take the held GPUs (backfill)
    assert q.release("a0", pod_uid("a0"), NOW + 700)
    assert q.release("a1", pod_uid("a1"), NOW + 700)
    assert q.dispatch(NOW + 700) == []
    report = status_report(q, NOW + 700)
    assert report["held"] == [{
        "tenant": "team-b", "band": "training", "pod": "team-b-dev/big", "group": None,
        "gang": None, "demand": {"gpu": 4}, "held": {"gpu": 2}, "held_gpu_equivalents": 2.0,
        "demand_gpu_equivalents": 4.0,
    }]
    out = io.StringIO()
    assert status_command(redis_url, True, out=out) == 0
    assert json.loads(out.getvalue())["held"] == report["held"]
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    assert "team-b: 2 of 4 gpu held for team-b-dev/big (training)" in table.getvalue()
    # once team-b runs, team-a (nothing running, below its share) is owed the next GPU
    assert q.release("a2", pod_uid("a2"), NOW + 701)
    assert q.release("a3", pod_uid("a3"), NOW + 701)
    assert [r.ticket for r in q.dispatch(NOW + 701)] == ["b-big"]
    assert [(h["pod"], h["held"]) for h in status_report(q, NOW + 701)["held"]] == [
        ("team-a-dev/more", {"gpu": 0})]


def test_why_explains_a_controllers_gated_pod_by_the_name_kubectl_shows(
    redis_url: str
) -> None:
    """A ReplicaSet's pod is admitted as ``serve-7d9f-*`` (the API server names it after
    admission) and queued. Once the dispatcher has seen the pod, ``fairgate why`` answers
    for its real name with the webhook's record joined, and still does after release."""
    audit = AuditLog(redis.Redis.from_url(redis_url), out=io.StringIO())
    rig = make_rig(redis_url, {"team-b": {"weight": 1, "nominal": {"gpu": 1}}}, {"gpu": 1},
                   audit=audit)
    first = rig.pod("first", tenant="team-b", duration=10)
    gated = rig.pod("serve-7d9f-*", tenant="team-b", duration=10)
    assert not first.gated and gated.gated
    name = gated.ref.name
    assert name.startswith("serve-7d9f-") and name != "serve-7d9f-*"
    # the webhook's record names the pod as it was admitted
    audit.record(QUEUE, uid=gated.ticket, tenant="team-b", namespace="team-b-ns",
                 name="serve-7d9f-*", pod_class="training", demand="gpu=1",
                 reason="waiting for 1 x gpu of cluster capacity")
    ref = f"team-b-ns/{name}"
    out = io.StringIO()
    assert why_command(redis_url, ref, json_out=True, out=out) == 1  # nothing known: exit 1
    assert json.loads(out.getvalue())["verdict"] == "unknown"  # the dispatcher has not seen it

    rig.settle()  # the dispatcher sees the pod: its ticket takes the pod's name
    out = io.StringIO()
    assert why_command(redis_url, ref, json_out=True, out=out) == 0
    report = json.loads(out.getvalue())
    assert report["pod"] == ref and report["verdict"] == "queued"
    assert report["ticket"] == gated.ticket and report["tenant"] == "team-b"
    assert report["summary"].startswith("queued: position 1 of 1 for team-b/training")
    assert [line.split(" ", 1)[1] for line in report["history"]] == [
        "queue: waiting for 1 x gpu of cluster capacity"]  # the webhook's record, joined

    rig.at(1_010.0)  # first ends: the controller's pod is released under its own name
    admitted = [e for e in rig.cluster.events if e.reason == "Admitted"]
    assert [e.pod for e in admitted] == [gated.ref]
    out = io.StringIO()
    assert why_command(redis_url, ref, out=out) == 0
    text = out.getvalue()
    assert text.startswith(f"{ref}: released as training at ")
    assert "queue: waiting for 1 x gpu" in text and "dispatch: released as training" in text


def test_status_shows_capacity_and_usage_per_placement_class(
        redis_client: redis.Redis, redis_url: str) -> None:
    """Capacity per class as the dispatcher stores it, usage per class as released."""
    q = FairQueue(redis_client)
    q.sync_config(CONFIG, {"gpu": 8, "mig-1g.5gb#single": 56, "mig-1g.5gb": 7})
    assert q.admit(_request("g", "g", demand={"gpu": 2}), NOW).outcome == "reserved"
    assert q.admit(_request("s", "s", pod_class="inference",
                            demand={"mig-1g.5gb#single": 3}), NOW).outcome == "reserved"
    rows = status_report(q, NOW)["capacity_by_class"]
    assert rows == [
        {"key": "gpu", "class": "whole GPUs", "resource": "gpu", "capacity": 8, "used": 2},
        {"key": "mig-1g.5gb", "class": "MIG mixed", "resource": "mig-1g.5gb",
         "capacity": 7, "used": 0},
        {"key": "mig-1g.5gb#single", "class": "MIG single 1g.5gb",
         "resource": "mig-1g.5gb", "capacity": 56, "used": 3},
    ]
    out = io.StringIO()
    assert status_command(redis_url, False, out=out) == 0
    assert "MIG single 1g.5gb: mig-1g.5gb 3 used of 56" in out.getvalue()


def test_status_counts_the_ticket_twins_of_each_tenant(queue: FairQueue, redis_url: str) -> None:
    """A pod running with a copied ticket is counted as a pod of its own (a twin entry)
    and ``fairgate status`` says how many each tenant has, in JSON and in text."""
    def pod(uid: str, name: str) -> GpuPod:
        return GpuPod(ref=PodRef("team-b-dev", name), uid=uid, ticket="b-run", tenant="team-b",
                      pod_class="training", band="training", demand={"gpu": 1}, group=None,
                      group_size=1, phase="Running", gated=False, node="n1", created=NOW)

    assert status_report(queue)["tenants"]["team-b"]["ticket_twins"] == 0
    reconcile(queue, [pod(pod_uid("b-run"), "b-run"), pod("uid-copy", "copy")],
              bound={"b-run": pod_uid("b-run")})
    assert queue.twin_counts() == {"team-b": 1}
    out = io.StringIO()
    assert status_command(redis_url, True, out=out) == 0
    tenants = json.loads(out.getvalue())["tenants"]
    assert {name: row["ticket_twins"] for name, row in tenants.items()} == {
        "team-a": 0, "team-b": 1}
    assert tenants["team-b"]["used"] == 2.0  # the owner and its twin
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    line = next(t for t in table.getvalue().splitlines() if t.startswith("ticket twins"))
    assert line.endswith(": team-a 0, team-b 1")


def test_status_shows_the_inference_reserves_kept_free(queue: FairQueue, redis_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Lent (the default), no reserve is kept; kept, team-a's reserve of 1 GPU less the
    MIG slice its inference uses is, in the report and its text."""
    assert status_report(queue)["reserves_kept_free"] == 0
    fair_share = CONFIG.platform.fair_share.model_copy(update={"lend_inference_reserve": False})
    queue.sync_config(replace(CONFIG, platform=CONFIG.platform.model_copy(
        update={"fair_share": fair_share})), None)
    assert status_report(queue)["reserves_kept_free"] == 0.86  # 6 of 7 slices
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    assert status_command(redis_url, False, out=out) == 0
    assert ("inference reserves kept free: 0.86 GPU-eq unused by inference, which no "
            "borrowed pod may take") in out.getvalue()
