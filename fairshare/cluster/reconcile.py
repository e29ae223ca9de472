"""Rebuild the queue's usage and backlog from the pods that exist in the cluster.

Contract: the cluster is the truth (docs/reference.md, "The queue"): a pod still carrying the
``fairgate.io/queue`` gate is queued, a released pod that has not ended holds usage.
:func:`cluster_truth` turns a list of :class:`~fairshare.cluster.cluster.GpuPod` into the
records :meth:`FairQueue.rebuild` takes; :func:`reconcile` applies them in one atomic
script. Queue order is the pods' creation time (then ticket), which is the
``submitted_at`` the webhook queued them with, so after a Redis flush the rebuilt queue
and usage equal those before (invariant 6). Pods that cannot be represented (a malformed
annotation someone forged) are skipped and counted, and so are twins: pods carrying a
ticket an older pod owns (copied stamps, invariant 7) that hold nothing (gated); a twin
that holds capacity is counted as its own pod (:func:`twin_ticket`). A ResourceClaim
that several pods of a tenant share is charged to one of them (:mod:`admission.sharing`):
the others are counted without it, and one that is then charged nothing (all its GPUs
are such a claim) is a *rider*, held by no ticket. The caller must have synced the
config into the queue first (``rebuild`` keeps config, a flushed Redis has none).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from admission.sharing import charged, exemptions, payers
from audit.usage import Riding
from fairshare.cluster.cluster import GpuPod
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GatedPod, InvalidRequestError, PodRequest, RunningPod
from tenants.resources import ResourceCounts

log = logging.getLogger("fairgate.reconcile")


@dataclass(frozen=True)
class ClusterTruth:
    """What the cluster says: pods holding GPUs, pods gated, pods skipped; the
    :func:`ticket_owners` split they were taken from; and the riders (pods charged
    nothing: their GPUs are a shared claim another pod that holds capacity pays)."""

    running: list[RunningPod]
    gated: list[GatedPod]
    skipped: int
    owners: dict[str, GpuPod]
    twins: list[GpuPod]
    riders: list[GpuPod]


@dataclass(frozen=True)
class ReconcileSummary:
    """How many pods a reconcile put back as usage and as queued, and how many it skipped;
    ``owners`` and ``twins`` are the :func:`ticket_owners` split of the pods it was given,
    ``riders`` the pods it charged nothing (:class:`ClusterTruth`)."""

    running: int
    gated: int
    skipped: int
    owners: dict[str, GpuPod]
    twins: list[GpuPod]
    riders: list[GpuPod]


def twin_ticket(pod: GpuPod) -> str:
    """The ticket a twin that holds capacity is counted under (its own, by its uid): a
    pod runs counted whatever ticket it presents, and never as its ticket's owner."""
    return f"{pod.ticket[:40]}.twin.{pod.uid}"


def ticket_owners(
    pods: Iterable[GpuPod], bound: Mapping[str, str] | None = None
) -> tuple[dict[str, GpuPod], list[GpuPod]]:
    """Which pod owns each ticket, and the twins that present a ticket they do not own.

    Pods that have ended (:attr:`GpuPod.ended`) are left out. A ticket belongs to
    one pod: when several carry it (copied stamps), the one ``bound`` (ticket -> uid:
    the pods the dispatcher saw own their tickets) names owns it, else the oldest
    (creation time, then uid: a copy made within the same second may be older).
    """
    owners: dict[str, GpuPod] = {}
    twins: list[GpuPod] = []
    known = bound or {}
    for pod in sorted(pods, key=lambda p: (known.get(p.ticket, p.uid) != p.uid, p.created,
                                           p.uid)):
        if pod.ended:
            continue
        if pod.ticket in owners:
            twins.append(pod)
        else:
            owners[pod.ticket] = pod
    return owners, twins


def pod_charges(pods: Sequence[GpuPod]) -> dict[str, ResourceCounts]:
    """Pod uid -> what each of ``pods`` (the live pods, all of them) is charged: its
    demand less the shared claims another of them pays
    (:func:`admission.sharing.exemptions`; empty for a rider)."""
    exempt = exemptions(pod.sharer for pod in pods if pod.shared)
    return {pod.uid: charged(pod.demand, pod.shared, exempt.get(pod.uid, ()))
            if pod.uid in exempt else dict(pod.demand) for pod in pods}


