"""Random interleavings of every queue operation, checked against the reference model.

Each step runs the same operation on a real FairQueue (Lua in a real redis-server)
and on tests/fairshare/queue/reference.py, and compares the answers exactly; invariants
1 (quota and capacity safety), 2 (class priority), 4 (work conservation) and
5 (idempotency, dry run writes nothing) are checked on the real state. Both orders run:
current usage (``usageHalfLife: 0``) and virtual time (the default), on a clock that
advances (the operations get ``now`` as the dispatcher passes it).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import cast

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fairshare.queue.calls import TicketConflictError
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GatedPod, PodRequest, RunningPod
from tenants.models import FairgateConfig, PlatformConfig, PodClass, QuotaSpec
from tenants.resources import ResourceCounts
from tests.fairshare.queue.reference import (
    BAND_CODE,
    BAND_NAME,
    BANDS,
    PRIO,
    Rec,
    Reference,
    empty_shape,
    waiting_for,
)
from tests.fairshare.queue.test_queue import dump_all
from tests.fairshare.tickets import pod_uid

TENANTS = ("a", "b", "c")
RESOURCES = ("gpu", "mig-1g.5gb", "mig-3g.40gb")
DEMANDS: tuple[ResourceCounts, ...] = (
    {"gpu": 1}, {"gpu": 2}, {"mig-1g.5gb": 1}, {"mig-1g.5gb": 2}, {"mig-3g.40gb": 1},
    {"gpu": 1, "mig-1g.5gb": 1},
)

quota_st = st.fixed_dictionaries({
    "weight": st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    "gpu": st.integers(1, 4),
    "mig-1g.5gb": st.integers(1, 6),
    "mig-3g.40gb": st.integers(0, 2),
    "borrow": st.integers(0, 2),
    "reserve": st.integers(0, 1),
})
capacity_st = st.fixed_dictionaries({
    "gpu": st.integers(1, 6), "mig-1g.5gb": st.integers(1, 7), "mig-3g.40gb": st.integers(0, 2),
})


def make_config(quotas: dict[str, dict[str, float]], virtual_time: bool,
                lend_reserve: bool = True) -> FairgateConfig:
    """The tenants' quotas; the order: virtual time (the default) or current usage
    (usageHalfLife: 0); whether unused inference reserves are lent to borrowed pods."""
    fair_share: dict[str, object] = {"lendInferenceReserve": lend_reserve}
    if not virtual_time:
        fair_share["usageHalfLife"] = 0
    platform = PlatformConfig.model_validate({
        "tenants": {t: {"weight": q["weight"], "ceiling": {"gpuEquivalents": 100}}
                    for t, q in quotas.items()},
        "fairShare": fair_share,
    })
    specs = {
        t: QuotaSpec.model_validate({
            "nominal": {r: int(q[r]) for r in RESOURCES},
            "borrowLimit": {"gpuEquivalents": int(q["borrow"])},
            "inferenceReserve": {"gpuEquivalents": int(q["reserve"])},
        })
        for t, q in quotas.items()
    }
    return FairgateConfig(platform=platform, quotas=specs)


@dataclasses.dataclass(frozen=True)
class Listing:
    """Pods as a reconciler listed them at time ``at``."""

    at: float
    running: list[tuple[str, Rec]]
    gated: list[tuple[str, Rec]]


class QueueMachine(RuleBasedStateMachine):
    client: redis.Redis
    virtual_time = False  # the order: current usage, or virtual time (the default)

    def __init__(self) -> None:
        super().__init__()
        self.client.flushall()
        self.queue = FairQueue(self.client)
        self.ref = Reference(virtual_time=self.virtual_time)
        self.now = 1000.0
        self.count = 0
        self.tickets: list[str] = []
        self.cap: ResourceCounts = {}
        self.last_usage = self.usage_snapshot()
        self.listed: Listing | None = None

    # -- helpers -----------------------------------------------------------------

    def usage_snapshot(self) -> dict[tuple[str, str], int]:
        """Limit-relevant usage per tenant (from Redis)."""
        snap: dict[tuple[str, str], int] = {}
        for ts in self.queue.tenant_status():
            for r, n in ts.used.items():
                snap[(ts.tenant, "u:" + r)] = n
            snap[(ts.tenant, "ut")] = ts.training_slices
            snap[(ts.tenant, "ut+ub")] = ts.training_slices + ts.borrowed_slices
            snap[(ts.tenant, "total")] = (ts.inference_slices + ts.training_slices
                                          + ts.borrowed_slices)
        return snap

    def pick(self, index: int, states: str = "QGRA") -> str | None:
        """A ticket ever admitted (maybe forgotten since) whose reference state is in
        ``states`` ("" also allows forgotten ones)."""
        if states == "QGRA":
            found = self.tickets
        else:
            found = [t for t in self.tickets
                     if (t in self.ref.recs and self.ref.recs[t].state in states)]
        return found[index % len(found)] if found else None

    def request(self, tenant: str, pod_class: PodClass, demand: int, gang: int) -> PodRequest:
        self.count += 1
        group = f"g{gang}-{pod_class[0]}" if gang else None
        # every other ticket a uuid, as fairgate mints them (stored packed)
        ticket = f"tk-{self.count}" if self.count % 2 else str(uuid.UUID(int=self.count))
        return PodRequest(
            ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}",
            name=f"pod-{self.count}", pod_class=pod_class, demand=dict(DEMANDS[demand]),
            group=group, group_size=gang + 1 if gang else 1, submitted_at=self.now,
        )

    def check_admit(self, req: PodRequest, dry: bool) -> None:
        used = self.cluster_used()
        got = self.queue.admit(req, self.now, dry_run=dry)
        if got.outcome == "reserved" and not got.duplicate and not dry:
            self.check_capacity(used, [(BAND_CODE[got.band], req.demand)])
        want, reason = self.ref.admit(req, self.now, dry)
        want = dataclasses.replace(
            want, waiting_for=waiting_for(reason, req.tenant, req.pod_class),
            reason=tuple(str(v) for v in reason) if want.outcome == "queued" else (),
        )
        assert got == want, (req, got, want)

    # -- rules ---------------------------------------------------------------------

    @initialize(quotas=st.fixed_dictionaries({t: quota_st for t in TENANTS}), cap=capacity_st,
                lend_reserve=st.booleans())
    def first_config(self, quotas: dict[str, dict[str, float]], cap: ResourceCounts,
                     lend_reserve: bool = True) -> None:
        self.configure(quotas, cap, lend_reserve)

    @rule(quotas=st.fixed_dictionaries({t: quota_st for t in TENANTS}), cap=capacity_st,
          lend_reserve=st.booleans())
    def configure(self, quotas: dict[str, dict[str, float]], cap: ResourceCounts,
                  lend_reserve: bool = True) -> None:
        config = make_config(quotas, self.virtual_time, lend_reserve)
        self.cap = cap
        self.queue.sync_config(config, cap)
        self.ref.sync(config, cap)
        self.last_usage = self.usage_snapshot()

    @rule(tenant=st.sampled_from(TENANTS), pod_class=st.sampled_from(["inference", "training"]),
          demand=st.integers(0, len(DEMANDS) - 1),
          gang=st.sampled_from([0, 0, 0, 0, 1, 2]))
    def admit(self, tenant: str, pod_class: PodClass, demand: int, gang: int) -> None:
        req = self.request(tenant, pod_class, demand, gang)
        self.check_admit(req, dry=False)
        self.tickets.append(req.ticket)

    @rule(pods=st.lists(st.tuples(st.sampled_from(TENANTS),
                                  st.sampled_from(["inference", "training"]),
                                  st.integers(0, len(DEMANDS) - 1),
                                  st.sampled_from([0, 0, 1, 2])), min_size=2, max_size=6))
    def burst(self, pods: list[tuple[str, PodClass, int, int]]) -> None:
        for tenant, pod_class, demand, gang in pods:
            self.admit(tenant, pod_class, demand, gang)
            self.quota_safety()

    @rule(index=st.integers(0, 10_000), reclaimed=st.booleans())
    def finish(self, index: int, reclaimed: bool = False) -> None:
        self.release(index, "RA", reclaimed)

    @rule(tenant=st.sampled_from(TENANTS), pod_class=st.sampled_from(["inference", "training"]),
          demand=st.integers(0, len(DEMANDS) - 1), gang=st.sampled_from([0, 1]))
    def dry_run_writes_nothing(self, tenant: str, pod_class: PodClass, demand: int,
                               gang: int) -> None:
        req = self.request(tenant, pod_class, demand, gang)
        before = dump_all(self.client)
        self.check_admit(req, dry=True)
        assert dump_all(self.client) == before

    @rule(index=st.integers(0, 10_000), copy=st.sampled_from(
        ["", "", "namespace", "name", "generated", "tenant", "class", "demand"]))
    def same_ticket_again(self, index: int, copy: str) -> None:
        """The same admission again changes nothing and answers the current state; the
        ticket copied into another pod (or one a pod was seen with) is refused, changing
        nothing."""
        ticket = self.pick(index)
        rec = self.ref.recs.get(ticket) if ticket else None
        if rec is None or ticket is None:
            return
        pod_class: PodClass = "inference" if rec.cls == "i" else "training"
        req = PodRequest(ticket, rec.tenant, rec.ns, rec.name, pod_class, dict(rec.demand),
                         submitted_at=rec.submitted)
        other_tenant = TENANTS[(TENANTS.index(rec.tenant) + 1) % len(TENANTS)]
        req = {
            "": req,
            "namespace": dataclasses.replace(req, namespace="ns-copy"),
            "name": dataclasses.replace(req, name=rec.name + "-copy"),
            "generated": dataclasses.replace(req, name="pod-*"),
            "tenant": dataclasses.replace(req, tenant=other_tenant),
            "class": dataclasses.replace(
                req, pod_class="training" if pod_class == "inference" else "inference"),
            "demand": dataclasses.replace(req, demand={**rec.demand,
                                                       "gpu": rec.demand.get("gpu", 0) + 1}),
        }[copy]
        before = dump_all(self.client)
        if copy or rec.state == "A" or rec.uid:  # a pod was seen with it: not a retry
            with pytest.raises(TicketConflictError) as got:
                self.queue.admit(req, self.now)
            with pytest.raises(TicketConflictError) as want:
                self.ref.admit(req, self.now, False)
            assert str(got.value) == str(want.value)
            assert (got.value.namespace, got.value.name) == (rec.ns, rec.name)
        else:
            got_admission = self.queue.admit(req, self.now)
            assert got_admission.duplicate
            self.check_admit(req, dry=False)
        assert dump_all(self.client) == before

    @rule(limit=st.sampled_from([1, 2, 100]))
    def dispatch(self, limit: int) -> None:
        used = self.cluster_used()
        got = self.queue.dispatch(self.now, limit)
        want = self.ref.dispatch(self.now, limit)
        assert got == want, (got, want)
        # each decision (a pod, or a whole gang) fits at the moment it is taken
        decisions: list[list[tuple[str, ResourceCounts]]] = []
        last_gang = None
        for release in got:
            gang = self.ref.recs[release.ticket].gang or None
            if gang is None or gang != last_gang:
                decisions.append([])
            decisions[-1].append((BAND_CODE[release.band], release.demand))
            last_gang = gang
        for started in decisions:
            self.check_capacity(used, started)
        if limit == 100:
            self.check_nothing_fits()

    @rule(limit=st.sampled_from([1, 2, 100]), extra=st.integers(1, 8))
    def dispatch_into_grown_pools(self, limit: int, extra: int) -> None:
        """A dispatch that fits entries against pools grown by ``extra`` units of every
        resource (autoscaling), fair shares still against the stored capacity: the
        same releases as the reference's, each fitting the grown capacity."""
        grown = {res: n + extra for res, n in self.cap.items()}
        used = self.cluster_used()
        got = self.queue.dispatch(self.now, limit, grown)
        want = self.ref.dispatch(self.now, limit, grown)
        assert got == want, (got, want)
        stored = self.cap
        self.cap = grown
        try:
            for release in got:
                self.check_capacity(used, [(BAND_CODE[release.band], release.demand)])
        finally:
            self.cap = stored

    @rule(count=st.integers(1, 3), limit=st.sampled_from([1, 100]))
    def pods_end(self, count: int, limit: int) -> None:
        """The dispatcher's loop: the running pods that began first end, and it
        dispatches (so the queue order decides who gets what they freed)."""
        running = sorted((rec.at, ticket) for ticket, rec in self.ref.recs.items()
                         if rec.state == "A" and rec.at is not None)
        for _, ticket in running[:count]:
            uid = pod_uid(ticket)
            assert self.queue.release(ticket, uid, self.now) == \
                self.ref.release(ticket, False, uid, self.now)
        self.dispatch(limit)

    @rule(index=st.integers(0, 10_000), states=st.just("QGRA"), reclaimed=st.booleans())
    def release(self, index: int, states: str, reclaimed: bool) -> None:
        """A pod ends or is deleted (``reclaimed``: evicted for another tenant)."""
        ticket = self.pick(index, states)
        if ticket is not None:
            uid = pod_uid(ticket)
            assert self.queue.release(ticket, uid, self.now, hand_over=not reclaimed) == \
                self.ref.release(ticket, False, uid, self.now, reclaimed)
            assert not self.queue.release(ticket, uid, self.now)

    @rule(index=st.integers(0, 10_000))
    def remove(self, index: int) -> None:
        ticket = self.pick(index, "QGA")
        if ticket is not None:
            uid = pod_uid(ticket)
            assert self.queue.remove(ticket, uid, self.now) == \
                self.ref.release(ticket, True, uid, self.now)

    @rule(index=st.integers(0, 10_000))
    def confirm(self, index: int) -> None:
        ticket = self.pick(index)
        if ticket is not None:
            rec = self.ref.recs.get(ticket)
            ns, name = (rec.ns, rec.name) if rec else ("ns-a", "gone")
            uid = pod_uid(ticket)
            assert self.queue.confirm(ticket, uid, ns, name) == \
                self.ref.confirm(ticket, uid, ns, name)

    @rule()
    def see_pods(self) -> None:
        """The dispatcher sees every pod admitted so far (each confirms its ticket):
        reservations run and queue entries stay queued, nothing of them expires."""
        for ticket in self.tickets:
            rec = self.ref.recs.get(ticket)
            if rec is not None and not rec.uid:
                uid = pod_uid(ticket)
                assert self.queue.confirm(ticket, uid, rec.ns, rec.name) == \
                    self.ref.confirm(ticket, uid, rec.ns, rec.name)

    @rule(index=st.integers(0, 10_000), copy=st.sampled_from(["uid", "namespace", "name"]))
    def twin_presents_ticket(self, index: int, copy: str) -> None:
        """A second pod carrying a ticket (copied stamps) neither binds, frees nor removes
        it once the owner was seen; nothing changes."""
        ticket = self.pick(index)
        rec = self.ref.recs.get(ticket) if ticket else None
        if rec is None or ticket is None or not rec.uid:
            return
        twin = "twin-" + ticket
        ns, name = {"uid": (rec.ns, rec.name), "namespace": ("ns-twin", rec.name),
                    "name": (rec.ns, rec.name + "-twin")}[copy]
        before = dump_all(self.client)
        assert self.queue.confirm(ticket, twin, ns, name) == "conflict"
        assert self.ref.confirm(ticket, twin, ns, name) == "conflict"
        assert not self.queue.release(ticket, twin) and not self.queue.remove(ticket, twin)
        assert not self.ref.release(ticket, False, twin)
        assert dump_all(self.client) == before

    @rule(index=st.integers(0, 10_000))
    def requeue(self, index: int) -> None:
        ticket = self.pick(index, "RAQ")
        if ticket is not None:
            assert self.queue.requeue(ticket, self.now) == self.ref.requeue(ticket, self.now)

    def listing(self, pods_of_reserved: bool) -> Listing:
        """The pods the cluster shows now: running (released, confirmed and, with
        ``pods_of_reserved``, reserved ones whose pod exists but is not confirmed yet)
        and gated ones in queue order."""
        running: list[tuple[str, Rec]] = []
        gated: list[tuple[str, Rec]] = []
        for ticket, rec in self.ref.recs.items():
            listed = dataclasses.replace(rec, uid=pod_uid(ticket))
            if rec.state == "A" or (rec.state == "R" and pods_of_reserved):
                running.append((ticket, listed))
            elif rec.state in ("Q", "G"):
                gated.append((ticket, listed))
        gated.sort(key=lambda item: (item[1].submitted, item[0]))
        return Listing(self.now, running, gated)

    @rule(pods_of_reserved=st.booleans())
    def list_pods(self, pods_of_reserved: bool) -> None:
        """A reconciler lists the pods; its rebuild may come several steps later."""
        self.listed = self.listing(pods_of_reserved)

    @rule(stale=st.booleans(), pods_of_reserved=st.booleans())
    def rebuild_from_cluster(self, stale: bool, pods_of_reserved: bool) -> None:
        """The reconciler replaces Redis with the cluster's truth as listed (now, or at
        the last ``list_pods``): tickets reserved or dispatched since shortly before the
        listing are kept."""
        listed = self.listed if stale and self.listed else self.listing(pods_of_reserved)
        running = [(t, dataclasses.replace(r)) for t, r in listed.running]
        gated = [(t, dataclasses.replace(r)) for t, r in listed.gated]

        def group(rec: Rec) -> tuple[str | None, int]:
            return (rec.gang.split("/", 1)[1], rec.gsize) if rec.gang else (None, 1)

        def pod_class(rec: Rec) -> PodClass:
            return "inference" if rec.cls == "i" else "training"

        self.queue.rebuild(
            [RunningPod(t, r.tenant, r.ns, r.name, pod_class(r), BAND_NAME[r.band],
                        dict(r.demand), r.uid, *group(r)) for t, r in running],
            [GatedPod(PodRequest(t, r.tenant, r.ns, r.name, pod_class(r), dict(r.demand),
                                 *group(r), submitted_at=r.submitted), BAND_NAME[r.band],
                      r.uid)
             for t, r in gated],
            listed_at=listed.at,
        )
        self.ref.rebuild(running, gated, listed.at - self.queue.reservation_ttl)
        self.last_usage = self.usage_snapshot()

    @rule(seconds=st.sampled_from([0.5, 5.0, 31.0, 150.0]))
    def tick_and_expire(self, seconds: float) -> None:
        self.now += seconds
        got = self.queue.expire(self.now)
        assert got == self.ref.expire(self.now - self.queue.reservation_ttl, self.now)

    @rule(seconds=st.sampled_from([0.5, 2.0, 7.0, 30.0, 90.0, 300.0, 650.0]))
    def advance(self, seconds: float) -> None:
        """Time passes (pods run, service accrues), nothing expires yet. Multiples of
        0.5 s: the service sums stay exact (reference.py, "Floating point")."""
        self.now += seconds

    @rule(index=st.integers(0, 10_000))
    def why(self, index: int) -> None:
        ticket = self.pick(index)
        if ticket is None:
            return
        status = self.queue.ticket_status(ticket, self.now)
        rec = self.ref.recs.get(ticket)
        assert (status is None) == (rec is None)
        if status is None or rec is None:
            return
        assert self.queue.find(rec.ns, rec.name) == ticket
        assert status.state == {"Q": "queued", "G": "gang-waiting", "R": "reserved",
                                "A": "running"}[rec.state]
        if rec.state in ("Q", "G"):
            position, length, reason = self.ref.describe(ticket, rec, self.now)
            assert status.position == (position or None)
            assert status.queue_length == length
            assert status.waiting_for == waiting_for(reason, rec.tenant, status.pod_class)

    # -- invariants ----------------------------------------------------------------

    def check_nothing_fits(self) -> None:
        """Invariants 2 and 4: after a full dispatch no queued pod could be released."""
        for tier in BANDS:
            guards, _, _, _ = self.ref.plan(tier, self.now)
            for rec in self.ref.recs.values():
                if rec.state != "Q" or rec.gang or rec.band != tier:
                    continue
                shape = empty_shape()
                shape[rec.band] = dict(rec.demand)
                fits = (self.ref.quota_check(rec.tenant, shape) is None
                        and self.ref.cap_check(shape, guards) is None)
                assert not fits, f"{rec} fits but was not released"

    @invariant()
    def usage_matches_reference(self) -> None:
        for ts in self.queue.tenant_status():
            usage = self.ref.usage(ts.tenant)
            assert ts.inference_slices == usage["ui"]
            assert ts.training_slices == usage["ut"]
            assert ts.borrowed_slices == usage["ub"]
            assert ts.used == {k[2:]: v for k, v in usage.items() if k.startswith("u:") and v}
            for pod_class, code in (("inference", "i"), ("training", "t")):
                want = len([r for r in self.ref.queued(ts.tenant) if r.cls == code])
                assert ts.queued[pod_class] == want  # type: ignore[index]

    @invariant()
    def stored_scores_are_lower_bounds(self) -> None:
        """A decision walks a ready set from its lowest stored score and stops at the
        first that cannot beat the best current one (lib_order.lua best_of): every stored
        score is at most its tenant's current one (the rule's, at the clock now)."""
        for key in self.client.scan_iter(match="fairgate:r:*"):
            members = cast(list[tuple[bytes, float]],
                           self.client.zrange(key, 0, -1, withscores=True))
            for member, stored in members:
                tenant = member.decode().rsplit(" ", 1)[-1]
                current = self.ref.share(tenant, self.now)
                assert float(stored) <= current + 1e-9 * max(1.0, abs(current)), (
                    key, tenant, stored, current)

    @invariant()
    def quota_safety(self) -> None:
        """Invariant 1: per tenant, non-borrowed usage within nominal (per resource;
        training within nominal less the inference reserve) and total usage within
        nominal + borrowLimit (training and borrowed within nominal less the reserve +
        borrowLimit). A limit may be exceeded only by lowering it, never by growth."""
        now = self.usage_snapshot()
        for ts in self.queue.tenant_status():
            limits = {("u:" + r): n for r, n in ts.nominal.items()}
            limits["ut"] = ts.nominal_slices - ts.inference_reserve_slices
            limits["ut+ub"] = limits["ut"] + ts.borrow_limit_slices
            limits["total"] = ts.nominal_slices + ts.borrow_limit_slices
            for field in set(limits) | {f for (t, f) in now if t == ts.tenant}:
                value = now.get((ts.tenant, field), 0)
                if value > limits.get(field, 0):
                    assert value <= self.last_usage.get((ts.tenant, field), 0), (
                        f"{ts.tenant} {field} grew to {value} over its limit"
                    )
        self.last_usage = now

    def cluster_used(self) -> dict[tuple[str, str], int]:
        used: dict[tuple[str, str], int] = {}
        for field, n in self.client.hgetall("fairgate:used").items():
            text = field.decode() if isinstance(field, bytes) else str(field)
            band, res = text.split(":", 1)
            used[(band, res)] = int(n)
        return used

    def check_capacity(self, used: dict[tuple[str, str], int],
                       started: list[tuple[str, ResourceCounts]]) -> None:
        """Invariant 1 for the cluster: pods that start together (one reservation, one
        gang) fit the capacity of their band, counting lower bands as free."""
        for band, demand in started:
            for res, n in demand.items():
                used[(band, res)] = used.get((band, res), 0) + n
        for band, demand in started:
            for res in demand:
                total = sum(used.get((b, res), 0) for b in BANDS if PRIO[b] >= PRIO[band])
                assert total <= self.cap.get(res, 0), f"{band} {res} over capacity"


