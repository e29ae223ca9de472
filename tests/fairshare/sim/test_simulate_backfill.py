"""Backfill in the simulator (fairshare/queue/README.md "Backfill"): the real queue and
dispatcher on a virtual clock, in a real Redis. While the cluster drains for a pod
larger than what is free, a waiting pod that fits the free GPUs and is expected to end
before the drain does runs in them.

The trace: 4 GPUs. ``big`` (weight 1) runs 4-GPU pods of 60 s, so each of its pods
waits for the whole cluster to drain; ``long`` (weight 3) 1-GPU pods of 600 s, owed
capacity too while ``big`` drains; ``short`` (weight 1) 2-GPU pods of 100 s. Together
the two owed entries lack more GPUs than the running pods hold (``long`` fits only
after ``big`` ran): that once counted as never fitting, and no ``short`` pod was
backfilled into any drain (utilisation 0.76)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from fairshare.sim.simcluster import PodHistory
from fairshare.sim.simulate import Simulation
from fairshare.sim.trace import parse_trace

CAPACITY = 4
SHORT_GPUS, SHORT_RUN = 2, 100


def trace(declared: bool) -> dict[str, Any]:
    """The trace of the module docstring; ``declared``: every pod declares its run time
    (``activeDeadlineSeconds`` = its duration), else the queue learns the averages."""
    def stream(tenant: str, gpus: int, seconds: int, count: int) -> dict[str, Any]:
        arrival = {"at": 0, "tenant": tenant, "class": "training", "demand": {"gpu": gpus},
                   "duration": seconds, "count": count}
        return {**arrival, "activeDeadlineSeconds": seconds} if declared else arrival

    return {
        "capacity": {"gpu": CAPACITY},
        "tenants": {name: {"weight": weight, "nominal": {"gpu": CAPACITY}}
                    for name, weight in (("big", 1), ("long", 3), ("short", 1))},
        "arrivals": [stream("big", 4, 60, 60), stream("long", 1, 600, 60),
                     stream("short", SHORT_GPUS, SHORT_RUN, 300)],
        "horizon": 6000,
    }


def missed_backfills(history: list[PodHistory], since: float) -> list[float]:
    """The moments from ``since`` at which a ``short`` pod waited while the GPUs it asks
    for stayed free for its whole run (it would have ended before anything took them)."""
    times = sorted({t for h in history for t in (h.created, h.started, h.ended)
                    if t is not None})

    def free(at: float) -> int:
        return CAPACITY - sum(h.spec.demand["gpu"] for h in history
                              if h.started is not None and h.started <= at
                              and (h.ended is None or h.ended > at))

    def short_waits(at: float) -> bool:
        return any(h.spec.tenant == "short" and h.created <= at
                   and (h.started is None or h.started > at) for h in history)

    return [t for t in times if t >= since and short_waits(t)
            and all(free(x) >= SHORT_GPUS for x in times if t <= x < t + SHORT_RUN)]


@pytest.mark.parametrize("declared", [True, False])
def test_a_pod_that_ends_before_the_drain_is_backfilled_into_it(
        redis_url: str, declared: bool) -> None:
    """Once every tenant has had a pod end (the queue knows its run time, declared or
    learned), no ``short`` pod waits while 2 GPUs stay free for its 100 s: each drain for
    ``big`` is backfilled, and the GPUs never idle while pods wait."""
    sim = Simulation(parse_trace(trace(declared)), redis.Redis.from_url(redis_url),
                     "fairgate:test:")
    report = sim.run()
    history = list(sim.cluster.history.values())
    known = max(min(h.ended for h in history if h.spec.tenant == name and h.ended)
                for name in ("big", "long", "short"))
    assert missed_backfills(history, known) == []
    assert report.utilization == pytest.approx(1.0)
