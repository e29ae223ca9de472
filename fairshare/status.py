"""``fairgate status`` and ``fairgate why``: the queue explained, as data and as text.

Contract:
- :func:`status_report` reads every tenant's quota, usage and backlog from the queue and
  returns plain data (JSON-ready, every key in snake_case as every ``--json`` of fairgate):
  per tenant ``weight``, ``nominal`` (per resource) and ``nominal_gpu_equivalents``,
  ``borrow_limit``, ``inference_reserve``, ``used``, ``borrowed`` (GPU-equivalents),
  ``queued`` by class, ``weighted_share`` (GPU-equivalents used per unit of weight),
  ``entitlement`` (its fair share in GPU-equivalents), ``of_entitlement`` (used /
  entitlement, null when entitled to nothing) and ``ticket_twins`` (the pods presenting a
  ticket another pod owns that are counted against it as pods of their own,
  :meth:`FairQueue.twin_counts`; :func:`twin_lines` prints them); and for the cluster ``capacity``
  (GPU-equivalents), ``capacity_by_class`` (per capacity key, :mod:`tenants.placement`:
  ``key``, ``class`` in words, ``resource``, ``capacity`` and ``used`` in units of the
  resource, all bands; :func:`class_lines` prints it), ``capacity_notes`` (the
  dispatcher's last :class:`~fairshare.cluster.cluster.CapacityReport` as JSON plus ``at``,
  ``override``, ``withheld`` (capacity withheld for released pods the scheduler cannot
  place, by capacity key) and ``unschedulable`` (those pods: ``pod``, ``ticket``,
  ``tenant``, ``demand``, ``since``, ``message``), or null; :func:`capacity_lines` prints
  it), ``jain_index`` (:func:`~fairshare.queue.entitlement.entitled_jain`: of used /
  entitlement, null when not defined) and
  ``held``: the capacity held at ``now`` for entries owed it (:meth:`FairQueue.holds`),
  per tier in queue order: ``tenant``, ``band``, ``pod`` (``namespace/name`` of the head
  pod, a gang's first queued member), ``group`` (a gang's id, else null), ``demand`` and
  ``held`` (units per resource), ``held_gpu_equivalents``, ``demand_gpu_equivalents`` and
  ``gang`` (the queue's record of its gang, :meth:`GangRecord.to_json`, or null);
  :func:`held_lines` prints it; ``gangs``: the gangs still waiting for members or for
  their size (:meth:`FairQueue.incomplete_gangs`, as ``gang``), :func:`gang_lines` prints
  them; ``budgets``: per tenant with a budget, its
  :class:`~fairshare.queue.budget.BudgetStatus` as the dispatcher last stored it (``tenant``,
  ``monthly``, ``spent``, ``currency``, ``month``, ``at``, ``ratio``, ``state``);
  :func:`budget_lines` prints it; ``reclaim``: the dispatcher's reclaim notes
  (:func:`fairshare.reclaim.notes`: on or off, its limits, the pods reclaimed in the
  last hour and the last ones), or null before a dispatcher checked;
  :func:`reclaim_lines` prints it.
  Fair shares come from :func:`fairshare.queue.entitlement.snapshot_fairness`, the
  computation behind the metrics.
  :func:`render_status` prints it as tables (:func:`status_tables`) and lines.
  :func:`status_command` is the CLI entry.
- :func:`why_report` explains one pod (``<namespace>/<name>``) from the audit stream
  (``fairgate:audit``: the webhook's admit/queue/deny records, the dispatcher's
  dispatch/release records) and the queue's ticket state; the pod is also looked up by
  name in the queue, and records sharing its ticket are joined, so a pod created with
  ``generateName`` (admitted as ``<generateName>*``) is explained by its own name once the
  dispatcher has seen it. The verdict is one of ``unknown`` (no record and not in
  the queue: not fairgate's business, or older than the audit retention),
  ``denied`` (with the reason), ``queued`` (position, queue length and what it waits
  for: tenant quota, inference reserve, cluster capacity, gang members; a gang member's
  summary names its gang by where it was declared with the queue's counts, ``gang of
  Indexed Job trainer: 3 of 4 pods created, waiting for the 4th``, and ``gang`` holds
  the record), ``reserved`` /
  ``running`` (released: when, after how long; ``unschedulable`` carries the scheduler's
  message when the dispatcher caught it Unschedulable past its grace) or ``ended`` (its
  usage was freed; a pod reclaimed, ``fairShare.reclaim``, says for whom and after how
  long it ran, and a pod still terminating after its reclaim says it is being reclaimed).
  A pod other tenants' pods were reclaimed for says how many and when the last was. A
  *rider* (a pod whose GPUs are a shared ResourceClaim another pod
  pays for, docs/dra.md "Shared claims") has no ticket in the queue: it is ``running``
  from the dispatcher's records of its charge (its ``dispatch`` or last ``charge``,
  :func:`audit.usage.read_charge`) until its ``release``, with ``charged`` (the demand
  it is charged) and ``riding`` (claim uid -> ``claim``, its name or None, and
  ``payer``, the pod that pays it). A queued borrowed
  pod of a tenant whose budget is exhausted waits for
  :func:`fairshare.queue.budget.held_note`.
  :func:`why_command` is the CLI entry. Times are the queue's clock (Unix seconds).
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, TextIO

import redis
from rich.console import Console
from rich.table import Table

from audit import ADMIT, CHARGE, DENY, DISPATCH, QUEUE, RECLAIM, RELEASE, AuditLog, AuditRecord
from audit.usage import Riding, read_charge, read_preemptor
from fairshare.cluster.cluster import CapacityReport, PodRef
from fairshare.connection import COMMAND_TIMEOUT, RedisTarget, connect_redis
from fairshare.queue.budget import BudgetStatus, held_note, money, percent
from fairshare.queue.entitlement import TenantFairness, jain_text, snapshot_fairness
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import GangRecord, Hold, TenantStatus, TicketStatus, gang_name
from tenants.placement import placement_of_key
from tenants.resources import SLICES_PER_GPU, format_counts, gpu_equivalents, total_slices
from tenants.tables import tenant_table

# A denial's audited reason is "<tag>: <the message the user got>" (webhook.service).
_TAG = re.compile(r"[a-z][a-z-]*")

Verdict = Literal["unknown", "denied", "queued", "reserved", "running", "ended"]


def _gpu_eq(slices: int) -> float:
    return round(slices / SLICES_PER_GPU, 2)


def tenant_row(status: TenantStatus, fair: TenantFairness, twins: int = 0) -> dict[str, Any]:
    """One tenant's line of ``fairgate status`` as plain data (``twins``: the ticket
    twins counted against it, :meth:`FairQueue.twin_counts`)."""
    ratio = fair.of_entitlement
    return {
        "weight": status.weight,
        "nominal": dict(status.nominal),
        "nominal_gpu_equivalents": _gpu_eq(status.nominal_slices),
        "borrow_limit": _gpu_eq(status.borrow_limit_slices),
        "inference_reserve": _gpu_eq(status.inference_reserve_slices),
        "used": _gpu_eq(status.used_slices),
        "borrowed": _gpu_eq(status.borrowed_slices),
        "queued": {"inference": status.queued.get("inference", 0),
                   "training": status.queued.get("training", 0)},
        "weighted_share": round(fair.weighted_share, 4),
        "entitlement": round(fair.entitlement, 2),
        "of_entitlement": round(ratio, 4) if ratio is not None else None,
        "ticket_twins": twins,
    }


def hold_row(hold: Hold, gang: GangRecord | None = None) -> dict[str, Any]:
    """One entry of ``held`` in ``fairgate status`` as plain data (``gang``: the queue's
    record of the entry's gang)."""
    return {
        "tenant": hold.tenant,
        "band": hold.band,
        "pod": f"{hold.namespace}/{hold.name}",
        "group": hold.group,
        "gang": gang.to_json() if gang is not None else None,
        "demand": dict(hold.demand),
        "held": {res: hold.held.get(res, 0) for res in hold.demand},
        "held_gpu_equivalents": _gpu_eq(total_slices(hold.held)),
        "demand_gpu_equivalents": _gpu_eq(total_slices(hold.demand)),
    }


def status_report(queue: FairQueue, now: float | None = None) -> dict[str, Any]:
    """``{"capacity", "capacity_notes", "jain_index", "held", "tenants": {name: row}}``
    for every tenant the queue knows (see tenant_row), from one snapshot of the queue;
    ``held`` as the queue holds it at ``now`` (default: the current time);
    ``reserves_kept_free``: GPU-eq of unused inference reserves no borrowed pod may take."""
    snapshot = queue.snapshot()
    fair = snapshot_fairness(snapshot)
    holds = queue.holds(time.time() if now is None else now)
    gangs = dict(zip([h.group for h in holds if h.group],
                     queue.gangs([h.group for h in holds if h.group]), strict=True))
    twins = queue.twin_counts()
    return {
        "capacity": round(fair.capacity, 2),
        "capacity_by_class": class_rows(snapshot.capacity, queue.class_usage()),
        "capacity_notes": queue.capacity_notes(),
        "jain_index": None if fair.jain_index is None else round(fair.jain_index, 4),
        "held": [hold_row(h, gangs.get(h.group) if h.group else None) for h in holds],
        "gangs": [g.to_json() for g in queue.incomplete_gangs()],
        "tenants": {s.tenant: tenant_row(s, fair.tenants[s.tenant], twins.get(s.tenant, 0))
                    for s in snapshot.tenants},
        "budgets": {name: b.to_json() for name, b in sorted(queue.budgets().items())},
        "reclaim": queue.reclaim_notes(),
        "reserves_kept_free": _gpu_eq(queue.kept_reserve_slices()),
    }


def class_rows(capacity: Mapping[str, int], used: Mapping[str, int]) -> list[dict[str, Any]]:
    """One row per capacity key with capacity or usage, sorted by key."""
    rows: list[dict[str, Any]] = []
    for key in sorted(set(capacity) | set(used)):
        resource, where = placement_of_key(key)
        rows.append({"key": key, "class": where.describe(), "resource": resource,
                     "capacity": capacity.get(key, 0), "used": used.get(key, 0)})
    return rows


def class_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``capacity_by_class`` as text: one line per class and resource."""
    if not rows:
        return ["capacity per placement class: none stored yet"]
    lines = ["capacity per placement class (a pod is released only against its own):"]
    for row in rows:
        lines.append(f"  {row['class']}: {row['resource']} {row['used']} used of "
                     f"{row['capacity']} ({row['key']})")
    return lines


def kept_reserve_lines(kept: float) -> list[str]:
    """The unused inference reserves kept free of borrowed pods, when there are any."""
    if not kept:
        return []
    return [f"inference reserves kept free: {kept:g} GPU-eq unused by inference, which no "
            "borrowed pod may take (fairShare.lendInferenceReserve: false)"]


def held_lines(held: list[dict[str, Any]]) -> list[str]:
    """The ``held`` part of the status report as text: one line per entry capacity is
    held for, e.g. ``team-b: 5 of 8 gpu held for team-b-ml/train-0 (training)``."""
    if not held:
        return ["capacity held: none (no queued entry of a tenant below its weighted share "
                "is waiting for capacity)"]
    lines = ["capacity held for the entries owed it, in fair-share order (no later pod of "
             "its band may use it; more drains to them, first one first, as pods end):"]
    for row in held:
        amounts = ", ".join(f"{row['held'][res]} of {units} {res}"
                            for res, units in sorted(row["demand"].items()))
        gang = row.get("gang")
        if gang:
            entry = (f"{gang_name(gang['id'], gang['source'] or '')} ({gang['id']}, "
                     f"{gang['created']} pods; {row['pod']} first)")
        else:
            entry = f"gang {row['group']} ({row['pod']} first)" if row["group"] else row["pod"]
        lines.append(f"  {row['tenant']}: {amounts} held for {entry} ({row['band']})")
    return lines


def gang_lines(gangs: list[dict[str, Any]]) -> list[str]:
    """``gangs`` of the status report as text: one line per gang still waiting for its
    pods or its size, e.g. ``team-a: gang of Indexed Job trainer: 3 of 4 pods created,
    waiting for the 4th (team-a-dev/job.trainer.1a2b3c4d5e)``."""
    if not gangs:
        return ["gangs waiting for their pods: none"]
    lines = ["gangs waiting for their pods (none of a gang runs before all of them exist):"]
    for gang in gangs:
        lines.append(f"  {gang['tenant'] or '?'}: {gang['summary']} ({gang['id']})")
    return lines


def twin_lines(tenants: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The tenants' ``ticket_twins`` as one line, e.g. ``ticket twins counted (...):
    team-a 1, team-b 0``."""
    counts = ", ".join(f"{name} {row.get('ticket_twins', 0)}" for name, row in tenants.items())
    return ["ticket twins counted (pods presenting a ticket another pod owns, each counted "
            f"as a pod of its own until it ends): {counts}"]


def capacity_lines(notes: Mapping[str, Any] | None) -> list[str]:
    """The dispatcher's capacity notes as text: where the capacity comes from, then one
    line per node left out (and why) and per node whose GPUs other pods hold."""
    if notes is None:
        return ["capacity notes: none yet (written by `fairgate dispatch` when it reads the "
                "nodes)"]
    try:
        report = CapacityReport.from_json(notes)
        at = _when(float(notes["at"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return ["capacity notes: unreadable (written by another fairgate version?)"]
    offered = format_counts(report.total) or "nothing"
    if notes.get("override"):
        head = f"capacity set by platform.capacity; the nodes offer {offered} (at {at})"
    else:
        head = f"capacity from the nodes: {offered} (at {at})"
    lines = [head] + [f"  {line}" for line in report.notes()]
    return lines + unschedulable_lines(notes) + autoscaling_lines(notes)


def autoscaling_lines(notes: Mapping[str, Any]) -> list[str]:
    """The heads waiting for nodes (``autoscaling`` of the notes), one line each."""
    heads = [h for h in notes.get("autoscaling") or [] if isinstance(h, dict)]
    if not heads:
        return []
    lines = [f"  waiting for nodes (autoscaling), in queue order: {len(heads)}"]
    for head in heads:
        lines.append(f"    {head.get('key')} of {head.get('tenant')} "
                     f"({format_counts(head.get('demand') or {})}), {head.get('state')} "
                     f"since {_when(float(head.get('since', 0)))}: {head.get('message')}")
    return lines


def unschedulable_lines(notes: Mapping[str, Any]) -> list[str]:
    """The capacity withheld for caught unschedulable releases, then one line per pod."""
    caught = notes.get("unschedulable") or []
    if not caught:
        return []
    withheld = format_counts(notes.get("withheld") or {})
    count = len(caught)
    lines = [f"  withheld {withheld} for {count} released pod{'s' if count != 1 else ''} "
             f"the scheduler cannot place (counted against quota until bound or gone):"]
    for pod in caught:
        lines.append(f"    {pod['pod']} ({format_counts(pod['demand'])}) Unschedulable since "
                     f"{_when(float(pod['since']))}: {pod['message']}")
    return lines


def budget_lines(budgets: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``budgets`` of the status report as text: per tenant spent / budget / state."""
    lines = []
    for name, entry in budgets.items():
        try:
            status = BudgetStatus.from_json(entry)
        except (KeyError, TypeError, ValueError):
            continue
        what = {"ok": "ok", "warning": "warning (admissions warned)",
                "exhausted": "exhausted: training may not borrow"}[status.state]
        lines.append(f"budget {name}: {money(status.spent)} / {money(status.monthly)} "
                     f"{status.currency} in {status.month} ({percent(status.ratio)}), {what}")
    return lines


def reclaim_lines(notes: Mapping[str, Any] | None,
                  sees: Callable[[str], bool] | None = None) -> list[str]:
    """``reclaim`` of the status report (the dispatcher's reclaim notes,
    :func:`fairshare.reclaim.notes`) as text: whether it is on and with what limits, how
    many pods it took in the last hour, then one line per recent reclaim (``[]`` when no
    dispatcher has checked yet). ``sees``: which tenants the reader may see; a reclaim
    naming another is left out, and so is the cluster-wide count."""
    if notes is None:
        return []
    if not notes.get("on"):
        return ["reclaim: off (fairShare.reclaim is not set in fairgate-platform): no "
                "training pod is evicted for another tenant's"]
    header = (f"reclaim: on (after {notes.get('after', 0):g}s waiting, pods that ran at "
              f"least {notes.get('min_runtime', 0):g}s, at most {notes.get('per_hour', 0)} an "
              "hour)")
    if sees is None:  # the cluster-wide count tells of every tenant
        header += f": {notes.get('last_hour', 0)} reclaimed in the last hour"
    lines = [header]
    for r in notes.get("recent") or []:
        if sees is not None and not (sees(str(r.get("tenant"))) and
                                     sees(str(r.get("for_tenant")))):
            continue
        lines.append(f"  at {_when(float(r.get('at', 0)))} reclaimed {r.get('pod')} of "
                     f"tenant {r.get('tenant')} ({r.get('gpu_equivalents', 0):g} GPU-eq, after "
                     f"{r.get('ran_seconds', 0):g}s running) for {r.get('for')} of tenant "
                     f"{r.get('for_tenant')}")
    return lines


def status_tables(report: dict[str, Any]) -> tuple[Table, Table, Table]:
    """The tenants of the status report as three tables that fit 80 columns: quota and
    queued pods, use against entitlement (GPU-equivalents), and the nominal quota per
    resource (in units of each resource)."""
    tenants = report["tenants"]
    names = sorted({res for row in tenants.values() for res, n in row["nominal"].items() if n})
    quota = tenant_table("fairgate tenants: quota and queued pods",
                         ("tenant", "weight", "nominal", "borrow limit", "queued inference",
                          "queued training"), caption="nominal and borrow limit in GPU-eq")
    use = tenant_table("fairgate tenants: use against entitlement",
                       ("tenant", "used", "borrowed", "entitlement", "of entitlement",
                        "weighted share"),
                       caption="in GPU-eq; entitlement: the tenant's fair share (below); "
                       "weighted share: used / weight")
    per_resource = tenant_table("nominal quota per resource (in units of each)",
                                ("tenant", *names))
    for name, row in tenants.items():
        ratio = row["of_entitlement"]
        quota.add_row(
            name, f"{row['weight']:g}", f"{row['nominal_gpu_equivalents']:.2f}",
            f"{row['borrow_limit']:.2f}", str(row["queued"]["inference"]),
            str(row["queued"]["training"]),
        )
        use.add_row(
            name, f"{row['used']:.2f}", f"{row['borrowed']:.2f}", f"{row['entitlement']:.2f}",
            f"{ratio:.0%}" if ratio is not None else "-", f"{row['weighted_share']:.3f}",
        )
        per_resource.add_row(name, *(str(row["nominal"].get(res, 0)) for res in names))
    return quota, use, per_resource


def render_status(report: dict[str, Any], console: Console) -> None:
    """The status report: :func:`status_tables`, then the fairness, capacity, holds,
    gangs and budgets in lines (not wrapped: the terminal wraps them, ``grep`` finds them
    whole)."""
    if not report["tenants"]:
        console.print("no tenants in the queue yet: is the dispatcher or webhook running "
                      "against this Redis (check --redis-url)?")
        return
    for table in status_tables(report):
        console.print(table)
    console.print(
        f"capacity {report['capacity']:g} GPU-eq; Jain's index of used / entitlement "
        f"{jain_text(report['jain_index'], 3)}. entitlement: the tenant's fair share, each "
        "placement class's capacity split by weight among tenants with demand in it, each "
        "capped at used + queued, summed over classes and capped at nominal + borrowLimit.",
        highlight=False, soft_wrap=True,
    )
    for line in (twin_lines(report["tenants"]) + class_lines(report["capacity_by_class"])
                 + kept_reserve_lines(report.get("reserves_kept_free") or 0)
                 + held_lines(report["held"]) + gang_lines(report.get("gangs") or [])
                 + budget_lines(report.get("budgets") or {})
                 + reclaim_lines(report.get("reclaim"))
                 + capacity_lines(report.get("capacity_notes"))):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@dataclass(frozen=True)
class WhyReport:
    """What fairgate knows about one pod."""

    pod: str
    verdict: Verdict
    summary: str
    ticket: str | None = None
    tenant: str | None = None
    pod_class: str | None = None
    demand: str | None = None
    position: int | None = None
    queue_length: int | None = None
    waiting_for: str | None = None
    released_at: float | None = None
    waited_seconds: float | None = None
    unschedulable: str | None = None
    gang: dict[str, Any] | None = None
    charged: str | None = None  # a rider's charge (a demand text, "" for nothing)
    riding: dict[str, dict[str, str | None]] | None = None  # a rider's claims: uid -> claim, payer
    history: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain data (``class`` for ``pod_class``; unset fields left out)."""
        data = {k: v for k, v in asdict(self).items() if v is not None}
        if "pod_class" in data:
            data["class"] = data.pop("pod_class")
        return data


def _when(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _records_of(ref: PodRef, records: Iterable[AuditRecord],
                known: str | None) -> tuple[list[AuditRecord], list[AuditRecord]]:
    """Records about ``ref``: by namespace/name, plus every record sharing their tickets
    or the ticket ``known`` the queue holds for it (the webhook's records of a pod
    created with ``generateName`` carry ``<generateName>*``, not the pod's name); and
    the ``reclaim`` records of pods reclaimed for it."""
    everything: list[AuditRecord] = []
    for_it: list[AuditRecord] = []
    for r in records:
        if r.namespace == ref.namespace:
            everything.append(r)
        if r.decision == RECLAIM and read_preemptor(r.diff) == str(ref):
            for_it.append(r)
    tickets = {r.uid for r in everything if r.name == ref.name and r.uid}
    if known is not None:
        tickets.add(known)
    return [r for r in everything if r.name == ref.name or r.uid in tickets], for_it


def _history(records: list[AuditRecord]) -> list[str]:
    return [f"{r.time} {r.decision}: {r.reason}" if r.reason else f"{r.time} {r.decision}"
            for r in records]


def why_report(
    ref: PodRef, queue: FairQueue, records: Iterable[AuditRecord], now: float
) -> WhyReport:
    """Explain ``ref`` from its audit ``records`` and the queue's state at ``now``.

    The queue is asked for the ticket of ``ref`` by name too, so a pod created with
    ``generateName`` is explained by the name ``kubectl`` shows once the dispatcher has
    seen it (:meth:`FairQueue.confirm` gives its ticket the pod's own name), with the
    webhook's records about ``<generateName>*`` joined through that ticket.
    """
    known = queue.find(ref.namespace, ref.name)
    mine, reclaimed_for_it = _records_of(ref, records, known)
    history = _history(mine)
    if not mine:  # audit trimmed or not written
        status = queue.ticket_status(known, now) if known is not None else None
        if known is not None and status is not None:
            report = _reclaims(status_why(status, str(ref), _gang_of(status, queue)),
                               None, reclaimed_for_it)
            return _held_by_budget(_unschedulable(report, queue), status, queue)
        return WhyReport(
            str(ref), "unknown",
            f"fairgate has no record of {ref}: either it is not fairgate's business (it asks "
            "for no nvidia.com GPU or MIG resource), it was never created, or its records are "
            "older than the audit log's retention",
        )
    last = mine[-1]
    tickets = [r.uid for r in mine
               if r.decision in (ADMIT, QUEUE, DISPATCH, RELEASE, RECLAIM) and r.uid]
    if last.decision == DENY or not tickets:
        tag, _, message = last.reason.partition(": ")
        told = f"{message} ({tag})" if message and _TAG.fullmatch(tag) else last.reason
        return WhyReport(str(ref), "denied", f"denied at admission: {told}",
                         tenant=last.tenant or None, pod_class=last.pod_class or None,
                         demand=last.demand or None, history=history)
    ticket = tickets[-1]
    status = queue.ticket_status(ticket, now)
    common: dict[str, Any] = {
        "pod": str(ref), "ticket": ticket, "tenant": last.tenant or None,
        "pod_class": last.pod_class or None, "demand": last.demand or None,
        "history": history,
    }
    reclaimed = next((r for r in reversed(mine) if r.decision == RECLAIM), None)
    if status is None and reclaimed is not None:
        return WhyReport(
            verdict="ended",
            summary=f"{reclaimed.reason} (at {reclaimed.time}; fairShare.reclaim): its "
                    "usage was freed; its controller's replacement, if any, is queued like "
                    "any new pod",
            **common,
        )
    if status is None:
        rider = _rider(mine, common)
        if rider is not None:
            return rider
        ended = next((r for r in reversed(mine) if r.decision == RELEASE), None)
        why = f" ({ended.reason})" if ended is not None and ended.reason else ""
        return WhyReport(
            verdict="ended",
            summary=f"no longer in the queue: its usage was freed{why}; the pod ended, was "
                    "deleted, or its reservation expired before the pod was created",
            **common,
        )
    report = _reclaims(_from_status(status, common, _gang_of(status, queue)), reclaimed,
                       reclaimed_for_it)
    return _held_by_budget(_unschedulable(report, queue), status, queue)


def _reclaims(report: WhyReport, reclaimed: AuditRecord | None,
              for_it: list[AuditRecord]) -> WhyReport:
    """``report`` of a pod still in the queue, saying that it is being reclaimed (its
    ``reclaim`` record) and how many pods were reclaimed for it."""
    summary = report.summary
    if reclaimed is not None:  # evicted, still terminating
        summary += f"; being {reclaimed.reason}"
    if for_it:
        summary += (f"; {len(for_it)} pod{'' if len(for_it) == 1 else 's'} of other tenants "
                    f"reclaimed for it, the last at {for_it[-1].time} (fairShare.reclaim)")
    return replace(report, summary=summary)


def _rider(records: list[AuditRecord], common: dict[str, Any]) -> WhyReport | None:
    """The report of a pod that rides on shared ResourceClaims another pod pays for, from
    the last charge its ``dispatch``/``charge`` records state (None when it rides on
    nothing, or was released since)."""
    riding: tuple[AuditRecord, str, dict[str, Riding]] | None = None
    for record in records:
        if record.decision == RELEASE:
            riding = None
        elif record.decision in (DISPATCH, CHARGE):
            charge = read_charge(record.diff)
            if charge is not None:
                riding = (record, *charge)
    if riding is None or not riding[2]:
        return None
    record, charged, claims = riding
    paid = "; ".join(f"runs on shared ResourceClaim {ride.words(uid)}"
                     for uid, ride in claims.items())
    own = (f"only its own demand ({charged})" if charged
           else "nothing: it asks for no GPUs of its own")
    return WhyReport(verdict="running", summary=f"{paid}; charged {own}, since {record.time}",
                     charged=charged, riding={uid: ride._asdict() for uid, ride in claims.items()},
                     **common)


def _gang_of(status: TicketStatus, queue: FairQueue) -> GangRecord | None:
    """The queue's record of the gang ``status`` belongs to (None: no gang, or gone)."""
    return queue.gangs([status.group])[0] if status.group else None


def _held_by_budget(report: WhyReport, status: TicketStatus, queue: FairQueue) -> WhyReport:
    """``report`` waiting for :func:`~fairshare.queue.budget.held_note` when it is a queued
    borrowed pod of a tenant whose budget is exhausted (borrowing is off)."""
    if report.verdict != "queued" or status.band != "borrowed":
        return report
    note = held_note(queue.budgets().get(status.tenant))
    if note is None:
        return report
    summary = report.summary.replace(f"waiting for {report.waiting_for}", f"waiting for {note}")
    return replace(report, summary=summary, waiting_for=note)


def _unschedulable(report: WhyReport, queue: FairQueue) -> WhyReport:
    """``report`` with the dispatcher's note if it caught the pod Unschedulable, or if
    the pod waits for nodes (autoscaled pools)."""
    if report.verdict not in ("running", "reserved") or report.ticket is None:
        return report
    heads = (queue.capacity_notes() or {}).get("autoscaling") or []
    head = next((h for h in heads if isinstance(h, dict)
                 and report.ticket in (h.get("tickets") or [])), None)
    if head is not None:
        said = str(head.get("message", ""))
        return replace(report, waiting_for=said, summary=(
            f"{report.summary}; waiting for nodes ({head.get('state')} since "
            f"{_when(float(head.get('since', 0)))}): {said}"))
    caught = (queue.capacity_notes() or {}).get("unschedulable") or []
    note = next((c for c in caught if isinstance(c, dict) and c.get("ticket") == report.ticket),
                None)
    if note is None:
        return report
    message = str(note.get("message", ""))
    summary = (f"{report.summary}; but the scheduler cannot place it (Unschedulable since "
               f"{_when(float(note.get('since', 0)))}: {message}): it stays counted against "
               f"quota and fairgate withholds its capacity until it is bound or gone")
    return replace(report, summary=summary, unschedulable=message)


def status_why(status: TicketStatus, pod: str, gang: GangRecord | None = None) -> WhyReport:
    """What ``fairgate why`` says of a ticket the queue knows, from its status and its
    gang's record ``gang`` (:meth:`FairQueue.gangs`) alone (no audit history): the
    console's queue rows, in the same words."""
    return _from_status(status, {"pod": pod, "ticket": status.ticket, "history": []}, gang)


def _gang_words(status: TicketStatus, gang: GangRecord | None) -> str:
    """The gang of ``status`` and how far it got (``""`` without a gang)."""
    if status.group is None:
        return ""
    if gang is None:  # its last member is being released or freed right now
        return gang_name(status.group, "")
    return gang.describe()


def _from_status(status: TicketStatus, common: dict[str, Any],
                 gang: GangRecord | None = None) -> WhyReport:
    common.update(tenant=status.tenant, pod_class=status.pod_class,
                  demand=format_counts(status.demand),
                  gang=gang.to_json() if gang is not None else None)
    lane = f"{status.tenant}/{status.pod_class}"
    words = _gang_words(status, gang)
    if status.state in ("queued", "gang-waiting"):
        waiting = status.waiting_for or "its turn"
        incomplete = gang is not None and (gang.size is None or gang.created < gang.size)
        if status.position is None and incomplete:
            # the gang says what it waits for: its missing pods, or its size
            summary = f"{words}; queued for {lane} ({status.queue_length} queued)"
        else:
            if status.position is None:
                where = f"queued for {lane} ({status.queue_length} queued)"
            else:
                where = (f"queued: position {status.position} of {status.queue_length} "
                         f"for {lane}")
            summary = f"{where}, waiting for {waiting}"
            if words:
                summary += f"; {words} (released together)"
        return WhyReport(
            verdict="queued", summary=summary,
            position=status.position, queue_length=status.queue_length,
            waiting_for=waiting, **common,
        )
    released = status.released_at
    waited = max(0.0, released - status.submitted_at) if released is not None else None
    verdict: Verdict = "running" if status.state == "running" else "reserved"
    if released is None or waited is None:
        held = gpu_equivalents(total_slices(status.demand))
        summary = f"released as {status.band} (holding {held} GPU-eq)"
    else:
        summary = (f"released as {status.band} at {_when(released)} after {waited:.1f}s in "
                   f"queue; {'running' if verdict == 'running' else 'reserved, pod not seen yet'}")
    if words:
        summary += f"; {words}"
    return WhyReport(verdict=verdict, summary=summary, released_at=released,
                     waited_seconds=waited, **common)


def render_why(report: WhyReport, out: TextIO) -> None:
    """The report as a few lines of text."""
    out.write(f"{report.pod}: {report.summary}\n")
    details = [(k, getattr(report, k)) for k in ("ticket", "tenant", "pod_class", "demand")]
    for key, value in details:
        if value is not None:
            out.write(f"  {key.replace('pod_class', 'class')}: {value}\n")
    if report.gang is not None:
        source = report.gang["source"] or "not known to the queue"
        out.write(f"  gang: {report.gang['id']} (declared by {source})\n")
    if report.history:
        out.write("  audit history:\n")
        for line in report.history[-10:]:
            out.write(f"    {line}\n")


def _audit_records(client: redis.Redis) -> Iterable[AuditRecord]:
    return (e.record for e in AuditLog(client).entries() if e.record is not None)


def _unreadable(target: RedisTarget, error: Exception) -> str:
    return f"fairgate: error: {target.problem(error)}\n"


def status_command(
    redis_target: RedisTarget | str, json_out: bool, out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``fairgate status``: 0, or 1 when Redis cannot be read."""
    stdout, stderr = out or sys.stdout, err or sys.stderr
    target = RedisTarget.of(redis_target)
    client = connect_redis(target, COMMAND_TIMEOUT)
    try:
        report = status_report(FairQueue(client))
    except (redis.RedisError, OSError) as error:
        stderr.write(_unreadable(target, error))
        return 1
    finally:
        client.close()
    if json_out:
        stdout.write(json.dumps(report) + "\n")
    else:
        render_status(report, Console(file=stdout))
    return 0


def why_command(
    redis_target: RedisTarget | str, ref: str, json_out: bool = False, out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``fairgate why <ns>/<pod>``: 0; 1 when fairgate knows nothing of the pod (verdict
    ``unknown``: the reason on ``err`` as ``fairgate: error: ...``, or the report on ``out``
    with ``json_out``) or Redis fails; 2 for a malformed reference."""
    stdout, stderr = out or sys.stdout, err or sys.stderr
    try:
        pod = PodRef.parse(ref)
    except ValueError as error:
        stderr.write(f"fairgate: error: {error}\n")
        return 2
    target = RedisTarget.of(redis_target)
    client = connect_redis(target, COMMAND_TIMEOUT)
    try:
        report = why_report(pod, FairQueue(client), _audit_records(client), time.time())
    except (redis.RedisError, OSError) as error:
        stderr.write(_unreadable(target, error))
        return 1
    finally:
        client.close()
    if json_out:
        stdout.write(json.dumps(report.to_json()) + "\n")
    elif report.verdict == "unknown":
        stderr.write(f"fairgate: error: {report.summary}\n")
    else:
        render_why(report, stdout)
    return 1 if report.verdict == "unknown" else 0
