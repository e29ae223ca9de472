"""Autoscaled pools: the dispatcher against the real queue (real redis-server) and a
simulated cluster whose pool grows when the test, acting as the autoscaler, says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from fairshare.autoscale import (
    BACKOFF_BASE,
    BACKOFF_MAX,
    backoff,
    free_slots,
    grown_capacity,
    request_name,
    verdict,
)
from fairshare.cluster.cluster import GpuPod
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.status import capacity_lines, why_report
from tenants.models import AutoscalingSpec, FairgateConfig
from tests.fairshare.simkit import Rig, make_rig

TEAMS = {"team-a": {"weight": 1, "nominal": {"gpu": 8}},
         "team-b": {"weight": 1, "nominal": {"gpu": 8}}}


def _spec(mode: str = "pending", most: int = 6, in_flight: int = 1) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate(
        {"mode": mode, "maxCapacity": {"gpu": most}, "inFlight": in_flight})


def _autoscaled(rig: Rig, spec: AutoscalingSpec, provisioner: Any = None) -> Rig:
    """``rig`` with ``autoscaling: spec`` in its platform config (a new dispatcher)."""
    config = FairgateConfig(
        platform=rig.config.platform.model_copy(update={"autoscaling": spec}),
        quotas=rig.config.quotas, namespaces=rig.config.namespaces)
    dispatcher = Dispatcher(rig.queue, rig.cluster, lambda: config, clock=rig.clock,
                            settings=DispatcherSettings(), provisioner=provisioner)
    dispatcher.sync(force=True)
    return replace(rig, dispatcher=dispatcher, config=config)


def _states(rig: Rig, *pods: GpuPod) -> list[str]:
    """Each pod as the cluster has it: gated, pending (released, not placed) or running."""
    now = {p.uid: p for p in rig.cluster.list_pods()}
    return ["gated" if now[p.uid].gated else "running" if now[p.uid].node else "pending"
            for p in pods]


# -- the pure parts ---------------------------------------------------------------------

@pytest.mark.parametrize(("existing", "most", "grown"), [
    ({"gpu": 2}, {"gpu": 6}, {"gpu": 6}),
    ({"gpu": 8}, {"gpu": 6}, {"gpu": 8}),  # never below what exists
    ({"gpu": 2, "mig-1g.5gb": 7}, {"gpu": 4}, {"gpu": 4, "mig-1g.5gb": 7}),
    ({}, {"gpu@pool-a": 4}, {"gpu@pool-a": 4}),  # a pool scaled to zero
])
def test_grown_capacity_is_the_maximum_where_it_is_more(
    existing: dict[str, int], most: dict[str, int], grown: dict[str, int]
) -> None:
    spec = AutoscalingSpec.model_validate({"mode": "pending", "maxCapacity": most})
    assert grown_capacity(existing, spec) == grown


@pytest.mark.parametrize(("mode", "in_flight", "waiting", "slots"), [
    ("pending", 4, 0, 4), ("pending", 4, 3, 1), ("pending", 4, 4, 0), ("pending", 2, 5, 0),
    ("provisioningRequest", 1, 0, 1), ("off", 4, 0, 0),
])
def test_free_slots(mode: str, in_flight: int, waiting: int, slots: int) -> None:
    spec = AutoscalingSpec.model_validate(
        {"mode": mode, "maxCapacity": {"gpu": 1} if mode != "off" else {},
         "inFlight": in_flight})
    assert free_slots(spec, waiting) == slots


def _cond(kind: str, status: str = "True", reason: str = "R", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(("conditions", "said"), [
    ([], "waiting"),
    ([_cond("Accepted")], "waiting"),
    ([_cond("Accepted"), _cond("Provisioned", "False")], "waiting"),
    ([_cond("Accepted"), _cond("Provisioned")], "provisioned"),
    ([_cond("Failed")], "failed"),
    ([_cond("Provisioned"), _cond("BookingExpired")], "failed"),  # expired after it
    ([_cond("Provisioned"), _cond("CapacityRevoked")], "failed"),
    ([_cond("Provisioned"), _cond("Failed", "False")], "provisioned"),
])
def test_verdict_of_a_requests_conditions(conditions: list[dict[str, str]], said: str) -> None:
    assert verdict(conditions)[0] == said


def test_verdict_says_why() -> None:
    assert verdict([_cond("Failed", reason="OutOfStock", message="no a100 in zone")]) == (
        "failed", "Failed: OutOfStock (no a100 in zone)")


def test_backoff_doubles_up_to_its_maximum() -> None:
    assert [backoff(n) for n in (1, 2, 3)] == [BACKOFF_BASE, 2 * BACKOFF_BASE, 4 * BACKOFF_BASE]
    assert backoff(50) == BACKOFF_MAX


def test_request_names_are_stable_dns_labels() -> None:
    name = request_name("team-a-ns/gang-0")
    assert name == request_name("team-a-ns/gang-0") != request_name("team-a-ns/gang-1")
    assert len(name) <= 63 and name.replace("-", "").isalnum() and name.islower()
    # a retry is a new request (a request's spec cannot change), still a DNS label
    assert request_name("team-a-ns/gang-0", 1) == name
    assert request_name("team-a-ns/gang-0", 12) == f"{name}-12"


# -- pending mode -------------------------------------------------------------------------

def test_without_autoscaling_pods_beyond_the_nodes_wait(redis_url: str) -> None:
    rig = make_rig(redis_url, TEAMS, {"gpu": 2})
    pods = [rig.pod(f"p{i}", demand={"gpu": 2}) for i in range(3)]
    rig.settle()
    assert _states(rig, *pods) == ["running", "gated", "gated"]


def test_pending_mode_releases_heads_in_order_at_most_in_flight_never_past_the_maximum(
    redis_url: str
) -> None:
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 2}), _spec(most=6, in_flight=1))
    a0 = rig.pod("a0", demand={"gpu": 2})
    a1 = rig.pod("a1", demand={"gpu": 2}, duration=1000)
    b0 = rig.pod("b0", tenant="team-b", demand={"gpu": 2}, duration=1000)
    a2 = rig.pod("a2", demand={"gpu": 2}, duration=1000)
    rig.settle()
    # team-b is owed next (team-a runs a0): its head is released to be seen pending
    assert _states(rig, a0, a1, b0, a2) == ["running", "gated", "pending", "gated"]
    told = [e.message for e in rig.cluster.events if e.pod.name == "b0"]
    assert any("autoscaling mode pending" in m for m in told), told
    notes = rig.queue.capacity_notes()
    assert notes is not None and [h["key"] for h in notes["autoscaling"]] == [b0.ticket]
    rig.cluster.grow({"gpu": 2})  # the autoscaler's node arrives: b0 runs, a1 is next
    rig.settle()
    assert _states(rig, a0, a1, b0, a2) == ["running", "pending", "running", "gated"]
    rig.cluster.grow({"gpu": 2})
    rig.settle()
    # 6 GPUs run: a2 would pass the maximum, so it waits for capacity like any pod
    assert _states(rig, a0, a1, b0, a2) == ["running", "running", "running", "gated"]
    assert rig.dispatcher._heads == {}
    rig.at(rig.clock() + 100)  # a0 ends: a2 runs on what exists
    assert _states(rig, a2) == ["running"]


def test_a_head_whose_pod_is_deleted_frees_its_slot(redis_url: str) -> None:
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}), _spec(most=4))
    rig.pod("a0", duration=1000)
    a1, a2 = rig.pod("a1"), rig.pod("a2")
    rig.settle()
    assert _states(rig, a1, a2) == ["pending", "gated"]
    rig.cluster.delete_pod(a1.uid)
    rig.settle()
    assert _states(rig, a2) == ["pending"]


# -- provisioningRequest mode --------------------------------------------------------------

class FakeProvisioner:
    """ProvisioningRequests kept in memory; the test sets their conditions. There is no
    delete: the pods own their requests (the e2e tests show the garbage collector at
    work)."""

    def __init__(self) -> None:
        self.requests: dict[str, list[dict[str, str]]] = {}
        self.made: list[tuple[str, tuple[str, ...]]] = []
        self.consumed: dict[str, str] = {}
        self.refusal = ""  # set: create raises ValueError (a shape the API would refuse)

    def create(self, name: str, namespace: str, pods: Sequence[GpuPod],
               labels: Mapping[str, str]) -> None:
        if self.refusal:
            raise ValueError(self.refusal)
        self.requests.setdefault(name, [])
        self.made.append((name, tuple(p.ref.name for p in pods)))

    def conditions(self, name: str, namespace: str) -> list[dict[str, str]] | None:
        return self.requests.get(name)

    def consume(self, pod: GpuPod, name: str) -> bool:
        self.consumed[pod.ref.name] = name
        return True


def test_a_head_gets_a_request_and_runs_once_it_is_provisioned(redis_url: str) -> None:
    fake = FakeProvisioner()
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 2}),
                      _spec("provisioningRequest", most=8), fake)
    rig.pod("a0", demand={"gpu": 2}, duration=1000)
    gang = [rig.pod(f"g{i}", demand={"gpu": 2}, group="g", group_size=2) for i in range(2)]
    rig.settle()
    name = request_name("team-a-ns/g")
    assert fake.made == [(name, ("g0", "g1"))]  # one request for the whole gang
    assert _states(rig, *gang) == ["gated", "gated"]  # held until it is provisioned
    status = rig.queue.ticket_status(gang[0].ticket, rig.clock())
    assert status is not None and status.state != "queued"  # counted, not queued
    rig.at(rig.clock() + 20)
    assert _states(rig, *gang) == ["gated", "gated"] and len(fake.made) == 1
    # the test is the autoscaler: nodes arrive, the request is Provisioned
    rig.cluster.grow({"gpu": 4})
    fake.requests[name] = [_cond("Accepted"), _cond("Provisioned")]
    rig.at(rig.clock() + 1)
    assert _states(rig, *gang) == ["running", "running"]
    assert fake.consumed == {"g0": name, "g1": name}
    rig.settle()
    assert rig.dispatcher._heads == {} and len(fake.made) == 1  # nothing more asked


def test_a_failed_request_is_retried_with_backoff_and_said(redis_url: str) -> None:
    fake = FakeProvisioner()
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}),
                      _spec("provisioningRequest", most=4), fake)
    rig.pod("a0", duration=10_000)
    a1 = rig.pod("a1")
    rig.settle()
    name, retry = request_name(a1.ticket), request_name(a1.ticket, 2)
    fake.requests[name] = [_cond("Failed", reason="OutOfStock", message="no GPUs in zone")]
    rig.at(rig.clock() + 1)
    assert _states(rig, a1) == ["gated"]
    warned = [e for e in rig.cluster.events if e.reason == "ProvisioningFailed"]
    assert [e.message for e in warned] == [
        f"ProvisioningRequest {name} failed (Failed: OutOfStock (no GPUs in zone)): asking "
        f"again in {BACKOFF_BASE:.0f}s (attempt 2)"]
    notes = rig.queue.capacity_notes()
    assert notes is not None and notes["autoscaling"][0]["state"] == "retrying"
    rig.at(rig.clock() + BACKOFF_BASE / 2)
    assert len(fake.made) == 1  # not before the backoff
    rig.at(rig.clock() + BACKOFF_BASE)
    assert [made for made, _ in fake.made] == [name, retry] and fake.requests[retry] == []
    rig.cluster.grow({"gpu": 1})
    fake.requests[retry] = [_cond("Provisioned")]
    rig.at(rig.clock() + 1)
    assert _states(rig, a1) == ["running"] and fake.consumed == {"a1": retry}


def test_a_request_that_cannot_be_made_is_said_and_asked_again(redis_url: str) -> None:
    fake = FakeProvisioner()
    fake.refusal = "33 pods of 33 shapes: a ProvisioningRequest holds at most 32 pod sets"
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}),
                      _spec("provisioningRequest", most=4), fake)
    rig.pod("a0", duration=10_000)
    a1 = rig.pod("a1")
    rig.settle()
    warned = [e.message for e in rig.cluster.events if e.reason == "ProvisioningFailed"]
    assert warned == [f"ProvisioningRequest {request_name(a1.ticket)} not made: "
                      f"{fake.refusal}: asking again in {BACKOFF_BASE:.0f}s (attempt 2)"]
    assert _states(rig, a1) == ["gated"] and fake.made == []
    fake.refusal = ""
    rig.at(rig.clock() + BACKOFF_BASE + 1)
    assert [made for made, _ in fake.made] == [request_name(a1.ticket, 2)]


def test_a_head_whose_pods_are_gone_is_forgotten_and_their_quota_freed(
    redis_url: str
) -> None:
    fake = FakeProvisioner()
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}),
                      _spec("provisioningRequest", most=4), fake)
    rig.pod("a0", duration=10_000)
    a1 = rig.pod("a1")
    rig.settle()
    used = next(s.used_slices for s in rig.queue.tenant_status() if s.tenant == "team-a")
    assert used == 14  # a0 and the held a1
    rig.cluster.delete_pod(a1.uid)
    rig.settle()
    assert rig.dispatcher._heads == {} and len(fake.made) == 1
    used = next(s.used_slices for s in rig.queue.tenant_status() if s.tenant == "team-a")
    assert used == 7


def test_a_reconcile_keeps_held_pods_counted(redis_url: str) -> None:
    fake = FakeProvisioner()
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}),
                      _spec("provisioningRequest", most=4), fake)
    rig.pod("a0", duration=10_000)
    a1 = rig.pod("a1")
    rig.settle()
    rig.client.flushall()  # Redis lost everything: rebuilt from the cluster
    rig.dispatcher.reconcile()
    rig.settle()
    assert len(fake.made) == 1 and _states(rig, a1) == ["gated"]
    used = next(s.used_slices for s in rig.queue.tenant_status() if s.tenant == "team-a")
    assert used == 14


def test_status_and_why_say_a_head_waits_for_nodes(redis_url: str) -> None:
    fake = FakeProvisioner()
    rig = _autoscaled(make_rig(redis_url, TEAMS, {"gpu": 1}),
                      _spec("provisioningRequest", most=4), fake)
    rig.pod("a0", duration=10_000)
    a1 = rig.pod("a1")
    rig.settle()
    lines = capacity_lines(rig.queue.capacity_notes())
    assert "  waiting for nodes (autoscaling), in queue order: 1" in lines
    assert any(line.startswith(f"    {a1.ticket} of team-a (gpu=1), requesting since")
               and request_name(a1.ticket) in line for line in lines), lines
    report = why_report(a1.ref, rig.queue, [], rig.clock())
    assert "waiting for nodes (requesting since" in report.summary, report.summary
    assert report.waiting_for is not None and request_name(a1.ticket) in report.waiting_for
