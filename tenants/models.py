"""Typed tenant and quota configuration: the ConfigMap schema.

Contract:
- :class:`PlatformConfig` is ``platform.yaml`` of the ``fairgate-platform`` ConfigMap.
- :class:`QuotaSpec` is ``quota.yaml`` of a ``quota-<tenant>`` ConfigMap.
- :class:`FairgateConfig` is one consistent snapshot of both plus the namespaces'
  tenant labels; :meth:`FairgateConfig.tenant` resolves a tenant's effective quota.
All numbers are non-negative integers except ``weight`` (a positive number); unknown
keys are errors. Models are immutable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    field_validator,
    model_validator,
)

from tenants import resources
from tenants.placement import check_node_pool, key_problem

PodClass = Literal["inference", "training"]
CLASSES: tuple[PodClass, ...] = ("inference", "training")
PriorityBand = Literal["inference", "training", "borrowed"]

TENANT_LABEL = "fairgate.io/tenant"
CLASS_LABEL = "fairgate.io/class"
POD_GROUP_LABEL = "fairgate.io/pod-group"
PREEMPTIBLE_LABEL = "fairgate.io/preemptible"
"""Set by the user to ``"true"`` on training pods that reclaim may evict (``fairShare.reclaim``)."""
POD_GROUP_SIZE_ANNOTATION = "fairgate.io/pod-group-size"
TICKET_ANNOTATION = "fairgate.io/ticket"
DEMAND_ANNOTATION = "fairgate.io/demand"
BORROWED_ANNOTATION = "fairgate.io/borrowed"
PRICED_CLAIMS_ANNOTATION = "fairgate.io/priced-claims"
"""What a pod's DRA claims were priced from at admission (:func:`admission.dra.priced_record`)."""
QUEUE_GATE = "fairgate.io/queue"
QUOTA_LABEL = "fairgate.io/quota"
FAIRGATE_PREFIX = "fairgate.io/"
CONTROL_NAMESPACE = "fairgate-system"
PLATFORM_CONFIGMAP = "fairgate-platform"
PLATFORM_KEY = "platform.yaml"
QUOTA_CONFIGMAP_PREFIX = "quota-"
QUOTA_KEY = "quota.yaml"
DISPATCHER_USER = "system:serviceaccount:fairgate-system:fairgate-dispatcher"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TOLERATION: Mapping[str, str] = {"key": GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": "NoSchedule"}
"""The toleration the webhook adds to every GPU pod (and the only one the dispatcher
assumes when it decides which nodes count as capacity)."""
MAX_GENERATED_PREFIX = 58
"""How much of ``metadata.generateName`` the API server keeps: it cuts the prefix to 58
characters, then appends :data:`GENERATED_SUFFIX` random ones (63 in all)."""
GENERATED_SUFFIX = 5
NONE_RULE = "none"
MIG_RULE = "mig"
DEFAULT_DEVICE_CLASSES: Mapping[str, str] = {
    "gpu.nvidia.com": resources.GPU, "mig.nvidia.com": MIG_RULE,
}
"""How the NVIDIA DRA driver's DeviceClasses count (platform ``deviceClasses`` adds to it)."""


def device_class_rule_problem(rule: str) -> str | None:
    """Why ``rule`` is not a DeviceClass rule (None: it is): ``gpu`` (whole GPUs),
    ``mig`` (the profile the claim selects), ``mig-<profile>`` or ``none`` (not a GPU)."""
    if rule in (resources.GPU, MIG_RULE, NONE_RULE):
        return None
    if rule.startswith(resources.MIG_PREFIX) and resources.is_known(rule):
        return None
    return (f"unknown DeviceClass rule {rule!r}: write gpu, mig (profile from the claim's "
            "selector), mig-<profile> (e.g. mig-1g.5gb) or none (not a GPU)")


NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Principals(_Strict):
    """Users and groups (as in the admission request's ``userInfo``)."""

    groups: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    def permits(self, user: str, groups: tuple[str, ...] | list[str]) -> bool:
        """Whether ``user`` or one of ``groups`` is listed."""
        return user in self.users or any(g in self.groups for g in groups)


class GpuEquivalents(_Strict):
    """An amount in whole GPU-equivalents (7 slices each)."""

    gpu_equivalents: NonNegativeInt = Field(0, alias="gpuEquivalents")

    @property
    def slices(self) -> int:
        """The amount in compute slices."""
        return self.gpu_equivalents * resources.SLICES_PER_GPU


class PriorityClassSpec(_Strict):
    """A PriorityClass fairgate assigns: its name, value and preemption policy."""

    name: str
    value: StrictInt
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = Field(
        "PreemptLowerPriority", alias="preemptionPolicy"
    )


class PriorityClasses(_Strict):
    """The three PriorityClasses, one per priority band."""

    inference: PriorityClassSpec = PriorityClassSpec(name="fairgate-inference", value=100000)
    training: PriorityClassSpec = PriorityClassSpec(name="fairgate-training", value=10000)
    borrowed: PriorityClassSpec = PriorityClassSpec(
        name="fairgate-borrowed", value=1000, preemption_policy="Never"
    )

    def for_band(self, band: PriorityBand) -> PriorityClassSpec:
        """The PriorityClass of a priority band."""
        spec: PriorityClassSpec = getattr(self, band)
        return spec

    def band_of(self, name: str) -> PriorityBand | None:
        """The band whose PriorityClass is called ``name``, if any."""
        for band in ("inference", "training", "borrowed"):
            if self.for_band(band).name == name:
                return band
        return None




class BudgetSpec(_Strict):
    """``budget`` of a tenant in ``platform.yaml``: what it may spend per calendar month
    (UTC), in the currency of ``pricing``. ``monthly`` is a number greater than 0."""

    monthly: float

    @field_validator("monthly", mode="before")
    @classmethod
    def _positive(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not value > 0 or value == float("inf"):
            raise ValueError(
                f"monthly budget is {value!r}: write a number greater than 0 in the pricing "
                f"currency, e.g. budget: {{monthly: 20000}} (leave budget out for no budget)")
        return float(value)


class TenantSpec(_Strict):
    """A tenant as the platform team defines it in ``platform.yaml``."""

    weight: float = Field(gt=0)
    ceiling: GpuEquivalents
    admins: Principals = Principals()
    classes: tuple[PodClass, ...] = CLASSES
    node_pool: str | None = Field(None, alias="nodePool")
    budget: BudgetSpec | None = None

    _pool = field_validator("node_pool")(check_node_pool)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)?$")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """Seconds of a duration: a number of seconds (``90``) or a string with one unit
    ``s``, ``m``, ``h`` or ``d`` (``"30m"``, ``"1h"``, ``"1.5h"``); raises ValueError
    saying what to write."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"must be a duration such as 1h, 30m or 90s, got {value!r}")
    match = _DURATION.match(str(value).strip())
    if match is None:
        raise ValueError(f"must be a duration such as 1h, 30m, 90s or 0 (off), got {value!r}")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


class ReclaimSpec(_Strict):
    """``fairShare.reclaim`` of ``platform.yaml``: fair-share preemption (off when absent).

    A tenant owed capacity whose head pod has waited at least ``after`` may have
    preemptible training pods (label ``fairgate.io/preemptible: "true"``) of tenants
    above their entitlement evicted for it, only pods that have run at least
    ``minRuntime``, at most ``perHour`` pods per hour cluster-wide (see
    ``fairshare.reclaim``). Durations are written ``5m``, ``30m``, ``90s``, ``1h``
    (seconds once parsed); ``perHour`` is a whole number of 1 or more. All three are
    required: reclaim evicts running work, so nothing about it is left to a default.
    """

    after: float
    min_runtime: float = Field(alias="minRuntime")
    per_hour: StrictInt = Field(alias="perHour")

    @field_validator("after", "min_runtime", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("per_hour")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"perHour is {value}: write 1 or more (pods reclaimed per hour, "
                             "cluster-wide); to turn reclaim off, leave fairShare.reclaim out")
        return value


class FairShareSpec(_Strict):
    """``fairShare`` of ``platform.yaml``: how the queue measures a tenant's share.

    Unset (the default, None): virtual time. A tenant's share is the service (GPU slice
    seconds) it received while active, per unit of weight; a tenant that becomes active
    starts at the smallest virtual time of the active tenants, so idle time earns no
    credit and what a tenant took ahead of the others it repays.
    ``usageHalfLife`` (seconds once parsed; written ``1h``, ``30m``, ``90s``): instead,
    usage history decayed with this half-life, Slurm-like: a tenant that was idle is
    owed credit when it returns. 0: current usage only (ties go to the oldest backlog).
    ``reclaim`` (:class:`ReclaimSpec`): fair-share preemption; None (the default) is off.
    ``lendInferenceReserve`` (default true): whether borrowed training may run in the
    capacity of tenants' inferenceReserve while no inference uses it. False keeps the
    unused reserves free, so inference within its reserve starts without preempting
    anyone (Kueue's ``lendingLimit`` of the reserve), at the price of that idle capacity.
    """

    usage_half_life: float | None = Field(None, alias="usageHalfLife")
    reclaim: ReclaimSpec | None = None
    lend_inference_reserve: bool = Field(True, alias="lendInferenceReserve")

    @field_validator("usage_half_life", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float | None:
        return None if value is None else parse_duration(value)


class PricingSpec(_Strict):
    """``pricing`` of ``platform.yaml``: what a whole-GPU hour costs.

    ``gpuHour`` is either one number (every GPU) or a mapping from the node label
    ``nvidia.com/gpu.product`` (e.g. ``NVIDIA-A100-SXM4-80GB``) to the price, with
    ``default`` for products not listed. A MIG slice costs slices/7 of its parent GPU.
    Prices are non-negative numbers in ``currency`` (a 3-letter code, default USD).
    """

    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    gpu_hour: float | dict[str, float] = Field(0.0, alias="gpuHour")

    @field_validator("gpu_hour", mode="before")
    @classmethod
    def _prices(cls, value: object) -> float | dict[str, float]:
        given = value if isinstance(value, dict) else {"default": value}
        prices: dict[str, float] = {}
        for product, price in given.items():
            if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                raise ValueError(
                    f"price of {product!r} is {price!r}: write a number of 0 or more, e.g. "
                    f"gpuHour: {{default: 2.50, NVIDIA-A100-SXM4-80GB: 3.10}}")
            prices[str(product)] = float(price)
        return prices if isinstance(value, dict) else prices["default"]

    def paths(self) -> dict[str, Any]:
        """The fields as dotted paths of ``platform.yaml`` (as a config diff names them):
        ``pricing.currency``, ``pricing.gpuHour`` or ``pricing.gpuHour.<product>``."""
        flat: dict[str, Any] = {"pricing.currency": self.currency}
        if isinstance(self.gpu_hour, dict):
            flat.update({f"pricing.gpuHour.{p}": v for p, v in self.gpu_hour.items()})
        else:
            flat["pricing.gpuHour"] = self.gpu_hour
        return flat

    def price(self, product: str | None) -> float:
        """Price of one whole-GPU hour of ``product`` (None: unknown product): its own
        price, else ``default``, else 0."""
        if not isinstance(self.gpu_hour, dict):
            return self.gpu_hour
        if product is not None and product in self.gpu_hour:
            return self.gpu_hour[product]
        return self.gpu_hour.get("default", 0.0)


AutoscalingMode = Literal["off", "provisioningRequest", "pending"]
PROVISIONING_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
"""The ProvisioningRequest class fairgate asks for: cluster-autoscaler adds the nodes for
all of a request's pods at once, or none."""


class AutoscalingSpec(_Strict):
    """``autoscaling`` of ``platform.yaml``: GPU pools that grow on demand.

    ``mode``: ``off`` (the default: nothing changes), ``provisioningRequest``
    (cluster-autoscaler's ProvisioningRequest API, ``autoscaling.x-k8s.io``: the head
    owed the next capacity gets a request and is released once it is Provisioned) or
    ``pending`` (the head is released so that an autoscaler that reacts to pending pods,
    such as Karpenter, sees it). ``maxCapacity``: the most the pools can hold, per
    capacity key as ``capacity`` (required unless ``off``). ``inFlight``: the most heads
    waiting for nodes at once (default 4, at least 1).
    """

    mode: AutoscalingMode = "off"
    max_capacity: dict[str, NonNegativeInt] = Field({}, alias="maxCapacity")
    in_flight: StrictInt = Field(4, alias="inFlight")

    @field_validator("mode", mode="before")
    @classmethod
    def _known_mode(cls, value: object) -> object:
        if value not in ("off", "provisioningRequest", "pending"):
            raise ValueError(
                f"unknown autoscaling mode {value!r}: write off (the default), "
                "provisioningRequest (cluster-autoscaler's ProvisioningRequest API) or "
                "pending (autoscalers that react to pending pods, such as Karpenter)")
        return value

    @field_validator("max_capacity")
    @classmethod
    def _known_keys(cls, value: dict[str, int]) -> dict[str, int]:
        return _capacity_keys(value)

    @field_validator("in_flight")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"inFlight is {value}: write 1 or more (heads waiting for "
                             "nodes at once)")
        return value

    @model_validator(mode="after")
    def _maximum_given(self) -> AutoscalingSpec:
        if self.mode != "off" and not any(self.max_capacity.values()):
            raise ValueError(
                f"autoscaling mode {self.mode} needs maxCapacity, the most the GPU pools "
                "can hold, e.g. maxCapacity: {gpu: 64}")
        return self

    @property
    def enabled(self) -> bool:
        """Whether fairgate asks for nodes (a mode other than ``off``)."""
        return self.mode != "off"

    def beyond(self, keyed: Mapping[str, int]) -> dict[str, int]:
        """The capacity keys of ``keyed`` (units by capacity key) past ``maxCapacity``,
        with their maximum; keys it does not list are not autoscaled and never past it.
        Empty when autoscaling is off."""
        if not self.enabled:
            return {}
        return {key: self.max_capacity[key] for key, n in keyed.items()
                if key in self.max_capacity and n > self.max_capacity[key]}


class PlatformConfig(_Strict):
    """``platform.yaml``: platform admins, capacity override, tenants, failure mode,
    priority classes, fair-share measure, pricing (optional), DeviceClass rules (DRA),
    autoscaled pools (:class:`AutoscalingSpec`)."""

    platform_admins: Principals = Field(Principals(), alias="platformAdmins")
    capacity: dict[str, NonNegativeInt] = {}
    tenants: dict[str, TenantSpec] = {}
    on_redis_unavailable: Literal["deny", "allow"] = Field("deny", alias="onRedisUnavailable")
    priority_classes: PriorityClasses = Field(PriorityClasses(), alias="priorityClasses")
    fair_share: FairShareSpec = Field(FairShareSpec(), alias="fairShare")
    pricing: PricingSpec | None = None
    device_classes: dict[str, str] = Field({}, alias="deviceClasses")
    autoscaling: AutoscalingSpec = AutoscalingSpec()

    @field_validator("device_classes")
    @classmethod
    def _known_rules(cls, value: dict[str, str]) -> dict[str, str]:
        """Each DeviceClass maps to a rule (:func:`device_class_rule_problem`)."""
        for device_class, rule in value.items():
            problem = device_class_rule_problem(resources.normalise(rule))
            if problem is not None:
                raise ValueError(f"{device_class}: {problem}")
        return {k: resources.normalise(v) for k, v in value.items()}

    @cached_property
    def device_class_rules(self) -> dict[str, str]:
        """:data:`DEFAULT_DEVICE_CLASSES` with ``deviceClasses`` on top."""
        return {**DEFAULT_DEVICE_CLASSES, **self.device_classes}

    @field_validator("capacity")
    @classmethod
    def _known_capacity(cls, value: dict[str, int]) -> dict[str, int]:
        return _capacity_keys(value)


def _capacity_keys(value: dict[str, int]) -> dict[str, int]:
    """Capacity keys (tenants.placement), normalised: ``gpu`` is whole GPUs on shared
    nodes; raises ValueError naming a bad key and how to write it."""
    for key in value:
        problem = key_problem(resources.normalise(key))
        if problem is not None:
            raise ValueError(problem)
    return {resources.normalise(key): n for key, n in value.items()}


class QuotaSpec(_Strict):
    """``quota.yaml`` of a tenant: nominal per resource, borrowing, inference reserve."""

    nominal: dict[str, NonNegativeInt] = {}
    borrow_limit: GpuEquivalents = Field(GpuEquivalents(), alias="borrowLimit")
    inference_reserve: GpuEquivalents = Field(GpuEquivalents(), alias="inferenceReserve")
    default_class: PodClass | None = Field(None, alias="defaultClass")

    @field_validator("nominal")
    @classmethod
    def _known_nominal(cls, value: dict[str, int]) -> dict[str, int]:
        return _known_counts(value)

    @property
    def nominal_slices(self) -> int:
        """Nominal quota over all resources, in slices."""
        return resources.total_slices(self.nominal)


def _known_counts(value: dict[str, int]) -> dict[str, int]:
    for name in value:
        if not resources.is_known(name):
            raise resources.UnknownResourceError(name)
    return {resources.normalise(name): n for name, n in value.items()}


@dataclass(frozen=True)
class Tenant:
    """A tenant's effective settings: platform entry and quota combined."""

    name: str
    weight: float
    ceiling_slices: int
    admins: Principals
    classes: tuple[PodClass, ...]
    node_pool: str | None
    nominal: Mapping[str, int]
    borrow_slices: int
    reserve_slices: int
    default_class: PodClass | None
    monthly_budget: float | None = None

    @property
    def nominal_slices(self) -> int:
        """Nominal quota over all resources, in slices."""
        return resources.total_slices(self.nominal)

    def training_limit(self, demand: Mapping[str, int]) -> int:
        """The most slices of ``demand`` this tenant's quota can ever let training hold
        at once: the part of its nominal quota (less the inference reserve, which only
        inference may use) that covers ``demand``'s resources, plus the borrow limit.
        Demand above it never fits; the queue (lib_tenants.lua ``quota_check``) admits anything
        up to it on an idle tenant."""
        covered = resources.total_slices(
            {r: min(n, self.nominal.get(r, 0)) for r, n in demand.items()})
        return self.borrow_slices + max(0, min(self.nominal_slices - self.reserve_slices,
                                               covered))


@dataclass(frozen=True)
class FairgateConfig:
    """One consistent snapshot of the platform config, all quotas and namespace labels."""

    platform: PlatformConfig
    quotas: Mapping[str, QuotaSpec] = field(default_factory=dict)
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def tenant_of_namespace(self, namespace: str) -> str | None:
        """The tenant named by the namespace's ``fairgate.io/tenant`` label, if any."""
        return self.namespaces.get(namespace, {}).get(TENANT_LABEL)

    def tenant(self, name: str) -> Tenant | None:
        """The effective tenant ``name``, or None if the platform does not know it.

        A known tenant without a quota ConfigMap has an empty nominal quota.
        """
        return self._tenants.get(name)

    def tenants(self) -> list[Tenant]:
        """Every tenant the platform config defines, by name."""
        return [self._tenants[name] for name in sorted(self._tenants)]

    @cached_property
    def _tenants(self) -> dict[str, Tenant]:
        """Every effective tenant, built once per snapshot (admission asks per pod)."""
        empty = QuotaSpec()
        found = {}
        for name, spec in self.platform.tenants.items():
            quota = self.quotas.get(name)
            if quota is None:
                quota = empty
            found[name] = Tenant(
                name=name,
                weight=spec.weight,
                ceiling_slices=spec.ceiling.slices,
                admins=spec.admins,
                classes=spec.classes,
                node_pool=spec.node_pool,
                nominal=dict(quota.nominal),
                borrow_slices=quota.borrow_limit.slices,
                reserve_slices=quota.inference_reserve.slices,
                default_class=quota.default_class,
                monthly_budget=spec.budget.monthly if spec.budget is not None else None,
            )
        return found
