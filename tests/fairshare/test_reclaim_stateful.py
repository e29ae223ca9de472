"""Reclaim's proof obligations, held by a hypothesis state machine on a real redis-server:
the real FairQueue and Dispatcher (reclaim checked on every step) on a SimulatedCluster
that evicts for real (the pod ends at once and its controller re-creates it).

Over random tenants (2 or 3, weights 1 to 3), reclaim settings (or reclaim off), pods of
random sizes and lengths, gangs of 2, and preemptible marks, after every step:

1. no pod is reclaimed before it has run ``minRuntime``;
2. no tenant at or below its entitlement loses a pod, and none is left below it;
3. no two tenants reclaim from each other in turn: with the entitlements ``e`` and the
   GPU-equivalents ``u`` in use the dispatcher decided on, the potential
   Φ = Σ u² / e strictly falls when the victims' GPUs move to the owed tenant
   (docs/fairness.md, "Why it cannot loop"), and a reclaim is never followed, with no
   pod arriving or ending in between, by one the other way round;
4. no more than ``perHour`` pods are reclaimed in any hour;
5. with reclaim off no pod is evicted by fairgate, whatever waits.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fairshare.cluster.cluster import GpuPod
from fairshare.cluster.pod_evict import EvictOutcome
from fairshare.dispatcher import DispatcherSettings
from fairshare.queue.entitlement import TenantFairness, snapshot_fairness
from fairshare.reclaim import HOUR
from fairshare.sim.simcluster import PodSpec
from tenants.models import FairgateConfig, FairShareSpec, ReclaimSpec
from tenants.resources import SLICES_PER_GPU
from tests.fairshare.simkit import Rig, make_rig

CAPACITY = 8
NAMES = ("ta", "tb", "tc")


@dataclass
class Batch:
    """The pods one reclaim check evicted, with the standings it decided on."""

    standings: dict[str, TenantFairness]
    pods: list[GpuPod] = field(default_factory=list)
    owed: str = ""
    epoch: int = 0

    def taken(self) -> dict[str, float]:
        """GPU-equivalents taken per victim tenant."""
        out: dict[str, float] = {}
        for pod in self.pods:
            out[pod.tenant] = out.get(pod.tenant, 0.0) + pod.slices / SLICES_PER_GPU
        return out


class WatchedEvictions:
    """The cluster's evictions, grouped into batches (one per reclaim check): the queue's
    fairness is read at a batch's first eviction, before any replacement is admitted,
    as the dispatcher read it to decide."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.open: Batch | None = None

    def evict(self, pod: GpuPod) -> EvictOutcome:
        if self.open is None:
            self.open = Batch(dict(snapshot_fairness(self.rig.queue.snapshot()).tenants))
        self.open.pods.append(pod)
        return self.rig.cluster.evict(pod)

    def close(self) -> Batch | None:
        batch, self.open = self.open, None
        return batch


def potential(used: dict[str, float], entitled: dict[str, float]) -> float:
    return sum(used[t] ** 2 / entitled[t] for t in used)


