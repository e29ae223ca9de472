"""The simulation trace: capacity, tenants and pod arrivals (``fairgate simulate``).

Contract (format in docs/reference.md, "Simulation trace"):
- :func:`load_trace` / :func:`parse_trace` return a validated :class:`Trace` or raise
  :class:`~tenants.schema.ConfigError` whose problems name the field path
  (``arrivals.3.demand``), what is wrong and how to fix it.
- Times and durations are seconds. An arrival with ``count: n, every: s`` is a stream of
  ``n`` pods (or gangs) at ``at, at+s, ...``. With ``group``/``groupSize`` each item of the
  stream is a gang of ``groupSize`` pods that must be released together. ``preemptible``
  labels its pods ``fairgate.io/preemptible: "true"`` (reclaim may evict them);
  ``activeDeadlineSeconds`` is their declared run time (an upper bound: a pod still
  running then is stopped, as the kubelet stops it).
- :meth:`Trace.config` is the :class:`~tenants.models.FairgateConfig` the queue runs with
  (each tenant's ceiling is its nominal quota, rounded up to whole GPU-equivalents;
  the optional ``fairShare`` is platform.yaml's, e.g. ``{usageHalfLife: 30m}`` or
  ``{reclaim: {after: 5m, minRuntime: 30m, perHour: 12}}``; the optional
  ``autoscaling: {maxCapacity, provisionSeconds}`` is platform.yaml's ``autoscaling`` in
  ``provisioningRequest`` mode with that ``maxCapacity``).
- :meth:`Trace.pods` expands arrivals into :class:`TracePod` items sorted by arrival time,
  each with its demand by capacity key of its placement class (:mod:`tenants.placement`:
  the arrival's ``migProfile``, as the pod label ``fairgate.io/mig-profile``, and its
  tenant's ``nodePool``).
- ``capacity`` is per capacity key: ``{gpu: 16}`` is the default class (whole GPUs on
  nodes without MIG and in no pool); ``gpu@pool-a``, ``mig-1g.5gb#single`` name others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from tenants import placement, resources
from tenants.localdir import read_config_file
from tenants.models import (
    FairgateConfig,
    FairShareSpec,
    GpuEquivalents,
    NonNegativeInt,
    PlatformConfig,
    PodClass,
    PricingSpec,
    QuotaSpec,
)
from tenants.placement import check_node_pool
from tenants.schema import ConfigError, Problem, load_yaml_mapping, parse_model, quota_problems

# A trace is a planning input: keep it small enough to simulate in minutes.
MAX_PODS = 200_000
# Tenant and group names become namespace names and label values.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_NAME_HINT = ("is not a valid name: use at most 42 lower-case letters, digits and '-', "
              "starting and ending with a letter or digit (e.g. team-a)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _counts(value: dict[str, int]) -> dict[str, int]:
    for name in value:
        if not resources.is_known(name):
            raise resources.UnknownResourceError(name)
    return {resources.normalise(name): n for name, n in value.items()}


def _capacity_keys(value: dict[str, int]) -> dict[str, int]:
    for key in value:
        problem = placement.key_problem(key)
        if problem is not None:
            raise ValueError(problem)
    return value


class TraceTenant(_Strict):
    """A tenant of the trace: weight, node pool, plus the fields of its quota ConfigMap."""

    weight: float = Field(gt=0)
    node_pool: str | None = Field(None, alias="nodePool")

    _pool = field_validator("node_pool")(check_node_pool)
    nominal: dict[str, NonNegativeInt] = {}
    borrow_limit: GpuEquivalents = Field(GpuEquivalents(), alias="borrowLimit")
    inference_reserve: GpuEquivalents = Field(GpuEquivalents(), alias="inferenceReserve")

    _known_nominal = field_validator("nominal")(_counts)

    def quota(self) -> QuotaSpec:
        """The tenant's quota as a :class:`QuotaSpec`."""
        return QuotaSpec.model_validate(
            {
                "nominal": self.nominal,
                "borrowLimit": {"gpuEquivalents": self.borrow_limit.gpu_equivalents},
                "inferenceReserve": {"gpuEquivalents": self.inference_reserve.gpu_equivalents},
            }
        )