@pytest.mark.slow
@pytest.mark.parametrize("virtual_time", [False, True], ids=["current-usage", "virtual-time"])
def test_queue_matches_reference_model(redis_client: redis.Redis, virtual_time: bool) -> None:
    class Machine(QueueMachine):
        client = redis_client

    Machine.virtual_time = virtual_time

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=80, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


# -- bugs the scripts had -----------------------------------------------------------
# Each is a falsifying example of the virtual-time machine, shrunk by hand, replayed
# step by step against the reference model (FIXED_BUGS).


def _quotas(**weights: float) -> dict[str, dict[str, float]]:
    """Every tenant may run 4 GPUs; weight 1 unless given."""
    return {t: {"weight": weights.get(t, 1.0), "gpu": 4, "mig-1g.5gb": 1, "mig-3g.40gb": 0,
                "borrow": 0, "reserve": 0} for t in TENANTS}


def _gpus(n: int) -> ResourceCounts:
    return {"gpu": n, "mig-1g.5gb": 1, "mig-3g.40gb": 0}


def _pod(tenant: str, gpus: int = 1) -> dict[str, object]:
    """A training pod of 1 or 2 GPUs (DEMANDS[0], DEMANDS[1])."""
    return {"tenant": tenant, "pod_class": "training", "demand": gpus - 1, "gang": 0}


