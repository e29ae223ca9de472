"""Prometheus metrics of the dispatcher (names follow Kueue's, with a ``fairgate_`` prefix).

Contract: every :class:`DispatcherMetrics` owns its own ``CollectorRegistry``.

- ``fairgate_pending_workloads{class, tenant}``: gauge, pods queued behind the gate
  (Kueue: ``kueue_pending_workloads``).
- ``fairgate_admission_wait_time_seconds{class, tenant}``: histogram of the time from a
  pod's creation to its release (Kueue: ``kueue_admission_wait_time_seconds``).
- ``fairgate_admitted_workloads_total{class, tenant}``: counter of released pods
  (Kueue: ``kueue_admitted_workloads_total``).
- ``fairgate_tenant_resource_usage{tenant, resource}``: gauge, non-borrowed usage in
  resource units (Kueue: ``kueue_cluster_queue_resource_usage``);
  ``fairgate_tenant_nominal_quota{tenant, resource}`` (Kueue:
  ``kueue_cluster_queue_nominal_quota``); ``fairgate_tenant_borrowing_limit{tenant}`` and
  ``fairgate_tenant_borrowed{tenant}`` in GPU-equivalents (Kueue:
  ``kueue_cluster_queue_borrowing_limit``).
- Fairness (one computation, :func:`fairshare.queue.entitlement.fairness`, shared with
  ``fairgate status``): ``fairgate_tenant_weighted_share{tenant}``, GPU-equivalents used
  per unit of weight (all bands); ``fairgate_tenant_fair_share{tenant}``, the tenant's
  entitlement in GPU-equivalents (each placement class's capacity water-filled by weight
  among tenants with demand in it, each capped at its usage + queued demand there and
  given at least its inference usage + queued demand there, which goes first; summed
  over classes and capped at nominal + borrow limit; 0 without demand);
  ``fairgate_fairness_jain_index``,
  :func:`~fairshare.queue.entitlement.entitled_jain`: Jain's index of usage /
  entitlement over the tenants entitled to something (1 = every one holds exactly its
  fair share), NaN when not defined (fewer than two such tenants, or no usage).
- ``fairgate_cluster_capacity{resource}``: GPU capacity the queue dispatches against, per
  capacity key (a resource in one placement class, e.g. ``gpu``, ``mig-1g.5gb#single``).
- ``fairgate_gate_lifts_total{outcome}``: gate lifts by
  :class:`~fairshare.cluster.cluster.LiftOutcome`.
- ``fairgate_admission_attempt_duration_seconds``: one dispatch pass (Kueue:
  ``kueue_admission_attempt_duration_seconds``).
- ``fairgate_reconcile_total{result}``, ``fairgate_expired_reservations_total``.
- Unschedulable releases: ``fairgate_unschedulable_releases_total{class, tenant}``,
  counter of released pods caught Unschedulable past ``--unschedulable-grace``;
  ``fairgate_unschedulable_pods``, gauge of those caught now (not bound, not gone yet);
  ``fairgate_unschedulable_withheld_capacity{resource}``, the capacity withheld for them.
- Cost (metered by the dispatcher while pods run: from when it sees a pod Running to
  its release, in steps of the status pass; the exact bill is ``fairgate report``):
  ``fairgate_tenant_gpu_seconds_total{tenant, class, band, resource}`` in GPU-equivalent
  seconds (slices / 7), ``fairgate_tenant_cost_total{tenant, currency}`` at the prices of
  ``pricing`` in platform.yaml, ``fairgate_preemptions_total{tenant}`` (pods that ran and
  were preempted by the scheduler, or evicted by fairgate to give borrowed capacity
  back to inference) and ``fairgate_preempted_gpu_seconds_total{tenant}``
  (the GPU-equivalent seconds they had run: lost work); the same for reclaim
  (``fairShare.reclaim``): ``fairgate_reclaims_total{tenant}``, pods fairgate evicted
  from a tenant for another one owed its fair share, and
  ``fairgate_reclaimed_gpu_seconds_total{tenant}``. Like every series of the dispatcher's
  ``/metrics``, they name the tenant (the webhook's ``/metrics`` does not unless told).
- Budgets (set on the dispatcher's budget pass, for tenants with ``budget`` in
  platform.yaml; others have no series): ``fairgate_tenant_budget_spent_ratio{tenant}``,
  this month's spend / monthly budget (0.8: warning, 1: exhausted);
  ``fairgate_tenant_budget_spent{tenant, currency}`` and
  ``fairgate_tenant_budget{tenant, currency}``, the amounts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairshare.queue.budget import BudgetStatus
from fairshare.queue.entitlement import snapshot_fairness
from fairshare.queue.model import QueueSnapshot
from tenants.models import CLASSES
from tenants.resources import SLICES_PER_GPU, base_of, slices_of

# Inference waits should be sub-second; training waits can be hours.
_WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600,
                 86400)
_PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class DispatcherMetrics:
    """The dispatcher's collectors, registered in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Register the collectors in ``registry`` (a fresh one by default)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._series: dict[Gauge, set[tuple[str, ...]]] = {}
        r = self.registry
        self.pending = Gauge("fairgate_pending_workloads",
                             "GPU pods waiting behind the fairgate.io/queue gate.",
                             ["class", "tenant"], registry=r)
        self.wait = Histogram("fairgate_admission_wait_time_seconds",
                              "Time from a pod's creation to the release of its gate.",
                              ["class", "tenant"], buckets=_WAIT_BUCKETS, registry=r)
        self.admitted = Counter("fairgate_admitted_workloads_total",
                                "Gated pods released by the dispatcher.",
                                ["class", "tenant"], registry=r)
        self.usage = Gauge("fairgate_tenant_resource_usage",
                           "Non-borrowed usage per resource, in units of the resource.",
                           ["tenant", "resource"], registry=r)
        self.nominal = Gauge("fairgate_tenant_nominal_quota",
                             "Nominal quota per resource, in units of the resource.",
                             ["tenant", "resource"], registry=r)
        self.borrow_limit = Gauge("fairgate_tenant_borrowing_limit",
                                  "How much a tenant may borrow, in GPU-equivalents.",
                                  ["tenant"], registry=r)
        self.borrowed = Gauge("fairgate_tenant_borrowed",
                              "What a tenant borrows now, in GPU-equivalents.",
                              ["tenant"], registry=r)
        self.share = Gauge("fairgate_tenant_weighted_share",
                           "GPU-equivalents used (all bands) per unit of weight.",
                           ["tenant"], registry=r)
        self.fair_share = Gauge(
            "fairgate_tenant_fair_share",
            "Entitlement in GPU-equivalents: each placement class's capacity water-filled "
            "by weight among tenants with demand in it, each capped at usage + queued, "
            "summed over classes and capped at nominal + borrow limit (0 without demand).",
            ["tenant"], registry=r)
        self.jain = Gauge(
            "fairgate_fairness_jain_index",
            "Jain's index of usage / entitlement over tenants entitled to something "
            "(1 = each holds exactly its fair share; 1/n = one holds everything).",
            registry=r)
        self.capacity = Gauge("fairgate_cluster_capacity",
                              "GPU capacity the queue dispatches against, per resource.",
                              ["resource"], registry=r)
        self.lifts = Counter("fairgate_gate_lifts_total",
                             "Attempts to lift the fairgate.io/queue gate, by outcome.",
                             ["outcome"], registry=r)
        self.attempt = Histogram("fairgate_admission_attempt_duration_seconds",
                                 "Duration of one dispatch pass (Redis script and gate lifts).",
                                 buckets=_PASS_BUCKETS, registry=r)
        self.reconciles = Counter("fairgate_reconcile_total",
                                  "Rebuilds of queue and usage from the cluster, by result.",
                                  ["result"], registry=r)
        self.primary_changes = Counter(
            "fairgate_redis_primary_changes_total",
            "Times another Redis primary answered than at the step before (a failover or "
            "a restart); each is followed by a reconcile.", registry=r)
        self.twins = Counter(
            "fairgate_ticket_twins_total",
            "Pods found presenting a ticket another pod owns (copied fairgate.io/* stamps) "
            "that may run, by tenant: each is counted against its tenant as a pod of its "
            "own.", ["tenant"], registry=r)
        self.overruns = Counter(
            "fairgate_dra_overruns_total",
            "Pods whose DRA claims were allocated more devices than they were admitted for, "
            "by tenant: each is charged what it holds.", ["tenant"], registry=r)
        self.expired = Counter("fairgate_expired_reservations_total",
                               "Reservations freed because no pod confirmed them in time.",
                               registry=r)
        self.unschedulable = Counter(
            "fairgate_unschedulable_releases_total",
            "Released pods the scheduler reported Unschedulable for longer than the grace.",
            ["class", "tenant"], registry=r)
        self.unschedulable_pods = Gauge(
            "fairgate_unschedulable_pods",
            "Released pods caught Unschedulable that are not bound or gone yet.", registry=r)
        self.withheld = Gauge(
            "fairgate_unschedulable_withheld_capacity",
            "Capacity withheld from the queue for caught unschedulable releases.",
            ["resource"], registry=r)
        self.gpu_seconds = Counter("fairgate_tenant_gpu_seconds_total",
                                   "GPU-equivalent seconds (slices / 7) run by a tenant's pods.",
                                   ["tenant", "class", "band", "resource"], registry=r)
        self.cost = Counter("fairgate_tenant_cost_total",
                            "Cost of a tenant's GPU-time at the platform's prices.",
                            ["tenant", "currency"], registry=r)
        self.preemptions = Counter("fairgate_preemptions_total",
                                   "Pods that ran and were preempted: by the scheduler, or "
                                   "evicted by fairgate to give borrowed capacity back to "
                                   "inference.",
                                   ["tenant"], registry=r)
        self.preempted_gpu_seconds = Counter(
            "fairgate_preempted_gpu_seconds_total",
            "GPU-equivalent seconds preempted pods had run (lost work).",
            ["tenant"], registry=r)
        self.reclaims = Counter("fairgate_reclaims_total",
                                "Pods of a tenant evicted by reclaim (fairShare.reclaim).",
                                ["tenant"], registry=r)
        self.reclaimed_gpu_seconds = Counter(
            "fairgate_reclaimed_gpu_seconds_total",
            "GPU-equivalent seconds reclaimed pods had run (lost work).",
            ["tenant"], registry=r)

        self.budget_ratio = Gauge(
            "fairgate_tenant_budget_spent_ratio",
            "This calendar month's spend (UTC) / the tenant's monthly budget.",
            ["tenant"], registry=r)
        self.budget_spent = Gauge("fairgate_tenant_budget_spent",
                                  "This calendar month's spend (UTC) of a tenant with a budget.",
                                  ["tenant", "currency"], registry=r)
        self.budget = Gauge("fairgate_tenant_budget", "A tenant's monthly budget.",
                            ["tenant", "currency"], registry=r)

    def observe_budgets(self, statuses: Iterable[BudgetStatus]) -> None:
        """Set the budget gauges (tenants without a budget now are removed)."""
        ratio: set[tuple[str, ...]] = set()
        amounts: set[tuple[str, ...]] = set()
        for status in statuses:
            self.budget_ratio.labels(status.tenant).set(status.ratio)
            self.budget_spent.labels(status.tenant, status.currency).set(status.spent)
            self.budget.labels(status.tenant, status.currency).set(status.monthly)
            ratio.add((status.tenant,))
            amounts.add((status.tenant, status.currency))
        self._drop_others(self.budget_ratio, ratio)
        self._drop_others(self.budget_spent, amounts)
        self._drop_others(self.budget, amounts)

    def observe_gpu_time(self, tenant: str, pod_class: str, band: str,
                         demand: Mapping[str, int], seconds: float, gpu_hour_price: float,
                         currency: str) -> None:
        """Count ``seconds`` of a pod with ``demand`` running, and their cost."""
        if seconds <= 0:
            return
        slices = 0
        for resource, count in demand.items():
            slices += slices_of(resource) * count
            self.gpu_seconds.labels(tenant, pod_class, band, base_of(resource)).inc(
                slices_of(resource) * count * seconds / SLICES_PER_GPU)
        self.cost.labels(tenant, currency).inc(
            slices * seconds / SLICES_PER_GPU / 3600 * gpu_hour_price)

    def observe_preemption(self, tenant: str, gpu_seconds: float) -> None:
        """Count one preempted pod that had run ``gpu_seconds`` GPU-equivalent seconds."""
        self.preemptions.labels(tenant).inc()
        self.preempted_gpu_seconds.labels(tenant).inc(gpu_seconds)

    def observe_reclaim(self, tenant: str, gpu_seconds: float) -> None:
        """Count one pod reclaimed from ``tenant`` that had run ``gpu_seconds``
        GPU-equivalent seconds."""
        self.reclaims.labels(tenant).inc()
        self.reclaimed_gpu_seconds.labels(tenant).inc(gpu_seconds)

    def observe_tenants(self, snapshot: QueueSnapshot) -> None:
        """Set the per-tenant and fairness gauges from a queue snapshot; series of
        tenants (or resources) no longer listed are removed. A scrape never sees a gauge
        emptied."""
        seen: dict[Gauge, set[tuple[str, ...]]] = {}
        fair = snapshot_fairness(snapshot)

        def put(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
            gauge.labels(*labels).set(value)
            seen.setdefault(gauge, set()).add(labels)

        for status in snapshot.tenants:
            tenant = status.tenant
            for pod_class in CLASSES:
                put(self.pending, (pod_class, tenant), status.queued.get(pod_class, 0))
            for resource in set(status.nominal) | set(status.used):
                put(self.nominal, (tenant, resource), status.nominal.get(resource, 0))
                put(self.usage, (tenant, resource), status.used.get(resource, 0))
            put(self.borrow_limit, (tenant,), status.borrow_limit_slices / SLICES_PER_GPU)
            put(self.borrowed, (tenant,), status.borrowed_slices / SLICES_PER_GPU)
            put(self.share, (tenant,), fair.tenants[tenant].weighted_share)
            put(self.fair_share, (tenant,), fair.tenants[tenant].entitlement)
        self.jain.set(math.nan if fair.jain_index is None else fair.jain_index)
        for gauge in (self.pending, self.usage, self.nominal, self.borrow_limit, self.borrowed,
                      self.share, self.fair_share):
            self._drop_others(gauge, seen.get(gauge, set()))

    def observe_capacity(self, capacity: Mapping[str, int]) -> None:
        """Set the capacity gauge (resources no longer present are removed)."""
        for resource, n in capacity.items():
            self.capacity.labels(resource).set(n)
        self._drop_others(self.capacity, {(resource,) for resource in capacity})

    def observe_unschedulable(self, pods: int, withheld: Mapping[str, int]) -> None:
        """Set the caught-unschedulable gauges (resources no longer withheld are removed)."""
        self.unschedulable_pods.set(pods)
        for resource, n in withheld.items():
            self.withheld.labels(resource).set(n)
        self._drop_others(self.withheld, {(resource,) for resource in withheld})

    def _drop_others(self, gauge: Gauge, keep: set[tuple[str, ...]]) -> None:
        """Remove the series of ``gauge`` this object set before and not now."""
        for labels in self._series.get(gauge, set()) - keep:
            gauge.remove(*labels)
        self._series[gauge] = keep

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)

