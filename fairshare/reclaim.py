"""Reclaim: which running pods to evict for a tenant owed capacity (pure; no I/O).

Contract (``fairShare.reclaim`` of ``platform.yaml``, :class:`tenants.models.ReclaimSpec`;
docs/fairness.md, "Reclaim"):
- :func:`choose` gets the owed head (:class:`Owed`: its tenant, what it still lacks per
  capacity key, when it started waiting), every tenant's :class:`Standing` (GPU-time in
  use and entitlement, GPU-equivalents), the running :class:`Victim` candidates (a pod,
  or a whole gang), the spec, the time now and when the pods reclaimed in the last hour
  were reclaimed. It returns the victims to evict, in order, or nothing.
- Nothing is reclaimed unless the head has waited at least ``after``, its tenant is
  below its entitlement, and the victims chosen free all it lacks (a partial reclaim
  loses work and still leaves the head waiting) within ``perHour`` pods counted over
  the last hour, cluster-wide (a gang counts all its pods).
- A victim is training, labelled ``fairgate.io/preemptible: "true"`` (a gang: every
  member), every member has run at least ``minRuntime``, it frees some of what the
  head lacks, and its tenant is not the owed one nor one the queue released a pod to
  after the head was created (a pod of it running now, gangs counted by member): the
  queue gave that tenant capacity while the head waited, which is its own fair-share
  order at work (a tenant behind in GPU-time runs above its share to catch up), and
  reclaiming from it would only have the queue hand the next capacity back, a reclaim
  at every turn of a busy cluster. It is taken only when, with it and
  the victims taken before it from the same tenant gone, that tenant still holds at
  least its own entitlement, and at least the owed tenant's GPU-time / entitlement
  once the head runs (used + the head's whole demand): a strict improvement.
- Order: the tenant furthest above its entitlement (used / entitlement, counting what
  was already taken) first, within it the youngest victim (latest start) first; the
  choice stops as soon as what the head lacks is freed.
- :func:`choose_in_turn` does the same for several heads in queue order (the owed
  tenant's next pods of the head's shape), as if each reclaim were made before the
  next head is looked at: the victims taken are gone, the head runs, and both count in
  the standings and against ``perHour``. It stops at the first head :func:`choose`
  refuses; each reclaim is one :func:`choose` allows on the standings it is made on.
- :func:`victims` groups running pods into candidates: a pod without a gang is one; a
  gang is one only when all its ``group_size`` members are running and known (a
  gang is reclaimed whole or not at all).
- :func:`due` says when waiting alone may let :func:`choose` reclaim what it refuses
  now (``after``, ``minRuntime``), so that the check comes then, not a period later.
- :func:`for_inference` is the other eviction: borrowed capacity returned to inference.
  It gets what the cluster lacks, per capacity key, once an inference pod just admitted
  is counted, and the running borrowed candidates; it returns the youngest of them
  first (a gang whole) until that shortfall is covered, or as far as they go. Borrowed
  pods are preemptible by definition: no label, ``after`` or ``minRuntime`` applies, and
  reclaim need not be on. These are the pods the kube-scheduler would preempt for the
  inference pod (the lowest priority, the latest started), taken before it tries.
- :func:`as_the_scheduler_would` says whether such an eviction may go ahead: the
  inference pod is not gated, so the kube-scheduler preempts for it too, and it must
  find the same victim already going, or one pod too many is lost. The scheduler
  honours only its own terminating victims, compares start times in whole seconds and
  breaks ties between nodes at random; so fairgate evicts only where the scheduler's
  choice is certain (one victim, one borrowed pod that started last, alone in its
  second) and otherwise leaves the preemption to the scheduler.
- :func:`notes` is what the dispatcher stores after each check for ``fairgate status``,
  ``fairgate why`` and the console (see :mod:`fairshare.dispatcher`);
  :func:`fairshare.status.reclaim_lines` says it in words.
- Loop-freedom: with Φ = Σ used² / entitlement over tenants, a reclaim that moves G_v
  from each victim tenant v to the owed tenant o under the rule above lowers Φ by at
  least G² / e_o, G = Σ G_v (docs/fairness.md gives the algebra). Φ >= 0 and every
  reclaim lowers it by a positive amount, so reclaims between the same tenants cannot
  go on in turn; and right after o reclaimed from v, v is at or above o's ratio, so v
  is not owed by o's measure and o is not above it: the reverse reclaim is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fairshare.cluster.cluster import GpuPod
from fairshare.queue.model import gang_id
from tenants.models import ReclaimSpec
from tenants.resources import SLICES_PER_GPU, total_slices

T = TypeVar("T")
HOUR = 3600.0
RECENT = 10  # reclaims listed in the notes


@dataclass(frozen=True)
class Owed:
    """The head owed the next capacity: ``lacks`` is its demand less what is held for it
    (units per capacity key), ``demand`` its whole demand, ``since`` its creation."""

    tenant: str
    lacks: Mapping[str, int]
    demand: Mapping[str, int]
    since: float


@dataclass(frozen=True)
class Standing:
    """A tenant's GPU-equivalents in use and its entitlement."""

    used: float
    entitlement: float


