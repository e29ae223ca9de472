"""A ResourceClaim or ResourceClaimTemplate made again under a name an admitted pod uses.

Contract (docs/dra.md, "Objects, not names"):
- At admission, :func:`priced_objects` is what each DRA object a pod names
  (``spec.resourceClaims[].resourceClaimName`` / ``resourceClaimTemplateName``) was
  priced at, by :class:`DraObjectRef`: the devices of that one object, priced with
  :func:`admission.dra.claim_spec_demand` (objects that are missing or cannot be priced
  are left out: the plan refuses such a pod).
- At a ResourceClaim or ResourceClaimTemplate CREATE, :func:`created_object` reads the
  new object (None: not one of them), and :func:`asked` prices it: its devices, or the
  :class:`~admission.PodError` saying why it cannot be priced (e.g. allocationMode
  All). :func:`swap_refusal` is the message refusing it when a live admission named an
  object of that name and was priced for less: any resource more, or an object that
  cannot be priced; None allows it.
- A claim made by the resourceclaim controller for a pod (:func:`made_for_a_pod`: its
  controller owner is a Pod *and* the request comes from the controller's identity) is
  not judged: it is a new object named after its pod, and only that controller makes
  it. An owner reference alone proves nothing, since a tenant user can write one.
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from admission.dra import (
    DraContext,
    DraKind,
    claim_spec_demand,
    exceeds,
    referenced_objects,
)
from admission.pods import CLAIM, TEMPLATE, PodError, PodView
from tenants.resources import ResourceCounts, format_counts

KIND_CODE: dict[DraKind, str] = {CLAIM: "c", TEMPLATE: "t"}
DRA_GROUP = "resource.k8s.io"

CLAIM_CONTROLLER_USERS = frozenset({
    "system:serviceaccount:kube-system:resource-claim-controller",  # its own credentials
    "system:kube-controller-manager",  # without --use-service-account-credentials
})
"""Who the resourceclaim controller (in kube-controller-manager) creates claims as."""


@dataclass(frozen=True, order=True)
class DraObjectRef:
    """A ResourceClaim or ResourceClaimTemplate by namespace and name."""

    namespace: str
    kind: DraKind
    name: str

    @property
    def key(self) -> str:
        """The index key: ``<namespace>/<c|t>/<name>`` (names hold no ``/``)."""
        return f"{self.namespace}/{KIND_CODE[self.kind]}/{self.name}"

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


class PricedPod(Protocol):
    """A live admission that was priced for an object
    (:class:`fairshare.queue.model.PricedTicket`)."""

    @property
    def devices(self) -> ResourceCounts: ...

    @property
    def state(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class CreatedObject:
    """A ResourceClaim or ResourceClaimTemplate at CREATE: where it is, its claim spec
    (a template's ``spec.spec``; None when absent) and its metadata."""

    ref: DraObjectRef
    spec: Mapping[str, Any] | None
    metadata: Mapping[str, Any]


def priced_objects(pod: PodView, context: DraContext) -> dict[DraObjectRef, ResourceCounts]:
    """What each object ``pod`` names was priced at, with ``context``'s objects (the ones
    the plan priced it with)."""
    templates, claims = referenced_objects(pod)
    out: dict[DraObjectRef, ResourceCounts] = {}
    for kind, names, found in ((TEMPLATE, templates, context.objects.templates),
                               (CLAIM, claims, context.objects.claims)):
        for name in sorted(names):
            priced = found.get((context.namespace, name))
            if priced is None:
                continue
            ref = DraObjectRef(context.namespace, kind, name)
            try:
                out[ref] = claim_spec_demand(priced.spec, context, str(ref))
            except PodError:
                continue
    return out


def created_object(group: str, kind: str, namespace: str, name: str,
                   obj: Mapping[str, Any] | None) -> CreatedObject | None:
    """The object of a CREATE of ``group``/``kind`` if it is a ResourceClaim or a
    ResourceClaimTemplate, else None; ``name`` is the request's (else the object's)."""
    if group != DRA_GROUP or kind not in KIND_CODE or not isinstance(obj, Mapping):
        return None
    dra_kind: DraKind = CLAIM if kind == CLAIM else TEMPLATE
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    spec = obj.get("spec")
    if dra_kind == TEMPLATE:
        spec = spec.get("spec") if isinstance(spec, Mapping) else None
    return CreatedObject(
        DraObjectRef(namespace, dra_kind, name or str(metadata.get("name") or "")),
        spec if isinstance(spec, Mapping) else None,
        metadata,
    )


def asked(created: CreatedObject, context: DraContext) -> ResourceCounts | PodError:
    """The devices ``created`` gives a pod naming it, or why it cannot be priced."""
    if created.spec is None:
        return PodError(f"{created.ref}: spec.devices is required")
    try:
        return claim_spec_demand(created.spec, context, str(created.ref))
    except PodError as error:
        return error


def made_for_a_pod(created: CreatedObject, username: str) -> bool:
    """Whether ``created`` is a claim the resourceclaim controller makes for a pod."""
    if created.ref.kind != CLAIM or username not in CLAIM_CONTROLLER_USERS:
        return False
    owners = created.metadata.get("ownerReferences")
    return isinstance(owners, list) and any(
        isinstance(owner, Mapping) and owner.get("controller") is True
        and owner.get("kind") == "Pod" and owner.get("apiVersion") == "v1"
        for owner in owners
    )


def _devices(counts: ResourceCounts) -> str:
    return format_counts(counts) or "no GPUs"


def swap_refusal(ref: DraObjectRef, asks: ResourceCounts | PodError,
                 admitted: Sequence[PricedPod]) -> str | None:
    """The message refusing the new object ``ref`` asking ``asks`` when one of the live
    ``admitted`` pods was priced for less; None when none was."""
    short = [a for a in admitted
             if isinstance(asks, PodError) or exceeds(asks, a.devices)]
    if not short:
        return None
    listed = sorted(f"{a.namespace}/{a.name} ({a.state}) for {_devices(a.devices)}"
                    for a in short)
    shown = "; ".join(listed[:3]) + (f"; and {len(listed) - 3} more" if len(listed) > 3
                                      else "")
    wants = (f"cannot be priced ({asks})" if isinstance(asks, PodError)
             else f"asks for {_devices(asks)}")
    return (
        f"fairgate refuses this {ref.kind}: pods admitted with the {ref.kind} "
        f"{ref.name!r} that was here were priced for fewer devices than this new one "
        f"gives them: {shown}; the new {ref.kind} {wants}. Delete those pods first, or "
        f"create this {ref.kind} under a new name (and pods that name it)"
    )
