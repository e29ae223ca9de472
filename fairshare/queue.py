"""The weighted-fair GPU queue, held in Redis.

Contract (rules in ``fairshare/README.md``; key layout there too):
- Every state change is one Lua script (``fairshare/scripts/*.lua``), so any number of
  webhooks and dispatchers may call a :class:`FairQueue` on the same Redis at once.
- :meth:`FairQueue.admit` reserves a pod now (fast path) or queues it, and picks its
  priority band; it is idempotent per ticket, and ``dry_run`` writes nothing.
- :meth:`FairQueue.dispatch` releases queued pods in queue order: class first
  (inference, then training; within training, the training band before borrowed
  pods), then the tenant with the lowest weighted share (slices used / weight; ties
  by tenant name), then FIFO; gangs all at once.
- Quota safety holds at every instant: per tenant, non-borrowed usage per resource
  <= nominal, non-borrowed training slices <= nominal - inference reserve, borrowed
  slices <= borrow limit; cluster capacity per band (lower bands count as free).
- :meth:`FairQueue.rebuild` replaces usage and queue with the cluster's truth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources as importlib_resources
from typing import Any

import redis
from redis.commands.core import Script

from fairshare.model import (
    Admission,
    GatedPod,
    InvalidRequestError,
    PodRequest,
    Release,
    RunningPod,
    TenantStatus,
    TicketState,
    TicketStatus,
)
from tenants.models import FairgateConfig, PodClass, PriorityBand
from tenants.resources import format_counts, gpu_equivalents, parse_counts

_BAND_CODE: dict[PriorityBand, str] = {"inference": "i", "training": "t", "borrowed": "b"}
_BAND_NAME: dict[str, PriorityBand] = {code: band for band, code in _BAND_CODE.items()}
_CLASS_CODE: dict[PodClass, str] = {"inference": "i", "training": "t"}
_CLASS_NAME: dict[str, PodClass] = {code: cls for cls, code in _CLASS_CODE.items()}
_STATE_NAME: dict[str, TicketState] = {
    "Q": "queued", "G": "gang-waiting", "R": "reserved", "A": "running",
}
_SCRIPTS = ("sync", "admit", "confirm", "dispatch", "forget", "expire", "requeue",
            "rebuild", "status", "why", "find")
DEFAULT_STARVATION_SECONDS = 300.0


class UnknownTenantError(LookupError):
    """The queue has no configuration for a tenant (``sync_config`` never named it)."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        super().__init__(
            f"tenant {tenant!r} is not configured in the queue: add it to platform.yaml "
            f"and call FairQueue.sync_config (the dispatcher does this on config changes)"
        )


class TicketConflictError(ValueError):
    """A pod CREATE carries the ticket of another pod (its YAML was copied, with the
    ``fairgate.io/ticket`` annotation, from a pod fairgate admitted): the stored
    reservation or queue place belongs to that pod, never to this one."""

    def __init__(self, ticket: str, state: TicketState, namespace: str, name: str) -> None:
        self.ticket = ticket
        self.state = state
        self.namespace = namespace
        self.name = name
        super().__init__(
            f"ticket {ticket} belongs to pod {namespace}/{name} ({state}): this pod's "
            f"fairgate.io/* annotations were copied from it; remove them and create it again"
        )


def _load_script(client: redis.Redis, name: str, library: str) -> Script:
    text = importlib_resources.files("fairshare.scripts").joinpath(f"{name}.lua").read_text()
    return client.register_script(library + "\n" + text)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value: float) -> str:
    """A float as text that Lua's tonumber reads back exactly."""
    if not math.isfinite(value):
        raise InvalidRequestError(f"time/weight {value!r} must be a finite number")
    return repr(float(value))