Steps = list[tuple[str, dict[str, object]]]

# Falsifying examples of bugs the scripts had (fixed since): they follow the rule.
FIXED_BUGS: dict[str, Steps] = {
    # stale-lanes: refresh counted a tenant's lanes before dropping the emptied ones
    "idle-tenant-stays-active": [
        ("first_config", {"quotas": _quotas(), "cap": _gpus(2)}),
        ("admit", _pod("b", gpus=2)),
        ("admit", _pod("a")),  # a waits...
        ("remove", {"index": 0}),  # ...its pod is deleted: a is idle and leaves va
        ("admit", _pod("b")),  # b waits for a GPU
        ("advance", {"seconds": 90.0}),
        ("admit", _pod("c")),  # c joins at b's virtual time 1260 (not at a's 0)
        ("see_pods", {}),
        ("finish", {"index": 0}),  # b's 2-GPU pod ends
        # b's pod is released (both at 1260, b's created first)
        ("dispatch", {"limit": 1}),
    ],
    # unjoined-entry: admit scored a tenant's entry before the tenant joined va
    "first-pod-back-from-idle-scored-before-joining": [
        ("first_config", {"quotas": _quotas(), "cap": _gpus(1)}),
        ("admit", _pod("b")),
        ("admit", _pod("b")),  # b waits
        ("see_pods", {}),
        ("advance", {"seconds": 90.0}),
        ("finish", {"index": 0}),  # b's pod ends: the GPU is free, b's at 630
        # a joins at 630, and its pod is scored there: it queues behind b's pod
        # (created first)
        ("admit", _pod("a")),
    ],
    # stale-floor: sync did not write va's scores again when a weight changed
    "floor-from-stale-va-after-weight-change": [
        ("first_config", {"quotas": _quotas(), "cap": _gpus(2)}),
        ("admit", _pod("a")),
        ("admit", _pod("b")),
        ("admit", _pod("a")),
        ("admit", _pod("b")),
        ("see_pods", {}),
        ("advance", {"seconds": 90.0}),
        ("finish", {"index": 0}),
        ("finish", {"index": 0}),  # both ran 630, and wait: active
        # b's weight triples: its virtual time is 210
        ("configure", {"quotas": _quotas(b=3), "cap": _gpus(0)}),
        ("admit", _pod("c")),  # c joins at b's 210 (not at a's 630)
        ("configure", {"quotas": _quotas(b=3), "cap": _gpus(2)}),
        # b's and c's pods are released (c at 210, ahead of a at 630)
        ("dispatch", {"limit": 100}),
    ],
    # stale-bounds: a tenant's score stored in a ready set could be above its current
    # one, and a decision walks the set only while a stored score can beat the best
    # current one; here rt fell without the stored score being written again
    "stored-score-above-current-when-rt-falls": [
        ("first_config", {"quotas": _quotas(), "cap": _gpus(3)}),
        ("admit", _pod("c", gpus=2)),
        ("admit", _pod("a")),
        ("confirm", {"index": 0}),  # c's pod is seen: its end teaches a run time
        ("admit", _pod("a")),  # a waits, scored with the 600 s default: 7 x 600
        ("advance", {"seconds": 90.0}),
        ("finish", {"index": 0}),  # c's pod ends: rt 90, a's score falls to 7 x 90
        ("admit", _pod("c")),  # c waits, at 14 x 90
        # a's pod is released (a's stored score fell with rt)
        ("dispatch", {"limit": 1}),
    ],
    # stale-bounds: here sync wrote a score without the time, counting the service of
    # a running pod up to the tenant's last fold twice
    "stored-score-above-current-after-sync": [
        ("first_config", {"quotas": _quotas(a=2), "cap": _gpus(3)}),
        ("admit", _pod("a")),
        ("advance", {"seconds": 90.0}),
        ("admit", _pod("a")),  # a's service is folded: 630
        ("admit", _pod("b")),  # b joins at a's virtual time: 315
        ("admit", _pod("b")),  # b waits: (315 + 7 x 600) / 1 = 4515
        ("admit", _pod("a")),  # a waits: (630 + 14 x 600 - 630) / 2 = 4200
        # sync stores a's score as of its last fold: 4200 (not (630 + 14 x 600) / 2)
        ("configure", {"quotas": _quotas(a=2), "cap": _gpus(4)}),
        # a's pod is released (4200 < 4515)
        ("dispatch", {"limit": 1}),
    ],
    # standing-in: a borrowed gang stood in the nominal room training left unused,
    # and a training pod within nominal was then admitted into that same room
    "training-takes-the-room-a-borrowed-gang-stands-in": [
        ("first_config", {"quotas": {**_quotas(), "a": {
            "weight": 1.0, "gpu": 4, "mig-1g.5gb": 1, "mig-3g.40gb": 0, "borrow": 2,
            "reserve": 1}}, "cap": _gpus(6)}),
        # a gang of 2 x 2 GPUs: above nominal less the reserve (22 slices), within it
        # + borrowLimit: borrowed, standing in 22 slices of nominal and borrowing 6
        ("admit", {"tenant": "a", "pod_class": "training", "demand": 1, "gang": 1}),
        ("admit", {"tenant": "a", "pod_class": "training", "demand": 1, "gang": 1}),
        ("dispatch", {"limit": 100}),
        # 2 GPUs more as training would be 42 slices of training and borrowed against
        # 22 + 14: it waits for the gang
        ("admit", _pod("a", gpus=2)),
        ("dispatch", {"limit": 100}),
    ],
}


def replay(client: redis.Redis, steps: Steps) -> QueueMachine:
    """Run the virtual-time machine's rules in order, its invariants after each."""
    class Machine(QueueMachine):
        pass

    Machine.client, Machine.virtual_time = client, True
    machine = Machine()
    for rule_name, arguments in steps:
        getattr(machine, rule_name)(**arguments)
        machine.quota_safety()
        machine.usage_matches_reference()
        machine.stored_scores_are_lower_bounds()
    return machine


@pytest.mark.parametrize("case", list(FIXED_BUGS))
def test_fixed_lua_bug_follows_the_rule(redis_client: redis.Redis, case: str) -> None:
    """A bug's falsifying example, now that the scripts follow the rule."""
    replay(redis_client, FIXED_BUGS[case])