def riding(pods: Sequence[GpuPod]) -> dict[str, dict[str, Riding]]:
    """Pod uid -> the shared claims it names that another of ``pods`` (the live pods)
    pays (:func:`admission.sharing.payers`): claim uid -> its name (None when the pod's
    stamp does not say) and ``namespace/name`` of the pod that pays it. Pods riding on
    nothing are left out."""
    sharers = [pod for pod in pods if pod.shared]
    paying = payers(pod.sharer for pod in sharers)
    refs = {pod.uid: str(pod.ref) for pod in sharers}
    out: dict[str, dict[str, Riding]] = {}
    for pod in sharers:
        rides = {claim: Riding(pod.claim_names.get(claim), refs[payer]) for claim in pod.shared
                 if (payer := paying.get((pod.tenant, claim))) not in (None, pod.uid)}
        if rides:
            out[pod.uid] = rides
    return out


def cluster_truth(pods: Iterable[GpuPod], bound: Mapping[str, str] | None = None
                  ) -> ClusterTruth:
    """Usage and queue records for the owners of ``pods``' tickets (:func:`ticket_owners`)
    and for the twins that hold capacity (:func:`twin_ticket`); gated twins are skipped
    and counted. Each is charged what :func:`pod_charges` says; one charged nothing is a
    rider, with no record."""
    running: list[RunningPod] = []
    gated: list[GatedPod] = []
    riders: list[GpuPod] = []
    owners, twins = ticket_owners(pods, bound)
    skipped = 0
    counted = [replace(pod, ticket=twin_ticket(pod)) for pod in twins if pod.holds_capacity]
    for pod in twins:
        if not pod.holds_capacity:
            skipped += 1
            log.warning("pod %s skipped by reconcile: its ticket belongs to an older pod",
                        pod.ref)
    accounted = [*owners.values(), *counted]
    charges = pod_charges(accounted)
    for listed in accounted:
        demand = charges[listed.uid]
        if not demand:
            riders.append(listed)
            continue
        pod = replace(listed, demand=demand)
        try:
            if pod.gated:
                request = PodRequest(
                    ticket=pod.ticket, tenant=pod.tenant, namespace=pod.ref.namespace,
                    name=pod.ref.name, pod_class=pod.pod_class, demand=dict(pod.demand),
                    group=pod.group, group_size=pod.group_size if pod.group else 1,
                    submitted_at=pod.created, run_seconds=pod.run_seconds,
                )
                gated.append(GatedPod(request, pod.band, pod.uid))
            else:
                running.append(RunningPod(
                    ticket=pod.ticket, tenant=pod.tenant, namespace=pod.ref.namespace,
                    name=pod.ref.name, pod_class=pod.pod_class, band=pod.band,
                    demand=dict(pod.demand), uid=pod.uid,
                    group=pod.group, group_size=pod.group_size if pod.group else 1,
                    run_seconds=pod.run_seconds,
                ))
        except InvalidRequestError as error:
            skipped += 1
            log.warning("pod %s skipped by reconcile: %s", pod.ref, error)
    return ClusterTruth(running, gated, skipped, owners, twins, riders)


def reconcile(
    queue: FairQueue, pods: Iterable[GpuPod], listed_at: float | None = None,
    bound: Mapping[str, str] | None = None, started: Mapping[str, float] | None = None,
) -> ReconcileSummary:
    """Replace the queue's usage and backlog with what ``pods`` say, and free the tickets
    of the riders (pods charged nothing: a shared claim another pod pays), atomically.

    ``listed_at`` is when ``pods`` were listed (taken *before* the list call, on the
    clock the webhook and dispatcher use): reservations and dispatches made shortly
    before or after it are kept (see :meth:`FairQueue.rebuild`). ``None`` only when
    nothing can have been reserved or dispatched since the listing. ``started``:
    ticket -> when the caller saw its pod start running (a run's beginning, for the
    tickets Redis lost).
    """
    truth = cluster_truth(pods, bound)
    began = started or {}
    running = [replace(pod, started_at=began.get(pod.ticket)) for pod in truth.running]
    # a rider is charged nothing, also when its ticket was released lately (the rebuild
    # keeps other such in-flight tickets): the charge moved to another pod of the claim
    queue.rebuild(running, truth.gated, listed_at, [rider.ticket for rider in truth.riders])
    return ReconcileSummary(len(truth.running), len(truth.gated), truth.skipped,
                            truth.owners, truth.twins, truth.riders)