class Arrival(_Strict):
    """One line of ``arrivals``: a pod, a stream of pods, or a stream of gangs."""

    at: float = Field(ge=0)
    tenant: str
    pod_class: PodClass = Field(alias="class")
    demand: dict[str, PositiveInt]
    duration: float = Field(gt=0)
    count: PositiveInt = 1
    every: float = Field(0.0, ge=0)
    group: str | None = None
    group_size: PositiveInt | None = Field(None, alias="groupSize")
    mig_profile: str | None = Field(None, alias="migProfile")
    preemptible: bool = False
    active_deadline_seconds: PositiveInt | None = Field(None, alias="activeDeadlineSeconds")

    _known_demand = field_validator("demand")(_counts)

    @model_validator(mode="after")
    def _gang_fields(self) -> Arrival:
        if not self.demand:
            raise ValueError("demand is empty: give at least one resource, e.g. {gpu: 1}")
        if (self.group is None) != (self.group_size is None):
            raise ValueError("group and groupSize go together: give both for a gang, or neither")
        return self

    @property
    def pods_per_item(self) -> int:
        """Pods created at each step of the stream (the gang size, or 1)."""
        return self.group_size or 1


@dataclass(frozen=True)
class TracePod:
    """One pod of the expanded trace."""

    name: str
    at: float
    tenant: str
    pod_class: PodClass
    demand: dict[str, int]
    duration: float
    group: str | None
    group_size: int
    preemptible: bool = False
    run_seconds: int | None = None  # activeDeadlineSeconds: its declared run time


class TraceAutoscaling(_Strict):
    """``autoscaling``: the pools grow up to ``maxCapacity`` (per capacity key, as
    ``capacity``); the nodes a request asks for arrive ``provisionSeconds`` after it."""

    max_capacity: dict[str, NonNegativeInt] = Field(alias="maxCapacity")
    provision_seconds: float = Field(ge=0, alias="provisionSeconds")

    _known_keys = field_validator("max_capacity")(_capacity_keys)


