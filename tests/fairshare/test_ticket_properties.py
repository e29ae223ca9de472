"""Usage follows what runs, whatever tickets pods present (invariant 7), as a property.

Random sequences of pod CREATEs go through the queue calls the webhooks make (``admit``
at mutation under the admitted name, ``bind`` at validation with the pod's uid and final
name), copies of one ticket interleaved before any is stored, then through the real
:class:`~fairshare.dispatcher.Dispatcher` (confirm, release, twins, reconcile) on a
cluster the test drives pod by pod: names and generateNames of 1 to 253 characters,
copied stamps, twins that got past the webhooks, deletes and recreates under one name.
After every step the usage the queue charges each tenant (all bands) equals the GPUs of that
tenant's pods that are ungated and unfinished: a twin counts as a pod of its own, no
pod is dropped and none is counted twice.

Not modelled: a pod the API server refuses after both webhooks passed it (its
reservation lives until the TTL: ``test_queue.py::
test_a_claimed_but_never_stored_pod_still_frees_its_reservation``), so explicit names
never collide with a live pod.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace

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

from admission.pods import admitted_name
from fairshare.cluster.cluster import (
    CapacityReport,
    ChangeKind,
    ClusterChange,
    EventType,
    GpuPod,
    LiftOutcome,
    PodRef,
)
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.calls import TicketConflictError, UnmintedTicketError
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.sim.simcluster import PostedEvent, VirtualClock
from tenants.models import GENERATED_SUFFIX, PriorityBand
from tests.fairshare.simkit import make_config, settle

TENANTS = ("a", "b")
CAPACITY = {"gpu": 6}
CONFIG = make_config({
    t: {"nominal": {"gpu": 3}, "borrowLimit": {"gpuEquivalents": 1}} for t in TENANTS
})
DIGITS = string.digits + string.ascii_lowercase


class DrivenCluster:
    """A :class:`~fairshare.cluster.cluster.Cluster` whose pods the test stores, runs, finishes
    and deletes one by one; lifting a gate only removes it."""

    def __init__(self) -> None:
        self.pods: dict[str, GpuPod] = {}  # uid -> pod
        self.events: list[PostedEvent] = []
        self._changes: list[ClusterChange] = []

    def list_pods(self) -> list[GpuPod]:
        return list(self.pods.values())

    def changes(self, timeout: float) -> list[ClusterChange]:
        batch, self._changes = self._changes, []
        return batch

    def capacity(self) -> dict[str, int]:
        return dict(CAPACITY)

    def capacity_report(self) -> CapacityReport:
        return CapacityReport(self.capacity())

    def lift_gate(self, pod: GpuPod) -> LiftOutcome:
        known = self.pods.get(pod.uid)
        if known is None:
            return LiftOutcome.GONE
        if not known.gated:
            return LiftOutcome.NOT_GATED
        self.put(replace(known, gated=False))
        return LiftOutcome.LIFTED

    def post_event(self, pod: GpuPod, reason: str, message: str, type_: EventType) -> None:
        self.events.append(PostedEvent(0.0, pod.ref, reason, message, type_))

    def put(self, pod: GpuPod) -> None:
        """Store ``pod`` (new, or changed) and report it like a watch."""
        self.pods[pod.uid] = pod
        self._changes.append(ClusterChange(ChangeKind.POD, pod))

    def delete(self, uid: str) -> None:
        pod = self.pods.pop(uid)
        self._changes.append(ClusterChange(ChangeKind.POD_GONE, pod))

    def has_changes(self) -> bool:
        return bool(self._changes)


@dataclass
class Create:
    """One pod CREATE on its way through the webhooks, before the pod is stored."""

    uid: str
    tenant: str
    metadata: dict[str, str]  # name or generateName
    final_name: str  # what the API server names the pod before validation
    ticket: str
    gpus: int
    presented: bool = False  # the manifest carries the ticket (chosen or copied)
    gated: bool = False
    band: PriorityBand = "training"
    refused: bool = False
    admitted: bool = False
    bound: bool = False


def _base36(n: int, width: int = 0) -> str:
    out = ""
    while n or not out:
        n, d = divmod(n, 36)
        out = DIGITS[d] + out
    return out.rjust(width, "0")


class TicketMachine(RuleBasedStateMachine):
    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.client.flushall()
        self.clock = VirtualClock(1_000.0)
        self.queue = FairQueue(self.client)
        self.cluster = DrivenCluster()
        self.dispatcher = Dispatcher(self.queue, self.cluster, lambda: CONFIG,
                                     clock=self.clock,
                                     settings=DispatcherSettings(lift_workers=1))
        self.count = 0
        self.tickets: list[str] = []  # every ticket a pod was created with
        self.via_webhooks: set[str] = set()  # uids of pods both webhooks let through

    # -- helpers -------------------------------------------------------------------

    def _next(self) -> int:
        self.count += 1
        return self.count

    def name_for(self, length: int, generate: bool) -> tuple[dict[str, str], str]:
        """Metadata of a new pod with a name (unique) or a generateName of ``length``
        characters, and the pod's final name."""
        tag = _base36(self._next())
        if generate:
            prefix = "g" * length
            return {"generateName": prefix}, self.generated(prefix)
        name = ("n" * length)[: max(0, length - len(tag))] + tag
        return {"name": name}, name

    def generated(self, prefix: str) -> str:
        """The name the API server gives a pod of ``generateName`` ``prefix``."""
        cut = admitted_name("", prefix)[:-1]
        return cut + _base36(self._next(), GENERATED_SUFFIX)

    def live(self, index: int) -> GpuPod | None:
        pods = sorted(self.cluster.pods.values(), key=lambda p: p.uid)
        return pods[index % len(pods)] if pods else None

    def copied_ticket(self, index: int) -> str | None:
        return self.tickets[index % len(self.tickets)] if self.tickets else None

    def mutate(self, create: Create) -> None:
        """The mutating webhook's queue call (``admit`` under the admitted name)."""
        request = PodRequest(
            ticket=create.ticket, tenant=create.tenant, namespace=f"ns-{create.tenant}",
            name=admitted_name(create.metadata.get("name", ""),
                               create.metadata.get("generateName", "")), pod_class="training",
            demand={"gpu": create.gpus}, submitted_at=self.clock(),
        )
        try:
            admission = self.queue.admit(request, self.clock(), presented=create.presented)
        except (TicketConflictError, UnmintedTicketError):
            create.refused = True
            return
        create.admitted = True
        create.gated = admission.outcome == "queued"
        create.band = admission.band

    def validate(self, create: Create) -> None:
        """The validating webhook's queue call (``bind`` with uid and final name)."""
        try:
            self.queue.bind(create.ticket, create.uid, f"ns-{create.tenant}",
                            create.final_name)
        except TicketConflictError:
            create.refused = True
            return
        create.bound = True

    def store(self, create: Create, gated: bool | None = None) -> None:
        """The API server stores the pod (``gated``: a pod that skipped the webhooks)."""
        self.cluster.put(GpuPod(
            ref=PodRef(f"ns-{create.tenant}", create.final_name), uid=create.uid,
            ticket=create.ticket, tenant=create.tenant, pod_class="training",
            band=create.band, demand={"gpu": create.gpus}, group=None, group_size=1,
            phase="Pending", gated=create.gated if gated is None else gated, node=None,
            created=self.clock(),
        ))
        self.tickets.append(create.ticket)
        if gated is None:
            self.via_webhooks.add(create.uid)

    def settle(self) -> None:
        """Step the dispatcher until it has seen every change and released nothing more."""
        settle(self.dispatcher, self.cluster, 100)

    def creates(self, tenant: str, copies: int, length: int, generate: bool,
                ticket: str | None) -> list[Create]:
        """``copies`` CREATEs of one manifest (one tenant, one name or generateName,
        ``ticket`` if it carries one: else each gets its own, the request uid)."""
        metadata, final = self.name_for(length, generate)
        made = []
        for i in range(copies):
            uid = f"uid-{self._next()}"
            if i and generate:
                final = self.generated(metadata["generateName"])
            made.append(Create(uid, tenant, metadata, final, ticket or f"tk-{uid}",
                               gpus=1 + len(made) % 2, presented=ticket is not None))
        return made

    # -- rules ---------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.dispatcher.sync(force=True)
        self.settle()

    @rule(tenant=st.sampled_from(TENANTS), copies=st.integers(1, 4),
          length=st.integers(1, 253), generate=st.booleans(),
          copy=st.none() | st.integers(0, 10_000), order=st.randoms(use_true_random=False))
    def create_concurrently(self, tenant: str, copies: int, length: int, generate: bool,
                            copy: int | None, order: object) -> None:
        """Copies of one manifest (a chosen or copied ticket, or none) created at once:
        each is mutated then validated, all interleaved, before any is stored; the
        dispatcher runs after the API server stored what both webhooks let through."""
        ticket = self.copied_ticket(copy) if copy is not None else None
        made = self.creates(tenant, copies, length, generate, ticket)
        if ticket is None and copies > 1:  # the manifest carries a chosen ticket
            ticket = f"chosen-{self._next()}"
            for create in made:
                create.ticket, create.presented = ticket, True
        steps = [(i, phase) for i in range(len(made)) for phase in (0, 1)]
        order.shuffle(steps)  # type: ignore[attr-defined]
        done: dict[int, int] = {}
        for i, _ in steps:  # each CREATE's mutation comes before its validation
            create, phase = made[i], done.get(i, 0)
            done[i] = phase + 1
            if create.refused:
                continue
            if phase == 0:
                self.mutate(create)
            else:
                self.validate(create)
        for create in made:
            if not create.refused:
                self.store(create)
        self.settle()

    @rule(index=st.integers(0, 10_000), gated=st.booleans(), length=st.integers(1, 253),
          generate=st.booleans())
    def twin_past_the_webhooks(self, index: int, gated: bool, length: int,
                               generate: bool) -> None:
        """A pod stored with another pod's stamps while the webhooks were bypassed."""
        source = self.live(index)
        if source is None:
            return
        made = self.creates(source.tenant, 1, length, generate, source.ticket)[0]
        self.store(made, gated=gated)
        self.settle()

    @rule(index=st.integers(0, 10_000))
    def run(self, index: int) -> None:
        pod = self.live(index)
        if pod is not None and not pod.gated and pod.phase == "Pending":
            self.cluster.put(replace(pod, phase="Running", node="node-1"))
            self.settle()

    @rule(index=st.integers(0, 10_000), failed=st.booleans())
    def finish(self, index: int, failed: bool) -> None:
        pod = self.live(index)
        if pod is not None and not pod.gated and not pod.finished:
            self.cluster.put(replace(pod, phase="Failed" if failed else "Succeeded"))
            self.settle()

    @rule(index=st.integers(0, 10_000))
    def delete(self, index: int) -> None:
        pod = self.live(index)
        if pod is not None:
            self.cluster.delete(pod.uid)
            self.settle()

    @rule(index=st.integers(0, 10_000), keep_ticket=st.booleans())
    def delete_and_recreate(self, index: int, keep_ticket: bool) -> None:
        """A pod deleted and created again under its name (from its YAML: with its
        ticket, or without), before the dispatcher saw the deletion."""
        pod = self.live(index)
        if pod is None:
            return
        self.cluster.delete(pod.uid)
        uid = f"uid-{self._next()}"
        create = Create(uid, pod.tenant, {"name": pod.ref.name}, pod.ref.name,
                        pod.ticket if keep_ticket else f"tk-{uid}", gpus=sum(pod.demand.values()))
        self.mutate(create)
        if not create.refused:
            self.validate(create)
        if not create.refused:
            self.store(create)
        self.settle()

    @rule(seconds=st.sampled_from([1.0, 11.0, 31.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance_to(self.clock() + seconds)
        self.settle()

    # -- the property ----------------------------------------------------------------

    @invariant()
    def usage_is_what_runs(self) -> None:
        running: dict[str, int] = {}
        for pod in self.cluster.pods.values():
            if pod.holds_capacity:
                running[pod.tenant] = running.get(pod.tenant, 0) + pod.slices
        charged = {s.tenant: s.used_slices for s in self.queue.tenant_status()}
        for tenant in TENANTS:
            assert charged.get(tenant, 0) == running.get(tenant, 0), (
                tenant, charged, running, sorted(self.cluster.pods.values(), key=str))

    @invariant()
    def one_ticket_one_webhook_pod(self) -> None:
        """No two unfinished pods that both webhooks let through share a ticket (twins
        only come from bypassing them)."""
        holders: dict[str, list[str]] = {}
        for pod in self.cluster.pods.values():
            if pod.uid in self.via_webhooks and not pod.ended:
                holders.setdefault(pod.ticket, []).append(pod.uid)
        assert all(len(uids) == 1 for uids in holders.values()), holders


@pytest.mark.slow
def test_usage_follows_the_pods_whatever_tickets_they_present(
        redis_client: redis.Redis) -> None:
    class Machine(TicketMachine):
        client = redis_client

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=150, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
