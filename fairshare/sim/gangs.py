"""What became of each gang in a simulation (``fairgate simulate``): pure, from the pods'
history the simulated cluster keeps.

Contract:
- A gang is the pods of one ``(namespace, group)`` in the
  :class:`~fairshare.sim.simcluster.PodHistory` records. A gang that the scheduler
  preempts or reclaim evicts is restarted by its controller under the next name
  (``<group>-r1``, ``-r2``, ...): that is a gang of its own, arriving when it is
  re-created.
- :func:`gang_reports`: one :class:`GangReport` per gang, by namespace and group:
  ``arrived`` (its first pod created), ``released`` (when the last of its ``size`` pods
  was released; None unless all were), ``wait`` (arrival to release; to the horizon when
  never released), ``ran`` (its first pod's start to its last pod's end, the horizon for
  one still running; 0 when none started) and ``outcome``, the first that holds of:
  ``partly_released`` (its pods were not all released at one instant, or fewer than its
  size were: a violation), ``preempted`` (by the scheduler), ``reclaimed``,
  ``waiting_at_end`` (no pod released by the horizon), ``released_not_started`` (a pod
  released but not started by the horizon), ``running_at_end``, ``ran_whole``.
  :data:`OUTCOME_WORDS` says each in words.
- :func:`gang_violations`: the gangs partly released, with their pods' release times.
- :func:`most_telling`: the gangs a table shows first (partly released, then the
  longest waits) and how many it leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from fairshare.sim.simcluster import PodHistory

GangOutcome = Literal["partly_released", "preempted", "reclaimed", "waiting_at_end",
                      "released_not_started", "running_at_end", "ran_whole"]

OUTCOME_WORDS: dict[GangOutcome, str] = {
    "partly_released": "partly released (a violation)",
    "preempted": "preempted",
    "reclaimed": "reclaimed",
    "waiting_at_end": "still waiting at the end",
    "released_not_started": "released, not started at the end",
    "running_at_end": "running whole at the end",
    "ran_whole": "ran whole",
}


@dataclass(frozen=True)
class GangReport:
    """One gang's fate (see the module docstring); times in virtual seconds."""

    namespace: str
    group: str
    tenant: str
    size: int
    arrived: float
    released: float | None
    wait: float
    ran: float
    outcome: GangOutcome

    @property
    def name(self) -> str:
        """``namespace/group``."""
        return f"{self.namespace}/{self.group}"


def _gangs(history: Mapping[str, PodHistory]) -> dict[tuple[str, str], list[PodHistory]]:
    """The gang members' records by (namespace, group), sorted by it."""
    gangs: dict[tuple[str, str], list[PodHistory]] = {}
    for record in history.values():
        if record.spec.group is not None:
            gangs.setdefault((record.spec.namespace, record.spec.group), []).append(record)
    return dict(sorted(gangs.items()))


def _partly_released(members: Sequence[PodHistory]) -> bool:
    """Whether the members were not all released at one instant (or released without
    all of the gang's pods)."""
    released = {m.released for m in members}
    complete = len(members) == members[0].spec.group_size
    return len(released) > 1 or (None not in released and not complete)


def gang_violations(history: Mapping[str, PodHistory]) -> list[str]:
    """Gangs whose members were not all released at one instant."""
    return [f"{namespace}/{group}: release times {sorted(map(str, {m.released for m in members}))}"
            for (namespace, group), members in _gangs(history).items()
            if _partly_released(members)]


def _outcome(members: Sequence[PodHistory]) -> GangOutcome:
    if _partly_released(members):
        return "partly_released"
    if any(m.preempted for m in members):
        return "preempted"
    if any(m.reclaimed for m in members):
        return "reclaimed"
    if all(m.released is None for m in members):
        return "waiting_at_end"
    if any(m.started is None for m in members):
        return "released_not_started"
    if any(m.ended is None for m in members):
        return "running_at_end"
    return "ran_whole"


def gang_reports(history: Mapping[str, PodHistory], horizon: float) -> list[GangReport]:
    """Every gang of ``history`` at ``horizon`` (see the module docstring)."""
    reports = []
    for (namespace, group), members in _gangs(history).items():
        size = members[0].spec.group_size
        arrived = min(m.created for m in members)
        times = [m.released for m in members if m.released is not None]
        released = max(times) if len(times) == len(members) == size else None
        starts = [m.started for m in members if m.started is not None]
        ran = 0.0
        if starts:
            ran = max(horizon if m.ended is None else m.ended
                      for m in members if m.started is not None) - min(starts)
        reports.append(GangReport(
            namespace=namespace, group=group, tenant=members[0].spec.tenant, size=size,
            arrived=arrived, released=released,
            wait=(horizon if released is None else released) - arrived, ran=ran,
            outcome=_outcome(members)))
    return reports


def most_telling(gangs: Sequence[GangReport], limit: int) -> tuple[list[GangReport], int]:
    """At most ``limit`` gangs, the partly released first, then the longest waits (then
    by arrival and name), and how many are left out."""
    ranked = sorted(gangs, key=lambda g: (g.outcome != "partly_released", -g.wait,
                                          g.arrived, g.name))
    return ranked[:limit], max(0, len(ranked) - limit)
