"""The simulator's autoscaler: what cluster-autoscaler does with fairgate's requests.

Contract: :class:`SimAutoscaler` is the dispatcher's
:class:`~fairshare.cluster.provisioning.Provisioner` in ``fairgate simulate`` (trace key
``autoscaling: {maxCapacity, provisionSeconds}``). A request asks for what its pods
demand (by capacity key); ``provision_seconds`` after it is made, :meth:`provision_due`
adds that capacity to the :class:`~fairshare.sim.simcluster.SimulatedCluster`, never
past ``max_capacity`` per key (the pools' maximum: a request made while pods ran may
come due after they ended; nodes that arrive stay, the simulator scales nothing down),
and the request reads ``Provisioned``. Requests never fail. :meth:`next_due` is the
virtual time of the next arrival of nodes, an event of the simulation like arrivals and
completions. :meth:`waits` (from a request to the start of the last of its pods; one not
started by the horizon counts with its wait so far) and :meth:`provisioned_gpus` (GPU-
equivalents of capacity added) are what ``--json`` reports under ``autoscaling``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairshare.cluster.cluster import GpuPod
from fairshare.sim.simcluster import SimulatedCluster
from tenants import resources


@dataclass
class SimRequest:
    """One request: when it was made, what it asks for, for which pods (uids)."""

    made: float
    demand: dict[str, int]
    pods: tuple[str, ...]
    provisioned: float | None = None
    added: dict[str, int] | None = None  # what arrived for it (at most the maximum)


class SimAutoscaler:
    """See the module docstring."""

    def __init__(self, cluster: SimulatedCluster, clock: Callable[[], float],
                 provision_seconds: float, max_capacity: Mapping[str, int]) -> None:
        self.cluster = cluster
        self.max_capacity = dict(max_capacity)
        self.clock = clock
        self.provision_seconds = provision_seconds
        self.requests: dict[str, SimRequest] = {}

    def create(self, name: str, namespace: str, pods: Sequence[GpuPod],
               labels: Mapping[str, str]) -> None:
        if name in self.requests:
            return
        demand: dict[str, int] = {}
        for pod in pods:
            for key, n in pod.demand.items():
                demand[key] = demand.get(key, 0) + n
        self.requests[name] = SimRequest(self.clock(), demand, tuple(p.uid for p in pods))

    def conditions(self, name: str, namespace: str) -> list[dict[str, Any]] | None:
        request = self.requests.get(name)
        if request is None:
            return None
        if request.provisioned is None:
            return []
        return [{"type": "Provisioned", "status": "True", "reason": "Provisioned",
                 "message": f"simulated nodes after {self.provision_seconds:g}s"}]

    def consume(self, pod: GpuPod, name: str) -> bool:
        return True

    def next_due(self) -> float | None:
        """When the next requested nodes arrive (None: none are on their way)."""
        due = [r.made + self.provision_seconds for r in self.requests.values()
               if r.provisioned is None]
        return min(due, default=None)

    def provision_due(self, now: float) -> None:
        """Add the capacity of every request due by ``now``."""
        for request in self.requests.values():
            if request.provisioned is None and request.made + self.provision_seconds <= now:
                have = self.cluster.capacity()
                request.provisioned = now
                request.added = {key: min(n, max(0, self.max_capacity.get(key, 0)
                                                 - have.get(key, 0)))
                                 for key, n in request.demand.items()}
                self.cluster.grow(request.added)

    def waits(self, started: Mapping[str, float | None], horizon: float) -> list[float]:
        """Per request, seconds from it to the start of the last of its pods;
        ``started``: each pod's start by uid (None: not started, counted to ``horizon``)."""
        waits = []
        for request in self.requests.values():
            starts = [started.get(uid) for uid in request.pods]
            end = horizon if any(s is None for s in starts) else max(
                s for s in starts if s is not None)
            waits.append(end - request.made)
        return waits

    def provisioned_gpus(self) -> float:
        """GPU-equivalents of the capacity added so far."""
        slices = sum(resources.total_slices(r.added) for r in self.requests.values()
                     if r.added is not None)
        return slices / resources.SLICES_PER_GPU
