"""Plain value types of the weighted-fair queue (no I/O).

Contract:
- :class:`PodRequest` is what the webhook asks the queue about at pod CREATE.
- :class:`Admission` is the queue's answer: reserved now, or queued in a priority band.
- :class:`Release` is a queued pod the dispatcher may now un-gate.
- :class:`RunningPod` / :class:`GatedPod` are the cluster's truth given to ``rebuild``.
- :class:`TenantStatus` / :class:`TicketStatus` are read-only snapshots for
  ``fairgate status`` and ``fairgate why``; :class:`QueueSnapshot` adds what fair-share
  entitlements need (queued slices per tenant, the stored capacity), read atomically.
All quota numbers are integers (slices or resource units); only ``weight`` and the
derived ``weighted_share`` are floats. Every type is immutable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tenants import resources
from tenants.models import CLASSES, PodClass, PriorityBand
from tenants.resources import ResourceCounts

Outcome = Literal["reserved", "queued"]
# what `confirm` found: the ticket is (now) bound to this pod, is unknown, or belongs
# to another pod (a twin carrying a copied ticket)
Confirmation = Literal["confirmed", "unknown", "conflict"]
TicketState = Literal["queued", "gang-waiting", "reserved", "running", "claimed"]
BANDS: tuple[PriorityBand, ...] = ("inference", "training", "borrowed")

_TICKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class InvalidRequestError(ValueError):
    """A :class:`PodRequest` (or rebuild record) the queue cannot store."""


def _check_text(what: str, value: str) -> None:
    if not value or "|" in value or any(ch.isspace() for ch in value):
        raise InvalidRequestError(
            f"{what} {value!r} is not usable: it must be non-empty and contain no '|' or "
            f"whitespace (Kubernetes names and labels never do)"
        )


def _check_ticket(ticket: str) -> None:
    if not _TICKET.match(ticket):
        raise InvalidRequestError(
            f"ticket {ticket!r} is not usable: use the admission request uid "
            f"(letters, digits, '.', '_', '-'; at most 128 characters)"
        )


def _check_uid(uid: str) -> None:
    if not uid or not _TICKET.match(uid):
        raise InvalidRequestError(
            f"pod uid {uid!r} is not usable: use metadata.uid of the pod as listed "
            f"(letters, digits, '.', '_', '-')"
        )


def _check_band(band: str) -> None:
    if band not in BANDS:
        raise InvalidRequestError(f"band {band!r} is unknown: use one of {BANDS}")


def _check_demand(demand: Mapping[str, int]) -> None:
    if not any(n > 0 for n in demand.values()):
        raise InvalidRequestError(
            "demand is empty: a pod without GPU demand is not queued by fairgate"
        )
    for name, count in demand.items():
        if not resources.is_known(resources.base_of(name)) or resources.normalise(name) != name:
            raise InvalidRequestError(
                f"unknown resource {name!r} in demand: use a short name such as 'gpu' "
                f"or 'mig-1g.5gb', or a capacity key such as 'gpu@pool-a' or "
                f"'mig-1g.5gb#single'"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidRequestError(
                f"demand {name}={count!r} must be a non-negative integer"
            )


def _check_run(run_seconds: int | None) -> None:
    if run_seconds is not None and (isinstance(run_seconds, bool)
                                    or not isinstance(run_seconds, int) or run_seconds < 1):
        raise InvalidRequestError(
            f"declared run time {run_seconds!r} is not usable: it must be a whole number "
            f"of seconds >= 1 (activeDeadlineSeconds), or None when the pod declares none"
        )


UNKNOWN_GANG_SIZE = 1_000_000
"""The size a gang is queued with while the object that declares it has not been seen
(``resize.lua`` and ``unsized.lua`` know it too): more members than any gang has, so it
never completes until :meth:`~fairshare.queue.fastpath.AsyncFairQueue.resize` gives it
its size."""


def gang_id(namespace: str, group: str | None, group_size: int) -> str | None:
    """The gang id ``namespace/group`` of a pod in a gang of 2 or more, else None."""
    if group is None or group_size < 2:
        return None
    return f"{namespace}/{group}"


MAX_GANG_SOURCE = 256
"""The longest ``group_source`` / ``group_awaiting`` text a :class:`PodRequest` carries."""


def gang_name(gang: str, source: str) -> str:
    """A gang as people know it: ``gang of Indexed Job trainer`` (where it was declared),
    or ``gang <namespace>/<key>`` when the queue does not know its source (a gang queued
    by an older fairgate, or rebuilt from the cluster after Redis lost its data)."""
    return f"gang of {source}" if source else f"gang {gang}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _plural(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def gang_missing(created: int, size: int | None, awaiting: str = "") -> str:
    """What an incomplete gang waits for, after ``waiting for``: ``the 4th`` (one pod
    missing), ``2 more`` or, size unknown, ``its size (known once Job trainer is
    seen)``; ``""`` when every pod was created."""
    if size is None:
        once = (f"known once {awaiting}" if awaiting
                else "the object that declares it has not been seen")
        return f"its size ({once})"
    if created >= size:
        return ""
    return f"the {_ordinal(size)}" if size - created == 1 else f"{size - created} more"


def gang_progress(gang: str, source: str, created: int, size: int | None,
                  awaiting: str = "", running: int = 0) -> str:
    """A gang and how far it got, e.g. ``gang of Indexed Job trainer: 3 of 4 pods
    created, waiting for the 4th``; ``gang of JobSet trainer: 2 pods created, waiting for
    its size (known once JobSet trainer is seen)``; ``gang of Indexed Job trainer: 4 of
    4 pods created, 4 running``. ``created``: the members the queue holds (queued or
    running)."""
    made = f"{_plural(created)} created" if size is None else \
        f"{created} of {size} pods created"
    text = f"{gang_name(gang, source)}: {made}"
    missing = gang_missing(created, size, awaiting)
    if missing:
        return f"{text}, waiting for {missing}"
    return f"{text}, {running} running" if running else text


@dataclass(frozen=True)
class GangRecord:
    """A gang as the queue holds it (``fairgate why``, ``status`` and the console):
    ``gang`` its id (``namespace/key``), ``size`` (None: not known yet), how many of its
    members run and how many are queued, ``source`` where it was declared (e.g.
    ``Indexed Job trainer``, ``pod group ddp7`` for fairgate's own label; ``""`` when
    the queue was not told), while the size is unknown what it waits for
    (``awaiting``, e.g. ``Job trainer is seen``), and the ``tenant`` whose lane it is in."""

    gang: str
    size: int | None
    running: int
    queued: int
    source: str = ""
    awaiting: str = ""
    tenant: str = ""

    @property
    def complete(self) -> bool:
        """Whether every member was created (it waits, or runs, as one entry)."""
        return self.size is not None and self.created >= self.size

    @property
    def created(self) -> int:
        """The members the queue holds: running or queued."""
        return self.running + self.queued

    @property
    def name(self) -> str:
        """:func:`gang_name` of this gang."""
        return gang_name(self.gang, self.source)

    def describe(self) -> str:
        """:func:`gang_progress` of this gang."""
        return gang_progress(self.gang, self.source, self.created, self.size,
                             self.awaiting, self.running)

    def to_json(self) -> dict[str, Any]:
        """Plain data: ``id``, ``tenant``, ``source``, ``size`` (null: unknown), ``created``,
        ``running``, ``queued``, ``awaiting`` and ``summary`` (:meth:`describe`)."""
        return {"id": self.gang, "tenant": self.tenant or None,
                "source": self.source or None, "size": self.size,
                "created": self.created, "running": self.running, "queued": self.queued,
                "awaiting": self.awaiting or None, "summary": self.describe()}


@dataclass(frozen=True)
class PodRequest:
    """A GPU pod at CREATE, as the queue sees it.

    ``ticket`` is the admission request uid (``fairgate.io/ticket``); ``group`` and
    ``group_size`` describe a gang (``group`` is None and ``group_size`` 1 otherwise;
    a gang is identified by ``namespace/group``). ``submitted_at`` orders the queue
    (seconds, any epoch the caller keeps consistent). ``hold``: never reserved at
    admission, however much is free; queued, so that the dispatcher checks it before
    its release (a pod whose DRA claims must be checked against what it was priced for).
    ``run_seconds``: its declared run time (``activeDeadlineSeconds`` of the pod or of its
    Job, an upper bound on how long it runs), which backfill reads in place of its
    tenant's expected run time; None when it declares none.
    """

    ticket: str
    tenant: str
    namespace: str
    name: str
    pod_class: PodClass
    demand: ResourceCounts
    group: str | None = None
    group_size: int = 1
    submitted_at: float = 0.0
    hold: bool = False
    group_source: str = ""
    group_awaiting: str = ""
    run_seconds: int | None = None

    def __post_init__(self) -> None:
        _check_ticket(self.ticket)
        _check_text("tenant", self.tenant)
        _check_run(self.run_seconds)
        _check_text("namespace", self.namespace)
        _check_text("name", self.name)
        if self.pod_class not in CLASSES:
            raise InvalidRequestError(
                f"class {self.pod_class!r} is unknown: use one of {', '.join(CLASSES)}"
            )
        _check_demand(self.demand)
        if self.group is not None:
            _check_text("pod group", self.group)
        if self.group_size < 1 or (self.group is None and self.group_size != 1):
            raise InvalidRequestError(
                f"group size {self.group_size} is invalid: a gang needs a group name and "
                f"a size >= 1; a pod without a group has size 1"
            )
        for what, words in (("group source", self.group_source),
                            ("group awaiting", self.group_awaiting)):
            if len(words) > MAX_GANG_SOURCE or not words.isprintable():
                raise InvalidRequestError(
                    f"{what} {words[:40]!r} is not usable: at most {MAX_GANG_SOURCE} "
                    "printable characters")

    @property
    def gang(self) -> str | None:
        """The gang id ``namespace/group`` when this pod is part of a gang of 2 or more."""
        return gang_id(self.namespace, self.group, self.group_size)


@dataclass(frozen=True)
class Admission:
    """The queue's decision for a :class:`PodRequest`.

    ``band`` decides the pod's PriorityClass. ``position`` is 1-based among the tenant's
    queue entries of the same class, a whole gang being one entry (None when reserved,
    or while a gang is incomplete); ``queue_length`` is how many pods of that tenant
    and class are queued.
    ``free_slices`` / ``nominal_slices`` describe the tenant's nominal quota (slices not
    used by non-borrowed pods, this one included when reserved / all of it).
    ``waiting_for`` says in words what a queued pod waits for (None when reserved).
    ``duplicate`` is True when the ticket was already known: nothing changed and the
    answer describes the ticket's current state. ``reason`` is the queue's reason code
    and its fields, as :func:`fairshare.queue.calls.explain` reads them (empty when
    reserved).
    """

    outcome: Outcome
    band: PriorityBand
    position: int | None
    queue_length: int
    free_slices: int
    nominal_slices: int
    waiting_for: str | None
    duplicate: bool = False
    reason: tuple[str, ...] = ()


@dataclass(frozen=True)
class Release:
    """A pod whose gate may be lifted now (its quota and capacity are already held)."""

    ticket: str
    tenant: str
    namespace: str
    name: str
    band: PriorityBand
    demand: ResourceCounts
    waited_seconds: float


@dataclass(frozen=True)
class RunningPod:
    """A pod holding GPUs in the cluster (bound, or created without a gate).

    ``uid`` is the pod's ``metadata.uid``: the ticket is bound to it. ``group``/
    ``group_size`` as in :class:`PodRequest` (so a gang member that is recreated later
    completes its gang with the members still running).
    """

    ticket: str
    tenant: str
    namespace: str
    name: str
    pod_class: PodClass
    band: PriorityBand
    demand: ResourceCounts
    uid: str
    group: str | None = None
    group_size: int = 1
    started_at: float | None = None  # when its run began, if the caller saw it begin
    run_seconds: int | None = None  # its declared run time, as in PodRequest

    def __post_init__(self) -> None:
        _check_ticket(self.ticket)
        _check_uid(self.uid)
        _check_run(self.run_seconds)
        for what, value in (("tenant", self.tenant), ("namespace", self.namespace),
                            ("name", self.name)):
            _check_text(what, value)
        if self.group is not None:
            _check_text("pod group", self.group)
        _check_band(self.band)
        _check_demand(self.demand)

    @property
    def gang(self) -> str | None:
        """The gang id ``namespace/group`` when this pod is part of a gang of 2 or more."""
        return gang_id(self.namespace, self.group, self.group_size)


@dataclass(frozen=True)
class GatedPod:
    """A pod still carrying the ``fairgate.io/queue`` gate, with the band it was given
    and its ``metadata.uid`` (the ticket is bound to it)."""

    request: PodRequest
    band: PriorityBand
    uid: str

    def __post_init__(self) -> None:
        _check_band(self.band)
        _check_uid(self.uid)


@dataclass(frozen=True)
class TenantStatus:
    """One tenant's quota, usage and backlog (slices unless stated otherwise)."""

    tenant: str
    weight: float
    nominal: ResourceCounts
    nominal_slices: int
    borrow_limit_slices: int
    inference_reserve_slices: int
    used: ResourceCounts  # non-borrowed usage per resource, in units
    used_slices: int  # all bands
    borrowed_slices: int
    training_slices: int  # non-borrowed training
    inference_slices: int
    running_by_key: ResourceCounts  # units per capacity key, all bands (borrowed too)
    running_inference_by_key: ResourceCounts  # the inference band's part of it
    queued: Mapping[PodClass, int] = field(default_factory=dict)
    weighted_share: float = 0.0