class FairQueue:
    """Weighted-fair queue and quota ledger for GPU pods in one Redis.

    ``prefix`` namespaces every key; ``reservation_ttl`` is how long a fast-path
    reservation lives without :meth:`confirm`; ``starvation_seconds`` is the starvation
    guard: a ready pod blocked only by cluster capacity, which has waited that long,
    gets the capacity it needs reserved (no other pod of its band using one of its
    resources is released before it). With ``wait_for_rebuild``, :meth:`admit`
    reserves nothing on a Redis where :meth:`rebuild` never ran (a fresh or restarted
    Redis knows no usage yet): pods queue until the reconciler has rebuilt usage.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "fairgate:",
        reservation_ttl: float = 30.0,
        starvation_seconds: float = DEFAULT_STARVATION_SECONDS,
        wait_for_rebuild: bool = False,
    ) -> None:
        if reservation_ttl <= 0 or starvation_seconds < 0:
            raise ValueError(
                "reservation_ttl must be > 0 and starvation_seconds >= 0 (seconds)"
            )
        self._client = client
        self._keys = [prefix]
        self.reservation_ttl = reservation_ttl
        self.starvation_seconds = starvation_seconds
        self.wait_for_rebuild = wait_for_rebuild
        library = (
            importlib_resources.files("fairshare.scripts").joinpath("lib.lua").read_text()
        )
        self._scripts = {name: _load_script(client, name, library) for name in _SCRIPTS}

    def _run(self, name: str, *args: str | int | float) -> Any:
        try:
            return self._scripts[name](keys=self._keys, args=list(args))
        except redis.ResponseError as exc:
            message = str(exc)
            marker = "unknown tenant:"
            if marker in message:
                tenant = message.split(marker, 1)[1].split()[0].strip()
                raise UnknownTenantError(tenant) from exc
            if "invalid: " in message:
                raise InvalidRequestError(message.split("invalid: ", 1)[1]) from exc
            raise

    # -- configuration -------------------------------------------------------------

    def sync_config(
        self, config: FairgateConfig, capacity: Mapping[str, int] | None
    ) -> None:
        """Store every tenant's weight and quota (in slices) and the cluster capacity.

        ``capacity=None`` keeps the capacity already stored (a caller that does not see
        the nodes, like the webhook, must not wipe what the dispatcher stored). Safe to
        repeat; tenants missing from ``config`` keep their usage but get an empty quota.
        Lowering a quota or capacity evicts nothing: new pods wait until usage drops.
        """
        args: list[str | int | float] = (
            ["0", ""] if capacity is None else ["1", format_counts(capacity)]
        )
        for tenant in config.tenants():
            args += [
                tenant.name,
                _num(tenant.weight),
                tenant.borrow_slices,
                tenant.reserve_slices,
                format_counts(tenant.nominal),
            ]
        self._run("sync", *args)

    # -- the webhook's fast path ---------------------------------------------------

    def admit(self, req: PodRequest, now: float, dry_run: bool = False) -> Admission:
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
        """
        raw = self._run(
            "admit",
            _num(now),
            1 if dry_run else 0,
            req.ticket,
            req.tenant,
            req.namespace,
            req.name,
            _CLASS_CODE[req.pod_class],
            format_counts(req.demand),
            req.gang or "",
            req.group_size if req.gang else 1,
            _num(req.submitted_at),
            _num(self.starvation_seconds),
            1 if self.wait_for_rebuild else 0,
        )
        fields = [_s(v) for v in raw]
        if fields[1] == "conflict":
            _, _, state, owner_ns, owner_name = fields
            raise TicketConflictError(req.ticket, _STATE_NAME[state], owner_ns, owner_name)
        dup, outcome, band, position, length, free, nominal, *reason = fields
        queued = outcome == "queued"
        return Admission(
            outcome="queued" if queued else "reserved",
            band=_BAND_NAME[band],
            position=int(position) if queued and int(position) > 0 else None,
            queue_length=int(length),
            free_slices=int(free),
            nominal_slices=int(nominal),
            waiting_for=_explain(reason, req.tenant, req.pod_class) if queued else None,
            duplicate=dup == "1",
        )

    def confirm(self, ticket: str, now: float) -> bool:
        """The pod of ``ticket`` exists: its reservation no longer expires.

        Returns False when the ticket is unknown (expired or never reserved).
        """
        return bool(self._run("confirm", ticket, _num(now)))

    # -- the dispatcher ------------------------------------------------------------

    def dispatch(self, now: float, limit: int = 1) -> list[Release]:
        """Release up to ``limit`` queue units (a pod, or a whole gang) that may run now.

        Their usage is held from this moment; lift their gates, or :meth:`requeue`
        them when that fails.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        raw = self._run("dispatch", _num(now), limit, _num(self.starvation_seconds))
        releases: list[Release] = []
        for i in range(0, len(raw), 7):
            ticket, tenant, ns, name, band, demand, submitted = (_s(v) for v in raw[i : i + 7])
            releases.append(
                Release(
                    ticket=ticket,
                    tenant=tenant,
                    namespace=ns,
                    name=name,
                    band=_BAND_NAME[band],
                    demand=parse_counts(demand),
                    waited_seconds=max(0.0, now - float(submitted)),
                )
            )
        return releases

    def release(self, ticket: str) -> bool:
        """The pod of ``ticket`` ended or was deleted: free its usage or queue place.

        Idempotent; returns False when the ticket was unknown.
        """
        return bool(self._run("forget", ticket, "any"))

    def remove(self, ticket: str) -> bool:
        """A queued pod was deleted: drop it from the queue (a gang becomes incomplete).

        Does nothing and returns False unless the ticket is queued.
        """
        return bool(self._run("forget", ticket, "queued"))

    def expire(self, now: float) -> list[str]:
        """Free fast-path reservations older than ``reservation_ttl`` never confirmed."""
        raw = self._run("expire", _num(now - self.reservation_ttl))
        return [_s(v) for v in raw]

    def requeue(self, ticket: str) -> bool:
        """A released pod's gate could not be lifted: free its usage and queue it again
        at the head of its queue (a gang member is retried alone).

        Returns False unless the ticket was reserved or running.
        """
        return bool(self._run("requeue", ticket))

    # -- the reconciler ------------------------------------------------------------

    def is_rebuilt(self) -> bool:
        """Whether :meth:`rebuild` has run on this Redis since it was last emptied."""
        return bool(self._client.exists(self._keys[0] + "rebuilt"))

    def rebuild(
        self,
        running: Iterable[RunningPod],
        gated: Iterable[GatedPod],
        listed_at: float | None = None,
    ) -> None:
        """Atomically replace usage and queue with the cluster's truth.

        ``running``: pods holding GPUs; ``gated``: pods still gated, queued in order of
        ``submitted_at`` (then ticket). ``listed_at``: when the pods were listed (the
        caller's clock, the one ``admit`` and ``dispatch`` get). Tickets reserved or
        released by dispatch later than ``listed_at - reservation_ttl`` are in flight
        (the list cannot show them yet) and are kept with their usage, also when the
        list shows their pod gated or not at all; an unconfirmed one still expires.
        With ``listed_at=None`` the lists are taken as complete (nothing reserved or
        dispatched since): every other ticket is dropped. Configuration is kept.
        """
        cutoff = "" if listed_at is None else _num(listed_at - self.reservation_ttl)
        args: list[str | int | float] = [cutoff]
        for pod in running:
            args += ["A", pod.ticket, pod.tenant, pod.namespace, pod.name,
                     _CLASS_CODE[pod.pod_class], _BAND_CODE[pod.band],
                     format_counts(pod.demand), pod.gang or "",
                     pod.group_size if pod.gang else 1, _num(0.0)]
        ordered = sorted(gated, key=lambda g: (g.request.submitted_at, g.request.ticket))
        for gated_pod in ordered:
            req = gated_pod.request
            args += ["Q", req.ticket, req.tenant, req.namespace, req.name,
                     _CLASS_CODE[req.pod_class], _BAND_CODE[gated_pod.band],
                     format_counts(req.demand), req.gang or "",
                     req.group_size if req.gang else 1, _num(req.submitted_at)]
        self._run("rebuild", *args)

    # -- snapshots -----------------------------------------------------------------

    def tenant_status(self) -> list[TenantStatus]:
        """Every known tenant's quota, usage, backlog and weighted share, by name."""
        raw = self._run("status")
        result: list[TenantStatus] = []
        for entry in raw:
            fields = dict(zip(*[iter(_s(v) for v in entry)] * 2, strict=True))
            used = parse_counts(fields["used"])
            weight = float(fields["w"])
            total = int(fields["ui"]) + int(fields["ut"]) + int(fields["ub"])
            result.append(
                TenantStatus(
                    tenant=fields["tenant"],
                    weight=weight,
                    nominal=parse_counts(fields["nominal"]),
                    nominal_slices=int(fields["ns"]),
                    borrow_limit_slices=int(fields["b"]),
                    inference_reserve_slices=int(fields["rs"]),
                    used=used,
                    used_slices=total,
                    borrowed_slices=int(fields["ub"]),
                    training_slices=int(fields["ut"]),
                    inference_slices=int(fields["ui"]),
                    queued={"inference": int(fields["qci"]), "training": int(fields["qct"])},
                    weighted_share=total / weight,
                )
            )
        return result

    def find(self, namespace: str, name: str) -> str | None:
        """The ticket of the known (reserved, queued or running) pod ``namespace/name``.

        ``name`` is the name the pod was admitted or last rebuilt with: a pod created
        with ``generateName`` is found as ``<generateName>*`` until a rebuild lists it
        under its own name. None when no such pod is known.
        """
        return _s(self._run("find", namespace, name)) or None

    def ticket_status(self, ticket: str, now: float) -> TicketStatus | None:
        """Where ``ticket`` stands and, when queued, what it waits for; None if unknown."""
        raw = self._run("why", ticket, _num(now), _num(self.starvation_seconds))
        if not raw:
            return None
        (state, tenant, cls, band, demand, ns, name, gang, _size, submitted, _seq, at,
         position, length, *reason) = (_s(v) for v in raw)
        pod_class = _CLASS_NAME[cls]
        queued = state in ("Q", "G")
        return TicketStatus(
            ticket=ticket,
            tenant=tenant,
            namespace=ns,
            name=name,
            pod_class=pod_class,
            band=_BAND_NAME[band],
            demand=parse_counts(demand),
            state=_STATE_NAME[state],
            position=int(position) if queued and int(position) > 0 else None,
            queue_length=int(length),
            waiting_for=_explain(reason, tenant, pod_class) if queued else None,
            submitted_at=float(submitted),
            released_at=float(at) if at else None,
            group=gang or None,
        )


def _explain(reason: Sequence[str], tenant: str, pod_class: PodClass) -> str:
    """Words for a reason code returned by the scripts (see lib.lua ``reason``)."""
    code, *rest = reason
    if code == "gang":
        return f"gang {rest[0]}: {rest[1]} of {rest[2]} members queued"
    if code == "never":
        return "never fits: demand exceeds the tenant's nominal quota and borrow limit"
    if code == "quota":
        return f"{gpu_equivalents(int(rest[0]))} GPU-eq of tenant quota"
    if code == "borrow":
        return f"{gpu_equivalents(int(rest[0]))} GPU-eq of borrow limit"
    if code == "capacity":
        return f"{rest[1]} x {rest[0]} of cluster capacity"
    if code == "guard":
        return f"{rest[0]} capacity held for a pod waiting longer (starvation guard)"
    if code == "ahead":
        return f"{rest[0]} {pod_class} pod(s) ahead in {tenant}"
    if code == "inference":
        return "inference pods released first"
    if code == "priority":
        return "training pods within nominal quota released first"
    if code == "rebuild":
        return "the dispatcher to restore usage from the cluster (Redis lost its data)"
    if code == "turn":
        return "its turn: tenants with a lower weighted share go first"
    return code