@dataclass(frozen=True)
class Victim:
    """A running pod, or a whole gang (``pods`` > 1), that could be reclaimed.

    ``started``: when its youngest member started running; ``released``: when the
    queue released its latest member (None: none was released by the dispatcher that
    sees it, e.g. admitted at once, or before that dispatcher started);
    ``preemptible``: every member carries ``fairgate.io/preemptible: "true"``;
    ``training``: every member is training."""

    key: str  # a ticket, or a gang id
    tenant: str
    demand: Mapping[str, int]  # summed over its members, per capacity key
    started: float
    pods: int = 1
    preemptible: bool = True
    training: bool = True
    tickets: tuple[str, ...] = ()  # of its pods (empty: the key alone)
    released: float | None = None

    @property
    def gpus(self) -> float:
        """Its GPU-equivalents."""
        return total_slices(self.demand) / SLICES_PER_GPU


def _ratio(used: float, entitlement: float) -> float:
    return used / entitlement if entitlement > 0 else float("inf")


def eligible(victim: Victim, owed: Owed, spec: ReclaimSpec, now: float) -> bool:
    """Whether ``victim`` may be reclaimed at all for ``owed`` (label, class, run time,
    another tenant, frees something the head lacks); see also :func:`favoured`."""
    return (victim.training and victim.preemptible and victim.tenant != owed.tenant
            and now - victim.started >= spec.min_runtime
            and any(owed.lacks.get(key, 0) > 0 for key, n in victim.demand.items() if n > 0))


def favoured(owed: Owed, running: Sequence[Victim]) -> set[str]:
    """The tenants the queue released a pod of ``running`` to (every running candidate,
    eligible or not) after ``owed``'s head was created: never victims for it."""
    return {v.tenant for v in running if v.released is not None and v.released >= owed.since}


def contenders(owed: Owed, victims: Sequence[Victim], spec: ReclaimSpec, now: float,
               recent: Sequence[float]) -> list[Victim]:
    """The victims :func:`choose` may pick for ``owed`` at ``now`` whatever the tenants'
    standings, youngest first: none before the head has waited ``after`` or once
    ``perHour`` is spent (``recent``: when the pods reclaimed lately were); else the
    :func:`eligible` ones of tenants not :func:`favoured`."""
    if now - owed.since < spec.after or _budget(spec, recent, now) <= 0:
        return []
    passed_over = favoured(owed, victims)
    return sorted((v for v in victims
                   if v.tenant not in passed_over and eligible(v, owed, spec, now)),
                  key=lambda v: (-v.started, v.key))


def _budget(spec: ReclaimSpec, recent: Sequence[float], now: float) -> int:
    """How many more pods ``perHour`` allows at ``now``."""
    return spec.per_hour - sum(1 for at in recent if now - at < HOUR)


