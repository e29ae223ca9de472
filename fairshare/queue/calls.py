"""The fair queue's Lua scripts as calls: their source, their arguments, their replies.

Contract (pure: no I/O; shared by the synchronous :class:`fairshare.queue.fairqueue.FairQueue`
and the webhook's :class:`fairshare.queue.fastpath.AsyncFairQueue`, so both speak to the
same scripts in exactly the same way):

- :func:`library` is the one Redis Function library holding every operation
  (``scripts/library.lua`` framing the ``lib_<part>.lua`` helpers and each
  ``<op>.lua``), named after a hash of those sources; :meth:`Library.function` is the
  function an operation is called by (``FCALL``, or ``FCALL_RO`` for the
  :data:`READ_ONLY` ones). Loading and calling it is :mod:`fairshare.queue.functions`.
- ``*_args`` build a script's ARGV; the matching reply readers turn its reply into the
  typed values of :mod:`fairshare.queue.model`, raising :class:`TicketConflictError` where the
  reply says so.
- :func:`queue_error` turns a script's error reply into the queue's own exception
  (:class:`UnknownTenantError`, :class:`~fairshare.queue.model.InvalidRequestError`) or
  returns None for an error that is not the queue's (a bug: re-raise it).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources as importlib_resources
from typing import Any

from fairshare.queue.model import (
    UNKNOWN_GANG_SIZE,
    Admission,
    Hold,
    InvalidRequestError,
    PodRequest,
    PricedTicket,
    QueueSnapshot,
    TenantStatus,
    TicketState,
    gang_missing,
    gang_name,
)
from tenants.models import FairgateConfig, PodClass, PriorityBand
from tenants.placement import placement_of_key
from tenants.resources import ResourceCounts, format_counts, gpu_equivalents, parse_counts

BAND_CODE: dict[PriorityBand, str] = {"inference": "i", "training": "t", "borrowed": "b"}
BAND_NAME: dict[str, PriorityBand] = {code: band for band, code in BAND_CODE.items()}
CLASS_CODE: dict[PodClass, str] = {"inference": "i", "training": "t"}
CLASS_NAME: dict[str, PodClass] = {code: cls for cls, code in CLASS_CODE.items()}
STATE_NAME: dict[str, TicketState] = {
    "Q": "queued", "G": "gang-waiting", "R": "reserved", "A": "running",
}

Args = list[str | int | float]


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


class UnmintedTicketError(ValueError):
    """A pod CREATE presents a ``fairgate.io/ticket`` the queue holds no admission for:
    fairgate did not mint it for this pod (it was chosen by hand, or copied from a pod
    whose admission has ended), so it reserves and counts nothing."""

    def __init__(self, ticket: str) -> None:
        self.ticket = ticket
        super().__init__(
            f"this pod presents the ticket {ticket} (annotation fairgate.io/ticket), which "
            f"fairgate did not issue for it: fairgate sets fairgate.io/ticket, "
            f"fairgate.io/demand and fairgate.io/borrowed itself; remove them from the pod "
            f"(or from the template it was made from) and create it again"
        )


# Every operation of the queue: ``fairshare/queue/scripts/<op>.lua``, each a function of the
# library. The read-only ones are registered ``no-writes`` (Redis refuses a write from
# them) and called with FCALL_RO.
OPERATIONS = ("sync", "admit", "bind", "confirm", "dispatch", "forget", "expire", "requeue",
              "rebuild", "status", "why", "find", "demand", "holds", "budget", "service",
              "restore", "note_priced", "priced_for", "unsized", "resize")
READ_ONLY = frozenset({"status", "why", "find", "demand", "holds", "service", "unsized"})


@dataclass(frozen=True)
class Library:
    """The queue's Redis Function library: ``name`` (``fairgate_`` + 16 hex digits of
    the SHA-1 of every source it is made of, so each version of fairgate has its own
    library and functions, and two versions can run side by side on one Redis) and
    ``source``, the text for ``FUNCTION LOAD``."""

    name: str
    source: str

    def function(self, op: str) -> str:
        """The name of operation ``op``'s function in this library."""
        return f"{self.name}_{op}"


LIB_PARTS = ("base", "tenants", "usage", "lanes", "order", "holds", "reasons")
"""The parts of the queue's shared helpers (``scripts/lib_<part>.lua``), in the order they
are joined: each uses the top-level locals of those before it."""


def lib_source() -> str:
    """The shared helpers as one Lua chunk: every ``lib_<part>.lua`` of :data:`LIB_PARTS`."""
    scripts = importlib_resources.files("fairshare.queue.scripts")
    return "\n".join(scripts.joinpath(f"lib_{part}.lua").read_text() for part in LIB_PARTS)


