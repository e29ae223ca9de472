"""Which class (inference or training) a GPU pod belongs to.

Contract, in order of precedence:
1. the pod's ``fairgate.io/class`` label, if it names a class and the tenant allows it;
2. else the tenant's ``defaultClass``, if the tenant allows it;
3. else the class inferred from the pod's controlling owner: serving workloads
   (ReplicaSet, StatefulSet, Deployment, LeaderWorkerSet) are inference; batch owners
   (Job, CronJob, JobSet, PyTorchJob, ...), any other owner, and no owner are training;
4. if the tenant does not allow that class either, the first class the tenant allows.
A tenant that allows no class at all raises :class:`ClassError`.
The result carries a short human reason; ``overridden`` is true when the user's label was
not honoured (the reason is then worth a warning).
"""

from __future__ import annotations

from dataclasses import dataclass

from admission.pods import PodView
from tenants.models import CLASS_LABEL, CLASSES, PodClass, Tenant

INFERENCE_OWNERS: frozenset[str] = frozenset(
    {"ReplicaSet", "StatefulSet", "Deployment", "LeaderWorkerSet"}
)


class ClassError(ValueError):
    """No class can be chosen for the pod; the message says how to fix it."""


@dataclass(frozen=True)
class ClassChoice:
    """The chosen class and why (``overridden``: the user's label was not honoured)."""

    pod_class: PodClass
    reason: str
    overridden: bool = False


def _as_class(value: str) -> PodClass | None:
    for candidate in CLASSES:
        if value == candidate:
            return candidate
    return None


def owner_kind(pod: PodView) -> str | None:
    """Kind of the pod's controlling owner (else its first owner), or None without owners."""
    chosen = pod.controller or (pod.owners[0] if pod.owners else None)
    return (chosen.kind or None) if chosen is not None else None


def inferred_class(kind: str | None) -> PodClass:
    """The class an owner kind implies (no owner: training)."""
    return "inference" if kind in INFERENCE_OWNERS else "training"


def resolve_class(pod: PodView, tenant: Tenant) -> ClassChoice:
    """The class of ``pod`` in ``tenant``; raises ClassError."""
    if not tenant.classes:
        raise ClassError(
            f"tenant {tenant.name!r} allows no pod classes: ask the platform team to set "
            "'classes' for it in fairgate-platform"
        )
    requested = pod.labels.get(CLASS_LABEL)
    problem: str | None = None
    if requested is not None:
        label_class = _as_class(requested)
        if label_class is None:
            problem = f"{CLASS_LABEL}={requested!r} is not inference or training"
        elif label_class not in tenant.classes:
            problem = f"class {label_class!r} not allowed for {tenant.name}"
        else:
            return ClassChoice(label_class, f"class {label_class!r} from label {CLASS_LABEL}")
    choice = _fallback(pod, tenant)
    if problem is None:
        return choice
    return ClassChoice(choice.pod_class, f"{problem}; using {choice.reason}", overridden=True)


def _fallback(pod: PodView, tenant: Tenant) -> ClassChoice:
    default = tenant.default_class
    if default is not None and default in tenant.classes:
        return ClassChoice(default, f"defaultClass {default}")
    kind = owner_kind(pod)
    owner_class = inferred_class(kind)
    source = f"owner {kind}" if kind else "no owner"
    if owner_class in tenant.classes:
        return ClassChoice(owner_class, f"{owner_class} ({source})")
    only = tenant.classes[0]
    return ClassChoice(only, f"{only} (only class allowed for {tenant.name})")
