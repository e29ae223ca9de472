"""A small, slow, pure-Python model of the fair queue's rules (fairshare/queue/README.md).

It keeps plain lists and dicts and recomputes everything (usage, readiness, shares,
holds) from the ticket records on every call, so it shares no bookkeeping with the
Lua scripts: the stateful test drives both with the same operations and compares
every answer. It models two orders (``Reference(virtual_time=...)``, the scripts
follow the synced ``fairShare``):

- current usage (``usageHalfLife: 0``): a tenant's score is slices in use / weight;
- virtual time, the default order (docs/fairness.md, lib_tenants.lua): per tenant the service
  v (slice-seconds) folded up to the caller's ``now`` whenever its usage changes, the
  start charge (slices in use x expected run time less the service those slices
  received since they began, never below 0), the expected run time (the moving
  average of the tenant's run times, newest weighing 1/4; before one of its pods ended
  the cluster's, 600 s before any), the rule for a tenant that becomes active (it
  starts at the smallest virtual time of the other active tenants when its own is
  lower), the handover credit and the commitment. The order is the rule itself: the
  lowest current score (ties: the head created first, then admitted first), computed
  for every ready tenant, not found by walking stored lower bounds as the scripts do.

Decayed usage (a positive half-life) is not modelled (test_fair_order.py checks it
against an independent integration). Everything else (bands, quota, capacity, holds,
gangs) is the same in every order.

Floating point: the scripts compute in doubles, as Python does, so the model repeats
their arithmetic in the same order (``v + u * (now - t)``, ``d + max(u * run - elapsed,
0) - credit * run``, ``log(d / weight)``, a floor raise ``floor * weight``) with the
same libm ``log``: equal scores, which the tie rules then order, come out equal on both
sides. Service sums (``rb``, slices x start time, which Redis adds in long double) are
exact only for times with few binary digits: the stateful test advances its clock by
multiples of 0.5 s.
"""

from __future__ import annotations

import math
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

# lib_tenants.lua's constants of virtual time
NO_USAGE = -1e18  # the score of a tenant with no service and nothing charged
DEFAULT_RUN = 600.0  # the expected run time before any pod ended
RUN_WEIGHT = 0.25  # the newest run's weight in the moving average of run times
HANDOVER = 0.5  # of one pod's slices x expected run time: the handover credit
COMMIT_AFTER = 0.5  # of the tenant's expected run time: a hold becomes a commitment
BACKFILL_PEERS = 4  # later tenants of a shape walked for backfill only (plan)


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


def pod_slices(shape: Shape) -> int:
    """The slices of one entry of the shape, all bands."""
    return sum(total_slices(shape[b]) for b in BANDS)


@dataclass
class Cfg:
    w: float = 1.0
    n: ResourceCounts = field(default_factory=dict)
    b: int = 0
    rs: int = 0
    kr: int = 0  # the reserve kept free of borrowed pods
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
    at: float | None = None  # reserved/released at (a running pod: when its run began)
    uid: str = ""  # the pod the ticket is bound to ("" while unseen)
    ends: float | None = None  # holding usage: when it is expected to end (re:<key>)
    run: int | None = None  # its declared run time (seconds), an upper bound


@dataclass
class Gang:
    tenant: str
    cls: str
    size: int
    members: list[str] = field(default_factory=list)
    running: int = 0
    source: str = ""  # words only (where it was declared, what its size awaits)
    awaiting: str = ""
    linked: str | None = None  # lane shape key while in a lane
    band: str = ""  # its members' band (its first member's)


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
    peer: int = 0  # > 0: a later tenant of its shape, walked for backfill only (plan)

    @property
    def order(self) -> tuple[float, float, float]:
        return self.score, self.at, self.seq


@dataclass
class Service:
    """A tenant's service counters (du:<tenant>): v slice-seconds as of t (None: never
    folded), its expected run time r (None: none of its pods ended yet)."""

    v: float = 0.0
    t: float | None = None
    r: float | None = None


@dataclass
class Commitment:
    """The lane capacity is held for at the end of dispatch rounds (fr <tier>:cs...)."""

    key: str
    tenant: str
    base: int  # the tenant's slices in use when the hold began
    at: float  # when


