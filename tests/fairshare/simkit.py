"""Test rig: the real FairQueue and Dispatcher on a SimulatedCluster with a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import redis

from audit import AuditLog
from fairshare.cluster.cluster import GpuPod
from fairshare.dispatcher import Dispatcher, DispatcherSettings
from fairshare.queue.calls import UnknownTenantError
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from fairshare.sim.simcluster import Placement, PodSpec, SimulatedCluster, VirtualClock
from tenants.models import FairgateConfig, PlatformConfig, PodClass, QuotaSpec


def make_config(tenants: dict[str, dict[str, Any]]) -> FairgateConfig:
    """A config from ``{tenant: {weight, ceiling, quota fields...}}`` (ceiling 100 GPU-eq)."""
    platform = PlatformConfig.model_validate({"tenants": {
        name: {"weight": spec.get("weight", 1), "ceiling": {"gpuEquivalents": 100}}
        for name, spec in tenants.items()
    }})
    quotas = {
        name: QuotaSpec.model_validate({k: v for k, v in spec.items() if k != "weight"})
        for name, spec in tenants.items()
    }
    return FairgateConfig(platform=platform, quotas=quotas)


def admit_hook(queue: FairQueue, clock: VirtualClock, config: FairgateConfig) -> Any:
    """What the webhook does at CREATE: ask the queue, gate the pod if it was queued.

    Like the webhook, it pushes the config (without capacity) again when Redis lost it.
    """

    def admit(spec: PodSpec, uid: str) -> Placement:
        now = clock()
        request = PodRequest(
            ticket=uid, tenant=spec.tenant, namespace=spec.namespace, name=spec.name,
            pod_class=spec.pod_class, demand=dict(spec.demand), group=spec.group,
            group_size=spec.group_size if spec.group else 1, submitted_at=now,
            # the webhook's words for a gang of fairgate's own label
            group_source=f"pod group {spec.group}" if spec.group else "",
        )
        try:
            admission = queue.admit(request, now)
        except UnknownTenantError:
            queue.sync_config(config, config.platform.capacity)
            admission = queue.admit(request, now)
        return Placement(uid, admission.band, admission.outcome == "queued")

    return admit


@dataclass
class Rig:
    """Queue, simulated cluster and dispatcher sharing one virtual clock."""

    client: redis.Redis
    queue: FairQueue
    clock: VirtualClock
    cluster: SimulatedCluster
    dispatcher: Dispatcher
    config: FairgateConfig

    def pod(self, name: str, tenant: str = "team-a", pod_class: PodClass = "training",
            demand: dict[str, int] | None = None, duration: float = 100.0,
            group: str | None = None, group_size: int = 1) -> GpuPod:
        """Create a pod as a controller would (admitted through the real queue)."""
        return self.cluster.create_pod(PodSpec(
            namespace=f"{tenant}-ns", name=name, tenant=tenant, pod_class=pod_class,
            demand=demand or {"gpu": 1}, duration=duration, group=group,
            group_size=group_size,
        ))

    def at(self, when: float) -> None:
        """Move the clock to ``when``, finish what is due, and let the dispatcher settle."""
        self.clock.advance_to(when)
        self.cluster.advance()
        self.settle()

    def settle(self) -> None:
        """Step the dispatcher until nothing changes."""
        settle(self.dispatcher, self.cluster, 1000)


class _Changing(Protocol):
    def has_changes(self) -> bool: ...


def settle(dispatcher: Dispatcher, cluster: _Changing, steps: int) -> None:
    """Step ``dispatcher`` until it releases nothing more and ``cluster`` has no change
    left for it; fails after ``steps`` steps."""
    for _ in range(steps):
        result = dispatcher.step()
        if not result.released and not cluster.has_changes():
            return
    raise AssertionError("dispatcher did not settle")


def make_rig(redis_url: str, tenants: dict[str, dict[str, Any]], capacity: dict[str, int],
             settings: DispatcherSettings | None = None, audit: AuditLog | None = None,
             prefix: str = "fairgate:") -> Rig:
    """A rig on ``redis_url`` with the given tenants and cluster capacity."""
    client = redis.Redis.from_url(redis_url)
    queue = FairQueue(client, prefix=prefix)
    clock = VirtualClock(1_000.0)
    config = make_config(tenants)
    cluster = SimulatedCluster(dict(capacity), admit_hook(queue, clock, config), clock)
    dispatcher = Dispatcher(queue, cluster, lambda: config, clock=clock, audit=audit,
                            settings=settings or DispatcherSettings())
    dispatcher.sync(force=True)
    return Rig(client, queue, clock, cluster, dispatcher, config)


# 4 GPUs; team-a (weight 1) alone until team-b (weight 3) arrives at t=200 with far more
# work than fits; team-c (weight 2) never sends a pod. 1-GPU pods of 100 s.
JOIN_TRACE = (
    "capacity: {gpu: 4}\n"
    "tenants:\n"
    "  team-a: {weight: 1, nominal: {gpu: 4}}\n"
    "  team-b: {weight: 3, nominal: {gpu: 4}}\n"
    "  team-c: {weight: 2, nominal: {gpu: 4}}\n"
    "arrivals:\n"
    "  - {at: 0, tenant: team-a, class: training, demand: {gpu: 1}, duration: 100, count: 40}\n"
    "  - {at: 200, tenant: team-b, class: training, demand: {gpu: 1}, duration: 100, count: 40}\n"
    "horizon: 620\n"
)