@cache
def library() -> Library:
    """The library of this fairgate's Lua sources (see ``scripts/library.lua``)."""
    scripts = importlib_resources.files("fairshare.queue.scripts")

    def read(name: str) -> str:
        return scripts.joinpath(f"{name}.lua").read_text()

    def flags(op: str) -> str:
        return "{'no-writes'}" if op in READ_ONLY else "{}"

    operations = "".join(
        f"ops[{op!r}] = function(ARGV)\nbegin()\n{read(op)}\nend\n" for op in OPERATIONS)
    registrations = "".join(f"register({op!r}, {flags(op)})\n" for op in OPERATIONS)
    frame = read("library")
    for marker, text in (("--[[lib]]", lib_source()), ("--[[operations]]", operations),
                         ("--[[registrations]]", registrations)):
        if frame.count(marker) != 1:
            raise RuntimeError(f"scripts/library.lua must hold {marker} exactly once")
        frame = frame.replace(marker, text)
    name = "fairgate_" + hashlib.sha1(frame.encode()).hexdigest()[:16]
    return Library(name, frame.replace("--[[library]]", name))


def text(value: Any) -> str:
    """A reply element as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


# the first byte of a uuid ticket packed into 17 bytes in a lane (pack_entry in
# scripts/lib_usage.lua); no UTF-8 text begins with it
PACKED = 0xFF


def lane_entry(value: Any) -> str:
    """A lane entry as text: a ticket (a lowercase uuid one is stored packed: byte 255
    and its 16 bytes) or ``@<gang id>``."""
    if isinstance(value, bytes) and len(value) == 17 and value[0] == PACKED:
        return str(uuid.UUID(bytes=value[1:]))
    return text(value)


def num(value: float) -> str:
    """A float as text that Lua's tonumber reads back exactly."""
    if not math.isfinite(value):
        raise InvalidRequestError(f"time/weight {value!r} must be a finite number")
    return repr(float(value))


def queue_error(error: Exception) -> Exception | None:
    """The queue's exception for a script's error reply, or None if it is not one."""
    message = str(error)
    marker = "unknown tenant:"
    if marker in message:
        return UnknownTenantError(message.split(marker, 1)[1].split()[0].strip())
    if "invalid: " in message:
        return InvalidRequestError(message.split("invalid: ", 1)[1])
    return None


# -- sync ---------------------------------------------------------------------------


def sync_args(config: FairgateConfig, capacity: Mapping[str, int] | None) -> Args:
    """ARGV of ``sync.lua``: capacity (None keeps), the usage half-life (-1: virtual
    time), every tenant's weight and quota, and the reserve kept free of borrowed pods
    (all of it unless ``fairShare.lendInferenceReserve``)."""
    args: Args = ["0", ""] if capacity is None else ["1", format_counts(capacity)]
    fair_share = config.platform.fair_share
    half_life = fair_share.usage_half_life
    args.append(num(-1.0 if half_life is None else half_life))
    for tenant in config.tenants():
        args += [
            tenant.name,
            num(tenant.weight),
            tenant.borrow_slices,
            tenant.reserve_slices,
            format_counts(tenant.nominal),
            0 if fair_share.lend_inference_reserve else tenant.reserve_slices,
        ]
    return args


# -- admit --------------------------------------------------------------------------


def admit_args(
    req: PodRequest, now: float, dry_run: bool, wait_for_rebuild: bool, presented: bool,
) -> Args:
    """ARGV of ``admit.lua``."""
    return [
        num(now),
        1 if dry_run else 0,
        req.ticket,
        req.tenant,
        req.namespace,
        req.name,
        CLASS_CODE[req.pod_class],
        format_counts(req.demand),
        req.gang or "",
        req.group_size if req.gang else 1,
        num(req.submitted_at),
        1 if wait_for_rebuild else 0,
        1 if presented else 0,
        1 if req.hold else 0,
        req.group_source if req.gang else "",
        req.group_awaiting if req.gang else "",
        run_arg(req.run_seconds),
    ]


def run_arg(run_seconds: int | None) -> str:
    """A declared run time as the scripts take it (F_RUN): seconds, or '' for none."""
    return "" if run_seconds is None else str(run_seconds)


def admission(raw: Sequence[Any], req: PodRequest) -> Admission:
    """The reply of ``admit.lua`` for ``req``; raises :class:`TicketConflictError` or
    :class:`UnmintedTicketError`."""
    fields = [text(v) for v in raw]
    if fields[1] == "unminted":
        raise UnmintedTicketError(req.ticket)
    if fields[1] == "conflict":
        _, _, state, owner_ns, owner_name = fields
        raise TicketConflictError(req.ticket, STATE_NAME[state], owner_ns, owner_name)
    dup, outcome, band, position, length, free, nominal, *reason = fields
    queued = outcome == "queued"
    return Admission(
        outcome="queued" if queued else "reserved",
        band=BAND_NAME[band],
        position=int(position) if queued and int(position) > 0 else None,
        queue_length=int(length),
        free_slices=int(free),
        nominal_slices=int(nominal),
        waiting_for=explain(reason, req.tenant, req.pod_class) if queued else None,
        duplicate=dup == "1",
        reason=tuple(reason) if queued else (),
    )