class Reference:
    """The rules, naively."""

    def __init__(self, virtual_time: bool = False) -> None:
        self.virtual = virtual_time
        self.cfg: dict[str, Cfg] = {}
        self.cap: ResourceCounts = {}
        self.fit: ResourceCounts = {}  # one dispatch's capacity to fit against, key by key
        self.tenants: set[str] = set()
        self.recs: dict[str, Rec] = {}
        self.lanes: dict[tuple[str, str], list[str]] = {}
        self.lane_shapes: dict[str, Shape] = {}
        self.gangs: dict[str, Gang] = {}
        self.resv: dict[str, float] = {}
        self.seq = 0
        # virtual time
        self.du: dict[str, Service] = {}
        self.rt: float | None = None  # the cluster's expected run time
        self.active: set[str] = set()  # va: the active tenants, as the scripts know them
        self.handover: dict[str, tuple[str, str]] = {}  # tier -> (lane shape, tenant)
        self.commit: dict[str, Commitment] = {}  # tier -> the committed lane

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

    def used_slices(self, tenant: str) -> int:
        u = self.usage(tenant)
        return u["ui"] + u["ut"] + u["ub"]

    def share(self, tenant: str, now: float | None, credit: float = 0.0) -> float:
        """The tenant's fair-share score at ``now`` (queue order: lowest first), less
        ``credit`` slices x its expected run time (the handover)."""
        if not self.virtual:
            return self.used_slices(tenant) / self.cfg_of(tenant).w
        d, run = self.service(tenant, now)
        charged = self.used_slices(tenant)
        d = d + max(charged * run - self.elapsed(tenant, now), 0) - credit * run
        if d <= 0:
            return NO_USAGE
        return math.log(d / self.cfg_of(tenant).w)

    # -- virtual time ---------------------------------------------------------------

    def cluster_run(self) -> float:
        return self.rt if self.rt is not None else DEFAULT_RUN

    def expected_run(self, tenant: str) -> float:
        """The tenant's expected run time (the cluster's before one of its pods ended)."""
        s = self.du.get(tenant)
        return s.r if s is not None and s.r is not None else self.cluster_run()

    def ends(self, rec: Rec, started: float) -> float:
        """When a ticket holding usage since ``started`` is expected to end: its tenant's
        expected run time after, or its declared run time when that is shorter."""
        run = self.expected_run(rec.tenant)
        return started + (run if rec.run is None else min(run, rec.run))

    def entry_run(self, tenant: str, key: str) -> float:
        """How long the head entry of the tenant's lane ``key`` runs when released: its
        declared run time (a gang: its members' longest, when all declare one), else its
        tenant's expected run time."""
        entry = self.lanes[(tenant, key)][0]
        tickets = self.gangs[entry[1:]].members if entry.startswith("@") else [entry]
        runs = [self.recs[t].run for t in tickets]
        if not runs or any(r is None for r in runs):
            return self.expected_run(tenant)
        return float(max(r for r in runs if r is not None))

    def drained_by(self, res: str, units: int, prio: int, now: float) -> float:
        """When ``units`` of ``res`` come free as the tickets holding it, of bands of
        priority >= ``prio``, end in their expected order (never before ``now``); when
        they never free that many (held tops lacking together more than they hold), the
        expected end of the last of them (``now`` when none does)."""
        got, last = 0, now
        holding = sorted((r.ends, t) for t, r in self.recs.items()
                         if r.ends is not None and res in r.demand)
        for ends, ticket in holding:
            rec = self.recs[ticket]
            if PRIO[rec.band] >= prio:
                got += rec.demand[res]
                last = max(ends, now)
                if got >= units:
                    break
        return last

    def backfills(self, top: Top, shape: Shape, held: list[Top], now: float) -> bool:
        """Virtual time: whether ``top`` (fits the free capacity, not what is held) is
        expected to end before each held top sharing one of its resources is expected
        to fit: when the tickets expected to end first have freed, on each of its
        resources, what it and the held tops before it still lack (not before the last
        of them ends when that is more than they hold)."""
        if not held or not self.virtual:
            return False
        ends = now + self.entry_run(top.tenant, top.key)
        mine = shape_resources(shape)
        lacking: dict[str, int] = {}
        for h in held:
            hs = self.lane_shapes[h.key]
            for b in BANDS:
                for r, n in hs[b].items():
                    if n:
                        lacking[r] = lacking.get(r, 0) + n - h.hold[b].get(r, 0)
            if not shape_resources(hs) & mine:
                continue
            fits_at = now
            for r in sorted(shape_resources(hs)):
                if lacking[r] > 0:
                    fits_at = max(fits_at,
                                  self.drained_by(r, lacking[r], PRIO[shape_tier(hs)], now))
            if ends > fits_at:
                return False
        return True

    def service(self, tenant: str, now: float | None) -> tuple[float, float]:
        """The tenant's service at ``now`` (None: as of its last fold) and its expected
        run time."""
        s = self.du.setdefault(tenant, Service())
        t = s.t if s.t is not None else (now if now is not None else 0.0)
        r = self.expected_run(tenant)
        if now is None or now <= t:
            return s.v, r
        return s.v + self.used_slices(tenant) * (now - t), r

    def elapsed(self, tenant: str, now: float | None) -> float:
        """The service the tenant's running slices received since they began (those
        that began at an unknown time, rebuilt without it, as if at time 0)."""
        u = self.used_slices(tenant)
        if u == 0 or now is None:
            return 0.0
        began = sum(total_slices(r.demand) * r.at for r in self.recs.values()
                    if r.tenant == tenant and r.state in ("R", "A") and r.at is not None)
        return max(u * now - began, 0)

    def fold(self, tenant: str, now: float | None) -> None:
        """Before the tenant's usage changes: its service up to ``now``."""
        if not self.virtual or now is None:
            return
        v, _ = self.service(tenant, now)
        s = self.du[tenant]
        s.v, s.t = v, now

    def has_lane(self, tenant: str) -> bool:
        """Whether the tenant has a queue entry in some lane."""
        return any(entries for (t, _), entries in self.lanes.items() if t == tenant)

    def track(self, tenant: str, now: float | None) -> None:
        """After the tenant's usage or lanes changed: an active tenant (slices in use or
        a lane) that was not starts at the smallest virtual time of the other active
        tenants if its own is lower (only when ``now`` is known: else it joins at its
        next change that knows it); an idle one leaves."""
        if not self.virtual:
            return
        active = self.used_slices(tenant) > 0 or self.has_lane(tenant)
        if active == (tenant in self.active):
            return
        if not active:
            self.active.discard(tenant)
            return
        if now is None:
            return
        self.fold(tenant, now)
        w, s = self.cfg_of(tenant).w, self.du[tenant]
        floor = self.min_active(tenant, now)
        if floor is not None and s.v < floor * w:
            s.v = floor * w
        self.active.add(tenant)

    def min_active(self, tenant: str, now: float) -> float | None:
        """The smallest virtual time at ``now`` of the active tenants but ``tenant``."""
        times = [self.service(other, now)[0] / self.cfg_of(other).w
                 for other in self.active if other != tenant]
        return min(times) if times else None

    def entry_share(self, tenant: str, now: float) -> float:
        """The score a new entry of the tenant joins the order with: with virtual time,
        a tenant not active yet is scored as it will be once it joins (at the floor)."""
        if not self.virtual or tenant in self.active:
            return self.share(tenant, now)
        s = self.du.setdefault(tenant, Service())
        saved = s.v, s.t
        self.fold(tenant, now)
        floor, w = self.min_active(tenant, now), self.cfg_of(tenant).w
        if floor is not None and s.v < floor * w:
            s.v = floor * w
        score = self.share(tenant, now)
        s.v, s.t = saved
        return score

    def refresh(self, tenant: str, now: float | None) -> None:
        """lib_lanes.lua refresh, after the tenant's usage, lanes or quota changed: va (the
        scores the scripts store in ready sets are lower bounds of the current ones,
        which the model computes instead)."""
        self.track(tenant, now)

    def note_run(self, tenant: str, started: float | None, now: float | None) -> None:
        """A running pod of the tenant that began at ``started`` ended at ``now``."""
        if not self.virtual or now is None or started is None:
            return
        s = self.du.setdefault(tenant, Service())
        run = max(now - started, 0)
        s.r = s.r + RUN_WEIGHT * (run - s.r) if s.r is not None else run
        self.rt = self.rt + RUN_WEIGHT * (run - self.rt) if self.rt is not None else run

    def note_freed(self, rec: Rec) -> None:
        """A running pod (not a gang's) ended: its lane's head gets the handover credit
        until its tier's next dispatch decision."""
        if not self.virtual or rec.gang:
            return
        shape = empty_shape()
        shape[rec.band] = dict(rec.demand)
        self.handover[shape_tier(shape)] = (shape_key(shape), rec.tenant)

    def lane_top(self, key: str, tenant: str, now: float, credit: float) -> Top | None:
        """The head of the tenant's lane of shape ``key`` as a top scored with
        ``credit``; None when the lane is empty or its head does not fit the quota."""
        shape = self.lane_shapes.get(key)
        if (shape is None or not self.lanes.get((tenant, key))
                or self.quota_check(tenant, shape) is not None):
            return None
        seq, at = self.entry_info(self.lanes[(tenant, key)][0])
        return Top(key, tenant, self.share(tenant, now, credit), at, seq,
                   self.cap_check(shape, None) is not None)

    def stepped(self, tenant: str, base: int, key: str) -> bool:
        """Whether the tenant runs one entry of shape ``key`` more than ``base``."""
        return self.used_slices(tenant) >= base + pod_slices(self.lane_shapes[key])

    def favoured_tops(self, tier: str, now: float) -> list[Top]:
        """The entries ordered otherwise than by their scores: the committed lane's
        head first (score -inf) once the hold lasted COMMIT_AFTER of its tenant's
        expected run time, until its step is done; the handover's lane head, scored
        with the credit of HANDOVER x its slices."""
        out: list[Top] = []
        committed = None
        c = self.commit.get(tier)
        if c is not None:
            top = self.lane_top(c.key, c.tenant, now, 0.0)
            if top is not None and not self.stepped(c.tenant, c.base, c.key):
                _, run = self.service(c.tenant, None)
                if now - c.at >= COMMIT_AFTER * run:
                    top.score = -math.inf
                    committed = top
                    out.append(top)
        if tier in self.handover and self.handover[tier][0] in self.lane_shapes:
            key, tenant = self.handover[tier]
            freed = self.lane_top(key, tenant, now,
                                  HANDOVER * pod_slices(self.lane_shapes[key]))
            if freed is not None and not (
                    committed is not None and (committed.key, committed.tenant) == (key, tenant)):
                out.append(freed)
        return out

    def note_hold(self, tier: str, now: float, best: Top | None, held: list[Top],
                  record: Commitment | None) -> None:
        """Keep the tier's commitment after a dispatch decision (lib_holds.lua note_hold):
        a release of the committed lane that finds the step done ends it; at the end of
        a round it stays while its lane is held for and its step not done, else it
        moves to the first entry held for, or ends."""
        def of_lane(top: Top) -> bool:
            return record is not None and (top.key, top.tenant) == (record.key, record.tenant)

        def step_done(top: Top) -> bool:
            assert record is not None
            return self.stepped(record.tenant, record.base, top.key)

        if best is not None:
            if of_lane(best) and step_done(best):
                del self.commit[tier]
            return
        first = None
        for top in held:
            if any(top.hold[b] for b in BANDS):
                if of_lane(top) and not step_done(top):
                    return
                first = first or top
        if first is not None:
            self.commit[tier] = Commitment(first.key, first.tenant,
                                           self.used_slices(first.tenant), now)
        elif record is not None:
            del self.commit[tier]

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
        # invariant 1 whatever the band: all within nominal + borrowLimit; training and
        # borrowed within nominal less the reserve + borrowLimit (a borrowed pod standing
        # in nominal room keeps it until it ends)
        trained = u["ut"] + u["ub"] + total_slices(shape["t"]) + total_slices(shape["b"])
        limit = u["ui"] + trained + total_slices(shape["i"]) - (cfg.ns + cfg.b)
        if any(shape["t"].values()) or any(shape["b"].values()):
            limit = max(limit, trained - (cfg.ns - cfg.rs + cfg.b))
        if not any(shape["b"].values()):
            missing = max(missing, limit)
        if missing > 0:
            return ["quota", missing]
        if any(shape["b"].values()):
            over = max(u["ub"] + total_slices(shape["b"]) - cfg.b
                       - self.nominal_room(cfg, u, shape["b"], nb, total_slices(shape["t"])),
                       limit)
            if over > 0:
                return ["borrow", over]
        return None

    @staticmethod
    def nominal_room(cfg: Cfg, u: dict[str, int], borrowed: ResourceCounts,
                     nb: ResourceCounts, t_slices: int, ahead: Shape | None = None) -> int:
        """The slices of ``borrowed`` that the nominal quota training leaves unused
        (nominal less the reserve, per resource and in slices) can hold, on top of usage
        ``u``, the entry's own non-borrowed demand ``nb`` / ``t_slices`` and the
        training queued ``ahead``."""
        ahead = ahead or empty_shape()
        room = cfg.ns - cfg.rs - u["ut"] - t_slices - total_slices(ahead["t"])
        held = 0
        for r, n in borrowed.items():
            free = (cfg.n.get(r, 0) - u.get("u:" + r, 0) - ahead["t"].get(r, 0)
                    - nb.get(r, 0))
            if free > 0:
                held += min(n, free) * slices_of(r)
        return max(0, min(room, held))

    def cap_check(self, shape: Shape, guards: Shape | None, idle: bool = False
                  ) -> tuple[str, int, str] | None:
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
                over = need - self.fit_cap(res)
                if over > 0:
                    return res, over, "capacity"
        borrowed = sorted(r for r, n in shape["b"].items() if n)
        if not idle and borrowed and self.idle_reserve() > 0:
            fit = sum(slices_of(r) * self.fit_cap(r) for r in set(self.cap) | set(self.fit))
            used = sum(total_slices(rec.demand) for rec in self.recs.values()
                       if rec.state in ("R", "A"))
            over = used + pod_slices(shape) + self.idle_reserve() - fit
            if over > 0:
                return borrowed[0], -(-over // slices_of(borrowed[0])), "reserve"
        return None

    def idle_reserve(self) -> int:
        """Slices of the tenants' inferenceReserve kept free of borrowed pods that their
        inference pods do not use."""
        return sum(max(0, self.cfg_of(t).kr - self.usage(t)["ui"]) for t in self.tenants)

    def entry_info(self, entry: str) -> tuple[int, float]:
        if not entry.startswith("@"):
            rec = self.recs[entry]
            return rec.seq, rec.submitted
        members = [self.recs[t] for t in self.gangs[entry[1:]].members]
        return max(m.seq for m in members), max(m.submitted for m in members)

    def ready(self, tier: str) -> dict[str, list[str]]:
        """Shape key -> the tenants whose lane of it is ready (its head fits the quota)."""
        out: dict[str, list[str]] = {}
        for (tenant, key), entries in self.lanes.items():
            shape = self.lane_shapes[key]
            if entries and shape_tier(shape) == tier and self.quota_check(tenant, shape) is None:
                out.setdefault(key, []).append(tenant)
        for v in out.values():
            v.sort()
        return out

    def head_top(self, key: str, tenant: str, now: float, blocked: bool) -> Top:
        seq, at = self.entry_info(self.lanes[(tenant, key)][0])
        return Top(key, tenant, self.share(tenant, now), at, seq, blocked)

    def best_of(self, key: str, now: float, blocked: bool, after: Top | None = None
                ) -> Top | None:
        """The first ready tenant of shape ``key`` in queue order (after ``after``): the
        lowest current score, then the oldest head."""
        tenants = self.ready(shape_tier(self.lane_shapes[key])).get(key, [])
        heads = [self.head_top(key, t, now, blocked) for t in tenants]
        later = [top for top in heads if after is None or after.order < top.order]
        return min(later, key=lambda top: top.order) if later else None

    def survey(self, tier: str, now: float) -> list[Top]:
        """Per ready shape of the tier its first tenant (score, oldest head), in order."""
        tops: list[Top] = []
        for key in self.ready(tier):
            blocked = self.cap_check(self.lane_shapes[key], None) is not None
            top = self.best_of(key, now, blocked)
            assert top is not None
            tops.append(top)
        return sorted(tops, key=lambda top: top.order)

    def next_top(self, after: Top, now: float, listed: set[tuple[str, str]]) -> Top | None:
        """The first ready tenant of ``after``'s shape after it in queue order that is
        not walked yet."""
        top = self.best_of(after.key, now, after.blocked, after)
        while top is not None and (top.key, top.tenant) in listed:
            top = self.best_of(after.key, now, after.blocked, top)
        return top

    def below_share(self, tenant: str, tier: str) -> bool:
        """slices used / weight < capacity slices / weight of the tier's ready tenants."""
        ready = {t for tenants in self.ready(tier).values() for t in tenants}
        w = sum(self.cfg_of(t).w for t in ready)
        capacity = total_slices(self.cap)
        return w > 0 and self.used_slices(tenant) * w < capacity * self.cfg_of(tenant).w

    def fit_cap(self, res: str) -> int:
        """The capacity of ``res`` entries are fitted against: a dispatch's own, else the
        stored one (fair shares always use the stored one)."""
        return self.fit.get(res, self.cap.get(res, 0))

    def free_for(self, band: str, res: str) -> int:
        """Units of ``res`` free for an entry of ``band`` (lower bands count as free)."""
        return self.fit_cap(res) - sum(self.cluster_used(b2, res) for b2 in BANDS
                                          if PRIO[b2] >= PRIO[band])

    def unheld(self, shape: Shape, guards: Shape) -> bool:
        """Whether some free capacity of a resource of the shape is not held yet."""
        return any(self.free_for(b, r) - guards[b].get(r, 0) > 0
                   for b in BANDS for r, n in shape[b].items() if n)

    def plan(self, tier: str, now: float, stop: tuple[float, float, float] | None = None,
             counts: ResourceCounts | None = None
             ) -> tuple[Shape, Top | None, list[Top], Commitment | None]:
        """Holds G, the first top that fits given the holds of the tops before it
        (sharing a resource with ``counts`` if given), the held tops and the tier's
        commitment as read, walking the tops before ``stop``. A top that does not fit is
        owed capacity when its tenant is below its weighted share and the cluster could
        ever hold it: of each resource of its demand, the free units not held for the
        tops before it, up to its demand (``top.hold``; an owed top may hold nothing).
        With current usage the first tenant of a shape has its lowest share, so no later
        one is owed; with virtual time, when a blocked top's tenant is at or above its
        share, the next tenant of its shape in queue order takes its place in the walk
        (while some free capacity of the shape is not held yet), and the favoured tops
        (commitment, handover) take their places in the order."""
        tops = self.survey(tier, now)
        record = self.commit.get(tier) if self.virtual else None
        if self.virtual:
            for favoured in self.favoured_tops(tier, now):
                tops = [top for top in tops
                        if (top.key, top.tenant) != (favoured.key, favoured.tenant)]
                at = 0
                while at < len(tops) and tops[at].order < favoured.order:
                    at += 1
                tops.insert(at, favoured)
        listed = {(top.key, top.tenant) for top in tops}
        guards = empty_shape()
        held: list[Top] = []
        i = 0
        while i < len(tops):
            top = tops[i]
            if stop is not None and top.order >= stop:
                break
            shape = self.lane_shapes[top.key]
            blocked = self.cap_check(shape, guards) is not None
            substituted = False
            if not blocked or (
                    self.cap_check(shape, None) is None
                    and self.backfills(top, shape, held, now)):
                if counts is None or shape_resources(shape) & {r for r, n in counts.items() if n}:
                    return guards, top, held, record
            elif not top.peer and self.cap_check(shape, None, idle=True) is None:
                if self.below_share(top.tenant, tier):
                    for b in BANDS:
                        for r, n in shape[b].items():
                            units = min(n, self.free_for(b, r) - guards[b].get(r, 0))
                            if n and units > 0:
                                top.hold[b][r] = units
                                guards[b][r] = guards[b].get(r, 0) + units
                    held.append(top)
                elif self.virtual and self.unheld(shape, guards):
                    nxt = self.next_top(top, now, listed)
                    if nxt is not None:
                        listed.add((nxt.key, nxt.tenant))
                        at = i + 1
                        while at < len(tops) and tops[at].order < nxt.order:
                            at += 1
                        tops.insert(at, nxt)
                        substituted = True
            # backfill peers: a top that fits the free capacity but not what is held
            # and does not backfill; the next tenant of its shape may (its run time)
            if (blocked and self.cap_check(shape, None) is None and not substituted
                    and held and self.virtual and top.peer < BACKFILL_PEERS):
                nxt = self.next_top(top, now, listed)
                if nxt is not None:
                    listed.add((nxt.key, nxt.tenant))
                    nxt.peer = top.peer + 1
                    at = i + 1
                    while at < len(tops) and tops[at].order < nxt.order:
                        at += 1
                    tops.insert(at, nxt)
            i += 1
        return guards, None, held, record

    def pick(self, tier: str, now: float) -> tuple[str, str] | None:
        """The next entry of the tier to release; with virtual time the decision ends
        the tier's handover and keeps its commitment (note_hold)."""
        _, best, held, record = self.plan(tier, now)
        if self.virtual:
            self.handover.pop(tier, None)
            self.note_hold(tier, now, best, held, record)
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
        g.band = g.band or rec.band
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

    def gang_running(self, gid: str, sign: int) -> str | None:
        """Count a gang member that starts or stops running; the gang's tenant."""
        if not gid or gid not in self.gangs:
            return None
        tenant = self.gangs[gid].tenant
        self.gang_unlink(gid)
        self.gangs[gid].running += sign
        self.gang_link(gid, False)
        return tenant

    def forget(self, ticket: str, now: float | None = None, reclaimed: bool = False) -> None:
        """Free what the ticket holds and forget it; ``now``: when (None: unknown, as
        for a script called without the time); ``reclaimed``: its pod was evicted by
        reclaim (no handover, no run time learnt)."""
        rec = self.recs[ticket]
        self.resv.pop(ticket, None)
        changed = None
        if rec.state in ("R", "A"):
            if rec.state == "A" and not reclaimed:
                self.note_run(rec.tenant, rec.at, now)
                self.note_freed(rec)
            self.fold(rec.tenant, now)
            del self.recs[ticket]
            self.track(rec.tenant, now)
            changed = self.gang_running(rec.gang, -1)
        else:
            changed = self.gangs[rec.gang].tenant if rec.gang else rec.tenant
            self.dequeue(ticket, rec)
            del self.recs[ticket]
        self.refresh(rec.tenant, now)
        if changed is not None and changed != rec.tenant:
            self.refresh(changed, now)
        self.drop_empty()

    # -- operations ---------------------------------------------------------------

    def sync(self, config: FairgateConfig, capacity: ResourceCounts) -> None:
        self.cap = {r: n for r, n in capacity.items() if n}
        self.cfg = {}
        for t in config.tenants():
            self.cfg[t.name] = Cfg(w=t.weight, n={r: n for r, n in t.nominal.items() if n},
                                   b=t.borrow_slices, rs=t.reserve_slices, known=True,
                                   kr=0 if config.platform.fair_share.lend_inference_reserve
                                   else t.reserve_slices)
            self.tenants.add(t.name)
        # the handover and the commitment end; every tenant is refreshed without the
        # time (idle tenants leave va, none joins)
        self.handover, self.commit = {}, {}
        for tenant in sorted(self.tenants | self.active):
            self.refresh(tenant, None)

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
            return [c[2], c[0], c[1]]
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
            return 0, length, ["gang", rec.gang, g.running + len(g.members), g.size,
                               g.source, g.awaiting]
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
            me = (self.share(rec.tenant, now), at, seq + 0.5)
            guards, _, held, _ = self.plan(tier, now, me, {})
            why = self.capacity_blocker(shape, guards, held,
                                        (rec.tenant, key) if head else None)
            if why is None and head and not self.ahead_of(shape, now, me):
                why = ["release"]
        if why is None:
            why = ["ahead", position - 1] if not head else ["turn"]
        return position, length, why

    def ahead_of(self, shape: Shape, now: float, me: tuple[float, float, float]) -> bool:
        """Whether an entry ahead of ``me`` in the order of the shape's tier could be
        released now and shares a resource with it."""
        mine = {r: 1 for b in BANDS for r, n in shape[b].items() if n}
        return self.plan(shape_tier(shape), now, me, mine)[1] is not None

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
        gang = self.gangs.get(req.gang or "")
        if gang is not None and gang.band:
            band = gang.band  # a gang's members share its first member's band
        elif cls == "t":
            # by the whole entry's demand: a gang's is its size x the member's
            whole = {r: n * (req.group_size if req.gang else 1) for r, n in d.items()}
            ws = total_slices(whole)
            room = cfg.ns - cfg.rs
            q_ahead = empty_shape()
            for q in seen:
                for r, n in q.demand.items():
                    q_ahead[q.band][r] = q_ahead[q.band].get(r, 0) + n
            fits = u["ut"] + total_slices(q_ahead["t"]) + ws <= room
            alone = ws <= room
            for r, n in whole.items():
                if u.get("u:" + r, 0) + q_ahead["t"].get(r, 0) + n > cfg.n.get(r, 0):
                    fits = False
                if n > cfg.n.get(r, 0):
                    alone = False
            if fits:
                band = "t"
            elif cfg.b > 0 and (u["ub"] + total_slices(q_ahead["b"]) + ws
                                <= cfg.b + self.nominal_room(cfg, u, whole, {}, 0, q_ahead)):
                band = "b"
            elif alone and ws <= cfg.b:  # the band whose lane drains first for its room
                lt = len(self.lanes.get((tenant, f"t/{format_counts(whole)}"), []))
                lb = len(self.lanes.get((tenant, f"b/{format_counts(whole)}"), []))
                band = "b" if (lb + 1) * room < (lt + 1) * cfg.b else "t"
            elif alone or ws > cfg.b + self.nominal_room(
                    cfg, {"ut": 0, "ub": 0}, whole, {}, 0):
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
                reason, position = ["gang", gid, have, req.group_size, req.group_source,
                                    req.group_awaiting], 0
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
                    me = (self.entry_share(tenant, now), req.submitted_at, float("inf"))
                    guards, _, held, _ = self.plan(tier, now, me, {})
                    reason = self.capacity_blocker(gshape, guards, held)
                    if reason is None:
                        reason = ["turn"] if self.ahead_of(gshape, now, me) else ["release"]
        else:
            reason = self.quota_blocker(tenant, shape)
            ahead = None
            if reason is None:
                me = (self.entry_share(tenant, now), req.submitted_at, float("inf"))
                guards, ahead, held, _ = self.plan(band, now, me, d)
                reason = self.capacity_blocker(shape, guards, held)
            if reason is None and any(
                r.cls == cls and r.state == "Q" and set(r.demand) & set(d) for r in queued
            ):
                reason = ["ahead", qc]
            for tier in BANDS:
                if reason is None and PRIO[tier] > PRIO[band]:
                    _, higher, _, _ = self.plan(tier, now, None, d)
                    if higher is not None:
                        reason = ["inference" if tier == "i" else "priority"]
            if reason is None and ahead is not None:
                reason = ["turn"]
        if reason is None:
            if band != "b":
                free = max(0, free - ds)
            if not dry:
                self.seq += 1
                self.fold(tenant, now)
                rec = Rec("R", tenant, cls, band, d, req.namespace, req.name, "", 1,
                          req.submitted_at, self.seq, now, run=req.run_seconds)
                rec.ends = self.ends(rec, now)
                self.recs[req.ticket] = rec
                self.resv[req.ticket] = now
                self.tenants.add(tenant)
                self.track(tenant, now)
                self.refresh(tenant, now)
            return Admission("reserved", BAND_NAME[band], None, qc, free, cfg.ns, None), []
        if not dry:
            self.seq += 1
            self.enqueue(req.ticket, Rec("Q", tenant, cls, band, d, req.namespace, req.name,
                                         gid, req.group_size if gid else 1,
                                         req.submitted_at, self.seq, run=req.run_seconds),
                         False)
            if gid and req.group_source:
                self.gangs[gid].source = req.group_source
                self.gangs[gid].awaiting = req.group_awaiting
            self.resv[req.ticket] = now
            self.refresh(tenant, now)
        return Admission("queued", BAND_NAME[band], position or None, qc + 1, free, cfg.ns,
                         None), reason

    def dispatch(self, now: float, limit: int,
                 capacity: ResourceCounts | None = None) -> list[Release]:
        self.fit = {r: n for r, n in (capacity or {}).items() if n}
        try:
            return self.dispatch_fitted(now, limit)
        finally:
            self.fit = {}

    def dispatch_fitted(self, now: float, limit: int) -> list[Release]:
        out: list[Release] = []
        for _ in range(limit):
            chosen = self.pick("i", now) or self.pick("t", now) or self.pick("b", now)
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
                self.fold(rec.tenant, now)
                rec.state, rec.at = "A", now
                rec.ends = self.ends(rec, now)
                if not rec.uid:
                    self.resv[t] = now
                out.append(Release(t, rec.tenant, rec.ns, rec.name, BAND_NAME[rec.band],
                                   dict(rec.demand), max(0.0, now - rec.submitted)))
                self.track(rec.tenant, now)
            for other in sorted({self.recs[t].tenant for t in tickets} - {tenant}):
                self.refresh(other, now)
            self.refresh(tenant, now)
            self.drop_empty()
        return out

    def release(self, ticket: str, queued_only: bool, uid: str,
                now: float | None = None, reclaimed: bool = False) -> bool:
        rec = self.recs.get(ticket)
        if rec is None or (queued_only and rec.state not in ("Q", "G")):
            return False
        if rec.uid and rec.uid != uid:
            return False
        self.forget(ticket, now, reclaimed)
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

    def expire(self, cutoff: float, now: float | None = None) -> list[str]:
        out = sorted((at, t) for t, at in self.resv.items() if at <= cutoff)
        for _, t in out:
            self.forget(t, now)
        return [t for _, t in out]

    def rebuild(self, running: list[tuple[str, Rec]], gated: list[tuple[str, Rec]],
                cutoff: float | None = None) -> None:
        """Replace usage and queue (not the config): first the in-flight tickets (R or A
        reserved/released after ``cutoff``, in sequence order, reservations still
        expiring), then ``running`` pods, then ``gated`` ones queued in the given order,
        skipping tickets already there (a listed running pod confirms a kept
        reservation); sequence numbers restart from 1. A listed running pod whose
        ticket held usage keeps when its run began (else unknown: no start time is
        listed). No time is known: service is not folded, and a tenant that becomes
        active joins at its next change that knows the time (idle ones leave)."""
        kept = sorted(
            ((t, r) for t, r in self.recs.items()
             if cutoff is not None and r.state in ("R", "A") and r.at is not None
             and r.at > cutoff),
            key=lambda item: item[1].seq,
        )
        began: dict[str, float] = {
            t: r.at for t, r in self.recs.items()
            if r.state in ("R", "A") and r.at is not None
            and not (cutoff is not None and r.at > cutoff)}
        self.recs, self.lanes, self.gangs, self.resv = {}, {}, {}, {}
        self.seq = 0
        for ticket, rec in kept:
            self.seq += 1
            rec.seq = self.seq
            self.hold(ticket, rec)
            if not rec.uid and rec.at is not None:
                self.resv[ticket] = rec.at
        for ticket, rec in running:
            if ticket in self.recs:
                kept_rec = self.recs[ticket]
                if not kept_rec.uid:
                    self.resv.pop(ticket, None)
                    kept_rec.state, kept_rec.uid, kept_rec.name = "A", rec.uid, rec.name
                continue
            self.seq += 1
            rec.state, rec.seq, rec.at, rec.submitted = "A", self.seq, began.get(ticket), 0.0
            self.hold(ticket, rec)
        for ticket, rec in gated:
            if ticket in self.recs:
                continue
            self.seq += 1
            rec.seq, rec.at = self.seq, None
            self.enqueue(ticket, rec, False)
        for tenant in sorted(self.tenants | self.active):
            self.refresh(tenant, None)

    def hold(self, ticket: str, rec: Rec) -> None:
        """Put back a ticket holding usage (its gang counts it as running)."""
        self.recs[ticket] = rec
        rec.ends = self.ends(rec, rec.at or 0.0)
        if rec.gang:
            g = self.gangs.setdefault(rec.gang, Gang(rec.tenant, rec.cls, rec.gsize))
            g.tenant, g.cls, g.size = rec.tenant, rec.cls, rec.gsize
            g.band = g.band or rec.band
            g.running += 1

    def requeue(self, ticket: str, now: float | None = None) -> bool:
        rec = self.recs.get(ticket)
        if rec is None or rec.state not in ("R", "A"):
            return False
        self.fold(rec.tenant, now)
        rec.state = "Q"  # no usage; in no lane until enqueued
        self.track(rec.tenant, now)
        if rec.uid:
            self.resv.pop(ticket, None)
        changed = self.gang_running(rec.gang, -1)
        rec.gang, rec.gsize, rec.at, rec.ends = "", 1, None, None
        self.enqueue(ticket, rec, True)
        self.refresh(rec.tenant, now)
        if changed is not None and changed != rec.tenant:
            self.refresh(changed, now)
        self.drop_empty()
        return True


def waiting_for(reason: list[object], tenant: str, pod_class: PodClass) -> str | None:
    """``Admission.waiting_for`` for a reason list, as the queue words it."""
    if not reason:
        return None
    return explain([str(x) for x in reason], tenant, pod_class)