@dataclass(frozen=True)
class QueueSnapshot:
    """Every tenant's status, its queued slices (all bands, gang members waiting for
    their gang included), the capacity the queue dispatches against (units per capacity
    key), the part of the queued slices that is inference, and per tenant its queued
    units per capacity key (all bands, and the inference band's part), read at one
    instant."""

    tenants: tuple[TenantStatus, ...]
    queued_slices: Mapping[str, int]
    capacity: ResourceCounts
    queued_inference_slices: Mapping[str, int]
    queued_by_key: Mapping[str, ResourceCounts]
    queued_inference_by_key: Mapping[str, ResourceCounts]


@dataclass(frozen=True)
class Hold:
    """Capacity held now for a queue entry owed it (it does not fit yet and its tenant is
    below its weighted share): ``held`` is the free capacity not held for the entries
    owed it before it in queue order (units per resource of ``demand``, at most
    ``demand``; possibly none yet); no later entry of ``band`` may use it."""

    tenant: str
    band: PriorityBand  # the tier the entry waits in (its lowest band)
    demand: ResourceCounts  # the whole entry (a gang: all its members)
    held: ResourceCounts
    namespace: str  # of the entry's head pod (a gang: its first queued member)
    name: str
    group: str | None = None  # the gang id (namespace/group) of a gang entry


