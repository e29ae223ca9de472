"""The weighted-fair GPU queue, held in Redis.

Contract (rules in ``fairshare/queue/README.md``; key layout there too):
- Every state change is one Lua operation (``fairshare/queue/scripts/<op>.lua``, a function
  of one Redis Function library: :mod:`fairshare.queue.functions`), so any number of webhooks
  and dispatchers may call a :class:`FairQueue` on the same Redis at once.
- :meth:`FairQueue.admit` reserves a pod now (fast path) or queues it, and picks its
  priority band; it is idempotent per ticket, and ``dry_run`` writes nothing.
- :meth:`FairQueue.dispatch` releases queued pods in queue order: class first
  (inference, then training; within training, the training band before borrowed
  pods), then the tenant with the lowest weighted share (slices used / weight, or
  decayed usage / weight with ``fairShare.usageHalfLife``; ties to the tenant whose
  head pod was created first), then FIFO; gangs all at once. The entries in that
  order that do not fit yet are owed the capacity they lack while their tenants are
  below their weighted share: the free capacity is held for the first of them, what is
  left for the next (``fairshare/queue/README.md``, "Holding").
- Quota safety holds at every instant: per tenant, non-borrowed usage per resource
  <= nominal, non-borrowed training slices <= nominal - inference reserve, borrowed
  slices <= borrow limit; cluster capacity per band (lower bands count as free).
- :meth:`FairQueue.rebuild` replaces usage and queue with the cluster's truth.
- Quota integrity (invariant 7): a ticket belongs to the first pod uid seen with it
  (:meth:`FairQueue.confirm`, or a rebuild); only that pod frees it, and tenant, class,
  band and demand are the ones recorded at admission. A ticket no pod is seen with
  within ``reservation_ttl`` expires (reserved or queued).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from fairshare.queue.budget import BudgetStatus, read_budgets
from fairshare.queue.calls import (
    BAND_CODE,
    BAND_NAME,
    CLASS_CODE,
    CLASS_NAME,
    STATE_NAME,
    admission,
    admit_args,
    bind_args,
    claimed,
    explain,
    holds,
    lane_entry,
    note_priced_args,
    num,
    priced_tickets,
    queue_error,
    queue_snapshot,
    resize_args,
    run_arg,
    sync_args,
    tenant_statuses,
    text,
)
from fairshare.queue.functions import QueueFunctions
from fairshare.queue.model import (
    UNKNOWN_GANG_SIZE,
    Admission,
    Confirmation,
    GangRecord,
    GatedPod,
    Hold,
    PodRequest,
    PricedTicket,
    QueueSnapshot,
    Release,
    RunningPod,
    ServiceSnapshot,
    TenantStatus,
    TicketStatus,
)
from tenants.models import FairgateConfig
from tenants.resources import ResourceCounts, format_counts, parse_counts


class FairQueue:
    """Weighted-fair queue and quota ledger for GPU pods in one Redis.

    ``prefix`` namespaces every key; ``reservation_ttl`` is how long a fast-path
    reservation lives without :meth:`confirm`. With ``wait_for_rebuild``, :meth:`admit`
    reserves nothing on a Redis where :meth:`rebuild` never ran (a fresh or restarted
    Redis knows no usage yet): pods queue until the reconciler has rebuilt usage.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "fairgate:",
        reservation_ttl: float = 30.0,
        wait_for_rebuild: bool = False,
    ) -> None:
        if reservation_ttl <= 0:
            raise ValueError(f"reservation_ttl must be > 0 seconds, got {reservation_ttl}")
        self._client = client
        self._keys = [prefix]
        self.reservation_ttl = reservation_ttl
        self.wait_for_rebuild = wait_for_rebuild
        self._functions = QueueFunctions(client, prefix)

    def _run(self, name: str, *args: str | int | float) -> Any:
        try:
            return self._functions(name, *args)
        except redis.ResponseError as exc:
            raise (queue_error(exc) or exc) from exc

    # -- configuration -------------------------------------------------------------

    def sync_config(
        self, config: FairgateConfig, capacity: Mapping[str, int] | None
    ) -> None:
        """Store every tenant's weight and quota (in slices), the cluster capacity and
        ``fairShare.usageHalfLife`` (a new half-life restarts the decayed counters).

        ``capacity=None`` keeps the capacity already stored (a caller that does not see
        the nodes, like the webhook, must not wipe what the dispatcher stored). Safe to
        repeat; tenants missing from ``config`` keep their usage but get an empty quota.
        Lowering a quota or capacity evicts nothing: new pods wait until usage drops.
        """
        self._run("sync", *sync_args(config, capacity))

    # -- the webhook's fast path ---------------------------------------------------

    def admit(self, req: PodRequest, now: float, dry_run: bool = False,
              presented: bool = False) -> Admission:
        """Reserve ``req`` now if it may run, else queue it; decide its priority band.

        Idempotent per ticket: the same admission again (the API server reinvoking or
        retrying the webhook for one pod CREATE) changes nothing and returns the
        ticket's current state with ``duplicate=True``. It is the same admission only
        while the pod is not confirmed (reserved, queued or gang-waiting) and namespace,
        name (the exact string: ``<generateName>*`` stays that string across one
        CREATE, as Kubernetes names the pod after mutating admission), tenant, class and
        demand are the stored ones. Otherwise the ticket was copied from another pod:
        :class:`TicketConflictError`, and nothing changes. ``dry_run`` evaluates the
        same decision and writes nothing. Raises :class:`UnknownTenantError` for an
        unconfigured tenant.

        ``presented``: the pod arrived carrying ``req.ticket`` itself (the reinvocation
        rule of :mod:`admission.plan`). Such a ticket must be one this queue minted for
        this admission; one it holds no record of raises :class:`UnmintedTicketError`
        and changes nothing (not checked on a dry run, which never records its ticket).
        """
        raw = self._run("admit", *admit_args(req, now, dry_run, self.wait_for_rebuild,
                                             presented))
        return admission(raw, req)

    def bind(self, ticket: str, uid: str, namespace: str, name: str,
             dry_run: bool = False) -> bool:
        """A pod CREATE presenting ``ticket`` passes validation, before it is stored:
        ``uid``, ``namespace``/``name`` (its final name).

        The first uid to present an unclaimed ticket claims it: no other pod can then
        present it (:class:`TicketConflictError`, raised for every later uid) nor
        confirm it. The reservation still expires unless :meth:`confirm` sees that pod.
        False when the ticket is unknown (expired, or Redis lost it); ``dry_run``
        changes nothing.
        """
        return claimed(self._run("bind", *bind_args(ticket, uid, namespace, name, dry_run)),
                       ticket)

    def note_priced(self, ticket: str, priced: Mapping[str, ResourceCounts]) -> int:
        """Remember that the admission of live ``ticket`` priced each DRA object of
        ``priced`` (object key -> devices) at those devices; returns how many objects were
        noted (0 when the queue no longer holds the ticket: nothing is written). Each
        object's entry lives :data:`~fairshare.queue.calls.PRICED_LIFETIME` seconds after
        its last write; the entries of tickets no longer live are dropped as it is written."""
        return int(self._run("note_priced", *note_priced_args(ticket, priced)))

    def priced_for(self, key: str) -> list[PricedTicket]:
        """The live admissions priced for the DRA object ``key`` (see :meth:`note_priced`),
        dropping the entries of tickets the queue no longer holds."""
        return priced_tickets(self._run("priced_for", key))

    def confirm(self, ticket: str, uid: str, namespace: str, name: str) -> Confirmation:
        """A pod presenting ``ticket`` exists: ``uid``, ``namespace``/``name``.

        The first pod seen with a ticket owns it (invariant 7): the ticket is bound to
        its uid, a reservation no longer expires, a queued entry starts to count as
        queued demand, and a ``<generateName>*`` name becomes the pod's own. Another
        pod presenting a bound ticket, or a pod whose namespace or name does not match
        the admitted one, is ``"conflict"`` and changes nothing. ``"unknown"``: the
        ticket expired or was never admitted.
        """
        found = int(self._run("confirm", ticket, uid, namespace, name))
        return "confirmed" if found > 0 else "conflict" if found < 0 else "unknown"

    # -- the dispatcher ------------------------------------------------------------

    def dispatch(self, now: float, limit: int = 1,
                 capacity: Mapping[str, int] | None = None) -> list[Release]:
        """Release up to ``limit`` queue units (a pod, or a whole gang) that may run now.

        Their usage is held from this moment; lift their gates, or :meth:`requeue`
        them when that fails. ``capacity`` (by capacity key): fit entries against these
        numbers in this call instead of the stored capacity, key by key (autoscaled
        pools: what they may grow to); fair shares keep the stored capacity.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        extra = () if capacity is None else (format_counts(capacity),)
        raw = self._run("dispatch", num(now), limit, *extra)
        releases: list[Release] = []
        for i in range(0, len(raw), 7):
            ticket, tenant, ns, name, band, demand, submitted = (text(v) for v in raw[i : i + 7])
            releases.append(
                Release(
                    ticket=ticket,
                    tenant=tenant,
                    namespace=ns,
                    name=name,
                    band=BAND_NAME[band],
                    demand=parse_counts(demand),
                    waited_seconds=max(0.0, now - float(submitted)),
                )
            )
        return releases

    def release(self, ticket: str, uid: str, now: float | None = None,
                hand_over: bool = True) -> bool:
        """The pod ``uid`` holding ``ticket`` ended or was deleted: free its usage or
        queue place.

        Only the pod the ticket is bound to (see :meth:`confirm`) frees it; a ticket
        no pod was seen with yet is freed by any. ``now``: when (the clock of
        :meth:`dispatch`); the tenant's service (virtual time, or decayed usage) is
        counted up to it (without it, only up to the tenant's last change: pass it
        whenever the time is known, as the dispatcher does). ``hand_over=False``: what
        the pod frees is not handed over to its tenant's next pod (it was evicted for
        another tenant, or another pod now pays for what it held), and its run, cut
        short, is not learnt as a run time.
        Idempotent; returns False when the ticket was unknown or belongs to another pod.
        """
        mode = "any" if hand_over else "reclaimed"
        return bool(self._run("forget", ticket, mode, uid, *_clock(now)))

    def remove(self, ticket: str, uid: str, now: float | None = None) -> bool:
        """The queued pod ``uid`` was deleted: drop it from the queue (a gang becomes
        incomplete); ``now`` as in :meth:`release`.

        Does nothing and returns False unless the ticket is queued (and bound to
        ``uid``, or to no pod yet).
        """
        return bool(self._run("forget", ticket, "queued", uid, *_clock(now)))

    def expire(self, now: float) -> list[str]:
        """Forget tickets admitted ``reservation_ttl`` or longer ago whose pod was never
        seen (:meth:`confirm`): fast-path reservations, and queue entries of pods that
        never came to exist (a later admission step refused them)."""
        raw = self._run("expire", num(now - self.reservation_ttl), num(now))
        return [text(v) for v in raw]

    def requeue(self, ticket: str, now: float | None = None) -> bool:
        """A released pod's gate could not be lifted: free its usage and queue it again
        at the head of its queue (a gang member is retried alone). ``now``: as for
        :meth:`release`.

        Returns False unless the ticket was reserved or running.
        """
        return bool(self._run("requeue", ticket, *_clock(now)))

    # -- the reconciler ------------------------------------------------------------

    def primary_epoch(self) -> str:
        """Who is answering: the Redis process' run id and its replication id. It changes
        when another server is promoted (a Sentinel failover), when a replica is
        promoted in place, and when Redis restarts: what the queue holds may then lack
        writes of the old primary's last moments (replication is asynchronous)."""
        info = self._client.execute_command(  # type: ignore[no-untyped-call]
            "INFO", "server", "replication")
        return f"{info['run_id']}/{info['master_replid']}"

    def service(self) -> ServiceSnapshot:
        """Every tenant's service counters (see :class:`ServiceSnapshot`), in one call."""
        return ServiceSnapshot(tuple(text(v) for v in self._run("service")))

    def restore_service(self, snapshot: ServiceSnapshot) -> int:
        """Give back counters read before Redis lost its data, so the order resumes
        where it was (virtual times survive the loss, as usage does through
        :meth:`rebuild`). Does nothing once :meth:`rebuild` has run on this Redis, or
        when the order mode changed since the snapshot; a tenant that holds more service
        than the snapshot keeps its own. Returns how many tenants were restored."""
        return int(self._run("restore", *snapshot.fields))

    def is_rebuilt(self) -> bool:
        """Whether :meth:`rebuild` has run on this Redis since it was last emptied."""
        return bool(self._client.exists(self._keys[0] + "rebuilt"))

    def rebuild(
        self,
        running: Iterable[RunningPod],
        gated: Iterable[GatedPod],
        listed_at: float | None = None,
        riders: Iterable[str] = (),
    ) -> None:
        """Atomically replace usage and queue with the cluster's truth.

        ``running``: pods holding GPUs; ``gated``: pods still gated, queued in order of
        ``submitted_at`` (then ticket). ``listed_at``: when the pods were listed (the
        caller's clock, the one ``admit`` and ``dispatch`` get). Tickets reserved or
        released by dispatch later than ``listed_at - reservation_ttl`` are in flight
        (the list cannot show them yet) and are kept with their usage, also when the
        list shows their pod gated or not at all; an unconfirmed one still expires.
        With ``listed_at=None`` the lists are taken as complete (nothing reserved or
        dispatched since): every other ticket is dropped. Configuration is kept. A
        running pod's run began when its ticket was released, or at ``started_at``
        when Redis no longer knows the ticket (the expected run time learns from it).
        Each pod's ``run_seconds`` (declared run time) is kept for backfill.
        ``riders``: the tickets of listed pods charged nothing (their GPUs are a shared
        claim another listed pod pays): dropped, also when in flight.
        """
        cutoff = "" if listed_at is None else num(listed_at - self.reservation_ttl)
        free = list(riders)
        args: list[str | int | float] = [cutoff, len(free), *free]
        for pod in running:
            args += ["A", pod.ticket, pod.tenant, pod.namespace, pod.name,
                     CLASS_CODE[pod.pod_class], BAND_CODE[pod.band],
                     format_counts(pod.demand), pod.gang or "",
                     pod.group_size if pod.gang else 1, num(0.0), pod.uid,
                     "" if pod.started_at is None else num(pod.started_at),
                     run_arg(pod.run_seconds)]
        ordered = sorted(gated, key=lambda g: (g.request.submitted_at, g.request.ticket))
        for gated_pod in ordered:
            req = gated_pod.request
            args += ["Q", req.ticket, req.tenant, req.namespace, req.name,
                     CLASS_CODE[req.pod_class], BAND_CODE[gated_pod.band],
                     format_counts(req.demand), req.gang or "",
                     req.group_size if req.gang else 1, num(req.submitted_at),
                     gated_pod.uid, "", run_arg(req.run_seconds)]
        self._run("rebuild", *args)

    def unsized(self) -> list[str]:
        """The ids of the gangs queued before the object declaring their size was seen
        (they wait with :data:`~fairshare.queue.model.UNKNOWN_GANG_SIZE`)."""
        return [text(gid) for gid in self._run("unsized")]

    def resize(self, sizes: Mapping[str, int]) -> int:
        """Give gangs waiting for their size (:meth:`unsized`) their size: gang id ->
        size. A gang whose size is known already keeps it; a gang that is complete with
        its size joins its lane. Returns how many gangs were resized."""
        if not sizes:
            return 0
        return int(self._run("resize", *resize_args(sizes)))

    # -- snapshots -----------------------------------------------------------------

    def tenant_status(self) -> list[TenantStatus]:
        """Every known tenant's quota, usage, backlog and weighted share, by name."""
        return tenant_statuses(self._run("status"))

    def snapshot(self) -> QueueSnapshot:
        """:meth:`tenant_status` plus each tenant's queued slices (in all and per
        capacity key) and the stored capacity, all read in one transaction (what
        fair-share entitlements need)."""
        status_raw, demand_raw = self._functions.pipelined(
            [("status", ()), ("demand", ())], transaction=True)
        return queue_snapshot(status_raw, demand_raw)

    def holds(self, now: float) -> list[Hold]:
        """The capacity held at ``now`` and for whom (``fairgate status``): the entries
        :meth:`dispatch` would hold for, per tier in queue order (an entry owed capacity
        behind others may have nothing held yet). Read-only."""
        return holds(self._run("holds", num(now)))

    def find(self, namespace: str, name: str) -> str | None:
        """The ticket of the known (reserved, queued or running) pod ``namespace/name``.

        ``name`` is the name the pod was admitted or last rebuilt with: a pod created
        with ``generateName`` is found as ``<generateName>*`` until the dispatcher sees it
        (:meth:`confirm`) or a rebuild lists it under its own name. None when no such pod is known.
        """
        return text(self._run("find", namespace, name)) or None

    def ticket_status(self, ticket: str, now: float) -> TicketStatus | None:
        """Where ``ticket`` stands and, when queued, what it waits for; None if unknown."""
        return _ticket_status(ticket, self._run("why", ticket, num(now)))

    def ticket_statuses(self, tickets: Sequence[str], now: float) -> list[TicketStatus | None]:
        """:meth:`ticket_status` of each ticket, in one round trip (the console's queue
        page)."""
        replies = self._functions.pipelined(
            [("why", (ticket, num(now))) for ticket in tickets], transaction=False)
        return [_ticket_status(t, raw) for t, raw in zip(tickets, replies, strict=True)]

    def tenant_names(self) -> list[str]:
        """Every tenant with config or state in this Redis, by name (one read)."""
        return sorted(text(t) for t in self._client.smembers(self._keys[0] + "tenants"))

    def lanes(self, tenants: Sequence[str]) -> list[tuple[str, str, int]]:
        """``(tenant, shape, length)`` of every non-empty lane of ``tenants`` (the
        console's queue listing): tenants in the given order, each tenant's shapes sorted.
        Read-only; two round trips whatever the number of tenants."""
        with self._client.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.smembers(f"{self._keys[0]}tl:{tenant}")
            shapes = [sorted(text(s) for s in members) for members in pipe.execute()]
        pairs = [(t, shape) for t, own in zip(tenants, shapes, strict=True) for shape in own]
        with self._client.pipeline(transaction=False) as pipe:
            for tenant, shape in pairs:
                pipe.llen(f"{self._keys[0]}q:{tenant}:{shape}")
            lengths = pipe.execute()
        return [(t, s, int(n)) for (t, s), n in zip(pairs, lengths, strict=True) if int(n)]

    def lane_entries(self, tenant: str, shape: str, start: int, stop: int) -> list[str]:
        """Entries ``start``..``stop`` (inclusive, 0-based, FIFO order) of a lane: tickets,
        or ``@<gang id>`` for a complete gang waiting as one entry."""
        raw = self._client.lrange(f"{self._keys[0]}q:{tenant}:{shape}", start, stop)
        return [lane_entry(v) for v in raw]

    def gang_members(self, gangs: Sequence[str]) -> list[list[str]]:
        """The queued members' tickets of each gang id, in arrival order (``[]`` for a
        gang no longer known), in one round trip (the console's queue page)."""
        with self._client.pipeline(transaction=False) as pipe:
            for gang in gangs:
                pipe.hget(f"{self._keys[0]}g:{gang}", "m")
            raw = pipe.execute()
        return [[t for t in text(m).split(",") if t] if m is not None else [] for m in raw]

    def gangs(self, gangs: Sequence[str]) -> list[GangRecord | None]:
        """Each gang id's :class:`GangRecord` (None: the queue holds no such gang), in
        one round trip, read-only (``fairgate why``, ``status`` and the console)."""
        if not gangs:
            return []
        with self._client.pipeline(transaction=False) as pipe:
            for gang in gangs:
                pipe.hmget(f"{self._keys[0]}g:{gang}", "n", "r", "m", "src", "aw", "t")
            raw = pipe.execute()
        return [_gang_record(gang, fields) for gang, fields in zip(gangs, raw, strict=True)]

    def incomplete_gangs(self) -> list[GangRecord]:
        """The gangs still waiting for members or for their size, by id (``fairgate
        status``); read-only, two round trips."""
        ids = sorted(text(g) for g in self._client.smembers(self._keys[0] + "gangs"))
        return [g for g in self.gangs(ids) if g is not None and not g.complete]

    def ticket_namespaces(self, tickets: Sequence[str]) -> list[str | None]:
        """The namespace each ticket was admitted in (None for an unknown ticket or a
        gang entry), in one read of the ticket records."""
        if not tickets:
            return []
        raw = self._client.hmget(self._keys[0] + "tk", list(tickets))
        return [text(r).split("|", 6)[5] if r is not None else None for r in raw]

    def namespace_tenants(self, chunk: int = 1000) -> dict[str, set[str]]:
        """Per namespace, the tenants of its ticket records (queued, reserved or
        running; a complete gang's members are in its namespace and tenant), read with
        ``HSCAN`` ``chunk`` records at a time (Redis is never busy for long). A record
        present for the whole read is in the answer; one written during it may not be."""
        found: dict[str, set[str]] = {}
        cursor = 0
        while True:
            cursor, records = self._client.hscan(self._keys[0] + "tk", cursor, count=chunk)
            assert isinstance(records, dict)  # without no_values, HSCAN answers a mapping
            for raw in records.values():
                fields = text(raw).split("|", 6)
                found.setdefault(fields[5], set()).add(fields[1])
            if cursor == 0:
                return found

    def twin_counts(self, chunk: int = 1000) -> dict[str, int]:
        """Per tenant, the ticket twins counted now: the pods that present a ticket
        another pod owns and hold capacity, each counted as a pod of its own under
        ``<ticket>.twin.<uid>`` (:func:`fairshare.cluster.reconcile.twin_ticket`). Read with
        ``HSCAN`` ``chunk`` records at a time; tenants without twins are left out."""
        found: dict[str, int] = {}
        cursor = 0
        while True:
            cursor, records = self._client.hscan(self._keys[0] + "tk", cursor,
                                                 match="*.twin.*", count=chunk)
            assert isinstance(records, dict)  # without no_values, HSCAN answers a mapping
            for raw in records.values():
                tenant = text(raw).split("|", 2)[1]
                found[tenant] = found.get(tenant, 0) + 1
            if cursor == 0:
                return found

    # -- budgets -------------------------------------------------------------------

    def write_budgets(self, statuses: Iterable[BudgetStatus]) -> list[tuple[str, str, str]]:
        """Store every budgeted tenant's :class:`BudgetStatus` (hash ``budget``), dropping
        the entries of tenants not given; returns ``(tenant, before, after)`` per tenant
        whose state changed (``""``: no entry). Atomic, so of several dispatchers only one
        sees a given change. Call :meth:`sync_config` after a change to or from
        ``exhausted``: the borrow limit the queue enforces follows the stored state."""
        args: list[str | int | float] = []
        for status in statuses:
            args += [status.tenant, status.dumps(), status.state]
        raw = self._run("budget", *args)
        values = [text(v) for v in raw]
        return [(values[i], values[i + 1], values[i + 2]) for i in range(0, len(values), 3)]

    def budgets(self) -> dict[str, BudgetStatus]:
        """The stored budget statuses by tenant (entries that do not parse are left out)."""
        return read_budgets(self._client.hgetall(self._keys[0] + "budget"))

    # -- capacity notes ------------------------------------------------------------

    def write_capacity_notes(self, notes: Mapping[str, Any]) -> None:
        """Store the dispatcher's capacity report (JSON, key ``capacity-notes``) for
        ``fairgate status``. Informational: no script reads it, nothing is decided on it."""
        self._client.set(self._keys[0] + "capacity-notes", json.dumps(notes))

    def write_reclaim_notes(self, notes: Mapping[str, Any]) -> None:
        """Store the dispatcher's reclaim report (JSON, key ``reclaim-notes``; see
        :meth:`fairshare.dispatcher.Dispatcher`, "Reclaim") for ``fairgate status`` and
        the console. Informational: no script reads it, nothing is decided on it."""
        self._client.set(self._keys[0] + "reclaim-notes", json.dumps(notes))

    def reclaim_notes(self) -> dict[str, Any] | None:
        """What :meth:`write_reclaim_notes` stored last; None if nothing (or not JSON)."""
        return _json_object(self._client.get(self._keys[0] + "reclaim-notes"))

    def class_usage(self) -> dict[str, int]:
        """Cluster usage (all bands) per capacity key, as the queue holds it now
        (``fairgate status``; read-only)."""
        used: dict[str, int] = {}
        for field, value in self._client.hgetall(self._keys[0] + "used").items():
            key = text(field).partition(":")[2]
            used[key] = used.get(key, 0) + int(value)
        return {key: n for key, n in used.items() if n}

    def kept_reserve_slices(self) -> int:
        """The slices of the tenants' inference reserves that no inference pod uses and
        that are kept free of borrowed pods (0 unless ``fairShare.lendInferenceReserve``
        is false)."""
        return max(0, int(self._client.get(self._keys[0] + "ri") or 0))

    def capacity_notes(self) -> dict[str, Any] | None:
        """What :meth:`write_capacity_notes` stored last; None if nothing (or not JSON)."""
        return _json_object(self._client.get(self._keys[0] + "capacity-notes"))


