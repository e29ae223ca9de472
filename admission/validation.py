"""Validating-webhook verdicts for pods (pure).

Contract:
- :func:`validate_create` judges a pod CREATE after all mutation (fairgate's included). A
  pod without GPU demand is allowed unless it carries a marker only fairgate sets (the
  ``fairgate.io/queue`` gate, the ``fairgate.io/tenant`` label, or a ``fairgate.io/*``
  annotation other than ``fairgate.io/pod-group-size``): that is a forgery. A GPU pod is
  denied for everything :func:`admission.plan.plan_create` denies, and unless it carries
  fairgate's stamp consistently: a ``fairgate.io/ticket`` with the matching
  ``fairgate.io/demand`` and ``fairgate.io/tenant`` (the reinvocation rule of
  :mod:`admission.plan`); a ``fairgate.io/class`` label the tenant allows; a
  priorityClassName of fairgate's band for that class (inference: the inference class;
  training: the training or borrowed class); and ``fairgate.io/borrowed: "true"`` exactly
  when the class is the borrowed one. Such a pod's verdict names its ticket: the webhook
  claims it for the pod's uid before the pod is stored
  (:meth:`fairshare.queue.fairqueue.FairQueue.bind`).
- :func:`validate_update` judges a pod UPDATE: removing the ``fairgate.io/queue`` gate is
  denied to anyone but :data:`~tenants.models.DISPATCHER_USER`; adding, changing or
  removing any ``fairgate.io/*`` label or annotation is denied to anyone but fairgate's
  service accounts (:data:`FAIRGATE_USERS`). Everything else is allowed. ``groups`` and
  ``config`` are part of the signature so the webhook passes the whole request context;
  the current rules depend on the user name only.
- A pod (old or new) that is not shaped like a Pod is denied, naming the field
  (:func:`admission.plan.read_pod`); each pod is read once, as a
  :class:`~admission.pods.PodView` (the webhook may hand the view it parsed).
- A verdict's ``reason`` says what is wrong and how to fix it (denials) or why the request
  is fine (allowed), in at most :data:`~admission.plan.MAX_MESSAGE_CHARS` characters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from admission.dra import NO_OBJECTS, DraObjects
from admission.plan import (
    BANDS_OF_CLASS,
    MAX_MESSAGE_CHARS,
    Denied,
    NotOurs,
    plan_create,
    quoted,
    read_pod,
)
from admission.pods import PodView
from admission.reviews import one_line
from tenants.models import (
    BORROWED_ANNOTATION,
    CLASS_LABEL,
    DISPATCHER_USER,
    FAIRGATE_PREFIX,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_GATE,
    TENANT_LABEL,
    TICKET_ANNOTATION,
    FairgateConfig,
)

WEBHOOK_USER = "system:serviceaccount:fairgate-system:fairgate-webhook"
FAIRGATE_USERS = frozenset({WEBHOOK_USER, DISPATCHER_USER})


@dataclass(frozen=True)
class Verdict:
    """Allowed or not, why, and warnings for the user; ``ticket`` is the fairgate ticket
    an allowed GPU pod CREATE presents, which the webhook must then claim for the pod's
    uid (a second pod presenting it is a copy), '' otherwise."""

    allowed: bool
    reason: str
    warnings: tuple[str, ...] = ()
    ticket: str = ""


def _allow(reason: str, warnings: Sequence[str] = ()) -> Verdict:
    return Verdict(True, reason, tuple(warnings))


def _deny(reason: str) -> Verdict:
    return Verdict(False, one_line(reason, MAX_MESSAGE_CHARS))


def _fairgate_only_markers(pod: PodView) -> list[str]:
    """Markers on ``pod`` that only fairgate sets (what a GPU-less pod must not carry)."""
    markers = [f"label {TENANT_LABEL}"] if TENANT_LABEL in pod.labels else []
    markers += [
        f"annotation {key}"
        for key in sorted(pod.annotations)
        if key.startswith(FAIRGATE_PREFIX) and key != POD_GROUP_SIZE_ANNOTATION
    ]
    if QUEUE_GATE in pod.scheduling_gates:
        markers.append(f"scheduling gate {QUEUE_GATE}")
    return markers


def validate_create(pod: object, namespace: str, config: FairgateConfig,
                    dra: DraObjects = NO_OBJECTS) -> Verdict:
    """Verdict on a mutated pod CREATE (a :class:`PodView`, or ``request.object`` to
    parse) in ``namespace`` (DRA objects ``dra``)."""
    view = read_pod(pod)
    if isinstance(view, Denied):
        return _deny(view.message)
    result = plan_create(view, namespace, "", config, dra)
    if isinstance(result, NotOurs):
        forged = _fairgate_only_markers(view)
        if forged:
            return _deny(
                f"{', '.join(forged)} may only be set by fairgate, on GPU pods: remove "
                f"{'it' if len(forged) == 1 else 'them'} from this pod"
            )
        return _allow(result.reason)
    if isinstance(result, Denied):
        return _deny(result.message)
    if not result.reused_ticket:
        return _deny(
            f"GPU pod lacks the {TICKET_ANNOTATION} stamp of fairgate's mutating webhook: "
            "check that the fairgate MutatingWebhookConfiguration matches this namespace"
        )
    label = view.labels.get(CLASS_LABEL)
    priority_class = view.priority_class_name
    borrowed = view.annotations.get(BORROWED_ANNOTATION)
    if label is None:
        return _deny(
            f"GPU pod lacks label {CLASS_LABEL}, which fairgate's mutating webhook sets: check "
            "that the fairgate MutatingWebhookConfiguration matches this namespace"
        )
    if label != result.pod_class:
        return _deny(
            f"label {CLASS_LABEL}={quoted(label)} is not a class tenant {result.tenant.name} "
            f"allows: remove the label or set it to {result.pod_class}"
        )
    classes = config.platform.priority_classes
    band = classes.band_of(priority_class) if priority_class is not None else None
    if band is None or band not in BANDS_OF_CLASS[result.pod_class]:
        names = " or ".join(
            classes.for_band(b).name for b in sorted(BANDS_OF_CLASS[result.pod_class])
        )
        return _deny(
            f"a {label} GPU pod must have priorityClassName {names}, not "
            f"{quoted(priority_class) if priority_class is not None else 'none'}: "
            "leave priorityClassName to fairgate"
        )
    if (borrowed == "true") != (band == "borrowed"):
        return _deny(
            f'annotation {BORROWED_ANNOTATION}="true" must be set exactly when '
            f"priorityClassName is {classes.borrowed.name}: leave both to fairgate"
        )
    return Verdict(True, f"GPU pod of {result.tenant.name} ({label}, {band})",
                   tuple(result.warnings), result.ticket)


def _fairgate_keys(values: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in values.items() if k.startswith(FAIRGATE_PREFIX)}


def _changed_key(old: Mapping[str, str], new: Mapping[str, str]) -> str | None:
    before, after = _fairgate_keys(old), _fairgate_keys(new)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return changed[0] if changed else None


def validate_update(
    old_pod: object,
    new_pod: object,
    username: str,
    groups: Sequence[str],
    config: FairgateConfig,
) -> Verdict:
    """Verdict on a pod UPDATE by ``username`` (each pod a :class:`PodView`, or the
    review's object to parse; see the module contract)."""
    old, new = read_pod(old_pod), read_pod(new_pod)
    if isinstance(old, Denied):
        return _deny(old.message)
    if isinstance(new, Denied):
        return _deny(new.message)
    gate_removed = QUEUE_GATE in old.scheduling_gates and QUEUE_GATE not in new.scheduling_gates
    label = _changed_key(old.labels, new.labels)
    annotation = _changed_key(old.annotations, new.annotations)
    if gate_removed and username != DISPATCHER_USER:
        return _deny(
            f"only fairgate's dispatcher may remove the scheduling gate {QUEUE_GATE}: the pod "
            "is released when its tenant's quota and the cluster allow (see 'fairgate why')"
        )
    if username not in FAIRGATE_USERS:
        if label is not None:
            return _deny(
                f"label {quoted(label)} is managed by fairgate: do not add, change or remove it"
            )
        if annotation is not None:
            return _deny(
                f"annotation {quoted(annotation)} is managed by fairgate: do not add, change or "
                "remove it"
            )
    if username in FAIRGATE_USERS:
        return _allow(f"update by fairgate service account {username}")
    return _allow("no fairgate-managed field changed")