@dataclass(frozen=True)
class TicketStatus:
    """Where one ticket stands (``fairgate why``)."""

    ticket: str
    tenant: str
    namespace: str
    name: str
    pod_class: PodClass
    band: PriorityBand
    demand: ResourceCounts
    state: TicketState
    position: int | None
    queue_length: int
    waiting_for: str | None
    submitted_at: float
    released_at: float | None
    group: str | None


@dataclass(frozen=True)
class PricedTicket:
    """A live admission priced for one DRA object it names (a ResourceClaim or
    ResourceClaimTemplate): its ticket, the devices the object was priced at for it,
    and where its pod stands (``name`` is ``<prefix>*`` for a generateName)."""

    ticket: str
    devices: ResourceCounts
    state: TicketState
    namespace: str
    name: str


@dataclass(frozen=True)
class ServiceSnapshot:
    """The service counters the queue orders by (virtual time, or decayed usage), as
    :meth:`fairshare.queue.fairqueue.FairQueue.service` read them: opaque to the caller, kept to
    give back to :meth:`~fairshare.queue.fairqueue.FairQueue.restore_service` after a Redis loss.
    ``fields`` is the exact text the queue stored (numbers read back exactly)."""

    fields: tuple[str, ...]

    @property
    def tenants(self) -> int:
        """How many tenants' counters it holds."""
        return (len(self.fields) - 3) // 5
