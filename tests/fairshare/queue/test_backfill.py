"""Backfill (fairshare/queue/README.md "Backfill"), on the real Lua in a real Redis and
against the reference model, step by step: with virtual time, an entry that fits the
free capacity but not what is held for an owed entry is released into the held
capacity when it is expected to end before the owed entry is expected to fit; one
expected to outlast that waits."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import Admission, GatedPod, PodRequest, RunningPod
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec
from tests.fairshare.queue.reference import Reference, waiting_for
from tests.fairshare.tickets import pod_uid


class Both:
    """The queue and the reference model, driven together; every answer compared."""

    def __init__(self, client: redis.Redis, half_life: str | None = None,
                 gpus: int = 2) -> None:
        platform = PlatformConfig.model_validate({
            "tenants": {t: {"weight": 1, "ceiling": {"gpuEquivalents": 100}} for t in "abc"},
            **({} if half_life is None else {"fairShare": {"usageHalfLife": half_life}}),
        })
        quota = QuotaSpec.model_validate({"nominal": {"gpu": gpus}})
        config = FairgateConfig(platform=platform, quotas={t: quota for t in "abc"})
        self.q, self.ref = FairQueue(client), Reference(virtual_time=half_life is None)
        self.q.sync_config(config, {"gpu": gpus})
        self.ref.sync(config, {"gpu": gpus})

    def admit(self, ticket: str, tenant: str, gpus: int, at: float,
              run: int | None = None) -> Admission:
        req = PodRequest(ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}",
                         name=ticket, pod_class="training", demand={"gpu": gpus},
                         submitted_at=at, run_seconds=run)
        got = self.q.admit(req, at)
        want, reason = self.ref.admit(req, at, False)
        assert got == dataclasses.replace(
            want, waiting_for=waiting_for(reason, tenant, "training"),
            reason=tuple(str(v) for v in reason) if want.outcome == "queued" else ())
        uid = pod_uid(ticket)
        assert self.q.confirm(ticket, uid, f"ns-{tenant}", ticket) == "confirmed"
        assert self.ref.confirm(ticket, uid, f"ns-{tenant}", ticket) == "confirmed"
        return got

    def end(self, ticket: str, at: float) -> None:
        assert self.q.release(ticket, pod_uid(ticket), now=at)
        assert self.ref.release(ticket, False, pod_uid(ticket), now=at)

    def dispatch(self, at: float) -> list[str]:
        got = self.q.dispatch(at, 10)
        assert got == self.ref.dispatch(at, 10)
        return [r.ticket for r in got]


def drained_for_a(client: redis.Redis, b_runs: float, half_life: str | None = None,
                  b2_declares: int | None = None, c1_declares: int | None = None) -> Both:
    """2 GPUs, both running from t=0 (c1, b1: expected to end at 600 s, no pod having
    ended yet, or at ``c1_declares`` if c1 declares a shorter run time); a's 2-GPU pod
    and b's next 1-GPU pod (declaring ``b2_declares``) wait. b1 ends after ``b_runs``:
    one GPU is free and held for a, which is owed it; b2 fits that GPU only."""
    both = Both(client, half_life)
    assert both.admit("c1", "c", 1, 0.0, c1_declares).outcome == "reserved"
    assert both.admit("b1", "b", 1, 0.0).outcome == "reserved"
    assert both.admit("a1", "a", 2, 1.0).outcome == "queued"
    assert both.admit("b2", "b", 1, 2.0, b2_declares).outcome == "queued"
    both.end("b1", b_runs)
    return both


def test_a_pod_expected_to_end_before_the_drain_is_backfilled(
        redis_client: redis.Redis) -> None:
    """b's pods run 50 s: b2 is expected to end at 100 s, c1 (what a still waits for) at
    600 s, so b2 runs in the GPU held for a meanwhile."""
    both = drained_for_a(redis_client, 50.0)
    assert both.dispatch(50.0) == ["b2"]


def test_a_pod_expected_to_outlast_the_drain_waits(redis_client: redis.Redis) -> None:
    """b's pods run 500 s: b2 would be expected to end at 1,000 s, after c1 (600 s), and
    delay a; the GPU stays held for a, and a starts when c1 ends."""
    both = drained_for_a(redis_client, 500.0)
    assert both.dispatch(500.0) == []
    assert [(h.tenant, dict(h.held)) for h in both.q.holds(500.0)] == [
        ("a", {"gpu": 1}), ("b", {})]  # b is owed too: nothing left to hold
    both.end("c1", 610.0)
    assert both.dispatch(610.0) == ["a1"]


@pytest.mark.parametrize("half_life", ["0s", "1h"])
def test_other_orders_do_not_backfill(redis_client: redis.Redis, half_life: str) -> None:
    """Only virtual time backfills (the orders by current or decayed usage hold as
    before)."""
    both = drained_for_a(redis_client, 50.0, half_life)
    assert both.dispatch(50.0) == []


def test_expected_ends_are_kept_per_capacity_key_and_rebuilt_from_the_pods(
        redis_client: redis.Redis) -> None:
    """re:gpu holds the tickets holding GPUs by expected end; a rebuild replaces it from
    the listed running pods, each from when its run began and its tenant's expected run
    time then (c has no run of its own: the cluster's, 50 s since b1 ended)."""
    both = drained_for_a(redis_client, 50.0)
    assert redis_client.zrange("fairgate:re:gpu", 0, -1, withscores=True) == [
        (b"c1", 600.0)]
    assert both.dispatch(50.0) == ["b2"]
    assert redis_client.zrange("fairgate:re:gpu", 0, -1, withscores=True) == [
        (b"b2", 100.0), (b"c1", 600.0)]
    both.q.rebuild([RunningPod("c1", "c", "ns-c", "c1", "training", "training", {"gpu": 1},
                               pod_uid("c1"), started_at=0.0)], [])
    assert redis_client.zrange("fairgate:re:gpu", 0, -1, withscores=True) == [
        (b"c1", 50.0)]


def test_a_pod_that_declares_it_ends_in_time_is_backfilled(redis_client: redis.Redis) -> None:
    """b's pods run 500 s on average, but b2 declares activeDeadlineSeconds 60: it ends by
    560 s at the latest, before c1 (600 s), so it runs in the GPU held for a; its own
    expected end is its declared one."""
    both = drained_for_a(redis_client, 500.0, b2_declares=60)
    assert both.dispatch(500.0) == ["b2"]
    assert redis_client.zscore("fairgate:re:gpu", "b2") == 560.0


def test_a_pod_that_declares_it_outlasts_the_drain_waits(redis_client: redis.Redis) -> None:
    """b's pods run 50 s on average, but b2 declares 1,000 s: it may run until 1,050 s,
    past c1's end (600 s), and so would delay a: the GPU stays held for a."""
    both = drained_for_a(redis_client, 50.0, b2_declares=1000)
    assert both.dispatch(50.0) == []
    both.end("c1", 610.0)
    assert both.dispatch(610.0) == ["a1"]


@pytest.mark.parametrize(("c1_declares", "backfilled"), [(None, ["b2"]), (200, [])])
def test_a_running_pod_that_declares_a_shorter_run_ends_the_drain_sooner(
        redis_client: redis.Redis, c1_declares: int | None, backfilled: list[str]) -> None:
    """b's pods run 150 s: b2 is expected to end at 300 s. c1 is expected to end at 600 s
    (b2 is backfilled), unless it declares 200 s, shorter: then a is expected to fit at
    200 s, which b2 would delay, and b2 waits."""
    both = drained_for_a(redis_client, 150.0, c1_declares=c1_declares)
    assert redis_client.zscore("fairgate:re:gpu", "c1") == (c1_declares or 600.0)
    assert both.dispatch(150.0) == backfilled


@pytest.mark.parametrize(("c2_declares", "backfilled"), [(10, ["c2"]), (700, [])])
def test_a_second_owed_entry_that_fits_only_after_the_first_ran_does_not_stop_backfill(
        redis_client: redis.Redis, c2_declares: int, backfilled: list[str]) -> None:
    """4 GPUs: c1 (2 GPUs, expected to end at 600 s) runs; b1 (2 GPUs) ends at 50 s. a's
    4-GPU pod is owed and held the 2 free GPUs; b2 (1 GPU, declaring 1,000 s: it would
    delay a) is owed too and holds nothing. Together they lack 3 GPUs, more than c1
    holds: b2 fits only after a1 ran, so not before c1 ends. c2 (2 GPUs) declaring 10 s
    ends before, and runs in the GPUs held for a; declaring 700 s it waits. (The held
    top that lacked more than the running pods hold was once expected never to fit,
    which stopped every backfill into the drain.)"""
    both = Both(redis_client, gpus=4)
    assert both.admit("c1", "c", 2, 0.0).outcome == "reserved"
    assert both.admit("b1", "b", 2, 0.0).outcome == "reserved"
    assert both.admit("a1", "a", 4, 1.0).outcome == "queued"
    assert both.admit("b2", "b", 1, 2.0, 1000).outcome == "queued"
    assert both.admit("c2", "c", 2, 3.0, c2_declares).outcome == "queued"
    both.end("b1", 50.0)
    assert both.dispatch(50.0) == backfilled
    if not backfilled:
        assert [(h.tenant, dict(h.held)) for h in both.q.holds(50.0)] == [
            ("a", {"gpu": 2}), ("b", {})]


def test_a_declared_run_time_outlived_is_handled_as_before(redis_client: redis.Redis) -> None:
    """c1 declared 200 s and is still running at 250 s (its deadline's grace): a is
    expected to fit now, so nothing is backfilled into its GPU, even b2 declaring 10 s."""
    both = drained_for_a(redis_client, 250.0, b2_declares=10, c1_declares=200)
    assert both.dispatch(250.0) == []


def test_a_rebuild_keeps_the_declared_run_times_of_the_listed_pods(
        redis_client: redis.Redis) -> None:
    """A running pod listed with its declared run time is expected to end by it when that
    is shorter than its tenant's expected run time (50 s here); a gated one keeps it for
    its backfill."""
    both = drained_for_a(redis_client, 50.0)
    gated = PodRequest(ticket="b2", tenant="b", namespace="ns-b", name="b2",
                       pod_class="training", demand={"gpu": 1}, submitted_at=2.0,
                       run_seconds=900)
    both.q.rebuild([RunningPod("c1", "c", "ns-c", "c1", "training", "training", {"gpu": 1},
                               pod_uid("c1"), started_at=0.0, run_seconds=20)],
                   [GatedPod(gated, "training", pod_uid("b2"))])
    assert redis_client.zrange("fairgate:re:gpu", 0, -1, withscores=True) == [
        (b"c1", 20.0)]
    assert redis_client.hget("fairgate:tk", "b2").decode().split("|")[14] == "900"


def test_a_later_tenant_of_a_shape_is_backfilled_when_its_first_outlasts_the_drain(
        redis_client: redis.Redis) -> None:
    """4 GPUs: a (1 GPU) and b (2 GPUs) run until 100 s; c's 4-GPU pod is owed and held
    the free GPU. a2 and b2 (1 GPU each) wait: the same shape, a first in order (it runs
    less). a2 declares 1,000 s and would delay c; b2 declares 10 s and ends in time, so
    it runs in the held GPU. Before, only a shape's first tenant was looked at (one top
    per shape), so b2 was never tried and the GPU stayed idle, or went to a tenant of
    another shape further back in order (bench/fairness.py --unkind seed 158)."""
    both = Both(redis_client, gpus=4)
    assert both.admit("a1", "a", 1, 0.0, 100).outcome == "reserved"
    assert both.admit("b1", "b", 2, 0.0, 100).outcome == "reserved"
    assert both.admit("c1", "c", 4, 1.0).outcome == "queued"
    assert both.admit("a2", "a", 1, 2.0, 1000).outcome == "queued"
    assert both.admit("b2", "b", 1, 3.0, 10).outcome == "queued"
    assert [(h.tenant, dict(h.held)) for h in both.q.holds(4.0)] == [
        ("c", {"gpu": 1}), ("a", {})]
    assert both.dispatch(4.0) == ["b2"]