def _json_object(raw: Any) -> dict[str, Any] | None:
    """A stored JSON object; None when nothing is stored, or it is not one."""
    if raw is None:
        return None
    try:
        notes = json.loads(raw)
    except ValueError:
        return None
    return notes if isinstance(notes, dict) else None


def _clock(now: float | None) -> list[str]:
    """The optional ``now`` argument of a script."""
    return [] if now is None else [num(now)]


def _gang_record(gang: str, fields: Sequence[Any]) -> GangRecord | None:
    size, running, members, source, awaiting, tenant = (
        None if v is None else text(v) for v in fields)
    if size is None:
        return None
    return GangRecord(
        gang=gang, size=None if int(size) >= UNKNOWN_GANG_SIZE else int(size),
        running=max(0, int(running or 0)),
        queued=len([t for t in (members or "").split(",") if t]),
        source=source or "", awaiting=awaiting or "", tenant=tenant or "")


def _ticket_status(ticket: str, raw: Any) -> TicketStatus | None:
    """The reply of ``why.lua`` for ``ticket`` as a :class:`TicketStatus` (None: unknown)."""
    if not raw:
        return None
    (state, tenant, cls, band, demand, ns, name, gang, _size, submitted, _seq, at,
     position, length, *reason) = (text(v) for v in raw)
    pod_class = CLASS_NAME[cls]
    queued = state in ("Q", "G")
    return TicketStatus(
        ticket=ticket,
        tenant=tenant,
        namespace=ns,
        name=name,
        pod_class=pod_class,
        band=BAND_NAME[band],
        demand=parse_counts(demand),
        state=STATE_NAME[state],
        position=int(position) if queued and int(position) > 0 else None,
        queue_length=int(length),
        waiting_for=explain(reason, tenant, pod_class) if queued else None,
        submitted_at=float(submitted),
        released_at=float(at) if at else None,
        group=gang or None,
    )
