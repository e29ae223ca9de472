"""A ResourceClaim two pods share is billed once: the dispatcher (real queue in a real
redis-server, simulated cluster) audits what each pod is charged, `fairgate report`
bills the verified stream, and `fairgate why` explains the pod riding on the claim."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import redis

from audit import CHARGE, DISPATCH, RELEASE, START, AuditLog, AuditRecord
from cost.billing import bill
from cost.budget import AuditSpend
from cost.report import report_command
from fairshare.cluster.cluster import PodRef
from fairshare.sim.simcluster import PodSpec
from fairshare.status import why_report
from tenants.models import PricingSpec
from tests.fairshare.simkit import Rig, make_rig

TEAM_A = {"team-a": {"weight": 1, "nominal": {"gpu": 4}}}
CLAIM = {"claim-uid-x": {"gpu": 3}}
T0 = 1_000.0  # the rig's clock at start (Unix seconds)


def _sharing(redis_url: str, first: float) -> tuple[Rig, redis.Redis]:
    """A rig whose dispatcher audits into Redis, with two pods whose only GPUs are the
    shared 3-GPU claim, settled: ``first`` (created first, it pays) runs ``first``
    seconds, ``second`` (riding on it) an hour."""
    client = redis.Redis.from_url(redis_url)
    rig = make_rig(redis_url, TEAM_A, {"gpu": 8}, audit=AuditLog(client, out=io.StringIO()))
    for name, duration in (("first", first), ("second", 3600.0)):
        rig.cluster.create_pod(PodSpec("team-a-ns", name, "team-a", "training", {"gpu": 3},
                                       duration, shared=CLAIM,
                                       claim_names={"claim-uid-x": "weights"}))
    rig.settle()
    return rig, client


def _report(client: redis.Redis, until: float) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code = report_command(client, out, since="1970-01-01T00:00:00Z",
                          until=datetime.fromtimestamp(until, UTC).isoformat(),
                          output="json", now=datetime.fromtimestamp(until + 60, UTC),
                          err=err)
    assert code == 0, err.getvalue()
    data: dict[str, object] = json.loads(out.getvalue())
    return data


def _gpu_hours(data: dict[str, object]) -> float:
    totals = data["totals"]
    assert isinstance(totals, dict)
    return float(totals["gpu_hours"])


def test_two_pods_sharing_a_3_gpu_claim_for_an_hour_bill_3_gpu_hours(redis_url: str) -> None:
    rig, client = _sharing(redis_url, 3600)
    rig.at(T0 + 3600)
    rig.at(T0 + 3700)  # both ended and released
    data = _report(client, T0 + 3700)
    assert abs(_gpu_hours(data) - 3.0) < 0.01, data["totals"]


def test_the_payer_ending_half_way_still_bills_3_gpu_hours_in_all(redis_url: str) -> None:
    rig, client = _sharing(redis_url, 1800)
    rig.at(T0 + 1800)  # the payer ends; the charge moves to the rider
    records = [e.record for e in AuditLog(client).entries() if e.record is not None]
    moved = [r for r in records if r.decision == CHARGE and r.name == "second"]
    assert len(moved) == 1 and moved[0].diff is not None, [r.decision for r in records]
    assert moved[0].diff["charge"]["after"] == "gpu=3"
    rig.at(T0 + 3600)
    rig.at(T0 + 3700)
    data = _report(client, T0 + 3700)
    assert abs(_gpu_hours(data) - 3.0) < 0.01, data["totals"]
    half = _report(client, T0 + 1800)  # the first half: the payer's hour-half alone
    assert abs(_gpu_hours(half) - 1.5) < 0.01, half["totals"]
    # the budget's month-to-date spend bills the same records the same way
    spent, _ = AuditSpend(AuditLog(client)).spent(
        datetime.fromtimestamp(0, UTC), datetime.fromtimestamp(T0 + 3700, UTC),
        PricingSpec.model_validate({"gpuHour": {"default": 2.0}}))
    assert abs(spent["team-a"] - 6.0) < 0.01, spent


def test_why_explains_a_rider_by_the_claim_and_the_pod_that_pays(redis_url: str) -> None:
    rig, client = _sharing(redis_url, 3600)
    records = [e.record for e in AuditLog(client).entries() if e.record is not None]
    report = why_report(PodRef("team-a-ns", "second"), rig.queue, records, rig.clock())
    assert report.verdict == "running", report
    assert "claim weights (uid claim-uid-x) that team-a-ns/first pays for" in report.summary
    assert "charged nothing" in report.summary, report.summary
    assert report.riding == {"claim-uid-x": {"claim": "weights", "payer": "team-a-ns/first"}}
    assert report.charged == ""

    rig.at(T0 + 3600)  # both end: the rider is no longer running
    records = [e.record for e in AuditLog(client).entries() if e.record is not None]
    ended = why_report(PodRef("team-a-ns", "second"), rig.queue, records, rig.clock())
    assert ended.verdict == "ended", ended


def _record(decision: str, name: str, at: str, **extra: object) -> AuditRecord:
    return AuditRecord(time=at, uid=f"ticket-{name}", user="fairgate-dispatcher",
                       operation="DISPATCH", tenant="team-a", namespace="team-a-ns",
                       name=name, pod_class="training", demand="gpu=3", decision=decision,
                       reason=str(extra.pop("reason", "")), **extra)  # type: ignore[arg-type]


def test_records_written_before_charges_were_audited_bill_each_pod_in_full() -> None:
    # an older trail: no charge in any record, so each pod is billed its demand
    records = [
        _record(DISPATCH, "first", "2026-03-01T00:00:00.000Z", reason="released as training"),
        _record(DISPATCH, "second", "2026-03-01T00:00:00.000Z", reason="released: its GPUs"),
        _record(START, "first", "2026-03-01T00:00:00.000Z"),
        _record(START, "second", "2026-03-01T00:00:00.000Z"),
        _record(RELEASE, "first", "2026-03-01T01:00:00.000Z", reason="pod Succeeded"),
        _record(RELEASE, "second", "2026-03-01T01:00:00.000Z", reason="pod Succeeded"),
    ]
    billed = bill(records, datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC))
    assert abs(billed.totals().gpu_hours - 6.0) < 1e-9


def test_a_pod_with_gpus_of_its_own_besides_the_claim_is_billed_those(
        redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rig = make_rig(redis_url, {"team-a": {"weight": 1, "nominal": {"gpu": 8}}}, {"gpu": 8},
                   audit=AuditLog(client, out=io.StringIO()))
    for name, demand in (("claim-only", {"gpu": 3}), ("claim-and-one", {"gpu": 4})):
        rig.cluster.create_pod(PodSpec("team-a-ns", name, "team-a", "training", demand,
                                       3600, shared=CLAIM))
    rig.settle()
    rig.at(T0 + 3600)
    rig.at(T0 + 3700)
    records = [e.record for e in AuditLog(client).entries() if e.record is not None]
    charged = [r.diff["charge"]["after"] for r in records
               if r.decision == CHARGE and r.name == "claim-and-one" and r.diff]
    assert charged == ["gpu=1"], [(r.decision, r.name, r.diff) for r in records]
    data = _report(client, T0 + 3700)
    assert abs(_gpu_hours(data) - 4.0) < 0.01, data["totals"]  # the claim's 3, its own 1


def test_a_charge_move_is_billed_from_its_time_clipped_to_the_window() -> None:
    # the payer ends at 00:30 and the rider pays from then; billed [00:15, 00:45): the
    # claim held for 30 minutes, 3 GPUs, once
    records = [
        _record(DISPATCH, "payer", "2026-03-01T00:00:00.000Z", reason="released as training"),
        _record(DISPATCH, "rider", "2026-03-01T00:00:00.000Z", reason="released: its GPUs",
                diff={"charge": {"before": "gpu=3", "after": "", "riding": {}}}),
        _record(START, "payer", "2026-03-01T00:00:00.000Z"),
        _record(START, "rider", "2026-03-01T00:00:00.000Z"),
        _record(CHARGE, "rider", "2026-03-01T00:30:00.000Z",
                diff={"charge": {"before": "", "after": "gpu=3", "riding": {}}}),
        _record(RELEASE, "payer", "2026-03-01T00:30:00.000Z", reason="pod Succeeded"),
        _record(RELEASE, "rider", "2026-03-01T01:00:00.000Z", reason="pod Succeeded"),
    ]
    billed = bill(records, datetime(2026, 3, 1, 0, 15, tzinfo=UTC),
                  datetime(2026, 3, 1, 0, 45, tzinfo=UTC))
    assert abs(billed.totals().gpu_hours - 1.5) < 1e-9