# -- bind ---------------------------------------------------------------------------


def resize_args(sizes: Mapping[str, int]) -> list[str | int]:
    """ARGV of ``resize.lua``: gang id, size, ... (sizes from 1 to below
    :data:`~fairshare.queue.model.UNKNOWN_GANG_SIZE`)."""
    args: list[str | int] = []
    for gid, size in sorted(sizes.items()):
        if not 1 <= size < UNKNOWN_GANG_SIZE:
            raise InvalidRequestError(f"gang {gid}: size {size} is not a gang size")
        args += [gid, size]
    return args


def bind_args(ticket: str, uid: str, namespace: str, name: str, dry_run: bool) -> Args:
    """ARGV of ``bind.lua``."""
    return [ticket, uid, namespace, name, 1 if dry_run else 0]


def claimed(raw: Sequence[Any], ticket: str) -> bool:
    """The reply of ``bind.lua``: True when the ticket is now this pod's, False when the
    queue does not know it; raises :class:`TicketConflictError` when another pod owns it."""
    fields = [text(v) for v in raw]
    if fields[0] == "-1":
        raise TicketConflictError(ticket, "claimed", fields[1], fields[2])
    return fields[0] == "1"


# -- status -------------------------------------------------------------------------


def tenant_statuses(raw: Sequence[Any]) -> list[TenantStatus]:
    """The reply of ``status.lua``: every known tenant, by name."""
    result: list[TenantStatus] = []
    for entry in raw:
        fields = dict(zip(*[iter(text(v) for v in entry)] * 2, strict=True))
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
                used=parse_counts(fields["used"]),
                used_slices=total,
                borrowed_slices=int(fields["ub"]),
                training_slices=int(fields["ut"]),
                inference_slices=int(fields["ui"]),
                running_by_key=parse_counts(fields["keys"]),
                running_inference_by_key=parse_counts(fields["ikeys"]),
                queued={"inference": int(fields["qci"]), "training": int(fields["qct"])},
                weighted_share=total / weight,
            )
        )
    return result


def queue_snapshot(status_raw: Sequence[Any], demand_raw: Sequence[Any]) -> QueueSnapshot:
    """The replies of ``status.lua`` and ``demand.lua`` (read in one transaction) as a
    snapshot."""
    capacity, *rows = (text(v) for v in demand_raw)
    tenants = rows[::5]
    return QueueSnapshot(
        tenants=tuple(tenant_statuses(status_raw)),
        queued_slices={t: int(n) for t, n in zip(tenants, rows[1::5], strict=True)},
        capacity=parse_counts(capacity),
        queued_inference_slices={t: int(n) for t, n in zip(tenants, rows[2::5], strict=True)},
        queued_by_key={t: parse_counts(c) for t, c in zip(tenants, rows[3::5], strict=True)},
        queued_inference_by_key={t: parse_counts(c)
                                 for t, c in zip(tenants, rows[4::5], strict=True)},
    )


def holds(raw: Sequence[Any]) -> list[Hold]:
    """The reply of ``holds.lua``: the capacity held now, per tier in queue order."""
    result: list[Hold] = []
    for entry in raw:
        tier, tenant, shape, held, head, ns, name = (text(v) for v in entry)
        demand: dict[str, int] = {}
        for _band, counts in shape_bands(shape):
            for res, units in counts.items():
                demand[res] = demand.get(res, 0) + units
        result.append(Hold(
            tenant=tenant, band=BAND_NAME[tier], demand=demand, held=parse_counts(held),
            namespace=ns, name=name, group=head[1:] if head.startswith("@") else None,
        ))
    return result


def shape_bands(shape: str) -> list[tuple[PriorityBand, ResourceCounts]]:
    """A lane's shape, ``<band code>/<counts>`` per band of its entry joined by ``+``
    (``t/gpu=1+b/gpu=3``), as ``(band, counts)`` pairs in that order."""
    return [(BAND_NAME[code], parse_counts(counts))
            for code, _, counts in (part.partition("/") for part in shape.split("+"))]


def shape_in_words(shape: str) -> str:
    """A lane's shape for people: ``t/gpu=1+b/gpu=3`` is ``1 GPU training + 3 GPUs
    borrowed`` (the units in each priority band: training within the tenant's nominal
    quota, borrowed above it); MIG devices by profile, a placement class named."""
    said = []
    for band, counts in shape_bands(shape):
        for key, units in sorted(counts.items()):
            resource, where = placement_of_key(key)
            name = (("GPU" if units == 1 else "GPUs") if resource == "gpu"
                    else resource.replace("mig-", "MIG ", 1))
            if key != resource:
                name += f" ({where.describe()})"
            said.append(f"{units} {name} {band}")
    return " + ".join(said)