class ReclaimMachine(RuleBasedStateMachine):
    redis_url: str
    reclaimed = 0  # pods reclaimed over every example run (the test is not vacuous)

    def __init__(self) -> None:
        super().__init__()
        self.rig: Rig | None = None
        self.spec: ReclaimSpec | None = None
        self.batches: list[Batch] = []
        self.epoch = 0  # changes when a pod arrives or time passes
        self.names = itertools.count()

    @initialize(
        weights=st.lists(st.integers(1, 3), min_size=2, max_size=3),
        on=st.sampled_from([True, True, True, False]),
        after=st.sampled_from([0, 60, 300]),
        min_runtime=st.sampled_from([0, 300, 1800]),
        per_hour=st.integers(1, 6),
    )
    def setup(self, weights: list[int], on: bool, after: int, min_runtime: int,
              per_hour: int) -> None:
        tenants = {NAMES[i]: {"weight": w, "nominal": {"gpu": CAPACITY}}
                   for i, w in enumerate(weights)}
        self.prefix = f"fairgate:rc{uuid.uuid4().hex[:10]}:"
        rig = make_rig(self.redis_url, tenants, {"gpu": CAPACITY},
                       settings=DispatcherSettings(reclaim_every=0.0, lift_workers=1),
                       prefix=self.prefix)
        if on:
            self.spec = ReclaimSpec.model_validate(
                {"after": after, "minRuntime": min_runtime, "perHour": per_hour})
        platform = rig.config.platform.model_copy(update={"fair_share": FairShareSpec(
            reclaim=self.spec)})
        config = FairgateConfig(platform=platform, quotas=rig.config.quotas)
        rig.dispatcher.config = lambda: config
        self.evictions = WatchedEvictions(rig)
        rig.dispatcher.evictor = self.evictions
        self.rig = rig

    def teardown(self) -> None:
        if self.rig is not None:
            keys = list(self.rig.client.scan_iter(match=f"{self.prefix}*", count=1000))
            if keys:
                self.rig.client.delete(*keys)
            self.rig.client.close()

    # -- driving it ---------------------------------------------------------------------

    def settle(self) -> None:
        """Step the dispatcher until nothing changes, closing a batch after each step."""
        assert self.rig is not None
        for _ in range(1000):
            result = self.rig.dispatcher.step()
            batch = self.evictions.close()
            if batch is not None:
                self.judge(batch)
            if not result.released and not self.rig.cluster.has_changes():
                return
        raise AssertionError("the dispatcher did not settle")

    @rule(tenant=st.sampled_from(NAMES), gpus=st.sampled_from([1, 2, 4, 8]),
          count=st.integers(1, 8), minutes=st.sampled_from([5, 30, 120, 480]),
          preemptible=st.booleans(), gang=st.booleans())
    def arrive(self, tenant: str, gpus: int, count: int, minutes: int, preemptible: bool,
               gang: bool) -> None:
        """``count`` pods (or gangs of 2) of one tenant at once, as a controller makes
        them."""
        assert self.rig is not None
        if tenant not in self.rig.config.quotas:
            return
        size = 2 if gang and gpus <= CAPACITY // 2 else 1
        for _ in range(count):
            n = next(self.names)
            for member in range(size):
                self.rig.cluster.create_pod(PodSpec(
                    namespace=f"{tenant}-ns", name=f"p{n}-{member}", tenant=tenant,
                    pod_class="training", demand={"gpu": gpus}, duration=minutes * 60.0,
                    group=f"g{n}" if size > 1 else None, group_size=size,
                    preemptible=preemptible))
        self.epoch += 1
        self.settle()

    @rule(tenant=st.sampled_from(NAMES), gpus=st.sampled_from([1, 2]))
    def fill(self, tenant: str, gpus: int) -> None:
        """The tenant takes what is free with 8-hour preemptible pods (the case reclaim is
        for: a newcomer would wait for hours)."""
        assert self.rig is not None
        free = CAPACITY - sum(self.rig.cluster.used().values())
        self.arrive(tenant, gpus, max(free // gpus, 1), 480, True, False)

    @rule(seconds=st.sampled_from([30, 120, 600, 1800]))
    def wait(self, seconds: int) -> None:
        assert self.rig is not None
        self.rig.clock.advance_to(self.rig.clock() + seconds)
        self.rig.cluster.advance()
        self.epoch += 1
        self.settle()

    # -- what each reclaim must satisfy -------------------------------------------------

    def judge(self, batch: Batch) -> None:
        assert self.rig is not None
        assert self.spec is not None, "reclaim is off, yet fairgate evicted " + ", ".join(
            str(p.ref) for p in batch.pods)
        notes = self.rig.queue.reclaim_notes() or {}
        evicted = {str(p.ref) for p in batch.pods}
        owed = {r["for_tenant"] for r in notes.get("recent", []) if r["pod"] in evicted}
        assert len(owed) == 1, owed
        batch.owed, batch.epoch = owed.pop(), self.epoch
        s = batch.standings
        o = s[batch.owed]
        assert o.used < o.entitlement, "the owed tenant was not below its entitlement"
        taken = batch.taken()
        for tenant, gpus in taken.items():
            v = s[tenant]
            assert tenant != batch.owed
            assert v.used > v.entitlement, f"{tenant} lost a pod at or below its entitlement"
            assert v.used - gpus >= v.entitlement - 1e-9, f"{tenant} left below its entitlement"
        # the potential falls when the victims' GPUs move to the owed tenant
        involved = [batch.owed, *taken]
        used = {t: s[t].used for t in involved}
        entitled = {t: s[t].entitlement for t in involved}
        moved = dict(used)
        for tenant, gpus in taken.items():
            moved[tenant] -= gpus
        moved[batch.owed] += sum(taken.values())
        assert potential(moved, entitled) < potential(used, entitled)
        if self.batches:
            last = self.batches[-1]
            if last.epoch == batch.epoch:
                assert not (batch.owed in last.taken() and last.owed in taken), \
                    f"{last.owed} and {batch.owed} reclaimed from each other in turn"
        self.batches.append(batch)
        type(self).reclaimed += len(batch.pods)

    @invariant()
    def reclaimed_pods_ran_min_runtime_and_the_rate_holds(self) -> None:
        if self.rig is None:
            return
        history = [h for h in self.rig.cluster.history.values() if h.reclaimed]
        if self.spec is None:
            assert history == [] and self.rig.cluster.reclaims == 0
            return
        for h in history:
            assert h.started is not None and h.ended is not None
            assert h.ended - h.started >= self.spec.min_runtime, \
                f"{h.spec.name} reclaimed after {h.ended - h.started:g}s"
        times = sorted(h.ended for h in history if h.ended is not None)
        for i, start in enumerate(times):
            within = sum(1 for t in times[i:] if t - start < HOUR)
            assert within <= self.spec.per_hour, f"{within} pods reclaimed within an hour"


@pytest.mark.slow
def test_reclaim_keeps_its_promises(redis_url: str) -> None:
    class Machine(ReclaimMachine):
        pass

    Machine.redis_url = redis_url
    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=100, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
    assert Machine.reclaimed > 0, "no example reclaimed anything: the checks held vacuously"
    print(f"pods reclaimed over the examples: {Machine.reclaimed}")