class Trace(_Strict):
    """A whole trace file."""

    capacity: dict[str, NonNegativeInt]
    tenants: dict[str, TraceTenant]
    arrivals: list[Arrival]
    horizon: float = Field(gt=0)
    fair_share: FairShareSpec = Field(FairShareSpec(), alias="fairShare")
    pricing: PricingSpec | None = None
    autoscaling: TraceAutoscaling | None = None

    _known_capacity = field_validator("capacity")(_capacity_keys)

    def config(self) -> FairgateConfig:
        """The platform and quota configuration the simulated queue runs with."""
        platform = PlatformConfig.model_validate(
            {
                "tenants": {
                    name: {
                        "weight": t.weight,
                        "ceiling": {"gpuEquivalents": -(-t.quota().nominal_slices // 7)},
                        "nodePool": t.node_pool,
                    }
                    for name, t in self.tenants.items()
                },
                "fairShare": self.fair_share,
                **({"autoscaling": {"mode": "provisioningRequest",
                                    "maxCapacity": self.autoscaling.max_capacity}}
                   if self.autoscaling is not None else {}),
            }
        )
        quotas = {name: t.quota() for name, t in self.tenants.items()}
        return FairgateConfig(platform=platform, quotas=quotas)

    def demand_of(self, arrival: Arrival) -> dict[str, int]:
        """An arrival's demand by capacity key (raises PlacementError for a bad
        ``migProfile``)."""
        demand = dict(arrival.demand)
        if arrival.mig_profile is not None:
            demand = placement.profile_demand(demand, arrival.mig_profile)
        tenant = self.tenants.get(arrival.tenant)
        pool = tenant.node_pool if tenant is not None else None
        return placement.pod_placement(demand, arrival.mig_profile, pool).keyed(demand)

    def pods(self) -> list[TracePod]:
        """Every pod the trace creates, ordered by arrival time (stable)."""
        pods: list[TracePod] = []
        for index, arrival in enumerate(self.arrivals):
            demand = self.demand_of(arrival)
            for step in range(arrival.count):
                at = arrival.at + step * arrival.every
                group = arrival.group
                if group is not None and arrival.count > 1:
                    group = f"{group}-{step}"
                for member in range(arrival.pods_per_item):
                    pods.append(
                        TracePod(
                            name=f"{arrival.tenant}-{arrival.pod_class}-{index}-{step}-{member}",
                            at=at,
                            tenant=arrival.tenant,
                            pod_class=arrival.pod_class,
                            demand=dict(demand),
                            duration=arrival.duration,
                            group=group,
                            group_size=arrival.pods_per_item,
                            preemptible=arrival.preemptible,
                            run_seconds=arrival.active_deadline_seconds,
                        )
                    )
        pods.sort(key=lambda p: p.at)
        return pods


def _cross_problems(trace: Trace) -> list[Problem]:
    problems: list[Problem] = []
    capacity_slices = resources.total_slices(trace.capacity)
    if capacity_slices == 0:
        problems.append(Problem("capacity", "is empty: give at least one resource, e.g. {gpu: 8}"))
    for name, tenant in trace.tenants.items():
        if not _NAME.match(name):
            problems.append(Problem(f"tenants.{name}", _NAME_HINT))
        for problem in quota_problems(tenant.quota(), name, None):
            problems.append(Problem(f"tenants.{name}.{problem.field}", problem.message))
    total = 0
    groups: dict[str, int] = {}
    for index, arrival in enumerate(trace.arrivals):
        where = f"arrivals.{index}"
        total += arrival.count * arrival.pods_per_item
        if arrival.tenant not in trace.tenants:
            problems.append(
                Problem(
                    f"{where}.tenant",
                    f"unknown tenant {arrival.tenant!r}: define it under 'tenants' "
                    f"(known: {', '.join(sorted(trace.tenants)) or 'none'})",
                )
            )
        try:
            demand = trace.demand_of(arrival)
        except placement.PlacementError as exc:
            problems.append(Problem(f"{where}.migProfile", str(exc)))
            demand = {}
        missing = sorted(r for r in demand if trace.capacity.get(r, 0) == 0)
        if missing:
            problems.append(
                Problem(
                    f"{where}.demand",
                    f"asks for {', '.join(missing)} which 'capacity' does not have: "
                    "add it to capacity or change the demand (capacity is per placement "
                    "class: gpu@<pool> for a tenant's nodePool, mig-<profile>#single for "
                    "migProfile)",
                )
            )
        if arrival.group is not None:
            if not _NAME.match(arrival.group):
                problems.append(Problem(f"{where}.group", _NAME_HINT))
            if arrival.group in groups:
                problems.append(
                    Problem(
                        f"{where}.group",
                        f"group {arrival.group!r} is already used by "
                        f"arrivals.{groups[arrival.group]}: give every gang its own name",
                    )
                )
            groups[arrival.group] = index
    if total > MAX_PODS:
        problems.append(
            Problem("arrivals", f"creates {total} pods, more than {MAX_PODS}: shorten the trace")
        )
    return problems


def parse_trace(data: dict[str, Any], source: str = "trace") -> Trace:
    """Validate a trace document; raises ConfigError listing every problem."""
    trace = parse_model(Trace, data, source)
    problems = _cross_problems(trace)
    if problems:
        raise ConfigError(source, problems)
    return trace


def load_trace(path: Path) -> Trace:
    """Read and validate a trace YAML file."""
    if not path.is_file():
        raise ConfigError(str(path), [Problem("", "file not found: check the path")])
    return parse_trace(load_yaml_mapping(read_config_file(path), str(path)), str(path))


__all__ = ["Arrival", "Trace", "TracePod", "TraceTenant", "load_trace", "parse_trace"]