def choose(
    owed: Owed, standings: Mapping[str, Standing], victims: Sequence[Victim],
    spec: ReclaimSpec, now: float, recent: Sequence[float],
) -> list[Victim]:
    """The victims to evict for ``owed`` (see the module contract), or []."""
    mine = standings.get(owed.tenant)
    if mine is None or mine.used >= mine.entitlement:
        return []
    left = contenders(owed, victims, spec, now, recent)
    budget = _budget(spec, recent, now)
    target = _ratio(mine.used + total_slices(owed.demand) / SLICES_PER_GPU,
                    mine.entitlement)
    lacking = {key: n for key, n in owed.lacks.items() if n > 0}
    taken: dict[str, float] = {}
    chosen: list[Victim] = []

    def after(victim: Victim) -> float:
        standing = standings[victim.tenant]
        return standing.used - taken.get(victim.tenant, 0.0) - victim.gpus

    def allowed(victim: Victim) -> bool:
        standing = standings.get(victim.tenant)
        if standing is None or victim.pods > budget:
            return False
        rest = after(victim)
        return rest >= standing.entitlement and _ratio(rest, standing.entitlement) >= target

    while lacking:
        fits = [v for v in left if allowed(v)
                and any(lacking.get(key, 0) > 0 for key in v.demand)]
        if not fits:
            return []
        # furthest above its entitlement first (what was taken counted), youngest first
        pick = min(fits, key=lambda v: (
            -_ratio(standings[v.tenant].used - taken.get(v.tenant, 0.0),
                    standings[v.tenant].entitlement), -v.started, v.key))
        chosen.append(pick)
        left.remove(pick)
        budget -= pick.pods
        taken[pick.tenant] = taken.get(pick.tenant, 0.0) + pick.gpus
        _cover(lacking, pick)
    return chosen


def choose_in_turn(
    heads: Iterable[tuple[T, Owed]], standings: Mapping[str, Standing],
    victims: Sequence[Victim], spec: ReclaimSpec, now: float, recent: Sequence[float],
) -> list[tuple[T, list[Victim]]]:
    """Each head of ``heads`` (the caller's label for it, and it as :class:`Owed`) with
    the victims to evict for it, in order (see the module contract); empty when
    :func:`choose` refuses the first. ``heads`` is read one at a time, and no further
    than the first head refused."""
    standing = dict(standings)
    left = list(victims)
    reclaimed = list(recent)
    out: list[tuple[T, list[Victim]]] = []
    for label, owed in heads:
        chosen = choose(owed, standing, left, spec, now, reclaimed)
        if not chosen:
            break
        out.append((label, chosen))
        for victim in chosen:
            left.remove(victim)
            was = standing[victim.tenant]
            standing[victim.tenant] = Standing(was.used - victim.gpus, was.entitlement)
            reclaimed.extend([now] * victim.pods)
        was = standing[owed.tenant]
        standing[owed.tenant] = Standing(
            was.used + total_slices(owed.demand) / SLICES_PER_GPU, was.entitlement)
    return out


def due(owed: Owed, candidates: Sequence[Victim], spec: ReclaimSpec,
        now: float) -> float | None:
    """The first moment after ``now`` at which time alone may change what :func:`choose`
    refuses ``owed`` now: the head has waited ``after``; or, that reached, a candidate
    becomes :func:`eligible` by reaching ``minRuntime``. None when neither lies ahead."""
    waited = owed.since + spec.after
    if waited > now:
        return waited
    ahead = [v.started + spec.min_runtime for v in candidates
             if v.started + spec.min_runtime > now
             and eligible(v, owed, spec, v.started + spec.min_runtime)]
    return min(ahead, default=None)


def for_inference(short: Mapping[str, int], borrowed: Sequence[Victim]) -> list[Victim]:
    """The borrowed victims to evict so that an inference pod fits: ``short`` is what
    capacity lacks per key with it counted (keys it does not ask for left out),
    ``borrowed`` the candidates (see the module contract)."""
    lacking = {key: n for key, n in short.items() if n > 0}
    chosen: list[Victim] = []
    for victim in sorted(borrowed, key=lambda v: (-v.started, v.key)):
        if not lacking:
            break
        if not any(lacking.get(key, 0) > 0 and n > 0 for key, n in victim.demand.items()):
            continue
        chosen.append(victim)
        _cover(lacking, victim)
    return chosen


