"""A small, slow, pure-Python model of the fair queue's rules (fairshare/queue/README.md).

It keeps plain lists and dicts and recomputes everything (usage, readiness, shares,
holds) from the ticket records on every call, so it shares no bookkeeping with the
Lua scripts: the stateful test drives both with the same operations and compares
every answer. Shares are current usage / weight (``usageHalfLife: 0``), the one order
that follows from the records alone: virtual time and decayed usage depend on the
service history, and are tested on their own (test_virtual_time.py, test_fair_order.py).
Everything else (bands, quota, capacity, holds, gangs) is the same in every order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairshare.queue.calls import TicketConflictError, explain
from fairshare.queue.model import Admission, PodRequest, Release, TicketState
from tenants.models import FairgateConfig, PodClass, PriorityBand
from tenants.resources import ResourceCounts, format_counts, slices_of, total_slices

BANDS = ("i", "t", "b")
PRIO = {"i": 3, "t": 2, "b": 1}
BAND_CODE: dict[PriorityBand, str] = {"inference": "i", "training": "t", "borrowed": "b"}
BAND_NAME: dict[str, PriorityBand] = {v: k for k, v in BAND_CODE.items()}
CLASS_CODE: dict[PodClass, str] = {"inference": "i", "training": "t"}
STATE_NAME: dict[str, TicketState] = {
    "Q": "queued", "G": "gang-waiting", "R": "reserved", "A": "running",
}

Shape = dict[str, ResourceCounts]  # band code -> counts


def shape_key(shape: Shape) -> str:
    return "+".join(f"{b}/{format_counts(shape[b])}" for b in BANDS if any(shape[b].values()))


def shape_tier(shape: Shape) -> str:
    """The lowest band in the shape: dispatch serves tiers i, t, b in that order."""
    if any(shape["i"].values()):
        return "i"
    return "b" if any(shape["b"].values()) else "t"


def shape_resources(shape: Shape) -> set[str]:
    return {r for b in BANDS for r, n in shape[b].items() if n}


def empty_shape() -> Shape:
    return {"i": {}, "t": {}, "b": {}}


@dataclass
class Cfg:
    w: float = 1.0
    n: ResourceCounts = field(default_factory=dict)
    b: int = 0
    rs: int = 0
    known: bool = False

    @property
    def ns(self) -> int:
        return total_slices(self.n)


@dataclass
class Rec:
    state: str  # Q G R A
    tenant: str
    cls: str
    band: str
    demand: ResourceCounts
    ns: str
    name: str
    gang: str
    gsize: int
    submitted: float
    seq: int
    at: float | None = None
    uid: str = ""  # the pod the ticket is bound to ("" while unseen)


@dataclass
class Gang:
    tenant: str
    cls: str
    size: int
    members: list[str] = field(default_factory=list)
    running: int = 0
    linked: str | None = None  # lane shape key while in a lane


@dataclass
class Top:
    """The first tenant in queue order of one ready shape."""

    key: str
    tenant: str
    score: float
    at: float
    seq: float
    blocked: bool
    hold: Shape = field(default_factory=empty_shape)  # units held for it (plan)

    @property
    def order(self) -> tuple[float, float, float]:
        return self.score, self.at, self.seq


class Reference:
    """The rules, naively."""

    def __init__(self) -> None:
        self.cfg: dict[str, Cfg] = {}
        self.cap: ResourceCounts = {}
        self.tenants: set[str] = set()
        self.recs: dict[str, Rec] = {}
        self.lanes: dict[tuple[str, str], list[str]] = {}
        self.lane_shapes: dict[str, Shape] = {}
        self.gangs: dict[str, Gang] = {}
        self.resv: dict[str, float] = {}
        self.seq = 0

    # -- derived state -------------------------------------------------------------

    def cfg_of(self, tenant: str) -> Cfg:
        return self.cfg.get(tenant, Cfg())

    def usage(self, tenant: str) -> dict[str, int]:
        """u:<res> (non-borrowed units), ui/ut/ub slices."""
        u: dict[str, int] = {"ui": 0, "ut": 0, "ub": 0}
        for rec in self.recs.values():
            if rec.tenant == tenant and rec.state in ("R", "A"):
                u["u" + rec.band] += total_slices(rec.demand)
                if rec.band != "b":
                    for r, n in rec.demand.items():
                        u["u:" + r] = u.get("u:" + r, 0) + n
        return u

    def cluster_used(self, band: str, res: str) -> int:
        return sum(rec.demand.get(res, 0) for rec in self.recs.values()
                   if rec.state in ("R", "A") and rec.band == band)

    def queued(self, tenant: str, states: tuple[str, ...] = ("Q", "G")) -> list[Rec]:
        return [r for r in self.recs.values() if r.tenant == tenant and r.state in states]

    def share(self, tenant: str) -> float:
        u = self.usage(tenant)
        return (u["ui"] + u["ut"] + u["ub"]) / self.cfg_of(tenant).w

    def quota_check(self, tenant: str, shape: Shape, idle: bool = False) -> list[object] | None:
        cfg = self.cfg_of(tenant)
        u = {"ui": 0, "ut": 0, "ub": 0} if idle else self.usage(tenant)
        nb: dict[str, int] = {}
        for b in ("i", "t"):
            for r, n in shape[b].items():
                nb[r] = nb.get(r, 0) + n
        missing = 0
        for r in sorted(nb):
            over = u.get("u:" + r, 0) + nb[r] - cfg.n.get(r, 0)
            if over > 0:
                missing += over * slices_of(r)
        if any(shape["t"].values()):
            over = u["ut"] + total_slices(shape["t"]) - (cfg.ns - cfg.rs)
            missing = max(missing, over)
        if missing > 0:
            return ["quota", missing]
        if any(shape["b"].values()):
            over = u["ub"] + total_slices(shape["b"]) - cfg.b
            if over > 0:
                return ["borrow", over]
        return None

    def cap_check(self, shape: Shape, guards: Shape | None, idle: bool = False
                  ) -> tuple[str, int] | None:
        for band in BANDS:
            for res in sorted(r for r, n in shape[band].items() if n):
                need = 0
                for b2 in BANDS:
                    if PRIO[b2] >= PRIO[band]:
                        need += shape[b2].get(res, 0)
                        if not idle:
                            need += self.cluster_used(b2, res)
                if guards is not None:
                    need += guards[band].get(res, 0)
                over = need - self.cap.get(res, 0)
                if over > 0:
                    return res, over
        return None

    def entry_info(self, entry: str) -> tuple[int, float]:
        if not entry.startswith("@"):
            rec = self.recs[entry]
            return rec.seq, rec.submitted
        members = [self.recs[t] for t in self.gangs[entry[1:]].members]
        return max(m.seq for m in members), max(m.submitted for m in members)

    def ready(self, tier: str) -> dict[str, list[tuple[float, str]]]:
        """Shape key -> ready tenants (share, name), sorted."""
        out: dict[str, list[tuple[float, str]]] = {}
        for (tenant, key), entries in self.lanes.items():
            shape = self.lane_shapes[key]
            if entries and shape_tier(shape) == tier and self.quota_check(tenant, shape) is None:
                out.setdefault(key, []).append((self.share(tenant), tenant))
        for v in out.values():
            v.sort()
        return out

    def survey(self, tier: str) -> list[Top]:
        """Per ready shape of the tier its first tenant (share, oldest head), in order."""
        tops: list[Top] = []
        for key, tenants in self.ready(tier).items():
            heads = [(score, *self.entry_info(self.lanes[(t, key)][0])[::-1], t)
                     for score, t in tenants]
            score, at, seq, tenant = min(heads)
            shape = self.lane_shapes[key]
            tops.append(Top(key, tenant, score, at, seq,
                            self.cap_check(shape, None) is not None))
        return sorted(tops, key=lambda top: top.order)

    def below_share(self, tenant: str, tier: str) -> bool:
        """slices used / weight < capacity slices / weight of the tier's ready tenants."""
        ready = {t for tenants in self.ready(tier).values() for _, t in tenants}
        w = sum(self.cfg_of(t).w for t in ready)
        u = self.usage(tenant)
        used = u["ui"] + u["ut"] + u["ub"]
        return w > 0 and used * w < total_slices(self.cap) * self.cfg_of(tenant).w

    def free_for(self, band: str, res: str) -> int:
        """Units of ``res`` free for an entry of ``band`` (lower bands count as free)."""
        return self.cap.get(res, 0) - sum(self.cluster_used(b2, res) for b2 in BANDS
                                          if PRIO[b2] >= PRIO[band])

    def plan(self, tops: list[Top], tier: str, stop: tuple[float, float, float] | None = None,
             counts: ResourceCounts | None = None) -> tuple[Shape, Top | None, list[Top]]:
        """Holds G, the first top that fits given the holds of the tops before it
        (sharing a resource with ``counts`` if given), and the held tops, walking the
        tops before ``stop``. A top that does not fit is owed capacity when its tenant
        is below its weighted share and the cluster could ever hold it: of each
        resource of its demand, the free units not held for the tops before it, up to
        its demand (``top.hold``; an owed top may hold nothing). No half-life here: the
        first tenant of a shape has its lowest share, so no later one is owed."""
        guards = empty_shape()
        held: list[Top] = []
        for top in tops:
            if stop is not None and top.order >= stop:
                break
            shape = self.lane_shapes[top.key]
            if self.cap_check(shape, guards) is None:
                if counts is None or shape_resources(shape) & {r for r, n in counts.items() if n}:
                    return guards, top, held
            elif (self.cap_check(shape, None, idle=True) is None
                  and self.below_share(top.tenant, tier)):
                for b in BANDS:
                    for r, n in shape[b].items():
                        units = min(n, self.free_for(b, r) - guards[b].get(r, 0))
                        if n and units > 0:
                            top.hold[b][r] = units
                            guards[b][r] = guards[b].get(r, 0) + units
                held.append(top)
        return guards, None, held

    def pick(self, tier: str) -> tuple[str, str] | None:
        _, best, _ = self.plan(self.survey(tier), tier)
        return None if best is None else (best.tenant, best.key)

    # -- lanes and gangs ----------------------------------------------------------

    def push(self, tenant: str, shape: Shape, entry: str, head: bool) -> None:
        key = shape_key(shape)
        self.lane_shapes[key] = shape
        lane = self.lanes.setdefault((tenant, key), [])
        lane.insert(0, entry) if head else lane.append(entry)

    def drop_empty(self) -> None:
        for k in [k for k, v in self.lanes.items() if not v]:
            del self.lanes[k]

    def gang_unlink(self, gid: str) -> None:
        g = self.gangs[gid]
        if g.linked is None:
            return
        self.lanes[(g.tenant, g.linked)].remove("@" + gid)
        for t in g.members:
            self.recs[t].state = "G"
        g.linked = None

    def gang_link(self, gid: str, head: bool) -> None:
        g = self.gangs[gid]
        if not g.members:
            if g.running <= 0:
                del self.gangs[gid]
            return
        if g.running + len(g.members) < g.size:
            return
        shape = empty_shape()
        for t in g.members:
            rec = self.recs[t]
            rec.state = "Q"
            for r, n in rec.demand.items():
                shape[rec.band][r] = shape[rec.band].get(r, 0) + n
        g.linked = shape_key(shape)
        self.push(g.tenant, shape, "@" + gid, head)

    def enqueue(self, ticket: str, rec: Rec, head: bool) -> None:
        self.recs[ticket] = rec
        self.tenants.add(rec.tenant)
        if not rec.gang:
            rec.state = "Q"
            shape = empty_shape()
            shape[rec.band] = dict(rec.demand)
            self.push(rec.tenant, shape, ticket, head)
            return
        rec.state = "G"
        g = self.gangs.setdefault(rec.gang, Gang(rec.tenant, rec.cls, rec.gsize))
        self.gang_unlink(rec.gang)
        g.tenant, g.cls, g.size = rec.tenant, rec.cls, rec.gsize
        g.members.append(ticket)
        self.gang_link(rec.gang, head)

    def dequeue(self, ticket: str, rec: Rec) -> None:
        if not rec.gang:
            shape = empty_shape()
            shape[rec.band] = dict(rec.demand)
            self.lanes[(rec.tenant, shape_key(shape))].remove(ticket)
            return
        self.gang_unlink(rec.gang)
        self.gangs[rec.gang].members.remove(ticket)
        self.gang_link(rec.gang, False)

    def gang_running(self, gid: str, sign: int) -> None:
        if not gid or gid not in self.gangs:
            return
        self.gang_unlink(gid)
        self.gangs[gid].running += sign
        self.gang_link(gid, False)

    def forget(self, ticket: str) -> None:
        rec = self.recs[ticket]
        self.resv.pop(ticket, None)
        if rec.state in ("R", "A"):
            del self.recs[ticket]
            self.gang_running(rec.gang, -1)
        else:
            self.dequeue(ticket, rec)
            del self.recs[ticket]
        self.drop_empty()

    # -- operations ---------------------------------------------------------------

    def sync(self, config: FairgateConfig, capacity: ResourceCounts) -> None:
        self.cap = {r: n for r, n in capacity.items() if n}
        self.cfg = {}
        for t in config.tenants():
            self.cfg[t.name] = Cfg(w=t.weight, n={r: n for r, n in t.nominal.items() if n},
                                   b=t.borrow_slices, rs=t.reserve_slices, known=True)
            self.tenants.add(t.name)

    def entries_before(self, tenant: str, cls: str, seq: float) -> int:
        """Lane entries of the tenant's class before ``seq`` (binary search per lane,
        as the scripts do; lanes are in admission order)."""
        ahead = 0
        for (t, key), lane in self.lanes.items():
            if t != tenant or ("i" if shape_tier(self.lane_shapes[key]) == "i" else "t") != cls:
                continue
            lo, hi = 0, len(lane)
            while lo < hi:
                mid = (lo + hi) // 2
                if self.entry_info(lane[mid])[0] < seq:
                    lo = mid + 1
                else:
                    hi = mid
            ahead += lo
        return ahead

    def free(self, tenant: str) -> int:
        u = self.usage(tenant)
        return max(0, self.cfg_of(tenant).ns - u["ui"] - u["ut"])

    def capacity_blocker(self, shape: Shape, guards: Shape, held: list[Top],
                         me: tuple[str, str] | None = None) -> list[object] | None:
        """Why the cluster keeps ``shape`` waiting given the holds of its tier: part
        of what it lacks is held for this very lane head (``me``), it lacks capacity,
        or another entry's hold is in its way; None when it fits."""
        mine = next((top for top in held if me == (top.tenant, top.key)), None)
        if mine is not None:
            for r in sorted(shape_resources(shape)):
                need = sum(shape[b].get(r, 0) for b in BANDS)
                units = sum(mine.hold[b].get(r, 0) for b in BANDS)
                if 0 < units < need:
                    return ["held", r, units, need]
            guards = {b: {r: n - mine.hold[b].get(r, 0) for r, n in guards[b].items()}
                      for b in BANDS}
        c = self.cap_check(shape, None)
        if c is not None:
            return ["capacity", c[0], c[1]]
        c = self.cap_check(shape, guards)
        if c is None:
            return None
        holder = next((top.tenant for top in held
                       if top is not mine and any(top.hold[b].get(c[0], 0) for b in BANDS)), "")
        return ["guard", c[0], holder]

    def describe(self, ticket: str, rec: Rec, now: float) -> tuple[int, int, list[object]]:
        length = len([r for r in self.queued(rec.tenant) if r.cls == rec.cls])
        if rec.gang and self.gangs[rec.gang].linked is None:
            g = self.gangs[rec.gang]
            return 0, length, ["gang", rec.gang, g.running + len(g.members), g.size]
        if rec.gang:
            key = self.gangs[rec.gang].linked
            assert key is not None
            entry = "@" + rec.gang
        else:
            shape = empty_shape()
            shape[rec.band] = dict(rec.demand)
            key, entry = shape_key(shape), ticket
        shape = self.lane_shapes[key]
        seq, at = self.entry_info(entry)
        position = self.entries_before(rec.tenant, rec.cls, seq) + 1
        head = self.lanes[(rec.tenant, key)][0] == entry
        why = self.quota_blocker(rec.tenant, shape)
        if why is None:
            tier = shape_tier(shape)
            guards, _, held = self.plan(self.survey(tier), tier,
                                        (self.share(rec.tenant), at, seq + 0.5), {})
            why = self.capacity_blocker(shape, guards, held,
                                        (rec.tenant, key) if head else None)
        if why is None:
            why = ["ahead", position - 1] if not head else ["turn"]
        return position, length, why

    def quota_blocker(self, tenant: str, shape: Shape) -> list[object] | None:
        if self.quota_check(tenant, shape, idle=True) is not None:
            return ["never"]
        return self.quota_check(tenant, shape)

    def admit(self, req: PodRequest, now: float, dry: bool) -> tuple[Admission, list[object]]:
        """The admission and the raw reason list (None reason -> [])."""
        existing = self.recs.get(req.ticket)
        if existing is not None:
            stored = (existing.ns, existing.name, existing.tenant, existing.cls,
                      existing.demand)
            asked = (req.namespace, req.name, req.tenant, CLASS_CODE[req.pod_class],
                     {k: v for k, v in req.demand.items() if v})
            if existing.state == "A" or existing.uid or stored != asked:
                raise TicketConflictError(req.ticket, STATE_NAME[existing.state],
                                          existing.ns, existing.name)
            t = existing.tenant
            old_band = BAND_NAME[existing.band]
            length = len([r for r in self.queued(t) if r.cls == existing.cls])
            if existing.state in ("R", "A"):
                return Admission("reserved", old_band, None, length, self.free(t),
                                 self.cfg_of(t).ns, None, True), []
            pos, length, why = self.describe(req.ticket, existing, now)
            return Admission("queued", old_band, pos or None, length, self.free(t),
                             self.cfg_of(t).ns, None, True), why
        tenant, cls = req.tenant, CLASS_CODE[req.pod_class]
        cfg = self.cfg_of(tenant)
        if not cfg.known:
            raise LookupError(tenant)
        u = self.usage(tenant)
        d = {r: n for r, n in req.demand.items() if n}
        ds = total_slices(d)
        queued = self.queued(tenant)
        seen = [r for r in queued if r.uid]  # what counts as queued ahead for the band
        band = "i"
        if cls == "t":
            room = cfg.ns - cfg.rs
            qs_t = sum(total_slices(r.demand) for r in seen if r.band == "t")
            qs_b = sum(total_slices(r.demand) for r in seen if r.band == "b")
            fits = u["ut"] + qs_t + ds <= room
            alone = ds <= room
            for r, n in d.items():
                qd = sum(q.demand.get(r, 0) for q in seen if q.band == "t")
                if u.get("u:" + r, 0) + qd + n > cfg.n.get(r, 0):
                    fits = False
                if n > cfg.n.get(r, 0):
                    alone = False
            if fits:
                band = "t"
            elif cfg.b > 0 and u["ub"] + qs_b + ds <= cfg.b:
                band = "b"
            elif alone and ds <= cfg.b:  # the band whose lane drains first for its room
                lt = len(self.lanes.get((tenant, f"t/{format_counts(d)}"), []))
                lb = len(self.lanes.get((tenant, f"b/{format_counts(d)}"), []))
                band = "b" if (lb + 1) * room < (lt + 1) * cfg.b else "t"
            elif alone or ds > cfg.b:
                band = "t"
            else:
                band = "b"
        shape = empty_shape()
        shape[band] = dict(d)
        qc = len([r for r in queued if r.cls == cls])
        free = max(0, cfg.ns - u["ui"] - u["ut"])
        position = self.entries_before(tenant, cls, float("inf")) + 1
        reason: list[object] | None
        gid = req.gang or ""
        if gid:
            g = self.gangs.get(gid)
            members = g.members if g else []
            have = (g.running if g else 0) + len(members) + 1
            if have < req.group_size:
                reason, position = ["gang", gid, have, req.group_size], 0
            else:
                gshape = empty_shape()
                for t in members:
                    m = self.recs[t]
                    for r, n in m.demand.items():
                        gshape[m.band][r] = gshape[m.band].get(r, 0) + n
                for r, n in d.items():
                    gshape[band][r] = gshape[band].get(r, 0) + n
                reason = self.quota_blocker(tenant, gshape)
                if reason is None:
                    tier = shape_tier(gshape)
                    me = (self.share(tenant), req.submitted_at, float("inf"))
                    guards, _, held = self.plan(self.survey(tier), tier, me, {})
                    reason = self.capacity_blocker(gshape, guards, held) or ["turn"]
        else:
            reason = self.quota_blocker(tenant, shape)
            ahead = None
            if reason is None:
                me = (self.share(tenant), req.submitted_at, float("inf"))
                guards, ahead, held = self.plan(self.survey(band), band, me, d)
                reason = self.capacity_blocker(shape, guards, held)
            if reason is None and any(
                r.cls == cls and r.state == "Q" and set(r.demand) & set(d) for r in queued
            ):
                reason = ["ahead", qc]
            for tier in BANDS:
                if reason is None and PRIO[tier] > PRIO[band]:
                    _, higher, _ = self.plan(self.survey(tier), tier, None, d)
                    if higher is not None:
                        reason = ["inference" if tier == "i" else "priority"]
            if reason is None and ahead is not None:
                reason = ["turn"]
        if reason is None:
            if band != "b":
                free = max(0, free - ds)
            if not dry:
                self.seq += 1
                self.recs[req.ticket] = Rec("R", tenant, cls, band, d, req.namespace,
                                            req.name, "", 1, req.submitted_at, self.seq, now)
                self.resv[req.ticket] = now
                self.tenants.add(tenant)
            return Admission("reserved", BAND_NAME[band], None, qc, free, cfg.ns, None), []
        if not dry:
            self.seq += 1
            self.enqueue(req.ticket, Rec("Q", tenant, cls, band, d, req.namespace, req.name,
                                         gid, req.group_size if gid else 1,
                                         req.submitted_at, self.seq), False)
            self.resv[req.ticket] = now
        return Admission("queued", BAND_NAME[band], position or None, qc + 1, free, cfg.ns,
                         None), reason

    def dispatch(self, now: float, limit: int) -> list[Release]:
        out: list[Release] = []
        for _ in range(limit):
            chosen = self.pick("i") or self.pick("t") or self.pick("b")
            if chosen is None:
                break
            tenant, key = chosen
            entry = self.lanes[(tenant, key)].pop(0)
            if entry.startswith("@"):
                g = self.gangs[entry[1:]]
                tickets, g.members = g.members, []
                g.linked = None
                g.running += len(tickets)
            else:
                tickets = [entry]
            for t in tickets:
                rec = self.recs[t]
                rec.state, rec.at = "A", now
                if not rec.uid:
                    self.resv[t] = now
                out.append(Release(t, rec.tenant, rec.ns, rec.name, BAND_NAME[rec.band],
                                   dict(rec.demand), max(0.0, now - rec.submitted)))
            self.drop_empty()
        return out

    def release(self, ticket: str, queued_only: bool, uid: str) -> bool:
        rec = self.recs.get(ticket)
        if rec is None or (queued_only and rec.state not in ("Q", "G")):
            return False
        if rec.uid and rec.uid != uid:
            return False
        self.forget(ticket)
        return True

    def confirm(self, ticket: str, uid: str, ns: str, name: str) -> str:
        rec = self.recs.get(ticket)
        if rec is None:
            return "unknown"
        if rec.uid:
            return "confirmed" if rec.uid == uid else "conflict"
        generated = rec.name.endswith("*") and name.startswith(rec.name[:-1]) \
            and len(name) > len(rec.name) - 1
        if rec.ns != ns or (rec.name != name and not generated):
            return "conflict"
        self.resv.pop(ticket, None)
        rec.uid, rec.name = uid, name
        if rec.state == "R":
            rec.state = "A"
        return "confirmed"

    def expire(self, cutoff: float) -> list[str]:
        out = sorted((at, t) for t, at in self.resv.items() if at <= cutoff)
        for _, t in out:
            self.forget(t)
        return [t for _, t in out]

    def rebuild(self, running: list[tuple[str, Rec]], gated: list[tuple[str, Rec]],
                cutoff: float | None = None) -> None:
        """Replace usage and queue (not the config): first the in-flight tickets (R or A
        reserved/released after ``cutoff``, in sequence order, reservations still
        expiring), then ``running`` pods, then ``gated`` ones queued in the given order,
        skipping tickets already there (a listed running pod confirms a kept
        reservation); sequence numbers restart from 1."""
        kept = sorted(
            ((t, r) for t, r in self.recs.items()
             if cutoff is not None and r.state in ("R", "A") and r.at is not None
             and r.at > cutoff),
            key=lambda item: item[1].seq,
        )
        self.recs, self.lanes, self.gangs, self.resv = {}, {}, {}, {}
        self.seq = 0
        for ticket, rec in kept:
            self.seq += 1
            rec.seq = self.seq
            self.hold(ticket, rec)
            if not rec.uid:
                self.resv[ticket] = rec.at
        for ticket, rec in running:
            if ticket in self.recs:
                kept_rec = self.recs[ticket]
                if not kept_rec.uid:
                    self.resv.pop(ticket, None)
                    kept_rec.state, kept_rec.uid, kept_rec.name = "A", rec.uid, rec.name
                continue
            self.seq += 1
            rec.state, rec.seq, rec.at, rec.submitted = "A", self.seq, None, 0.0
            self.hold(ticket, rec)
        for ticket, rec in gated:
            if ticket in self.recs:
                continue
            self.seq += 1
            rec.seq, rec.at = self.seq, None
            self.enqueue(ticket, rec, False)

    def hold(self, ticket: str, rec: Rec) -> None:
        """Put back a ticket holding usage (its gang counts it as running)."""
        self.recs[ticket] = rec
        if rec.gang:
            g = self.gangs.setdefault(rec.gang, Gang(rec.tenant, rec.cls, rec.gsize))
            g.tenant, g.cls, g.size = rec.tenant, rec.cls, rec.gsize
            g.running += 1

    def requeue(self, ticket: str) -> bool:
        rec = self.recs.get(ticket)
        if rec is None or rec.state not in ("R", "A"):
            return False
        if rec.uid:
            self.resv.pop(ticket, None)
        self.gang_running(rec.gang, -1)
        rec.gang, rec.gsize, rec.at = "", 1, None
        self.enqueue(ticket, rec, True)
        return True


def waiting_for(reason: list[object], tenant: str, pod_class: PodClass) -> str | None:
    """``Admission.waiting_for`` for a reason list, as the queue words it."""
    if not reason:
        return None
    return explain([str(x) for x in reason], tenant, pod_class)
