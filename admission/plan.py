"""What fairgate decides about a pod CREATE before asking the queue: whose, which class,
how much, which ticket, which gang, or why it is refused.

Contract of :func:`plan_create` (pure; the pod is AdmissionReview ``request.object``,
or the :class:`~admission.pods.PodView` the caller parsed it into once):
- :class:`Denied` ``malformed-pod`` when the pod is not shaped like a Pod
  (:meth:`~admission.pods.PodView.parse` names the field).
- :class:`NotOurs` when the pod asks for no GPU (allow it untouched).
- :class:`Denied` (a message of at most :data:`MAX_MESSAGE_CHARS` that says what is wrong
  and how to fix it, plus a short ``code`` for audit) when:
  the GPU demand cannot be determined (see :mod:`admission.demand`); the namespace has no
  ``fairgate.io/tenant`` label or names a tenant the platform does not define; the tenant
  allows no class; the pod can never fit its tenant (inference: more of a resource than
  nominal; training: more slices than nominal + borrowLimit, or more of a resource than
  nominal when the tenant cannot borrow); ``priorityClassName`` is one of fairgate's
  classes reserved for another class; the pod carries ``fairgate.io/*`` labels or
  annotations that fairgate does not accept from users (see below); or the pod-group
  label / size annotation are inconsistent (size not a positive integer, one without the
  other).
- otherwise a :class:`PodPlan`. Its ``group`` is the pod's gang: fairgate's own label
  and annotation when set (they win over everything else), else the gang the pod
  declares with the ecosystem's tools (:func:`admission.gangs.pod_gang`, with the size
  objects ``gangs``), whose size may not be known yet (None). A pod carrying
  ``fairgate.io/pod-group`` without the size annotation is accepted only when the label
  is exactly the key of the gang it declares that way (fairgate's own stamp of a gang
  whose size it did not know yet, :mod:`admission.mutation`); a declaration fairgate
  cannot use (:class:`~admission.gangs.GangError`) is refused as ``invalid-pod-group``.

User-set ``fairgate.io/*`` keys: users may set the label ``fairgate.io/class`` (a hint, see
:mod:`admission.classes`), the labels ``fairgate.io/pod-group``, ``fairgate.io/mig-profile``
and ``fairgate.io/preemptible`` (consent to reclaim: it can only cost its own pod) and the
annotation ``fairgate.io/pod-group-size``. The label ``fairgate.io/tenant`` is accepted only when it
names the namespace's tenant. Any other ``fairgate.io/`` label or annotation is refused.

Reinvocation rule (ticket reuse): the API server may call the mutating webhook again on
the already-mutated pod, with a new request uid. A CREATE whose pod already carries
``fairgate.io/ticket`` is therefore accepted only as fairgate's own earlier mutation: it must
also carry ``fairgate.io/demand`` equal to the pod's demand (as formatted by
``tenants.resources.format_counts``) and the ``fairgate.io/tenant`` label of its namespace,
and ``fairgate.io/borrowed`` may only be ``"true"`` on a pod whose priorityClassName is the
borrowed class. The plan then reuses that ticket (``reused_ticket``), so the queue's
per-ticket idempotency keeps the reservation single; the queue refuses a reused ticket
it holds no admission for (one chosen by hand, or copied from a pod whose admission has
ended), so only a ticket fairgate minted can be reused. A ``fairgate.io/demand`` or
``fairgate.io/borrowed`` annotation without a ticket, or a ticket that does not meet these
conditions, is refused. Otherwise the ticket is the request uid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from admission.classes import ClassError, resolve_class
from admission.demand import DemandError, pod_demand
from admission.dra import NO_OBJECTS, DraContext, DraError, DraObjects, priced_record
from admission.gangs import (
    MAX_GANG_SIZE,
    NO_GANG_OBJECTS,
    GangError,
    GangObjects,
    declared_run,
    pod_gang,
)
from admission.pods import PodError, PodView
from admission.reviews import one_line
from tenants import resources
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DEMAND_ANNOTATION,
    FAIRGATE_PREFIX,
    PLATFORM_CONFIGMAP,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    PREEMPTIBLE_LABEL,
    PRICED_CLAIMS_ANNOTATION,
    QUOTA_CONFIGMAP_PREFIX,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    AutoscalingSpec,
    FairgateConfig,
    PodClass,
    PriorityBand,
    PriorityClasses,
    Tenant,
)
from tenants.placement import (
    MIG_PROFILE_LABEL,
    NODE_POOL_ANNOTATION,
    Placement,
    pod_placement,
)

MAX_MESSAGE_CHARS = 250
MAX_GROUP_SIZE = MAX_GANG_SIZE
TICKET_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
USER_LABELS = frozenset({TENANT_LABEL, CLASS_LABEL, POD_GROUP_LABEL, MIG_PROFILE_LABEL,
                         PREEMPTIBLE_LABEL})
USER_ANNOTATIONS = frozenset({POD_GROUP_SIZE_ANNOTATION})
FAIRGATE_ANNOTATIONS = frozenset({TICKET_ANNOTATION, DEMAND_ANNOTATION, BORROWED_ANNOTATION,
                                  NODE_POOL_ANNOTATION, PRICED_CLAIMS_ANNOTATION})
BANDS_OF_CLASS: Mapping[PodClass, frozenset[PriorityBand]] = {
    "inference": frozenset({"inference"}),
    "training": frozenset({"training", "borrowed"}),
}


@dataclass(frozen=True)
class NotOurs:
    """The pod asks for no GPU: fairgate lets it through untouched."""

    reason: str = "no GPU demand"


@dataclass(frozen=True)
class Denied:
    """The pod is refused. ``message`` is for the user; ``code`` is a short audit tag;
    ``pod_class`` and ``demand`` are what was known of the pod when it was refused
    (``""`` and ``{}`` before that)."""

    code: str
    message: str
    pod_class: str = ""
    demand: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PodGroup:
    """A gang, released together: ``name`` is its key (the ``fairgate.io/pod-group``
    label's value), ``size`` its number of pods (None: not known yet, ``awaiting`` says
    for what); ``source`` where it was declared (e.g. ``Indexed Job trainer``; ``""`` for
    fairgate's own label)."""

    name: str
    size: int | None
    source: str = ""
    awaiting: str = ""


@dataclass(frozen=True)
class PodPlan:
    """Everything fairgate decided about a GPU pod before asking the queue.

    ``demand`` holds positive counts by short resource name and ``demand_slices`` their
    compute slices; ``class_reason`` says how the class was chosen; ``ticket`` is the
    request uid, or the pod's own ticket when ``reused_ticket`` (reinvocation rule);
    ``warnings`` are for the user (each short, see ``admission.reviews``);
    ``placement`` is the placement class (:mod:`tenants.placement`) of the pod's nodes;
    ``priced_claims`` records the objects its DRA claims were priced from
    (:func:`admission.dra.priced_record`; empty without claims): such a pod is held
    behind the gate until the dispatcher has checked the claims it will be allocated;
    ``run_seconds`` its declared run time (:func:`admission.gangs.declared_run`; None:
    none), which backfill reads in place of its tenant's expected run time.
    """

    tenant: Tenant
    pod_class: PodClass
    class_reason: str
    demand: Mapping[str, int]
    demand_slices: int
    ticket: str
    reused_ticket: bool
    group: PodGroup | None
    warnings: tuple[str, ...] = field(default=())
    placement: Placement = field(default=Placement())
    priced_claims: str = ""
    run_seconds: int | None = None


PlanResult = NotOurs | Denied | PodPlan


def quoted(text: str) -> str:
    """A user-supplied value for a message: quoted, at most about 40 characters."""
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _denied(code: str, message: str) -> Denied:
    return Denied(code, one_line(message, MAX_MESSAGE_CHARS))


class _Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.denied = _denied(code, message)


def read_pod(pod: object) -> PodView | Denied:
    """``pod`` parsed (itself when it is a :class:`PodView` already), or the refusal that
    names its malformed field."""
    if isinstance(pod, PodView):
        return pod
    try:
        return PodView.parse(pod)
    except PodError as exc:
        return _denied("malformed-pod", f"malformed pod: {exc}")


def plan_create(
    pod: object, namespace: str, request_uid: str, config: FairgateConfig,
    dra: DraObjects = NO_OBJECTS, gangs: GangObjects = NO_GANG_OBJECTS,
) -> PlanResult:
    """Decide tenant, class, demand, ticket and gang of a pod CREATE (a :class:`PodView`,
    or ``request.object`` to parse), or refuse it; its GPUs through DRA are counted with
    the cluster's objects ``dra``, its gang's size read from the size objects ``gangs``."""
    view = read_pod(pod)
    if isinstance(view, Denied):
        return view
    context = DraContext(namespace, config.platform.device_class_rules, dra)
    try:
        demand = pod_demand(view, context)
    except DemandError as exc:
        return _denied("invalid-demand", str(exc))
    if not demand:
        return NotOurs()

    def asks_for_gpu(template: object) -> bool:
        try:
            return bool(pod_demand(PodView.parse(template), context))
        except PodError:
            return True  # its pods are refused, or counted, when they come

    try:
        plan = _plan(view, namespace, request_uid, config, demand,
                     lambda: _group(view, namespace, gangs, asks_for_gpu))
        return replace(plan, priced_claims=priced_record(view, context),
                       run_seconds=declared_run(view, gangs))
    except _Refusal as refusal:
        return replace(refusal.denied, demand=demand)
    except DraError as exc:  # pod_demand refused these first
        return _denied("invalid-demand", str(exc))


def _plan(
    pod: PodView,
    namespace: str,
    request_uid: str,
    config: FairgateConfig,
    demand: dict[str, int],
    gang_of: Callable[[], PodGroup | None],
) -> PodPlan:
    tenant = _tenant(namespace, config)
    _check_user_keys(pod.labels, pod.annotations, tenant, namespace)
    try:
        choice = resolve_class(pod, tenant)
    except ClassError as exc:
        raise _Refusal("no-class", str(exc)) from exc
    priority_classes = config.platform.priority_classes
    warnings = [choice.reason] if choice.overridden else []
    group = gang_of()
    try:
        warnings += _check_priority_class(pod, choice.pod_class, priority_classes)
        placement = pod_placement(demand, pod.labels.get(MIG_PROFILE_LABEL), tenant.node_pool)
        _check_fit(tenant, choice.pod_class, demand, group)
        _check_pools(config.platform.autoscaling, placement, demand, group)
    except _Refusal as refusal:
        refusal.denied = replace(refusal.denied, pod_class=choice.pod_class)
        raise
    ticket = _ticket(pod, tenant, demand, priority_classes)
    return PodPlan(
        tenant=tenant,
        pod_class=choice.pod_class,
        class_reason=choice.reason,
        demand=demand,
        demand_slices=resources.total_slices(demand),
        ticket=ticket or request_uid,
        reused_ticket=ticket is not None,
        group=group,
        warnings=tuple(warnings),
        placement=placement,
    )


def _tenant(namespace: str, config: FairgateConfig) -> Tenant:
    name = config.tenant_of_namespace(namespace)
    if name is None:
        raise _Refusal(
            "no-tenant",
            f"namespace {namespace} has no {TENANT_LABEL} label, so its pods get no GPUs: "
            f"ask a platform admin to run 'kubectl label namespace {namespace} "
            f"{TENANT_LABEL}=<tenant>'",
        )
    tenant = config.tenant(name)
    if tenant is None:
        raise _Refusal(
            "unknown-tenant",
            f"namespace {namespace} is labelled {TENANT_LABEL}={quoted(name)} but "
            f"fairgate-platform defines no tenant {quoted(name)}: fix the namespace label or ask "
            "the platform team to add the tenant",
        )
    return tenant


def _check_user_keys(
    labels: Mapping[str, str], annotations: Mapping[str, str], tenant: Tenant, namespace: str
) -> None:
    own = labels.get(TENANT_LABEL)
    if own is not None and own != tenant.name:
        raise _Refusal(
            "fairgate-field",
            f"label {TENANT_LABEL}={quoted(own)} disagrees with namespace {namespace} (tenant "
            f"{tenant.name}): remove the label, fairgate sets it",
        )
    for kind, keys, allowed in (
        ("label", labels, USER_LABELS),
        ("annotation", annotations, USER_ANNOTATIONS | FAIRGATE_ANNOTATIONS),
    ):
        for key in sorted(keys):
            if key.startswith(FAIRGATE_PREFIX) and key not in allowed:
                raise _Refusal(
                    "fairgate-field",
                    f"{kind} {quoted(key)} is not a fairgate.io key users may set: remove it "
                    f"(users may set {CLASS_LABEL}, {POD_GROUP_LABEL}, {MIG_PROFILE_LABEL}, "
                    f"{PREEMPTIBLE_LABEL}, {POD_GROUP_SIZE_ANNOTATION})",
                )


def _check_priority_class(
    pod: PodView, pod_class: PodClass, priority_classes: PriorityClasses
) -> list[str]:
    name = pod.priority_class_name
    if name is None:
        return []
    band = priority_classes.band_of(name)
    if band is None:
        return [
            f"priorityClassName {quoted(name)} replaced by fairgate's class for {pod_class} pods"
        ]
    if band not in BANDS_OF_CLASS[pod_class]:
        raise _Refusal(
            "reserved-priority-class",
            f"priorityClassName {name} is reserved for {_class_of_band(band)} pods and this "
            f"is a {pod_class} pod: remove priorityClassName, fairgate sets it",
        )
    return []


def _class_of_band(band: PriorityBand) -> PodClass:
    return "inference" if band == "inference" else "training"


def _check_fit(tenant: Tenant, pod_class: PodClass, demand: Mapping[str, int],
               group: PodGroup | None) -> None:
    """Refuse what can never fit the tenant's quota: a pod, or a gang as a whole (its
    size x this member's demand), since a gang runs all at once or not at all. Quota
    ceilings hold nominal + borrowLimit, so this covers them too."""
    fix = f"ask for less, or ask a {tenant.name} admin to raise it in ConfigMap " + (
        f"{QUOTA_CONFIGMAP_PREFIX}{tenant.name}"
    )
    size = group.size if group and group.size else 1  # a size not known yet: the pod alone
    whole = {r: n * size for r, n in demand.items()}
    what = (f"gang {group.name} asks for {size} x {resources.format_counts(demand)} = "
            if group and size > 1 else "pod asks for ")
    wanted = what + resources.format_counts(whole)
    over = {r: tenant.nominal.get(r, 0) for r, n in whole.items() if n > tenant.nominal.get(r, 0)}
    if pod_class == "inference" and over:
        raise _Refusal(
            "never-fits",
            f"inference {wanted} but {tenant.name}'s nominal quota has "
            f"{_counts(over)} and inference never borrows: {fix}",
        )
    if pod_class == "training":
        slices = resources.total_slices(whole)
        most = tenant.training_limit(whole)
        if slices > most:
            eq = resources.gpu_equivalents
            raise _Refusal(
                "never-fits",
                f"{wanted} ({eq(slices)} GPU-eq) but {tenant.name} may hold at most "
                f"{eq(most)} GPU-eq of it as training (nominal {eq(tenant.nominal_slices)} in all, "
                f"less inferenceReserve {eq(tenant.reserve_slices)}, plus borrowLimit "
                f"{eq(tenant.borrow_slices)}): {fix}",
            )


def _check_pools(autoscaling: AutoscalingSpec, placement: Placement,
                 demand: Mapping[str, int], group: PodGroup | None) -> None:
    """With autoscaled pools, refuse a pod (or a gang as a whole) larger than the most the
    pools can ever hold (``autoscaling.maxCapacity`` of its placement class)."""
    size = group.size if group and group.size else 1
    whole = placement.keyed({r: n * size for r, n in demand.items()})
    beyond = autoscaling.beyond(whole)
    if beyond:
        what = f"gang {group.name} asks for" if group and size > 1 else "pod asks for"
        raise _Refusal(
            "never-fits",
            f"{what} {resources.format_counts(whole)} of {placement.describe()} but the "
            f"GPU pools can hold at most {resources.format_counts(beyond)} "
            f"(autoscaling.maxCapacity in ConfigMap {PLATFORM_CONFIGMAP}): ask for less, or "
            f"ask a platform admin to raise maxCapacity",
        )


def _counts(counts: Mapping[str, int]) -> str:
    return ",".join(f"{name}={n}" for name, n in sorted(counts.items()))


def _ticket(
    pod: PodView,
    tenant: Tenant,
    demand: Mapping[str, int],
    priority_classes: PriorityClasses,
) -> str | None:
    """The ticket to reuse on reinvocation, None for a fresh pod; refuses forged fields."""
    labels, annotations = pod.labels, pod.annotations
    present = sorted(k for k in FAIRGATE_ANNOTATIONS if k in annotations)
    if not present:
        return None
    ticket = annotations.get(TICKET_ANNOTATION, "")
    fix = (
        f"remove annotations {', '.join(present)} from the pod (or its template): "
        "fairgate sets them"
    )
    if not ticket:
        raise _Refusal("fairgate-field", f"annotation {present[0]} is set by fairgate: {fix}")
    if not TICKET_PATTERN.match(ticket):
        raise _Refusal(
            "fairgate-field", f"annotation {TICKET_ANNOTATION} is not one fairgate set: {fix}"
        )
    if annotations.get(DEMAND_ANNOTATION) != resources.format_counts(demand):
        raise _Refusal(
            "fairgate-field",
            f"annotation {DEMAND_ANNOTATION} does not match the pod's GPU demand "
            f"{resources.format_counts(demand)}: {fix}",
        )
    if labels.get(TENANT_LABEL) != tenant.name:
        raise _Refusal(
            "fairgate-field", f"annotation {TICKET_ANNOTATION} without label {TENANT_LABEL}: {fix}"
        )
    if annotations.get(NODE_POOL_ANNOTATION) != tenant.node_pool:
        raise _Refusal(
            "fairgate-field",
            f"annotation {NODE_POOL_ANNOTATION} does not match tenant {tenant.name}'s node "
            f"pool: {fix}",
        )
    borrowed = annotations.get(BORROWED_ANNOTATION)
    borrowed_class = priority_classes.borrowed.name
    if borrowed is not None and (
        borrowed != "true" or pod.priority_class_name != borrowed_class
    ):
        raise _Refusal(
            "fairgate-field",
            f'annotation {BORROWED_ANNOTATION} is only valid as "true" with '
            f"priorityClassName {borrowed_class}: {fix}",
        )
    return ticket


def _group(pod: PodView, namespace: str, gangs: GangObjects,
           asks_for_gpu: Callable[[object], bool]) -> PodGroup | None:
    name = pod.labels.get(POD_GROUP_LABEL)
    size_text = pod.annotations.get(POD_GROUP_SIZE_ANNOTATION)
    try:
        declared = pod_gang(pod, namespace, gangs, asks_for_gpu)
        problem = None
    except GangError as exc:
        declared, problem = None, str(exc)
    if name is None and size_text is None:
        if problem is not None:
            raise _Refusal("invalid-pod-group", f"{problem} (or set {POD_GROUP_LABEL} and "
                           f"{POD_GROUP_SIZE_ANNOTATION} yourself)")
        if declared is None:
            return None
        return PodGroup(declared.key, declared.size, declared.source, declared.awaiting)
    if name is None:
        raise _Refusal(
            "invalid-pod-group",
            f"annotation {POD_GROUP_SIZE_ANNOTATION} without label {POD_GROUP_LABEL}: add the "
            "label naming the group, or remove the annotation",
        )
    stamped = declared if declared is not None and declared.key == name else None
    if size_text is None:
        if stamped is not None:  # fairgate's own stamp of a gang of unknown size
            return PodGroup(name, stamped.size, stamped.source, stamped.awaiting)
        raise _Refusal(
            "invalid-pod-group",
            f"label {POD_GROUP_LABEL}={quoted(name)} needs annotation {POD_GROUP_SIZE_ANNOTATION}: "
            '"<n>", the number of pods in the group',
        )
    valid = size_text.isascii() and size_text.isdigit() and len(size_text) <= 6
    if not valid or not 0 < int(size_text) <= MAX_GROUP_SIZE:
        raise _Refusal(
            "invalid-pod-group",
            f"annotation {POD_GROUP_SIZE_ANNOTATION}={quoted(size_text)} must be a whole number "
            f"from 1 to {MAX_GROUP_SIZE} (the number of pods in group {quoted(name)})",
        )
    return PodGroup(name, int(size_text), stamped.source if stamped else "")