def as_the_scheduler_would(demand: Mapping[str, int], chosen: Sequence[Victim],
                           borrowed: Mapping[str, GpuPod]) -> bool:
    """Whether the kube-scheduler, preempting for an inference pod of ``demand`` itself,
    takes a pod of ``chosen`` (what :func:`for_inference` picked): the pod asks one unit
    of one capacity key, so one victim makes room on any node, and among ``borrowed``
    (ticket -> running borrowed pod, those already being deleted included: the scheduler
    still sees them) holding that key, one started in a later second than all others and
    is among ``chosen``."""
    asked = [key for key, n in demand.items() if n > 0]
    if len(asked) != 1 or demand[asked[0]] != 1:
        return False
    holders = {ticket: pod.started_at for ticket, pod in borrowed.items()
               if pod.demand.get(asked[0], 0) > 0}
    if not holders or None in holders.values():
        return False
    latest = max(t for t in holders.values() if t is not None)
    youngest = [ticket for ticket, started in holders.items() if started == latest]
    return len(youngest) == 1 and any(youngest[0] in (v.tickets or (v.key,)) for v in chosen)


def _cover(lacking: dict[str, int], victim: Victim) -> None:
    """Take what evicting ``victim`` frees off ``lacking`` (keys covered are dropped)."""
    for key, n in victim.demand.items():
        if key in lacking:
            lacking[key] -= n
            if lacking[key] <= 0:
                del lacking[key]


def victims(running: Mapping[str, GpuPod], started: Mapping[str, float],
            released: Mapping[str, float] | None = None) -> list[Victim]:
    """The candidates among ``running`` (ticket -> pod running now, not being deleted;
    ``started``: ticket -> when it was seen running; ``released``: ticket -> when the
    queue released it, for those the dispatcher released), one per pod or whole gang."""
    released = released or {}
    gangs: dict[str, list[GpuPod]] = {}
    alone: list[Victim] = []
    for ticket, pod in running.items():
        if ticket not in started:
            continue
        gid = gang_id(pod.ref.namespace, pod.group, pod.group_size)
        if gid is None:
            alone.append(_victim(ticket, [pod], started, released))
        else:
            gangs.setdefault(gid, []).append(pod)
    return alone + [_victim(gid, pods, started, released) for gid, pods in gangs.items()
                    if len(pods) >= max(p.group_size for p in pods)]


def _victim(key: str, pods: Sequence[GpuPod], started: Mapping[str, float],
            released: Mapping[str, float]) -> Victim:
    demand: dict[str, int] = {}
    for pod in pods:
        for name, n in pod.demand.items():
            demand[name] = demand.get(name, 0) + n
    times = [released[p.ticket] for p in pods if p.ticket in released]
    return Victim(key, pods[0].tenant, demand, max(started[p.ticket] for p in pods),
                  pods=len(pods), preemptible=all(p.preemptible for p in pods),
                  training=all(p.pod_class == "training" for p in pods),
                  tickets=tuple(sorted(p.ticket for p in pods)),
                  released=max(times) if times else None)


def notes(spec: ReclaimSpec | None, reclaimed: Sequence[Mapping[str, Any]],
          now: float) -> dict[str, Any]:
    """The reclaim notes at ``now``: ``on``, the spec's ``after``, ``min_runtime`` and
    ``per_hour`` (when on), ``last_hour`` (how many of ``reclaimed``, the pods reclaimed in
    the last hour, oldest first) and ``recent`` (the last :data:`RECENT` of them)."""
    base: dict[str, Any] = {"on": spec is not None, "at": now, "last_hour": len(reclaimed),
                            "recent": [dict(r) for r in reclaimed[-RECENT:]]}
    if spec is not None:
        base.update(after=spec.after, min_runtime=spec.min_runtime, per_hour=spec.per_hour)
    return base