def in_words(key: str) -> str:
    """A capacity key for people: the resource, with its placement class unless it is
    the default one (``mig-1g.5gb (MIG single 1g.5gb in pool a)``)."""
    resource, where = placement_of_key(key)
    return resource if key == resource else f"{resource} ({where.describe()})"


def gang_reason(rest: Sequence[str]) -> tuple[str, int, int | None, str, str]:
    """The fields of a ``gang`` reason (lib_reasons.lua): gang id, members created (queued or
    running), size (None: unknown), source and what the size awaits (``""`` from a
    queue that did not store them)."""
    gang, created, size = rest[0], int(rest[1]), int(rest[2])
    source = rest[3] if len(rest) > 3 else ""
    awaiting = rest[4] if len(rest) > 4 else ""
    return gang, created, None if size == UNKNOWN_GANG_SIZE else size, source, awaiting


def gang_wait(gang: str, created: int, size: int | None, source: str = "",
              awaiting: str = "") -> str:
    """What a member of an incomplete gang waits for, after ``waiting for``: ``the 4th
    pod of gang of Indexed Job trainer (3 of 4 pods created)``, ``2 more pods of ...``,
    or ``the size of gang of JobSet trainer (3 pods created; known once JobSet trainer
    is seen)``."""
    name = gang_name(gang, source)
    if size is None:
        once = (f"known once {awaiting}" if awaiting
                else "the object that declares it has not been seen")
        made = "1 pod" if created == 1 else f"{created} pods"
        return f"the size of {name} ({made} created; {once})"
    missing = gang_missing(created, size) or "no more"
    pods = "pod" if missing.startswith("the ") else "pods"
    return f"{missing} {pods} of {name} ({created} of {size} pods created)"


def explain(reason: Sequence[str], tenant: str, pod_class: PodClass) -> str:
    """Words for a reason code returned by the scripts (see the scripts' ``reason``)."""
    code, *rest = reason
    if code == "gang":
        return gang_wait(*gang_reason(rest))
    if code == "never":
        return ("a larger quota: it never fits the tenant's nominal quota (less the "
                "inference reserve for training) and borrow limit")
    if code == "quota":
        return f"{gpu_equivalents(int(rest[0]))} GPU-eq of tenant quota"
    if code == "borrow":
        return f"{gpu_equivalents(int(rest[0]))} GPU-eq of borrow limit"
    if code == "capacity":
        return f"{rest[1]} x {in_words(rest[0])} of cluster capacity"
    if code == "reserve":
        return (f"{rest[1]} x {in_words(rest[0])} of cluster capacity: borrowed pods leave "
                "the tenants' unused inferenceReserve free")
    if code == "held":
        unit = "GPUs" if rest[0] == "gpu" else in_words(rest[0])
        return f"capacity held for you: {rest[1]} of {rest[2]} {unit}"
    if code == "guard":
        return f"{in_words(rest[0])} capacity held for {rest[1]} (ahead in fair-share order)"
    if code == "ahead":
        return f"{rest[0]} {pod_class} pod(s) ahead in {tenant}"
    if code == "inference":
        return "inference pods released first"
    if code == "priority":
        return "training pods within nominal quota released first"
    if code == "rebuild":
        return "the dispatcher to restore usage from the cluster (Redis lost its data)"
    if code == "claims":
        return "the dispatcher to check the ResourceClaims it will be allocated"
    if code == "release":
        return "the dispatcher to release it: it fits now"
    if code == "turn":
        return "its turn: tenants with a lower weighted share (or an older pod) go first"
    return code


# -- priced objects -----------------------------------------------------------------

PRICED_LIFETIME = 30 * 24 * 3600
"""Seconds an object's entry of what admitted pods were priced for lives after its
last write (``note_priced.lua``)."""


def note_priced_args(ticket: str, priced: Mapping[str, ResourceCounts],
                     lifetime: int = PRICED_LIFETIME) -> Args:
    """ARGV of ``note_priced.lua``: ``priced`` is object key -> devices (see
    :attr:`admission.claimguard.DraObjectRef.key`)."""
    args: Args = [ticket, lifetime]
    for key in sorted(priced):
        args += [key, format_counts(priced[key])]
    return args


def priced_tickets(raw: Sequence[Any]) -> list[PricedTicket]:
    """The reply of ``priced_for.lua``."""
    fields = [text(v) for v in raw]
    return [
        PricedTicket(ticket=fields[i], devices=parse_counts(fields[i + 1]),
                     state=STATE_NAME[fields[i + 2]], namespace=fields[i + 3],
                     name=fields[i + 4])
        for i in range(0, len(fields) - 4, 5)
    ]
